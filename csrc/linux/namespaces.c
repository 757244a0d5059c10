/* linux/namespaces.c -- the child's namespaces: user (when unprivileged), network,
 * mount and PID, entered right after pdeathsig and before the rlimits.
 *
 * Everything is prepared in the parent (map strings, mount data, paths);
 * the child only makes system calls.  Order matters:
 *   unshare -> id maps (before anything that creates files or needs a
 *   mapped uid) -> loopback up -> mounts made slaves (so that nothing
 *   mounted here propagates to the host) -> tmpfs on the workspace, its
 *   root's fd sent to the parent -> PID namespace: fork PID 1.
 *
 * The read-only view (spec->view_ro_root, spec->view): in the child's own
 * mount namespace the host is read-only and nosuid, the writable roots are
 * bound back as the host has them (nosuid, nodev), protected paths are
 * re-bound read-only on top, and deny_read paths are covered (an empty
 * read-only tmpfs, or /dev/null): their contents, names and sockets are gone
 * for the program; /dev holds only null, zero, full, random, urandom, tty,
 * a pty instance and shm of its own.  This is the file rules' first layer, and the only one
 * on a kernel without Landlock; it needs the new mount API (Linux 5.12:
 * open_tree, move_mount, mount_setattr), which sets flags on a whole tree
 * at once.  The writable trees are cloned before "/" turns read-only, so
 * what the host mounted read-only beneath them stays read-only.
 *
 * A mount namespace dies with its last process, and the tmpfs with it; the
 * parent keeps the fd it was sent, so what the program left stays readable
 * until the caller closes the sandbox (SPEC 3, workdir).
 *
 * PID namespace: the child is cloned straight into it (fork-like, without
 * CLONE_VM: it outlives exec) and is PID 1, a reaper that forwards signals
 * to the target and reaps whatever is orphaned inside.  The target is its
 * CLONE_VM|CLONE_VFORK child and goes on with the setup.  When the target
 * ends, PID 1 writes its wait status to the status pipe and exits with the
 * same code, and the kernel kills everything left in the namespace.  PID 1
 * cannot die of a signal it sends itself: the caller reads the program's
 * own status, signals included, from the pipe at the reap.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../sbx_internal.h"
#include "reaper.h"

#ifndef SYS_close_range
#define SYS_close_range 436
#endif
/* The new mount API (linux/mount.h), spelled out so that the build does not
 * depend on the installed headers: the numbers are the same on every
 * architecture. */
#ifndef SYS_open_tree
#define SYS_open_tree 428
#endif
#ifndef SYS_move_mount
#define SYS_move_mount 429
#endif
#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif
#ifndef SYS_fsopen
#define SYS_fsopen 430
#endif
#ifndef SYS_fsconfig
#define SYS_fsconfig 431
#endif
#ifndef SYS_fsmount
#define SYS_fsmount 432
#endif
struct sbx_mount_attr {
    uint64_t attr_set, attr_clr, propagation, userns_fd;
};
#define SBX_MOUNT_ATTR_RDONLY     0x1
#define SBX_MOUNT_ATTR_NOSUID     0x2
#define SBX_MOUNT_ATTR_NODEV      0x4
#define SBX_MOUNT_ATTR_NOEXEC     0x8
#define SBX_OPEN_TREE_CLONE       1
#define SBX_MOVE_MOUNT_F_EMPTY    0x4
#define SBX_AT_RECURSIVE          0x8000
#define SBX_AT_EMPTY_PATH         0x1000
#define SBX_AT_SYMLINK_NOFOLLOW   0x100
#define SBX_STATX_ATTR_MOUNT_ROOT 0x2000
#define SBX_FSOPEN_CLOEXEC        0x1
#define SBX_FSMOUNT_CLOEXEC       0x1
#define SBX_FSCONFIG_SET_STRING   1
#define SBX_FSCONFIG_CMD_CREATE   6

static int write_file(const char *path, const char *text)
{
    size_t len = strlen(text);
    ssize_t n;
    int fd = open(path, O_WRONLY | O_CLOEXEC);

    if (fd < 0)
        return -1;
    do {
        n = write(fd, text, len);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    close(fd);
    return 0;
}

/* An unprivileged user namespace may map only its creator's ids, and only
 * once setgroups is denied. */
static int idmap(const char *uid_map, const char *gid_map)
{
    if (write_file("/proc/self/setgroups", "deny") < 0 && errno != ENOENT)
        return -1;
    if (write_file("/proc/self/uid_map", uid_map) < 0)
        return -1;
    return write_file("/proc/self/gid_map", gid_map);
}

/* A new network namespace has only lo, and it is down. */
static int loopback_up(void)
{
    struct ifreq ifr;
    int saved, fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);

    if (fd < 0)
        return -1;
    memset(&ifr, 0, sizeof ifr);
    memcpy(ifr.ifr_name, "lo", 3);
    if (ioctl(fd, SIOCGIFFLAGS, &ifr) < 0)
        goto fail;
    ifr.ifr_flags |= IFF_UP;
    if (ioctl(fd, SIOCSIFFLAGS, &ifr) < 0)
        goto fail;
    close(fd);
    return 0;
fail:
    saved = errno;
    close(fd);
    errno = saved;
    return -1;
}

