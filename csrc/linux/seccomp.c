/* linux/seccomp.c -- the hardening filter, built in the parent, loaded in the
 * child as its last step before execve.
 *
 * Refusals are errors (EPERM, or what a kernel without the feature says),
 * never kills: a program that probes for a feature must get an error it
 * can handle.  The filter is a deny list where a whole system call is
 * dangerous and an allow-list where the arguments decide:
 *
 *   refused       ptrace, process_vm_readv/writev, kcmp, pidfd_getfd,
 *                 kexec, bpf, perf_event_open, keys, userfaultfd,
 *                 io_uring, mounting (old and new API), pivot_root,
 *                 chroot, setns, modules, open_by_handle_at, reboot,
 *                 swap, clocks, syslog, acct, quotactl, host names
 *   namespaces    unshare() and clone() with any CLONE_NEW* flag; clone3
 *                 gets ENOSYS (its flags are in memory, out of the
 *                 filter's sight; libc falls back to clone)
 *   devices       mknod/mknodat of a character or block device
 *   ioctl         TIOCSTI and TIOCLINUX (typing into a terminal),
 *                 SIOCGSKNS (a socket's network namespace as an fd)
 *   prlimit64     changes only to the caller itself (pid 0)
 *   signals       kill(-1), and any signal or pidfd for the sandbox's
 *                 caller or its process group, or for the caller's
 *                 sentinel (a group of its own); where nothing else keeps
 *                 signals in (SBX_SECCOMP_SIGNALS), pidfd_send_signal
 *                 (ENOSYS): its fd may be a /proc/PID directory, whose
 *                 process the filter cannot see
 *   socket        AF_UNIX, AF_INET, AF_INET6 and NETLINK_ROUTE only
 *                 (EAFNOSUPPORT): no vsock (a way out of any network
 *                 namespace, to the hypervisor), packet, XDP, alg,
 *                 other netlink families; with a network rule, no
 *                 IPv4/IPv6 socket at all ("deny" without a namespace) or
 *                 TCP stream ones only ("proxy", whose ports Landlock holds)
 *
 * The architecture is checked first: a system call made through another
 * ABI (x86-64's int 0x80 / x32) has other numbers and is refused as a whole,
 * or the list could be bypassed.  Arguments are compared on their low 32
 * bits where the kernel reads an int (ioctl's cmd, a pid, a family): it
 * ignores the high bits, so must we.  Built for the architecture this file
 * is compiled for; elsewhere sbx_seccomp_build() returns -ENOSYS and the
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
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../sbx_internal.h"

#if defined(__x86_64__)
#define SBX_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define SBX_AUDIT_ARCH AUDIT_ARCH_AARCH64
#endif

#ifdef SBX_AUDIT_ARCH
/* Refused whatever the arguments; each only where this architecture has it. */
static const long denied[] = {
    SYS_ptrace,
    SYS_process_vm_readv,
    SYS_process_vm_writev,
    SYS_kcmp,
#ifdef SYS_pidfd_getfd
    SYS_pidfd_getfd,
#endif
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
    SYS_chroot,
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
    SYS_setns,
    SYS_open_by_handle_at,
    SYS_init_module,
    SYS_finit_module,
    SYS_delete_module,
    SYS_reboot,
    SYS_swapon,
    SYS_swapoff,
    SYS_syslog,
    SYS_acct,
    SYS_quotactl,
    SYS_settimeofday,
    SYS_clock_settime,
    SYS_clock_adjtime,
    SYS_adjtimex,
    SYS_sethostname,
    SYS_setdomainname,
    SYS_vhangup,
#ifdef SYS_iopl
    SYS_iopl,
    SYS_ioperm,
#endif
#ifdef SYS_lookup_dcookie
    SYS_lookup_dcookie,
#endif
};
#define N_DENIED (sizeof denied / sizeof denied[0])

/* Signals and pidfds: their first argument is a pid, never the caller's. */
static const long signalling[] = {
    SYS_tkill,      SYS_tgkill, SYS_rt_sigqueueinfo, SYS_rt_tgsigqueueinfo,
#ifdef SYS_pidfd_open
    SYS_pidfd_open,
#endif
};
#define N_SIGNALLING (sizeof signalling / sizeof signalling[0])

#define SBX_CLONE_NEW_ANY                                                                          \
    0x7E020000u /* NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET */
