/* none/watch.c -- no inotify on this platform (linux/watch.c's stand-in):
 * the protected paths' search is reused for its TTL only. */
#include <errno.h>

#include "../sbx_internal.h"

int sbx_watch_open(void)
{
    return -ENOSYS;
}

int sbx_watch_add(int fd, const char *path, int what)
{
    (void)fd;
    (void)path;
    (void)what;
    return -ENOSYS;
}

int sbx_mounts_changed(int fd)
{
    (void)fd;
    return -ENOSYS;
}

int sbx_watch_changed(int fd, const char *const *skip, size_t n_skip, int *wds, size_t cap,
                      size_t *n_wds)
{
    (void)fd;
    (void)skip;
    (void)n_skip;
    (void)wds;
    (void)cap;
    *n_wds = 0;
    return -ENOSYS;
}
