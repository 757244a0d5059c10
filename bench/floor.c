/* floor.c -- what the kernel alone charges for each sandbox mechanism.
 *
 * Spawns /bin/true the cheapest way C can (clone(CLONE_VM|CLONE_VFORK) on
 * a stack of its own, execve, waitpid) with one mechanism's system calls
 * in the child (or, for a cgroup per sandbox, in the parent), interleaved
 * and shuffled, and prints the median per variant in ns.  bench/floor.py
 * builds and runs it and turns the medians into floors: the least any
 * library on top of subprocess.run could cost for that mechanism.
 *
 * Two variants measure the read-only view a policy asks for (VIEW), made
 * the way sbxlimit's child makes it and from a namespace made once
 * (VIEW_COPY), with the entries sbxlimit's Python layer gives for
 * Policy(workdir="/") on this machine (bench/floor.py writes them).
 *
 * The ROW_* variants are the benchmark's cgroup and policy rows whole:
 * every system call sbxlimit's child makes for that row, and the objects a
 * sandbox has of its own (three v1 cgroups, an IPC and maybe a network
 * namespace, a workspace) made before the spawn and removed after it.  "serial": all in
 * the timed thread.  "pooled": a second thread makes them ahead and removes
 * them after, as sbxlimit's supervisor does, so that part runs on the
 * other core (the spawn makes its own when none is ready).
 *
 * Linux only; run as root (cgroup v1 directories, namespaces, Landlock).
 *     floor ROUNDS REAPER VIEW   (REAPER: sbxlimit's _pid1 program;
 *                                 VIEW: a file of "P path" pins, "R path"
 *                                 read-only binds)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <linux/filter.h>
#include <linux/landlock.h>
#include <linux/capability.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum {
    PLAIN,
    RLIMITS,
    CG_JOIN,      /* join ready-made v1 cgroups (a pool) */
    CG_MAKE,      /* mkdir, limit, join, rmdir a v1 cgroup per spawn */
    LANDLOCK,     /* a read-only ruleset for / and a seccomp filter */
    MOUNTNS,      /* a private mount namespace with a tmpfs workspace */
    NETNS,        /* a network namespace */
    NETNS_JOIN,   /* join a network namespace made before the timing starts */
    PIDNS,        /* a PID namespace: the program is its PID 1 */
    PIDNS_REAPER, /* sbxlimit's way: PID 1 (with /proc) vforks the program, execs a reaper */
    TYPICAL,      /* rlimits + cgroup join + mount ns + net ns + Landlock */
    VIEW,         /* Policy(workdir="/")'s view as the child makes it: a /dev
                   * cloned from a template, /proc and /sys read-only, the
                   * pins and read-only binds of the entries file */
    VIEW_COPY,    /* the same view made once: join it, copy it (unshare), add
                   * what is each sandbox's own (devpts, /dev/shm) */
    ROW_CG,       /* limits with a cgroup per sandbox (no policy), serial */
    ROW_WD,       /* Policy(workdir="/"), serial */
    ROW_POL,      /* Policy(), its workspace and a view built around it, serial */
    ROW_DENY,     /* Policy(workdir="/", network="deny"), serial */
    ROW_TYP,      /* the typical agent sandbox, serial */
    POOL_CG,      /* the same five rows, pooled */
    POOL_WD,
    POOL_POL,
    POOL_DENY,
    POOL_TYP,
    NVARIANTS
};

static const char *const names[NVARIANTS] = {
    [PLAIN] = "plain",
    [RLIMITS] = "rlimits",
    [CG_JOIN] = "cgroup-join",
    [CG_MAKE] = "cgroup-make",
    [LANDLOCK] = "landlock+seccomp",
    [MOUNTNS] = "mountns+tmpfs",
    [NETNS] = "netns",
    [NETNS_JOIN] = "netns-join",
    [PIDNS] = "pidns",
    [PIDNS_REAPER] = "pidns+reaper",
    [TYPICAL] = "typical",
    [VIEW] = "view",
    [VIEW_COPY] = "view-copy",
    [ROW_CG] = "row-cgroup-serial",
    [ROW_WD] = "row-workdir-serial",
    [ROW_POL] = "row-policy-serial",
    [ROW_DENY] = "row-deny-serial",
    [ROW_TYP] = "row-typical-serial",
    [POOL_CG] = "row-cgroup-pooled",
    [POOL_WD] = "row-workdir-pooled",
    [POOL_POL] = "row-policy-pooled",
    [POOL_DENY] = "row-deny-pooled",
    [POOL_TYP] = "row-typical-pooled",
};

/* A sandbox cgroup's v1 hierarchies where the pids controller exists (its
 * kill stops forks with pids.max = 0: no freezer). */
static const char *const hierarchies[] = {"memory", "pids", "cpuacct"};
#define NH (sizeof hierarchies / sizeof hierarchies[0])

