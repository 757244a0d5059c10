/* test_fds.c -- close_fds as macOS does it (no close_range, no /proc), on
 * Linux: csrc/spawn.c and csrc/fds.c built with -DSBX_TEST_PORTABLE_FDS
 * against the libproc model, the child forked (-DSBX_NO_VFORK).
 *
 * Built and run by tests/test_darwin_c.py:
 *   cc -std=c11 -D_GNU_SOURCE -DSBX_TEST_PORTABLE_FDS -DSBX_NO_VFORK \
 *      -Itests/c/darwin -Icsrc tests/c/darwin/test_fds.c \
 *      tests/c/darwin/fake_libproc.c csrc/spawn.c csrc/child_fail.c csrc/fds.c \
 *      csrc/rlimit.c csrc/none/cgroup.c csrc/none/seccomp.c csrc/none/landlock.c \
 *      csrc/none/namespaces.c
 * Usage: test_fds CASE... | all | --list.  Each case spawns this program
 * again with open_files (RLIMIT_NOFILE) lowered, which checks its fds:
 *   test_fds --check open:N closed:N ...
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sbx_internal.h"

/* spawn.c's Linux-only steps, never reached here (no caps, no PID
 * namespace in these specs). */
int sbx_caps_drop_child(const struct sbx_spec *s)
{
    (void)s;
    errno = ENOSYS;
    return -1;
}

pid_t sbx_ns_clone_pid1(struct sbx_child_ctx *ctx)
{
    (void)ctx;
    errno = ENOSYS;
    return -1;
}

#define LOWERED 64 /* Limits.open_files in every case */

static int failures;
static char self[PATH_MAX];

static void fail(const char *what)
{
    failures++;
    fprintf(stderr, "%s\n", what);
}

/* In the spawned program: each "open:N" must be an open fd without
 * close-on-exec, each "closed:N" must not be open. */
static int check(int argc, char **argv)
{
    int a, bad = 0;

    for (a = 2; a < argc; a++) {
        int want_open = strncmp(argv[a], "open:", 5) == 0;
        int fd = atoi(strchr(argv[a], ':') + 1);
        int flags = fcntl(fd, F_GETFD);

        if (want_open ? flags < 0 : !(flags < 0 && errno == EBADF)) {
            fprintf(stderr, "fd %d is %s, want %s\n", fd, flags < 0 ? "closed" : "open",
                    want_open ? "open" : "closed");
            bad = 1;
        }
    }
    return bad;
}

/* /dev/null at fd `at`, inheritable. */
static void open_at(int at)
{
    int fd = open("/dev/null", O_RDONLY);

    if (fd < 0 || dup2(fd, at) != at) {
        perror("open_at");
        exit(2);
    }
    close(fd);
}

static void set_soft_nofile(rlim_t soft)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < soft)) {
        fprintf(stderr, "RLIMIT_NOFILE hard limit below %lu\n", (unsigned long)soft);
        exit(2);
    }
    rl.rlim_cur = soft;
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
        perror("setrlimit");
        exit(2);
    }
}

/* Spawn `self --check expect...` with RLIMIT_NOFILE lowered to LOWERED,
 * close_fds, keeping keep[0..n_keep); fail unless it exits 0. */
