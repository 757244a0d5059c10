/* sbx.h -- the C API of sbxlimit's core.
 *
 * The parent prepares a struct sbx_spec (every string, array and fd the child
 * needs), then sbx_spawn_start() creates the child and sbx_spawn_finish()
 * learns whether it reached execve.  The child runs one flat,
 * async-signal-safe sequence of steps; the first step that fails sends one
 * fixed-size struct sbx_child_error over a close-on-exec pipe and _exit(127)s.
 * EOF on that pipe means execve succeeded.
 *
 * No Python here: this header and every file but _coremodule.c are plain C11.
 */
#ifndef SBX_H
#define SBX_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Steps of the child sequence, in the order they run.  The numbers travel
 * in the error record; the names (sbx_step_name) are the stable public form.
 * Append new steps before SBX_STEP__COUNT only in a way that keeps names. */
enum sbx_step {
    SBX_STEP_NONE = 0,
    SBX_STEP_CGROUP,        /* "cgroup:procs", detail = index in cgroup_procs */
    SBX_STEP_SIGNALS_RESET, /* "signals:reset" */
    SBX_STEP_STDIO,         /* "stdio:dup2", detail = target fd */
    SBX_STEP_SETSID,        /* "session:setsid" */
    SBX_STEP_SETPGID,       /* "session:setpgid", detail = pgid */
    SBX_STEP_PDEATHSIG,     /* "pdeathsig" */
    SBX_STEP_NS_UNSHARE,    /* "ns:unshare", detail = CLONE_NEW* flags */
    SBX_STEP_NS_IDMAP,      /* "ns:idmap" (user namespace uid/gid maps) */
    SBX_STEP_NS_LOOPBACK,   /* "ns:loopback" (lo up in a new netns) */
    SBX_STEP_NS_MOUNT,      /* "ns:mount", detail: 0 slave, 1 tmpfs, 2 mkdir, 3 its fd */
    SBX_STEP_NS_VIEW,       /* "ns:view", detail = index in view[] (-1: "/" read-only, -2: /dev) */
    SBX_STEP_NS_PID,        /* "ns:pid", detail: 1 the target's clone, 2 the parent gone */
    SBX_STEP_RLIMIT_CORE,   /* "rlimit:RLIMIT_CORE", detail = soft value */
    SBX_STEP_RLIMIT_CPU,
    SBX_STEP_RLIMIT_FSIZE,
    SBX_STEP_RLIMIT_DATA,
    SBX_STEP_RLIMIT_AS,
    SBX_STEP_RLIMIT_NOFILE,
    SBX_STEP_RLIMIT_NPROC,
    SBX_STEP_CHDIR,        /* "chdir" */
    SBX_STEP_UMASK,        /* "umask" (cannot fail; here for the test switch) */
    SBX_STEP_SETGROUPS,    /* "setgroups" */
    SBX_STEP_SETGID,       /* "setgid", detail = gid */
    SBX_STEP_SETUID,       /* "setuid", detail = uid */
    SBX_STEP_CAPS,         /* "caps:drop" */
    SBX_STEP_NO_NEW_PRIVS, /* "harden:no_new_privs" */
    SBX_STEP_LANDLOCK,     /* "landlock:restrict" */
    SBX_STEP_SECCOMP,      /* "harden:seccomp" */
    SBX_STEP_PREEXEC,      /* "preexec_fn" */
    SBX_STEP_PASS_FDS,     /* "pass_fds", detail = fd */
    SBX_STEP_CLOSE_FDS,    /* "close_fds" */
    SBX_STEP_SIGMASK,      /* "signals:mask" */
    SBX_STEP_EXEC,         /* "exec" */
    SBX_STEP_NS_SETNS,     /* "ns:setns" (a namespace made ahead: 0 net, 1 IPC, 2 the view's) */
    SBX_STEP_NS_PROXY,     /* "ns:proxy" (the proxy's listener on its loopback) */
    SBX_STEP__COUNT
};

/* Stable name of a step ("rlimit:RLIMIT_CPU"), or NULL if out of range
 * (child_fail.c). */
const char *sbx_step_name(int step);

/* The step that sets rlimit `resource` (an RLIMIT_* constant), or
 * SBX_STEP_NONE when the core does not handle that resource. */
