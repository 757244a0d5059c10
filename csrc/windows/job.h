/* windows/job.h -- limits through a Job Object, and a program born inside it.
 *
 * Plain C11 against the Win32 API (no Python.h): the binding calls these.
 * The parent makes a job with every limit set (sbx_job_create), creates the
 * program inside it with no moment outside it (sbx_job_spawn), learns which
 * limit was hit from the job's completion port (sbx_job_next_event,
 * sbx_job_reason), reads the job's usage (sbx_job_usage), and kills the
 * whole tree with one call (sbx_job_kill).  Closing the job kills whatever is
 * left in it (KILL_ON_JOB_CLOSE), so a caller that dies leaks no process.
 *
 * Every failure fills a struct sbx_win_error: the step (a stable name such
 * as "job:limits" or "spawn:assign") and GetLastError() at the failing call,
 * as the POSIX core reports a step and errno.
 */
#ifndef SBX_WINDOWS_JOB_H
#define SBX_WINDOWS_JOB_H

#include <stddef.h>
#include <stdint.h>

#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>

/* The call that failed ("job:limits") and GetLastError() there. */
struct sbx_win_error {
    const char *step;
    uint32_t code;
};

/* The limits of one job; 0 means none for every field. */
struct sbx_job_limits {
    uint64_t memory;         /* bytes committed by all the job's processes (JobMemoryLimit) */
    uint32_t pids;           /* processes alive at once (ActiveProcessLimit) */
    uint64_t cpu_time_100ns; /* user time of the whole job, 100 ns units (PerJobUserTimeLimit) */
    uint32_t cpu_millicores; /* a hard cap on CPU rate (JOBOBJECT_CPU_RATE_CONTROL_INFORMATION) */
};

/* A job and the completion port it posts its messages to. */
struct sbx_job {
    HANDLE job;
    HANDLE port;
    struct sbx_job_limits limits; /* as asked */
    /* The CPU rate cap is applied on its own, and its refusal does not fail
     * sbx_job_create (a system without it still holds every other limit):
     * 0 not asked, 1 applied, -1 refused (cpu_rate_error says how). */
    int cpu_rate;
    uint32_t cpu_rate_value; /* CpuRate: 1/100 of a percent of all processors */
    struct sbx_win_error cpu_rate_error;
};

/* Make a job with `limits`: JOBOBJECT_EXTENDED_LIMIT_INFORMATION with
 * KILL_ON_JOB_CLOSE and DIE_ON_UNHANDLED_EXCEPTION, no breakaway, the
 * asked limits; a completion port associated (key: the job handle); then
 * the CPU rate cap when asked (see struct sbx_job).  Returns 0, or -1 with
 * *err filled and nothing left open. */
int sbx_job_create(const struct sbx_job_limits *limits, struct sbx_job *job,
                   struct sbx_win_error *err);

/* Close the port and the job: every process still in it is killed. */
void sbx_job_close(struct sbx_job *job);

/* CpuRate for `millicores` on `ncpu` processors: 1/100 of a percent of the
 * whole machine, at least 1, at most 10000. */
uint32_t sbx_job_cpu_rate(uint32_t millicores, uint32_t ncpu);

/* ---- the program, born inside the job -------------------------------- */

struct sbx_job_spawn {
    const wchar_t *application; /* NULL: the first word of command_line */
    wchar_t *command_line;      /* built by the caller (subprocess.list2cmdline);
                                   CreateProcessW may write into it */
    const wchar_t *cwd;         /* NULL: the caller's */
    void *environment;          /* NULL: the caller's; else a Unicode block */
    /* The standard handles, inheritable (NULL: none); with `handles` they are
     * the only handles the program inherits (PROC_THREAD_ATTRIBUTE_HANDLE_LIST). */
    HANDLE std_input, std_output, std_error;
    const HANDLE *handles;
    size_t n_handles;
    uint32_t creation_flags; /* the caller's; CREATE_SUSPENDED: left suspended */
    /* STARTUPINFO's dwFlags (STARTF_USESTDHANDLES is this layer's own) and
     * wShowWindow, as the caller's startupinfo has them (subprocess hides
     * the window of a shell: STARTF_USESHOWWINDOW, SW_HIDE). */
    uint32_t startup_flags;
    uint16_t show_window;
    /* Testing switch: skip PROC_THREAD_ATTRIBUTE_JOB_LIST and take the
     * suspended-assign-resume way. */
    int no_job_list;
};

