/* windows/job.c -- the Job Object: limits, completion port, usage, kill.
 *
 * Each limit is one field of the job (docs/windows.md):
 *   memory   -> JOBOBJECT_EXTENDED_LIMIT_INFORMATION.JobMemoryLimit
 *   pids     -> BasicLimitInformation.ActiveProcessLimit
 *   cpu_time -> BasicLimitInformation.PerJobUserTimeLimit
 *   cpu      -> JOBOBJECT_CPU_RATE_CONTROL_INFORMATION (hard cap)
 * and which one was hit comes from the completion port's messages.
 */
#include "job.h"

#include <string.h>

static int fail(struct sbx_win_error *err, const char *step)
{
    err->step = step;
    err->code = (uint32_t)GetLastError();
    return -1;
}

uint32_t sbx_job_cpu_rate(uint32_t millicores, uint32_t ncpu)
{
    /* CpuRate is in 1/100 of a percent of every processor: one core of n is
     * 10000 / n, so millicores m are m * 10 / n. */
    uint64_t rate;

    if (ncpu == 0)
        ncpu = 1;
    rate = (uint64_t)millicores * 10 / ncpu;
    if (rate < 1)
        rate = 1;
    if (rate > 10000)
        rate = 10000;
    return (uint32_t)rate;
}

static int set_cpu_rate(struct sbx_job *job)
{
    JOBOBJECT_CPU_RATE_CONTROL_INFORMATION rate;
    DWORD ncpu = GetActiveProcessorCount(ALL_PROCESSOR_GROUPS);

    memset(&rate, 0, sizeof rate);
    rate.ControlFlags = JOB_OBJECT_CPU_RATE_CONTROL_ENABLE | JOB_OBJECT_CPU_RATE_CONTROL_HARD_CAP;
    rate.CpuRate = job->cpu_rate_value = sbx_job_cpu_rate(job->limits.cpu_millicores, ncpu);
    if (!SetInformationJobObject(job->job, JobObjectCpuRateControlInformation, &rate, sizeof rate))
        return fail(&job->cpu_rate_error, "job:cpu_rate");
    return 0;
}

int sbx_job_create(const struct sbx_job_limits *limits, struct sbx_job *job,
                   struct sbx_win_error *err)
{
    JOBOBJECT_EXTENDED_LIMIT_INFORMATION ext;
    JOBOBJECT_ASSOCIATE_COMPLETION_PORT assoc;
    JOBOBJECT_BASIC_LIMIT_INFORMATION *basic = &ext.BasicLimitInformation;

    memset(job, 0, sizeof *job);
    job->limits = *limits;

    job->job = CreateJobObjectW(NULL, NULL);
    if (job->job == NULL)
        return fail(err, "job:create");

    /* No JOB_OBJECT_LIMIT_BREAKAWAY_OK nor SILENT_BREAKAWAY_OK: a process of
     * the job cannot leave it, and every child it makes is born in it. */
    memset(&ext, 0, sizeof ext);
    basic->LimitFlags =
        JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE | JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION;
    if (limits->memory) {
        basic->LimitFlags |= JOB_OBJECT_LIMIT_JOB_MEMORY;
        ext.JobMemoryLimit = (SIZE_T)limits->memory;
    }
    if (limits->pids) {
        basic->LimitFlags |= JOB_OBJECT_LIMIT_ACTIVE_PROCESS;
        basic->ActiveProcessLimit = limits->pids;
    }
    if (limits->cpu_time_100ns) {
        basic->LimitFlags |= JOB_OBJECT_LIMIT_JOB_TIME;
        basic->PerJobUserTimeLimit.QuadPart = (LONGLONG)limits->cpu_time_100ns;
    }
    if (!SetInformationJobObject(job->job, JobObjectExtendedLimitInformation, &ext, sizeof ext))
        goto failed_limits;

    /* At PerJobUserTimeLimit every process is terminated with exit status
     * ERROR_NOT_ENOUGH_QUOTA: JOB_OBJECT_TERMINATE_AT_END_OF_JOB, the default
     * of JobObjectEndOfJobTimeInformation, left as it is (setting it again
     * is one more call a system may not implement; Wine 8 does not). */