int sbx_rlimit_step(int resource);

/* The record a failing child writes.  Fixed size, well under PIPE_BUF, so a
 * single write() is atomic. */
struct sbx_child_error {
    int32_t step;   /* enum sbx_step */
    int32_t err;    /* errno at the failing call (0 for preexec_fn) */
    int64_t detail; /* step-specific: fd, id, limit ... */
};

/* One resource limit to set in the child.  RLIM_INFINITY is SBX_RLIM_INF. */
#define SBX_RLIM_INF UINT64_MAX
struct sbx_rlimit {
    int resource; /* RLIMIT_* constant of this platform */
    uint64_t soft, hard;
};

/* Called in a fork()ed (never vfork()ed) child at the preexec_fn step; it
 * returns 0 to go on, anything else to fail the step. */
typedef int (*sbx_child_hook)(void *arg);

/* One entry of the read-only view (linux/namespaces.c).  A path that does
 * not exist is skipped. */
enum sbx_view_kind {
    SBX_VIEW_RW = 1,   /* a writable root: the host's tree as it is, nosuid, nodev */
    SBX_VIEW_RW_DEV,   /* the same without nodev (the tree holds /dev) */
    SBX_VIEW_RO,       /* a protected path: its tree (data: the tree at data,
                          a symbolic link's target) bound read-only over it */
    SBX_VIEW_HIDE_DIR, /* deny_read: an empty read-only tmpfs over it */
    SBX_VIEW_HIDE,     /* deny_read, not a directory: /dev/null bound read-only over it */
    SBX_VIEW_TMPFS,    /* a private tmpfs, nosuid, nodev; data: its mount options */
    SBX_VIEW_PIN,      /* a directory on the way from a writable root to what the view
                          covers: bound over itself (writable, nosuid, nodev), a mount
                          point that cannot be renamed or removed */
    SBX_VIEW_RO_MOUNT  /* a mount of the kernel's own (proc, sysfs) under a writable
                          root: read-only and nosuid where it is, with what is mounted
                          below it (bound read-only over itself if it is no mount) */
};
#define SBX_VIEW_MAX_RW 64
struct sbx_view {
    int kind;
    const char *path;
    const char *data;
};

struct sbx_spec {
    /* execve candidates tried in order, as os.execvpe does; PATH lookup is
     * done by the parent, so this is normally a single resolved path. */
    const char *const *exec_paths;
    size_t n_exec_paths;
    char *const *argv;
    char *const *envp; /* NULL: the parent's environ */
    const char *cwd;   /* NULL: unchanged */

    int fd_stdin, fd_stdout, fd_stderr; /* -1: inherit the parent's */
    int close_fds;
    const int *keep_fds; /* sorted ascending; made inheritable */
    size_t n_keep_fds;
    int restore_signals; /* SIGPIPE, SIGXFSZ back to SIG_DFL */

    int new_session; /* setsid() */
    pid_t pgid;      /* -1: unchanged, 0: lead a new group, >0: join it */

    int set_groups; /* setgroups(groups) when non-zero */
    const gid_t *groups;
    size_t n_groups;
    long gid;  /* -1: unchanged */
    long uid;  /* -1: unchanged */
    int umask; /* -1: unchanged */

    const struct sbx_rlimit *rlimits;
    size_t n_rlimits;

    int pdeathsig;    /* 0: none; set again after a uid/gid change, which clears it */
    pid_t parent_pid; /* checked after PR_SET_PDEATHSIG */
    /* Capabilities (linux/caps.c), dropped after the credential change:
     * SBX_CAPS_* bits (0: keep them all, as a plain Popen does); caps_keep
     * is the set (bit n: capability n) the program keeps. */
    int drop_caps;
#define SBX_CAPS_DROP     1 /* effective, permitted, inheritable, ambient */
#define SBX_CAPS_BOUNDING 2 /* also securebits and the bounding set (CAP_SETPCAP) */
    uint64_t caps_keep;
    int no_new_privs;
    /* A Landlock ruleset (from sbx_landlock_ruleset) the child restricts
     * itself with after no_new_privs; -1: none. */
    int landlock_fd;
    /* A seccomp filter (struct sock_filter[n_seccomp], from
     * sbx_seccomp_build) loaded as the setup's last step; NULL: none. */
    const void *seccomp;
    size_t n_seccomp;

