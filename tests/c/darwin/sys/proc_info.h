/* sys/proc_info.h -- test double of macOS's <sys/proc_info.h> (see
 * ../libproc.h): the structures and flavors sbxlimit uses, as the SDK
 * declares them. */
#ifndef SBX_FAKE_SYS_PROC_INFO_H
#define SBX_FAKE_SYS_PROC_INFO_H

#include <stdint.h>

struct proc_taskinfo {
    uint64_t pti_virtual_size;  /* bytes */
    uint64_t pti_resident_size; /* bytes */
    uint64_t pti_total_user;    /* Mach absolute time units */
    uint64_t pti_total_system;
    uint64_t pti_threads_user; /* existing threads only */
    uint64_t pti_threads_system;
    int32_t pti_policy;
    int32_t pti_faults;
    int32_t pti_pageins;
    int32_t pti_cow_faults;
    int32_t pti_messages_sent;
    int32_t pti_messages_received;
    int32_t pti_syscalls_mach;
    int32_t pti_syscalls_unix;
    int32_t pti_csw;
    int32_t pti_threadnum;
    int32_t pti_numrunning;
    int32_t pti_priority;
};

struct proc_fdinfo {
    int32_t proc_fd;
    uint32_t proc_fdtype;
};

#define PROX_FDTYPE_VNODE  1
#define PROX_FDTYPE_SOCKET 2
#define PROX_FDTYPE_PIPE   6

#define PROC_PIDLISTFDS       1
#define PROC_PIDLISTFD_SIZE   (sizeof(struct proc_fdinfo))
#define PROC_PIDTASKINFO      4
#define PROC_PIDTASKINFO_SIZE (sizeof(struct proc_taskinfo))

#endif /* SBX_FAKE_SYS_PROC_INFO_H */
