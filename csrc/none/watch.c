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

int sbx_path_ident(const char *path, uint64_t ident[3])
{
    (void)path;
    (void)ident;
    return -ENOSYS;
}

int sbx_views_stale(int mounts_fd, int watch_fd, const uint64_t root[3], const uint64_t ns[3])
{
    (void)mounts_fd;
    (void)watch_fd;
    (void)root;
    (void)ns;
    return 1;
}