#define SBX_CLONE_NEWTIME 0x00000080u /* unshare/clone3 only: clone()'s low byte is a signal */
#define SBX_TIOCSTI       0x5412u
#define SBX_TIOCLINUX     0x541Cu
#define SBX_SIOCGSKNS     0x894Cu
#define SBX_AF_NETLINK    16
#define SBX_NETLINK_ROUTE 0
#endif

#define RET_ERRNO(e) (SECCOMP_RET_ERRNO | ((e)&SECCOMP_RET_DATA))

#ifdef SBX_AUDIT_ARCH
/* A tiny assembler: jumps name labels, resolved to BPF's forward offsets
 * when the program is complete.  The returns sit at the end, so every jump
 * is forward. */
enum {
    L_NONE = -1,
    L_UNSHARE,
    L_CLONE,
    L_MKNOD,
    L_MKNODAT,
    L_DEV_MODE,
    L_IOCTL,
    L_PRLIMIT,
    L_KILL,
    L_SIGNAL,
    L_SOCKET,
    L_NETLINK,
    L_INET,
    L_ALLOW,
    L_EPERM,
    L_ENOSYS,
    L_EAFNOSUPPORT,
    L_EPROTONOSUPPORT,
    L__COUNT
};

struct prog {
    struct sock_filter *out;
    size_t n, cap;
    /* labels, L_NONE: fall through; L__COUNT + i: instruction i */
    int jt[SBX_SECCOMP_MAX], jf[SBX_SECCOMP_MAX];
    size_t at[L__COUNT];
    int placed[L__COUNT];
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
    p->placed[l] = 1;
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

            size_t to;

            if (l == L_NONE)
                continue;
            if (l >= L__COUNT) {
                to = (size_t)(l - L__COUNT);
            } else if (p->placed[l]) {
                to = p->at[l];
            } else {
                return -EINVAL;
            }
            /* Forward only, within BPF's 8-bit offsets, to a label that
             * exists: a builder bug otherwise, refused here rather than by
             * the kernel. */
            if (to <= i || (off = to - i - 1) > 255)
                return -EINVAL;
            if (p->out[i].code == (BPF_JMP | BPF_JA))
                p->out[i].k = (unsigned)off;
            else if (side)
                p->out[i].jf = (unsigned char)off;
            else
                p->out[i].jt = (unsigned char)off;
        }
    }
    return 0;
}

#define ARG_LO(i)  ((unsigned)offsetof(struct seccomp_data, args[i])) /* little-endian */
#define ARG_HI(i)  (ARG_LO(i) + 4)
#define LD(p, off) emit((p), BPF_LD | BPF_W | BPF_ABS, (off), L_NONE, L_NONE)
/* if (A == k) goto jt else goto jf (L_NONE: the next instruction) */
#define JEQ(p, k, jt, jf)  emit((p), BPF_JMP | BPF_JEQ | BPF_K, (unsigned)(k), (jt), (jf))
#define JSET(p, k, jt, jf) emit((p), BPF_JMP | BPF_JSET | BPF_K, (unsigned)(k), (jt), (jf))
#define RET(p, v)          emit((p), BPF_RET | BPF_K, (v), L_NONE, L_NONE)
#define JA(p, l)           emit((p), BPF_JMP | BPF_JA, 0, (l), L_NONE) /* goto l */
#endif

#ifdef SBX_AUDIT_ARCH
/* A system call the filter decides on: where its number goes. */
struct route {
    unsigned nr;
    int label;
};
#define MAX_ROUTES 96

static void route(struct route *r, size_t *n, long nr, int label)
{
    if (*n < MAX_ROUTES)
        r[*n] = (struct route){(unsigned)nr, label};
    ++*n;
}

/* Send the number in A to its route's label, every other to L_ALLOW, by
 * binary search over the sorted routes.  The kernel emulates the filter for
 * every system call number when it is loaded (the cache of calls always
 * allowed, Linux 5.11+): a chain of comparisons costs that emulation its
 * length for each number, some 2.7 us per comparison on each load here
 * (280 us for this filter as a chain, 35 us as a tree), and every call
 * the program makes walks it too. */