    /* Cgroup placement, the child's first step.  cgroup_dirfd >= 0 (a v2
     * cgroup directory): the child is born inside it with
     * clone3(CLONE_INTO_CGROUP) where the kernel allows; cgroup_procs[0] must
     * then be that cgroup's cgroup.procs, written by the child only when
     * clone3 could not place it.  Every other cgroup_procs fd (v1
     * hierarchies) is always written: "0" moves the writer itself. */
    int cgroup_dirfd;
    const int *cgroup_procs;
    size_t n_cgroup_procs;

    /* Namespaces (linux/namespaces.c), entered after pdeathsig.  ns_flags:
     * the CLONE_NEW* flags to unshare (0: none).  With CLONE_NEWUSER,
     * uid_map/gid_map are written ("inside outside count\n").  With
     * CLONE_NEWNET, ns_loopback brings lo up.  With CLONE_NEWNS, mounts are
     * made slaves first; tmpfs_path (NULL: none) gets a tmpfs with mount
     * data tmpfs_opts, tmpfs_mkdir is made in it, and an fd of its root is
     * sent on the datagram socket tmpfs_sock (SCM_RIGHTS) for the parent to
     * read it after the namespace is gone.  With CLONE_NEWPID the child is
     * made by clone(CLONE_NEWPID[|CLONE_NEWUSER]) and is PID 1, a reaper;
     * the target is its CLONE_VM|CLONE_VFORK child (a fork() with a hook).
     * PID 1 writes the target's wait status (an int) to ns_status_fd and
     * exits with the same code; a parent that reads it there gets the
     * target's own status, signals included. */
    int ns_flags;
#define SBX_CLONE_NEWPID 0x20000000 /* Linux's CLONE_NEWPID, for portable code */
    const char *uid_map, *gid_map;
    int ns_loopback;
    const char *tmpfs_path, *tmpfs_opts, *tmpfs_mkdir;
    int tmpfs_sock;
    int ns_status_fd; /* write end, close-on-exec; -1: none */
    /* ns_join_net, ns_join_ipc: join the network namespace ns_netns_fd
     * (lo up), the IPC namespace ns_ipcns_fd (both made ahead by
     * sbx_ns_make, close-on-exec) first, instead of unsharing them:
     * ns_flags then lacks CLONE_NEWNET, CLONE_NEWIPC.  Flags of their own,
     * so that a zeroed spec joins nothing. */
    int ns_join_net, ns_netns_fd;
    int ns_join_ipc, ns_ipcns_fd;
    /* proxy_port > 0: once in its network namespace, the child listens on
     * 127.0.0.1:proxy_port there and sends the socket on tmpfs_sock before
     * anything else; the parent serves it (a socket keeps the namespace it
     * was made in), so the sandbox's one way out is that proxy. */
    int proxy_port;
    /* The reaper program (csrc/linux/pid1.c): PID 1 is then a vfork-style
     * child that execs it once the target runs; NULL: PID 1 is fork()ed
     * and reaps in place. */
    const char *ns_reaper;
    uint64_t tmpfs_landlock; /* rights beneath the tmpfs in landlock_fd's ruleset */
    /* The read-only view of the host (CLONE_NEWNS): with view_ro_root every
     * mount becomes read-only and nosuid, except the trees of the SBX_VIEW_RW
     * entries (cloned before, put back after); then the other entries are
     * applied in order.  At most SBX_VIEW_MAX_RW writable entries. */
    const struct sbx_view *view;
    size_t n_view;
    int view_ro_root;
    int view_dev; /* a /dev of its own (linux/namespaces.c, private_dev) */
    /* >= 0: the child clones this template of it (sbx_ns_dev_template)
     * instead of building one; not with CLONE_NEWUSER. */
    int view_dev_fd;
    /* >= 0: a mount namespace holding the view already (sbx_ns_view_ns):
     * "/" read-only, /dev, the entries it was made with.  The child joins
     * and copies it (unshare), and `view` holds only what is its own:
     * writable trees of its own (cloned before it joins), its tmpfs, what
     * was not there when the namespace was made.  Not with CLONE_NEWUSER. */
    int view_ns_fd;

    sbx_child_hook hook; /* non-NULL forces fork() instead of vfork() */

