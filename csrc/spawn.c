/* spawn.c -- create the child, run its setup sequence, exec the target.
 *
 * Shape taken from CPython's _posixsubprocess.c: everything is prepared in
 * the parent; the child only makes system calls, one step a line, and
 * reports the first failure as a fixed-size record on a close-on-exec pipe
 * (child_fail.c).
 *
 * Without a preexec hook the child is created with CLONE_VM|CLONE_VFORK on a
 * stack of its own: no page tables are copied, so spawning costs the same
 * from a 10 MiB parent as from a 10 GiB one.  The child then shares the
 * parent's memory until execve and must not write anything the parent
 * reads, call malloc, take locks, or run signal handlers: all signals are
 * blocked across the clone and handlers are reset to SIG_DFL in the child
 * before its mask is restored.  Credentials are changed with raw system
 * calls, because glibc's set*id() wrappers signal every thread of the
 * parent's thread list.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef __linux__
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/prctl.h>
#endif

#include "sbx_internal.h"

extern char **environ;

/* Sanitizer runtimes do not follow a CLONE_VM child; those builds fork. */
#if !defined(__linux__) || defined(SBX_NO_VFORK)
#define SBX_USE_VFORK 0
#else
#define SBX_USE_VFORK 1
#endif

#define SBX_CHILD_STACK (128 * 1024)

/* ---- child side: everything below up to sbx_spawn_start runs between
 * fork and exec and is async-signal-safe. -------------------------------- */

/* Handlers of a CLONE_VM child would run on the parent's memory: put every
 * caught signal back to SIG_DFL before the mask is lifted.  Ignored signals
 * stay ignored, as execve would keep them. */
static void reset_handlers_child(const struct sbx_child_ctx *ctx)
{
    struct sigaction dfl;
    int sig;

    if (ctx->spec->fail_step == SBX_STEP_SIGNALS_RESET)
        sbx_child_fail(ctx, SBX_STEP_SIGNALS_RESET, ctx->spec->fail_errno, 0);
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (sig = 1; sig < NSIG; sig++) {
        struct sigaction cur;
        void *h;

        if (sig == SIGKILL || sig == SIGSTOP)
            continue;
        /* libc refuses its internal signals with EINVAL: nothing to do. */
        if (sigaction(sig, NULL, &cur) < 0)
            continue;
        h = (cur.sa_flags & SA_SIGINFO) ? (void *)cur.sa_sigaction : (void *)cur.sa_handler;
        if (h == (void *)SIG_IGN || h == (void *)SIG_DFL)
            continue;
        (void)sigaction(sig, &dfl, NULL);
    }
}

static int restore_signals_child(void)
{
    /* Python ignores these; a program expects the default. */
    if (signal(SIGPIPE, SIG_DFL) == SIG_ERR)
        return -1;
#ifdef SIGXFSZ
    if (signal(SIGXFSZ, SIG_DFL) == SIG_ERR)
        return -1;
#endif
    return 0;
}

/* dup2 src onto target; when they are equal dup2 is a no-op that would
 * leave close-on-exec set, so clear the flag instead. */
static int dup_onto_child(int src, int target)
{
    if (src == target) {
        int flags = fcntl(src, F_GETFD);
        if (flags < 0)
            return -1;
        return fcntl(src, F_SETFD, flags & ~FD_CLOEXEC);
    }
    return dup2(src, target);
}

static void stdio_child(const struct sbx_child_ctx *ctx)
{
    const struct sbx_spec *s = ctx->spec;
    int in = s->fd_stdin, out = s->fd_stdout, err = s->fd_stderr;

    /* A source fd among 0..2 could be overwritten by an earlier dup2
     * (bpo-12607): move such sources above 2 first. */
    if (out == 0)
        SBX_CHILD_STEP(ctx, SBX_STEP_STDIO, 1, out = fcntl(out, F_DUPFD_CLOEXEC, 3));
    if (err == 0 || err == 1)
        SBX_CHILD_STEP(ctx, SBX_STEP_STDIO, 2, err = fcntl(err, F_DUPFD_CLOEXEC, 3));

    if (in >= 0)
        SBX_CHILD_STEP(ctx, SBX_STEP_STDIO, 0, dup_onto_child(in, 0));
    if (out >= 0)
        SBX_CHILD_STEP(ctx, SBX_STEP_STDIO, 1, dup_onto_child(out, 1));
    if (err >= 0)
        SBX_CHILD_STEP(ctx, SBX_STEP_STDIO, 2, dup_onto_child(err, 2));
}

