/* linux/proctree.c -- a sandbox's process tree, read from /proc.
 *
 * Used where no cgroup holds the tree: the memory/pids watchdog samples it,
 * and tree kills signal it.  Descendants are found through
 * /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN), which costs in
 * proportion to the tree, not to the host.  A process that double-forks
 * and calls setsid() leaves the tree and the process group: only a cgroup
 * can follow it (docs/SECURITY.md).
 *
 * Parent side only: malloc and stdio-free file reads are fine here.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../sbx.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

#define TREE_MAX    65536 /* processes followed per call */
#define KILL_ROUNDS 64    /* stop-and-rewalk rounds for SIGKILL */

struct pidvec {
    pid_t *pid;
    int *fd; /* pidfds, or NULL when not collected */
    size_t n, cap;
};

static int vec_has(const struct pidvec *v, pid_t pid)
{
    size_t i;

    for (i = 0; i < v->n; i++)
        if (v->pid[i] == pid)
            return 1;
    return 0;
}

static int vec_push(struct pidvec *v, pid_t pid, int fd, int want_fds)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        pid_t *p;

        if (cap > TREE_MAX)
            cap = TREE_MAX;
        if (v->n == cap) {
            errno = E2BIG;
            return -1;
        }
        p = realloc(v->pid, cap * sizeof *p);
        if (!p)
            return -1;
        v->pid = p;
        if (want_fds) {
            int *f = realloc(v->fd, cap * sizeof *f);
            if (!f)
                return -1;
            v->fd = f;
        }
        v->cap = cap;
    }
    v->pid[v->n] = pid;
    if (want_fds)
        v->fd[v->n] = fd;
    v->n++;
    return 0;
}

static void vec_free(struct pidvec *v)
{
    size_t i;

    if (v->fd)
        for (i = 0; i < v->n; i++)
            if (v->fd[i] >= 0)
                close(v->fd[i]);
    free(v->pid);
    free(v->fd);
    memset(v, 0, sizeof *v);
}

/* Read a small /proc file whole; returns bytes read (NUL-terminated), or -1
 * when it cannot be read or does not fit (never half a file). */
static ssize_t read_small(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n, got = 0;

    if (fd < 0)
        return -1;
    for (;;) {
        n = read(fd, buf + got, size - 1 - (size_t)got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += n;
        if ((size_t)got == size - 1) {
            char extra;

            do {
                n = read(fd, &extra, 1);
            } while (n < 0 && errno == EINTR);
            if (n != 0) {
                close(fd);
                errno = EOVERFLOW;
                return -1;
            }
            break;
        }
    }
    close(fd);
    if (n < 0)
        return -1;
    buf[got] = '\0';
    return got;
}

/* Call fn(arg, child) for each pid listed in a children file.  The file
 * can be long (a fork loop), so it is parsed in chunks. */
static int for_each_child(const char *path, int (*fn)(void *, pid_t), void *arg)
{
    char buf[4096];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    long cur = -1;
    ssize_t n;

    if (fd < 0)
        return -1;
    for (;;) {
        ssize_t i;

        n = read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        for (i = 0; i < n; i++) {
            char c = buf[i];
            if (c >= '0' && c <= '9') {
                cur = (cur < 0 ? 0 : cur * 10) + (c - '0');
            } else if (cur >= 0) {
                if (fn(arg, (pid_t)cur) < 0) {
                    close(fd);
                    return -1;
                }
                cur = -1;
            }
        }
    }
    close(fd);
    if (cur >= 0 && fn(arg, (pid_t)cur) < 0)
        return -1;
    return 0;
}

/* Call fn for every child of every thread of pid. */
static int for_each_child_of(pid_t pid, int single_thread, int (*fn)(void *, pid_t), void *arg)
{
    char path[64];
    DIR *d;
    struct dirent *e;

    if (single_thread) {
        snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
        return for_each_child(path, fn, arg);
    }
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    d = opendir(path);
    if (!d)
        return -1;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        snprintf(path, sizeof path, "/proc/%d/task/%ld/children", (int)pid,
                 strtol(e->d_name, NULL, 10));
        if (for_each_child(path, fn, arg) < 0 && errno != ENOENT && errno != ESRCH) {
            closedir(d);
            return -1;
        }
    }
    closedir(d);
    return 0;
}

/* What the watchdog reads of /proc/PID/status. */
struct status {
    char state;
    unsigned long long threads, rss_anon_kb, rss_shmem_kb, swap_kb;
};

static void status_line(struct status *st, const char *line)
{
    static const struct {
        const char *key;
        size_t off;
    } keys[] = {
        {"Threads:", offsetof(struct status, threads)},
        {"RssAnon:", offsetof(struct status, rss_anon_kb)},
        {"RssShmem:", offsetof(struct status, rss_shmem_kb)},
        {"VmSwap:", offsetof(struct status, swap_kb)},
    };
    size_t i;

    if (strncmp(line, "State:", 6) == 0) {
        line += 6;
        st->state = line[strspn(line, " \t")];
        return;
    }
    for (i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        size_t len = strlen(keys[i].key);

        if (strncmp(line, keys[i].key, len) == 0) {
            *(unsigned long long *)((char *)st + keys[i].off) = strtoull(line + len, NULL, 10);
            return;
        }
    }
}

