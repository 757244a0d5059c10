/* job_test.c -- csrc/windows/ exercised for real (tests/test_windows_wine.py).
 *
 *   job_test.exe [check ...]   run the checks (all without arguments)
 *   job_test.exe child MODE    a program for a check to run in a job
 *
 * Each check prints one line:
 *   {"check": "NAME", "status": "pass|fail|unsupported", "detail": "..."}
 * "unsupported" is printed only when a call returned an error saying the
 * system does not do it ("unsupported: <call> returned <error>"); a call
 * that succeeds but does not hold is a "fail" with what was seen.  No
 * check waits without a bound.
 */
#include "../../../csrc/windows/job.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB (1024u * 1024u)

static wchar_t self_path[MAX_PATH];

/* ---- output ---------------------------------------------------------- */

#if defined(__GNUC__) || defined(__clang__)
#define PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define PRINTF_LIKE(f, a)
#endif

static void report(const char *check, const char *status, const char *fmt, ...) PRINTF_LIKE(3, 4);

static void report(const char *check, const char *status, const char *fmt, ...)
{
    char detail[512];
    va_list ap;
    char *p;

    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    for (p = detail; *p; p++)
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20)
            *p = '\'';
    printf("{\"check\": \"%s\", \"status\": \"%s\", \"detail\": \"%s\"}\n", check, status, detail);
    fflush(stdout);
}

#define PASS(check, ...)        report(check, "pass", __VA_ARGS__)
#define FAIL(check, ...)        report(check, "fail", __VA_ARGS__)
#define UNSUPPORTED(check, ...) report(check, "unsupported", __VA_ARGS__)

/* ---- the child programs ---------------------------------------------- */

static void spin(DWORD ms)
{
    DWORD start = GetTickCount();
    volatile unsigned long x = 0;

    while (GetTickCount() - start < ms)
        x++;
}

/* A copy of this program in child mode, created by plain CreateProcessW as
 * the program in a job would (no breakaway unless flags ask). */
static BOOL start_self(const char *args, DWORD flags, PROCESS_INFORMATION *pi)
{
    char narrow[512];
    wchar_t cmd[1024];
    STARTUPINFOW si;
    int n;

    n = snprintf(narrow, sizeof narrow, "\"%ls\" child %s", self_path, args);
    if (n < 0 || (size_t)n >= sizeof narrow)
        return FALSE;
    if (!MultiByteToWideChar(CP_UTF8, 0, narrow, -1, cmd, (int)(sizeof cmd / sizeof cmd[0])))
        return FALSE;
    memset(&si, 0, sizeof si);
    si.cb = sizeof si;
    return CreateProcessW(self_path, cmd, NULL, NULL, FALSE, flags, NULL, NULL, &si, pi);
}

static int child_main(int argc, char **argv)
{
    const char *mode = argc > 2 ? argv[2] : "";
    long arg = argc > 3 ? strtol(argv[3], NULL, 10) : 0;

    if (strcmp(mode, "sleep") == 0) {
        Sleep((DWORD)arg);
        return 0;
    }
    if (strcmp(mode, "spin") == 0) {
        spin((DWORD)arg);
        return 0;
    }
    if (strcmp(mode, "injob") == 0) {
        BOOL in = FALSE;
        if (!IsProcessInJob(GetCurrentProcess(), NULL, &in))
            printf("injob error %lu\n", (unsigned long)GetLastError());
        else
            printf("injob %d\n", in ? 1 : 0);
        return 0;
    }
    if (strcmp(mode, "alloc") == 0) { /* commit arg MiB and touch every page */
        SIZE_T size = (SIZE_T)arg * MIB, i;
        char *p = VirtualAlloc(NULL, size, MEM_COMMIT | MEM_RESERVE, PAGE_READWRITE);
        if (p == NULL) {
            printf("alloc failed %lu\n", (unsigned long)GetLastError());
            return 3;
        }
        for (i = 0; i < size; i += 4096)
            p[i] = 1;
        printf("alloc ok\n");
        return 0;
    }
    if (strcmp(mode, "spawn") == 0) { /* start arg children sleeping argv[4] ms */
        PROCESS_INFORMATION pis[16];
        char args[64];
        long i, ok = 0, failed = 0;
        DWORD first_error = 0;
        snprintf(args, sizeof args, "sleep %s", argc > 4 ? argv[4] : "0");
        for (i = 0; i < arg && i < 16; i++) {
            if (start_self(args, 0, &pis[ok])) {
                ok++;
            } else {
                if (!failed)
                    first_error = GetLastError();
                failed++;
            }
        }
        printf("spawned %ld failed %ld error %lu\n", ok, failed, (unsigned long)first_error);
        fflush(stdout);
        for (i = 0; i < ok; i++) {
            WaitForSingleObject(pis[i].hProcess, 30000);
            CloseHandle(pis[i].hThread);
            CloseHandle(pis[i].hProcess);
        }
        return 0;
    }
    if (strcmp(mode, "breakaway") == 0) {
        PROCESS_INFORMATION pi;
        if (start_self("sleep 0", CREATE_BREAKAWAY_FROM_JOB, &pi)) {
            printf("breakaway ok\n");
            WaitForSingleObject(pi.hProcess, 10000);
            CloseHandle(pi.hThread);
            CloseHandle(pi.hProcess);
        } else {
            printf("breakaway refused %lu\n", (unsigned long)GetLastError());
        }
        return 0;
    }
    if (strcmp(mode, "crash") == 0) {
        volatile int *volatile nowhere = NULL;
        *nowhere = 1;
        return 0;
    }
    if (strcmp(mode, "mark") == 0 && argc > 3) { /* proof that it ran: a file */
        HANDLE f = CreateFileA(argv[3], GENERIC_WRITE, 0, NULL, CREATE_ALWAYS, 0, NULL);
        if (f != INVALID_HANDLE_VALUE)
            CloseHandle(f);
        return 0;
    }
    if (strcmp(mode, "work") == 0 && argc > 3) { /* CPU, a written file, memory */
        static char block[64 * 1024];
        DWORD wrote;
        int i;
        HANDLE f = CreateFileA(argv[3], GENERIC_WRITE, 0, NULL, CREATE_ALWAYS, 0, NULL);
        char *p;
        spin(400);
        if (f == INVALID_HANDLE_VALUE)
            return 4;
        for (i = 0; i < 16; i++)
            WriteFile(f, block, sizeof block, &wrote, NULL);
        CloseHandle(f);
        p = VirtualAlloc(NULL, 32 * MIB, MEM_COMMIT | MEM_RESERVE, PAGE_READWRITE);
        if (p == NULL)
            return 5;
        for (i = 0; i < (int)(32 * MIB); i += 4096)
            p[i] = 1;
        return 0;
    }
    fprintf(stderr, "job_test: unknown child mode %s\n", mode);
    return 2;
}