/* expect: the parent's pid as we see it. */
static int set_pdeathsig_child(const struct sbx_child_ctx *ctx, pid_t expect)
{
#ifdef __linux__
    if (prctl(PR_SET_PDEATHSIG, ctx->spec->pdeathsig, 0, 0, 0) < 0)
        return -1;
    /* The parent may have died before the prctl: nobody would signal us. */
    if (getppid() != expect)
        _exit(127);
    return 0;
#else
    (void)ctx;
    (void)expect;
    errno = ENOSYS;
    return -1;
#endif
}

/* Raw system calls: glibc's wrappers would broadcast to the parent's
 * threads (see the header comment). */
static int setgroups_child(const struct sbx_spec *s)
{
#ifdef __linux__
    return (int)syscall(SYS_setgroups, s->n_groups, s->groups);
#else
    return setgroups((int)s->n_groups, s->groups);
#endif
}

static int setgid_child(long gid)
{
#ifdef __linux__
    return (int)syscall(SYS_setregid, (gid_t)gid, (gid_t)gid);
#else
    return setregid((gid_t)gid, (gid_t)gid);
#endif
}

static int setuid_child(long uid)
{
#ifdef __linux__
    return (int)syscall(SYS_setreuid, (uid_t)uid, (uid_t)uid);
#else
    return setreuid((uid_t)uid, (uid_t)uid);
#endif
}

static int no_new_privs_child(void)
{
#ifdef __linux__
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
#else
    return 0;
#endif
}

static _Noreturn void exec_child(const struct sbx_child_ctx *ctx)
{
    const struct sbx_spec *s = ctx->spec;
    char *const *envp = s->envp ? s->envp : environ;
    int saved = 0;
    size_t i;

    if (s->fail_step == SBX_STEP_EXEC)
        sbx_child_fail(ctx, SBX_STEP_EXEC, s->fail_errno, 0);
    /* The same rule as os.execvpe: go on past "not here", remember the
     * first real error (EACCES, ENOEXEC...). */
    for (i = 0; i < s->n_exec_paths; i++) {
        execve(s->exec_paths[i], s->argv, envp);
        if (errno != ENOENT && errno != ENOTDIR && saved == 0)
            saved = errno;
    }
    sbx_child_fail(ctx, SBX_STEP_EXEC, saved ? saved : errno, 0);
}

static void child_setup_target(const struct sbx_child_ctx *ctx);

/* The sandbox's setup: every step up to the preexec hook.  A fork_only
 * child stops here and returns to its caller's code. */
static void child_setup(const struct sbx_child_ctx *ctx)
{
    const struct sbx_spec *s = ctx->spec;

    /* First: nothing the child does, and nothing it starts, runs outside
     * the sandbox's cgroups. */
    sbx_cgroup_join_child(ctx);
    if (ctx->vforked && !(ctx->how & SBX_HOW_CLONE3))
        reset_handlers_child(ctx);
    if (s->restore_signals)
        SBX_CHILD_STEP(ctx, SBX_STEP_SIGNALS_RESET, 0, restore_signals_child());
    stdio_child(ctx);
    if (s->new_session)
        SBX_CHILD_STEP(ctx, SBX_STEP_SETSID, 0, setsid());
    if (s->pgid >= 0)
        SBX_CHILD_STEP(ctx, SBX_STEP_SETPGID, s->pgid, setpgid(0, s->pgid));
    /* PID 1 of a new PID namespace sees its parent as pid 0; whether the
     * parent is gone it learns from the status pipe (namespaces.c). */
    if (s->pdeathsig > 0)
        SBX_CHILD_STEP(ctx, SBX_STEP_PDEATHSIG, s->pdeathsig,
                       set_pdeathsig_child(ctx, (ctx->how & SBX_HOW_PID1) ? 0 : s->parent_pid));
    /* Before the rlimits (RLIMIT_NPROC would count the PID namespace's
     * reaper) and before chdir (the workspace may become a tmpfs). */
    if (s->ns_flags || s->ns_join_net || s->ns_join_ipc)
        sbx_ns_enter_child(ctx);
    child_setup_target(ctx);
}

