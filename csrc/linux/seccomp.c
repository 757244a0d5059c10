/* seccomp.c -- the hardening filter, built in the parent, loaded in the
 * child as its last step before execve.
 *
 * The filter refuses, with EPERM (never a kill: a program that probes for a
 * feature must get an error it can handle), the system calls an untrusted
 * program has no business making and that widen the kernel's attack
 * surface or reach other processes: ptrace and process_vm_readv/writev,
 * kexec, bpf, perf_event_open, the key-management calls, userfaultfd,
 * io_uring, mounting (old and new API), module loading and
 * open_by_handle_at.  Everything else is allowed.  With a network rule
 * it also looks at socket(2)'s arguments: no IPv4/IPv6 or packet sockets
 * (network="deny" without a namespace), or only TCP stream ones (network
 * "proxy", whose ports Landlock holds).
 *
 * The architecture is checked first: a system call made through another
 * ABI (x86-64's int 0x80 / x32) has other numbers and is refused as a whole,
 * or the list could be bypassed.  Built for the architecture this file is
 * compiled for; elsewhere sbx_seccomp_build() returns -ENOSYS and the
 * Python layer reports the protection as not available.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../sbx_internal.h"

#if defined(__x86_64__)
#define SBX_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define SBX_AUDIT_ARCH AUDIT_ARCH_AARCH64
#endif

#ifdef SBX_AUDIT_ARCH
/* The refused calls; each only where this architecture has it. */
static const long denied[] = {
    SYS_ptrace,
    SYS_process_vm_readv,
    SYS_process_vm_writev,
    SYS_kexec_load,
#ifdef SYS_kexec_file_load
    SYS_kexec_file_load,
#endif
    SYS_bpf,
    SYS_perf_event_open,
    SYS_keyctl,
    SYS_add_key,
    SYS_request_key,
    SYS_userfaultfd,
#ifdef SYS_io_uring_setup
    SYS_io_uring_setup,
    SYS_io_uring_enter,
    SYS_io_uring_register,
#endif
    SYS_mount,
    SYS_umount2,
    SYS_pivot_root,
#ifdef SYS_fsopen
    SYS_fsopen,
    SYS_fsconfig,
    SYS_fsmount,
    SYS_move_mount,
    SYS_open_tree,
    SYS_fspick,
#endif
#ifdef SYS_mount_setattr
    SYS_mount_setattr,
#endif
    SYS_open_by_handle_at,
    SYS_init_module,
    SYS_finit_module,
    SYS_delete_module,
};
#define N_DENIED (sizeof denied / sizeof denied[0])
#endif

#define RET_ERRNO(e) (SECCOMP_RET_ERRNO | ((e)&SECCOMP_RET_DATA))

#ifdef SBX_AUDIT_ARCH
/* A tiny assembler: jumps name labels, resolved to BPF's forward offsets
 * when the program is complete. */
enum { L_NONE = -1, L_ALLOW, L_EPERM, L_SOCKET, L_INET, L_SOCK_EPERM, L_SOCK_ALLOW, L__COUNT };

struct prog {
    struct sock_filter *out;
    size_t n, cap;
    int jt[SBX_SECCOMP_MAX], jf[SBX_SECCOMP_MAX]; /* labels, L_NONE: fall through */
    size_t at[L__COUNT];
};

static void emit(struct prog *p, unsigned short code, unsigned k, int jt, int jf)
{
    if (p->n < p->cap && p->n < SBX_SECCOMP_MAX) {
        p->out[p->n] = (struct sock_filter)BPF_STMT(code, k);
        p->jt[p->n] = jt;
        p->jf[p->n] = jf;
    }
    p->n++;
}

static void label(struct prog *p, int l)
{
    p->at[l] = p->n;
}

static int resolve(struct prog *p)
{
    size_t i;

    if (p->n > p->cap || p->n > SBX_SECCOMP_MAX)
        return -ENOSPC;
    for (i = 0; i < p->n; i++) {
        int side;

        for (side = 0; side < 2; side++) {
            int l = side ? p->jf[i] : p->jt[i];
            size_t off;

            if (l == L_NONE)
                continue;
            /* Forward only, within BPF's 8-bit offsets: a builder bug
             * otherwise, refused here rather than by the kernel. */
            if (p->at[l] <= i || (off = p->at[l] - i - 1) > 255)
                return -EINVAL;
            if (side)
                p->out[i].jf = (unsigned char)off;
            else
                p->out[i].jt = (unsigned char)off;
        }
    }
    return 0;
}