    /* The port before any process is in the job: no message is missed. */
    job->port = CreateIoCompletionPort(INVALID_HANDLE_VALUE, NULL, 0, 1);
    if (job->port == NULL) {
        fail(err, "job:port");
        goto failed;
    }
    assoc.CompletionKey = job->job;
    assoc.CompletionPort = job->port;
    if (!SetInformationJobObject(job->job, JobObjectAssociateCompletionPortInformation, &assoc,
                                 sizeof assoc)) {
        fail(err, "job:associate_port");
        goto failed;
    }

    if (limits->cpu_millicores)
        job->cpu_rate = set_cpu_rate(job) == 0 ? 1 : -1;
    return 0;

failed_limits:
    fail(err, "job:limits");
failed:
    sbx_job_close(job);
    return -1;
}

void sbx_job_close(struct sbx_job *job)
{
    if (job->port != NULL)
        CloseHandle(job->port);
    if (job->job != NULL)
        CloseHandle(job->job); /* KILL_ON_JOB_CLOSE: the last handle kills the tree */
    job->port = job->job = NULL;
}

/* ---- the completion port --------------------------------------------- */

int sbx_job_next_event(const struct sbx_job *job, uint32_t timeout_ms, struct sbx_job_event *event,
                       struct sbx_win_error *err)
{
    DWORD msg = 0;
    ULONG_PTR key = 0;
    LPOVERLAPPED data = NULL;

    for (;;) {
        if (!GetQueuedCompletionStatus(job->port, &msg, &key, &data, timeout_ms)) {
            if (data == NULL && GetLastError() == WAIT_TIMEOUT)
                return 0;
            return fail(err, "job:wait_event");
        }
        if (key != (ULONG_PTR)job->job)
            continue; /* not this job's: nothing else is posted to this port */
        event->msg = (uint32_t)msg;
        /* For process messages the "overlapped" pointer is the process id. */
        event->pid = (uint32_t)(ULONG_PTR)data;
        return 1;
    }
}

const char *sbx_job_msg_name(uint32_t msg)
{
    switch (msg) {
    case JOB_OBJECT_MSG_END_OF_JOB_TIME:
        return "end_of_job_time";
    case JOB_OBJECT_MSG_END_OF_PROCESS_TIME:
        return "end_of_process_time";
    case JOB_OBJECT_MSG_ACTIVE_PROCESS_LIMIT:
        return "active_process_limit";
    case JOB_OBJECT_MSG_ACTIVE_PROCESS_ZERO:
        return "active_process_zero";
    case JOB_OBJECT_MSG_NEW_PROCESS:
        return "new_process";
    case JOB_OBJECT_MSG_EXIT_PROCESS:
        return "exit_process";
    case JOB_OBJECT_MSG_ABNORMAL_EXIT_PROCESS:
        return "abnormal_exit_process";
    case JOB_OBJECT_MSG_PROCESS_MEMORY_LIMIT:
        return "process_memory_limit";
    case JOB_OBJECT_MSG_JOB_MEMORY_LIMIT:
        return "job_memory_limit";
    default:
        return NULL;
    }
}

const char *sbx_job_msg_reason(uint32_t msg)
{
    switch (msg) {
    case JOB_OBJECT_MSG_JOB_MEMORY_LIMIT:
        return "memory";
    case JOB_OBJECT_MSG_ACTIVE_PROCESS_LIMIT:
        return "pids";
    case JOB_OBJECT_MSG_END_OF_JOB_TIME:
        return "cpu_time";
    default:
        return NULL;
    }
}