/* ---- helpers of the checks ------------------------------------------- */

struct run {
    struct sbx_job_child child;
    HANDLE out; /* read end of the child's stdout */
    char text[512];
    DWORD exit_code;
    int done; /* exited within the wait */
};

/* Start `args` (child mode) in job with a pipe as stdout and stderr. */
static int run_start(const struct sbx_job *job, const char *args, int no_job_list, struct run *r,
                     struct sbx_win_error *err)
{
    SECURITY_ATTRIBUTES sa = {sizeof sa, NULL, TRUE};
    struct sbx_job_spawn s;
    char narrow[512];
    wchar_t cmd[1024];
    HANDLE wr;
    int rc;

    memset(r, 0, sizeof *r);
    if (!CreatePipe(&r->out, &wr, &sa, 0)) {
        err->step = "test:pipe";
        err->code = (uint32_t)GetLastError();
        return -1;
    }
    SetHandleInformation(r->out, HANDLE_FLAG_INHERIT, 0);
    snprintf(narrow, sizeof narrow, "\"%ls\" child %s", self_path, args);
    MultiByteToWideChar(CP_UTF8, 0, narrow, -1, cmd, (int)(sizeof cmd / sizeof cmd[0]));
    memset(&s, 0, sizeof s);
    s.application = self_path;
    s.command_line = cmd;
    s.std_output = wr;
    s.std_error = wr;
    s.no_job_list = no_job_list;
    rc = sbx_job_spawn(job, &s, &r->child, err);
    CloseHandle(wr);
    if (rc < 0) {
        CloseHandle(r->out);
        r->out = NULL;
    }
    return rc;
}

/* Wait up to ms for the child, then read what it wrote. */
static void run_wait(struct run *r, DWORD ms)
{
    DWORD got = 0, avail = 0;

    r->done = WaitForSingleObject(r->child.process, ms) == WAIT_OBJECT_0;
    GetExitCodeProcess(r->child.process, &r->exit_code);
    r->text[0] = 0;
    if (PeekNamedPipe(r->out, NULL, 0, NULL, &avail, NULL) && avail > 0 &&
        ReadFile(r->out, r->text, sizeof r->text - 1, &got, NULL))
        r->text[got] = 0;
    while (got > 0 && (r->text[got - 1] == '\n' || r->text[got - 1] == '\r'))
        r->text[--got] = 0;
}

static void run_close(struct run *r)
{
    if (r->child.process)
        CloseHandle(r->child.process);
    if (r->child.thread)
        CloseHandle(r->child.thread);
    if (r->out)
        CloseHandle(r->out);
    memset(r, 0, sizeof *r);
}

/* Read the job's messages for up to ms, until stop_msg (0: none) is seen. */
struct seen {
    struct sbx_job_verdict v;
    uint32_t new_pids[16];
    unsigned n_new;
    char names[256];
};

static void collect(const struct sbx_job *job, DWORD ms, uint32_t stop_msg, struct seen *seen)
{
    DWORD start = GetTickCount(), left;
    struct sbx_job_event ev;
    struct sbx_win_error err;
    const char *name;
    size_t len;

    for (;;) {
        DWORD spent = GetTickCount() - start;
        left = spent >= ms ? 0 : ms - spent;
        if (sbx_job_next_event(job, left, &ev, &err) != 1)
            return;
        sbx_job_note(&seen->v, &ev);
        if (ev.msg == JOB_OBJECT_MSG_NEW_PROCESS && seen->n_new < 16)
            seen->new_pids[seen->n_new++] = ev.pid;
        name = sbx_job_msg_name(ev.msg);
        len = strlen(seen->names);
        snprintf(seen->names + len, sizeof seen->names - len, "%s%s", len ? "," : "",
                 name ? name : "?");
        if (stop_msg && ev.msg == stop_msg)
            return;
    }
}

