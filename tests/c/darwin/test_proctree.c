/* test_proctree.c -- csrc/darwin/proctree.c on Linux, against the libproc
 * model (fake_libproc.c).
 *
 * Built and run by tests/test_darwin_c.py:
 *   cc -std=c11 -D_GNU_SOURCE -Dkill=fake_kill -Itests/c/darwin -Icsrc \
 *      tests/c/darwin/test_proctree.c tests/c/darwin/fake_libproc.c \
 *      csrc/darwin/proctree.c
 * Usage: test_proctree CASE... | all | --list.  Exit status 0 when every
 * check of the cases passes; each failure is printed.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_libproc.h"
#include "sbx.h"

static int failures;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define CHECK_U64(got, want) check_u64(__LINE__, #got, (uint64_t)(got), (uint64_t)(want))
#define CHECK_SEC(got, want) check_sec(__LINE__, #got, (got), (want))

static void check_u64(int line, const char *expr, uint64_t got, uint64_t want)
{
    if (got != want) {
        failures++;
        fprintf(stderr, "%s:%d: %s = %llu, want %llu\n", __FILE__, line, expr,
                (unsigned long long)got, (unsigned long long)want);
    }
}

static void check_sec(int line, const char *expr, double got, double want)
{
    if (fabs(got - want) > 1e-9 * (fabs(want) + 1)) {
        failures++;
        fprintf(stderr, "%s:%d: %s = %.12g s, want %.12g s\n", __FILE__, line, expr, got, want);
    }
}

/* Mach absolute time units of the model (125/3 ns) to seconds. */
static double ticks(uint64_t t)
{
    return (double)t * 125.0 / 3.0 / 1e9;
}

/* A process with `footprint` bytes accounted, of which only part is
 * resident (the rest compressed), and `threads` threads. */
static pid_t proc(pid_t ppid, uint64_t footprint, int threads)
{
    pid_t pid = fake_spawn(ppid);
    struct fake_proc *p = fake_get(pid);

    p->footprint = footprint;
    p->resident = footprint / 3 + 4096;
    p->threads = threads;
    return pid;
}

/* The sums sbx_tree_sample should report over pids[0..n) (live ones). */
struct want {
    uint64_t memory;
    uint32_t tasks, procs;
};

static void add(struct want *w, pid_t pid)
{
    const struct fake_proc *p = fake_get(pid);

    w->memory += p->footprint;
    w->tasks += (uint32_t)p->threads;
    w->procs++;
}

static void check_sample(pid_t root, const struct want *w)
{
    struct sbx_tree_sample s;

    CHECK(sbx_tree_sample(root, 0, &s) == 0);
    CHECK_U64(s.procs, w->procs);
    CHECK_U64(s.tasks, w->tasks);
    CHECK_U64(s.memory, w->memory);
    CHECK(s.root_alive == 1);
}

/* A root with n children: every one is seen, whatever n. */
static void children(int n)
{
    struct want w = {0, 0, 0};
    pid_t root = proc(1, 50 << 20, 3);
    int k;

    add(&w, root);
    for (k = 0; k < n; k++)
        add(&w, proc(root, (uint64_t)(k + 1) << 20, 1 + k % 4));
    check_sample(root, &w);
}

static void case_children_1(void)
{
    children(1);
}

static void case_children_2(void)
{
    children(2);
}

static void case_children_3(void)
{
    children(3);
}

/* More children than fit in one buffer, and exactly as many as fill one:
 * a full buffer is asked again, not taken as the whole list. */
static void case_children_many(void)
{
    children(3000);
}

static void case_children_1024(void)
{
    children(1024);
}

/* root -> a -> b (setsid) -> c, root -> d -> e: three levels, one of them
 * in a session of its own, and still part of the tree by its parent. */
static void case_three_levels_setsid(void)
{
    struct want w = {0, 0, 0};
    pid_t root = proc(1, 10 << 20, 2), a = proc(root, 20 << 20, 1), b = proc(a, 30 << 20, 4);
    pid_t c = proc(b, 40 << 20, 1), d = proc(root, 50 << 20, 2), e = proc(d, 60 << 20, 1);
    pid_t outside = proc(1, 1 << 30, 1);

    fake_setsid(b);
    fake_get(c)->sid = fake_get(c)->pgid = b;
    fake_get(outside)->pgid = fake_get(root)->pgid; /* same group, not in the tree */
    add(&w, root);
    add(&w, a);
    add(&w, b);
    add(&w, c);
    add(&w, d);
    add(&w, e);
    check_sample(root, &w);
}