static int procs_fd[NH];
static const char *reaper_path;
static int status_pipe[2] = {-1, -1};
static char target_stack[1 << 15] __attribute__((aligned(16)));
static int netns_fd = -1;
static int ruleset_fd = -1;
static struct sock_fprog filter;
/* sbxlimit's own filters for the rows (bench/floor.py writes them):
 * Policy()'s, and with network="deny". */
static struct sock_fprog row_filter, row_filter_net;
static char *const argv_true[] = {"/bin/true", NULL};
static char *const envp[] = {NULL};

/* The view's entries (main reads them), the /dev template, the view made once. */
#define MAX_ENTRIES 256
static char *pins[MAX_ENTRIES], *binds[MAX_ENTRIES];
static size_t n_pins, n_binds;
static int dev_template = -1;
static int view_ns = -1;

static long landlock(long nr, long a, long b, long c)
{
    return syscall(nr, a, b, c, 0L); /* every Landlock call has flags last: 0 */
}

static int make_ruleset(void)
{
    struct landlock_ruleset_attr attr = {.handled_access_fs = (1ULL << 13) - 1};
    struct landlock_path_beneath_attr root = {
        .allowed_access =
            LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR,
    };
    int fd = (int)landlock(SYS_landlock_create_ruleset, (long)&attr, sizeof attr, 0);

    if (fd < 0)
        return -1;
    root.parent_fd = open("/", O_PATH | O_CLOEXEC);
    if (landlock(SYS_landlock_add_rule, fd, LANDLOCK_RULE_PATH_BENEATH, (long)&root) < 0)
        return -1;
    close(root.parent_fd);
    return fd;
}

static void make_filter(void)
{
    /* Allow everything but ptrace: the cost of loading and running a
     * filter, not of a policy. */
    static struct sock_filter prog[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_ptrace, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    filter.len = sizeof prog / sizeof prog[0];
    filter.filter = prog;
}

static void join_cgroups(void)
{
    for (size_t i = 0; i < NH; i++)
        if (write(procs_fd[i], "0", 1) != 1)
            _exit(120);
}

static void sandbox(void)
{
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    if (landlock(SYS_landlock_restrict_self, ruleset_fd, 0, 0) < 0)
        _exit(121);
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &filter) < 0)
        _exit(122);
}

static void rlimits(void)
{
    struct rlimit r = {1 << 30, 1 << 30};
    struct rlimit n = {256, 256};
    struct rlimit c = {10, 11};

    setrlimit(RLIMIT_CPU, &c);
    setrlimit(RLIMIT_NOFILE, &n);
    setrlimit(RLIMIT_FSIZE, &r);
    setrlimit(RLIMIT_DATA, &r);
}

static void mountns(void)
{
    if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
        mount("tmpfs", "/tmp", "tmpfs", 0, "size=1m") < 0)
        _exit(123);
}

static int set_attr(int dfd, const char *path, unsigned flags, uint64_t set)
{
    struct mount_attr attr;

    memset(&attr, 0, sizeof attr);
    attr.attr_set = set;
    return (int)syscall(SYS_mount_setattr, dfd, path, flags, &attr, sizeof attr);
}

/* open_tree + move_mount, as the core binds (the source's tree, flags added). */
static int bind_tree(const char *src, const char *path, uint64_t set)
{
    int fd = (int)syscall(SYS_open_tree, AT_FDCWD, src,
                          OPEN_TREE_CLONE | O_CLOEXEC | AT_SYMLINK_NOFOLLOW | AT_RECURSIVE);
    int rc;

    if (fd < 0)
        return errno == ENOENT ? 0 : -1; /* not there: skipped, as the core does */
    rc = set ? set_attr(fd, "", AT_EMPTY_PATH | AT_RECURSIVE, set) : 0;
    if (rc == 0)
        rc = (int)syscall(SYS_move_mount, fd, "", AT_FDCWD, path, MOVE_MOUNT_F_EMPTY_PATH);
    close(fd);
    return rc;
}

