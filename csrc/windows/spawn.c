/* windows/spawn.c -- the program, created inside its job.
 *
 * There is no moment when the program runs outside the job: either it is
 * created in it (PROC_THREAD_ATTRIBUTE_JOB_LIST, Windows 10 and later), or
 * it is created suspended, assigned, and only then resumed; when the
 * assignment fails the suspended process is terminated before it ran.  The
 * program inherits the handles it is given and no other
 * (PROC_THREAD_ATTRIBUTE_HANDLE_LIST).
 */
#include "job.h"

#include <string.h>

#ifndef PROC_THREAD_ATTRIBUTE_JOB_LIST /* older SDKs: the value Windows 10 defines */
#define PROC_THREAD_ATTRIBUTE_JOB_LIST 0x2000D
#endif

#define MAX_INHERITED 64

static int fail(struct sbx_win_error *err, const char *step)
{
    err->step = step;
    err->code = (uint32_t)GetLastError();
    return -1;
}

/* The handles to inherit, each once (a repeated handle makes CreateProcess
 * fail), NULL and INVALID_HANDLE_VALUE left out.  Returns the count, or
 * -1 when there are more than fit. */
static int inherited(const struct sbx_job_spawn *s, HANDLE *out)
{
    HANDLE all[3 + MAX_INHERITED];
    size_t n_all = 0, i, j;
    int n = 0;

    if (s->n_handles > MAX_INHERITED)
        return -1;
    all[n_all++] = s->std_input;
    all[n_all++] = s->std_output;
    all[n_all++] = s->std_error;
    for (i = 0; i < s->n_handles; i++)
        all[n_all++] = s->handles[i];
    for (i = 0; i < n_all; i++) {
        if (all[i] == NULL || all[i] == INVALID_HANDLE_VALUE)
            continue;
        for (j = 0; j < (size_t)n && out[j] != all[i]; j++)
            ;
        if (j == (size_t)n)
            out[n++] = all[i];
    }
    return n;
}

/* One CreateProcessW.  job_list: created inside the job by the attribute;
 * else created suspended, for the caller to assign.  On failure *step says
 * which call failed and GetLastError() is left as it was. */
static BOOL create(const struct sbx_job *job, const struct sbx_job_spawn *s, int job_list,
                   PROCESS_INFORMATION *pi, const char **step)
{
    STARTUPINFOEXW si;
    HANDLE handles[3 + MAX_INHERITED];
    HANDLE jobs[1];
    LPPROC_THREAD_ATTRIBUTE_LIST attrs = NULL;
    SIZE_T size = 0;
    DWORD count, flags, saved;
    int n;
    BOOL ok = FALSE;

    n = inherited(s, handles);
    if (n < 0) {
        *step = "spawn:handle_list";
        SetLastError(ERROR_INVALID_PARAMETER);
        return FALSE;
    }
    count = (DWORD)(n > 0) + (DWORD)(job_list != 0);

    memset(&si, 0, sizeof si);
    si.StartupInfo.cb = sizeof si;
    si.StartupInfo.dwFlags = s->startup_flags & ~(DWORD)STARTF_USESTDHANDLES;
    si.StartupInfo.wShowWindow = s->show_window;
    if (s->std_input || s->std_output || s->std_error) {
        si.StartupInfo.dwFlags |= STARTF_USESTDHANDLES;
        si.StartupInfo.hStdInput = s->std_input;
        si.StartupInfo.hStdOutput = s->std_output;
        si.StartupInfo.hStdError = s->std_error;
    }
    if (count > 0) {
        *step = "spawn:attribute_list";
        InitializeProcThreadAttributeList(NULL, count, 0, &size); /* fails, telling the size */
        attrs = (LPPROC_THREAD_ATTRIBUTE_LIST)HeapAlloc(GetProcessHeap(), 0, size);
        if (attrs == NULL) {
            SetLastError(ERROR_NOT_ENOUGH_MEMORY);
            return FALSE;
        }
        if (!InitializeProcThreadAttributeList(attrs, count, 0, &size)) {
            saved = GetLastError();
            HeapFree(GetProcessHeap(), 0, attrs);
            SetLastError(saved);
            return FALSE;
        }
        si.lpAttributeList = attrs;
    }
    if (n > 0) {
        *step = "spawn:handle_list";
        if (!UpdateProcThreadAttribute(attrs, 0, PROC_THREAD_ATTRIBUTE_HANDLE_LIST, handles,
                                       (SIZE_T)n * sizeof(HANDLE), NULL, NULL))
            goto done;
    }
    if (job_list) {
        *step = "spawn:job_list";
        jobs[0] = job->job;
        if (!UpdateProcThreadAttribute(attrs, 0, PROC_THREAD_ATTRIBUTE_JOB_LIST, jobs, sizeof jobs,
                                       NULL, NULL))
            goto done;
    }

    flags = s->creation_flags | CREATE_UNICODE_ENVIRONMENT;
    if (attrs != NULL)
        flags |= EXTENDED_STARTUPINFO_PRESENT;
    if (!job_list)
        flags |= CREATE_SUSPENDED;
    *step = "spawn:create_process";
    ok = CreateProcessW(s->application, s->command_line, NULL, NULL, n > 0, flags, s->environment,
                        s->cwd, &si.StartupInfo, pi);
done:
    saved = GetLastError();
    if (attrs != NULL) {
        DeleteProcThreadAttributeList(attrs);
        HeapFree(GetProcessHeap(), 0, attrs);
    }
    SetLastError(saved);
    return ok;
}