static int make_job(const struct sbx_job_limits *lim, struct sbx_job *job, const char *check)
{
    struct sbx_win_error err;

    if (sbx_job_create(lim, job, &err) < 0) {
        FAIL(check, "sbx_job_create failed at %s: error %lu", err.step, (unsigned long)err.code);
        return -1;
    }
    return 0;
}

/* ---- the checks ------------------------------------------------------- */

static void check_create(void)
{
    struct sbx_job_limits lim = {1024ull * MIB, 10, 100ull * 10000000ull, 500};
    JOBOBJECT_EXTENDED_LIMIT_INFORMATION ext;
    JOBOBJECT_CPU_RATE_CONTROL_INFORMATION rate;
    DWORD want = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE | JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION |
                 JOB_OBJECT_LIMIT_JOB_MEMORY | JOB_OBJECT_LIMIT_ACTIVE_PROCESS |
                 JOB_OBJECT_LIMIT_JOB_TIME;
    struct sbx_job job;

    if (make_job(&lim, &job, "create") < 0)
        return;
    PASS("create", "every limit set: LimitFlags 0x%lx", (unsigned long)want);

    memset(&ext, 0, sizeof ext);
    if (!QueryInformationJobObject(job.job, JobObjectExtendedLimitInformation, &ext, sizeof ext,
                                   NULL))
        UNSUPPORTED("query_limits",
                    "unsupported: QueryInformationJobObject(JobObjectExtendedLimitInformation) "
                    "returned %lu",
                    (unsigned long)GetLastError());
    else if (ext.BasicLimitInformation.LimitFlags != want || ext.JobMemoryLimit != lim.memory ||
             ext.BasicLimitInformation.ActiveProcessLimit != lim.pids ||
             (uint64_t)ext.BasicLimitInformation.PerJobUserTimeLimit.QuadPart != lim.cpu_time_100ns)
        FAIL("query_limits",
             "read back LimitFlags 0x%lx JobMemoryLimit %llu ActiveProcessLimit %lu "
             "PerJobUserTimeLimit %lld, set 0x%lx %llu %lu %llu",
             (unsigned long)ext.BasicLimitInformation.LimitFlags,
             (unsigned long long)ext.JobMemoryLimit,
             (unsigned long)ext.BasicLimitInformation.ActiveProcessLimit,
             (long long)ext.BasicLimitInformation.PerJobUserTimeLimit.QuadPart, (unsigned long)want,
             (unsigned long long)lim.memory, (unsigned long)lim.pids,
             (unsigned long long)lim.cpu_time_100ns);
    else
        PASS("query_limits", "the limits read back as set");

    if (job.cpu_rate < 0) {
        UNSUPPORTED("cpu_rate",
                    "unsupported: SetInformationJobObject(JobObjectCpuRateControlInformation) "
                    "returned %lu",
                    (unsigned long)job.cpu_rate_error.code);
    } else {
        memset(&rate, 0, sizeof rate);
        if (!QueryInformationJobObject(job.job, JobObjectCpuRateControlInformation, &rate,
                                       sizeof rate, NULL))
            FAIL("cpu_rate", "set, but QueryInformationJobObject returned %lu",
                 (unsigned long)GetLastError());
        else if (rate.CpuRate != job.cpu_rate_value ||
                 !(rate.ControlFlags & JOB_OBJECT_CPU_RATE_CONTROL_HARD_CAP))
            FAIL("cpu_rate", "read back CpuRate %lu flags 0x%lx, set %lu",
                 (unsigned long)rate.CpuRate, (unsigned long)rate.ControlFlags,
                 (unsigned long)job.cpu_rate_value);
        else
            PASS("cpu_rate", "hard cap CpuRate %lu", (unsigned long)rate.CpuRate);
    }
    sbx_job_close(&job);
}

static void check_pure(void)
{
    if (sbx_job_cpu_rate(500, 4) == 1250 && sbx_job_cpu_rate(1000, 1) == 10000 &&
        sbx_job_cpu_rate(64000, 4) == 10000 && sbx_job_cpu_rate(1, 64) == 1 &&
        sbx_job_cpu_rate(250, 0) == 2500)
        PASS("cpu_rate_value", "millicores to CpuRate");
    else
        FAIL("cpu_rate_value", "500m on 4 CPUs gave %lu", (unsigned long)sbx_job_cpu_rate(500, 4));
    if (strcmp(sbx_job_msg_reason(JOB_OBJECT_MSG_JOB_MEMORY_LIMIT), "memory") == 0 &&
        strcmp(sbx_job_msg_reason(JOB_OBJECT_MSG_ACTIVE_PROCESS_LIMIT), "pids") == 0 &&
        strcmp(sbx_job_msg_reason(JOB_OBJECT_MSG_END_OF_JOB_TIME), "cpu_time") == 0 &&
        sbx_job_msg_reason(JOB_OBJECT_MSG_ACTIVE_PROCESS_ZERO) == NULL &&
        sbx_job_msg_reason(JOB_OBJECT_MSG_EXIT_PROCESS) == NULL)
        PASS("msg_reason", "message to termination reason");
    else
        FAIL("msg_reason", "a message maps to the wrong reason");
}

