/* fsbatch.c -- the supervisor's directory work, many system calls in one
 * call (see sbx_fs_batch in sbx.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sbx.h"

/* Where a step's relative path starts.  A path from a directory kept open
 * skips the walk from "/": on kernfs every name of a cgroup's path is
 * looked up the slow way (no RCU walk), most of an open's cost. */
static int dir_of(const struct sbx_fs_step *s)
{
    return s->dir >= 0 ? s->dir : AT_FDCWD;
}

/* openat(dir, path, flags | O_CLOEXEC), again if a signal interrupts it. */
static int open_cloexec(int dir, const char *path, int flags)
{
    int fd;

    do {
        fd = openat(dir, path, flags | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    return fd;
}

static int write_whole(int dir, const char *path, const char *data, size_t len)
{
    int fd, saved;
    ssize_t n;

    fd = open_cloexec(dir, path, O_WRONLY);
    if (fd < 0)
        return errno;
    /* kernfs and cgroupfs take a value in one write(): a short one is an
     * error, not a reason to write the rest. */
    do {
        n = write(fd, data, len);
    } while (n < 0 && errno == EINTR);
    saved = n < 0 ? errno : (size_t)n != len ? EIO : 0;
    close(fd);
    return saved;
}

/* Read fd until a read gives nothing (never a short read taken for the
 * whole file); `at_start`: through pread from offset 0, for a file kept
 * open and read again.  0, EFBIG when it fills the buffer, or errno. */
static int read_from_start(struct sbx_fs_step *s, int fd, int at_start)
{
    ssize_t n;

    s->len = 0;
    for (;;) {
        if (s->len >= s->cap) /* full: whether more follows is unknown */
            return EFBIG;
        if (at_start)
            n = pread(fd, s->buf + s->len, s->cap - s->len, (off_t)s->len);
        else
            n = read(fd, s->buf + s->len, s->cap - s->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return errno;
        if (n == 0)
            return 0;
        s->len += (size_t)n;
    }
}

static int read_whole(struct sbx_fs_step *s)
{
    int fd, err;

    fd = open_cloexec(dir_of(s), s->path, O_RDONLY);
    if (fd < 0)
        return errno;
    err = read_from_start(s, fd, 0);
    close(fd);
    return err;
}

static int open_kept(struct sbx_fs_step *s, int flags)
{
    char scratch[512];
    ssize_t n;
    int fd;

    fd = open_cloexec(dir_of(s), s->path, flags);
    if (fd < 0)
        return errno;
    if (flags == O_RDONLY) {
        do {
            n = pread(fd, scratch, sizeof scratch, 0);
        } while (n < 0 && errno == EINTR);
        if (n < 0) {
            int saved = errno;

            close(fd);
            return saved;
        }
    }
    s->fd = fd;
    return 0;
}

/* "<eventfd> <fd of the watched file><arg>" into cgroup.event_control. */
static int v1_event(const struct sbx_fs_step *s)
{
    size_t plen = s->data ? strnlen(s->data, s->len) : 0;
    const char *arg = plen < s->len ? s->data + plen + 1 : "";
    size_t alen = plen < s->len ? s->len - plen - 1 : 0;
    char line[96];
    int watched, n, err;

    if (!s->data || plen == 0 || plen == s->len || alen > 32 || s->fd < 0)
        return EINVAL;
    watched = open_cloexec(dir_of(s), s->data, O_RDONLY);
    if (watched < 0)
        return errno;
    n = snprintf(line, sizeof line, "%d %d%.*s", s->fd, watched, (int)alen, arg);
    err = n < 0 || (size_t)n >= sizeof line ? EINVAL
                                            : write_whole(dir_of(s), s->path, line, (size_t)n);
    close(watched);
    return err;
}

/* Whether the directory open as fd holds nothing but `only` (NULL:
 * nothing): 0, ENOTEMPTY, or the errno listing it failed with.  Takes fd. */
static int holds_only(int fd, const char *only)
{
    struct dirent *e;
    DIR *d = fdopendir(fd);
    int err = 0;

    if (!d) {
        err = errno;
        close(fd);
        return err;
    }
    errno = 0;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (!only || strcmp(e->d_name, only) != 0) {
            err = ENOTEMPTY;
            break;
        }
    }
    if (!e && errno != 0)
        err = errno;
    closedir(d);
    return err;
}

/* A workspace whose program left nothing: path holding an empty tmp/.
 * Anything else is left whole (ENOTEMPTY).  An entry made in path between
 * the look and the last rmdir (the program is gone by then: only the
 * caller's own code could) fails that rmdir the same way, tmp/ removed. */
static int rm_workspace(struct sbx_fs_step *s)
{
    struct stat st;
    int dir, tmp, err;

    memset(&st, 0, sizeof st);
    dir = open_cloexec(dir_of(s), s->path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (dir < 0)
        return errno;
    tmp = fcntl(dir, F_DUPFD_CLOEXEC, 0); /* fdopendir takes it */
    err = tmp < 0 ? errno : holds_only(tmp, "tmp");
    if (err == 0) {
        tmp = openat(dir, "tmp", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (tmp < 0)
            err = errno == ENOTDIR || errno == ELOOP ? ENOTEMPTY : errno;
        else if (fstat(tmp, &st) < 0) {
            err = errno;
            close(tmp);
        } else
            err = holds_only(tmp, NULL);
    }
    if (err == 0 && unlinkat(dir, "tmp", AT_REMOVEDIR) < 0)
        err = errno;
    close(dir);
    if (err == 0 && unlinkat(dir_of(s), s->path, AT_REMOVEDIR) < 0)
        err = errno;
    if (err == 0)
        s->len = (size_t)st.st_blocks * 512;
    return err;
}

static int run_step(struct sbx_fs_step *s)
{
    switch (s->op) {
    case SBX_FS_MKDIR:
        return mkdirat(dir_of(s), s->path, 0755) < 0 ? errno : 0;
    case SBX_FS_RMDIR:
        return unlinkat(dir_of(s), s->path, AT_REMOVEDIR) < 0 ? errno : 0;
    case SBX_FS_WRITE:
        return write_whole(dir_of(s), s->path, s->data, s->len);
    case SBX_FS_WRITE_OPTIONAL: {
        int err = write_whole(dir_of(s), s->path, s->data, s->len);
        return err == ENOENT ? 0 : err;
    }
    case SBX_FS_READ:
        return read_whole(s);
    case SBX_FS_STAT: {
        struct stat st;

        if (fstatat(dir_of(s), s->path, &st, 0) < 0)
            return errno;
        s->dev = (unsigned long long)st.st_dev;
        s->ino = (unsigned long long)st.st_ino;
        return 0;
    }
    case SBX_FS_OPEN_WRITE:
        return open_kept(s, O_WRONLY);
    case SBX_FS_OPEN_READ:
        return open_kept(s, O_RDONLY);
    case SBX_FS_V1_EVENT:
        return v1_event(s);
    case SBX_FS_CLOSE:
        /* Linux frees the number even when close is interrupted. */
        return close(s->fd) < 0 && errno != EINTR ? errno : 0;
    case SBX_FS_RM_WORKSPACE:
        return rm_workspace(s);
    case SBX_FS_PREAD:
        return read_from_start(s, s->fd, 1);
    default:
        return EINVAL;
    }
}

size_t sbx_fs_batch(struct sbx_fs_step *steps, size_t n, int stop_at_error)
{
    size_t i, failed = 0;

    for (i = 0; i < n; i++) {
        steps[i].err = -1;
        if (steps[i].op == SBX_FS_OPEN_WRITE || steps[i].op == SBX_FS_OPEN_READ)
            steps[i].fd = -1;
    }
    for (i = 0; i < n; i++) {
        steps[i].err = run_step(&steps[i]);
        if (steps[i].err != 0) {
            failed++;
            if (stop_at_error)
                break;
        }
    }
    return failed;
}
