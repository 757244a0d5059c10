/* fds.c -- file descriptors in the child: keep pass_fds, close the rest.
 *
 * close_range(2) closes each gap between kept fds in one call; kernels
 * older than 5.9 get the /proc/self/fd walk CPython uses, then brute force.
 * macOS has neither: brute force up to a bound the parent takes before the
 * child lowers RLIMIT_NOFILE (sbx_fds_top).
 *
 * SBX_TEST_PORTABLE_FDS (tests/c/darwin/test_fds.c): macOS's path on Linux,
 * without close_range and the /proc walk, with a model of libproc.
 *
 * Also the parent's close-on-exec pipes (sbx_pipe_cloexec), for spawn.c's
 * error pipe and probe.c's.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

/* SYS_close_range, SYS_getdents64: the test switch leaves them undefined. */
#if defined(__linux__) && !defined(SBX_TEST_PORTABLE_FDS)
#include <sys/syscall.h>
#endif
#if defined(__APPLE__) || defined(SBX_TEST_PORTABLE_FDS)
#include <libproc.h>
#define SBX_FDS_LIBPROC 1
#endif

#include "sbx_internal.h"

/* Brute force stops here unless an open fd is known above it. */
#define SBX_FDS_SCAN_MAX 65536u

int sbx_pipe_cloexec(int fds[2])
{
#if defined(__linux__) || defined(__FreeBSD__)
    return pipe2(fds, O_CLOEXEC);
#else
    if (pipe(fds) < 0)
        return -1;
    if (fcntl(fds[0], F_SETFD, FD_CLOEXEC) < 0 || fcntl(fds[1], F_SETFD, FD_CLOEXEC) < 0) {
        int saved = errno;

        close(fds[0]);
        close(fds[1]);
        errno = saved;
        return -1;
    }
    return 0;
#endif
}

#if defined(__linux__) && defined(SYS_getdents64)
static int is_kept(const struct sbx_child_ctx *ctx, int fd)
{
    size_t i;

    if (fd == ctx->errfd)
        return 1;
    for (i = 0; i < ctx->spec->n_keep_fds; i++)
        if (ctx->spec->keep_fds[i] == fd)
            return 1;
    return 0;
}
#endif

/* Smallest kept fd greater than `after`, or -1. */
static int next_kept(const struct sbx_child_ctx *ctx, int after)
{
    int best = ctx->errfd > after ? ctx->errfd : -1;
    size_t i;

    for (i = 0; i < ctx->spec->n_keep_fds; i++) {
        int fd = ctx->spec->keep_fds[i];
        if (fd > after) {
            if (best < 0 || fd < best)
                best = fd;
            break; /* sorted */
        }
    }
    return best;
}

void sbx_fds_keep_child(const struct sbx_child_ctx *ctx)
{
    const struct sbx_spec *s = ctx->spec;
    size_t i;

    for (i = 0; i < s->n_keep_fds; i++) {
        int fd = s->keep_fds[i], flags;

        if (fd == ctx->errfd)
            continue;
        if (s->fail_step == SBX_STEP_PASS_FDS)
            sbx_child_fail(ctx, SBX_STEP_PASS_FDS, s->fail_errno, fd);
        flags = fcntl(fd, F_GETFD);
        if (flags < 0 || ((flags & FD_CLOEXEC) && fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC) < 0))
            sbx_child_fail(ctx, SBX_STEP_PASS_FDS, errno, fd);
    }
}