static void check_in_job(const char *check, int no_job_list)
{
    struct sbx_job_limits lim = {0, 0, 0, 0};
    struct sbx_job job;
    struct sbx_win_error err;
    struct run r;
    BOOL in = FALSE;
    int want = no_job_list ? SBX_JOB_HOW_ASSIGN : SBX_JOB_HOW_JOB_LIST;

    if (make_job(&lim, &job, check) < 0)
        return;
    if (run_start(&job, "injob", no_job_list, &r, &err) < 0) {
        FAIL(check, "sbx_job_spawn failed at %s: error %lu", err.step, (unsigned long)err.code);
        sbx_job_close(&job);
        return;
    }
    if (!IsProcessInJob(r.child.process, job.job, &in))
        in = FALSE;
    run_wait(&r, 10000);
    if (r.child.how != want && !no_job_list)
        UNSUPPORTED(check,
                    "unsupported: CreateProcessW with PROC_THREAD_ATTRIBUTE_JOB_LIST: %s "
                    "returned %lu (created suspended and assigned instead)",
                    r.child.job_list_error.step ? r.child.job_list_error.step : "?",
                    (unsigned long)r.child.job_list_error.code);
    else if (r.child.how != want)
        FAIL(check, "how %d, wanted %d", r.child.how, want);
    else if (!in || strcmp(r.text, "injob 1") != 0)
        FAIL(check, "IsProcessInJob(child, job) %d, the child said '%s'", (int)in, r.text);
    else
        PASS(check, "in the job from birth (how %d), the child said '%s'", r.child.how, r.text);
    run_close(&r);
    sbx_job_close(&job);
}

static void check_assign_failure(void)
{
    /* A job handle that may not assign: AssignProcessToJobObject fails, and
     * the suspended program must be gone without having run. */
    struct sbx_job_limits lim = {0, 0, 0, 0};
    struct sbx_job job, weak;
    struct sbx_win_error err;
    struct run r;
    char mark[MAX_PATH], args[MAX_PATH + 16];
    DWORD n;
    int rc;

    if (make_job(&lim, &job, "assign_failure") < 0)
        return;
    weak = job;
    if (!DuplicateHandle(GetCurrentProcess(), job.job, GetCurrentProcess(), &weak.job,
                         JOB_OBJECT_QUERY, FALSE, 0)) {
        FAIL("assign_failure", "DuplicateHandle returned %lu", (unsigned long)GetLastError());
        sbx_job_close(&job);
        return;
    }
    n = GetTempPathA(sizeof mark, mark);
    snprintf(mark + n, sizeof mark - n, "sbx_job_test_mark_%lu",
             (unsigned long)GetCurrentProcessId());
    DeleteFileA(mark);
    snprintf(args, sizeof args, "mark %s", mark);
    rc = run_start(&weak, args, 1, &r, &err);
    Sleep(500);
    if (rc == 0) {
        FAIL("assign_failure", "spawned through a job handle without JOB_OBJECT_ASSIGN_PROCESS");
        run_wait(&r, 5000);
        run_close(&r);
    } else if (GetFileAttributesA(mark) != INVALID_FILE_ATTRIBUTES) {
        FAIL("assign_failure", "%s failed (error %lu) but the program ran outside the job",
             err.step, (unsigned long)err.code);
    } else if (strcmp(err.step, "spawn:assign") != 0 || err.code != ERROR_ACCESS_DENIED) {
        FAIL("assign_failure", "failed at %s with %lu, wanted spawn:assign with 5", err.step,
             (unsigned long)err.code);
    } else {
        PASS("assign_failure", "%s error %lu, the suspended program never ran", err.step,
             (unsigned long)err.code);
    }
    DeleteFileA(mark);
    CloseHandle(weak.job);
    sbx_job_close(&job);
}

static void check_spawn_error(void)
{
    struct sbx_job_limits lim = {0, 0, 0, 0};
    struct sbx_job job;
    struct sbx_job_spawn s;
    struct sbx_job_child c;
    struct sbx_win_error err = {NULL, 0};
    wchar_t cmd[] = L"C:\\sbx-no-such-dir\\nothing.exe";

    if (make_job(&lim, &job, "spawn_error") < 0)
        return;
    memset(&s, 0, sizeof s);
    s.command_line = cmd;
    if (sbx_job_spawn(&job, &s, &c, &err) == 0) {
        FAIL("spawn_error", "a program that does not exist was started");
        CloseHandle(c.process);
        CloseHandle(c.thread);
    } else if (strcmp(err.step, "spawn:create_process") != 0 ||
               (err.code != ERROR_FILE_NOT_FOUND && err.code != ERROR_PATH_NOT_FOUND)) {
        FAIL("spawn_error", "step %s error %lu", err.step, (unsigned long)err.code);
    } else {
        PASS("spawn_error", "step %s error %lu", err.step, (unsigned long)err.code);
    }
    sbx_job_close(&job);
}

