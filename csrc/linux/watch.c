/* linux/watch.c -- inotify for the protected paths' search (_protected.py):
 * the search is reused until a directory it listed gets or loses a
 * subdirectory or a .git, or a file it read changes.  The kernel queues an
 * event within the system call that made the change, so draining the queue
 * before the search is reused sees every change made before. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/inotify.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "../sbx_internal.h"

/* Filesystems whose every change passes through this kernel: inotify
 * cannot see what another client of a network filesystem (or a FUSE
 * server) changes. */
static int local_fs(long type)
{
    switch ((unsigned long)type) {
    case 0xEF53UL:     /* ext2/3/4 */
    case 0x58465342UL: /* xfs */
    case 0x9123683EUL: /* btrfs */
    case 0x01021994UL: /* tmpfs */
    case 0x858458F6UL: /* ramfs */
    case 0x794C7630UL: /* overlayfs */
    case 0xF2F52010UL: /* f2fs */
    case 0x2FC12FC1UL: /* zfs */
        return 1;
    default:
        return 0;
    }
}

int sbx_watch_open(void)
{
    int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);

    return fd < 0 ? -errno : fd;
}

#define SBX_WATCH_DIR                                                                              \
    (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF |         \
     IN_ONLYDIR)
#define SBX_WATCH_FILE (IN_MODIFY | IN_CLOSE_WRITE | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF)
/* A file replaced by a rename loses a link: IN_ATTRIB. */
#define SBX_WATCH_ITSELF (IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF | IN_DONT_FOLLOW)

int sbx_watch_add(int fd, const char *path, int what)
{
    static const uint32_t masks[] = {
        [SBX_WATCH_CONTENT] = SBX_WATCH_FILE,
        [SBX_WATCH_ENTRIES] = SBX_WATCH_DIR,
        [SBX_WATCH_SELF] = SBX_WATCH_ITSELF,
    };
    struct statfs sf;
    int wd;

    if (what < SBX_WATCH_CONTENT || what > SBX_WATCH_SELF)
        return -EINVAL;
    wd = inotify_add_watch(fd, path, masks[what]);
    if (wd < 0)
        return -errno;
    /* After the watch: a mount made over the path meanwhile is seen as a
     * filesystem of another kind, never missed. */
    if (statfs(path, &sf) < 0)
        return -errno;
    return local_fs((long)sf.f_type) ? wd : wd | SBX_WATCH_REMOTE;
}

/* ev names one of names, where a name ending in '*' is a prefix. */
static int named(const struct inotify_event *ev, const char *const *names, size_t n)
{
    size_t i, len;

    for (i = 0; ev->len > 0 && i < n; i++) {
        len = strlen(names[i]);
        if (len > 0 && names[i][len - 1] == '*' ? strncmp(ev->name, names[i], len - 1) == 0
                                                : strcmp(ev->name, names[i]) == 0)
            return 1;
    }
    return 0;
}

/* An entry that changes what the search finds: a .git (a repository, a
 * file or a directory), a commondir (a worktree's gitdir), a directory
 * (the search descends into directories, never through links) but those
 * it never descends into (`skip`). */
static int matters(const struct inotify_event *ev, const char *const *skip, size_t n_skip)
{
    static const char *const git[] = {".git", "commondir"};

    if (ev->mask & (IN_Q_OVERFLOW | IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT |
                    IN_MODIFY | IN_CLOSE_WRITE | IN_ATTRIB))
        return 1;
    if (named(ev, git, 2))
        return 1;
    return (ev->mask & IN_ISDIR) && !named(ev, skip, n_skip);
}

/* Note wd among the n distinct ones found so far (-1: more than cap). */
static void note(int *wds, size_t cap, size_t *n, int wd)
{
    size_t i;

    if (*n > 0 && wds[0] == -1)
        return;
    for (i = 0; i < *n; i++)
        if (wds[i] == wd)
            return;
    if (wd < 0 || *n == cap) {
        wds[0] = -1;
        *n = 1;
        return;
    }
    wds[(*n)++] = wd;
}

int sbx_watch_changed(int fd, const char *const *skip, size_t n_skip, int *wds, size_t cap,
                      size_t *n_wds)
{
    /* Aligned as the kernel writes events; one read may hold many. */
    char buf[16384] __attribute__((aligned(__alignof__(struct inotify_event))));

    *n_wds = 0;
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        size_t off = 0;

        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN)
                return 0;
            return -errno;
        }
        if (n == 0)
            return -EIO;
        while (off + sizeof(struct inotify_event) <= (size_t)n) {
            const struct inotify_event *ev = (const struct inotify_event *)(buf + off);

            if (matters(ev, skip, n_skip))
                note(wds, cap, n_wds, (ev->mask & IN_Q_OVERFLOW) ? -1 : ev->wd);
            off += sizeof(struct inotify_event) + ev->len;
        }
    }
}

int sbx_mounts_changed(int fd)
{
    struct pollfd pfd = {.fd = fd, .events = POLLPRI, .revents = 0};
    int n = poll(&pfd, 1, 0);

    if (n < 0)
        return -errno;
    return n > 0 && (pfd.revents & (POLLPRI | POLLERR)) ? 1 : 0;
}

int sbx_path_ident(const char *path, uint64_t ident[3])
{
#ifdef STATX_MNT_ID
    struct statx sx;

    if (statx(AT_FDCWD, path, 0, STATX_INO | STATX_MNT_ID, &sx) < 0)
        return -errno;
    ident[0] = (uint64_t)makedev(sx.stx_dev_major, sx.stx_dev_minor);
    ident[1] = sx.stx_ino;
    ident[2] = (sx.stx_mask & STATX_MNT_ID) ? sx.stx_mnt_id : 0;
#else
    struct stat st;

    if (stat(path, &st) < 0)
        return -errno;
    ident[0] = (uint64_t)st.st_dev;
    ident[1] = (uint64_t)st.st_ino;
    ident[2] = 0;
#endif
    return 0;
}

/* path is still what ident says. */
static int same(const char *path, const uint64_t ident[3])
{
    uint64_t now[3];

    return sbx_path_ident(path, now) == 0 && memcmp(now, ident, sizeof now) == 0;
}

int sbx_views_stale(int mounts_fd, int watch_fd, const uint64_t root[3], const uint64_t ns[3])
{
    int wds[1];
    size_t n = 0;

    if (sbx_mounts_changed(mounts_fd) != 0 ||
        sbx_watch_changed(watch_fd, NULL, 0, wds, 1, &n) < 0 || n > 0)
        return 1;
    /* A chroot or an unshare since: the mount id tells a bind of "/"
     * from "/" itself. */
    return !same("/", root) || !same("/proc/thread-self/ns/mnt", ns);
}
