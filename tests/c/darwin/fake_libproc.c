/* fake_libproc.c -- a model of libproc over a table of processes, so that
 * csrc/darwin/proctree.c runs on Linux (tests/test_darwin_c.py).
 *
 * Each call behaves as XNU's does (libsyscall/wrappers/libproc/libproc.c
 * over bsd/kern/proc_info.c), in what the code under test can observe:
 * return values and units, truncation, errno, zombies.  See libproc.h.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libproc.h>
#include <mach/mach_time.h>
#include <sys/proc_info.h>

#include "fake_libproc.h"

#define FIRST_PID 100

static struct fake_proc table[FAKE_MAX];
static pid_t next_pid = FIRST_PID;
static uint64_t clock_ticks = 1000;

struct fake_call fake_calls[FAKE_CALLS];
size_t fake_n_calls;
size_t fake_listings;

void fake_reset(void)
{
    memset(table, 0, sizeof table);
    next_pid = FIRST_PID;
    fake_n_calls = 0;
    fake_listings = 0;
}

struct fake_proc *fake_get(pid_t pid)
{
    struct fake_proc *p;

    if (pid < FIRST_PID || pid >= FIRST_PID + FAKE_MAX)
        return NULL;
    p = &table[pid - FIRST_PID];
    return p->state == FAKE_FREE ? NULL : p;
}

pid_t fake_spawn(pid_t ppid)
{
    struct fake_proc *parent = fake_get(ppid), *p;

    if (next_pid >= FIRST_PID + FAKE_MAX)
        abort(); /* a test made more processes than the table holds */
    p = &table[next_pid - FIRST_PID];
    memset(p, 0, sizeof *p);
    p->pid = next_pid++;
    p->ppid = ppid;
    p->pgid = parent ? parent->pgid : p->pid;
    p->sid = parent ? parent->sid : p->pid;
    p->state = FAKE_LIVE;
    p->threads = 1;
    return p->pid;
}

void fake_setsid(pid_t pid)
{
    struct fake_proc *p = fake_get(pid);

    p->sid = p->pgid = pid;
}

void fake_exit(pid_t pid)
{
    struct fake_proc *p = fake_get(pid);
    int i;

    if (!p || p->state != FAKE_LIVE)
        return;
    p->state = FAKE_ZOMBIE;
    p->stopped = 0;
    p->exit_time = ++clock_ticks;
    for (i = 0; i < FAKE_MAX; i++)
        if (table[i].state != FAKE_FREE && table[i].ppid == pid)
            table[i].ppid = 1;
}

void fake_reap(pid_t pid)
{
    struct fake_proc *p = fake_get(pid), *parent;

    if (!p || p->state != FAKE_ZOMBIE)
        return;
    parent = fake_get(p->ppid);
    if (parent) {
        parent->child_user += p->user + p->child_user;
        parent->child_system += p->system + p->child_system;
    }
    p->state = FAKE_FREE;
}

/* ---- kill(2) --------------------------------------------------------- */

static void deliver(struct fake_proc *p, int sig)
{
    if (p->n_history < FAKE_HISTORY)
        p->history[p->n_history++] = sig;
    switch (sig) {
    case 0:
        break;
    case SIGSTOP:
    case SIGTSTP:
        p->stopped = 1;
        break;
    case SIGCONT:
        p->stopped = 0;
        if (p->pending_term)
            fake_exit(p->pid);
        break;
    case SIGKILL:
        fake_exit(p->pid); /* even a stopped process */
        break;
    case SIGCHLD:
    case SIGWINCH:
    case SIGURG:
        break; /* ignored by default */
    default:
        /* Terminates by default; a stopped process when it continues. */
        if (p->stopped)
            p->pending_term = 1;
        else
            fake_exit(p->pid);
    }
}

int fake_kill(pid_t pid, int sig)
{
    struct fake_call *c;
    int i, hit = 0;

    if (fake_n_calls == FAKE_CALLS)
        abort(); /* more calls than a test can check */
    c = &fake_calls[fake_n_calls++];
    c->pid = pid;
    c->sig = sig;
    c->ret = 0;
    if (pid > 0) {
        struct fake_proc *p = fake_get(pid);

        /* XNU: success for a zombie, which it leaves alone. */
        if (p && p->state == FAKE_LIVE)
            deliver(p, sig);
        else if (!p)
            hit = -1;
    } else if (pid < -1) {
        hit = -1;
        for (i = 0; i < FAKE_MAX; i++)
            if (table[i].state == FAKE_LIVE && table[i].pgid == -pid) {
                deliver(&table[i], sig);
                hit = 0;
            }
    } else {
        abort(); /* kill(0) or kill(-1): never from the code under test */
    }
    if (hit < 0) {
        c->ret = -1;
        errno = ESRCH;
        return -1;
    }
    return 0;
}

/* ---- libproc ------------------------------------------------------------ */

static int nprocs(void)
{
    int i, n = 0;

    for (i = 0; i < FAKE_MAX; i++)
        n += table[i].state != FAKE_FREE;
    return n;
}

/* proc_listpids(PROC_PPID_ONLY, ppid, ...) in the kernel, then libproc's
 * division by sizeof(int). */
