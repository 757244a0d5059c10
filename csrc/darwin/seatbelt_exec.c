/* darwin/seatbelt_exec.c -- sbxlimit/_seatbelt_exec, the program a macOS
 * sandbox's target is exec'd through (in place of sandbox-exec(1)):
 *
 *     _seatbelt_exec PROFILE_FD REPORT_FD TARGET ARGV0 [ARG...]
 *
 * It reads the Seatbelt profile from PROFILE_FD (an unlinked file: no
 * argv size limit, no name another sandbox could swap), applies it, makes
 * REPORT_FD close-on-exec and execs TARGET with ARGV0 ARG... (TARGET
 * without a slash is looked up in PATH).  The parent reads REPORT_FD to
 * EOF: EOF alone means the target runs under the profile; otherwise one
 * record "STEP\0ERRNO\0MESSAGE" says which step failed ("seatbelt:apply":
 * the profile was refused or the caller is already sandboxed; "exec"), so
 * that a failure is never mistaken for the program's own exit status.
 *
 * A process of its own after exec, not a child between fork and exec: it
 * may allocate.  Plain POSIX besides sandbox_init (seatbelt_apply.c), so
 * the tests build and run it on Linux against a double of libsandbox.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "seatbelt_apply.h"

#define EXIT_SETUP 126 /* what the parent reaps after a report */

static int report_fd = -1;

static int parse_fd(const char *s)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < 0 || v > 65535)
        return -1;
    return (int)v;
}

/* Write the record (the parent reads it whole: one write, far below
 * PIPE_BUF) and exit. */
static _Noreturn void fail(const char *step, int err, const char *msg)
{
    char rec[1024];
    int n = snprintf(rec, sizeof rec, "%s%c%d%c%s", step, '\0', err, '\0', msg ? msg : "");

    if (report_fd >= 0 && n > 0) {
        ssize_t w;

        if ((size_t)n >= sizeof rec)
            n = (int)sizeof rec - 1;
        do
            w = write(report_fd, rec, (size_t)n);
        while (w < 0 && errno == EINTR);
    } else {
        fprintf(stderr, "sbxlimit _seatbelt_exec: %s: %s %s\n", step, strerror(err),
                msg ? msg : "");
    }
    _exit(EXIT_SETUP);
}

/* The whole file at fd, NUL-terminated; NULL with errno. */
static char *read_profile(int fd)
{
    struct stat st;
    size_t have = 0, cap;
    char *buf;

    if (fstat(fd, &st) < 0)
        return NULL;
    cap = st.st_size > 0 ? (size_t)st.st_size + 1 : 4096;
    if ((buf = malloc(cap)) == NULL)
        return NULL;
    for (;;) {
        ssize_t n;

        if (have + 1 == cap) { /* grew since fstat: a pipe, or a writer */
            char *more = realloc(buf, cap * 2);

            if (more == NULL) {
                free(buf);
                return NULL;
            }
            buf = more;
            cap *= 2;
        }
        n = read(fd, buf + have, cap - 1 - have);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int saved = errno;

            free(buf);
            errno = saved;
            return NULL;
        }
        if (n == 0)
            break;
        have += (size_t)n;
    }
    buf[have] = '\0';
    if (memchr(buf, '\0', have) != NULL) { /* the builder never writes one */
        free(buf);
        errno = EINVAL;
        return NULL;
    }
    return buf;
}

int main(int argc, char **argv)
{
    char msg[512];
    char *profile;
    int profile_fd, err;

    if (argc < 5 || (profile_fd = parse_fd(argv[1])) < 0 || (report_fd = parse_fd(argv[2])) < 0) {
        report_fd = -1;
        fail("seatbelt:args", EINVAL, "usage: _seatbelt_exec PROFILE_FD REPORT_FD TARGET ARGV0...");
    }
    if ((profile = read_profile(profile_fd)) == NULL)
        fail("seatbelt:profile", errno, "reading the profile");
    (void)close(profile_fd);
    if ((err = sbx_seatbelt_apply(profile, msg, sizeof msg)) != 0)
        fail("seatbelt:apply", err, msg);
    free(profile);
    if (fcntl(report_fd, F_SETFD, FD_CLOEXEC) < 0)
        fail("seatbelt:report", errno, "");
    if (strchr(argv[3], '/') != NULL)
        execv(argv[3], argv + 4);
    else
        execvp(argv[3], argv + 4);
    fail("exec", errno, "");
}
