/* linux/pid1.c -- PID 1 of a sandbox's PID namespace, as a program of its own.
 *
 * The core's PID 1 is a vfork-style child: it shares the caller's memory
 * until it execs, which is what makes a sandbox with a PID namespace cheap
 * (a fork()ed PID 1 copies, and write-protects, every page the caller has).
 * Once it has started the target it execs this program to stay on as the
 * reaper:  _pid1 TARGET STATUS_FD
 * Signals are still blocked (execve keeps the mask and what is pending), so
 * none is lost between the target's start and the loop. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <signal.h>
#include <stdlib.h>

#include "reaper.h"

static long number(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);

    return (*s && !*end && v >= 0) ? v : -1;
}

int main(int argc, char **argv)
{
    sigset_t all;
    long target, fd;

    if (argc != 3 || (target = number(argv[1])) <= 0 || (fd = number(argv[2])) < 0)
        return 127;
    sbx_close_all_but((int)fd);
    sigfillset(&all);
    (void)sigprocmask(SIG_BLOCK, &all, NULL);
    sbx_reap((pid_t)target, (int)fd, &all);
}