    /* fork() and run the setup steps (up to no_new_privs), then return to
     * the caller in the child as fork() does (child->pid == 0): for running
     * code of the caller's, not a program, under the sandbox's limits.
     * exec_paths, argv, fd closing and the preexec hook are not used. */
    int fork_only;
    void *hook_arg;

    /* Testing switch: make step fail_step fail with fail_errno when it runs
     * (SBX_STEP_NONE: off).  Proves every step's error reaches the caller. */
    int fail_step;
    int fail_errno;
};

/* How a child was made (struct sbx_child.how, a bit set). */
#define SBX_HOW_VM          1 /* shared the parent's memory until exec */
#define SBX_HOW_CLONE3      2 /* clone3(), handlers cleared by the kernel */
#define SBX_HOW_INTO_CGROUP 4 /* born in cgroup_dirfd (CLONE_INTO_CGROUP) */
#define SBX_HOW_PID1        8 /* PID 1 of a new PID namespace (clone) */

/* A started child: the pid and the read end of its error pipe. */
struct sbx_child {
    pid_t pid;
    int errpipe;
    int how; /* SBX_HOW_* */
    /* Linux, a child with a mount namespace of its own (CLONE_NEWNS) made
     * by clone3: its pidfd until sbx_spawn_finish, which turns it into
     * mnt_ns.  -1 otherwise. */
    int pidfd;
    /* After sbx_spawn_finish: an fd holding the running child's mount
     * namespace (PIDFD_GET_MNT_NAMESPACE, Linux 6.11), -1 when the child
     * is gone already, SBX_MNT_NS_ASK when it could not be asked so (the
     * caller opens /proc/<pid>/ns/mnt). */
    int mnt_ns;
};
#define SBX_MNT_NS_ASK (-2)

/* Create the child.  With spec->fork_only, returns 0 in both processes, with
 * child->pid == 0 in the child (see fork_only).
 * With spec->hook == NULL (and a build that allows it)
 * the child shares the parent's memory until execve (CLONE_VM|CLONE_VFORK),
 * so the caller's thread is suspended until then and the spawn cost does not
 * grow with the parent's size.  Returns 0, or -1 with errno set when no child
 * was created. */
int sbx_spawn_start(const struct sbx_spec *spec, struct sbx_child *child);

/* Wait for execve (EOF on the error pipe) or for the child's error record.
 * Returns 0 when the target is running, 1 when the child failed (err filled,
 * the child reaped and its wait status in *status), -1 with errno on a
 * parent-side failure.  Closes the error pipe in every case. */
int sbx_spawn_finish(struct sbx_child *child, struct sbx_child_error *err, int *status);

/* ---- namespaces made ahead (linux/namespaces.c) --------------------- */

/* A new namespace of `kind` (CLONE_NEWNET, with lo up, or CLONE_NEWIPC)
 * as an fd (close-on-exec) for a child to join (ns_netns_fd, ns_ipcns_fd).
 * Made by a short-lived thread of its own, so that no thread of the
 * caller is ever left inside it.  Returns the fd, or -1 with errno
 * (EINVAL for another kind, ENOSYS where there are no namespaces). */
int sbx_ns_make(int kind);

/* The private /dev a view gives (spec view_dev), built once as a detached
 * mount for children to clone (view_dev_fd): a read-only tmpfs with the
 * host's device nodes bound in, empty pts and shm directories, and the
 * usual links.  Returns the fd (close-on-exec), or -1 with errno: ENOSYS
 * or EINVAL where the kernel cannot build it (mounts onto a detached tree
 * need Linux 6.15), EPERM without CAP_SYS_ADMIN. */
int sbx_ns_dev_template(void);

/* The read-only view made once (spec view_ns_fd), in a mount namespace of
 * its own made by a thread of the core: "/" read-only with view_ro_root,
 * the writable trees among view[] put back, dev_fd (a template from
 * sbx_ns_dev_template, or -1) cloned onto /dev, then the other entries in
 * order; no SBX_VIEW_TMPFS entry.  missing[i] is set to 1 for each entry
 * not there (skipped; the child makes it at its spawn if it is there by
 * then).  root, ns: what the caller's "/" and mount namespace were
 * (sbx_path_ident), for sbx_views_stale.  Refused (-EXDEV) where the
 * caller's "/" is not its namespace's root (chrooted): a child that joins
 * the namespace starts at that root.  Returns the namespace's fd
 * (close-on-exec), or -errno. */