#define ARG_LO(i)         ((unsigned)offsetof(struct seccomp_data, args[i])) /* little-endian */
#define JEQ(p, k, target) emit((p), BPF_JMP | BPF_JEQ | BPF_K, (unsigned)(k), (target), L_NONE)
#endif

int sbx_seccomp_build(void *buf, size_t cap, size_t *n_out, int what)
{
#ifdef SBX_AUDIT_ARCH
    struct prog p;
    size_t i;
    int net = what & (SBX_SECCOMP_NET_DENY | SBX_SECCOMP_NET_PROXY);

    if (!(what & (SBX_SECCOMP_HARDEN | SBX_SECCOMP_NET_DENY | SBX_SECCOMP_NET_PROXY)))
        return -EINVAL;
    memset(&p, 0, sizeof p);
    p.out = buf;
    p.cap = cap;
    emit(&p, BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch), L_NONE, L_NONE);
    /* Another ABI: refuse every call. */
    emit(&p, BPF_JMP | BPF_JEQ | BPF_K, SBX_AUDIT_ARCH, L_NONE, L_EPERM);
    emit(&p, BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr), L_NONE, L_NONE);
#if defined(__x86_64__)
    /* x32 calls carry bit 30 on x86-64's arch value: refuse them all. */
    emit(&p, BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, L_EPERM, L_NONE);
#endif
    if (what & SBX_SECCOMP_HARDEN)
        for (i = 0; i < N_DENIED; i++)
            JEQ(&p, denied[i], L_EPERM);
#ifdef SYS_io_uring_setup
    /* io_uring makes sockets without socket(2): refused with any net rule. */
    if (net && !(what & SBX_SECCOMP_HARDEN))
        JEQ(&p, SYS_io_uring_setup, L_EPERM);
#endif
    if (net)
        JEQ(&p, SYS_socket, L_SOCKET);
    label(&p, L_ALLOW);
    emit(&p, BPF_RET | BPF_K, SECCOMP_RET_ALLOW, L_NONE, L_NONE);
    label(&p, L_EPERM);
    emit(&p, BPF_RET | BPF_K, RET_ERRNO(EPERM), L_NONE, L_NONE);
    if (net) {
        /* socket(domain, type, protocol): integers, so seccomp can look.
         * BPF jumps only forward: this block has its own refusal. */
        label(&p, L_SOCKET);
        emit(&p, BPF_LD | BPF_W | BPF_ABS, ARG_LO(0), L_NONE, L_NONE);
        JEQ(&p, AF_PACKET, L_SOCK_EPERM);
        JEQ(&p, AF_INET, L_INET);
        JEQ(&p, AF_INET6, L_INET);
        emit(&p, BPF_RET | BPF_K, SECCOMP_RET_ALLOW, L_NONE, L_NONE);
        label(&p, L_INET);
        if (what & SBX_SECCOMP_NET_PROXY) {
            /* Landlock's port rules hold TCP only, so nothing else may be
             * made: no UDP, raw, SCTP or MPTCP socket. */
            emit(&p, BPF_LD | BPF_W | BPF_ABS, ARG_LO(1), L_NONE, L_NONE);
            emit(&p, BPF_ALU | BPF_AND | BPF_K, 0xf, L_NONE, L_NONE); /* minus NONBLOCK|CLOEXEC */
            emit(&p, BPF_JMP | BPF_JEQ | BPF_K, SOCK_STREAM, L_NONE, L_SOCK_EPERM);
            emit(&p, BPF_LD | BPF_W | BPF_ABS, ARG_LO(2), L_NONE, L_NONE);
            JEQ(&p, 0, L_SOCK_ALLOW);
            JEQ(&p, IPPROTO_TCP, L_SOCK_ALLOW);
        }
        label(&p, L_SOCK_EPERM);
        emit(&p, BPF_RET | BPF_K, RET_ERRNO(EPERM), L_NONE, L_NONE);
        if (what & SBX_SECCOMP_NET_PROXY) {
            label(&p, L_SOCK_ALLOW);
            emit(&p, BPF_RET | BPF_K, SECCOMP_RET_ALLOW, L_NONE, L_NONE);
        }
    }
    {
        int rc = resolve(&p);
        if (rc < 0)
            return rc;
    }
    *n_out = p.n;
    return 0;
#else
    (void)buf;
    (void)cap;
    (void)n_out;
    (void)what;
    return -ENOSYS;
#endif
}

/* Child side: load the spec's filter (no_new_privs was set before). */
int sbx_seccomp_load_child(const struct sbx_spec *s)
{
    struct sock_fprog prog;

    prog.len = (unsigned short)s->n_seccomp;
    prog.filter = (struct sock_filter *)s->seccomp;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0);
}