/* What each sandbox has of its own in its /dev. */
static int own_dev(void)
{
    if (mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666"))
        return -1;
    return mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
}

/* The view, in a namespace just unshared; dev: a clone of the template;
 * once: the namespace made once, which each child copies. */
static int make_view(int dev, int once)
{
    uint64_t ro = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID;
    size_t i;

    /* "/" stays writable: a writable root, whence the pins.  /proc and
     * /sys turn read-only where they are, and in the namespace made once
     * the host's /dev goes before ours covers it (as the core's view). */
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        return -1;
    if (once)
        (void)umount2("/dev", MNT_DETACH);
    if (syscall(SYS_move_mount, dev, "", AT_FDCWD, "/dev", MOVE_MOUNT_F_EMPTY_PATH) < 0 ||
        set_attr(AT_FDCWD, "/proc", AT_RECURSIVE, ro) < 0 ||
        set_attr(AT_FDCWD, "/sys", AT_RECURSIVE, ro) < 0)
        return -1;
    for (i = 0; i < n_pins; i++)
        if (bind_tree(pins[i], pins[i], MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV) < 0)
            return -1;
    for (i = 0; i < n_binds; i++)
        if (bind_tree(binds[i], binds[i], ro) < 0)
            return -1;
    return 0;
}

static int clone_dev(void)
{
    return (int)syscall(SYS_open_tree, dev_template, "",
                        OPEN_TREE_CLONE | O_CLOEXEC | AT_EMPTY_PATH | AT_RECURSIVE);
}

static void view(void)
{
    int dev = clone_dev();

    if (dev < 0 || unshare(CLONE_NEWNS) < 0 || make_view(dev, 0) < 0 || own_dev() < 0)
        _exit(125);
}

static void view_copy(void)
{
    if (setns(view_ns, CLONE_NEWNS) < 0 || unshare(CLONE_NEWNS) < 0 || own_dev() < 0 ||
        chdir("/") < 0)
        _exit(125);
}

static int write_file(const char *path, const char *value);
static void cgroup_paths(char paths[NH][256], const char *name);

/* ---- the policy rows whole ------------------------------------------- */

#define R_WS     1u /* a fresh workspace: a view built around it, a ruleset of its own */
#define R_NET    2u /* a network namespace */
#define R_LIMITS 4u /* memory and pids limits written (and the typical sandbox's RLIMIT_CPU) */
#define R_POLICY 8u /* a Policy: an IPC namespace, a view, no capabilities, Landlock, seccomp */
#define N_ROWS   5
#define N_KINDS  N_ROWS /* each row's boxes are a kind of their own */

#ifndef PIDFD_GET_MNT_NAMESPACE
#define PIDFD_GET_MNT_NAMESPACE _IO(0xFF, 3) /* linux/pidfd.h, Linux 6.11 */
#endif

/* What one sandbox has of its own.  `mnt`: its mount namespace, held from
 * the exec to after the wait (as sbxlimit does: the child's exit then does
 * not tear it down). */
struct box {
    char cg[NH][256];
    int tasks[NH];
    char ws[80], ws_tmp[96];
    int net, ipc, ruleset, mnt;
};

static int last_cap = 40;
static int box_counter;
static struct box *cur_box; /* the spawn's, read by its child */

static const unsigned row_whats[N_ROWS] = {
    R_LIMITS, R_POLICY, R_POLICY | R_WS, R_POLICY | R_NET, R_POLICY | R_WS | R_NET | R_LIMITS,
};

static unsigned row_what(int v)
{
    return row_whats[(v - ROW_CG) % N_ROWS];
}

static int lo_up(void)
{
    struct ifreq ifr;
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), rc = -1;

    memset(&ifr, 0, sizeof ifr);
    memcpy(ifr.ifr_name, "lo", 3);
    if (s >= 0 && ioctl(s, SIOCGIFFLAGS, &ifr) == 0) {
        ifr.ifr_flags |= IFF_UP;
        rc = ioctl(s, SIOCSIFFLAGS, &ifr);
    }
    if (s >= 0)
        close(s);
    return rc;
}

/* A namespace of `kind` kept by an fd, as sbxlimit's pool makes it (a
 * network one with lo up), but in this thread: entered, kept, left. */
static int make_ns(int kind)
{
    const char *self =
        kind == CLONE_NEWNET ? "/proc/thread-self/ns/net" : "/proc/thread-self/ns/ipc";
    int home = open(self, O_RDONLY | O_CLOEXEC), fd = -1;

    if (home < 0)
        return -1;
    if (unshare(kind) == 0 && (kind != CLONE_NEWNET || lo_up() == 0))
        fd = open(self, O_RDONLY | O_CLOEXEC);
    if (setns(home, kind) < 0)
        abort(); /* this benchmark would go on in the wrong namespace */
    close(home);
    return fd;
}

static void remove_box(struct box *b)
{
    for (size_t i = 0; i < NH; i++) {
        if (b->tasks[i] >= 0)
            close(b->tasks[i]);
        if (b->cg[i][0])
            rmdir(b->cg[i]);
    }
    if (b->ws[0]) {
        rmdir(b->ws_tmp);
        rmdir(b->ws);
    }
    if (b->mnt >= 0)
        close(b->mnt);
    if (b->net >= 0)
        close(b->net);
    if (b->ipc >= 0)
        close(b->ipc);
}

/* The three cgroups (v1 joins through `tasks`, as sbxlimit's child does:
 * no thread-group lock), the workspace, the namespaces; what was made of
 * them is removed again if one fails. */