int sbx_ns_view_ns(const struct sbx_view *view, size_t n_view, int view_ro_root, int dev_fd,
                   unsigned char *missing, uint64_t root[3], uint64_t ns[3]);

/* ---- process trees (platform code: linux/proctree.c) ------------------ */

struct sbx_tree_sample {
    uint64_t memory; /* bytes: anonymous + shmem resident + swap, summed */
    uint32_t tasks;  /* threads, summed */
    uint32_t procs;  /* processes (root included while it is alive) */
    double cpu_user; /* seconds: the live processes and the children they reaped */
    double cpu_system;
    int root_alive; /* 0 once the root is a zombie or gone */
};

/* Sample the tree rooted at pid (the root and its descendants); with
 * skip_root, the root's own memory and tasks are left out (a PID
 * namespace's reaper: a copy of the caller's memory, not the sandbox's),
 * its reaped children's CPU is not.
 * Returns 0, or -1 with errno (ENOSYS where the platform has no way). */
int sbx_tree_sample(pid_t root, int skip_root, struct sbx_tree_sample *out);

/* What a sample remembers of a small tree, so that the next one can tell
 * that nothing in it has run since: memory grows, processes fork and exit
 * only by running.  Zeroed by the caller before the first sample. */
#define SBX_TREE_CACHE_PROCS 8  /* larger trees are walked every time */
#define SBX_TREE_CACHE_WALK  10 /* a full walk at least every this many samples */
struct sbx_tree_cache {
    uint32_t n;      /* processes remembered (0: walk) */
    uint32_t reused; /* samples answered from it since the last walk */
    pid_t pid[SBX_TREE_CACHE_PROCS];
    uint64_t ran_ns[SBX_TREE_CACHE_PROCS]; /* CPU time, every thread (process CPU clock) */
    struct sbx_tree_sample last;
};

/* sbx_tree_sample, answered from `cache` while no remembered process has
 * run since the last walk (Linux; elsewhere it always walks).  A walk refills the cache.  The
 * walk's figures can only go stale through what runs in no process of the tree (a khugepaged
 * collapse, reclaim): at most SBX_TREE_CACHE_WALK samples.
 * Returns 1 when the cache answered, 0 after a walk, -1 with errno. */
int sbx_tree_sample_cached(pid_t root, int skip_root, struct sbx_tree_cache *cache,
                           struct sbx_tree_sample *out);

/* Send sig to the root, every descendant, and (pgid > 0) the process group.
 * For SIGKILL the tree is stopped first and re-walked until no new process
 * appears, so a fork loop cannot outrun it.  Returns the number of
 * processes signalled, or -1 with errno. */
int sbx_tree_signal(pid_t root, int sig, pid_t pgid);

/* ---- cgroups (linux/cgroup.c) ------------------------------------------ */

/* What filesystem `path` is: 2 cgroup2, 1 cgroup v1, 0 something else,
 * -errno when it cannot be stat'ed. */
int sbx_cgroup_fs_kind(const char *path);

/* ---- Landlock (linux/landlock.c) ------------------------------------------ */

/* A ruleset handling `handled` (LANDLOCK_ACCESS_FS_* bits) that allows
 * access[i] beneath paths[i]; paths that do not exist are skipped (*added
 * counts the rules made).  With handled_net (LANDLOCK_ACCESS_NET_*, ABI 4)
 * it allows net_access on each of ports[]; scoped (ABI 6) is passed as is.
 * Returns the ruleset fd (close-on-exec), or -errno. */
struct sbx_landlock_net {
    uint64_t handled_net, net_access, scoped;
    const uint16_t *ports;
    size_t n_ports;
};
int sbx_landlock_ruleset(uint64_t handled, const char *const *paths, const uint64_t *access,
                         size_t n, const struct sbx_landlock_net *net, size_t *added);

/* ---- seccomp (linux/seccomp.c) --------------------------------------------- */

/* Instructions a filter needs at most. */
#define SBX_SECCOMP_MAX 256

/* What a filter refuses, a bit set for sbx_seccomp_build (the table in
 * linux/seccomp.c).  Every bit also limits socket families to AF_UNIX,
 * AF_INET, AF_INET6 and NETLINK_ROUTE. */
