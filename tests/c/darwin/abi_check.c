/* abi_check.c -- the libproc test double declares what macOS declares.
 *
 * Compiled (not run) twice by tests/test_darwin_c.py, warnings as errors:
 * with the host compiler against the fake headers beside this file, and
 * with zig for macOS against the SDK's.  A signature that differs makes an
 * incompatible pointer assignment; a layout that differs fails an assert.
 */
#include <stddef.h>
#include <stdint.h>

#include <libproc.h>
#include <mach/mach_time.h>
#include <sys/proc_info.h>
#include <sys/resource.h>

_Static_assert(PROC_PIDLISTFDS == 1, "PROC_PIDLISTFDS");
_Static_assert(PROC_PIDTASKINFO == 4, "PROC_PIDTASKINFO");
_Static_assert(PROC_PIDLISTFD_SIZE == 8, "PROC_PIDLISTFD_SIZE");
_Static_assert(PROC_PIDTASKINFO_SIZE == 96, "PROC_PIDTASKINFO_SIZE");
_Static_assert(RUSAGE_INFO_V0 == 0 && RUSAGE_INFO_V2 == 2 && RUSAGE_INFO_V6 == 6, "RUSAGE_INFO");
_Static_assert(RUSAGE_INFO_CURRENT == RUSAGE_INFO_V6, "RUSAGE_INFO_CURRENT");
_Static_assert(KERN_SUCCESS == 0, "KERN_SUCCESS");

_Static_assert(sizeof(struct proc_fdinfo) == 8, "proc_fdinfo");
_Static_assert(offsetof(struct proc_fdinfo, proc_fd) == 0, "proc_fd");
_Static_assert(sizeof(struct proc_taskinfo) == 96, "proc_taskinfo");
_Static_assert(offsetof(struct proc_taskinfo, pti_resident_size) == 8, "pti_resident_size");
_Static_assert(offsetof(struct proc_taskinfo, pti_total_user) == 16, "pti_total_user");
_Static_assert(offsetof(struct proc_taskinfo, pti_total_system) == 24, "pti_total_system");
_Static_assert(offsetof(struct proc_taskinfo, pti_threadnum) == 84, "pti_threadnum");

_Static_assert(sizeof(struct rusage_info_v0) == 96, "rusage_info_v0");
_Static_assert(sizeof(struct rusage_info_v1) == 144, "rusage_info_v1");
_Static_assert(sizeof(struct rusage_info_v2) == 160, "rusage_info_v2");
_Static_assert(sizeof(struct rusage_info_v3) == 232, "rusage_info_v3");
_Static_assert(sizeof(struct rusage_info_v4) == 296, "rusage_info_v4");
_Static_assert(sizeof(struct rusage_info_v5) == 304, "rusage_info_v5");
_Static_assert(sizeof(struct rusage_info_v6) == 464, "rusage_info_v6");
_Static_assert(sizeof(rusage_info_current) == sizeof(struct rusage_info_v6), "rusage_info_current");
_Static_assert(offsetof(struct rusage_info_v2, ri_user_time) == 16, "ri_user_time");
_Static_assert(offsetof(struct rusage_info_v2, ri_system_time) == 24, "ri_system_time");
_Static_assert(offsetof(struct rusage_info_v2, ri_phys_footprint) == 72, "ri_phys_footprint");
_Static_assert(offsetof(struct rusage_info_v2, ri_proc_exit_abstime) == 88, "ri_proc_exit_abstime");
_Static_assert(offsetof(struct rusage_info_v2, ri_child_user_time) == 96, "ri_child_user_time");
_Static_assert(offsetof(struct rusage_info_v2, ri_child_system_time) == 104,
               "ri_child_system_time");
_Static_assert(sizeof(mach_timebase_info_data_t) == 8, "mach_timebase_info");

int sbx_abi_check(void);

int sbx_abi_check(void)
{
    int (*listchildpids)(pid_t, void *, int) = proc_listchildpids;
    int (*pidinfo)(int, int, uint64_t, void *, int) = proc_pidinfo;
    int (*pid_rusage)(int, int, rusage_info_t *) = proc_pid_rusage;
    kern_return_t (*timebase)(mach_timebase_info_t) = mach_timebase_info;

    return listchildpids != NULL && pidinfo != NULL && pid_rusage != NULL && timebase != NULL;
}
