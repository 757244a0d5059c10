/* linux/clone3.c -- clone3() with CLONE_VM, for the spawn fast path.
 *
 * glibc has no public clone3() wrapper, and a CLONE_VM child cannot simply
 * return from a raw syscall() into C code: it runs on a fresh stack that the
 * compiler's frame does not know about.  The trampoline below makes the
 * system call and, in the child, calls fn(arg) on the new stack and exits
 * with its result, the same thing glibc's clone() does for clone(2).
 *
 * clone3 is worth it for two flags: CLONE_CLEAR_SIGHAND (the kernel resets
 * every handler, so the child skips 64 sigaction calls) and
 * CLONE_INTO_CGROUP (the child is born inside its cgroup: no window in which
 * it runs outside, and no cgroup.procs write).  Only x86-64 has a
 * trampoline so far; elsewhere the caller falls back to clone().
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stddef.h>

#include "../sbx_internal.h"

#if defined(__x86_64__)
/* rdi = args, rsi = size (the syscall's own arguments), rdx = fn, rcx = arg.
 * syscall preserves r8/r9, and the child starts with the parent's registers,
 * so fn and arg reach the child there.  The kernel points the child's rsp at
 * stack + stack_size (16-byte aligned): `call` leaves it as the ABI wants. */
__asm__(".text\n"
        ".globl sbx_clone3_raw\n"
        ".hidden sbx_clone3_raw\n"
        ".type sbx_clone3_raw,@function\n"
        "sbx_clone3_raw:\n"
        "    mov %rdx, %r8\n"
        "    mov %rcx, %r9\n"
        "    mov $435, %eax\n" /* __NR_clone3 */
        "    syscall\n"
        "    test %rax, %rax\n"
        "    jnz 1f\n"
        "    xor %ebp, %ebp\n" /* outermost frame for unwinders */
        "    mov %r9, %rdi\n"
        "    call *%r8\n"
        "    mov %eax, %edi\n"
        "    mov $60, %eax\n" /* __NR_exit */
        "    syscall\n"
        "    hlt\n"
        "1:  ret\n"
        ".size sbx_clone3_raw, .-sbx_clone3_raw\n");

long sbx_clone3_raw(struct sbx_clone_args *args, size_t size, int (*fn)(void *), void *arg);

long sbx_clone3_run(struct sbx_clone_args *args, int (*fn)(void *), void *arg)
{
    return sbx_clone3_raw(args, sizeof(struct sbx_clone_args), fn, arg);
}
#else
long sbx_clone3_run(struct sbx_clone_args *args, int (*fn)(void *), void *arg)
{
    (void)args;
    (void)fn;
    (void)arg;
    return -ENOSYS;
}
#endif