int sbx_job_spawn(const struct sbx_job *job, const struct sbx_job_spawn *spawn,
                  struct sbx_job_child *child, struct sbx_win_error *err)
{
    PROCESS_INFORMATION pi;
    const char *step = NULL;
    DWORD code;

    memset(child, 0, sizeof *child);
    memset(&pi, 0, sizeof pi);

    if (!spawn->no_job_list) {
        if (create(job, spawn, 1, &pi, &step)) {
            child->how = SBX_JOB_HOW_JOB_LIST;
            goto born;
        }
        code = GetLastError();
        /* The attribute is unknown to this system (before Windows 10): take
         * the other way.  Any other failure is the program's own. */
        if (strcmp(step, "spawn:job_list") != 0 && code != ERROR_INVALID_PARAMETER &&
            code != ERROR_NOT_SUPPORTED) {
            SetLastError(code);
            return fail(err, step);
        }
        child->job_list_error.step = step;
        child->job_list_error.code = (uint32_t)code;
    }

    /* Created suspended: no instruction of it runs before it is in the job. */
    if (!create(job, spawn, 0, &pi, &step))
        return fail(err, step);
    if (!AssignProcessToJobObject(job->job, pi.hProcess)) {
        fail(err, "spawn:assign");
        TerminateProcess(pi.hProcess, ERROR_ACCESS_DENIED);
        WaitForSingleObject(pi.hProcess, INFINITE);
        CloseHandle(pi.hThread);
        CloseHandle(pi.hProcess);
        return -1;
    }
    child->how = SBX_JOB_HOW_ASSIGN;
    if (!(spawn->creation_flags & CREATE_SUSPENDED) && ResumeThread(pi.hThread) == (DWORD)-1) {
        fail(err, "spawn:resume");
        TerminateProcess(pi.hProcess, ERROR_ACCESS_DENIED);
        WaitForSingleObject(pi.hProcess, INFINITE);
        CloseHandle(pi.hThread);
        CloseHandle(pi.hProcess);
        return -1;
    }

born:
    child->process = pi.hProcess;
    child->thread = pi.hThread;
    child->pid = pi.dwProcessId;
    child->tid = pi.dwThreadId;
    return 0;
}