/* The setup steps after the namespaces: a PID namespace's target starts
 * here (see child_main_target). */
static void child_setup_target(const struct sbx_child_ctx *ctx)
{
    const struct sbx_spec *s = ctx->spec;

#ifdef __linux__
    /* In a PID namespace Popen.pid is PID 1, which took the caller's
     * session or group request for the outside view; the program leads a
     * session or group of its own, as it would without the namespace. */
    if ((s->ns_flags & SBX_CLONE_NEWPID) && s->new_session)
        SBX_CHILD_STEP(ctx, SBX_STEP_SETSID, 1, setsid());
    else if ((s->ns_flags & SBX_CLONE_NEWPID) && s->pgid == 0)
        SBX_CHILD_STEP(ctx, SBX_STEP_SETPGID, 1, setpgid(0, 0));
#endif
    sbx_rlimit_apply_child(ctx);
    if (s->cwd)
        SBX_CHILD_STEP(ctx, SBX_STEP_CHDIR, 0, chdir(s->cwd));
    if (s->umask >= 0)
        SBX_CHILD_STEP(ctx, SBX_STEP_UMASK, s->umask, (umask((mode_t)s->umask), 0));
    if (s->set_groups)
        SBX_CHILD_STEP(ctx, SBX_STEP_SETGROUPS, (int64_t)s->n_groups, setgroups_child(s));
    if (s->gid >= 0)
        SBX_CHILD_STEP(ctx, SBX_STEP_SETGID, s->gid, setgid_child(s->gid));
    if (s->uid >= 0)
        SBX_CHILD_STEP(ctx, SBX_STEP_SETUID, s->uid, setuid_child(s->uid));
#ifdef __linux__
    if (s->drop_caps)
        SBX_CHILD_STEP(ctx, SBX_STEP_CAPS, 0, sbx_caps_drop_child(s));
#endif
    /* A change of uid or gid clears the parent-death signal: set it again.
     * In a new PID namespace our parent is its PID 1, whose death takes
     * the namespace with it. */
    if (s->pdeathsig > 0 && (s->uid >= 0 || s->gid >= 0))
        SBX_CHILD_STEP(
            ctx, SBX_STEP_PDEATHSIG, s->pdeathsig,
            set_pdeathsig_child(ctx, (s->ns_flags & SBX_CLONE_NEWPID) ? 1 : s->parent_pid));
    if (s->no_new_privs)
        SBX_CHILD_STEP(ctx, SBX_STEP_NO_NEW_PRIVS, 0, no_new_privs_child());
    if (s->landlock_fd >= 0)
        SBX_CHILD_STEP(ctx, SBX_STEP_LANDLOCK, s->landlock_fd, sbx_landlock_restrict_child(s));
    /* Last: the filter then covers everything the program does, and none
     * of the steps above has to get past it. */
    if (s->seccomp)
        SBX_CHILD_STEP(ctx, SBX_STEP_SECCOMP, (int64_t)s->n_seccomp, sbx_seccomp_load_child(s));
}

static _Noreturn void child_exec(const struct sbx_child_ctx *ctx);

/* The child sequence: one flat list, one step a line. */
static _Noreturn void child_main(const struct sbx_child_ctx *ctx)
{
    child_setup(ctx);
    child_exec(ctx);
}

#ifdef __linux__
/* A PID namespace's target: PID 1 did the steps up to the namespaces. */
static void child_main_target(const struct sbx_child_ctx *ctx)
{
    child_setup_target(ctx);
    child_exec(ctx);
}
#endif

static _Noreturn void child_exec(const struct sbx_child_ctx *ctx)
{
    const struct sbx_spec *s = ctx->spec;

    if (s->hook)
        SBX_CHILD_STEP(ctx, SBX_STEP_PREEXEC, 0, (s->hook(s->hook_arg) == 0 ? 0 : (errno = 0, -1)));
    sbx_fds_keep_child(ctx);
    sbx_fds_close_child(ctx);
    if (ctx->vforked)
        SBX_CHILD_STEP(ctx, SBX_STEP_SIGMASK, 0, sigprocmask(SIG_SETMASK, &ctx->saved_mask, NULL));
    exec_child(ctx);
}

