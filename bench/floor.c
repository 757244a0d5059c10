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
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
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
};

static const char *const hierarchies[] = {"memory", "pids", "cpuacct", "freezer"};
#define NH (sizeof hierarchies / sizeof hierarchies[0])

static int procs_fd[NH];
static const char *reaper_path;
static int status_pipe[2] = {-1, -1};
static char target_stack[1 << 15] __attribute__((aligned(16)));
static int netns_fd = -1;
static int ruleset_fd = -1;
static struct sock_fprog filter;
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

/* The view, in a namespace just unshared; dev: a clone of the template. */
static int make_view(int dev)
{
    uint64_t ro = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID;
    size_t i;

    /* "/" stays writable: a writable root, whence the pins. */
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
        syscall(SYS_move_mount, dev, "", AT_FDCWD, "/dev", MOVE_MOUNT_F_EMPTY_PATH) < 0 ||
        bind_tree("/proc", "/proc", ro) < 0 || bind_tree("/sys", "/sys", ro) < 0)
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

    if (dev < 0 || unshare(CLONE_NEWNS) < 0 || make_view(dev) < 0 || own_dev() < 0)
        _exit(125);
}

static void view_copy(void)
{
    if (setns(view_ns, CLONE_NEWNS) < 0 || unshare(CLONE_NEWNS) < 0 || own_dev() < 0 ||
        chdir("/") < 0)
        _exit(125);
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
    }
    execve(argv_true[0], argv_true, envp);
    _exit(127);
}

/* As sbxlimit's pool does it, but in this thread: enter a new one, keep
 * an fd, come back. */
static int make_netns(void)
{
    int home = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);

    if (home < 0 || unshare(CLONE_NEWNET) < 0)
        return -1;
    netns_fd = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (setns(home, CLONE_NEWNET) < 0)
        abort(); /* this benchmark would go on in the wrong namespace */
    close(home);
    return netns_fd < 0 ? -1 : 0;
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
        if (dev < 0 || unshare(CLONE_NEWNS) < 0 || make_view(dev) < 0)
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

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 300, counter = 0;
    int64_t *t[NVARIANTS];
    char paths[NH][256];
    char *stack = malloc(1 << 16);
    int order[NVARIANTS];

    reaper_path = argc > 2 ? argv[2] : NULL;
    if (!stack || rounds <= 0 || !reaper_path || argc < 4)
        return 2;
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

            if ((v == CG_JOIN || v == TYPICAL) && open_procs(paths) < 0)
                return 2;
            if (v == NETNS_JOIN && make_netns() < 0) {
                perror("floor: netns");
                return 2;
            }
            t[v][r] = spawn_once(v, stack + (1 << 16), &counter);
            if (v == CG_JOIN || v == TYPICAL)
                close_procs();
            if (v == NETNS_JOIN)
                close(netns_fd);
            if (t[v][r] < 0) {
                remove_dev_dir();
                return 1;
            }
        }
    }
    for (size_t i = 0; i < NH; i++)
        rmdir(paths[i]);
    close(view_ns);
    close(dev_template);
    remove_dev_dir();
    for (int v = 0; v < NVARIANTS; v++) {
        qsort(t[v], (size_t)rounds, sizeof **t, cmp64);
        printf("%s %lld\n", names[v], (long long)t[v][rounds / 2]);
    }
    return 0;
}
