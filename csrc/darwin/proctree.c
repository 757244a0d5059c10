/* darwin/proctree.c -- a sandbox's process tree on macOS, through libproc.
 *
 * macOS has no cgroups and no PID namespaces: the tree is what
 * proc_listchildpids() reports, walked from the sandbox's first process; a
 * child that called setsid() keeps its parent, so it is still found.  The
 * memory watchdog sums phys_footprint (proc_pid_rusage), the figure macOS
 * itself accounts and limits: the resident size misses compressed memory.
 * A SIGKILL tree kill stops every process first (SIGSTOP), re-walks until no
 * new process appears, then kills, so that a fork loop cannot outrun it.  A
 * process that double-forks away from the tree and leaves the process group
 * is out of reach, as on Linux without a cgroup (docs/SECURITY.md).
 *
 * Parent side only.  Built for macOS; on Linux it is cross-compiled
 * (tests/test_cross_build.py) and run against a model of libproc
 * (tests/c/darwin/, tests/test_darwin_c.py).
 */
#include <errno.h>
#include <libproc.h>
#include <mach/mach_time.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/proc_info.h>
#include <sys/resource.h>
#include <unistd.h>

#include "../sbx.h"

#define TREE_MAX    65536 /* processes followed per call */
#define KIDS_FIRST  64    /* room for one process's children, doubled when full */
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

        if (cap > TREE_MAX) {
            errno = E2BIG;
            return -1;
        }
        np = realloc(s->pid, cap * sizeof *np);
        if (!np)
            return -1;
        s->pid = np;
        s->cap = cap;
    }
    s->pid[s->n++] = p;
    return 1;
}

/* Room for the children of one process, kept across a walk. */
struct kids {
    pid_t *pid;
    int cap;
};

/* The children of ppid (zombies included) into k.  Returns how many, or -1
 * with errno.  proc_listchildpids() returns a count of pids, not bytes
 * (libproc divides the kernel's byte count by sizeof(int)), and never more
 * than fit: a full buffer may have cut the list short, so ask again with
 * twice the room.  0 also means ppid is gone. */
static int list_children(pid_t ppid, struct kids *k)
{
    for (;;) {
        int n = proc_listchildpids(ppid, k->pid, k->cap * (int)sizeof *k->pid);
        pid_t *np;

        if (n < k->cap)
            return n > 0 ? n : 0;
        if (k->cap >= TREE_MAX) {
            errno = E2BIG;
            return -1;
        }
        np = realloc(k->pid, (size_t)k->cap * 2 * sizeof *np);
        if (!np)
            return -1;
        k->pid = np;
        k->cap *= 2;
    }
}

/* List the children of s->pid[from..] into s, following the ones added
 * (breadth first).  Returns the number added, or -1 with errno (s then
 * holds what was found). */
static int walk(struct pidset *s, size_t from)
{
    struct kids k;
    int added = 0, saved;
    size_t i;

    k.cap = KIDS_FIRST;
    k.pid = malloc((size_t)k.cap * sizeof *k.pid);
    if (!k.pid)
        return -1;
    for (i = from; i < s->n; i++) {
        int n = list_children(s->pid[i], &k), j;

        for (j = 0; n >= 0 && j < n; j++) {
            int r = pidset_add(s, k.pid[j]);

            if (r < 0)
                n = -1;
            else
                added += r;
        }
        if (n < 0) {
            saved = errno;
            free(k.pid);
            errno = saved;
            return -1;
        }
    }
    free(k.pid);
    return added;
}

/* rusage_info and proc_taskinfo times are Mach absolute time units: 1 ns
 * on Intel, 125/3 ns on Apple Silicon. */
static double mach_seconds(uint64_t t)
{
    static mach_timebase_info_data_t tb;

    if (tb.denom == 0 && (mach_timebase_info(&tb) != KERN_SUCCESS || tb.denom == 0)) {
        tb.numer = 1;
        tb.denom = 1;
    }
    return (double)t * tb.numer / tb.denom / 1e9;
}

int sbx_tree_sample(pid_t root, int skip_root, struct sbx_tree_sample *out)
{
    struct pidset s = {NULL, 0, 0};
    size_t i;

    memset(out, 0, sizeof *out);
    if (pidset_add(&s, root) < 0 || walk(&s, 0) < 0) {
        int saved = errno;

        free(s.pid);
        errno = saved;
        return -1;
    }
    for (i = 0; i < s.n; i++) {
        struct rusage_info_v2 ri;
        struct proc_taskinfo ti;

        /* Live processes and zombies answer; a zombie's record is the one
         * the kernel kept at exit (exit time set, footprint 0). */
        if (proc_pid_rusage(s.pid[i], RUSAGE_INFO_V2, (rusage_info_t *)&ri) != 0)
            continue; /* gone */
        /* Its own CPU and that of the children it reaped, as on Linux. */
        out->cpu_user += mach_seconds(ri.ri_user_time + ri.ri_child_user_time);
        out->cpu_system += mach_seconds(ri.ri_system_time + ri.ri_child_system_time);
        if (ri.ri_proc_exit_abstime != 0 ||
            proc_pidinfo(s.pid[i], PROC_PIDTASKINFO, 0, &ti, (int)sizeof ti) != (int)sizeof ti) {
            /* Exited: no memory left, but its pid is held until it is
             * reaped, and counts as on Linux (a fork loop that reaps late
             * stays at the limit with zombies). */
            if (i > 0) {
                out->procs++;
                out->tasks++;
            }
            continue;
        }
        if (i == 0)
            out->root_alive = 1;
        if (i == 0 && skip_root)
            continue;
        out->memory += ri.ri_phys_footprint;
        out->tasks += (uint32_t)ti.pti_threadnum;
        out->procs++;
    }
    free(s.pid);
    return 0;
}

int sbx_tree_signal(pid_t root, int sig, pid_t pgid)
{
    struct pidset s = {NULL, 0, 0};
    size_t i;
    int round, n;

    /* Freeze the group before the walk; any other signal is sent once,
     * below (a second SIGTERM can mean "now" to a program). */
    if (pgid > 0 && sig == SIGKILL)
        (void)kill(-pgid, SIGSTOP);
    if (pidset_add(&s, root) < 0)
        return -1;
    /* A walk cut short (out of memory, TREE_MAX) still signals what it found. */
    (void)walk(&s, 0);
    if (sig == SIGKILL) {
        /* Stop everything, re-walk until the tree holds still, then kill:
         * a stopped process cannot fork. */
        for (round = 0; round < KILL_ROUNDS; round++) {
            for (i = 0; i < s.n; i++)
                (void)kill(s.pid[i], SIGSTOP);
            if (walk(&s, 0) <= 0)
                break;
        }
    }
    for (i = 0; i < s.n; i++)
        (void)kill(s.pid[i], sig);
    if (pgid > 0)
        (void)kill(-pgid, sig);
    if (sig == SIGKILL)
        for (i = 0; i < s.n; i++)
            (void)kill(s.pid[i], SIGCONT); /* in case a stopped one waits for it to die */
    n = (int)s.n;
    free(s.pid);
    return n;
}

int sbx_tree_sample_cached(pid_t root, int skip_root, struct sbx_tree_cache *cache,
                           struct sbx_tree_sample *out)
{
    /* No cheap "has it run" here: always walk. */
    cache->n = 0;
    return sbx_tree_sample(root, skip_root, out);
}