static void check_handle_list(void)
{
    /* An inheritable pipe not in the list must not reach the program: its
     * write end, closed here, then has no holder (PeekNamedPipe: broken). */
    SECURITY_ATTRIBUTES sa = {sizeof sa, NULL, TRUE};
    struct sbx_job_limits lim = {0, 0, 0, 0};
    struct sbx_job job;
    struct sbx_win_error err;
    struct run r;
    HANDLE rd, wr;
    DWORD avail = 0, listed_err = 0, other_err = 0;
    BOOL listed_ok, other_ok;

    if (make_job(&lim, &job, "handle_list") < 0)
        return;
    if (!CreatePipe(&rd, &wr, &sa, 0)) {
        FAIL("handle_list", "CreatePipe returned %lu", (unsigned long)GetLastError());
        sbx_job_close(&job);
        return;
    }
    if (run_start(&job, "sleep 1500", 0, &r, &err) < 0) {
        FAIL("handle_list", "sbx_job_spawn failed at %s: error %lu", err.step,
             (unsigned long)err.code);
        CloseHandle(rd);
        CloseHandle(wr);
        sbx_job_close(&job);
        return;
    }
    CloseHandle(wr);
    other_ok = PeekNamedPipe(rd, NULL, 0, NULL, &avail, NULL);
    other_err = other_ok ? 0 : GetLastError();
    listed_ok = PeekNamedPipe(r.out, NULL, 0, NULL, &avail, NULL);
    listed_err = listed_ok ? 0 : GetLastError();
    if (!listed_ok)
        FAIL("handle_list", "the listed stdout pipe has no writer: %lu", (unsigned long)listed_err);
    else if (other_ok)
        FAIL("handle_list", "an inheritable handle outside the list was inherited");
    else if (other_err != ERROR_BROKEN_PIPE)
        FAIL("handle_list", "PeekNamedPipe on the unlisted pipe returned %lu",
             (unsigned long)other_err);
    else
        PASS("handle_list", "only the listed handles were inherited");
    run_wait(&r, 10000);
    run_close(&r);
    CloseHandle(rd);
    sbx_job_close(&job);
}

static void check_port_messages(void)
{
    struct sbx_job_limits lim = {0, 0, 0, 0};
    struct sbx_job job;
    struct sbx_win_error err;
    struct seen seen;
    struct run r;

    memset(&seen, 0, sizeof seen);
    if (make_job(&lim, &job, "port_messages") < 0)
        return;
    if (run_start(&job, "sleep 50", 0, &r, &err) < 0) {
        FAIL("port_messages", "sbx_job_spawn failed at %s: error %lu", err.step,
             (unsigned long)err.code);
        sbx_job_close(&job);
        return;
    }
    collect(&job, 10000, JOB_OBJECT_MSG_ACTIVE_PROCESS_ZERO, &seen);
    run_wait(&r, 5000);
    if (seen.n_new == 1 && seen.new_pids[0] == r.child.pid && seen.v.exits == 1 && seen.v.empty &&
        seen.v.hits == 0)
        PASS("port_messages", "%s", seen.names);
    else
        FAIL("port_messages", "messages: '%s' (new pid %lu, child %lu)", seen.names,
             (unsigned long)(seen.n_new ? seen.new_pids[0] : 0), (unsigned long)r.child.pid);
    run_close(&r);
    sbx_job_close(&job);
}

/* Wait up to ms for the child's pipe to hold some output: its CreateProcess
 * of the grandchild has returned. */
static void wait_output(struct run *r, DWORD ms)
{
    DWORD start = GetTickCount(), avail = 0;

    while (GetTickCount() - start < ms) {
        if (PeekNamedPipe(r->out, NULL, 0, NULL, &avail, NULL) && avail > 0)
            return;
        Sleep(10);
    }
}

/* Read the port until two processes were born (a child and its child). */
static int tree_collect_two(const struct sbx_job *job, struct seen *seen)
{
    DWORD start = GetTickCount();

    while (seen->n_new < 2 && GetTickCount() - start < 10000) {
        struct sbx_job_event ev;
        struct sbx_win_error err;
        if (sbx_job_next_event(job, 500, &ev, &err) == 1) {
            sbx_job_note(&seen->v, &ev);
            if (ev.msg == JOB_OBJECT_MSG_NEW_PROCESS && seen->n_new < 16)
                seen->new_pids[seen->n_new++] = ev.pid;
        }
    }
    return (int)seen->n_new;
}