#define SBX_SECCOMP_HARDEN    1  /* namespaces, devices, TIOCSTI, ptrace, bpf, mount ... */
#define SBX_SECCOMP_NET_DENY  2  /* no AF_INET, AF_INET6 socket; io_uring */
#define SBX_SECCOMP_NET_PROXY 4  /* AF_INET* TCP stream only; io_uring */
#define SBX_SECCOMP_FAMILIES  8  /* the family allow-list alone (a network namespace) */
#define SBX_SECCOMP_SIGNALS   16 /* the filter alone keeps signals in: no pidfd_send_signal */
/* The filter's version, in `enforced` ("seccomp:allow-list v3"). */
#define SBX_SECCOMP_VERSION 3

/* Build a filter (struct sock_filter[], 8 bytes each) into out (cap
 * instructions) refusing what `what` (SBX_SECCOMP_*) names, and every call
 * of another ABI.  caller, caller_pgid: the sandbox's caller, which the
 * program may not signal (SBX_SECCOMP_HARDEN); guard, if > 0: another
 * process it may not signal, nor its process group (the caller's sentinel,
 * a group of its own).  Returns 0 with *n set, -ENOSPC, -EINVAL (nothing
 * asked), or -ENOSYS where this architecture has no filter. */
int sbx_seccomp_build(void *out, size_t cap, size_t *n, int what, int caller, int caller_pgid,
                      int guard);

/* ---- file system chores in one call (fsbatch.c) ------------------------ */

/* The supervisor's directory work (cgroups made, armed and removed,
 * workspaces removed) as one call, so that the binding releases the GIL
 * once for all of it: a thread that takes the GIL back between each of a
 * dozen system calls delays the caller's thread at each of its own. */
enum sbx_fs_op {
    SBX_FS_MKDIR = 1,      /* mkdir(path, 0755) */
    SBX_FS_RMDIR,          /* rmdir(path) */
    SBX_FS_WRITE,          /* open(path, O_WRONLY), write data whole, close */
    SBX_FS_WRITE_OPTIONAL, /* the same; ENOENT counts as done */
    SBX_FS_READ,           /* read the whole file into buf (less than cap bytes) */
    SBX_FS_STAT,           /* stat(path), links followed: dev and ino */
    SBX_FS_OPEN_WRITE,     /* open(path, O_WRONLY), kept: out fd */
    SBX_FS_OPEN_READ,      /* open(path, O_RDONLY) and read once (which arms
                            * kernfs's poll), kept: out fd */
    SBX_FS_V1_EVENT,       /* register eventfd fd for data (the watched file's
                            * path, then a NUL and what follows the two fds in
                            * the line) through cgroup.event_control path */
    SBX_FS_CLOSE,          /* close(fd) */
    SBX_FS_RM_WORKSPACE,   /* rmdir path and its tmp/ if that is all it holds
                            * (else ENOTEMPTY; see fsbatch.c for a race): out
                            * len, the bytes tmp/ held (the tree's size) */
    SBX_FS_PREAD           /* read the whole file through fd, kept open, from
                            * its start (pread), as SBX_FS_READ */
};
struct sbx_fs_step {
    int op; /* SBX_FS_* */
    const char *path;
    const char *data;            /* SBX_FS_WRITE*: what to write; SBX_FS_V1_EVENT */
    size_t len;                  /* data's length; out: SBX_FS_READ's bytes read, */
    char *buf;                   /* SBX_FS_RM_WORKSPACE's size; SBX_FS_READ: where */
    size_t cap;                  /* (a file that fills it is EFBIG: never a */
                                 /* truncated read taken for the whole) */
    unsigned long long dev, ino; /* SBX_FS_STAT: out */
    int fd;                      /* in: SBX_FS_V1_EVENT, SBX_FS_CLOSE, SBX_FS_PREAD; out: */
                                 /* SBX_FS_OPEN_* */
    int dir;                     /* in: the directory a relative path (and */
                                 /* SBX_FS_V1_EVENT's data) is resolved from; */
                                 /* -1: the working directory */
    int err;                     /* out: 0, or the errno it failed with (-1: not run) */
};