static int make_box(struct box *b, unsigned what)
{
    char name[64], file[300], paths[NH][256];
    int n = __atomic_fetch_add(&box_counter, 1, __ATOMIC_RELAXED);

    memset(b, 0, sizeof *b);
    b->net = b->ipc = b->ruleset = b->mnt = -1;
    for (size_t i = 0; i < NH; i++)
        b->tasks[i] = -1;
    snprintf(name, sizeof name, "floor-%d-b%d", (int)getpid(), n);
    cgroup_paths(paths, name);
    for (size_t i = 0; i < NH; i++) {
        if (mkdir(paths[i], 0755) < 0)
            goto fail;
        memcpy(b->cg[i], paths[i], sizeof b->cg[i]); /* made: removed on failure */
    }
    if (what & R_LIMITS) {
        snprintf(file, sizeof file, "%s/memory.limit_in_bytes", b->cg[0]);
        write_file(file, "536870912");
        snprintf(file, sizeof file, "%s/pids.max", b->cg[1]);
        write_file(file, "256");
    }
    for (size_t i = 0; i < NH; i++) {
        snprintf(file, sizeof file, "%s/tasks", b->cg[i]);
        if ((b->tasks[i] = open(file, O_WRONLY | O_CLOEXEC)) < 0)
            goto fail;
    }
    if (what & R_WS) {
        /* room left in ws for the renames' suffixes (rename_ws) */
        snprintf(b->ws, sizeof b->ws, "/tmp/floor-ws-XXXXXX");
        if (mkdtemp(b->ws) == NULL) {
            b->ws[0] = 0;
            goto fail;
        }
        snprintf(b->ws_tmp, sizeof b->ws_tmp, "%s/tmp", b->ws);
        if (mkdir(b->ws_tmp, 0700) < 0)
            goto fail;
    }
    if ((what & R_NET) && (b->net = make_ns(CLONE_NEWNET)) < 0)
        goto fail;
    if ((what & R_POLICY) && (b->ipc = make_ns(CLONE_NEWIPC)) < 0)
        goto fail;
    return 0;
fail:
    remove_box(b);
    return -1;
}

/* The rules a fresh workspace's ruleset has: / read, the workspace all,
 * the /dev entries a program may write. */
static int ws_ruleset(const char *ws)
{
    static const char *const devs[] = {"/dev/null",   "/dev/zero",    "/dev/full",
                                       "/dev/random", "/dev/urandom", "/dev/tty",
                                       "/dev/ptmx",   "/dev/pts",     "/dev/shm"};
    struct landlock_ruleset_attr attr = {.handled_access_fs = (1ULL << 13) - 1};
    struct landlock_path_beneath_attr rule;
    int fd = (int)landlock(SYS_landlock_create_ruleset, (long)&attr, sizeof attr, 0);

    for (size_t i = 0; fd >= 0 && i < 2 + sizeof devs / sizeof devs[0]; i++) {
        const char *path = i == 0 ? "/" : i == 1 ? ws : devs[i - 2];

        rule.allowed_access = i == 0 ? LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE |
                                           LANDLOCK_ACCESS_FS_READ_DIR
                              : i == 1
                                  ? (1ULL << 13) - 1
                                  : LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_READ_FILE;
        rule.parent_fd = open(path, O_PATH | O_CLOEXEC);
        if (rule.parent_fd < 0)
            continue; /* not on this machine */
        if (landlock(SYS_landlock_add_rule, fd, LANDLOCK_RULE_PATH_BENEATH, (long)&rule) < 0 &&
            errno != EINVAL) {
            close(rule.parent_fd);
            close(fd);
            return -1;
        }
        close(rule.parent_fd);
    }
    return fd;
}

static void drop_caps(void)
{
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];

    for (int c = 0; c <= last_cap; c++)
        prctl(PR_CAPBSET_DROP, c, 0, 0, 0);
    memset(data, 0, sizeof data);
    if (syscall(SYS_capset, &hdr, data) < 0)
        _exit(128);
}

/* Policy()'s view: / read-only, the workspace writable, a /dev of its own. */
static void ws_view(const char *ws)
{
    int tree = (int)syscall(SYS_open_tree, AT_FDCWD, ws, OPEN_TREE_CLONE | O_CLOEXEC);
    int dev = clone_dev();

    if (tree < 0 || dev < 0 || unshare(CLONE_NEWNS) < 0 ||
        mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
        set_attr(AT_FDCWD, "/", AT_RECURSIVE, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID) < 0)
        _exit(129);
    if (syscall(SYS_move_mount, dev, "", AT_FDCWD, "/dev", MOVE_MOUNT_F_EMPTY_PATH) < 0 ||
        own_dev() < 0 ||
        syscall(SYS_move_mount, tree, "", AT_FDCWD, ws, MOVE_MOUNT_F_EMPTY_PATH) < 0 || chdir(ws))
        _exit(129);
}