/* Read /proc/PID/status to its end, a line at a time: it has no size
 * bound (a process with 60000 supplementary groups has a 300 KB Groups:
 * line), and a read cut short would miss the fields after it.  Lines longer
 * than the buffer are none of ours and are skipped whole.  0, or -1 when
 * the process is gone. */
static int read_status(pid_t pid, struct status *st)
{
    char path[64], chunk[4096], line[128];
    size_t used = 0;
    int fd, overlong = 0;

    memset(st, 0, sizeof *st);
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    for (;;) {
        ssize_t n = read(fd, chunk, sizeof chunk), i;

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            close(fd);
            return -1;
        }
        if (n == 0)
            break;
        for (i = 0; i < n; i++) {
            if (chunk[i] != '\n') {
                if (used < sizeof line - 1)
                    line[used++] = chunk[i];
                else
                    overlong = 1;
                continue;
            }
            line[used] = '\0';
            if (!overlong)
                status_line(st, line);
            used = 0;
            overlong = 0;
        }
    }
    close(fd);
    if (used && !overlong) {
        line[used] = '\0';
        status_line(st, line);
    }
    return st->state ? 0 : -1;
}

/* ---- sampling ---------------------------------------------------------- */

struct sample_walk {
    struct pidvec v;
};

static int sample_push(void *arg, pid_t child)
{
    struct sample_walk *w = arg;

    if (vec_has(&w->v, child))
        return 0;
    return vec_push(&w->v, child, -1, 0);
}

/* Time every thread of pid has spent on a CPU, in ns: its process CPU
 * clock (clock_getcpuclockid's encoding, without glibc's extra
 * clock_getres): one system call, no /proc path to look up.  -1 once the
 * process is reaped, or where the clock cannot be read. */
static int read_ran(pid_t pid, uint64_t *ns)
{
    clockid_t clk = (clockid_t)((~(unsigned)pid << 3) | 2U); /* CPUCLOCK_SCHED */
    struct timespec ts;

    if (clock_gettime(clk, &ts) < 0)
        return -1;
    *ns = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
    return 0;
}

/* Add pid's CPU seconds to out: its own and those of the children it
 * reaped, as in a cgroup (an orphan's go to whoever reaps it: PID 1 of a
 * PID namespace is in the tree). */
static void add_cpu(pid_t pid, long ticks, char *buf, size_t size, struct sbx_tree_sample *out)
{
    char path[64];
    const char *rp;
    unsigned long long ut = 0, stt = 0, cut = 0, cst = 0;

    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (read_small(path, buf, size) <= 0 || (rp = strrchr(buf, ')')) == NULL)
        return;
    /* after ")": state(3) ppid pgrp session tty tpgid flags minflt cminflt
     * majflt cmajflt utime(14) stime(15) cutime cstime */
    if (sscanf(rp + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %llu %llu", &ut, &stt,
               &cut, &cst) == 4 &&
        ticks > 0) {
        out->cpu_user += (double)(ut + cut) / (double)ticks;
        out->cpu_system += (double)(stt + cst) / (double)ticks;
    }
}

static int walk(pid_t root, int skip_root, struct sbx_tree_cache *cache,
                struct sbx_tree_sample *out)
{
    static long ticks;
    struct sample_walk w;
    size_t i;
    char buf[4096];
    int cacheable = cache != NULL;

    if (!ticks)
        ticks = sysconf(_SC_CLK_TCK);
    memset(out, 0, sizeof *out);
    memset(&w, 0, sizeof w);
    if (cache)
        cache->n = 0;
    if (vec_push(&w.v, root, -1, 0) < 0)
        return -1;
    for (i = 0; i < w.v.n; i++) {
        pid_t pid = w.v.pid[i];
        struct status st;
        uint64_t ran = 0;

        /* Before anything else of it: whatever it does after this read
         * shows in the next one. */
        if (cacheable && read_ran(pid, &ran) < 0)
            cacheable = 0;
        if (read_status(pid, &st) < 0)
            continue; /* gone */
        if (st.state == 'Z' || st.state == 'X') {
            /* No memory and no children left, but its pid is held until it
             * is reaped, as a pids cgroup and RLIMIT_NPROC count it: a fork
             * loop that reaps late stays at the limit with zombies.  Its
             * reaping shows as its parent's running. */
            if (i > 0) {
                out->procs++;
                out->tasks++;
            }
            /* Its CPU time too, until its parent reaps it (then it is the
             * parent's): a child that burns CPU and is never reaped must
             * not take its seconds out of cpu_time's count. */
            add_cpu(pid, ticks, buf, sizeof buf, out);
            continue;
        }
        if (cacheable) {
            if (cache->n == SBX_TREE_CACHE_PROCS) {
                cacheable = 0;
            } else {
                cache->pid[cache->n] = pid;
                cache->ran_ns[cache->n] = ran;
                cache->n++;
            }
        }
        if (i == 0)
            out->root_alive = 1;
        if (i > 0 || !skip_root) {
            out->procs++;
            out->tasks += (uint32_t)(st.threads ? st.threads : 1);
            out->memory += 1024ULL * (st.rss_anon_kb + st.rss_shmem_kb + st.swap_kb);
        }

        add_cpu(pid, ticks, buf, sizeof buf, out);
        if (for_each_child_of(pid, st.threads <= 1, sample_push, &w) < 0 && errno == E2BIG)
            break;
    }
    vec_free(&w.v);
    if (cache) {
        if (!cacheable || !out->root_alive)
            cache->n = 0;
        cache->reused = 0;
        cache->last = *out;
    }
    return 0;
}