#if SBX_USE_VFORK
static int child_entry(void *arg)
{
    child_main((const struct sbx_child_ctx *)arg);
}

/* One child stack per spawning thread, kept for the thread's life: a
 * CLONE_VFORK child is done with it when clone() returns, and mapping and
 * unmapping it on every spawn costs a TLB shootdown in a threaded parent. */
static pthread_key_t stack_key;
static pthread_once_t stack_once = PTHREAD_ONCE_INIT;
static int stack_key_ok;

static void stack_release(void *stack)
{
    munmap(stack, SBX_CHILD_STACK);
}

static void stack_key_init(void)
{
    stack_key_ok = pthread_key_create(&stack_key, stack_release) == 0;
}

static void *child_stack(void)
{
    void *stack;

    pthread_once(&stack_once, stack_key_init);
    if (stack_key_ok && (stack = pthread_getspecific(stack_key)) != NULL)
        return stack;
    stack = mmap(NULL, SBX_CHILD_STACK, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack == MAP_FAILED)
        return NULL;
    if (!stack_key_ok || pthread_setspecific(stack_key, stack) != 0) {
        /* Cannot cache it: the caller unmaps it after use. */
        return stack;
    }
    return stack;
}

static int stack_cached(void *stack)
{
    return stack_key_ok && pthread_getspecific(stack_key) == stack;
}

#ifndef CLONE_CLEAR_SIGHAND
#define CLONE_CLEAR_SIGHAND 0x100000000ULL
#endif
#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif
#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x1000
#endif

/* Cleared the first time the kernel (or a seccomp filter, as Docker's
 * default profile does) refuses clone3 itself. */
static int clone3_usable = 1;

/* The CLONE_VM|CLONE_VFORK child, made with clone3 where possible.  Fills
 * ctx->how.  Returns the pid, or -1 with errno. */
static pid_t clone_vm_child(struct sbx_child_ctx *ctx, void *stack)
{
    const struct sbx_spec *spec = ctx->spec;
    pid_t pid;
    /* PID 1 of a new PID (and user) namespace, which execs the reaper. */
    unsigned pid1 = 0;
    int how_pid1 = 0;

#ifdef __linux__
    if (spec->ns_flags & SBX_CLONE_NEWPID) {
        pid1 = CLONE_NEWPID | ((unsigned)spec->ns_flags & CLONE_NEWUSER);
        how_pid1 = SBX_HOW_PID1;
        ctx->target_main = child_main_target;
    }
#endif
    if (__atomic_load_n(&clone3_usable, __ATOMIC_RELAXED)) {
        struct sbx_clone_args ca;
        long r;

        memset(&ca, 0, sizeof ca);
        ca.flags = CLONE_VM | CLONE_VFORK | CLONE_CLEAR_SIGHAND | pid1;
#ifdef __linux__
        if (spec->ns_flags & CLONE_NEWNS) {
            /* A pidfd for nothing: asked through it, the kernel gives the
             * mount namespace the caller holds until the reap, without a
             * lookup of /proc/<pid> (sbx_spawn_finish). */
            ca.flags |= CLONE_PIDFD;
            ca.pidfd = (uint64_t)(uintptr_t)&ctx->pidfd;
        }
#endif
        ca.exit_signal = SIGCHLD;
        ca.stack = (uint64_t)(uintptr_t)stack;
        ca.stack_size = SBX_CHILD_STACK;
        ctx->how = SBX_HOW_VM | SBX_HOW_CLONE3 | how_pid1;
        if (spec->cgroup_dirfd >= 0) {
            ca.flags |= CLONE_INTO_CGROUP;
            ca.cgroup = (uint64_t)spec->cgroup_dirfd;
            ctx->how |= SBX_HOW_INTO_CGROUP;
            r = sbx_clone3_run(&ca, child_entry, ctx);
            if (r >= 0)
                return (pid_t)r;
            /* The cgroup was refused (older kernel, permissions): the
             * child writes cgroup.procs itself and reports the errno. */
            ca.flags &= ~(uint64_t)CLONE_INTO_CGROUP;
            ctx->how &= ~SBX_HOW_INTO_CGROUP;
        }
        r = sbx_clone3_run(&ca, child_entry, ctx);
        if (r >= 0)
            return (pid_t)r;
        if (r != -ENOSYS && r != -EPERM && r != -EINVAL && r != -E2BIG) {
            errno = (int)-r;
            return -1;
        }
        __atomic_store_n(&clone3_usable, 0, __ATOMIC_RELAXED);
    }
    ctx->pidfd = -1;
    ctx->how = SBX_HOW_VM | how_pid1;
    /* Stacks grow down on every architecture Linux runs us on. */
    pid = clone(child_entry, (char *)stack + SBX_CHILD_STACK,
                (int)(CLONE_VM | CLONE_VFORK | pid1 | SIGCHLD), ctx);
    return pid;
}
#endif