static void row_child(int v)
{
    unsigned what = row_what(v);
    struct box *b = cur_box;
    struct rlimit zero = {0, 0}, cpu = {60, 61};

    for (size_t i = 0; i < NH; i++)
        if (write(b->tasks[i], "0", 1) != 1)
            _exit(120);
    setrlimit(RLIMIT_CORE, &zero);
    if (!(what & R_POLICY)) {
        setpgid(0, 0); /* limits alone: a group of its own, the tree to end */
        return;
    }
    setsid();
    if (what & R_LIMITS)
        setrlimit(RLIMIT_CPU, &cpu);
    if ((b->net >= 0 && setns(b->net, CLONE_NEWNET) < 0) || setns(b->ipc, CLONE_NEWIPC) < 0)
        _exit(124);
    if (what & R_WS)
        ws_view(b->ws);
    else
        view_copy();
    drop_caps();
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    if (landlock(SYS_landlock_restrict_self, b->ruleset >= 0 ? b->ruleset : ruleset_fd, 0, 0) < 0)
        _exit(121);
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, (what & R_NET) ? &row_filter_net : &row_filter) <
        0)
        _exit(122);
}

/* The pooled rows' second thread: two boxes of each kind kept ready, the
 * used ones removed. */
#define POOL_SIZE   2
#define MAX_RETIRED 64
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_work = PTHREAD_COND_INITIALIZER;
static struct box ready[N_KINDS][POOL_SIZE], retired[MAX_RETIRED];
static int n_ready[N_KINDS], n_retired, pool_stop, pool_failed, pool_misses;

static unsigned kind_what(int k)
{
    return row_whats[k];
}

static void *pool_thread(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&pool_lock);
    while (!pool_stop) {
        int k, did = 0;

        if (n_retired > 0) {
            struct box b = retired[--n_retired];

            pthread_mutex_unlock(&pool_lock);
            remove_box(&b);
            pthread_mutex_lock(&pool_lock);
            did = 1;
        }
        for (k = 0; k < N_KINDS && !pool_failed; k++) {
            if (n_ready[k] < POOL_SIZE) {
                struct box b;

                pthread_mutex_unlock(&pool_lock);
                if (make_box(&b, kind_what(k)) < 0)
                    pool_failed = 1;
                pthread_mutex_lock(&pool_lock);
                if (!pool_failed)
                    ready[k][n_ready[k]++] = b;
                did = 1;
            }
        }
        if (!did)
            pthread_cond_wait(&pool_work, &pool_lock);
    }
    pthread_mutex_unlock(&pool_lock);
    return NULL;
}

/* A ready box, or one made here (a miss, counted); the pool's thread is
 * woken once the child runs (pool_wake), as sbxlimit's supervisor. */
static int take_box(unsigned what, struct box *b)
{
    int k = 0, got = 0;

    while (k < N_ROWS - 1 && row_whats[k] != what)
        k++;

    pthread_mutex_lock(&pool_lock);
    if (n_ready[k] > 0) {
        *b = ready[k][--n_ready[k]];
        got = 1;
    } else {
        pool_misses++;
    }
    pthread_mutex_unlock(&pool_lock);
    return got || make_box(b, what) == 0;
}

/* sbxlimit renames a ready workspace for its sandbox, and away at close. */
static int rename_ws(struct box *b, const char *suffix)
{
    char to[sizeof b->ws];

    if (snprintf(to, sizeof to, "%s%s", b->ws, suffix) >= (int)sizeof to || rename(b->ws, to) < 0)
        return -1;
    memcpy(b->ws, to, sizeof to);
    snprintf(b->ws_tmp, sizeof b->ws_tmp, "%s/tmp", b->ws);
    return 0;
}

static void pool_wake(void)
{
    pthread_mutex_lock(&pool_lock);
    pthread_cond_signal(&pool_work);
    pthread_mutex_unlock(&pool_lock);
}

static void retire_box(struct box *b)
{
    pthread_mutex_lock(&pool_lock);
    if (n_retired < MAX_RETIRED) {
        retired[n_retired++] = *b;
        b = NULL;
    }
    pthread_cond_signal(&pool_work);
    pthread_mutex_unlock(&pool_lock);
    if (b != NULL)
        remove_box(b);
}

static void drain_pool(void)
{
    pthread_mutex_lock(&pool_lock);
    pool_stop = 1;
    pthread_cond_signal(&pool_work);
    pthread_mutex_unlock(&pool_lock);
}

static sigset_t saved_mask;

static int target(void *arg)
{
    (void)arg;
    sigprocmask(SIG_SETMASK, &saved_mask, NULL);
    execve(argv_true[0], argv_true, envp);
    _exit(127);
}

/* PID 1 as sbxlimit's core makes it: /proc of its own, the program started
 * with a vfork-style clone, then the static reaper exec'd in its place. */