static void dispatch(struct prog *p, const struct route *r, size_t n)
{
    size_t i, mid, at;

    if (n <= 3) {
        for (i = 0; i < n; i++)
            JEQ(p, r[i].nr, r[i].label, i + 1 == n ? L_ALLOW : L_NONE);
        if (n == 0)
            JA(p, L_ALLOW);
        return;
    }
    mid = n / 2;
    at = p->n;
    /* if (A >= r[mid].nr) the upper half, patched below; else the lower */
    emit(p, BPF_JMP | BPF_JGE | BPF_K, r[mid].nr, L_NONE, L_NONE);
    dispatch(p, r, mid);
    if (at < SBX_SECCOMP_MAX)
        p->jt[at] = L__COUNT + (int)p->n;
    dispatch(p, r + mid, n - mid);
}
#endif

int sbx_seccomp_build(void *buf, size_t cap, size_t *n_out, int what, int caller, int caller_pgid,
                      int guard)
{
#ifdef SBX_AUDIT_ARCH
    struct prog p;
    struct route routes[MAX_ROUTES];
    size_t i, j, n_routes = 0;
    int harden = what & SBX_SECCOMP_HARDEN;
    int inet = what & (SBX_SECCOMP_NET_DENY | SBX_SECCOMP_NET_PROXY);

    if (!(what & (SBX_SECCOMP_HARDEN | SBX_SECCOMP_NET_DENY | SBX_SECCOMP_NET_PROXY |
                  SBX_SECCOMP_FAMILIES)))
        return -EINVAL;
    memset(&p, 0, sizeof p);
    p.out = buf;
    p.cap = cap;
    LD(&p, offsetof(struct seccomp_data, arch));
    /* Another ABI: refuse every call. */
    JEQ(&p, SBX_AUDIT_ARCH, L_NONE, L_EPERM);
    LD(&p, offsetof(struct seccomp_data, nr));
#if defined(__x86_64__)
    /* x32 calls carry bit 30 on x86-64's arch value: refuse them all. */
    emit(&p, BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, L_EPERM, L_NONE);
#endif
    route(routes, &n_routes, SYS_socket, L_SOCKET);
    if (harden) {
        for (i = 0; i < N_DENIED; i++)
            route(routes, &n_routes, denied[i], L_EPERM);
        route(routes, &n_routes, SYS_clone3, L_ENOSYS);
        route(routes, &n_routes, SYS_unshare, L_UNSHARE);
        route(routes, &n_routes, SYS_clone, L_CLONE);
#ifdef SYS_mknod
        route(routes, &n_routes, SYS_mknod, L_MKNOD);
#endif
        route(routes, &n_routes, SYS_mknodat, L_MKNODAT);
        route(routes, &n_routes, SYS_ioctl, L_IOCTL);
        route(routes, &n_routes, SYS_prlimit64, L_PRLIMIT);
        route(routes, &n_routes, SYS_kill, L_KILL);
        for (i = 0; i < N_SIGNALLING; i++)
            route(routes, &n_routes, signalling[i], L_SIGNAL);
    }
#ifdef SYS_pidfd_send_signal
    if (what & SBX_SECCOMP_SIGNALS)
        route(routes, &n_routes, SYS_pidfd_send_signal, L_ENOSYS);
#endif
#ifdef SYS_io_uring_setup
    /* io_uring makes sockets without socket(2): refused with any net rule. */
    if (inet && !harden)
        route(routes, &n_routes, SYS_io_uring_setup, L_EPERM);
#endif
    if (n_routes > MAX_ROUTES)
        return -ENOSPC;
    /* Sorted by number (insertion sort: some 70 entries, in the parent);
     * a number listed twice would be a builder bug. */
    for (i = 1; i < n_routes; i++) {
        struct route r = routes[i];

        for (j = i; j > 0 && routes[j - 1].nr > r.nr; j--)
            routes[j] = routes[j - 1];
        routes[j] = r;
    }
    for (i = 1; i < n_routes; i++)
        if (routes[i - 1].nr == routes[i].nr)
            return -EINVAL;
    dispatch(&p, routes, n_routes); /* everything not routed: allowed */

    if (harden) {
        /* No namespace, by flag; CLONE_FILES, CLONE_FS and the like are fine. */
        label(&p, L_UNSHARE);
        LD(&p, ARG_LO(0));
        JSET(&p, SBX_CLONE_NEW_ANY | SBX_CLONE_NEWTIME, L_EPERM, L_ALLOW);
        label(&p, L_CLONE);
        LD(&p, ARG_LO(0));
        JSET(&p, SBX_CLONE_NEW_ANY, L_EPERM, L_ALLOW);
        /* No device node: mknod(path, mode, dev), mknodat(dir, path, mode, dev). */
        label(&p, L_MKNOD);
        LD(&p, ARG_LO(1));
        JA(&p, L_DEV_MODE);
        label(&p, L_MKNODAT);
        LD(&p, ARG_LO(2));
        label(&p, L_DEV_MODE);
        emit(&p, BPF_ALU | BPF_AND | BPF_K, S_IFMT, L_NONE, L_NONE);
        JEQ(&p, S_IFCHR, L_EPERM, L_NONE);
        JEQ(&p, S_IFBLK, L_EPERM, L_ALLOW);
        /* ioctl(fd, cmd, ...): cmd is an unsigned int to the kernel. */
        label(&p, L_IOCTL);
        LD(&p, ARG_LO(1));
        JEQ(&p, SBX_TIOCSTI, L_EPERM, L_NONE);
        JEQ(&p, SBX_TIOCLINUX, L_EPERM, L_NONE);
        JEQ(&p, SBX_SIOCGSKNS, L_EPERM, L_ALLOW);
        /* prlimit64(pid, resource, new, old): reading is fine; changing
         * only our own (pid 0, what setrlimit passes). */
        label(&p, L_PRLIMIT);
        LD(&p, ARG_LO(0));
        JEQ(&p, 0, L_ALLOW, L_NONE);
        LD(&p, ARG_LO(2));
        JEQ(&p, 0, L_NONE, L_EPERM);
        LD(&p, ARG_HI(2));
        JEQ(&p, 0, L_ALLOW, L_EPERM);
        /* kill(pid, sig): not everyone (-1), not the caller or its group,
         * not the guarded process's group.  (A pid of 0 is the sandbox's own
         * group: never a guard.) */
        label(&p, L_KILL);
        LD(&p, ARG_LO(0));
        JEQ(&p, 0xffffffffu, L_EPERM, L_NONE);
        JEQ(&p, (unsigned)-caller_pgid, L_EPERM, L_NONE);
        if (guard > 0)
            JEQ(&p, (unsigned)-guard, L_EPERM, L_NONE);
        label(&p, L_SIGNAL);
        LD(&p, ARG_LO(0));
        if (guard > 0)
            JEQ(&p, (unsigned)guard, L_EPERM, L_NONE);
        JEQ(&p, (unsigned)caller, L_EPERM, L_ALLOW);
    }

    /* socket(domain, type, protocol): integers, so seccomp can look. */
    label(&p, L_SOCKET);
    LD(&p, ARG_LO(0));
    JEQ(&p, AF_UNIX, L_ALLOW, L_NONE);
    JEQ(&p, AF_INET, L_INET, L_NONE);
    JEQ(&p, AF_INET6, L_INET, L_NONE);
    JEQ(&p, SBX_AF_NETLINK, L_NETLINK, L_EAFNOSUPPORT);
    label(&p, L_NETLINK);
    LD(&p, ARG_LO(2));
    JEQ(&p, SBX_NETLINK_ROUTE, L_ALLOW, L_EPROTONOSUPPORT);
    label(&p, L_INET);
    if (what & SBX_SECCOMP_NET_DENY) {
        JA(&p, L_EPERM);
    } else if (what & SBX_SECCOMP_NET_PROXY) {
        /* Landlock's port rules hold TCP only, so nothing else may be
         * made: no UDP, raw, SCTP or MPTCP socket. */
        LD(&p, ARG_LO(1));
        emit(&p, BPF_ALU | BPF_AND | BPF_K, 0xf, L_NONE, L_NONE); /* minus NONBLOCK|CLOEXEC */
        JEQ(&p, SOCK_STREAM, L_NONE, L_EPERM);
        LD(&p, ARG_LO(2));
        JEQ(&p, 0, L_ALLOW, L_NONE);
        JEQ(&p, IPPROTO_TCP, L_ALLOW, L_EPERM);
    }

    label(&p, L_ALLOW);
    RET(&p, SECCOMP_RET_ALLOW);
    label(&p, L_EPERM);
    RET(&p, RET_ERRNO(EPERM));
    label(&p, L_ENOSYS);
    RET(&p, RET_ERRNO(ENOSYS));
    label(&p, L_EAFNOSUPPORT);
    RET(&p, RET_ERRNO(EAFNOSUPPORT));
    label(&p, L_EPROTONOSUPPORT);
    RET(&p, RET_ERRNO(EPROTONOSUPPORT));
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
    (void)caller;
    (void)caller_pgid;
    (void)guard;
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
