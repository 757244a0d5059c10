/* sbx_internal.h -- shared by the core's C files, not by the binding. */
#ifndef SBX_INTERNAL_H
#define SBX_INTERNAL_H

#include <signal.h>
#include <stdint.h>

#include "sbx.h"

/* What the child needs besides the spec; lives in the parent's memory. */
struct sbx_child_ctx {
    const struct sbx_spec *spec;
    int errfd;           /* write end of the error pipe, close-on-exec */
    sigset_t saved_mask; /* the spawning thread's mask, restored before exec */
    int vforked;         /* sharing the parent's memory until exec */
    int how;             /* SBX_HOW_* of the clone that made the child */
    int pidfd;           /* clone3's CLONE_PIDFD (a mount namespace to hold), or -1 */
    /* A PID namespace's target runs this (no return): the setup after the
     * namespaces, then exec (spawn.c). */
    void (*target_main)(const struct sbx_child_ctx *ctx);
    struct sigaction target_chld; /* the SIGCHLD disposition it gets back */
    /* close_fds by brute force closes the fds below this (sbx_fds_top). */
    unsigned fd_top;
};

/* fds.c, parent side: a pipe with both ends close-on-exec (pipe2 where it
 * exists; elsewhere pipe + fcntl, racing only with a fork in another
 * thread, as CPython accepts on such platforms). */
int sbx_pipe_cloexec(int fds[2]);

/* linux/landlock.c, child side: restrict with spec->landlock_fd. */
int sbx_landlock_restrict_child(const struct sbx_spec *s);

/* linux/landlock.c, child side: allow `access` beneath directory fd in
 * the ruleset (the workspace's tmpfs, mounted after it was built). */
int sbx_landlock_allow_child(int ruleset, int fd, uint64_t access);

/* linux/caps.c, child side: drop every capability but spec->caps_keep. */
int sbx_caps_drop_child(const struct sbx_spec *s);

/* linux/seccomp.c, child side: load spec->seccomp (no_new_privs set). */
int sbx_seccomp_load_child(const struct sbx_spec *s);

/* linux/namespaces.c, child side: enter spec->ns_flags' namespaces and
 * set them up; with CLONE_NEWPID returns only in the target's process. */
void sbx_ns_enter_child(const struct sbx_child_ctx *ctx);
/* linux/namespaces.c, parent side: clone PID 1 of a new PID namespace
 * (fork-like: returns 0 in the child, which has SBX_HOW_PID1 in ctx->how). */
pid_t sbx_ns_clone_pid1(struct sbx_child_ctx *ctx);
/* linux/namespaces.c, in a probe's child: the same sequence for flags;
 * 0, or -1 with errno. */
int sbx_ns_probe_child(long flags);
/* linux/namespaces.c, in a probe's child: sbx_ns_probe_child(flags), then
 * the read-only view's calls; 0, or -1 with errno. */
int sbx_ns_probe_view_child(long flags);

/* linux/cgroup.c, child side: join the cgroups of the spec. */
void sbx_cgroup_join_child(const struct sbx_child_ctx *ctx);

/* linux/clone3.c: clone3(args) with CLONE_VM on args' stack, running fn(arg)
 * in the child and exiting with its result.  Returns the pid, or -errno
 * (-ENOSYS where this architecture has no trampoline). */
struct sbx_clone_args {
    /* The kernel's struct clone_args as of Linux 5.7 (size 88), spelled out
     * so that the build does not depend on the installed kernel headers. */
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
    uint64_t set_tid, set_tid_size, cgroup;
};
long sbx_clone3_run(struct sbx_clone_args *args, int (*fn)(void *), void *arg);

/* child_fail.c, child side: report (step, err, detail) to the parent on
 * ctx->errfd and _exit(127); async-signal-safe. */
_Noreturn void sbx_child_fail(const struct sbx_child_ctx *ctx, int step, int err, int64_t detail);

/* Child side: run one step.  The testing switch makes the step fail with the
 * requested errno before the real call is made. */
#define SBX_CHILD_STEP(ctx, step, detail, call)                                                    \
    do {                                                                                           \
        if ((ctx)->spec->fail_step == (step))                                                      \
            sbx_child_fail((ctx), (step), (ctx)->spec->fail_errno, (detail));                      \
        if ((call) < 0)                                                                            \
            sbx_child_fail((ctx), (step), errno, (detail));                                        \
    } while (0)

/* rlimit.c, child side: set every limit of the spec, in order. */
void sbx_rlimit_apply_child(const struct sbx_child_ctx *ctx);

/* fds.c, parent side: the bound for closing fds by brute force (macOS has
 * no close_range), taken before the child lowers RLIMIT_NOFILE: the soft
 * limit, or past the highest open fd (libproc) when that is above it. */
unsigned sbx_fds_top(void);
/* fds.c, child side: clear close-on-exec on the kept fds. */
void sbx_fds_keep_child(const struct sbx_child_ctx *ctx);
/* fds.c, child side: close every fd >= 3 except the kept ones and errfd. */
void sbx_fds_close_child(const struct sbx_child_ctx *ctx);

#endif /* SBX_INTERNAL_H */