/* How the program entered the job (struct sbx_job_child.how). */
#define SBX_JOB_HOW_JOB_LIST 1 /* created in it: PROC_THREAD_ATTRIBUTE_JOB_LIST */
#define SBX_JOB_HOW_ASSIGN   2 /* created suspended, assigned, then resumed */

struct sbx_job_child {
    HANDLE process, thread;
    uint32_t pid, tid;
    int how; /* SBX_JOB_HOW_* */
    /* Why the JOB_LIST way was not taken (step NULL: it was, or was not
     * tried).  Informational: the ASSIGN way holds the same guarantee. */
    struct sbx_win_error job_list_error;
};

/* Create the program inside `job`: with PROC_THREAD_ATTRIBUTE_JOB_LIST
 * where the system has it; else CREATE_SUSPENDED, AssignProcessToJobObject,
 * ResumeThread -- and when the assignment fails the suspended process is
 * terminated, so it never runs a single instruction outside the job.
 * Returns 0 (the child's handles are the caller's to close), or -1 with *err
 * filled and no process left. */
int sbx_job_spawn(const struct sbx_job *job, const struct sbx_job_spawn *spawn,
                  struct sbx_job_child *child, struct sbx_win_error *err);

/* ---- what happened: the completion port ------------------------------ */

struct sbx_job_event {
    uint32_t msg; /* JOB_OBJECT_MSG_* */
    uint32_t pid; /* the process concerned, when the message names one */
};

/* Wait up to timeout_ms for the job's next message.  Returns 1 with *event
 * filled, 0 when none came in time, -1 with *err. */
int sbx_job_next_event(const struct sbx_job *job, uint32_t timeout_ms, struct sbx_job_event *event,
                       struct sbx_win_error *err);

/* A stable name of a JOB_OBJECT_MSG_* value ("active_process_zero"), or
 * NULL for one not known here. */
const char *sbx_job_msg_name(uint32_t msg);

/* The termination reason a message means ("memory", "pids", "cpu_time":
 * the names of sbxlimit's Termination.reason), or NULL when it means none. */
const char *sbx_job_msg_reason(uint32_t msg);

/* The messages seen so far, folded (sbx_job_note). */
#define SBX_JOB_HIT_MEMORY   1 /* JOB_OBJECT_MSG_JOB_MEMORY_LIMIT */
#define SBX_JOB_HIT_PIDS     2 /* JOB_OBJECT_MSG_ACTIVE_PROCESS_LIMIT */
#define SBX_JOB_HIT_CPU_TIME 4 /* JOB_OBJECT_MSG_END_OF_JOB_TIME */
struct sbx_job_verdict {
    unsigned hits;  /* SBX_JOB_HIT_* */
    unsigned first; /* the first SBX_JOB_HIT_* seen (0: none) */
    uint32_t new_processes, exits, abnormal_exits;
    int empty; /* JOB_OBJECT_MSG_ACTIVE_PROCESS_ZERO seen */
};

/* Fold one event into *verdict. */
void sbx_job_note(struct sbx_job_verdict *verdict, const struct sbx_job_event *event);

/* The reason of the first limit hit ("memory", "pids", "cpu_time"), or NULL. */
const char *sbx_job_reason(const struct sbx_job_verdict *verdict);

/* ---- usage and the end ------------------------------------------------ */

struct sbx_job_usage {
    uint64_t user_100ns, kernel_100ns; /* every process the job has had */
    uint32_t total_processes, active_processes, terminated_processes;
    uint64_t read_ops, write_ops, other_ops;
    uint64_t read_bytes, write_bytes, other_bytes;
    uint64_t peak_job_memory;     /* PeakJobMemoryUsed: bytes committed, at most */
    uint64_t peak_process_memory; /* PeakProcessMemoryUsed */
};

/* JobObjectBasicAndIoAccountingInformation and the peaks of
 * JobObjectExtendedLimitInformation.  Returns 0, or -1 with *err. */
int sbx_job_usage(const struct sbx_job *job, struct sbx_job_usage *usage,
                  struct sbx_win_error *err);

/* Whether the job's user time reached its cpu_time limit (1), not (0), or
 * -1 with *err: the evidence for "cpu_time" when Windows ended the job at
 * its time limit (exit status ERROR_NOT_ENOUGH_QUOTA) without a message. */
int sbx_job_cpu_time_reached(const struct sbx_job *job, struct sbx_win_error *err);

/* kill_tree: TerminateJobObject, every process of the job at once, with
 * exit_code.  Returns 0, or -1 with *err. */
int sbx_job_kill(const struct sbx_job *job, uint32_t exit_code, struct sbx_win_error *err);

#endif /* SBX_WINDOWS_JOB_H */
