/* probe.c -- doctor's probes.
 *
 * Each probe really tries the mechanism.  Where trying changes the caller
 * (a namespace, a seccomp filter, no_new_privs), it runs in a short-lived
 * fork()ed child that makes only system calls, reports errno on a pipe and
 * _exit()s; the parent waits at most timeout_ms, then SIGKILLs it.  Nothing
 * a probe does outlives it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef __linux__
#include <sys/syscall.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <sys/prctl.h>
#endif

#include "sbx_internal.h"

#ifdef __linux__
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_clone3
#define SYS_clone3 435
#endif
#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#endif
#ifndef LANDLOCK_CREATE_RULESET_VERSION
#define LANDLOCK_CREATE_RULESET_VERSION (1U << 0)
#endif
#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif

struct clone3_args {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
        set_tid_size, cgroup;
};

/* ---- child bodies: system calls only ----------------------------------- */

static int try_no_new_privs(long arg)
{
    (void)arg;
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
}

static int try_seccomp(long arg)
{
    struct sock_filter allow = BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    struct sock_fprog prog = {1, &allow};

    (void)arg;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return -1;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0);
}

static int try_unshare(long flags)
{
    return unshare((int)flags);
}

static int try_hang(long arg)
{
    (void)arg;
    for (;;)
        pause();
    return 0;
}
#endif /* __linux__ */

/* Run fn(arg) in a forked child; returns 0 (fn succeeded), its errno, or
 * ETIMEDOUT. */
static int run_in_child(int (*fn)(long), long arg, int timeout_ms)
{
    int fds[2], err = 0, status;
    struct pollfd pfd;
    pid_t pid;
    ssize_t n;

    if (sbx_pipe_cloexec(fds) < 0)
        return errno;
    pid = fork();
    if (pid < 0) {
        err = errno;
        close(fds[0]);
        close(fds[1]);
        return err;
    }
    if (pid == 0) {
        int e = fn(arg) < 0 ? errno : 0;
        (void)!write(fds[1], &e, sizeof e);
        _exit(0);
    }
    close(fds[1]);
    pfd.fd = fds[0];
    pfd.events = POLLIN;
    do {
        n = poll(&pfd, 1, timeout_ms);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) {
        err = n == 0 ? ETIMEDOUT : errno;
        kill(pid, SIGKILL);
    } else if (read(fds[0], &err, sizeof err) != (ssize_t)sizeof err) {
        err = EIO;
    }
    close(fds[0]);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return err;
}

int sbx_probe(int what, long arg, int timeout_ms)
{
#ifdef __linux__
    switch (what) {
    case SBX_PROBE_PIDFD: {
        int fd = (int)syscall(SYS_pidfd_open, getpid(), 0);
        if (fd < 0)
            return errno;
        close(fd);
        return 0;
    }
    case SBX_PROBE_CLOSE_RANGE:
#ifdef SYS_close_range
        /* An empty range at the top: closes nothing. */
        return syscall(SYS_close_range, ~0U, ~0U, 0) == 0 ? 0 : errno;
#else
        return ENOSYS;
#endif
    case SBX_PROBE_NO_NEW_PRIVS:
        return run_in_child(try_no_new_privs, 0, timeout_ms);
    case SBX_PROBE_SECCOMP:
        return run_in_child(try_seccomp, 0, timeout_ms);
    case SBX_PROBE_UNSHARE:
        return run_in_child(try_unshare, arg, timeout_ms);
    case SBX_PROBE_HANG:
        return run_in_child(try_hang, 0, timeout_ms);
    case SBX_PROBE_NAMESPACES:
        return run_in_child(sbx_ns_probe_child, arg, timeout_ms);
    case SBX_PROBE_RO_VIEW:
        return run_in_child(sbx_ns_probe_view_child, arg, timeout_ms);
    case SBX_PROBE_CLONE3_CGROUP: {
        /* The child is born in the cgroup whose directory fd is arg, and
         * exits at once: like fork(), no shared memory, so the raw
         * syscall is safe here. */
        struct clone3_args ca;
        int status;
        long pid;

        memset(&ca, 0, sizeof ca);
        ca.flags = CLONE_INTO_CGROUP;
        ca.exit_signal = SIGCHLD;
        ca.cgroup = (uint64_t)arg;
        pid = syscall(SYS_clone3, &ca, sizeof ca);
        if (pid < 0)
            return errno;
        if (pid == 0)
            _exit(0);
        while (waitpid((pid_t)pid, &status, 0) < 0 && errno == EINTR)
            ;
        return 0;
    }
    default:
        return EINVAL;
    }
#else
    (void)what;
    (void)arg;
    (void)timeout_ms;
    (void)run_in_child;
    return ENOSYS;
#endif
}

int sbx_probe_landlock_abi(void)
{
#ifdef __linux__
    long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
    return abi < 0 ? -errno : (int)abi;
#else
    return -ENOSYS;
#endif
}