/* Memory is phys_footprint, not the resident size. */
static void case_memory_is_footprint(void)
{
    struct sbx_tree_sample s;
    pid_t root = proc(1, 300 << 20, 1), kid = proc(root, 700 << 20, 1);

    CHECK(fake_get(root)->resident != fake_get(root)->footprint);
    CHECK(sbx_tree_sample(root, 0, &s) == 0);
    CHECK_U64(s.memory, fake_get(root)->footprint + fake_get(kid)->footprint);
}

/* Zombies hold a pid (counted, one task each) but no memory, even though
 * proc_pid_rusage answers for them. */
static void case_zombies(void)
{
    struct sbx_tree_sample s;
    pid_t root = proc(1, 1 << 20, 2), a = proc(root, 2 << 20, 3), z1 = proc(root, 64 << 20, 5);
    pid_t z2 = proc(a, 128 << 20, 7);

    fake_exit(z1);
    fake_exit(z2);
    CHECK(sbx_tree_sample(root, 0, &s) == 0);
    CHECK_U64(s.memory, (1 << 20) + (2 << 20));
    CHECK_U64(s.procs, 4);
    CHECK_U64(s.tasks, 2 + 3 + 1 + 1);
    CHECK(s.root_alive == 1);

    fake_exit(root);
    fake_reap(a); /* not a zombie: no effect */
    CHECK(sbx_tree_sample(root, 0, &s) == 0);
    CHECK(s.root_alive == 0);
}

/* CPU: Mach absolute time units converted, reaped children included, and
 * unchanged by a reap (the parent takes the child's time over). */
static void case_cpu(void)
{
    struct sbx_tree_sample s, after;
    pid_t root = proc(1, 1 << 20, 1), a = proc(root, 1 << 20, 1), z = proc(a, 1 << 20, 1);

    fake_get(root)->user = 3000000000ULL;
    fake_get(root)->system = 600000000ULL;
    fake_get(root)->child_user = 1200000000ULL; /* reaped before */
    fake_get(root)->child_system = 30000000ULL;
    fake_get(a)->user = 240000000ULL;
    fake_get(a)->system = 24000000ULL;
    fake_get(z)->user = 72000000ULL;
    fake_get(z)->system = 7200000ULL;
    fake_exit(z);
    CHECK(sbx_tree_sample(root, 0, &s) == 0);
    CHECK_SEC(s.cpu_user, ticks(3000000000ULL + 1200000000ULL + 240000000ULL + 72000000ULL));
    CHECK_SEC(s.cpu_system, ticks(600000000ULL + 30000000ULL + 24000000ULL + 7200000ULL));
    fake_reap(z);
    CHECK(sbx_tree_sample(root, 0, &after) == 0);
    CHECK_SEC(after.cpu_user, s.cpu_user);
    CHECK_SEC(after.cpu_system, s.cpu_system);
    CHECK_U64(after.procs, s.procs - 1);
}

/* skip_root: the root's memory, threads and pid left out, its CPU (and
 * that of the children it reaped) kept. */
static void case_skip_root(void)
{
    struct sbx_tree_sample s;
    pid_t root = proc(1, 900 << 20, 6), a = proc(root, 5 << 20, 2), b = proc(a, 7 << 20, 3);

    fake_get(root)->user = 3000;
    fake_get(root)->child_user = 6000;
    fake_get(b)->user = 300;
    CHECK(sbx_tree_sample(root, 1, &s) == 0);
    CHECK_U64(s.memory, (5 << 20) + (7 << 20));
    CHECK_U64(s.tasks, 2 + 3);
    CHECK_U64(s.procs, 2);
    CHECK(s.root_alive == 1);
    CHECK_SEC(s.cpu_user, ticks(3000 + 6000 + 300));
}

static int signals_of(pid_t pid, int sig)
{
    const struct fake_proc *p = fake_get(pid);
    int i, n = 0;

    for (i = 0; i < p->n_history; i++)
        n += p->history[i] == sig;
    return n;
}

static int position_of(pid_t pid, int sig)
{
    const struct fake_proc *p = fake_get(pid);
    int i;

    for (i = 0; i < p->n_history; i++)
        if (p->history[i] == sig)
            return i;
    return -1;
}

static int called(pid_t pid, int sig)
{
    size_t i;

    for (i = 0; i < fake_n_calls; i++)
        if (fake_calls[i].pid == pid && fake_calls[i].sig == sig)
            return 1;
    return 0;
}

/* SIGKILL: every process of the tree, the setsid() one and its child
 * included, is stopped first, then killed, then sent SIGCONT. */