/* Mounts made from here on stay in this namespace, and the host's do not
 * come in.  Without this, a shared "/" (systemd's default) would carry the
 * tmpfs, and a new /proc, back to the host; as a slave, a mount the host
 * made meanwhile (a volume, a login's /run/user) would come in with its
 * own flags, writable, past the read-only view. */
static int make_private(void)
{
    return mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
}

/* ---- the read-only view ------------------------------------------------ */

/* Close the fds >= 0 among fds[0..n), errno kept. */
static void close_all(const int *fds, size_t n)
{
    int saved = errno;
    size_t i;

    for (i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    errno = saved;
}

static int set_attr(int dfd, const char *path, unsigned flags, uint64_t set)
{
    struct sbx_mount_attr attr;

    memset(&attr, 0, sizeof attr);
    attr.attr_set = set;
    return (int)syscall(SYS_mount_setattr, dfd, path, flags, &attr, sizeof attr);
}

/* A detached copy of the tree at path (recursive: what is mounted below
 * comes along), or -1 with errno. */
static int clone_tree(const char *path, unsigned recursive)
{
    return (int)syscall(SYS_open_tree, AT_FDCWD, path,
                        SBX_OPEN_TREE_CLONE | O_CLOEXEC | SBX_AT_SYMLINK_NOFOLLOW | recursive);
}

/* Put the detached tree fd over path, with `set` added to its flags. */
static int attach(int fd, const char *path, uint64_t set)
{
    if (set && set_attr(fd, "", SBX_AT_EMPTY_PATH | SBX_AT_RECURSIVE, set) < 0)
        return -1;
    return (int)syscall(SYS_move_mount, fd, "", AT_FDCWD, path, SBX_MOVE_MOUNT_F_EMPTY);
}

/* Bind the tree at src over path, with `set` added to its flags. */
static int bind_tree(const char *src, const char *path, unsigned recursive, uint64_t set)
{
    int saved, rc, fd = clone_tree(src, recursive);

    if (fd < 0)
        return -1;
    rc = attach(fd, path, set);
    saved = errno;
    close(fd);
    errno = saved;
    return rc;
}

/* Bind the tree at src read-only over path. */
static int bind_ro(const char *src, const char *path, unsigned recursive)
{
    return bind_tree(src, path, recursive, SBX_MOUNT_ATTR_RDONLY | SBX_MOUNT_ATTR_NOSUID);
}

/* The mount at path (the kernel's own: /proc, /sys) read-only and nosuid
 * where it is, with what is mounted below it.  A read-only copy bound over
 * it would do as much, and leave the writable tree beneath: every mount of
 * a namespace is copied, and torn down, with each sandbox's.  The fd
 * holds the mount checked: not the root of one (unmounted meanwhile), the
 * flags would land on the mount around it, so it is bound over instead. */
static int ro_where_it_is(const char *path)
{
    struct statx sx;
    int rc, saved,
        fd = (int)syscall(SYS_open_tree, AT_FDCWD, path, O_CLOEXEC | SBX_AT_SYMLINK_NOFOLLOW);

    if (fd < 0)
        return -1;
    if (statx(fd, "", SBX_AT_EMPTY_PATH, 0, &sx) == 0 &&
        (sx.stx_attributes_mask & SBX_STATX_ATTR_MOUNT_ROOT) &&
        (sx.stx_attributes & SBX_STATX_ATTR_MOUNT_ROOT))
        rc = set_attr(fd, "", SBX_AT_EMPTY_PATH | SBX_AT_RECURSIVE,
                      SBX_MOUNT_ATTR_RDONLY | SBX_MOUNT_ATTR_NOSUID);
    else
        rc = bind_ro(path, path, SBX_AT_RECURSIVE);
    saved = errno;
    close(fd);
    errno = saved;
    return rc;
}

/* The host's /dev and what is mounted on it (its shm, its pts), gone from
 * the namespace made once before a /dev of our own covers them: hidden,
 * they would still be copied with each sandbox's namespace.  Not in a
 * child that makes its own view: an unmount waits for an RCU grace period
 * (some 100 us here), more than the copies cost.  Best effort: "/dev" may
 * be no mount: covered then, as before. */
static void detach_host_dev(void)
{
    (void)umount2("/dev", MNT_DETACH);
}

static int writable(const struct sbx_view *v)
{
    return v->kind == SBX_VIEW_RW || v->kind == SBX_VIEW_RW_DEV;
}

/* Detached clones of the view's writable trees into fds, in order (-1 for
 * one not there), or -1 with errno and index[0] the entry's.  The clones'
 * fds live on the caller's stack: a child writes nothing to the parent's
 * memory. */
static int clone_rw(const struct sbx_view *view, size_t n_view, int *fds, int64_t *index)
{
    size_t i, n = 0;

    for (i = 0; i < n_view && n < SBX_VIEW_MAX_RW; i++) {
        if (!writable(&view[i]))
            continue;
        fds[n] = clone_tree(view[i].path, SBX_AT_RECURSIVE);
        if (fds[n] < 0 && errno != ENOENT) {
            *index = (int64_t)i;
            close_all(fds, n);
            return -1;
        }
        n++;
    }
    return 0;
}

/* Put the clones back where they were (each fd closed), or -1 with errno
 * and index[0] the entry's. */
static int attach_rw(const struct sbx_view *view, size_t n_view, int *fds, int64_t *index)
{
    size_t i, n = 0;
    int rc = 0;

    for (i = 0; i < n_view && n < SBX_VIEW_MAX_RW; i++) {
        uint64_t set = SBX_MOUNT_ATTR_NOSUID;

        if (!writable(&view[i]))
            continue;
        if (fds[n] >= 0 && rc == 0) {
            if (view[i].kind == SBX_VIEW_RW)
                set |= SBX_MOUNT_ATTR_NODEV;
            rc = attach(fds[n], view[i].path, set);
            *index = (int64_t)i;
        }
        if (fds[n] >= 0)
            close_all(&fds[n], 1);
        n++;
    }
    return rc;
}

static int ro_root(void)
{
    return set_attr(AT_FDCWD, "/", SBX_AT_RECURSIVE, SBX_MOUNT_ATTR_RDONLY | SBX_MOUNT_ATTR_NOSUID);
}

/* The host read-only, the writable trees back as they were; fds: clones
 * made already (a view copied: made before the child joined it), or NULL. */
static void view_begin_child(const struct sbx_child_ctx *ctx, int *made)
{
    const struct sbx_spec *s = ctx->spec;
    int own[SBX_VIEW_MAX_RW], *fds = made != NULL ? made : own;
    int64_t index = -1;

    if (made == NULL && clone_rw(s->view, s->n_view, fds, &index) < 0)
        sbx_child_fail(ctx, SBX_STEP_NS_VIEW, errno, index);
    if (made == NULL && s->view_ro_root)
        SBX_CHILD_STEP(ctx, SBX_STEP_NS_VIEW, -1, ro_root());
    if (attach_rw(s->view, s->n_view, fds, &index) < 0)
        sbx_child_fail(ctx, SBX_STEP_NS_VIEW, errno, index);
}

static int allow_root(const struct sbx_spec *s, const char *path);

/* A /dev of its own: a read-only tmpfs holding only what programs need,
 * the host's device nodes bound in one by one, a devpts instance of its
 * own (no pty of the host's to read or type into), and a private /dev/shm
 * (a SBX_VIEW_TMPFS entry).  The host's /dev would give a root program its
 * raw disks (reads past deny_read; writes where Landlock is missing), and
 * any program every terminal of its user.  As bubblewrap's --dev does. */
static const char *const dev_nodes[] = {"null", "zero", "full", "random", "urandom", "tty"};
#define N_DEV_NODES (sizeof dev_nodes / sizeof dev_nodes[0])
/* (target, name in /dev) */
static const char *const dev_links[][2] = {
    {"/proc/self/fd", "fd"},       {"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"},
    {"/proc/self/fd/2", "stderr"}, {"pts/ptmx", "ptmx"},
};
#define N_DEV_LINKS (sizeof dev_links / sizeof dev_links[0])

static int dev_path(char *buf, size_t size, const char *name)
{
    size_t n = strlen(name);

    if (n + 6 > size)
        return -1;
    memcpy(buf, "/dev/", 5);
    memcpy(buf + 5, name, n + 1);
    return 0;
}

/* The instance of devpts, of its own: no pty of the host's to read or
 * type into. */
static int own_devpts(const struct sbx_spec *s)
{
    if (mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
              "newinstance,ptmxmode=0666,mode=0620") < 0)
        return -1;
    return allow_root(s, "/dev/pts");
}