static void spawn_check(const int *keep, size_t n_keep, const char *const *expect)
{
    struct sbx_rlimit rl = {RLIMIT_NOFILE, LOWERED, LOWERED};
    const char *paths[] = {self};
    char *argv[16];
    struct sbx_spec spec;
    struct sbx_child child;
    struct sbx_child_error err;
    int status = 0, rc;
    size_t i;

    argv[0] = self;
    argv[1] = (char *)"--check";
    for (i = 0; expect[i] && i < 13; i++)
        argv[2 + i] = (char *)expect[i];
    argv[2 + i] = NULL;
    memset(&spec, 0, sizeof spec);
    spec.exec_paths = paths;
    spec.n_exec_paths = 1;
    spec.argv = argv;
    spec.fd_stdin = spec.fd_stdout = spec.fd_stderr = -1;
    spec.close_fds = 1;
    spec.keep_fds = keep;
    spec.n_keep_fds = n_keep;
    spec.pgid = -1;
    spec.uid = spec.gid = -1;
    spec.umask = -1;
    spec.rlimits = &rl;
    spec.n_rlimits = 1;
    spec.landlock_fd = spec.cgroup_dirfd = spec.tmpfs_sock = spec.ns_status_fd = -1;
    if (sbx_spawn_start(&spec, &child) < 0) {
        perror("sbx_spawn_start");
        exit(2);
    }
    rc = sbx_spawn_finish(&child, &err, &status);
    if (rc != 0) {
        fprintf(stderr, "child failed at %s: %s\n", sbx_step_name(err.step), strerror(err.err));
        fail("spawn failed");
        return;
    }
    while (waitpid(child.pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the spawned program saw fds it should not have");
}

/* An fd between the child's lowered limit and the parent's soft limit. */
static void case_above_child_limit(void)
{
    const char *const expect[] = {"closed:10", "closed:200", "closed:1000", NULL};

    set_soft_nofile(1024);
    open_at(10);
    open_at(200);
    open_at(1000);
    spawn_check(NULL, 0, expect);
}

/* An fd opened before the parent lowered its own soft limit: above every
 * limit, found only in the fd table (PROC_PIDLISTFDS). */
static void case_above_parent_limit(void)
{
    const char *const expect[] = {"closed:20", "closed:300", NULL};

    set_soft_nofile(1024);
    open_at(20);
    open_at(300);
    set_soft_nofile(128);
    spawn_check(NULL, 0, expect);
}

/* pass_fds above the lowered limit stay, their neighbours go. */
static void case_keep_above_limit(void)
{
    static const int keep[] = {70, 150};
    const char *const expect[] = {"closed:40", "open:70",    "closed:149",
                                  "open:150",  "closed:151", NULL};

    set_soft_nofile(1024);
    open_at(40);
    open_at(70);
    open_at(149);
    open_at(150);
    open_at(151);
    spawn_check(keep, 2, expect);
}

static const struct {
    const char *name;
    void (*fn)(void);
} cases[] = {
    {"above_child_limit", case_above_child_limit},
    {"above_parent_limit", case_above_parent_limit},
    {"keep_above_limit", case_keep_above_limit},
};
#define N_CASES (sizeof cases / sizeof cases[0])

/* Each case in a process of its own: its fds and limits stay there. */
static int run(size_t i)
{
    pid_t pid = fork();
    int status = 0, ok;

    if (pid < 0) {
        perror("fork");
        exit(2);
    }
    if (pid == 0) {
        cases[i].fn();
        _exit(failures ? 1 : 0);
    }
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    printf("%s: %s\n", cases[i].name, ok ? "ok" : "FAILED");
    return ok;
}

int main(int argc, char **argv)
{
    size_t i;
    int a, bad = 0;

    if (argc >= 2 && strcmp(argv[1], "--check") == 0)
        return check(argc, argv);
    if (argc == 2 && strcmp(argv[1], "--list") == 0) {
        for (i = 0; i < N_CASES; i++)
            printf("%s\n", cases[i].name);
        return 0;
    }
    if (argc < 2) {
        fprintf(stderr, "usage: %s CASE... | all | --list\n", argv[0]);
        return 2;
    }
    if (!realpath("/proc/self/exe", self)) {
        perror("/proc/self/exe");
        return 2;
    }
    for (a = 1; a < argc; a++) {
        int found = 0;

        for (i = 0; i < N_CASES; i++)
            if (strcmp(argv[a], "all") == 0 || strcmp(argv[a], cases[i].name) == 0) {
                fflush(stdout);
                bad |= !run(i);
                found = 1;
            }
        if (!found) {
            fprintf(stderr, "no case %s\n", argv[a]);
            return 2;
        }
    }
    return bad;
}