static void check_tree_end(const char *check, int by_kill)
{
    struct sbx_job_limits lim = {0, 0, 0, 0};
    struct sbx_job job;
    struct sbx_win_error err;
    struct seen seen;
    struct run r;
    HANDLE procs[2] = {NULL, NULL};
    DWORD codes[2] = {0, 0}, waited, start;
    int n = 0, i, ended = 0;

    memset(&seen, 0, sizeof seen);
    if (make_job(&lim, &job, check) < 0)
        return;
    if (run_start(&job, "spawn 1 60000", 0, &r, &err) < 0) {
        FAIL(check, "sbx_job_spawn failed at %s: error %lu", err.step, (unsigned long)err.code);
        sbx_job_close(&job);
        return;
    }
    tree_collect_two(&job, &seen);
    /* The tree is killed running, not while the grandchild is still being
     * created: Wine 8 can leave a process ended mid-creation STILL_ACTIVE
     * (exit code 259, the job never empty), a race that is Wine's. */
    wait_output(&r, 10000);
    Sleep(200);
    for (i = 0; i < (int)seen.n_new && n < 2; i++) {
        procs[n] =
            OpenProcess(SYNCHRONIZE | PROCESS_QUERY_LIMITED_INFORMATION, FALSE, seen.new_pids[i]);
        if (procs[n] != NULL)
            n++;
    }
    if (n < 2) {
        FAIL(check, "the tree did not start: %u new processes seen, %d opened", seen.n_new, n);
        sbx_job_close(&job);
        run_close(&r);
        for (i = 0; i < n; i++)
            CloseHandle(procs[i]);
        return;
    }
    start = GetTickCount();
    if (by_kill) {
        if (sbx_job_kill(&job, 0xdead, &err) < 0) {
            FAIL(check, "sbx_job_kill failed at %s: error %lu", err.step, (unsigned long)err.code);
            sbx_job_close(&job);
            run_close(&r);
            for (i = 0; i < n; i++)
                CloseHandle(procs[i]);
            return;
        }
    } else {
        sbx_job_close(&job); /* the only handle: KILL_ON_JOB_CLOSE */
    }
    for (i = 0; i < n; i++) {
        if (WaitForSingleObject(procs[i], 10000) == WAIT_OBJECT_0)
            ended++;
        GetExitCodeProcess(procs[i], &codes[i]);
    }
    waited = GetTickCount() - start;
    if (by_kill)
        collect(&job, 5000, JOB_OBJECT_MSG_ACTIVE_PROCESS_ZERO, &seen);
    if (ended != 2)
        FAIL(check, "%d of 2 processes ended within 10 s", ended);
    else if (by_kill && (codes[0] != 0xdead || codes[1] != 0xdead || !seen.v.empty))
        FAIL(check, "exit codes %lu %lu, active_process_zero %d", (unsigned long)codes[0],
             (unsigned long)codes[1], seen.v.empty);
    else
        PASS(check, "child and grandchild ended in %lu ms (exit codes %lu %lu)",
             (unsigned long)waited, (unsigned long)codes[0], (unsigned long)codes[1]);
    for (i = 0; i < n; i++)
        CloseHandle(procs[i]);
    run_close(&r);
    sbx_job_close(&job);
}

static void check_active_process_limit(void)
{
    struct sbx_job_limits lim = {0, 2, 0, 0};
    struct sbx_job job;
    struct sbx_win_error err;
    struct seen seen;
    struct run r;
    long ok = -1, failed = -1;
    unsigned long code = 0;

    memset(&seen, 0, sizeof seen);
    if (make_job(&lim, &job, "active_process_limit") < 0)
        return;
    if (run_start(&job, "spawn 3 1000", 0, &r, &err) < 0) {
        FAIL("active_process_limit", "sbx_job_spawn failed at %s: error %lu", err.step,
             (unsigned long)err.code);
        sbx_job_close(&job);
        return;
    }
    run_wait(&r, 15000);
    collect(&job, 5000, JOB_OBJECT_MSG_ACTIVE_PROCESS_ZERO, &seen);
    if (sscanf(r.text, "spawned %ld failed %ld error %lu", &ok, &failed, &code) != 3)
        FAIL("active_process_limit", "the child said '%s' (exit %lu)", r.text,
             (unsigned long)r.exit_code);
    else if (ok != 1 || failed != 2 || code != ERROR_NOT_ENOUGH_QUOTA)
        FAIL("active_process_limit",
             "limit 2: the child started %ld of 3, %ld refused (error "
             "%lu); messages '%s'",
             ok, failed, code, seen.names);
    else if (!(seen.v.hits & SBX_JOB_HIT_PIDS) || strcmp(sbx_job_reason(&seen.v), "pids") != 0)
        FAIL("active_process_limit",
             "refused (error %lu) but no active_process_limit message: "
             "'%s'",
             code, seen.names);
    else
        PASS("active_process_limit", "limit 2: 1 of 3 started, 2 refused with %lu; reason %s", code,
             sbx_job_reason(&seen.v));
    run_close(&r);
    sbx_job_close(&job);
}

static void check_job_memory_limit(void)
{
    struct sbx_job_limits lim = {64ull * MIB, 0, 0, 0};
    struct sbx_job job;
    struct sbx_win_error err;
    struct seen seen;
    struct run r;
    const char *reason;

    memset(&seen, 0, sizeof seen);
    if (make_job(&lim, &job, "job_memory_limit") < 0)
        return;
    if (run_start(&job, "alloc 256", 0, &r, &err) < 0) {
        FAIL("job_memory_limit", "sbx_job_spawn failed at %s: error %lu", err.step,
             (unsigned long)err.code);
        sbx_job_close(&job);
        return;
    }
    run_wait(&r, 20000);
    collect(&job, 5000, JOB_OBJECT_MSG_ACTIVE_PROCESS_ZERO, &seen);
    reason = sbx_job_reason(&seen.v);
    if (strncmp(r.text, "alloc failed", 12) != 0)
        FAIL("job_memory_limit", "committed 256 MiB under a 64 MiB job limit: '%s'; messages '%s'",
             r.text, seen.names);
    else if (reason == NULL || strcmp(reason, "memory") != 0)
        FAIL("job_memory_limit", "refused ('%s') but no job_memory_limit message: '%s'", r.text,
             seen.names);
    else
        PASS("job_memory_limit", "64 MiB: '%s', reason %s", r.text, reason);
    run_close(&r);
    sbx_job_close(&job);
}

