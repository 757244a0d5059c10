/* windows/_corewin.c -- sbxlimit._core on Windows: the Job Object layer
 * (job.c, spawn.c) for Python.
 *
 * The only Windows file that includes Python.h (csrc/_coremodule.c is the
 * POSIX binding; setup.py builds one or the other).  A job is a capsule
 * that owns its handles: job_close() closes them (and, KILL_ON_JOB_CLOSE,
 * ends whatever is left in it), and so does the capsule's destructor, so a
 * job dropped by a failing caller still kills its processes.  Functions
 * raise only OSError: (0, message, step, winerror), the step naming the
 * call that failed ("job:limits", "spawn:create_process").  Calls that
 * wait release the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "job.h"

#include <string.h>

#define JOB_CAPSULE "sbxlimit._core.job"

static PyObject *win_error(const struct sbx_win_error *err)
{
    PyObject *exc, *step;
    char text[256];
    DWORD n;

    n = FormatMessageA(FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS, NULL,
                       (DWORD)err->code, 0, text, (DWORD)sizeof text, NULL);
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == '.'))
        text[--n] = 0;
    if (n == 0)
        snprintf(text, sizeof text, "Windows error %lu", (unsigned long)err->code);
    /* OSError(errno, strerror, filename, winerror): Python maps winerror
     * to errno and to the subclass (FileNotFoundError, PermissionError). */
    step = PyUnicode_FromString(err->step ? err->step : "?");
    if (step == NULL)
        return NULL;
    exc = PyObject_CallFunction(PyExc_OSError, "isOk", 0, text, step, (unsigned long)err->code);
    Py_DECREF(step);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* ---- the job capsule -------------------------------------------------- */

static void job_destroy(PyObject *capsule)
{
    struct sbx_job *job = PyCapsule_GetPointer(capsule, JOB_CAPSULE);

    if (job == NULL) {
        PyErr_Clear();
        return;
    }
    sbx_job_close(job);
    PyMem_Free(job);
}

static struct sbx_job *job_of(PyObject *capsule)
{
    struct sbx_job *job = PyCapsule_GetPointer(capsule, JOB_CAPSULE);

    if (job != NULL && job->job == NULL) {
        PyErr_SetString(PyExc_ValueError, "the job is closed");
        return NULL;
    }
    return job;
}

PyDoc_STRVAR(job_create_doc,
             "job_create(memory, pids, cpu_time_100ns, cpu_millicores) -> (job, cpu_rate, "
             "cpu_rate_error)\n\n"
             "A Job Object with these limits (0: none), KILL_ON_JOB_CLOSE,\n"
             "DIE_ON_UNHANDLED_EXCEPTION, no breakaway, and a completion port.\n"
             "cpu_rate: 0 not asked, 1 applied, -1 refused; cpu_rate_error:\n"
             "(step, winerror) of the refusal, else None (the other limits hold).");

static PyObject *core_job_create(PyObject *self, PyObject *args)
{
    struct sbx_job_limits limits;
    struct sbx_win_error err = {NULL, 0};
    struct sbx_job *job;
    unsigned long long memory, cpu_time;
    unsigned long pids, millicores;
    PyObject *capsule, *rate_error;

    (void)self;
    if (!PyArg_ParseTuple(args, "KkKk", &memory, &pids, &cpu_time, &millicores))
        return NULL;
    memset(&limits, 0, sizeof limits);
    limits.memory = memory;
    limits.pids = (uint32_t)pids;
    limits.cpu_time_100ns = cpu_time;
    limits.cpu_millicores = (uint32_t)millicores;
    job = PyMem_Malloc(sizeof *job);
    if (job == NULL)
        return PyErr_NoMemory();
    if (sbx_job_create(&limits, job, &err) < 0) {
        PyMem_Free(job);
        return win_error(&err);
    }
    capsule = PyCapsule_New(job, JOB_CAPSULE, job_destroy);
    if (capsule == NULL) {
        sbx_job_close(job);
        PyMem_Free(job);
        return NULL;
    }
    if (job->cpu_rate < 0)
        rate_error = Py_BuildValue("(sk)", job->cpu_rate_error.step,
                                   (unsigned long)job->cpu_rate_error.code);
    else
        rate_error = Py_NewRef(Py_None);
    if (rate_error == NULL) {
        Py_DECREF(capsule);
        return NULL;
    }
    return Py_BuildValue("(NiN)", capsule, job->cpu_rate, rate_error);
}