static void pid1(void)
{
    char tbuf[16], fbuf[16];
    char *argv[] = {"sbxlimit-pid1", tbuf, fbuf, NULL};
    sigset_t all;
    pid_t t;

    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
        _exit(126);
    /* Blocked from here into the reaper: its sigwaitinfo sees the SIGCHLD. */
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &saved_mask);
    t = clone(target, target_stack + sizeof target_stack, CLONE_VM | CLONE_VFORK | SIGCHLD, NULL);
    if (t < 0)
        _exit(126);
    snprintf(tbuf, sizeof tbuf, "%d", (int)t);
    snprintf(fbuf, sizeof fbuf, "%d", status_pipe[1]);
    fcntl(status_pipe[1], F_SETFD, 0);
    execve(reaper_path, argv, envp);
    _exit(126);
}

static int child(void *arg)
{
    int v = (int)(intptr_t)arg;

    switch (v) {
    case RLIMITS:
        rlimits();
        break;
    case CG_JOIN:
    case CG_MAKE:
        join_cgroups();
        break;
    case LANDLOCK:
        sandbox();
        break;
    case MOUNTNS:
        mountns();
        break;
    case NETNS:
        if (unshare(CLONE_NEWNET) < 0)
            _exit(124);
        break;
    case PIDNS_REAPER:
        pid1();
        break;
    case NETNS_JOIN:
        if (setns(netns_fd, CLONE_NEWNET) < 0)
            _exit(124);
        break;
    case TYPICAL:
        join_cgroups();
        rlimits();
        mountns();
        if (unshare(CLONE_NEWNET) < 0)
            _exit(124);
        sandbox();
        break;
    case VIEW:
        view();
        break;
    case VIEW_COPY:
        view_copy();
        break;
    case ROW_CG:
    case ROW_WD:
    case ROW_POL:
    case ROW_DENY:
    case ROW_TYP:
    case POOL_CG:
    case POOL_WD:
    case POOL_POL:
    case POOL_DENY:
    case POOL_TYP:
        row_child(v);
        break;
    }
    execve(argv_true[0], argv_true, envp);
    _exit(127);
}

/* A /dev as the core's template: a directory of the host's six nodes,
 * pts and shm, cloned detached (a bind of it, as good as a tmpfs here). */
static char dev_dir[] = "/tmp/floor-dev-XXXXXX";
static const char *const dev_nodes[] = {"null", "zero", "full", "random", "urandom",
                                        "tty",  "ptmx", "pts",  "shm"};
#define N_DEV_NODES 6 /* the rest: a link and two directories */

static int make_dev_template(void)
{
    char from[64], to[300];
    struct stat st;

    for (size_t i = 0; i < N_DEV_NODES; i++) {
        snprintf(from, sizeof from, "/dev/%s", dev_nodes[i]);
        snprintf(to, sizeof to, "%s/%s", dev_dir, dev_nodes[i]);
        if (stat(from, &st) < 0 || mknod(to, st.st_mode, st.st_rdev) < 0)
            return -1;
    }
    snprintf(to, sizeof to, "%s/ptmx", dev_dir);
    if (symlink("pts/ptmx", to) < 0)
        return -1;
    snprintf(to, sizeof to, "%s/pts", dev_dir);
    if (mkdir(to, 0755) < 0)
        return -1;
    snprintf(to, sizeof to, "%s/shm", dev_dir);
    if (mkdir(to, 01777) < 0)
        return -1;
    dev_template =
        (int)syscall(SYS_open_tree, AT_FDCWD, dev_dir, OPEN_TREE_CLONE | O_CLOEXEC | AT_RECURSIVE);
    return dev_template < 0 ? -1 : 0;
}

static void remove_dev_dir(void)
{
    char path[300];

    for (size_t i = 0; i < sizeof dev_nodes / sizeof dev_nodes[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dev_dir, dev_nodes[i]);
        if (unlink(path) < 0)
            rmdir(path);
    }
    rmdir(dev_dir);
}

/* The view made once: a process makes it in a namespace of its own, and
 * the namespace is kept by an fd after the process is gone. */
static int make_view_ns(void)
{
    int ready[2], rc = -1;
    char path[64], c;
    pid_t pid;

    if (pipe2(ready, O_CLOEXEC) < 0)
        return -1;
    pid = fork();
    if (pid == 0) {
        int dev = clone_dev();

        close(ready[0]);
        if (dev < 0 || unshare(CLONE_NEWNS) < 0 || make_view(dev, 1) < 0)
            _exit(1);
        if (write(ready[1], "x", 1) != 1)
            _exit(1);
        pause();
        _exit(0);
    }
    close(ready[1]);
    if (pid > 0 && read(ready[0], &c, 1) == 1) {
        snprintf(path, sizeof path, "/proc/%d/ns/mnt", (int)pid);
        view_ns = open(path, O_RDONLY | O_CLOEXEC);
        rc = view_ns < 0 ? -1 : 0;
    }
    close(ready[0]);
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    return rc;
}