static void check_job_time(void)
{
    struct sbx_job_limits lim = {0, 0, 3000000ull /* 0.3 s */, 0};
    struct sbx_job job;
    struct sbx_win_error err;
    struct seen seen;
    struct run r;
    DWORD start, took;
    int reached;

    memset(&seen, 0, sizeof seen);
    if (make_job(&lim, &job, "per_job_user_time") < 0)
        return;
    start = GetTickCount();
    if (run_start(&job, "spin 3000", 0, &r, &err) < 0) {
        FAIL("per_job_user_time", "sbx_job_spawn failed at %s: error %lu", err.step,
             (unsigned long)err.code);
        sbx_job_close(&job);
        return;
    }
    run_wait(&r, 15000);
    took = GetTickCount() - start;
    collect(&job, 2000, JOB_OBJECT_MSG_ACTIVE_PROCESS_ZERO, &seen);
    reached = sbx_job_cpu_time_reached(&job, &err);
    if (!r.done || r.exit_code != ERROR_NOT_ENOUGH_QUOTA)
        FAIL("per_job_user_time",
             "0.3 s limit: a 3 s spin ended after %lu ms with exit code %lu; "
             "user time reached %d; messages '%s'",
             (unsigned long)took, (unsigned long)r.exit_code, reached, seen.names);
    else if (!(seen.v.hits & SBX_JOB_HIT_CPU_TIME) && reached != 1)
        FAIL("per_job_user_time", "ended (exit %lu) with neither message nor user time: '%s'",
             (unsigned long)r.exit_code, seen.names);
    else
        PASS("per_job_user_time", "ended after %lu ms, exit %lu, message %d, user time reached %d",
             (unsigned long)took, (unsigned long)r.exit_code,
             (seen.v.hits & SBX_JOB_HIT_CPU_TIME) != 0, reached);
    run_close(&r);
    sbx_job_close(&job);
}

static void check_accounting(void)
{
    struct sbx_job_limits lim = {0, 0, 0, 0};
    struct sbx_job job;
    struct sbx_win_error err;
    struct sbx_job_usage u;
    JOBOBJECT_BASIC_ACCOUNTING_INFORMATION basic;
    struct seen seen;
    struct run r;
    char path[MAX_PATH], args[MAX_PATH + 16];
    DWORD n;
    int have_usage;

    memset(&seen, 0, sizeof seen);
    if (make_job(&lim, &job, "accounting") < 0)
        return;
    n = GetTempPathA(sizeof path, path);
    snprintf(path + n, sizeof path - n, "sbx_job_test_io_%lu",
             (unsigned long)GetCurrentProcessId());
    snprintf(args, sizeof args, "work %s", path);
    if (run_start(&job, args, 0, &r, &err) < 0) {
        FAIL("accounting_basic", "sbx_job_spawn failed at %s: error %lu", err.step,
             (unsigned long)err.code);
        sbx_job_close(&job);
        return;
    }
    run_wait(&r, 15000);
    collect(&job, 5000, JOB_OBJECT_MSG_ACTIVE_PROCESS_ZERO, &seen);
    DeleteFileA(path);
    if (!r.done || r.exit_code != 0)
        FAIL("accounting_basic", "the work child ended %d with %lu", r.done,
             (unsigned long)r.exit_code);

    memset(&basic, 0, sizeof basic);
    if (!QueryInformationJobObject(job.job, JobObjectBasicAccountingInformation, &basic,
                                   sizeof basic, NULL))
        UNSUPPORTED("accounting_basic",
                    "unsupported: QueryInformationJobObject(JobObjectBasicAccountingInformation) "
                    "returned %lu",
                    (unsigned long)GetLastError());
    else if (basic.TotalProcesses != 1 || basic.ActiveProcesses != 0)
        FAIL("accounting_basic", "TotalProcesses %lu ActiveProcesses %lu",
             (unsigned long)basic.TotalProcesses, (unsigned long)basic.ActiveProcesses);
    else
        PASS("accounting_basic", "TotalProcesses 1, ActiveProcesses 0");

    if (basic.TotalUserTime.QuadPart >= 1000000) /* 0.1 s of a 0.4 s spin */
        PASS("accounting_cpu_time", "TotalUserTime %lld x 100 ns",
             (long long)basic.TotalUserTime.QuadPart);
    else
        FAIL("accounting_cpu_time", "TotalUserTime %lld x 100 ns after a 0.4 s spin",
             (long long)basic.TotalUserTime.QuadPart);

    have_usage = sbx_job_usage(&job, &u, &err) == 0;
    if (!have_usage) {
        UNSUPPORTED("accounting_io", "unsupported: %s returned %lu",
                    strcmp(err.step, "job:query_accounting") == 0
                        ? "QueryInformationJobObject(JobObjectBasicAndIoAccountingInformation)"
                        : err.step,
                    (unsigned long)err.code);
    } else if (u.write_bytes < MIB) {
        FAIL("accounting_io", "WriteTransferCount %llu after writing 1 MiB",
             (unsigned long long)u.write_bytes);
    } else {
        PASS("accounting_io", "WriteTransferCount %llu", (unsigned long long)u.write_bytes);
    }
    if (have_usage && u.peak_job_memory >= 32ull * MIB)
        PASS("peak_memory", "PeakJobMemoryUsed %llu", (unsigned long long)u.peak_job_memory);
    else if (have_usage)
        FAIL("peak_memory", "PeakJobMemoryUsed %llu after committing 32 MiB",
             (unsigned long long)u.peak_job_memory);
    else {
        JOBOBJECT_EXTENDED_LIMIT_INFORMATION ext;
        memset(&ext, 0, sizeof ext);
        if (!QueryInformationJobObject(job.job, JobObjectExtendedLimitInformation, &ext, sizeof ext,
                                       NULL))
            UNSUPPORTED("peak_memory",
                        "unsupported: QueryInformationJobObject(JobObjectExtendedLimitInformation) "
                        "returned %lu",
                        (unsigned long)GetLastError());
        else if (ext.PeakJobMemoryUsed >= 32ull * MIB)
            PASS("peak_memory", "PeakJobMemoryUsed %llu",
                 (unsigned long long)ext.PeakJobMemoryUsed);
        else
            FAIL("peak_memory", "PeakJobMemoryUsed %llu after committing 32 MiB",
                 (unsigned long long)ext.PeakJobMemoryUsed);
    }
    run_close(&r);
    sbx_job_close(&job);
}