/* The buffer the binding gives each SBX_FS_READ and SBX_FS_PREAD: the cgroup files read
 * this way (counters, stat lines) are a few hundred bytes. */
#define SBX_FS_READ_MAX 8192

/* Run steps in order, filling each one's err.  stop_at_error: stop at the
 * first failure (the rest get -1); else run them all.  Returns the number
 * of steps that failed. */
size_t sbx_fs_batch(struct sbx_fs_step *steps, size_t n, int stop_at_error);

/* ---- watches for the protected paths' search (linux/watch.c) ----------- */

/* An inotify fd (non-blocking, close-on-exec), or -errno. */
int sbx_watch_open(void);

/* Watch `path` on fd: what: SBX_WATCH_ENTRIES a directory's entries,
 * SBX_WATCH_CONTENT a file's content, SBX_WATCH_SELF only the file or
 * directory itself (removed, moved, its links or attributes changed; the
 * path itself, not a link's target).  Returns the watch descriptor, or
 * -errno.  Where the filesystem is one whose changes this kernel may not
 * all see (network, FUSE: another client's), the descriptor comes with
 * SBX_WATCH_REMOTE set: what this kernel changes there is still seen. */
enum { SBX_WATCH_CONTENT = 0, SBX_WATCH_ENTRIES = 1, SBX_WATCH_SELF = 2 };
#define SBX_WATCH_REMOTE (1 << 30)
int sbx_watch_add(int fd, const char *path, int what);

/* 1 if the mount table that fd (an open /proc/thread-self/mountinfo)
 * shows has changed since it was opened or last asked, else 0; -errno. */
int sbx_mounts_changed(int fd);

/* What a file is: (device, inode, mount id) of path, links followed; the
 * mount id 0 where the kernel or libc cannot say (before Linux 5.8).
 * 0, or -errno. */
int sbx_path_ident(const char *path, uint64_t ident[3]);

/* Whether the views kept (sbx_ns_view_ns) may no longer be this thread's:
 * the mount table mounts_fd shows changed, an event is queued on the
 * inotify fd watch_fd (drained), or "/" or the mount namespace is no
 * longer root, ns (sbx_path_ident).  1, or 0: no wait, a few system
 * calls. */
int sbx_views_stale(int mounts_fd, int watch_fd, const uint64_t root[3], const uint64_t ns[3]);

/* Drain fd's queue into wds (cap entries, *n_wds filled): the distinct
 * watches on which an event that can change the search was queued (a
 * subdirectory but those named in skip, where a name ending in '*' is a
 * prefix, a .git or a commondir made,
 * removed or renamed; a watched file changed; a watch lost), or the one
 * entry -1 (an overflow: anything may have changed; more than cap).
 * Returns 0, or -errno. */
int sbx_watch_changed(int fd, const char *const *skip, size_t n_skip, int *wds, size_t cap,
                      size_t *n_wds);

/* ---- doctor's probes (probe.c) ------------------------------------------ */

enum sbx_probe_kind {
    SBX_PROBE_PIDFD = 1,     /* pidfd_open(2) on ourselves */
    SBX_PROBE_CLOSE_RANGE,   /* close_range(2) on an empty range */
    SBX_PROBE_NO_NEW_PRIVS,  /* PR_SET_NO_NEW_PRIVS, in a child */
    SBX_PROBE_SECCOMP,       /* load an allow-all filter, in a child */
    SBX_PROBE_UNSHARE,       /* unshare(arg = CLONE_* flags), in a child */
    SBX_PROBE_CLONE3_CGROUP, /* clone3(CLONE_INTO_CGROUP) into dirfd arg */
    SBX_PROBE_HANG,          /* for tests: a child that never answers */
    SBX_PROBE_NAMESPACES,    /* unshare(arg) and set each namespace up, in a child */
    SBX_PROBE_RO_VIEW        /* the same with CLONE_NEWNS, then the read-only view */
};

/* Try one mechanism; returns 0 when it works, else the errno it failed
 * with (ETIMEDOUT when the child did not answer within timeout_ms). */
int sbx_probe(int what, long arg, int timeout_ms);

/* The Landlock ABI version (>= 1), or -errno (ENOSYS: not built in,
 * EOPNOTSUPP: built in but disabled at boot). */
int sbx_probe_landlock_abi(void);

#endif /* SBX_H */
