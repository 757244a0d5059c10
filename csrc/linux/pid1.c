/* linux/pid1.c -- PID 1 of a sandbox's PID namespace, as a program of its own.
 *
 * The core's PID 1 is a vfork-style child: it shares the caller's memory
 * until it execs, which is what makes a sandbox with a PID namespace cheap
 * (a fork()ed PID 1 copies, and write-protects, every page the caller has).
 * Once it has started the target it execs this program to stay on as the
 * reaper:  _pid1 TARGET STATUS_FD
 * Signals are still blocked (execve keeps the mask and what is pending), so
 * none is lost between the target's start and the loop.
 *
 * Where setup.py can (x86-64 and aarch64, SBX_PID1_BARE), it is built
 * without libc: raw system calls and a _start of its own.  A libc's start-up
 * runs before main while the target already runs, and a short target's exit
 * waits for it: glibc's asks the CPU its cache sizes with about a hundred
 * CPUID instructions, each one trapped by a hypervisor (590 us from exec to
 * exit on the VM this was measured on, against 60 us without libc).
 * Elsewhere, libc and reaper.h, as the core's fork()ed PID 1 uses. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#if defined(SBX_PID1_BARE) && (defined(__x86_64__) || defined(__aarch64__))

/* The system calls' numbers (the kernel's ABI: they never change), spelled
 * out so that no header of a libc or of the kernel is needed. */
#if defined(__x86_64__)
#define B_NR_write           1
#define B_NR_close           3
#define B_NR_rt_sigprocmask  14
#define B_NR_wait4           61
#define B_NR_kill            62
#define B_NR_rt_sigtimedwait 128
#define B_NR_exit_group      231
#else /* aarch64, the generic table */
#define B_NR_close           57
#define B_NR_write           64
#define B_NR_exit_group      94
#define B_NR_kill            129
#define B_NR_rt_sigprocmask  135
#define B_NR_rt_sigtimedwait 137
#define B_NR_wait4           260
#endif
#define B_NR_close_range 436

/* And its constants, the same on both architectures. */
#define B_SIG_BLOCK 0
#define B_SIGCHLD   17
#define B_WNOHANG   1
#define B_EINTR     4

static long sys4(long n, long a, long b, long c, long d)
{
#if defined(__x86_64__)
    long r;
    register long r10 __asm__("r10") = d;

    __asm__ volatile("syscall"
                     : "=a"(r)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10)
                     : "rcx", "r11", "memory");
    return r;
#else
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;

    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3) : "memory");
    return x0;
#endif
}

static _Noreturn void bare_exit(int code)
{
    for (;;)
        (void)sys4(B_NR_exit_group, code, 0, 0, 0);
}

static long number(const char *s)
{
    long v = 0;

    if (*s == '\0')
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > 100000000)
            return -1;
        v = v * 10 + (*s - '0');
    }
    return v;
}

/* reaper.h's sbx_close_all_but, in system calls. */
static void close_all_but(long keep)
{
    long fd;

    if (keep > 0 && sys4(B_NR_close_range, 0, keep - 1, 0, 0) == 0 &&
        sys4(B_NR_close_range, keep + 1, 0xffffffffL, 0, 0) == 0)
        return;
    if (keep == 0 && sys4(B_NR_close_range, 1, 0xffffffffL, 0, 0) == 0)
        return;
    for (fd = 0; fd < 65536; fd++) /* older kernels */
        if (fd != keep)
            (void)sys4(B_NR_close, fd, 0, 0, 0);
}

/* reaper.h's sbx_reap: every signal to the target, every orphan reaped,
 * the target's status to the parent and its exit code as ours. */
static _Noreturn void reap(long target, long status_fd)
{
    unsigned long all = ~0UL; /* the kernel's sigset: 64 bits */

    (void)sys4(B_NR_rt_sigprocmask, B_SIG_BLOCK, (long)&all, 0, sizeof all);
    for (;;) {
        long sig = sys4(B_NR_rt_sigtimedwait, (long)&all, 0, 0, sizeof all);

        if (sig == -B_EINTR)
            continue;
        if (sig < 0)
            bare_exit(126);
        if (sig != B_SIGCHLD) {
            (void)sys4(B_NR_kill, target, sig, 0, 0);
            continue;
        }
        for (;;) {
            int st = 0;
            long r = sys4(B_NR_wait4, -1, (long)&st, B_WNOHANG, 0);

            if (r <= 0)
                break;
            if (r != target)
                continue;
            if (status_fd >= 0)
                (void)sys4(B_NR_write, status_fd, (long)&st, sizeof st, 0);
            bare_exit((st & 0x7f) == 0 ? (st >> 8) & 0xff : 128 + (st & 0x7f));
        }
    }
}

/* From _start: the stack holds argc, then argv. */
__attribute__((used)) _Noreturn void sbx_pid1_main(long *sp)
{
    long argc = sp[0], target, fd;
    char **argv = (char **)(sp + 1);

    if (argc != 3 || (target = number(argv[1])) <= 0 || (fd = number(argv[2])) < 0)
        bare_exit(127);
    close_all_but(fd);
    reap(target, fd);
}

#if defined(__x86_64__)
__asm__(".text\n"
        ".global _start\n"
        "_start:\n"
        "    xor %ebp, %ebp\n"
        "    mov %rsp, %rdi\n"
        "    and $-16, %rsp\n"
        "    call sbx_pid1_main\n"
        "    hlt\n");
#else
__asm__(".text\n"
        ".global _start\n"
        "_start:\n"
        "    mov x29, #0\n"
        "    mov x30, #0\n"
        "    mov x0, sp\n"
        "    bl sbx_pid1_main\n"
        "    b .\n");
#endif

#else /* with libc */

#include <signal.h>
#include <stdlib.h>

#include "reaper.h"

static long number(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);

    return (*s && !*end && v >= 0) ? v : -1;
}

int main(int argc, char **argv)
{
    sigset_t all;
    long target, fd;

    if (argc != 3 || (target = number(argv[1])) <= 0 || (fd = number(argv[2])) < 0)
        return 127;
    sbx_close_all_but((int)fd);
    sigfillset(&all);
    (void)sigprocmask(SIG_BLOCK, &all, NULL);
    sbx_reap((pid_t)target, (int)fd, &all);
}

#endif