int proc_listchildpids(pid_t ppid, void *buffer, int buffersize)
{
    struct fake_proc *parent = fake_get(ppid);
    int *out = buffer;
    int want, n = 0, pass, i;

    fake_listings++;
    if (buffer == NULL)
        return nprocs() + 20; /* an estimate of all processes, in pids */
    if (buffersize < (int)sizeof(int)) {
        errno = ENOMEM;
        return 0; /* libproc's proc_listpids turns -1 into 0 */
    }
    want = buffersize / (int)sizeof(int);
    if (want > nprocs() + 20)
        want = nprocs() + 20;
    /* allproc, newest first, then zombproc. */
    for (pass = 0; pass < 2; pass++)
        for (i = FAKE_MAX - 1; i >= 0 && n < want; i--) {
            const struct fake_proc *p = &table[i];

            if (p->state == (pass == 0 ? FAKE_LIVE : FAKE_ZOMBIE) && p->ppid == ppid)
                out[n++] = p->pid;
        }
    /* A fork loop forks again right after we looked, unless stopped: only
     * the next look sees that child. */
    if (parent && parent->state == FAKE_LIVE && parent->forks && !parent->stopped)
        (void)fake_spawn(ppid);
    return n;
}

/* This process's fds, ascending, from /proc/self/fd; at most max of them
 * into out (NULL: count only).  Returns how many, or -1. */
static int own_fds(struct proc_fdinfo *out, int max, int *highest)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;

    *highest = -1;
    if (!d)
        return -1;
    while ((e = readdir(d)) != NULL) {
        int fd;

        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        fd = atoi(e->d_name);
        if (fd == dirfd(d))
            continue;
        if (fd > *highest)
            *highest = fd;
        if (out && n < max) {
            out[n].proc_fd = fd;
            out[n].proc_fdtype = PROX_FDTYPE_VNODE;
        }
        n++;
    }
    closedir(d);
    return out && n > max ? max : n;
}

int proc_pidinfo(int pid, int flavor, uint64_t arg, void *buffer, int buffersize)
{
    (void)arg;
    switch (flavor) {
    case PROC_PIDLISTFDS: {
        int n, highest;

        if (buffer != NULL && buffersize < (int)PROC_PIDLISTFD_SIZE) {
            errno = ENOMEM;
            return 0;
        }
        if (pid != getpid()) {
            errno = ESRCH; /* the model knows only this process's fds */
            return 0;
        }
        n = own_fds(buffer, buffersize / (int)PROC_PIDLISTFD_SIZE, &highest);
        if (n < 0) {
            errno = ESRCH;
            return 0;
        }
        if (buffer == NULL) /* fd_nfiles, the table's size, plus 20 */
            return (highest + 1 + 20) * (int)PROC_PIDLISTFD_SIZE;
        return n * (int)PROC_PIDLISTFD_SIZE;
    }
    case PROC_PIDTASKINFO: {
        struct fake_proc *p = fake_get(pid);
        struct proc_taskinfo ti;

        if (buffersize < (int)PROC_PIDTASKINFO_SIZE) {
            errno = ENOMEM;
            return 0;
        }
        /* proc_find() does not return zombies: ESRCH as for no process. */
        if (!p || p->state != FAKE_LIVE) {
            errno = ESRCH;
            return 0;
        }
        memset(&ti, 0, sizeof ti);
        ti.pti_virtual_size = 4 * p->footprint + (1ULL << 32);
        ti.pti_resident_size = p->resident;
        ti.pti_total_user = p->user;
        ti.pti_total_system = p->system;
        ti.pti_threads_user = p->user;
        ti.pti_threads_system = p->system;
        ti.pti_threadnum = p->threads;
        ti.pti_numrunning = p->stopped ? 0 : 1;
        memcpy(buffer, &ti, sizeof ti);
        return (int)sizeof ti;
    }
    default:
        errno = EINVAL;
        return 0;
    }
}

int proc_pid_rusage(int pid, int flavor, rusage_info_t *buffer)
{
    struct fake_proc *p = fake_get(pid);
    rusage_info_current ri;
    size_t size;

    switch (flavor) {
    case RUSAGE_INFO_V0:
        size = sizeof(struct rusage_info_v0);
        break;
    case RUSAGE_INFO_V1:
        size = sizeof(struct rusage_info_v1);
        break;
    case RUSAGE_INFO_V2:
        size = sizeof(struct rusage_info_v2);
        break;
    case RUSAGE_INFO_V3:
        size = sizeof(struct rusage_info_v3);
        break;
    case RUSAGE_INFO_V4:
        size = sizeof(struct rusage_info_v4);
        break;
    case RUSAGE_INFO_V5:
        size = sizeof(struct rusage_info_v5);
        break;
    case RUSAGE_INFO_V6:
        size = sizeof(struct rusage_info_v6);
        break;
    default:
        errno = EINVAL;
        return -1;
    }
    if (!p) {
        errno = ESRCH;
        return -1;
    }
    memset(&ri, 0, sizeof ri);
    ri.ri_user_time = p->user;
    ri.ri_system_time = p->system;
    ri.ri_resident_size = p->resident;
    ri.ri_phys_footprint = p->footprint;
    ri.ri_lifetime_max_phys_footprint = p->footprint;
    ri.ri_proc_start_abstime = 1;
    ri.ri_child_user_time = p->child_user;
    ri.ri_child_system_time = p->child_system;
    if (p->state == FAKE_ZOMBIE) {
        /* The record kept at exit (proc_exit: footprint zeroed, exit time
         * set); the resident size is left as it was. */
        ri.ri_phys_footprint = 0;
        ri.ri_proc_exit_abstime = p->exit_time;
    }
    memcpy((void *)buffer, &ri, size);
    return 0;
}

/* ---- mach time ---------------------------------------------------------- */

kern_return_t mach_timebase_info(mach_timebase_info_t info)
{
    info->numer = 125; /* Apple Silicon */
    info->denom = 3;
    return KERN_SUCCESS;
}

uint64_t mach_absolute_time(void)
{
    return ++clock_ticks;
}
