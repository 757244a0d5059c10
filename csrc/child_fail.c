/* child_fail.c -- the child's failure report: its record and its names.
 *
 * The first step of the child sequence that fails writes one fixed-size
 * struct sbx_child_error (step, errno, detail) to the close-on-exec error
 * pipe and _exit(127)s (sbx_child_fail); the parent reads it in
 * sbx_spawn_finish (spawn.c) and names the step with sbx_step_name.  Every
 * step file (spawn.c, fds.c, rlimit.c, linux/...) reports through here, so
 * none of them depends on another for it.
 *
 * sbx_child_fail runs between clone and exec, possibly sharing the parent's
 * memory: only write(2) and _exit(2), no malloc, no locks, no stdio.
 */
#include <errno.h>
#include <unistd.h>

#include "sbx_internal.h"

/* The stable names of sbx.h's steps (parent side). */
static const char *const step_names[SBX_STEP__COUNT] = {
    [SBX_STEP_NONE] = "none",
    [SBX_STEP_CGROUP] = "cgroup:procs",
    [SBX_STEP_SIGNALS_RESET] = "signals:reset",
    [SBX_STEP_STDIO] = "stdio:dup2",
    [SBX_STEP_SETSID] = "session:setsid",
    [SBX_STEP_SETPGID] = "session:setpgid",
    [SBX_STEP_PDEATHSIG] = "pdeathsig",
    [SBX_STEP_NS_UNSHARE] = "ns:unshare",
    [SBX_STEP_NS_IDMAP] = "ns:idmap",
    [SBX_STEP_NS_LOOPBACK] = "ns:loopback",
    [SBX_STEP_NS_MOUNT] = "ns:mount",
    [SBX_STEP_NS_VIEW] = "ns:view",
    [SBX_STEP_NS_PID] = "ns:pid",
    [SBX_STEP_RLIMIT_CORE] = "rlimit:RLIMIT_CORE",
    [SBX_STEP_RLIMIT_CPU] = "rlimit:RLIMIT_CPU",
    [SBX_STEP_RLIMIT_FSIZE] = "rlimit:RLIMIT_FSIZE",
    [SBX_STEP_RLIMIT_DATA] = "rlimit:RLIMIT_DATA",
    [SBX_STEP_RLIMIT_AS] = "rlimit:RLIMIT_AS",
    [SBX_STEP_RLIMIT_NOFILE] = "rlimit:RLIMIT_NOFILE",
    [SBX_STEP_RLIMIT_NPROC] = "rlimit:RLIMIT_NPROC",
    [SBX_STEP_CHDIR] = "chdir",
    [SBX_STEP_UMASK] = "umask",
    [SBX_STEP_SETGROUPS] = "setgroups",
    [SBX_STEP_SETGID] = "setgid",
    [SBX_STEP_SETUID] = "setuid",
    [SBX_STEP_CAPS] = "caps:drop",
    [SBX_STEP_NO_NEW_PRIVS] = "harden:no_new_privs",
    [SBX_STEP_LANDLOCK] = "landlock:restrict",
    [SBX_STEP_SECCOMP] = "harden:seccomp",
    [SBX_STEP_PREEXEC] = "preexec_fn",
    [SBX_STEP_PASS_FDS] = "pass_fds",
    [SBX_STEP_CLOSE_FDS] = "close_fds",
    [SBX_STEP_SIGMASK] = "signals:mask",
    [SBX_STEP_EXEC] = "exec",
    [SBX_STEP_NS_SETNS] = "ns:setns",
    [SBX_STEP_NS_PROXY] = "ns:proxy",
};

const char *sbx_step_name(int step)
{
    if (step < 0 || step >= SBX_STEP__COUNT)
        return NULL;
    return step_names[step];
}

_Noreturn void sbx_child_fail(const struct sbx_child_ctx *ctx, int step, int err, int64_t detail)
{
    struct sbx_child_error rec;
    ssize_t n;

    rec.step = step;
    rec.err = err;
    rec.detail = detail;
    do {
        n = write(ctx->errfd, &rec, sizeof rec);
    } while (n < 0 && errno == EINTR);
    _exit(127);
}