#if defined(__linux__) && defined(SYS_getdents64)
struct linux_dirent64 {
    unsigned long long d_ino;
    long long d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

/* Close every unkept fd >= 3 listed in /proc/self/fd; 0 on success. */
static int close_by_proc_child(const struct sbx_child_ctx *ctx)
{
    char buf[1024] __attribute__((aligned(8)));
    int dirfd = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    long n;

    if (dirfd < 0)
        return -1;
    while ((n = syscall(SYS_getdents64, dirfd, buf, sizeof buf)) > 0) {
        long off = 0;
        while (off < n) {
            struct linux_dirent64 *d = (struct linux_dirent64 *)(buf + off);
            const char *p = d->d_name;
            int fd = 0;

            off += d->d_reclen;
            if (*p < '0' || *p > '9')
                continue;
            for (; *p >= '0' && *p <= '9'; p++)
                fd = fd * 10 + (*p - '0');
            if (fd >= 3 && fd != dirfd && !is_kept(ctx, fd))
                close(fd);
        }
    }
    close(dirfd);
    return n < 0 ? -1 : 0;
}
#endif

static void close_gap_child(const struct sbx_child_ctx *ctx, unsigned lo, unsigned hi,
                            int *use_close_range)
{
#ifdef SYS_close_range
    if (*use_close_range) {
        if (syscall(SYS_close_range, lo, hi, 0) == 0)
            return;
        if (errno != ENOSYS && errno != EINVAL)
            sbx_child_fail(ctx, SBX_STEP_CLOSE_FDS, errno, lo);
        *use_close_range = 0;
    }
#endif
    (void)use_close_range;
    {
        /* Not the current RLIMIT_NOFILE: Limits.open_files has lowered it
         * by now, and fds above it are open all the same. */
        unsigned fd, top = ctx->fd_top;

        for (fd = lo; fd <= hi && fd < top; fd++)
            close((int)fd);
    }
}

#ifdef SBX_FDS_LIBPROC
/* The highest fd open in this process, or -1.  PROC_PIDLISTFDS fills
 * struct proc_fdinfo entries and returns bytes, never more than fit: a full
 * buffer (fds opened meanwhile) is asked again with twice the room. */
static int highest_fd(void)
{
    pid_t self = getpid();
    /* A NULL buffer: the fd table's size plus room for 20, in bytes. */
    int size = proc_pidinfo(self, PROC_PIDLISTFDS, 0, NULL, 0);
    int hi = -1;

    while (size > 0) {
        struct proc_fdinfo *fds = malloc((size_t)size);
        int got, i;

        if (!fds)
            return -1;
        got = proc_pidinfo(self, PROC_PIDLISTFDS, 0, fds, size);
        if (got + (int)sizeof *fds > size && size <= INT_MAX / 2) {
            free(fds);
            size *= 2;
            continue;
        }
        for (i = 0; i < got / (int)sizeof *fds; i++)
            if (fds[i].proc_fd > hi)
                hi = fds[i].proc_fd;
        free(fds);
        break;
    }
    return hi;
}
#endif

unsigned sbx_fds_top(void)
{
    struct rlimit rl;
    unsigned top = SBX_FDS_SCAN_MAX;

    /* An fd another thread opens before the fork is below the soft limit. */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < top)
        top = (unsigned)rl.rlim_cur;
#ifdef SBX_FDS_LIBPROC
    {
        /* An fd opened before the soft limit was lowered lies above it. */
        int hi = highest_fd();

        if (hi >= 0 && (unsigned)hi >= top)
            top = (unsigned)hi + 1;
    }
#endif
    return top;
}

void sbx_fds_close_child(const struct sbx_child_ctx *ctx)
{
    int use_close_range = 1;
    int lo = 3, kept;

    if (!ctx->spec->close_fds)
        return;
    if (ctx->spec->fail_step == SBX_STEP_CLOSE_FDS)
        sbx_child_fail(ctx, SBX_STEP_CLOSE_FDS, ctx->spec->fail_errno, 3);
    while ((kept = next_kept(ctx, lo - 1)) >= 0) {
        if (kept > lo) {
            close_gap_child(ctx, (unsigned)lo, (unsigned)kept - 1, &use_close_range);
            if (!use_close_range)
                break;
        }
        lo = kept + 1;
    }
    if (use_close_range) {
        close_gap_child(ctx, (unsigned)lo, UINT_MAX, &use_close_range);
        if (use_close_range)
            return;
    }
#if defined(__linux__) && defined(SYS_getdents64)
    if (close_by_proc_child(ctx) == 0)
        return;
#endif
    /* Last resort: brute force every gap. */
    lo = 3;
    while ((kept = next_kept(ctx, lo - 1)) >= 0) {
        if (kept > lo)
            close_gap_child(ctx, (unsigned)lo, (unsigned)kept - 1, &use_close_range);
        lo = kept + 1;
    }
    close_gap_child(ctx, (unsigned)lo, UINT_MAX, &use_close_range);
}
