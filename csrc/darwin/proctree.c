/* darwin/proctree.c -- a sandbox's process tree on macOS, through libproc.
 *
 * macOS has no cgroups and no PID namespaces: the tree is what
 * proc_listchildpids() reports, walked from the sandbox's first process.
 * The memory watchdog sums resident sizes (proc_pidinfo PROC_PIDTASKINFO);
 * a SIGKILL tree kill stops every process first (SIGSTOP), re-walks until no
 * new process appears, then kills, so that a fork loop cannot outrun it.  A
 * process that double-forks away from the tree and leaves the process group
 * is out of reach, as on Linux without a cgroup (docs/SECURITY.md).
 *
 * Parent side only.  Compiled for macOS only; the Linux build checks it
 * through the cross-compile test (tests/test_cross_build.py).
 */
#include <errno.h>
#include <libproc.h>
#include <mach/mach_time.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/proc_info.h>
#include <unistd.h>

#include "../sbx.h"

#define TREE_MAX    65536 /* processes followed per call */
#define KILL_ROUNDS 64    /* stop-and-rewalk rounds for SIGKILL */

struct pidset {
    pid_t *pid;
    size_t n, cap;
};

static int pidset_has(const struct pidset *s, pid_t p)
{
    size_t i;

    for (i = 0; i < s->n; i++)
        if (s->pid[i] == p)
            return 1;
    return 0;
}

static int pidset_add(struct pidset *s, pid_t p)
{
    if (pidset_has(s, p))
        return 0;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        pid_t *np;

        if (cap > TREE_MAX)
            return -1;
        np = realloc(s->pid, cap * sizeof *np);
        if (!np)
            return -1;
        s->pid = np;
        s->cap = cap;
    }
    s->pid[s->n++] = p;
    return 1;
}

/* List the children of s->pid[from..] into s, following the ones added
 * (breadth first).  Returns the number added, or -1 with errno. */
static int walk(struct pidset *s, size_t from)
{
    pid_t kids[1024];
    int added = 0;
    size_t i;

    for (i = from; i < s->n; i++) {
        int bytes = proc_listchildpids(s->pid[i], kids, (int)sizeof kids);
        int k, n;

        if (bytes <= 0)
            continue;
        n = bytes / (int)sizeof kids[0];
        for (k = 0; k < n; k++) {
            int r = pidset_add(s, kids[k]);

            if (r < 0)
                return -1;
            added += r;
        }
    }
    return added;
}

static double mach_seconds(uint64_t t)
{
    static mach_timebase_info_data_t tb;

    if (tb.denom == 0)
        mach_timebase_info(&tb);
    return (double)t * tb.numer / tb.denom / 1e9;
}

int sbx_tree_sample(pid_t root, int skip_root, struct sbx_tree_sample *out)
{
    struct pidset s = {NULL, 0, 0};
    size_t i;

    memset(out, 0, sizeof *out);
    if (pidset_add(&s, root) < 0 || walk(&s, 0) < 0) {
        free(s.pid);
        return -1;
    }
    for (i = 0; i < s.n; i++) {
        struct proc_taskinfo ti;

        if (proc_pidinfo(s.pid[i], PROC_PIDTASKINFO, 0, &ti, (int)sizeof ti) != (int)sizeof ti)
            continue; /* gone, or a zombie */
        if (s.pid[i] == root)
            out->root_alive = 1;
        if (s.pid[i] == root && skip_root)
            continue;
        out->memory += ti.pti_resident_size;
        out->tasks += (uint32_t)ti.pti_threadnum;
        out->procs += 1;
        out->cpu_user += mach_seconds(ti.pti_total_user);
        out->cpu_system += mach_seconds(ti.pti_total_system);
    }
    free(s.pid);
    return 0;
}

int sbx_tree_signal(pid_t root, int sig, pid_t pgid)
{
    struct pidset s = {NULL, 0, 0};
    size_t i;
    int round, n;

    if (pgid > 0)
        (void)kill(-pgid, sig == SIGKILL ? SIGSTOP : sig);
    if (pidset_add(&s, root) < 0 || walk(&s, 0) < 0) {
        free(s.pid);
        return -1;
    }
    if (sig == SIGKILL) {
        /* Stop everything, re-walk until the tree holds still, then kill:
         * a stopped process cannot fork. */
        for (round = 0; round < KILL_ROUNDS; round++) {
            for (i = 0; i < s.n; i++)
                (void)kill(s.pid[i], SIGSTOP);
            n = walk(&s, 0);
            if (n <= 0)
                break;
        }
    }
    for (i = 0; i < s.n; i++)
        (void)kill(s.pid[i], sig);
    if (pgid > 0)
        (void)kill(-pgid, sig);
    if (sig == SIGKILL)
        for (i = 0; i < s.n; i++)
            (void)kill(s.pid[i], SIGCONT); /* a stopped process dies on continue */
    n = (int)s.n;
    free(s.pid);
    return n;
}