/* Detached clones of the host's nodes into nodes[] (-1 for one it lacks);
 * 0, or -1 with errno with none left open. */
static int clone_nodes(int nodes[N_DEV_NODES])
{
    char path[32];
    size_t i;

    for (i = 0; i < N_DEV_NODES; i++) {
        nodes[i] = dev_path(path, sizeof path, dev_nodes[i]) < 0 ? -1 : clone_tree(path, 0);
        if (nodes[i] < 0 && errno != ENOENT) {
            close_all(nodes, i);
            return -1;
        }
    }
    return 0;
}

/* Fill the empty tmpfs at dir (an fd on its root): the nodes bound onto
 * files of their names, pts and shm, the links; then make it read-only.
 * The nodes' fds are closed.  The child's (private_dev) and the parent's
 * template (sbx_ns_dev_template) alike. */
static int fill_dev(int dir, int nodes[N_DEV_NODES])
{
    size_t i;
    int saved = 0;

    for (i = 0; i < N_DEV_NODES && !saved; i++) {
        int fd;

        if (nodes[i] < 0)
            continue;
        fd = openat(dir, dev_nodes[i], O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 || close(fd) < 0 ||
            syscall(SYS_move_mount, nodes[i], "", dir, dev_nodes[i], SBX_MOVE_MOUNT_F_EMPTY) < 0)
            saved = errno;
    }
    close_all(nodes, N_DEV_NODES);
    if (!saved && (mkdirat(dir, "pts", 0755) < 0 || mkdirat(dir, "shm", 01777) < 0))
        saved = errno;
    for (i = 0; i < N_DEV_LINKS && !saved; i++)
        if (symlinkat(dev_links[i][0], dir, dev_links[i][1]) < 0)
            saved = errno;
    if (!saved && set_attr(dir, "", SBX_AT_EMPTY_PATH, SBX_MOUNT_ATTR_RDONLY) < 0)
        saved = errno;
    errno = saved;
    return saved ? -1 : 0;
}

/* template: a clone of the parent's template (sbx_ns_dev_template), made
 * before the unshare, or -1: build the same tree here. */