/* A filter program as _core.seccomp_program gives it (struct sock_filter[]). */
static int read_filter(const char *file, struct sock_fprog *prog)
{
    static struct sock_filter progs[2][4096];
    static int used;
    FILE *f = fopen(file, "rb");
    size_t n;

    if (f == NULL || used >= 2)
        return -1;
    n = fread(progs[used], sizeof progs[used][0], 4096, f);
    fclose(f);
    if (n == 0)
        return -1;
    prog->len = (unsigned short)n;
    prog->filter = progs[used++];
    return 0;
}

static int read_entries(const char *file)
{
    char line[4096];
    FILE *f = fopen(file, "r");

    if (f == NULL)
        return -1;
    while (fgets(line, sizeof line, f) != NULL) {
        size_t n = strlen(line);

        if (n < 3 || (line[0] != 'P' && line[0] != 'R'))
            continue;
        line[n - 1] = line[n - 1] == '\n' ? 0 : line[n - 1];
        if (line[0] == 'P' && n_pins < MAX_ENTRIES)
            pins[n_pins++] = strdup(line + 2);
        else if (line[0] == 'R' && n_binds < MAX_ENTRIES)
            binds[n_binds++] = strdup(line + 2);
    }
    fclose(f);
    return 0;
}

static int write_file(const char *path, const char *value)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC), ok;

    if (fd < 0)
        return -1;
    ok = write(fd, value, strlen(value)) == (ssize_t)strlen(value);
    close(fd);
    return ok ? 0 : -1;
}

static void cgroup_paths(char paths[NH][256], const char *name)
{
    for (size_t i = 0; i < NH; i++)
        snprintf(paths[i], 256, "/sys/fs/cgroup/%s/%s", hierarchies[i], name);
}

static int open_procs(char paths[NH][256])
{
    char p[300];

    for (size_t i = 0; i < NH; i++) {
        snprintf(p, sizeof p, "%s/cgroup.procs", paths[i]);
        procs_fd[i] = open(p, O_WRONLY | O_CLOEXEC);
        if (procs_fd[i] < 0)
            return -1;
    }
    return 0;
}

static void close_procs(void)
{
    for (size_t i = 0; i < NH; i++)
        close(procs_fd[i]);
}

static int64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t spawn_once(int v, char *stack_top, int *counter)
{
    char paths[NH][256], name[64], file[300];
    int flags = CLONE_VM | CLONE_VFORK | SIGCHLD, status;
    int64_t t0 = now_ns();
    pid_t pid;

    if (v == CG_MAKE) {
        snprintf(name, sizeof name, "floor-%d-%d", (int)getpid(), (*counter)++);
        cgroup_paths(paths, name);
        for (size_t i = 0; i < NH; i++)
            if (mkdir(paths[i], 0755) < 0)
                return -1;
        snprintf(file, sizeof file, "%s/memory.limit_in_bytes", paths[0]);
        write_file(file, "1073741824");
        snprintf(file, sizeof file, "%s/pids.max", paths[1]);
        write_file(file, "1024");
        if (open_procs(paths) < 0)
            return -1;
    }
    if (v == PIDNS_REAPER) {
        flags |= CLONE_NEWPID | CLONE_NEWNS;
        if (pipe2(status_pipe, O_CLOEXEC) < 0)
            return -1;
    }
    if (v == PIDNS)
        flags |= CLONE_NEWPID;
    pid = clone(child, stack_top, flags, (void *)(intptr_t)v);
    if (pid < 0)
        return -1;
    if (v == PIDNS_REAPER) {
        int sts = -1;

        /* The program's status, as the core reads it at reap. */
        close(status_pipe[1]);
        if (waitpid(pid, &status, 0) < 0 || read(status_pipe[0], &sts, sizeof sts) != sizeof sts)
            sts = -1;
        close(status_pipe[0]);
        status = sts;
    } else if (waitpid(pid, &status, 0) < 0) {
        status = -1;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "floor: %s: child status %#x\n", names[v], status);
        return -1;
    }
    if (v == CG_MAKE) {
        close_procs();
        for (size_t i = 0; i < NH; i++)
            rmdir(paths[i]);
    }
    return now_ns() - t0;
}

/* A row's spawn: its own objects (made here, or taken ready), its ruleset
 * if it has a workspace, the child, then the objects removed (or handed
 * to the pool's thread). */