PyDoc_STRVAR(job_close_doc, "job_close(job)\n\n"
                            "Close the job and its port: every process left in it is killed.\n"
                            "Closing twice does nothing.");

static PyObject *core_job_close(PyObject *self, PyObject *capsule)
{
    struct sbx_job *job = PyCapsule_GetPointer(capsule, JOB_CAPSULE);

    (void)self;
    if (job == NULL)
        return NULL;
    sbx_job_close(job);
    Py_RETURN_NONE;
}

/* ---- the program ------------------------------------------------------- */

/* A handle from Python: None or -1 is none. */
static int handle_arg(PyObject *o, HANDLE *out)
{
    unsigned long long v;

    if (o == Py_None) {
        *out = NULL;
        return 1;
    }
    if (PyLong_Check(o) && PyLong_AsLongLong(o) == -1 && !PyErr_Occurred()) {
        *out = NULL;
        return 1;
    }
    PyErr_Clear();
    v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return 0;
    *out = (HANDLE)(uintptr_t)v;
    return 1;
}

/* A str, or None (NULL), as a wide string the caller frees with PyMem_Free. */
static int wide_arg(PyObject *o, wchar_t **out)
{
    *out = NULL;
    if (o == Py_None)
        return 1;
    *out = PyUnicode_AsWideCharString(o, NULL);
    return *out != NULL;
}

PyDoc_STRVAR(job_spawn_doc,
             "job_spawn(job, application, command_line, cwd, environment, stdin, stdout, "
             "stderr, handles, creation_flags, startup_flags=0, show_window=0, "
             "no_job_list=False)\n"
             "    -> (process_handle, thread_handle, pid, tid, how)\n\n"
             "Create the program inside the job (CreateProcessW), never running\n"
             "outside it.  application, cwd: str or None; command_line: str (as\n"
             "subprocess.list2cmdline makes it); environment: None (ours) or a\n"
             "block 'K=V\\0...\\0\\0'; stdin/stdout/stderr: inheritable handles or\n"
             "None; handles: more handles to inherit (only these and the three\n"
             "are inherited).  how: JOB_HOW_JOB_LIST or JOB_HOW_ASSIGN.  The two\n"
             "handles returned are the caller's to close.");