int sbx_tree_sample(pid_t root, int skip_root, struct sbx_tree_sample *out)
{
    return walk(root, skip_root, NULL, out);
}

int sbx_tree_sample_cached(pid_t root, int skip_root, struct sbx_tree_cache *cache,
                           struct sbx_tree_sample *out)
{
    uint32_t i;

    if (cache->n == 0 || cache->n > SBX_TREE_CACHE_PROCS || cache->reused >= SBX_TREE_CACHE_WALK ||
        cache->pid[0] != root)
        return walk(root, skip_root, cache, out);
    for (i = 0; i < cache->n; i++) {
        uint64_t ran;

        /* Gone, or ran (a new thread or child is made by running): walk. */
        if (read_ran(cache->pid[i], &ran) < 0 || ran != cache->ran_ns[i])
            return walk(root, skip_root, cache, out);
    }
    cache->reused++;
    *out = cache->last;
    return 1;
}

/* ---- signalling -------------------------------------------------------- */

static int pidfd_open_(pid_t pid)
{
    return (int)syscall(SYS_pidfd_open, pid, 0);
}

static int pidfd_signal(int fd, pid_t pid, int sig)
{
    if (fd >= 0)
        return (int)syscall(SYS_pidfd_send_signal, fd, sig, NULL, 0);
    return kill(pid, sig);
}

static pid_t ppid_of(pid_t pid)
{
    char path[64], buf[4096];
    const char *rp;
    int ppid;

    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (read_small(path, buf, sizeof buf) <= 0 || !(rp = strrchr(buf, ')')))
        return -1;
    if (sscanf(rp + 2, "%*c %d", &ppid) != 1)
        return -1;
    return (pid_t)ppid;
}

struct kill_walk {
    struct pidvec v;
    pid_t parent;
    int added;
};

/* A pid read from a children file may die and be reused before we act on
 * it; pin it with a pidfd, then check it is still the child we saw. */
static int kill_push(void *arg, pid_t child)
{
    struct kill_walk *w = arg;
    int fd;

    if (vec_has(&w->v, child))
        return 0;
    fd = pidfd_open_(child);
    if (fd < 0 && errno != ENOSYS)
        return 0; /* already gone */
    if (ppid_of(child) != w->parent) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    if (vec_push(&w->v, child, fd, 1) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    w->added++;
    return 0;
}

/* Walk from every known process and add the new children. */
static int kill_collect(struct kill_walk *w)
{
    size_t i;

    w->added = 0;
    for (i = 0; i < w->v.n; i++) {
        w->parent = w->v.pid[i];
        if (for_each_child_of(w->v.pid[i], 0, kill_push, w) < 0 && errno == E2BIG)
            return -1;
    }
    return w->added;
}

int sbx_tree_signal(pid_t root, int sig, pid_t pgid)
{
    struct kill_walk w;
    size_t i;
    int round, count = 0;

    memset(&w, 0, sizeof w);
    if (vec_push(&w.v, root, pidfd_open_(root), 1) < 0)
        return -1;
    kill_collect(&w);
    if (sig == SIGKILL) {
        /* Freeze what we know, then look again: a process forked between
         * the walk and the stop is found by the next walk. */
        for (round = 0; round < KILL_ROUNDS; round++) {
            for (i = 0; i < w.v.n; i++)
                pidfd_signal(w.v.fd[i], w.v.pid[i], SIGSTOP);
            if (pgid > 0)
                kill(-pgid, SIGSTOP);
            if (kill_collect(&w) <= 0)
                break;
        }
    }
    if (pgid > 0 && kill(-pgid, sig) == 0)
        count++;
    for (i = 0; i < w.v.n; i++)
        if (pidfd_signal(w.v.fd[i], w.v.pid[i], sig) == 0)
            count++;
    if (sig == SIGKILL && pgid > 0)
        kill(-pgid, SIGKILL);
    vec_free(&w.v);
    return count;
}
