/* linux/caps.c -- a sandbox runs without capabilities (SPEC 3, security model).
 *
 * A root program keeps every capability across execve unless it is told
 * otherwise: with them it could enter the caller's network namespace
 * (setns), make device nodes, trace or re-limit other processes, type into
 * a terminal.  The child drops them after its credential change (setuid
 * would otherwise re-grant nothing, but root's execve re-grants the
 * bounding set) and before no_new_privs:
 *
 *   securebits  uid 0 gets no capability from execve, and set*uid never
 *               "fixes" them up (SECBIT_NOROOT, SECBIT_NO_SETUID_FIXUP,
 *               locked so the program cannot undo them);
 *   bounding    every capability but the kept ones leaves the bounding set,
 *               so nothing can ever be regained (file capabilities);
 *   capset      effective, permitted and inheritable become the kept set;
 *   ambient     cleared, then each kept capability raised: the one way a
 *               capability survives execve once uid 0 is no longer special.
 *
 * securebits and the bounding set need CAP_SETPCAP (SBX_CAPS_BOUNDING): a
 * caller without it (an ordinary user, some containers' root) still drops
 * what it holds with capset, and no_new_privs keeps execve from granting
 * any capability beyond those (the kernel caps the new permitted set by the
 * old one for a no_new_privs task).
 *
 * Child side only; raw system calls, no libcap.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../sbx_internal.h"

/* linux/capability.h and linux/securebits.h, spelled out so that the build
 * does not depend on the installed headers. */
struct sbx_cap_header {
    uint32_t version;
    int pid;
};
struct sbx_cap_data {
    uint32_t effective, permitted, inheritable;
};
#define SBX_CAP_VERSION_3 0x20080522

#define SBX_SECBIT_NOROOT                 (1 << 0)
#define SBX_SECBIT_NOROOT_LOCKED          (1 << 1)
#define SBX_SECBIT_NO_SETUID_FIXUP        (1 << 2)
#define SBX_SECBIT_NO_SETUID_FIXUP_LOCKED (1 << 3)
#define SBX_SECBIT_KEEP_CAPS_LOCKED       (1 << 5)

#ifndef PR_CAP_AMBIENT
#define PR_CAP_AMBIENT 47
#endif
#ifndef PR_CAP_AMBIENT_RAISE
#define PR_CAP_AMBIENT_RAISE 2
#endif
#ifndef PR_CAP_AMBIENT_CLEAR_ALL
#define PR_CAP_AMBIENT_CLEAR_ALL 4
#endif
#ifndef PR_SET_SECUREBITS
#define PR_SET_SECUREBITS 28
#endif
#ifndef PR_CAPBSET_DROP
#define PR_CAPBSET_DROP 24
#endif

/* Child side: drop every capability but s->caps_keep.  0, or -1 with
 * errno. */
int sbx_caps_drop_child(const struct sbx_spec *s)
{
    struct sbx_cap_header hdr = {SBX_CAP_VERSION_3, 0};
    struct sbx_cap_data data[2] = {{0, 0, 0}, {0, 0, 0}};
    uint64_t keep = s->caps_keep;
    int cap;

    if (s->drop_caps & SBX_CAPS_BOUNDING) {
        if (prctl(PR_SET_SECUREBITS,
                  SBX_SECBIT_NOROOT | SBX_SECBIT_NOROOT_LOCKED | SBX_SECBIT_NO_SETUID_FIXUP |
                      SBX_SECBIT_NO_SETUID_FIXUP_LOCKED | SBX_SECBIT_KEEP_CAPS_LOCKED,
                  0, 0, 0) < 0)
            return -1;
        /* Up to the kernel's last capability: EINVAL past it. */
        for (cap = 0; cap < 64; cap++) {
            if (keep & (1ULL << cap))
                continue;
            if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0) {
                if (errno == EINVAL)
                    break;
                return -1;
            }
        }
    }
    /* What we do not hold cannot be kept: capset would refuse it. */
    if (syscall(SYS_capget, &hdr, data) < 0)
        return -1;
    keep &= ((uint64_t)data[1].permitted << 32) | data[0].permitted;
    data[0].effective = data[0].permitted = data[0].inheritable = (uint32_t)keep;
    data[1].effective = data[1].permitted = data[1].inheritable = (uint32_t)(keep >> 32);
    hdr.version = SBX_CAP_VERSION_3;
    hdr.pid = 0;
    if (syscall(SYS_capset, &hdr, data) < 0)
        return -1;
    /* EINVAL: a kernel before 4.3 has no ambient set (nothing to clear). */
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0)
        return errno == EINVAL && keep == 0 ? 0 : -1;
    for (cap = 0; cap < 64; cap++)
        if ((keep & (1ULL << cap)) && prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0) < 0)
            return -1;
    return 0;
}