void sbx_job_note(struct sbx_job_verdict *verdict, const struct sbx_job_event *event)
{
    unsigned hit = 0;

    switch (event->msg) {
    case JOB_OBJECT_MSG_JOB_MEMORY_LIMIT:
        hit = SBX_JOB_HIT_MEMORY;
        break;
    case JOB_OBJECT_MSG_ACTIVE_PROCESS_LIMIT:
        hit = SBX_JOB_HIT_PIDS;
        break;
    case JOB_OBJECT_MSG_END_OF_JOB_TIME:
        hit = SBX_JOB_HIT_CPU_TIME;
        break;
    case JOB_OBJECT_MSG_ACTIVE_PROCESS_ZERO:
        verdict->empty = 1;
        break;
    case JOB_OBJECT_MSG_NEW_PROCESS:
        verdict->new_processes++;
        break;
    case JOB_OBJECT_MSG_EXIT_PROCESS:
        verdict->exits++;
        break;
    case JOB_OBJECT_MSG_ABNORMAL_EXIT_PROCESS:
        verdict->exits++;
        verdict->abnormal_exits++;
        break;
    default:
        break;
    }
    if (hit && !verdict->first)
        verdict->first = hit;
    verdict->hits |= hit;
}

const char *sbx_job_reason(const struct sbx_job_verdict *verdict)
{
    switch (verdict->first) {
    case SBX_JOB_HIT_MEMORY:
        return "memory";
    case SBX_JOB_HIT_PIDS:
        return "pids";
    case SBX_JOB_HIT_CPU_TIME:
        return "cpu_time";
    default:
        return NULL;
    }
}

/* ---- usage and the end ------------------------------------------------ */

int sbx_job_usage(const struct sbx_job *job, struct sbx_job_usage *usage, struct sbx_win_error *err)
{
    JOBOBJECT_BASIC_AND_IO_ACCOUNTING_INFORMATION acct;
    JOBOBJECT_EXTENDED_LIMIT_INFORMATION ext;

    memset(usage, 0, sizeof *usage);
    memset(&acct, 0, sizeof acct);
    if (!QueryInformationJobObject(job->job, JobObjectBasicAndIoAccountingInformation, &acct,
                                   sizeof acct, NULL))
        return fail(err, "job:query_accounting");
    usage->user_100ns = (uint64_t)acct.BasicInfo.TotalUserTime.QuadPart;
    usage->kernel_100ns = (uint64_t)acct.BasicInfo.TotalKernelTime.QuadPart;
    usage->total_processes = acct.BasicInfo.TotalProcesses;
    usage->active_processes = acct.BasicInfo.ActiveProcesses;
    usage->terminated_processes = acct.BasicInfo.TotalTerminatedProcesses;
    usage->read_ops = acct.IoInfo.ReadOperationCount;
    usage->write_ops = acct.IoInfo.WriteOperationCount;
    usage->other_ops = acct.IoInfo.OtherOperationCount;
    usage->read_bytes = acct.IoInfo.ReadTransferCount;
    usage->write_bytes = acct.IoInfo.WriteTransferCount;
    usage->other_bytes = acct.IoInfo.OtherTransferCount;

    memset(&ext, 0, sizeof ext);
    if (!QueryInformationJobObject(job->job, JobObjectExtendedLimitInformation, &ext, sizeof ext,
                                   NULL))
        return fail(err, "job:query_limits");
    usage->peak_job_memory = ext.PeakJobMemoryUsed;
    usage->peak_process_memory = ext.PeakProcessMemoryUsed;
    return 0;
}

int sbx_job_cpu_time_reached(const struct sbx_job *job, struct sbx_win_error *err)
{
    JOBOBJECT_BASIC_ACCOUNTING_INFORMATION acct;

    if (!job->limits.cpu_time_100ns)
        return 0;
    memset(&acct, 0, sizeof acct);
    if (!QueryInformationJobObject(job->job, JobObjectBasicAccountingInformation, &acct,
                                   sizeof acct, NULL))
        return fail(err, "job:query_accounting");
    return (uint64_t)acct.TotalUserTime.QuadPart >= job->limits.cpu_time_100ns;
}

int sbx_job_kill(const struct sbx_job *job, uint32_t exit_code, struct sbx_win_error *err)
{
    if (!TerminateJobObject(job->job, exit_code))
        return fail(err, "job:terminate");
    return 0;
}