static PyObject *core_job_spawn(PyObject *self, PyObject *args)
{
    PyObject *capsule, *app_o, *cmd_o, *cwd_o, *env_o, *in_o, *out_o, *err_o, *handles_o;
    PyObject *seq = NULL, *ret = NULL;
    unsigned long flags, startup_flags = 0;
    unsigned short show_window = 0;
    int no_job_list = 0, rc;
    struct sbx_job *job;
    struct sbx_job_spawn s;
    struct sbx_job_child child;
    struct sbx_win_error err = {NULL, 0};
    wchar_t *app = NULL, *cmd = NULL, *cwd = NULL, *env = NULL;
    HANDLE *handles = NULL;
    Py_ssize_t i, n = 0;

    (void)self;
    if (!PyArg_ParseTuple(args, "OOUOOOOOOk|kHp", &capsule, &app_o, &cmd_o, &cwd_o, &env_o, &in_o,
                          &out_o, &err_o, &handles_o, &flags, &startup_flags, &show_window,
                          &no_job_list))
        return NULL;
    job = job_of(capsule);
    if (job == NULL)
        return NULL;
    memset(&s, 0, sizeof s);
    if (!handle_arg(in_o, &s.std_input) || !handle_arg(out_o, &s.std_output) ||
        !handle_arg(err_o, &s.std_error))
        return NULL;
    seq = PySequence_Fast(handles_o, "handles must be a sequence of handles");
    if (seq == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    if (n > 0) {
        handles = PyMem_New(HANDLE, (size_t)n);
        if (handles == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (i = 0; i < n; i++)
            if (!handle_arg(PySequence_Fast_GET_ITEM(seq, i), &handles[i]))
                goto done;
    }
    if (!wide_arg(app_o, &app) || !wide_arg(cmd_o, &cmd) || !wide_arg(cwd_o, &cwd))
        goto done;
    if (env_o != Py_None) {
        Py_ssize_t len;
        if (!PyUnicode_Check(env_o)) {
            PyErr_SetString(PyExc_TypeError, "environment must be a str block or None");
            goto done;
        }
        /* The block holds NULs: its length, not its first NUL, ends it. */
        env = PyUnicode_AsWideCharString(env_o, &len);
        if (env == NULL)
            goto done;
        if (len < 2 || env[len - 1] != 0 || env[len - 2] != 0) {
            PyErr_SetString(PyExc_ValueError, "an environment block ends with two NULs");
            goto done;
        }
    }
    s.application = app;
    s.command_line = cmd;
    s.cwd = cwd;
    s.environment = env;
    s.handles = handles;
    s.n_handles = (size_t)n;
    s.creation_flags = (uint32_t)flags;
    s.startup_flags = (uint32_t)startup_flags;
    s.show_window = (uint16_t)show_window;
    s.no_job_list = no_job_list;
    Py_BEGIN_ALLOW_THREADS
        rc = sbx_job_spawn(job, &s, &child, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        win_error(&err);
        goto done;
    }
    ret = Py_BuildValue("(KKkki)", (unsigned long long)(uintptr_t)child.process,
                        (unsigned long long)(uintptr_t)child.thread, (unsigned long)child.pid,
                        (unsigned long)child.tid, child.how);
    if (ret == NULL) { /* no Python object owns the child: end it */
        TerminateProcess(child.process, 1);
        CloseHandle(child.thread);
        CloseHandle(child.process);
    }
done:
    Py_XDECREF(seq);
    PyMem_Free(handles);
    PyMem_Free(app);
    PyMem_Free(cmd);
    PyMem_Free(cwd);
    PyMem_Free(env);
    return ret;
}

/* ---- what happened ----------------------------------------------------- */

PyDoc_STRVAR(job_next_event_doc, "job_next_event(job, timeout_ms) -> (msg, pid) or None\n\n"
                                 "The job's next completion message (JOB_MSG_*), waiting up to\n"
                                 "timeout_ms; None when none came in time.");

static PyObject *core_job_next_event(PyObject *self, PyObject *args)
{
    PyObject *capsule;
    unsigned long timeout;
    struct sbx_job *job;
    struct sbx_job_event ev;
    struct sbx_win_error err = {NULL, 0};
    int rc;

    (void)self;
    if (!PyArg_ParseTuple(args, "Ok", &capsule, &timeout))
        return NULL;
    job = job_of(capsule);
    if (job == NULL)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
        rc = sbx_job_next_event(job, (uint32_t)timeout, &ev, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return win_error(&err);
    if (rc == 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(kk)", (unsigned long)ev.msg, (unsigned long)ev.pid);
}

PyDoc_STRVAR(job_usage_doc,
             "job_usage(job) -> (user_100ns, kernel_100ns, total_processes, active_processes,\n"
             "    terminated_processes, read_bytes, write_bytes, other_bytes,\n"
             "    peak_job_memory, peak_process_memory)\n\n"
             "JobObjectBasicAndIoAccountingInformation and the memory peaks.");

static PyObject *core_job_usage(PyObject *self, PyObject *capsule)
{
    struct sbx_job *job = job_of(capsule);
    struct sbx_job_usage u;
    struct sbx_win_error err = {NULL, 0};

    (void)self;
    if (job == NULL)
        return NULL;
    if (sbx_job_usage(job, &u, &err) < 0)
        return win_error(&err);
    return Py_BuildValue("(KKkkkKKKKK)", (unsigned long long)u.user_100ns,
                         (unsigned long long)u.kernel_100ns, (unsigned long)u.total_processes,
                         (unsigned long)u.active_processes, (unsigned long)u.terminated_processes,
                         (unsigned long long)u.read_bytes, (unsigned long long)u.write_bytes,
                         (unsigned long long)u.other_bytes, (unsigned long long)u.peak_job_memory,
                         (unsigned long long)u.peak_process_memory);
}

PyDoc_STRVAR(job_cpu_time_reached_doc, "job_cpu_time_reached(job) -> bool\n\n"
                                       "Whether the job's user time reached its cpu_time limit.");

static PyObject *core_job_cpu_time_reached(PyObject *self, PyObject *capsule)
{
    struct sbx_job *job = job_of(capsule);
    struct sbx_win_error err = {NULL, 0};
    int rc;

    (void)self;
    if (job == NULL)
        return NULL;
    rc = sbx_job_cpu_time_reached(job, &err);
    if (rc < 0)
        return win_error(&err);
    return PyBool_FromLong(rc);
}

PyDoc_STRVAR(job_kill_doc, "job_kill(job, exit_code)\n\n"
                           "TerminateJobObject: every process of the job, at once.");

static PyObject *core_job_kill(PyObject *self, PyObject *args)
{
    PyObject *capsule;
    unsigned long code;
    struct sbx_job *job;
    struct sbx_win_error err = {NULL, 0};

    (void)self;
    if (!PyArg_ParseTuple(args, "Ok", &capsule, &code))
        return NULL;
    job = job_of(capsule);
    if (job == NULL)
        return NULL;
    if (sbx_job_kill(job, (uint32_t)code, &err) < 0)
        return win_error(&err);
    Py_RETURN_NONE;
}

/* ---- pure helpers ------------------------------------------------------ */

PyDoc_STRVAR(job_msg_name_doc, "job_msg_name(msg) -> str or None");

static PyObject *core_job_msg_name(PyObject *self, PyObject *arg)
{
    unsigned long msg = PyLong_AsUnsignedLong(arg);
    const char *name;

    (void)self;
    if (msg == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    name = sbx_job_msg_name((uint32_t)msg);
    if (name == NULL)
        Py_RETURN_NONE;
    return PyUnicode_FromString(name);
}

PyDoc_STRVAR(job_msg_reason_doc,
             "job_msg_reason(msg) -> str or None\n\n"
             "The Termination.reason a completion message means (memory, pids,\n"
             "cpu_time), or None.");

static PyObject *core_job_msg_reason(PyObject *self, PyObject *arg)
{
    unsigned long msg = PyLong_AsUnsignedLong(arg);
    const char *reason;

    (void)self;
    if (msg == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    reason = sbx_job_msg_reason((uint32_t)msg);
    if (reason == NULL)
        Py_RETURN_NONE;
    return PyUnicode_FromString(reason);
}

PyDoc_STRVAR(job_cpu_rate_doc, "job_cpu_rate(millicores, ncpu) -> int\n\n"
                               "CpuRate (1/100 of a percent of the machine) for millicores.");

static PyObject *core_job_cpu_rate(PyObject *self, PyObject *args)
{
    unsigned long millicores, ncpu;

    (void)self;
    if (!PyArg_ParseTuple(args, "kk", &millicores, &ncpu))
        return NULL;
    return PyLong_FromUnsignedLong(
        (unsigned long)sbx_job_cpu_rate((uint32_t)millicores, (uint32_t)ncpu));
}

static PyMethodDef core_methods[] = {
    {"job_create", core_job_create, METH_VARARGS, job_create_doc},
    {"job_close", core_job_close, METH_O, job_close_doc},
    {"job_spawn", core_job_spawn, METH_VARARGS, job_spawn_doc},
    {"job_next_event", core_job_next_event, METH_VARARGS, job_next_event_doc},
    {"job_usage", core_job_usage, METH_O, job_usage_doc},
    {"job_cpu_time_reached", core_job_cpu_time_reached, METH_O, job_cpu_time_reached_doc},
    {"job_kill", core_job_kill, METH_VARARGS, job_kill_doc},
    {"job_msg_name", core_job_msg_name, METH_O, job_msg_name_doc},
    {"job_msg_reason", core_job_msg_reason, METH_O, job_msg_reason_doc},
    {"job_cpu_rate", core_job_cpu_rate, METH_VARARGS, job_cpu_rate_doc},
    {NULL, NULL, 0, NULL},
};

/* sbxlimit.STEPS on Windows: the steps of the job layer, in the order
 * they run (an OSError's filename is one of them). */
static const char *const STEPS[] = {
    "none",
    "job:create",
    "job:limits",
    "job:port",
    "job:associate_port",
    "job:cpu_rate",
    "spawn:handle_list",
    "spawn:attribute_list",
    "spawn:job_list",
    "spawn:create_process",
    "spawn:assign",
    "spawn:resume",
    "job:wait_event",
    "job:query_accounting",
    "job:query_limits",
    "job:terminate",
};

static int core_exec(PyObject *m)
{
    PyObject *steps;
    size_t i, n = sizeof STEPS / sizeof STEPS[0];

    steps = PyTuple_New((Py_ssize_t)n);
    if (steps == NULL)
        return -1;
    for (i = 0; i < n; i++) {
        PyObject *name = PyUnicode_FromString(STEPS[i]);
        if (name == NULL) {
            Py_DECREF(steps);
            return -1;
        }
        PyTuple_SET_ITEM(steps, (Py_ssize_t)i, name);
    }
    if (PyModule_AddObject(m, "STEPS", steps) < 0) {
        Py_DECREF(steps);
        return -1;
    }
    if (PyModule_AddIntConstant(m, "HAS_JOB", 1) < 0 ||
        PyModule_AddIntConstant(m, "JOB_HOW_JOB_LIST", SBX_JOB_HOW_JOB_LIST) < 0 ||
        PyModule_AddIntConstant(m, "JOB_HOW_ASSIGN", SBX_JOB_HOW_ASSIGN) < 0 ||
        PyModule_AddIntConstant(m, "JOB_MSG_END_OF_JOB_TIME", JOB_OBJECT_MSG_END_OF_JOB_TIME) < 0 ||
        PyModule_AddIntConstant(m, "JOB_MSG_ACTIVE_PROCESS_LIMIT",
                                JOB_OBJECT_MSG_ACTIVE_PROCESS_LIMIT) < 0 ||
        PyModule_AddIntConstant(m, "JOB_MSG_ACTIVE_PROCESS_ZERO",
                                JOB_OBJECT_MSG_ACTIVE_PROCESS_ZERO) < 0 ||
        PyModule_AddIntConstant(m, "JOB_MSG_NEW_PROCESS", JOB_OBJECT_MSG_NEW_PROCESS) < 0 ||
        PyModule_AddIntConstant(m, "JOB_MSG_EXIT_PROCESS", JOB_OBJECT_MSG_EXIT_PROCESS) < 0 ||
        PyModule_AddIntConstant(m, "JOB_MSG_ABNORMAL_EXIT_PROCESS",
                                JOB_OBJECT_MSG_ABNORMAL_EXIT_PROCESS) < 0 ||
        PyModule_AddIntConstant(m, "JOB_MSG_JOB_MEMORY_LIMIT", JOB_OBJECT_MSG_JOB_MEMORY_LIMIT) < 0)
        return -1;
    return 0;
}

static PyModuleDef_Slot core_slots[] = {
    {Py_mod_exec, (void *)core_exec},
    {0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    "_core",
    "sbxlimit's C core on Windows: Job Objects (csrc/windows/).",
    0,
    core_methods,
    core_slots,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__core(void)
{
    return PyModuleDef_Init(&core_module);
}
