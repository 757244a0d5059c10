/* linux/sentinel.c -- what ends a process's sandboxes once it was killed.
 *
 * A sandbox with a cgroup and no PID namespace outlives a caller killed
 * with SIGKILL: its leader dies of the parent-death signal, but what it
 * started stays in the cgroup, past its wall_time, with nobody left to end
 * it.  So a process starts this program once, at its first sandbox cgroup:
 *
 *     _sentinel PYTHON CODE ARG
 *
 * with a pipe from the owner as fd 0, a pidfd of the owner as fd 3, and fd 1
 * where it says its pid.  It forks once and lives on as init's child (the
 * owner's waitpid(-1) never finds it), in a session of its own (a kill of
 * the owner's process group leaves it).
 * The owner writes a line for each sandbox cgroup it makes and removes and
 * for each sandbox meant to outlive it, "reset" and its whole state when
 * those lines outnumber its live cgroups, and "done" as it ends with
 * nothing of its own left.  This program only collects those lines until the owner
 * is gone (a pidfd, Linux 5.3).  Without "done" then, it execs
 * PYTHON -c CODE ARG with the lines as its stdin: the package's own cgroup
 * code ends and removes what is left (sbxlimit/_sentinel.py).  Idle, it is
 * a process in poll() that wakes once a second, with no Python in it. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_close_range
#define SYS_close_range 436
#endif

#define TEXT_MAX (64u << 20) /* a bound on what an owner may say */

static char *text;
static size_t len, cap;

/* The start of the last line that is `word` ("reset\n") and starts before
 * `end`, or -1. */
static long last_line(const char *word, size_t end)
{
    size_t n = strlen(word);
    for (size_t at = end; at >= n; at--) {
        size_t start = at - n;
        if (memcmp(text + start, word, n) == 0 && (start == 0 || text[start - 1] == '\n'))
            return (long)start;
    }
    return -1;
}

/* "reset" ... "end": the owner's whole state, which voids what came before
 * it once its end has come (one cut short by a full pipe voids nothing).
 * What is kept is the owner's live cgroups, however long it runs. */
static void drop_before_reset(void)
{
    long end = last_line("end\n", len);
    long reset = end < 0 ? -1 : last_line("reset\n", (size_t)end);
    if (reset > 0) {
        memmove(text, text + reset, len - (size_t)reset);
        len -= (size_t)reset;
    }
}

/* Reads what fd 0 has; returns 0 at its end (or on an error), 1 when more
 * may come later. */
static int take(void)
{
    for (;;) {
        if (len == cap) {
            size_t more = cap ? cap * 2 : 4096;
            char *grown = more <= TEXT_MAX ? realloc(text, more) : NULL;
            if (grown == NULL)
                return 0; /* what was said so far stands */
            text = grown;
            cap = more;
        }
        ssize_t n = read(0, text + len, cap - len);
        if (n > 0) {
            len += (size_t)n;
            drop_before_reset();
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        return n < 0 && errno == EAGAIN;
    }
}

/* The owner's last line was "done": it ended with nothing left. */
static int said_done(void)
{
    static const char done[] = "done\n";
    size_t n = sizeof done - 1;
    return len >= n && memcmp(text + len - n, done, n) == 0 &&
           (len == n || text[len - n - 1] == '\n');
}

int main(int argc, char **argv)
{
    if (argc != 4)
        return 2;
    /* Nothing of the owner's but the pipe, the pidfd and the pid's way
     * back: an fd it let us inherit (a pipe's end someone reads to its end)
     * must not wait for us, nor its working directory's mount. */
    if (syscall(SYS_close_range, 4, ~0u, 0) != 0)
        for (int fd = 4; fd < 1024; fd++)
            close(fd);
    if (chdir("/") != 0)
        return 2;
    /* Our /proc/PID/fd only for root with CAP_SYS_PTRACE: a sandboxed program
     * of the owner's user must not open the pipe and speak for the owner. */
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0)
        return 2;
    /* Not the owner's child: its waitpid(-1) must never find us. */
    pid_t pid = fork();
    if (pid < 0)
        return 3;
    if (pid > 0) {
        char said[24];
        int n = snprintf(said, sizeof said, "%d", (int)pid);
        return write(1, said, (size_t)n) == n ? 0 : 3;
    }
    /* A process group of its own, whose id is its pid: the one group a
     * sandbox's filter must refuse signals to besides the caller's. */
    if (setpgid(0, 0) != 0)
        return 2;
    /* A stop of the caller's service signals each of its processes: the
     * caller goes, this one must stay to end what it left.  (Ignored signals
     * stay ignored through the exec at the end.) */
    static const int stay[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE};
    for (size_t i = 0; i < sizeof stay / sizeof stay[0]; i++)
        signal(stay[i], SIG_IGN);
    int null = open("/dev/null", O_WRONLY);
    if (null < 0 || dup2(null, 1) != 1 || dup2(null, 2) != 2)
        return 2;
    close(null);
    fcntl(0, F_SETFL, fcntl(0, F_GETFL) | O_NONBLOCK);
    /* The pipe is read once a second, not at each line: a wake-up per line
     * cost each sandbox some 60 us of CPU on a 2-core machine.  The owner
     * makes it 1 MiB at its first full write, far more than a second of
     * lines; what does not fit it says again (a reset). */
    struct pollfd owner = {3, POLLIN, 0};
    for (;;) {
        int n = poll(&owner, 1, 1000);
        if (n < 0 && errno != EINTR)
            return 4;
        if (n > 0)
            break; /* the owner is gone */
        take();
    }
    take(); /* what it wrote last */
    if (said_done())
        return 0;
    /* Sealed: the interpreter we exec is dumpable again, and what it reads
     * must stay what the owner said. */
    int m = (int)syscall(SYS_memfd_create, "sbxlimit-sentinel", MFD_ALLOW_SEALING);
    if (m < 0)
        return 5;
    for (size_t at = 0; at < len;) {
        ssize_t n = write(m, text + at, len - at);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return 5;
        at += (size_t)n;
    }
    int seals = F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL;
    if (fcntl(m, F_ADD_SEALS, seals) != 0 || lseek(m, 0, SEEK_SET) != 0 || dup2(m, 0) != 0)
        return 5;
    close(m);
    close(3);
    char *args[] = {argv[1], "-I", "-S", "-c", argv[2], argv[3], NULL};
    execv(argv[1], args);
    return 6;
}