static int private_dev(const struct sbx_spec *s, int template)
{
    int nodes[N_DEV_NODES], dir, rc;

    if (template >= 0)
        return attach(template, "/dev", 0) < 0 ? -1 : own_devpts(s);
    /* The host's nodes first: the tmpfs hides them. */
    if (clone_nodes(nodes) < 0)
        return -1;
    if (mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=64k") <
            0 ||
        (dir = open("/dev", O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0) {
        close_all(nodes, N_DEV_NODES);
        return -1;
    }
    rc = fill_dev(dir, nodes) < 0 ? -1 : own_devpts(s);
    close_all(&dir, 1);
    return rc;
}

/* Parent side: the tree private_dev builds, made once as a detached mount
 * (Linux 6.15+ mounts the nodes onto it), for each child to clone whole. */
int sbx_ns_dev_template(void)
{
    int nodes[N_DEV_NODES];
    int saved = 0, fd, dev = -1, fs = (int)syscall(SYS_fsopen, "tmpfs", SBX_FSOPEN_CLOEXEC);

    if (fs < 0)
        return -1;
    if (syscall(SYS_fsconfig, fs, SBX_FSCONFIG_SET_STRING, "source", "tmpfs", 0) < 0 ||
        syscall(SYS_fsconfig, fs, SBX_FSCONFIG_SET_STRING, "mode", "0755", 0) < 0 ||
        syscall(SYS_fsconfig, fs, SBX_FSCONFIG_SET_STRING, "size", "64k", 0) < 0 ||
        syscall(SYS_fsconfig, fs, SBX_FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0 ||
        (dev = (int)syscall(SYS_fsmount, fs, SBX_FSMOUNT_CLOEXEC,
                            SBX_MOUNT_ATTR_NOSUID | SBX_MOUNT_ATTR_NODEV | SBX_MOUNT_ATTR_NOEXEC)) <
            0 ||
        clone_nodes(nodes) < 0 || fill_dev(dev, nodes) < 0) {
        saved = errno;
        goto out;
    }
    /* What each child will do with it: a kernel that builds the tree but
     * cannot clone it would fail every spawn, where it can fall back now. */
    fd = (int)syscall(SYS_open_tree, dev, "",
                      SBX_OPEN_TREE_CLONE | O_CLOEXEC | SBX_AT_EMPTY_PATH | SBX_AT_RECURSIVE);
    if (fd < 0)
        saved = errno;
    else
        close(fd);
out:
    close(fs);
    if (saved && dev >= 0)
        close(dev);
    errno = saved;
    return saved ? -1 : dev;
}

/* Protected paths, hidden paths, private tmpfs: in the order given. */
static int view_entry(const struct sbx_spec *s, const struct sbx_view *v)
{
    switch (v->kind) {
    case SBX_VIEW_RO: /* data: a link's target, bound over the link itself */
        return bind_ro(v->data != NULL ? v->data : v->path, v->path, SBX_AT_RECURSIVE);
    case SBX_VIEW_RO_MOUNT:
        return ro_where_it_is(v->path);
    case SBX_VIEW_HIDE:
        return bind_ro("/dev/null", v->path, 0);
    case SBX_VIEW_HIDE_DIR:
        return mount("tmpfs", v->path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                     "size=4k,mode=0555");
    case SBX_VIEW_TMPFS:
        if (mount("tmpfs", v->path, "tmpfs", MS_NOSUID | MS_NODEV, v->data) < 0)
            return -1;
        return allow_root(s, v->path);
    case SBX_VIEW_PIN:
        /* Recursive: what is mounted beneath (a writable root, a protected
         * path) comes along.  A mount point of this namespace cannot be
         * renamed or removed in it (EBUSY): the path below stays where the
         * view covers it. */
        return bind_tree(v->path, v->path, SBX_AT_RECURSIVE,
                         SBX_MOUNT_ATTR_NOSUID | SBX_MOUNT_ATTR_NODEV);
    default:
        return 0;
    }
}

/* copied: the view's namespace was copied, its /dev there already. */
static void view_finish_child(const struct sbx_child_ctx *ctx, int dev, int copied)
{
    const struct sbx_spec *s = ctx->spec;
    size_t i;

    if (s->view_dev)
        SBX_CHILD_STEP(ctx, SBX_STEP_NS_VIEW, -2, copied ? own_devpts(s) : private_dev(s, dev));
    if (dev >= 0)
        close(dev);
    for (i = 0; i < s->n_view; i++) {
        if (s->fail_step == SBX_STEP_NS_VIEW)
            sbx_child_fail(ctx, SBX_STEP_NS_VIEW, s->fail_errno, (int64_t)i);
        if (view_entry(s, &s->view[i]) < 0 && errno != ENOENT)
            sbx_child_fail(ctx, SBX_STEP_NS_VIEW, errno, (int64_t)i);
    }
}

/* Send fd over the datagram socket sock (SCM_RIGHTS). */
static int send_fd(int sock, int fd)
{
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    struct msghdr msg;
    struct iovec iov;
    struct cmsghdr *cm;
    char byte = 'W';
    ssize_t n;

    memset(&msg, 0, sizeof msg);
    memset(&u, 0, sizeof u);
    iov.iov_base = &byte;
    iov.iov_len = 1;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = u.buf;
    msg.msg_controllen = sizeof u.buf;
    cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    do {
        n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n < 0 ? -1 : 0;
}

/* The proxy's listener on this namespace's loopback, sent to the parent:
 * connections to it are made here, served there. */
static int publish_listener(const struct sbx_spec *s)
{
    struct sockaddr_in a;
    int saved, rc, one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (fd < 0)
        return -1;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)s->proxy_port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    rc = setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (rc == 0)
        rc = bind(fd, (const struct sockaddr *)&a, sizeof a);
    if (rc == 0)
        rc = listen(fd, 128);
    if (rc == 0)
        rc = send_fd(s->tmpfs_sock, fd);
    saved = errno;
    close(fd);
    errno = saved;
    return rc;
}

/* A Landlock rule for a tmpfs we mounted at path, with the workspace's
 * rights: the parent's rule for the directory it hides does not apply
 * (Landlock skips hidden mount points). */
static int allow_root(const struct sbx_spec *s, const char *path)
{
    int saved, rc, fd;

    if (s->landlock_fd < 0 || !s->tmpfs_landlock)
        return 0;
    fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    rc = sbx_landlock_allow_child(s->landlock_fd, fd, s->tmpfs_landlock);
    saved = errno;
    close(fd);
    errno = saved;
    return rc;
}

/* The tmpfs's root: a Landlock rule for it (the parent's rule for the
 * directory it hides does not apply) and its fd to the parent. */
static int publish_root(const struct sbx_spec *s)
{
    int saved, rc = 0, fd = open(s->tmpfs_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

    if (fd < 0)
        return -1;
    if (s->landlock_fd >= 0 && s->tmpfs_landlock)
        rc = sbx_landlock_allow_child(s->landlock_fd, fd, s->tmpfs_landlock);
    if (rc == 0 && s->tmpfs_sock >= 0)
        rc = send_fd(s->tmpfs_sock, fd);
    saved = errno;
    close(fd);
    errno = saved;
    return rc;
}

/* The parent is gone (it holds the status pipe's read end until it reaps
 * us; getppid() says 0 across namespaces, so it cannot tell). */
static int parent_gone(int status_fd)
{
    struct pollfd pfd = {.fd = status_fd, .events = 0, .revents = 0};

    return status_fd >= 0 && poll(&pfd, 1, 0) > 0 && (pfd.revents & POLLERR);
}

#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif

/* Fork-like clone: no CLONE_VM, so the child returns from the system call
 * on its own copy of this stack.  Not glibc's fork(): no atfork handlers
 * and a stale TID in the child's thread descriptor, so the child must not
 * call raise(), abort() or pthread functions (it does not). */
static long clone_forklike(uint64_t flags, int cgroup_fd)
{
    struct sbx_clone_args ca;
    long r;

    memset(&ca, 0, sizeof ca);
    ca.flags = flags | (cgroup_fd >= 0 ? CLONE_INTO_CGROUP : 0);
    ca.exit_signal = SIGCHLD;
    ca.cgroup = (uint64_t)(cgroup_fd >= 0 ? cgroup_fd : 0);
#ifdef SYS_clone3
    r = syscall(SYS_clone3, &ca, sizeof ca);
    if (r >= 0 || cgroup_fd >= 0 || (errno != ENOSYS && errno != EPERM))
        return r;
#endif
    if (cgroup_fd >= 0) {
        errno = ENOSYS;
        return -1;
    }
    /* With every pointer NULL the argument order (it differs on s390)
     * matters only for the flags. */
#if defined(__s390__)
    return syscall(SYS_clone, 0, (unsigned long)flags | SIGCHLD, NULL, NULL, 0);
#else
    return syscall(SYS_clone, (unsigned long)flags | SIGCHLD, 0, NULL, NULL, 0);
#endif
}

pid_t sbx_ns_clone_pid1(struct sbx_child_ctx *ctx)
{
    const struct sbx_spec *s = ctx->spec;
    uint64_t flags = CLONE_NEWPID | ((unsigned)s->ns_flags & CLONE_NEWUSER);
    long r = -1;

    ctx->how = SBX_HOW_PID1;
    if (s->cgroup_dirfd >= 0) {
        /* Born in its cgroup: inside a new user namespace, writing
         * cgroup.procs may be refused. */
        ctx->how = SBX_HOW_PID1 | SBX_HOW_CLONE3 | SBX_HOW_INTO_CGROUP;
        r = clone_forklike(flags, s->cgroup_dirfd);
        if (r >= 0)
            return (pid_t)r;
        ctx->how = SBX_HOW_PID1;
    }
    return (pid_t)clone_forklike(flags, -1);
}

/* The target: a CLONE_VM|CLONE_VFORK child of PID 1, on a part of PID 1's
 * own stack (PID 1 waits until the exec).  Not a static one: a vfork-style
 * PID 1 shares the caller's memory with other threads that spawn. */
#define SBX_TARGET_STACK (48 * 1024)

static int target_entry(void *arg)
{
    const struct sbx_child_ctx *ctx = arg;

    (void)sigaction(SIGCHLD, &ctx->target_chld, NULL);
    (void)sigprocmask(SIG_SETMASK, &ctx->saved_mask, NULL);
    ctx->target_main(ctx);
    _exit(127); /* not reached: target_main execs or fails */
}

static char *put_uint(char *p, unsigned v);

/* A vfork-style PID 1 must not stay in the caller's memory: it execs the
 * reaper program (csrc/linux/pid1.c) with every signal still blocked.  If
 * that fails, the target is killed and the spawn fails. */
static _Noreturn void exec_reaper(const struct sbx_child_ctx *ctx, pid_t target)
{
    const struct sbx_spec *s = ctx->spec;
    char tbuf[16], fbuf[16];
    char *argv[] = {"sbxlimit-pid1", tbuf, fbuf, NULL};
    char *envp[] = {NULL};
    int err;

    *put_uint(tbuf, (unsigned)target) = 0;
    *put_uint(fbuf, (unsigned)s->ns_status_fd) = 0;
    if (fcntl(s->ns_status_fd, F_SETFD, 0) == 0)
        (void)execve(s->ns_reaper, argv, envp);
    err = errno;
    (void)kill(target, SIGKILL);
    (void)waitpid(target, NULL, 0);
    sbx_child_fail(ctx, SBX_STEP_NS_PID, err, 3);
}

/* In PID 1: mount /proc, start the target, become the reaper.  Returns
 * only in a forked target (a preexec hook runs the caller's code there). */
static void enter_pid_ns(const struct sbx_child_ctx *ctx)
{
    const struct sbx_spec *s = ctx->spec;
    struct sbx_child_ctx tctx = *ctx;
    struct sigaction dfl;
    sigset_t all;
    pid_t target;
    char own_stack[SBX_TARGET_STACK] __attribute__((aligned(16)));

    SBX_CHILD_STEP(ctx, SBX_STEP_NS_PID, 2, parent_gone(s->ns_status_fd) ? (errno = ESRCH, -1) : 0);
    sigfillset(&all);
    /* A vforked PID 1 has every signal blocked already (the caller's own
     * mask is in saved_mask); a forked one blocks them here. */
    (void)sigprocmask(SIG_BLOCK, &all, ctx->vforked ? NULL : &tctx.saved_mask);
    /* Blocked signals queue for sigwaitinfo (a blocked signal reaches PID 1
     * even without a handler); an ignored SIGCHLD would reap children
     * before we can read their status.  The target gets the caller's
     * disposition back (execve keeps an ignored one). */
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    (void)sigaction(SIGCHLD, &dfl, &tctx.target_chld);
    /* A /proc of this namespace, so that ps and /proc/self agree with
     * getpid().  Best effort: a container may forbid it (a locked /proc),
     * and the isolation itself does not depend on it.  Read-only: uid 0
     * may write most of /proc/sys without a capability (core_pattern, for
     * one), and the rest of the host is read-only too. */
    if (s->ns_flags & CLONE_NEWNS)
        (void)mount("proc", "/proc", "proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    tctx.how &= ~SBX_HOW_PID1;
    if (ctx->vforked) {
        target = clone(target_entry, own_stack + sizeof own_stack, CLONE_VM | CLONE_VFORK | SIGCHLD,
                       &tctx);
        if (target < 0)
            sbx_child_fail(ctx, SBX_STEP_NS_PID, errno, 1);
        exec_reaper(ctx, target);
    }
    if (s->hook == NULL && ctx->target_main != NULL) {
        target = clone(target_entry, own_stack + sizeof own_stack, CLONE_VM | CLONE_VFORK | SIGCHLD,
                       &tctx);
    } else {
        target = fork();
        if (target == 0) {
            (void)sigaction(SIGCHLD, &tctx.target_chld, NULL);
            (void)sigprocmask(SIG_SETMASK, &tctx.saved_mask, NULL);
            return;
        }
    }
    if (target < 0)
        sbx_child_fail(ctx, SBX_STEP_NS_PID, errno, 1);
    sbx_close_all_but(s->ns_status_fd);
    sbx_reap(target, s->ns_status_fd, &all);
}

void sbx_ns_enter_child(const struct sbx_child_ctx *ctx)
{
    const struct sbx_spec *s = ctx->spec;

    /* PID 1 was cloned into its PID (and user) namespace already. */
    int flags =
        (ctx->how & SBX_HOW_PID1) ? s->ns_flags & ~(CLONE_NEWPID | CLONE_NEWUSER) : s->ns_flags;
    int dev = -1, rw[SBX_VIEW_MAX_RW];
    int copied =
        (s->ns_flags & CLONE_NEWNS) && s->view_ns_fd >= 0 && !(s->ns_flags & CLONE_NEWUSER);
    int64_t index = -1;

    if (s->ns_join_net)
        SBX_CHILD_STEP(ctx, SBX_STEP_NS_SETNS, 0, setns(s->ns_netns_fd, CLONE_NEWNET));
    if (s->ns_join_ipc)
        SBX_CHILD_STEP(ctx, SBX_STEP_NS_SETNS, 1, setns(s->ns_ipcns_fd, CLONE_NEWIPC));
    if (copied) {
        /* Its own writable trees from here, where they are writable; then
         * the view's namespace, which the unshare below copies. */
        if (clone_rw(s->view, s->n_view, rw, &index) < 0)
            sbx_child_fail(ctx, SBX_STEP_NS_VIEW, errno, index);
        SBX_CHILD_STEP(ctx, SBX_STEP_NS_SETNS, 2, setns(s->view_ns_fd, CLONE_NEWNS));
    } else if ((s->ns_flags & CLONE_NEWNS) && s->view_dev && s->view_dev_fd >= 0 &&
               !(s->ns_flags & CLONE_NEWUSER)) {
        /* Cloned while still in the namespace the template was made in:
         * the kernel copies a detached tree only from there. */
        SBX_CHILD_STEP(ctx, SBX_STEP_NS_VIEW, -2,
                       dev = (int)syscall(SYS_open_tree, s->view_dev_fd, "",
                                          SBX_OPEN_TREE_CLONE | O_CLOEXEC | SBX_AT_EMPTY_PATH |
                                              SBX_AT_RECURSIVE));
    }
    if (flags)
        SBX_CHILD_STEP(ctx, SBX_STEP_NS_UNSHARE, flags, unshare(flags));
    if ((s->ns_flags & CLONE_NEWUSER) && s->uid_map)
        SBX_CHILD_STEP(ctx, SBX_STEP_NS_IDMAP, 0, idmap(s->uid_map, s->gid_map));
    if ((s->ns_flags & CLONE_NEWNET) && s->ns_loopback)
        SBX_CHILD_STEP(ctx, SBX_STEP_NS_LOOPBACK, 0, loopback_up());
    if (s->proxy_port > 0 && s->tmpfs_sock >= 0)
        SBX_CHILD_STEP(ctx, SBX_STEP_NS_PROXY, s->proxy_port, publish_listener(s));
    /* A copy of the view's namespace is private already. */
    if ((s->ns_flags & CLONE_NEWNS) && !copied)
        SBX_CHILD_STEP(ctx, SBX_STEP_NS_MOUNT, 0, make_private());
    if ((s->ns_flags & CLONE_NEWNS) && (s->view_ro_root || s->n_view))
        view_begin_child(ctx, copied ? rw : NULL);
    if ((s->ns_flags & CLONE_NEWNS) && s->tmpfs_path) {
        SBX_CHILD_STEP(ctx, SBX_STEP_NS_MOUNT, 1,
                       mount("tmpfs", s->tmpfs_path, "tmpfs", MS_NOSUID | MS_NODEV, s->tmpfs_opts));
        if (s->tmpfs_mkdir)
            SBX_CHILD_STEP(ctx, SBX_STEP_NS_MOUNT, 2, mkdir(s->tmpfs_mkdir, 0700));
        SBX_CHILD_STEP(ctx, SBX_STEP_NS_MOUNT, 3, publish_root(s));
    }
    if ((s->ns_flags & CLONE_NEWNS) && (s->n_view || s->view_dev))
        view_finish_child(ctx, dev, copied);
    if (ctx->how & SBX_HOW_PID1)
        enter_pid_ns(ctx);
}

/* ---- doctor's probe: the same sequence, in a throw-away child --------- */

static char *put_uint(char *p, unsigned v)
{
    char tmp[12];
    int n = 0;

    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *p++ = tmp[--n];
    return p;
}

/* "id id 1\n": map the caller's id to itself. */
static void self_map(char *buf, unsigned id)
{
    char *p = put_uint(buf, id);

    *p++ = ' ';
    p = put_uint(p, id);
    memcpy(p, " 1\n", 4);
}

/* ---- namespaces made ahead (parent side) -------------------------------- */

struct ns_job {
    int kind, fd, err;
};

static void *ns_thread(void *arg)
{
    struct ns_job *job = arg;
    int net = job->kind == CLONE_NEWNET;

    /* This thread alone enters the namespace, and ends there. */
    if (unshare(job->kind) < 0 || (net && loopback_up() < 0)) {
        job->err = errno;
        return NULL;
    }
    job->fd =
        open(net ? "/proc/thread-self/ns/net" : "/proc/thread-self/ns/ipc", O_RDONLY | O_CLOEXEC);
    if (job->fd < 0)
        job->err = errno;
    return NULL;
}

int sbx_ns_make(int kind)
{
    struct ns_job job = {kind, -1, 0};
    pthread_t t;
    int rc;

    if (kind != CLONE_NEWNET && kind != CLONE_NEWIPC) {
        errno = EINVAL;
        return -1;
    }
    rc = pthread_create(&t, NULL, ns_thread, &job);
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    pthread_join(t, NULL);
    if (job.fd < 0)
        errno = job.err;
    return job.fd;
}

/* ---- the view made once (parent side) ---------------------------------- */

struct view_job {
    const struct sbx_view *view;
    size_t n_view;
    int ro_root, dev_fd, fd, err;
    unsigned char *missing;
    uint64_t *root, *ns;
};

/* view_entry's spec: no Landlock rule to add (no tmpfs is made here). */
static const struct sbx_spec no_rules = {.landlock_fd = -1};

/* The caller's "/" and namespace, and whether that "/" is the namespace's
 * root: joined again (setns), this thread is at that root, and so is a
 * child that joins a copy of it.  A chrooted caller's is elsewhere. */
static int caller_is_at_root(struct view_job *job)
{
    uint64_t root[3];
    int home, rc;

    if ((rc = sbx_path_ident("/", job->root)) < 0 ||
        (rc = sbx_path_ident("/proc/thread-self/ns/mnt", job->ns)) < 0) {
        errno = -rc;
        return -1;
    }
    if (unshare(CLONE_FS) < 0 ||
        (home = open("/proc/thread-self/ns/mnt", O_RDONLY | O_CLOEXEC)) < 0)
        return -1;
    rc = setns(home, CLONE_NEWNS);
    close_all(&home, 1);
    if (rc < 0 || (rc = sbx_path_ident("/", root)) < 0) {
        errno = rc < -1 ? -rc : errno;
        return -1;
    }
    if (memcmp(root, job->root, sizeof root) != 0) {
        errno = EXDEV;
        return -1;
    }
    return 0;
}

static int make_view(struct view_job *job)
{
    const struct sbx_view *view = job->view;
    int rw[SBX_VIEW_MAX_RW], dev = -1;
    int64_t index = -1;
    size_t i, n = 0;

    if (caller_is_at_root(job) < 0)
        return -1;
    /* Cloned here first: the kernel copies a detached tree only from the
     * namespace that made it. */
    if (job->dev_fd >= 0 && (dev = (int)syscall(SYS_open_tree, job->dev_fd, "",
                                                SBX_OPEN_TREE_CLONE | O_CLOEXEC |
                                                    SBX_AT_EMPTY_PATH | SBX_AT_RECURSIVE)) < 0)
        return -1;
    if (unshare(CLONE_NEWNS) < 0 || make_private() < 0 ||
        clone_rw(view, job->n_view, rw, &index) < 0) {
        close_all(&dev, 1);
        return -1;
    }
    for (i = 0; i < job->n_view && n < SBX_VIEW_MAX_RW; i++)
        if (writable(&view[i]))
            job->missing[i] = rw[n++] < 0;
    if (job->ro_root && ro_root() < 0) {
        close_all(rw, n);
        close_all(&dev, 1);
        return -1;
    }
    /* attach_rw closes every clone, put back or not.  The host's /dev goes
     * after (a writable root may lie in it) and before ours, as the child
     * does it. */
    if (attach_rw(view, job->n_view, rw, &index) < 0) {
        close_all(&dev, 1);
        return -1;
    }
    if (dev >= 0) {
        detach_host_dev();
        if (attach(dev, "/dev", 0) < 0) {
            close_all(&dev, 1);
            return -1;
        }
    }
    close_all(&dev, 1);
    for (i = 0; i < job->n_view; i++) {
        if (writable(&view[i]))
            continue;
        if (view[i].kind == SBX_VIEW_TMPFS) {
            errno = EINVAL; /* each sandbox's own */
            return -1;
        }
        if (view_entry(&no_rules, &view[i]) < 0) {
            if (errno != ENOENT)
                return -1;
            job->missing[i] = 1;
        }
    }
    return 0;
}

static void *view_thread(void *arg)
{
    struct view_job *job = arg;

    /* This thread alone enters the namespace it makes, and ends there. */
    if (make_view(job) < 0 ||
        (job->fd = open("/proc/thread-self/ns/mnt", O_RDONLY | O_CLOEXEC)) < 0)
        job->err = errno;
    return NULL;
}

int sbx_ns_view_ns(const struct sbx_view *view, size_t n_view, int view_ro_root, int dev_fd,
                   unsigned char *missing, uint64_t root[3], uint64_t ns[3])
{
    struct view_job job = {view, n_view, view_ro_root, dev_fd, -1, 0, missing, root, ns};
    pthread_t t;
    int rc;

    memset(missing, 0, n_view);
    rc = pthread_create(&t, NULL, view_thread, &job);
    if (rc != 0)
        return -rc;
    pthread_join(t, NULL);
    return job.fd >= 0 ? job.fd : -(job.err ? job.err : EIO);
}

int sbx_ns_probe_child(long flags)
{
    char uid_map[32], gid_map[32];
    pid_t pid;
    int st;

    self_map(uid_map, (unsigned)getuid());
    self_map(gid_map, (unsigned)getgid());
    if (unshare((int)flags) < 0)
        return -1;
    if ((flags & CLONE_NEWUSER) && idmap(uid_map, gid_map) < 0)
        return -1;
    if ((flags & CLONE_NEWNET) && loopback_up() < 0)
        return -1;
    if (flags & CLONE_NEWNS) {
        if (make_private() < 0)
            return -1;
        /* Over "/" of this private namespace: always there, seen by no one. */
        if (mount("tmpfs", "/", "tmpfs", MS_NOSUID | MS_NODEV, "size=4k,mode=0700") < 0)
            return -1;
    }
    if (flags & CLONE_NEWPID) {
        /* A caller that ignores SIGCHLD would make its children reap
         * themselves: waitpid would find nothing. */
        (void)signal(SIGCHLD, SIG_DFL);
        pid = fork();
        if (pid < 0)
            return -1;
        if (pid == 0)
            _exit(getpid() == 1 ? 0 : 1);
        while (waitpid(pid, &st, 0) < 0)
            if (errno != EINTR)
                return -1;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            errno = EPROTO;
            return -1;
        }
    }
    return 0;
}

int sbx_ns_probe_view_child(long flags)
{
    int fd;

    if (sbx_ns_probe_child(flags | CLONE_NEWNS) < 0)
        return -1;
    /* As a sandbox's view does it: a tree cloned, "/" read-only, the clone
     * back on top (over "/" itself: this namespace is private). */
    fd = clone_tree("/", SBX_AT_RECURSIVE);
    if (fd < 0)
        return -1;
    if (set_attr(AT_FDCWD, "/", SBX_AT_RECURSIVE, SBX_MOUNT_ATTR_RDONLY | SBX_MOUNT_ATTR_NOSUID) <
        0)
        return -1;
    return attach(fd, "/", SBX_MOUNT_ATTR_NOSUID | SBX_MOUNT_ATTR_NODEV);
}
