/* linux/reaper.h -- the loop of a sandbox's PID 1, shared by the core (a PID 1
 * that fork()ed from the caller runs it in place) and csrc/linux/pid1.c (the
 * small program a vfork-style PID 1 execs).  Async-signal-safe: sigwaitinfo,
 * kill, waitpid, write, _exit. */
#ifndef SBX_REAPER_H
#define SBX_REAPER_H

#include <errno.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SYS_close_range
#define SYS_close_range 436
#endif

/* Close every fd but keep (-1: none): the long-lived processes of a PID
 * namespace must not hold the caller's pipe ends open. */
static inline void sbx_close_all_but(int keep)
{
    if (keep > 0 && syscall(SYS_close_range, 0, (unsigned)keep - 1, 0) == 0 &&
        syscall(SYS_close_range, (unsigned)keep + 1, ~0U, 0) == 0)
        return;
    if (keep < 0 && syscall(SYS_close_range, 0, ~0U, 0) == 0)
        return;
    /* Older kernels: the first 65536 are enough for a process we made. */
    for (int fd = 0; fd < 65536; fd++)
        if (fd != keep)
            (void)close(fd);
}

/* Forward every signal to the target, reap every orphan, and when the
 * target is gone hand its status to the parent and exit with the same code
 * (the kernel then kills what is left in the namespace).  PID 1 cannot end
 * by a signal of its own: the parent reads the status pipe.  Every signal
 * is blocked (it queues for sigwaitinfo, even without a handler). */
static inline _Noreturn void sbx_reap(pid_t target, int status_fd, const sigset_t *all)
{
    for (;;) {
        int sig, st;
        pid_t r;

        do {
            sig = sigwaitinfo(all, NULL);
        } while (sig < 0 && errno == EINTR);
        if (sig < 0)
            _exit(126);
        if (sig != SIGCHLD) {
            (void)kill(target, sig);
            continue;
        }
        while ((r = waitpid(-1, &st, WNOHANG)) > 0) {
            if (r != target)
                continue;
            if (status_fd >= 0)
                (void)write(status_fd, &st, sizeof st);
            _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
        }
    }
}

#endif