/* ---- parent side ------------------------------------------------------ */

/* The error pipe's write end must survive the stdio dup2s: keep it >= 3. */
static int errpipe_open(int fds[2])
{
    if (sbx_pipe_cloexec(fds) < 0)
        return -1;
    if (fds[1] < 3) {
        int moved = fcntl(fds[1], F_DUPFD_CLOEXEC, 3);
        int saved = errno;

        close(fds[1]);
        if (moved < 0) {
            close(fds[0]);
            errno = saved;
            return -1;
        }
        fds[1] = moved;
    }
    return 0;
}

/* Error pipes and fork(): a fork()ed child that does not execve soon (a
 * fork_only sandbox runs the caller's Python; a PID namespace's PID 1
 * lives as long as the target) would keep the write end of another
 * thread's error pipe open, and that spawn would wait for the child to
 * exit.  Spawns hold this lock shared from the pipe's creation until its
 * write end is closed here; fork() holds it exclusively. */
static pthread_rwlock_t pipe_lock;
static pthread_once_t pipe_lock_once = PTHREAD_ONCE_INIT;

static void pipe_lock_init(void)
{
    pthread_rwlockattr_t attr;

    pthread_rwlockattr_init(&attr);
#ifdef __GLIBC__
    /* A steady stream of spawns must not starve a fork. */
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
#endif
    pthread_rwlock_init(&pipe_lock, &attr);
    pthread_rwlockattr_destroy(&attr);
}