static void case_kill_tree(void)
{
    pid_t root = proc(1, 1, 1), a = proc(root, 1, 1), b = proc(a, 1, 1), c = proc(b, 1, 1);
    pid_t d = proc(root, 1, 1), z = proc(d, 1, 1), outside = proc(1, 1, 1);
    pid_t tree[] = {root, a, b, c, d};
    size_t i;

    fake_setsid(b);
    fake_get(c)->sid = fake_get(c)->pgid = b;
    fake_exit(z);
    CHECK_U64(sbx_tree_signal(root, SIGKILL, root), 6); /* the zombie is signalled too */
    for (i = 0; i < sizeof tree / sizeof tree[0]; i++) {
        const struct fake_proc *p = fake_get(tree[i]);

        CHECK(p->state == FAKE_ZOMBIE);
        CHECK(position_of(tree[i], SIGSTOP) >= 0);
        CHECK(position_of(tree[i], SIGSTOP) < position_of(tree[i], SIGKILL));
        CHECK(called(tree[i], SIGKILL));
        CHECK(called(tree[i], SIGCONT));
    }
    CHECK(fake_get(outside)->state == FAKE_LIVE);
    CHECK(fake_get(outside)->n_history == 0);
}

/* A fork loop in a session of its own: a child it makes after a walk is
 * found by the re-walk once everything is stopped, and killed too. */
static void case_kill_fork_loop(void)
{
    pid_t root = proc(1, 1, 1), loop = proc(root, 1, 1);
    int i, made;

    fake_setsid(loop);
    fake_get(loop)->forks = 1;
    CHECK(sbx_tree_signal(root, SIGKILL, root) >= 3);
    made = 0;
    for (i = loop + 1; fake_get(i) != NULL; i++) {
        made++;
        CHECK(fake_get(i)->ppid == 1); /* its parent died */
        CHECK(fake_get(i)->state == FAKE_ZOMBIE);
    }
    CHECK(made >= 1);
    CHECK(fake_get(root)->state == FAKE_ZOMBIE);
    CHECK(fake_get(loop)->state == FAKE_ZOMBIE);
}

/* Any other signal: exactly once to every process, nothing stopped. */
static void case_signal_term(void)
{
    pid_t root = proc(1, 1, 1), a = proc(root, 1, 1), b = proc(a, 1, 1), c = proc(root, 1, 1);
    pid_t tree[] = {root, a, b, c};
    size_t i;

    fake_setsid(b);
    CHECK_U64(sbx_tree_signal(root, SIGTERM, root), 4);
    for (i = 0; i < sizeof tree / sizeof tree[0]; i++) {
        CHECK_U64(signals_of(tree[i], SIGTERM), 1);
        CHECK_U64(signals_of(tree[i], SIGSTOP), 0);
        CHECK_U64(signals_of(tree[i], SIGCONT), 0);
        CHECK(fake_get(tree[i])->state == FAKE_ZOMBIE);
    }
}

static const struct {
    const char *name;
    void (*fn)(void);
} cases[] = {
    {"children_1", case_children_1},
    {"children_2", case_children_2},
    {"children_3", case_children_3},
    {"children_many", case_children_many},
    {"children_1024", case_children_1024},
    {"three_levels_setsid", case_three_levels_setsid},
    {"memory_is_footprint", case_memory_is_footprint},
    {"zombies", case_zombies},
    {"cpu", case_cpu},
    {"skip_root", case_skip_root},
    {"kill_tree", case_kill_tree},
    {"kill_fork_loop", case_kill_fork_loop},
    {"signal_term", case_signal_term},
};
#define N_CASES (sizeof cases / sizeof cases[0])

static int run(size_t i)
{
    int before = failures;

    fake_reset();
    cases[i].fn();
    printf("%s: %s\n", cases[i].name, failures == before ? "ok" : "FAILED");
    return failures == before;
}

int main(int argc, char **argv)
{
    size_t i;
    int a;

    if (argc == 2 && strcmp(argv[1], "--list") == 0) {
        for (i = 0; i < N_CASES; i++)
            printf("%s\n", cases[i].name);
        return 0;
    }
    if (argc < 2) {
        fprintf(stderr, "usage: %s CASE... | all | --list\n", argv[0]);
        return 2;
    }
    for (a = 1; a < argc; a++) {
        int found = 0;

        for (i = 0; i < N_CASES; i++)
            if (strcmp(argv[a], "all") == 0 || strcmp(argv[a], cases[i].name) == 0) {
                run(i);
                found = 1;
            }
        if (!found) {
            fprintf(stderr, "no case %s\n", argv[a]);
            return 2;
        }
    }
    return failures ? 1 : 0;
}
