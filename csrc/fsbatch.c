/* fsbatch.c -- the supervisor's directory work, many system calls in one
 * call (see sbx_fs_batch in sbx.h). */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sbx.h"

static int write_whole(const char *path, const char *data, size_t len)
{
    int fd, saved;
    ssize_t n;

    do {
        fd = open(path, O_WRONLY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
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

static int read_whole(struct sbx_fs_step *s)
{
    int fd, saved = 0;
    ssize_t n;

    s->len = 0;
    do {
        fd = open(s->path, O_RDONLY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return errno;
    for (;;) {
        if (s->len >= s->cap) { /* full: whether more follows is unknown */
            saved = EFBIG;
            break;
        }
        n = read(fd, s->buf + s->len, s->cap - s->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            saved = errno;
            break;
        }
        if (n == 0)
            break;
        s->len += (size_t)n;
    }
    close(fd);
    return saved;
}

static int run_step(struct sbx_fs_step *s)
{
    switch (s->op) {
    case SBX_FS_MKDIR:
        return mkdir(s->path, 0755) < 0 ? errno : 0;
    case SBX_FS_RMDIR:
        return rmdir(s->path) < 0 ? errno : 0;
    case SBX_FS_WRITE:
        return write_whole(s->path, s->data, s->len);
    case SBX_FS_WRITE_OPTIONAL: {
        int err = write_whole(s->path, s->data, s->len);
        return err == ENOENT ? 0 : err;
    }
    case SBX_FS_READ:
        return read_whole(s);
    case SBX_FS_STAT: {
        struct stat st;

        if (stat(s->path, &st) < 0)
            return errno;
        s->dev = (unsigned long long)st.st_dev;
        s->ino = (unsigned long long)st.st_ino;
        return 0;
    }
    default:
        return EINVAL;
    }
}

size_t sbx_fs_batch(struct sbx_fs_step *steps, size_t n, int stop_at_error)
{
    size_t i, failed = 0;

    for (i = 0; i < n; i++)
        steps[i].err = -1;
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