int sbx_spawn_start(const struct sbx_spec *spec, struct sbx_child *child)
{
    struct sbx_child_ctx ctx;
    int pipefd[2];
    pid_t pid;
    int saved_errno = 0;

    memset(&ctx, 0, sizeof ctx);
    ctx.spec = spec;
    ctx.pidfd = -1;
    child->pidfd = -1;
    child->mnt_ns = SBX_MNT_NS_ASK;
    /* Here, not in the child: its rlimits lower RLIMIT_NOFILE first. */
    if (spec->close_fds && !spec->fork_only)
        ctx.fd_top = sbx_fds_top();
    /* PID 1 of a PID namespace lives on as the target's reaper: it shares
     * our memory only if it can exec the reaper program.  A child that
     * changes uid or gid cannot share it: the kernel would mark the shared
     * memory, ours, not dumpable (CPython forks in that case too). */
    ctx.vforked = SBX_USE_VFORK && spec->hook == NULL && !spec->fork_only &&
                  (!(spec->ns_flags & SBX_CLONE_NEWPID) || spec->ns_reaper != NULL) &&
                  spec->uid < 0 && spec->gid < 0 && !spec->set_groups;
    pthread_once(&pipe_lock_once, pipe_lock_init);
    if (ctx.vforked)
        pthread_rwlock_rdlock(&pipe_lock);
    else
        pthread_rwlock_wrlock(&pipe_lock);
    if (errpipe_open(pipefd) < 0) {
        saved_errno = errno;
        pthread_rwlock_unlock(&pipe_lock);
        errno = saved_errno;
        return -1;
    }
    ctx.errfd = pipefd[1];

#if SBX_USE_VFORK
    if (ctx.vforked) {
        sigset_t all;
        void *stack;
        int rc;

        stack = child_stack();
        if (stack == NULL) {
            saved_errno = errno;
            close(pipefd[0]);
            close(pipefd[1]);
            pthread_rwlock_unlock(&pipe_lock);
            errno = saved_errno;
            return -1;
        }
        sigfillset(&all);
        rc = pthread_sigmask(SIG_BLOCK, &all, &ctx.saved_mask);
        if (rc != 0) {
            if (!stack_cached(stack))
                munmap(stack, SBX_CHILD_STACK);
            close(pipefd[0]);
            close(pipefd[1]);
            pthread_rwlock_unlock(&pipe_lock);
            errno = rc;
            return -1;
        }
        pid = clone_vm_child(&ctx, stack);
        saved_errno = errno;
        (void)pthread_sigmask(SIG_SETMASK, &ctx.saved_mask, NULL);
        if (!stack_cached(stack))
            munmap(stack, SBX_CHILD_STACK);
    } else
#endif
        if (spec->ns_flags & SBX_CLONE_NEWPID) {
#ifdef __linux__
        ctx.target_main = child_main_target;
        pid = sbx_ns_clone_pid1(&ctx);
        saved_errno = errno;
        if (pid == 0)
            child_main(&ctx);
#else
        pid = -1;
        saved_errno = ENOSYS;
#endif
    } else {
        pid = fork();
        saved_errno = errno;
        if (pid == 0 && spec->fork_only) {
            /* Set up, then back to the caller; EOF on the pipe says so.
             * The lock was copied held by a thread that is not here. */
            pipe_lock_init();
            child_setup(&ctx);
            close(pipefd[0]);
            close(pipefd[1]);
            child->pid = 0;
            child->errpipe = -1;
            child->how = 0;
            return 0;
        }
        if (pid == 0)
            child_main(&ctx);
    }

    close(pipefd[1]);
    pthread_rwlock_unlock(&pipe_lock);
    if (pid < 0) {
        close(pipefd[0]);
        errno = saved_errno;
        return -1;
    }
    child->pid = pid;
    child->errpipe = pipefd[0];
    child->how = ctx.how;
    child->pidfd = ctx.pidfd;
    return 0;
}

#ifndef PIDFD_GET_MNT_NAMESPACE
#define PIDFD_GET_MNT_NAMESPACE _IO(0xFF, 3) /* linux/pidfd.h, Linux 6.11 */
#endif

/* The exec'd child's mount namespace, through its pidfd (closed here). */
static void take_mnt_ns(struct sbx_child *child)
{
    int fd;

    if (child->pidfd < 0)
        return;
#ifdef __linux__
    fd = ioctl(child->pidfd, PIDFD_GET_MNT_NAMESPACE, 0);
    if (fd >= 0)
        child->mnt_ns = fd;
    else if (errno == ESRCH)
        child->mnt_ns = -1; /* exited: its namespace is gone with it */
#else
    (void)fd;
#endif
    close(child->pidfd);
    child->pidfd = -1;
}

int sbx_spawn_finish(struct sbx_child *child, struct sbx_child_error *err, int *status)
{
    char *buf = (char *)err;
    size_t got = 0;
    pid_t r;

    memset(err, 0, sizeof *err);
    while (got < sizeof *err) {
        ssize_t n = read(child->errpipe, buf + got, sizeof *err - got);
        if (n < 0) {
            int saved = errno;
            if (saved == EINTR)
                continue;
            /* We cannot tell whether exec happened: do not leave a child
             * running that nobody knows about. */
            close(child->errpipe);
            child->errpipe = -1;
            if (child->pidfd >= 0) {
                close(child->pidfd);
                child->pidfd = -1;
            }
            kill(child->pid, SIGKILL);
            do {
                r = waitpid(child->pid, status, 0);
            } while (r < 0 && errno == EINTR);
            errno = saved;
            return -1;
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    close(child->errpipe);
    child->errpipe = -1;
    if (got == 0) {
        take_mnt_ns(child);
        return 0;
    }
    if (child->pidfd >= 0) {
        close(child->pidfd);
        child->pidfd = -1;
    }
    if (got != sizeof *err) {
        err->step = SBX_STEP_NONE;
        err->err = EIO;
        err->detail = (int64_t)got;
    }
    do {
        r = waitpid(child->pid, status, 0);
    } while (r < 0 && errno == EINTR);
    return 1;
}
