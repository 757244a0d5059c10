/* fake_libproc.h -- the process table behind the libproc test double.
 *
 * fake_libproc.c implements proc_listchildpids, proc_pidinfo,
 * proc_pid_rusage and mach_timebase_info (declared by the fake system
 * headers beside this file) over this table, and kill() as fake_kill: the
 * code under test is compiled with -Dkill=fake_kill, so signals are
 * recorded and applied to the table, never sent.  PROC_PIDLISTFDS lists
 * this process's real fds (/proc/self/fd).
 */
#ifndef SBX_FAKE_LIBPROC_CONTROL_H
#define SBX_FAKE_LIBPROC_CONTROL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define FAKE_MAX     8192           /* processes in the table */
#define FAKE_HISTORY 8              /* signals remembered per process */
#define FAKE_CALLS   (8 * FAKE_MAX) /* kill() calls recorded */

enum fake_state { FAKE_FREE = 0, FAKE_LIVE, FAKE_ZOMBIE };

struct fake_proc {
    pid_t pid, ppid, pgid, sid;
    enum fake_state state;
    int stopped;
    int pending_term; /* a terminating signal received while stopped */
    int forks;        /* a fork loop: forks after each look at its children, while it runs */
    int32_t threads;
    uint64_t footprint, resident;         /* bytes */
    uint64_t user, system;                /* Mach absolute time units */
    uint64_t child_user, child_system;    /* of the children it reaped */
    uint64_t exit_time;                   /* Mach absolute time of its exit */
    int history[FAKE_HISTORY], n_history; /* signals it received, in order */
};

/* One kill() call as the code under test made it. */
struct fake_call {
    pid_t pid;
    int sig, ret;
};

extern struct fake_call fake_calls[];
extern size_t fake_n_calls;
extern size_t fake_listings; /* proc_listchildpids() calls */

/* An empty table; the first process made is pid 100. */
void fake_reset(void);
/* A live child of ppid in its group and session (ppid 1: a new session of
 * its own); one thread, no memory, no CPU. */
pid_t fake_spawn(pid_t ppid);
/* The process, live or zombie, or NULL. */
struct fake_proc *fake_get(pid_t pid);
/* setsid(): a session and group of its own; its parent stays. */
void fake_setsid(pid_t pid);
/* exit(): a zombie until reaped, its children handed to launchd (pid 1). */
void fake_exit(pid_t pid);
/* waitpid() by the parent: the zombie's times go to the parent's children
 * times, its slot is freed. */
void fake_reap(pid_t pid);

int fake_kill(pid_t pid, int sig);

#endif /* SBX_FAKE_LIBPROC_CONTROL_H */
