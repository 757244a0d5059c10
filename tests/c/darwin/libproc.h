/* libproc.h -- test double of macOS's <libproc.h>, for tests/c/darwin/.
 *
 * First on the include path, so that csrc/darwin/proctree.c and csrc/fds.c
 * compile unchanged on Linux against a model of libproc (fake_libproc.c).
 * Declarations are those of the macOS SDK (abi_check.c compiles against
 * both this and the real header); the model's behaviour follows XNU's
 * libsyscall/wrappers/libproc/libproc.c and bsd/kern/proc_info.c.
 * The real header includes <sys/resource.h>, which declares the
 * rusage_info structures: here they are declared in this file, since
 * the host's <sys/resource.h> cannot be replaced.
 */
#ifndef SBX_FAKE_LIBPROC_H
#define SBX_FAKE_LIBPROC_H

#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#include <sys/proc_info.h>

/* <sys/resource.h> of macOS: proc_pid_rusage's flavors. */
#define RUSAGE_INFO_V0      0
#define RUSAGE_INFO_V1      1
#define RUSAGE_INFO_V2      2
#define RUSAGE_INFO_V3      3
#define RUSAGE_INFO_V4      4
#define RUSAGE_INFO_V5      5
#define RUSAGE_INFO_V6      6
#define RUSAGE_INFO_CURRENT RUSAGE_INFO_V6

typedef void *rusage_info_t;

/* Each version extends the one before. */
#define SBX_FAKE_RI_V0                                                                             \
    uint8_t ri_uuid[16];                                                                           \
    uint64_t ri_user_time; /* Mach absolute time units, as the _abstime fields */                  \
    uint64_t ri_system_time;                                                                       \
    uint64_t ri_pkg_idle_wkups;                                                                    \
    uint64_t ri_interrupt_wkups;                                                                   \
    uint64_t ri_pageins;                                                                           \
    uint64_t ri_wired_size;                                                                        \
    uint64_t ri_resident_size;                                                                     \
    uint64_t ri_phys_footprint;                                                                    \
    uint64_t ri_proc_start_abstime;                                                                \
    uint64_t ri_proc_exit_abstime;
#define SBX_FAKE_RI_V1                                                                             \
    SBX_FAKE_RI_V0                                                                                 \
    uint64_t ri_child_user_time;                                                                   \
    uint64_t ri_child_system_time;                                                                 \
    uint64_t ri_child_pkg_idle_wkups;                                                              \
    uint64_t ri_child_interrupt_wkups;                                                             \
    uint64_t ri_child_pageins;                                                                     \
    uint64_t ri_child_elapsed_abstime;
#define SBX_FAKE_RI_V2                                                                             \
    SBX_FAKE_RI_V1                                                                                 \
    uint64_t ri_diskio_bytesread;                                                                  \
    uint64_t ri_diskio_byteswritten;
#define SBX_FAKE_RI_V3                                                                             \
    SBX_FAKE_RI_V2                                                                                 \
    uint64_t ri_cpu_time_qos_default;                                                              \
    uint64_t ri_cpu_time_qos_maintenance;                                                          \
    uint64_t ri_cpu_time_qos_background;                                                           \
    uint64_t ri_cpu_time_qos_utility;                                                              \
    uint64_t ri_cpu_time_qos_legacy;                                                               \
    uint64_t ri_cpu_time_qos_user_initiated;                                                       \
    uint64_t ri_cpu_time_qos_user_interactive;                                                     \
    uint64_t ri_billed_system_time;                                                                \
    uint64_t ri_serviced_system_time;
#define SBX_FAKE_RI_V4                                                                             \
    SBX_FAKE_RI_V3                                                                                 \
    uint64_t ri_logical_writes;                                                                    \
    uint64_t ri_lifetime_max_phys_footprint;                                                       \
    uint64_t ri_instructions;                                                                      \
    uint64_t ri_cycles;                                                                            \
    uint64_t ri_billed_energy;                                                                     \
    uint64_t ri_serviced_energy;                                                                   \
    uint64_t ri_interval_max_phys_footprint;                                                       \
    uint64_t ri_runnable_time;
#define SBX_FAKE_RI_V5                                                                             \
    SBX_FAKE_RI_V4                                                                                 \
    uint64_t ri_flags;
#define SBX_FAKE_RI_V6                                                                             \
    SBX_FAKE_RI_V5                                                                                 \
    uint64_t ri_user_ptime;                                                                        \
    uint64_t ri_system_ptime;                                                                      \
    uint64_t ri_pinstructions;                                                                     \
    uint64_t ri_pcycles;                                                                           \
    uint64_t ri_energy_nj;                                                                         \
    uint64_t ri_penergy_nj;                                                                        \
    uint64_t ri_secure_time_in_system;                                                             \
    uint64_t ri_secure_ptime_in_system;                                                            \
    uint64_t ri_neural_footprint;                                                                  \
    uint64_t ri_lifetime_max_neural_footprint;                                                     \
    uint64_t ri_interval_max_neural_footprint;                                                     \
    uint64_t ri_conclave_footprint;                                                                \
    uint64_t ri_page_wait_time_mach;                                                               \
    uint64_t ri_page_cache_hits;                                                                   \
    uint64_t ri_reserved[6];

struct rusage_info_v0 {
    SBX_FAKE_RI_V0
};
struct rusage_info_v1 {
    SBX_FAKE_RI_V1
};
struct rusage_info_v2 {
    SBX_FAKE_RI_V2
};
struct rusage_info_v3 {
    SBX_FAKE_RI_V3
};
struct rusage_info_v4 {
    SBX_FAKE_RI_V4
};
struct rusage_info_v5 {
    SBX_FAKE_RI_V5
};
struct rusage_info_v6 {
    SBX_FAKE_RI_V6
};
typedef struct rusage_info_v6 rusage_info_current;

/* The pids (ints) of ppid's children, zombies included, into buffer: returns
 * their NUMBER (libproc divides the kernel's byte count by sizeof(int)),
 * never more than buffersize / sizeof(int) -- a full buffer may mean more;
 * 0 when there are none or on error.  A NULL buffer gives the kernel's
 * estimate of ALL processes plus 20, not a count of children. */
int proc_listchildpids(pid_t ppid, void *buffer, int buffersize);

/* One flavor of information about pid into buffer: returns the bytes
 * written, 0 with errno on error (ESRCH: no such process, or a zombie
 * for PROC_PIDTASKINFO; ENOMEM: buffer too small for the flavor).
 * PROC_PIDLISTFDS writes struct proc_fdinfo entries, as many as fit; a
 * NULL buffer gives the size of the fd table plus 20 entries, in bytes. */
int proc_pidinfo(int pid, int flavor, uint64_t arg, void *buffer, int buffersize);

/* Resource usage of pid, a live process or a zombie, as struct
 * rusage_info_v<flavor>: returns 0, or -1 with errno (ESRCH, EINVAL for an
 * unknown flavor).  A zombie's record is the one kept at its exit, with
 * ri_phys_footprint 0 and ri_proc_exit_abstime set. */
int proc_pid_rusage(int pid, int flavor, rusage_info_t *buffer);

#endif /* SBX_FAKE_LIBPROC_H */