static int64_t spawn_row(int v, char *stack_top)
{
    unsigned what = row_what(v);
    int pooled = v >= POOL_CG, status, pidfd = -1;
    int64_t t0 = now_ns();
    struct box b;
    pid_t pid;

    if (pooled ? !take_box(what, &b) : make_box(&b, what) < 0)
        return -1;
    if (pooled && b.ws[0] && rename_ws(&b, "-taken") < 0) {
        remove_box(&b);
        return -1;
    }
    if ((what & R_WS) && (b.ruleset = ws_ruleset(b.ws)) < 0) {
        remove_box(&b);
        return -1;
    }
    cur_box = &b;
    /* A mount namespace of its own is held (sbxlimit asks for a pidfd
     * only then). */
    pid = clone(child, stack_top,
                CLONE_VM | CLONE_VFORK | SIGCHLD | ((what & R_POLICY) ? CLONE_PIDFD : 0),
                (void *)(intptr_t)v, &pidfd);
    if (pid > 0 && pidfd >= 0) {
        b.mnt = ioctl(pidfd, PIDFD_GET_MNT_NAMESPACE, 0); /* -1: exited already */
        close(pidfd);
    }
    if (pooled)
        pool_wake();
    if (pid < 0 || waitpid(pid, &status, 0) < 0)
        status = -1;
    if (b.ruleset >= 0)
        close(b.ruleset);
    b.ruleset = -1;
    if (pooled && b.ws[0])
        rename_ws(&b, ".removing"); /* its path gone before the spawn returns */
    if (pooled)
        retire_box(&b);
    else
        remove_box(&b);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "floor: %s: child status %#x\n", names[v], status);
        return -1;
    }
    return now_ns() - t0;
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 300, counter = 0, failed = 0;
    int64_t *t[NVARIANTS];
    char paths[NH][256];
    char *stack = malloc(1 << 16);
    int order[NVARIANTS];
    pthread_t pool;

    reaper_path = argc > 2 ? argv[2] : NULL;
    if (!stack || rounds <= 0 || !reaper_path || argc < 6)
        return 2;
    if (read_filter(argv[4], &row_filter) < 0 || read_filter(argv[5], &row_filter_net) < 0) {
        fprintf(stderr, "floor: the filters in %s and %s cannot be read\n", argv[4], argv[5]);
        return 2;
    }
    if (read_entries(argv[3]) < 0 || mkdtemp(dev_dir) == NULL || make_dev_template() < 0 ||
        make_view_ns() < 0) {
        perror("floor: view");
        remove_dev_dir();
        return 2;
    }
    ruleset_fd = make_ruleset();
    if (ruleset_fd < 0) {
        perror("floor: landlock");
        return 2;
    }
    make_filter();
    {
        FILE *f = fopen("/proc/sys/kernel/cap_last_cap", "r");

        if (f != NULL) {
            if (fscanf(f, "%d", &last_cap) != 1)
                last_cap = 40;
            fclose(f);
        }
    }
    if (pthread_create(&pool, NULL, pool_thread, NULL) != 0) {
        perror("floor: pool thread");
        return 2;
    }
    cgroup_paths(paths, "floor-pool");
    for (size_t i = 0; i < NH; i++)
        mkdir(paths[i], 0755);
    for (int v = 0; v < NVARIANTS; v++) {
        t[v] = calloc((size_t)rounds, sizeof **t);
        order[v] = v;
    }
    srand((unsigned)now_ns());
    for (int r = 0; r < rounds; r++) {
        for (int i = NVARIANTS - 1; i > 0; i--) {
            int j = rand() % (i + 1), x = order[i];
            order[i] = order[j];
            order[j] = x;
        }
        for (int i = 0; i < NVARIANTS; i++) {
            int v = order[i];

            if (((v == CG_JOIN || v == TYPICAL) && open_procs(paths) < 0) ||
                (v == NETNS_JOIN && (netns_fd = make_ns(CLONE_NEWNET)) < 0)) {
                perror("floor: cgroup or netns");
                failed = 1;
                goto out;
            }
            t[v][r] = v >= ROW_CG ? spawn_row(v, stack + (1 << 16))
                                  : spawn_once(v, stack + (1 << 16), &counter);
            if (v == CG_JOIN || v == TYPICAL)
                close_procs();
            if (v == NETNS_JOIN)
                close(netns_fd);
            if (t[v][r] < 0) {
                failed = 1;
                goto out;
            }
        }
    }
out:
    drain_pool();
    pthread_join(pool, NULL);
    for (int k = 0; k < N_KINDS; k++)
        while (n_ready[k] > 0)
            remove_box(&ready[k][--n_ready[k]]);
    while (n_retired > 0)
        remove_box(&retired[--n_retired]);
    for (size_t i = 0; i < NH; i++)
        rmdir(paths[i]);
    close(view_ns);
    close(dev_template);
    remove_dev_dir();
    if (failed)
        return 1;
    if (pool_failed)
        fprintf(stderr, "floor: the pool's thread could not make a sandbox's objects\n");
    printf("# pool-misses %d\n", pool_misses);
    for (int v = 0; v < NVARIANTS; v++) {
        qsort(t[v], (size_t)rounds, sizeof **t, cmp64);
        printf("%s %lld\n", names[v], (long long)t[v][rounds / 2]);
    }
    return 0;
}