static void check_child_run(const char *check, const char *args, const char *want_text,
                            DWORD want_code, DWORD wait_ms)
{
    struct sbx_job_limits lim = {0, 0, 0, 0};
    struct sbx_job job;
    struct sbx_win_error err;
    struct seen seen;
    struct run r;
    DWORD start, took;

    memset(&seen, 0, sizeof seen);
    if (make_job(&lim, &job, check) < 0)
        return;
    start = GetTickCount();
    if (run_start(&job, args, 0, &r, &err) < 0) {
        FAIL(check, "sbx_job_spawn failed at %s: error %lu", err.step, (unsigned long)err.code);
        sbx_job_close(&job);
        return;
    }
    run_wait(&r, wait_ms);
    took = GetTickCount() - start;
    collect(&job, 3000, JOB_OBJECT_MSG_ACTIVE_PROCESS_ZERO, &seen);
    if (!r.done)
        FAIL(check, "still running after %lu ms", (unsigned long)took);
    else if (want_text && strcmp(r.text, want_text) != 0)
        FAIL(check, "the child said '%s', wanted '%s'", r.text, want_text);
    else if (!want_text && r.exit_code != want_code)
        FAIL(check, "exit code 0x%lx after %lu ms, wanted 0x%lx", (unsigned long)r.exit_code,
             (unsigned long)took, (unsigned long)want_code);
    else
        PASS(check, "'%s' exit 0x%lx in %lu ms; messages '%s'", r.text, (unsigned long)r.exit_code,
             (unsigned long)took, seen.names);
    run_close(&r);
    sbx_job_close(&job);
}

struct check {
    const char *name;
    void (*run)(void);
};

static void c_job_list(void)
{
    check_in_job("job_list", 0);
}
static void c_assign(void)
{
    check_in_job("assign", 1);
}
static void c_kill_on_close(void)
{
    check_tree_end("kill_on_job_close", 0);
}
static void c_terminate(void)
{
    check_tree_end("terminate_job", 1);
}
static void c_no_breakaway(void)
{
    check_child_run("no_breakaway", "breakaway", "breakaway refused 5", 0, 10000);
}
static void c_die_on_exception(void)
{
    /* With DIE_ON_UNHANDLED_EXCEPTION the crash ends the program at once,
     * no debugger, no error box: 5 s is plenty. */
    check_child_run("die_on_unhandled_exception", "crash", NULL, 0xC0000005u, 5000);
}

static const struct check CHECKS[] = {
    {"create", check_create}, /* also query_limits, cpu_rate */
    {"pure", check_pure},     /* cpu_rate_value, msg_reason */
    {"job_list", c_job_list},
    {"assign", c_assign},
    {"assign_failure", check_assign_failure},
    {"spawn_error", check_spawn_error},
    {"handle_list", check_handle_list},
    {"port_messages", check_port_messages},
    {"kill_on_job_close", c_kill_on_close},
    {"terminate_job", c_terminate},
    {"active_process_limit", check_active_process_limit},
    {"job_memory_limit", check_job_memory_limit},
    {"per_job_user_time", check_job_time},
    {"accounting", check_accounting}, /* accounting_*, peak_memory */
    {"no_breakaway", c_no_breakaway},
    {"die_on_unhandled_exception", c_die_on_exception},
};

int main(int argc, char **argv)
{
    size_t i;
    int j, ran = 0;

    if (!GetModuleFileNameW(NULL, self_path, MAX_PATH))
        return 2;
    if (argc > 1 && strcmp(argv[1], "child") == 0)
        return child_main(argc, argv);
    /* No error dialog for a crash of this program; the children's come from
     * the job (DIE_ON_UNHANDLED_EXCEPTION). */
    for (i = 0; i < sizeof CHECKS / sizeof CHECKS[0]; i++) {
        int want = argc == 1;
        for (j = 1; j < argc; j++)
            want |= strcmp(argv[j], CHECKS[i].name) == 0;
        if (want) {
            CHECKS[i].run();
            ran++;
        }
    }
    if (ran == 0) {
        fprintf(stderr, "job_test: no such check\n");
        return 2;
    }
    return 0;
}
