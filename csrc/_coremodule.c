/* _coremodule.c -- sbxlimit._core, the only file that includes Python.h.
 *
 * Converts Python arguments into a struct sbx_spec (all allocation happens
 * here, in the parent), releases the GIL around the spawn, and hands child
 * errors back as data: the Python layer (sbxlimit/_spawn.py) is the one
 * place that turns them into exceptions.  Functions raise only OSError
 * naming the system call, as psutil does.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sbx.h"
#include "darwin/seatbelt.h"
#ifdef __APPLE__
#include "darwin/seatbelt_apply.h"
#endif

/* Everything a spec points into, freed in one place. */
struct spec_storage {
    PyObject *keep; /* list of bytes objects the char* point into */
    char **exec_paths;
    char **argv;
    char **envp;
    int *keep_fds;
    int *cgroup_procs;
    gid_t *groups;
    struct sbx_rlimit *rlimits;
    struct sbx_view *view;
};

static void storage_free(struct spec_storage *st)
{
    Py_CLEAR(st->keep);
    PyMem_Free(st->exec_paths);
    PyMem_Free(st->argv);
    PyMem_Free(st->envp);
    PyMem_Free(st->keep_fds);
    PyMem_Free(st->cgroup_procs);
    PyMem_Free(st->groups);
    PyMem_Free(st->rlimits);
    PyMem_Free(st->view);
}

/* PySequence_Fast(seq) into *fast and a zeroed array of one element more
 * than it holds, each `size` bytes; NULL with an exception set (*fast
 * released). */
static void *fast_array(PyObject *seq, const char *what, size_t size, PyObject **fast,
                        Py_ssize_t *n)
{
    void *out;

    *fast = PySequence_Fast(seq, what);
    if (!*fast)
        return NULL;
    *n = PySequence_Fast_GET_SIZE(*fast);
    out = PyMem_Calloc((size_t)*n + 1, size);
    if (!out) {
        Py_CLEAR(*fast);
        PyErr_NoMemory();
    }
    return out;
}

/* A NULL-terminated char* array from a sequence of path-likes; the bytes
 * objects the pointers point into are appended to keep. */
static char **to_cstrings_keep(PyObject *seq, const char *what, PyObject *keep, size_t *n_out)
{
    PyObject *fast;
    Py_ssize_t i, n;
    char **out = fast_array(seq, what, sizeof *out, &fast, &n);

    if (!out)
        return NULL;
    for (i = 0; i < n; i++) {
        PyObject *b = NULL;
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(fast, i), &b))
            goto fail;
        if (PyList_Append(keep, b) < 0) {
            Py_DECREF(b);
            goto fail;
        }
        out[i] = PyBytes_AS_STRING(b);
        Py_DECREF(b); /* keep holds it */
    }
    Py_DECREF(fast);
    if (n_out)
        *n_out = (size_t)n;
    return out;
fail:
    Py_DECREF(fast);
    PyMem_Free(out);
    return NULL;
}

static char **to_cstrings(PyObject *seq, const char *what, struct spec_storage *st, size_t *n_out)
{
    return to_cstrings_keep(seq, what, st->keep, n_out);
}

static int to_ints(PyObject *seq, const char *what, int **out, size_t *n_out)
{
    PyObject *fast = PySequence_Fast(seq, what);
    Py_ssize_t i, n;

    if (!fast)
        return -1;
    n = PySequence_Fast_GET_SIZE(fast);
    *out = PyMem_Calloc((size_t)n + 1, sizeof **out);
    if (!*out) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (i = 0; i < n; i++) {
        long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
        if (v < INT_MIN || v > INT_MAX) {
            Py_DECREF(fast);
            PyErr_Format(PyExc_OverflowError, "%s: value out of range", what);
            return -1;
        }
        (*out)[i] = (int)v;
    }
    Py_DECREF(fast);
    *n_out = (size_t)n;
    return 0;
}

/* A uid or gid over the whole uid_t/gid_t range, as CPython's converters
 * take it: -1 (or the type's all-ones value) means "unchanged". */
static int to_id(PyObject *o, const char *what, long long *out)
{
    long long v = PyLong_AsLongLong(o);

    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < -1) {
        PyErr_Format(PyExc_OverflowError, "%s is less than minimum", what);
        return -1;
    }
    if (v > (long long)(uint32_t)-1) {
        PyErr_Format(PyExc_OverflowError, "%s is greater than maximum", what);
        return -1;
    }
    *out = v == (long long)(uint32_t)-1 ? -1 : v;
    return 0;
}

/* Supplementary groups as gid_t, over the whole range (setgroups refuses
 * (gid_t)-1 itself, as it does for subprocess). */
static int to_gids(PyObject *seq, gid_t **out, size_t *n_out)
{
    PyObject *fast = PySequence_Fast(seq, "groups must be a sequence");
    Py_ssize_t i, n;

    if (!fast)
        return -1;
    n = PySequence_Fast_GET_SIZE(fast);
    *out = PyMem_Calloc((size_t)n + 1, sizeof **out);
    if (!*out) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (i = 0; i < n; i++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));

        if (v == -1 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
                Py_DECREF(fast);
                return -1;
            }
            PyErr_Clear(); /* past long long: out of range as any other */
            v = -2;
        }
        if (v < 0 || v > (long long)(uint32_t)-1) {
            Py_DECREF(fast);
            PyErr_SetString(PyExc_ValueError, "invalid group id");
            return -1;
        }
        (*out)[i] = (gid_t)v;
    }
    Py_DECREF(fast);
    *n_out = (size_t)n;
    return 0;
}

static int to_u64_limit(PyObject *o, uint64_t *out)
{
    long long v;

    if (o == Py_None) {
        *out = SBX_RLIM_INF;
        return 0;
    }
    v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = v < 0 ? SBX_RLIM_INF : (uint64_t)v;
    return 0;
}

static int to_rlimits(PyObject *seq, struct spec_storage *st, size_t *n_out)
{
    PyObject *fast = PySequence_Fast(seq, "rlimits must be a sequence");
    Py_ssize_t i, n;

    if (!fast)
        return -1;
    n = PySequence_Fast_GET_SIZE(fast);
    st->rlimits = PyMem_Calloc((size_t)n + 1, sizeof *st->rlimits);
    if (!st->rlimits) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        PyObject *soft, *hard;
        int resource;

        if (!PyArg_ParseTuple(item, "iOO;rlimits items are (resource, soft, hard)", &resource,
                              &soft, &hard))
            goto fail;
        if (sbx_rlimit_step(resource) == SBX_STEP_NONE) {
            PyErr_Format(PyExc_ValueError, "rlimit resource %d is not handled by the core",
                         resource);
            goto fail;
        }
        st->rlimits[i].resource = resource;
        if (to_u64_limit(soft, &st->rlimits[i].soft) < 0 ||
            to_u64_limit(hard, &st->rlimits[i].hard) < 0)
            goto fail;
    }
    Py_DECREF(fast);
    *n_out = (size_t)n;
    return 0;
fail:
    Py_DECREF(fast);
    return -1;
}

/* The read-only view's entries: (kind, path, data) tuples of an int and two
 * bytes (b"" for no data); the pointers are borrowed from the tuples, which
 * st->keep keeps alive (with the sequence that holds them). */
static int to_view(PyObject *seq, struct spec_storage *st, size_t *n_out)
{
    PyObject *fast = PySequence_Fast(seq, "view must be a sequence");
    Py_ssize_t i, n, rw = 0;

    if (!fast)
        return -1;
    if (PyList_Append(st->keep, fast) < 0) {
        Py_DECREF(fast);
        return -1;
    }
    n = PySequence_Fast_GET_SIZE(fast);
    st->view = PyMem_Calloc((size_t)n + 1, sizeof *st->view);
    if (!st->view) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (i = 0; i < n; i++) {
        struct sbx_view *v = &st->view[i];
        Py_ssize_t plen, dlen;

        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i),
                              "iy#y#;view items are (kind, path, data)", &v->kind, &v->path, &plen,
                              &v->data, &dlen))
            goto fail;
        if (v->kind < SBX_VIEW_RW || v->kind > SBX_VIEW_RO_MOUNT || plen == 0 ||
            strlen(v->path) != (size_t)plen || strlen(v->data) != (size_t)dlen) {
            PyErr_SetString(PyExc_ValueError, "view: bad kind, or an empty path or a NUL byte");
            goto fail;
        }
        if (v->kind == SBX_VIEW_RW || v->kind == SBX_VIEW_RW_DEV)
            rw++;
        if (!dlen)
            v->data = NULL;
    }
    if (rw > SBX_VIEW_MAX_RW) {
        PyErr_Format(PyExc_ValueError, "view: at most %d writable trees", SBX_VIEW_MAX_RW);
        goto fail;
    }
    Py_DECREF(fast);
    *n_out = (size_t)n;
    return 0;
fail:
    Py_DECREF(fast);
    return -1;
}

/* Runs in a fork()ed child only (a preexec hook disables vfork). */
static int preexec_hook(void *arg)
{
    PyObject *r;

    PyOS_AfterFork_Child();
    r = PyObject_CallNoArgs((PyObject *)arg);
    if (!r)
        return -1;
    Py_DECREF(r);
    return 0;
}

PyDoc_STRVAR(spawn_doc,
             "spawn(exec_paths, argv, envp, cwd, stdin, stdout, stderr, close_fds,\n"
             "      keep_fds, close_after, restore_signals, new_session, pgid, groups,\n"
             "      gid, uid, umask, rlimits, pdeathsig, no_new_privs, drop_caps, caps_keep,\n"
             "      seccomp, seccomp_guard, landlock_fd,\n"
             "      ns, cgroup_dirfd,\n"
             "      cgroup_procs, preexec_fn, fail_step, fail_errno, /)\n"
             "--\n\n"
             "Start a child as described and wait until it has exec'd or failed.\n"
             "exec_paths None: fork, set up, and return (0, None, 0, MNT_NS_ASK) in\n"
             "the child.  The fds in close_after are closed before returning, in\n"
             "every case.  Returns (pid, None, how, mnt_ns), or (pid, (step, errno,\n"
             "detail, wait_status), how, MNT_NS_ASK) when the child failed at `step`\n"
             "(it is reaped by then); how is the HOW_* bit set of the clone that made\n"
             "it.  mnt_ns, for a child with a mount namespace of its own: an fd\n"
             "holding that namespace (the caller's to close), -1 if the child is\n"
             "gone already, MNT_NS_ASK if the caller must open /proc/<pid>/ns/mnt.\n"
             "Raises OSError only\n"
             "for parent-side failures (pipe, clone).  Positional for speed: this is\n"
             "the hot path; sbxlimit/_core.pyi names every argument.");

static void close_all(const int *fds, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

/* SIGKILL to a child just made (and to the group it leads), then its
 * reap; the exception that interrupted its making is already set. */
static void abandon_child(pid_t pid, int leads_group)
{
    int r;

    if (leads_group)
        (void)kill(-pid, SIGKILL);
    (void)kill(pid, SIGKILL);
    Py_BEGIN_ALLOW_THREADS
        do {
            r = (int)waitpid(pid, NULL, 0);
        } while (r < 0 && errno == EINTR);
    Py_END_ALLOW_THREADS
}

static PyObject *core_spawn(PyObject *self, PyObject *args)
{
    PyObject *exec_paths, *argv, *envp, *cwd, *keep_fds, *close_after, *groups, *rlimits;
    PyObject *cgroup_procs, *ns, *gid_o, *uid_o;
    PyObject *preexec_fn;
    PyObject *cwd_bytes = NULL, *result = NULL;
    int fd_in, fd_out, fd_err, close_fds, restore_signals, new_session, no_new_privs;
    int pgid, umask_, pdeathsig, fail_step, fail_errno, cgroup_dirfd, seccomp, seccomp_guard;
    int landlock_fd;
    int drop_caps;
    unsigned long long caps_keep;
    uint64_t filter[SBX_SECCOMP_MAX]; /* struct sock_filter is 8 bytes */
    long long gid = -1, uid = -1;
    int *closing = NULL;
    size_t n_closing = 0;
    struct spec_storage st;
    struct sbx_spec spec;
    struct sbx_child child;
    struct sbx_child_error cerr;
    size_t n;
    int rc, status = 0, saved_errno;

    (void)self;
    memset(&st, 0, sizeof st);
    memset(&spec, 0, sizeof spec);
    if (!PyArg_ParseTuple(args, "OOOOiiipOOppiOOOiOipiKiiiOiOOii:spawn", &exec_paths, &argv, &envp,
                          &cwd, &fd_in, &fd_out, &fd_err, &close_fds, &keep_fds, &close_after,
                          &restore_signals, &new_session, &pgid, &groups, &gid_o, &uid_o, &umask_,
                          &rlimits, &pdeathsig, &no_new_privs, &drop_caps, &caps_keep, &seccomp,
                          &seccomp_guard, &landlock_fd, &ns, &cgroup_dirfd, &cgroup_procs,
                          &preexec_fn, &fail_step, &fail_errno))
        return NULL;
    /* Take charge of close_after first: from here on they are closed on
     * every path. */
    if (to_ints(close_after, "close_after must be a sequence", &closing, &n_closing) < 0) {
        PyMem_Free(closing);
        return NULL;
    }
    if (preexec_fn != Py_None && !PyCallable_Check(preexec_fn)) {
        PyErr_SetString(PyExc_TypeError, "preexec_fn must be callable or None");
        goto done;
    }
    if (fail_step < 0 || fail_step >= SBX_STEP__COUNT) {
        PyErr_SetString(PyExc_ValueError, "fail_step out of range");
        goto done;
    }

    st.keep = PyList_New(0);
    if (!st.keep)
        goto done;
    if (exec_paths == Py_None) {
        /* fork_only: the child returns here after the setup steps. */
        if (preexec_fn != Py_None) {
            PyErr_SetString(PyExc_ValueError, "preexec_fn needs a program to exec");
            goto done;
        }
        spec.fork_only = 1;
    } else {
        st.exec_paths = to_cstrings(exec_paths, "exec_paths must be a sequence", &st, &n);
        if (!st.exec_paths)
            goto done;
        if (n == 0) {
            PyErr_SetString(PyExc_ValueError, "exec_paths is empty");
            goto done;
        }
        spec.exec_paths = (const char *const *)st.exec_paths;
        spec.n_exec_paths = n;
    }
    st.argv = to_cstrings(argv, "argv must be a sequence", &st, NULL);
    if (!st.argv)
        goto done;
    spec.argv = st.argv;
    if (envp != Py_None) {
        st.envp = to_cstrings(envp, "envp must be a sequence", &st, NULL);
        if (!st.envp)
            goto done;
        spec.envp = st.envp;
    }
    if (cwd != Py_None) {
        if (!PyUnicode_FSConverter(cwd, &cwd_bytes))
            goto done;
        spec.cwd = PyBytes_AS_STRING(cwd_bytes);
    }
    if (to_ints(keep_fds, "keep_fds must be a sequence", &st.keep_fds, &spec.n_keep_fds) < 0)
        goto done;
    for (n = 0; n < spec.n_keep_fds; n++) {
        if (st.keep_fds[n] < 0 || (n > 0 && st.keep_fds[n] <= st.keep_fds[n - 1])) {
            PyErr_SetString(PyExc_ValueError, "keep_fds must be sorted, unique, non-negative");
            goto done;
        }
    }
    spec.keep_fds = st.keep_fds;
    if (to_ints(cgroup_procs, "cgroup_procs must be a sequence", &st.cgroup_procs,
                &spec.n_cgroup_procs) < 0)
        goto done;
    spec.cgroup_procs = st.cgroup_procs;
    spec.cgroup_dirfd = cgroup_dirfd;
    if (cgroup_dirfd >= 0 && spec.n_cgroup_procs == 0) {
        PyErr_SetString(PyExc_ValueError, "cgroup_dirfd needs its cgroup.procs in cgroup_procs[0]");
        goto done;
    }
    if (groups != Py_None) {
        if (to_gids(groups, &st.groups, &spec.n_groups) < 0)
            goto done;
        spec.groups = st.groups;
        spec.set_groups = 1;
    }
    if (to_id(gid_o, "gid", &gid) < 0 || to_id(uid_o, "uid", &uid) < 0)
        goto done;
    if (to_rlimits(rlimits, &st, &spec.n_rlimits) < 0)
        goto done;
    spec.rlimits = st.rlimits;

    spec.fd_stdin = fd_in;
    spec.fd_stdout = fd_out;
    spec.fd_stderr = fd_err;
    spec.close_fds = close_fds;
    spec.restore_signals = restore_signals;
    spec.new_session = new_session;
    spec.pgid = (pid_t)pgid;
    spec.gid = (long)gid;
    spec.uid = (long)uid;
    spec.umask = umask_;
    spec.pdeathsig = pdeathsig;
    spec.parent_pid = getpid();
    spec.no_new_privs = no_new_privs;
    spec.drop_caps = drop_caps;
    spec.caps_keep = caps_keep;
    spec.landlock_fd = landlock_fd;
    spec.tmpfs_sock = -1;
    spec.ns_status_fd = -1;
    spec.ns_netns_fd = spec.ns_ipcns_fd = spec.view_dev_fd = spec.view_ns_fd = -1;
    if (ns != Py_None) {
        /* (flags, uid_map, gid_map, loopback, tmpfs_path, tmpfs_opts,
         * tmpfs_mkdir, tmpfs_sock, tmpfs_landlock, view, view_ro_root, view_dev,
         * status_fd, reaper, netns_fd, ipcns_fd, proxy_port, view_dev_fd,
         * view_ns_fd):
         * bytes, b"" for none; view: ((kind, path, data), ...).  The
         * pointers are borrowed from `args`, alive until we return. */
        const char *tp, *to, *tm;
        unsigned long long ll = 0;
        PyObject *view;

        const char *reaper;

        if (!PyArg_ParseTuple(ns,
                              "iyypyyyiKOppiyiiiii;ns is (flags, uid_map, gid_map, loopback, "
                              "tmpfs_path, tmpfs_opts, tmpfs_mkdir, tmpfs_sock, "
                              "tmpfs_landlock, view, view_ro_root, view_dev, status_fd, reaper, "
                              "netns_fd, ipcns_fd, proxy_port, view_dev_fd, view_ns_fd)",
                              &spec.ns_flags, &spec.uid_map, &spec.gid_map, &spec.ns_loopback, &tp,
                              &to, &tm, &spec.tmpfs_sock, &ll, &view, &spec.view_ro_root,
                              &spec.view_dev, &spec.ns_status_fd, &reaper, &spec.ns_netns_fd,
                              &spec.ns_ipcns_fd, &spec.proxy_port, &spec.view_dev_fd,
                              &spec.view_ns_fd))
            goto done;
        spec.ns_reaper = *reaper ? reaper : NULL;
        spec.ns_join_net = spec.ns_netns_fd >= 0;
        spec.ns_join_ipc = spec.ns_ipcns_fd >= 0;
        if (to_view(view, &st, &spec.n_view) < 0)
            goto done;
        spec.view = st.view;
        spec.tmpfs_landlock = ll;
        spec.tmpfs_path = *tp ? tp : NULL;
        spec.tmpfs_opts = *to ? to : NULL;
        spec.tmpfs_mkdir = *tm ? tm : NULL;
        if (!*spec.uid_map)
            spec.uid_map = spec.gid_map = NULL;
        if (spec.fork_only && (spec.ns_flags & SBX_CLONE_NEWPID)) {
            PyErr_SetString(PyExc_ValueError, "a PID namespace needs a program to exec");
            goto done;
        }
    }
    if (seccomp) {
        int brc = sbx_seccomp_build(filter, SBX_SECCOMP_MAX, &spec.n_seccomp, seccomp,
                                    (int)getpid(), (int)getpgrp(), seccomp_guard);

        if (brc < 0) {
            errno = -brc;
            PyErr_SetFromErrnoWithFilename(PyExc_OSError, "seccomp filter");
            goto done;
        }
        spec.seccomp = filter;
    }
    spec.fail_step = fail_step;
    spec.fail_errno = fail_errno;

    if (!spec.fork_only && preexec_fn == Py_None) {
        /* The calling thread is suspended until exec: let others run. */
        Py_BEGIN_ALLOW_THREADS
            rc = sbx_spawn_start(&spec, &child);
            if (rc == 0)
                rc = sbx_spawn_finish(&child, &cerr, &status);
            saved_errno = errno;
        Py_END_ALLOW_THREADS
    } else {
        /* Python runs in the child (preexec_fn, or the caller's code after
         * a fork_only setup): fork with the GIL held, as _posixsubprocess
         * does, and let the runtime prepare for it. */
        if (!spec.fork_only) {
            spec.hook = preexec_hook;
            spec.hook_arg = preexec_fn;
        }
        PyOS_BeforeFork();
        rc = sbx_spawn_start(&spec, &child);
        saved_errno = errno;
        if (rc == 0 && child.pid == 0) { /* fork_only: we are the child */
            PyOS_AfterFork_Child();
            result = Py_BuildValue("(iOii)", 0, Py_None, 0, SBX_MNT_NS_ASK);
            goto done;
        }
        PyOS_AfterFork_Parent();
        if (rc == 0) {
            Py_BEGIN_ALLOW_THREADS
                rc = sbx_spawn_finish(&child, &cerr, &status);
                saved_errno = errno;
            Py_END_ALLOW_THREADS
        }
    }
    close_all(closing, n_closing);
    n_closing = 0;
    if (rc < 0) {
        errno = saved_errno;
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, "sbx_spawn");
        goto done;
    }
    if (rc == 0 && PyErr_CheckSignals() < 0) {
        /* The caller was interrupted while the child was made, where a
         * Ctrl-C lands more than anywhere: the eval breaker would raise
         * right after this call and drop its result, the child's pid,
         * with the stack; nobody could end or reap it.  End it here (and
         * the group it leads), reap it, and let the exception go up. */
        if (child.mnt_ns >= 0)
            close(child.mnt_ns);
        abandon_child(child.pid, pgid == 0 || new_session);
        goto done;
    }
    if (rc == 0) {
        result = Py_BuildValue("(iOii)", (int)child.pid, Py_None, child.how, child.mnt_ns);
        if (result == NULL && child.mnt_ns >= 0)
            close(child.mnt_ns);
    } else {
        result =
            Py_BuildValue("(i(siLi)ii)", (int)child.pid,
                          sbx_step_name(cerr.step) ? sbx_step_name(cerr.step) : "none",
                          (int)cerr.err, (long long)cerr.detail, status, child.how, SBX_MNT_NS_ASK);
    }
done:
    close_all(closing, n_closing);
    PyMem_Free(closing);
    Py_XDECREF(cwd_bytes);
    storage_free(&st);
    return result;
}

PyDoc_STRVAR(tree_sample_doc,
             "tree_sample(pid, skip_root=False, cache=None) -> (memory, tasks, procs, cpu_user,\n"
             "                                                  cpu_system, root_alive)\n"
             "--\n\n"
             "Sample the process tree rooted at pid: anonymous+shmem resident+swap\n"
             "bytes and threads summed, processes, CPU seconds of the live processes\n"
             "and the children they reaped.  skip_root: the root's own memory and\n"
             "tasks are not counted (a PID namespace's reaper).  cache: a zeroed\n"
             "bytearray of TREE_CACHE_SIZE bytes kept between samples of this tree;\n"
             "while nothing in the tree has run, the last figures are reused.");

static PyObject *core_tree_sample(PyObject *self, PyObject *args)
{
    struct sbx_tree_sample s;
    int pid, skip_root = 0, rc;
    PyObject *cache_obj = Py_None;
    Py_buffer cache = {0};

    (void)self;
    if (!PyArg_ParseTuple(args, "i|pO:tree_sample", &pid, &skip_root, &cache_obj))
        return NULL;
    if (cache_obj != Py_None) {
        if (PyObject_GetBuffer(cache_obj, &cache, PyBUF_WRITABLE) < 0)
            return NULL;
        if (cache.len != (Py_ssize_t)sizeof(struct sbx_tree_cache)) {
            PyBuffer_Release(&cache);
            PyErr_SetString(PyExc_ValueError, "tree_sample: cache must be TREE_CACHE_SIZE bytes");
            return NULL;
        }
    }
    Py_BEGIN_ALLOW_THREADS
        if (cache.buf)
            rc = sbx_tree_sample_cached((pid_t)pid, skip_root, (struct sbx_tree_cache *)cache.buf,
                                        &s);
        else
            rc = sbx_tree_sample((pid_t)pid, skip_root, &s);
    Py_END_ALLOW_THREADS
    if (cache.buf)
        PyBuffer_Release(&cache);
    if (rc < 0)
        return PyErr_SetFromErrnoWithFilename(PyExc_OSError, "sbx_tree_sample");
    return Py_BuildValue("(KIIddO)", (unsigned long long)s.memory, (unsigned)s.tasks,
                         (unsigned)s.procs, s.cpu_user, s.cpu_system,
                         s.root_alive ? Py_True : Py_False);
}

PyDoc_STRVAR(tree_sample_many_doc,
             "tree_sample_many(trees) -> list\n"
             "--\n\n"
             "tree_sample(pid, skip_root, cache) for each (pid, skip_root, cache) of\n"
             "trees, in one call: a tuple as tree_sample's, None where the cache\n"
             "answered (nothing in the tree ran: the last figures stand), or the\n"
             "errno where the tree could not be read.");

static PyObject *core_tree_sample_many(PyObject *self, PyObject *trees)
{
    PyObject *seq, *out;
    Py_ssize_t i, n;

    (void)self;
    seq = PySequence_Fast(trees, "tree_sample_many: a sequence of (pid, skip_root, cache)");
    if (!seq)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    out = PyList_New(n);
    if (!out) {
        Py_DECREF(seq);
        return NULL;
    }
    for (i = 0; i < n; i++) {
        struct sbx_tree_sample s;
        Py_buffer cache;
        PyObject *item;
        int pid, skip_root, rc, err;

        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "ipw*:tree_sample_many", &pid,
                              &skip_root, &cache))
            goto fail;
        if (cache.len != (Py_ssize_t)sizeof(struct sbx_tree_cache)) {
            PyBuffer_Release(&cache);
            PyErr_SetString(PyExc_ValueError,
                            "tree_sample_many: cache must be TREE_CACHE_SIZE bytes");
            goto fail;
        }
        Py_BEGIN_ALLOW_THREADS
            rc = sbx_tree_sample_cached((pid_t)pid, skip_root, (struct sbx_tree_cache *)cache.buf,
                                        &s);
            err = errno;
        Py_END_ALLOW_THREADS
        PyBuffer_Release(&cache);
        if (rc < 0)
            item = PyLong_FromLong(err);
        else if (rc == 1)
            item = Py_NewRef(Py_None);
        else
            item = Py_BuildValue("(KIIddO)", (unsigned long long)s.memory, (unsigned)s.tasks,
                                 (unsigned)s.procs, s.cpu_user, s.cpu_system,
                                 s.root_alive ? Py_True : Py_False);
        if (!item)
            goto fail;
        PyList_SET_ITEM(out, i, item);
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_DECREF(seq);
    Py_DECREF(out);
    return NULL;
}

PyDoc_STRVAR(ns_make_doc, "ns_make(kind) -> int\n"
                          "--\n\n"
                          "A new namespace of kind CLONE_NEWNET (lo up) or CLONE_NEWIPC, as an\n"
                          "fd (close-on-exec) for a child to join; made by a short-lived\n"
                          "thread of its own.");

static PyObject *core_ns_make(PyObject *self, PyObject *arg)
{
    long kind = PyLong_AsLong(arg);
    int fd;

    (void)self;
    if (kind == -1 && PyErr_Occurred())
        return NULL;
    if (kind != (int)kind)
        kind = 0; /* refused below, as any other kind */
    Py_BEGIN_ALLOW_THREADS
        fd = sbx_ns_make((int)kind);
    Py_END_ALLOW_THREADS
    if (fd < 0)
        return PyErr_SetFromErrnoWithFilename(PyExc_OSError, "sbx_ns_make");
    return PyLong_FromLong(fd);
}

PyDoc_STRVAR(dev_template_doc,
             "dev_template() -> int\n"
             "--\n\n"
             "The private /dev of a view, built once as a detached mount (an fd,\n"
             "close-on-exec) for children to clone: the ns tuple's view_dev_fd.");

static PyObject *core_dev_template(PyObject *self, PyObject *unused)
{
    int fd;

    (void)self;
    (void)unused;
    Py_BEGIN_ALLOW_THREADS
        fd = sbx_ns_dev_template();
    Py_END_ALLOW_THREADS
    if (fd < 0)
        return PyErr_SetFromErrnoWithFilename(PyExc_OSError, "sbx_ns_dev_template");
    return PyLong_FromLong(fd);
}

PyDoc_STRVAR(view_ns_doc,
             "view_ns(view, view_ro_root, dev_fd, /)\n"
             "    -> tuple[int, tuple[int, ...], tuple[int, int, int], tuple[int, int, int]]\n"
             "--\n\n"
             "The read-only view made once, in a mount namespace of its own (an fd,\n"
             "close-on-exec) for children to join and copy: the ns tuple's\n"
             "view_ns_fd.  view: the entries (no private tmpfs); dev_fd: a\n"
             "dev_template() to clone onto /dev, or -1.  Returns the fd, the\n"
             "indexes of the entries that were not there, and what the caller's \"/\"\n"
             "and mount namespace were (for views_stale).  OSError EXDEV: the\n"
             "caller is chrooted (a child that joins starts at the namespace's root).");

static PyObject *core_view_ns(PyObject *self, PyObject *args)
{
    struct spec_storage st;
    PyObject *view, *out = NULL, *missing_out = NULL;
    unsigned char *missing = NULL;
    uint64_t root[3] = {0, 0, 0}, ns[3] = {0, 0, 0};
    size_t i, n = 0, k = 0;
    int ro_root, dev_fd, fd;

    (void)self;
    memset(&st, 0, sizeof st);
    if (!PyArg_ParseTuple(args, "Opi:view_ns", &view, &ro_root, &dev_fd))
        return NULL;
    st.keep = PyList_New(0);
    if (!st.keep || to_view(view, &st, &n) < 0)
        goto done;
    missing = PyMem_Calloc(n + 1, 1);
    if (!missing) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
        fd = sbx_ns_view_ns(st.view, n, ro_root, dev_fd, missing, root, ns);
    Py_END_ALLOW_THREADS
    if (fd < 0) {
        errno = -fd;
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, "sbx_ns_view_ns");
        goto done;
    }
    for (i = 0; i < n; i++)
        k += missing[i];
    missing_out = PyTuple_New((Py_ssize_t)k);
    if (!missing_out) {
        close(fd);
        goto done;
    }
    for (i = 0, k = 0; i < n; i++) {
        if (!missing[i])
            continue;
        PyObject *x = PyLong_FromSize_t(i);

        if (!x) {
            close(fd);
            goto done;
        }
        PyTuple_SET_ITEM(missing_out, (Py_ssize_t)k++, x);
    }
    out = Py_BuildValue("(iO(KKK)(KKK))", fd, missing_out, (unsigned long long)root[0],
                        (unsigned long long)root[1], (unsigned long long)root[2],
                        (unsigned long long)ns[0], (unsigned long long)ns[1],
                        (unsigned long long)ns[2]);
    if (!out)
        close(fd);
done:
    Py_XDECREF(missing_out);
    PyMem_Free(missing);
    storage_free(&st);
    return out;
}

PyDoc_STRVAR(caller_place_doc,
             "caller_place() -> tuple[int, ...] | None\n"
             "--\n\n"
             "Where the calling thread resolves paths: (device, inode, mount id)\n"
             "of its \"/\" (a mount namespace of its own, or a chroot, has another\n"
             "mount id or inode there), and of its mount namespace where the\n"
             "kernel gives no mount id; None where it cannot say.  A path\n"
             "resolved in one place may lead elsewhere in another: resolutions\n"
             "are kept per place.");

static PyObject *core_caller_place(PyObject *self, PyObject *noargs)
{
    uint64_t root[3], ns[3];

    (void)self;
    (void)noargs;
    if (sbx_path_ident("/", root) < 0)
        Py_RETURN_NONE;
    if (root[2] != 0) /* mount ids are unique across namespaces */
        return Py_BuildValue("(KKK)", (unsigned long long)root[0], (unsigned long long)root[1],
                             (unsigned long long)root[2]);
    if (sbx_path_ident("/proc/thread-self/ns/mnt", ns) < 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(KKKKK)", (unsigned long long)root[0], (unsigned long long)root[1],
                         (unsigned long long)ns[0], (unsigned long long)ns[1],
                         (unsigned long long)ns[2]);
}

PyDoc_STRVAR(views_stale_doc,
             "views_stale(mounts_fd, watch_fd, root, mount_ns, /) -> bool\n"
             "--\n\n"
             "Whether the views kept (_viewns) may no longer be this thread's: the\n"
             "mount table mounts_fd (an open /proc/thread-self/mountinfo) shows\n"
             "changed, an event is queued on the inotify fd watch_fd (drained), or\n"
             "\"/\" or the mount namespace is no longer what view_ns() said.  No\n"
             "wait, and the GIL is kept: a few system calls.");

static int to_ident(PyObject *t, uint64_t ident[3])
{
    unsigned long long a, b, c;

    if (!PyArg_ParseTuple(t, "KKK", &a, &b, &c))
        return -1;
    ident[0] = a;
    ident[1] = b;
    ident[2] = c;
    return 0;
}

static PyObject *core_views_stale(PyObject *self, PyObject *args)
{
    PyObject *root_t, *ns_t;
    uint64_t root[3], ns[3];
    int mounts_fd, watch_fd;

    (void)self;
    if (!PyArg_ParseTuple(args, "iiOO:views_stale", &mounts_fd, &watch_fd, &root_t, &ns_t) ||
        to_ident(root_t, root) < 0 || to_ident(ns_t, ns) < 0)
        return NULL;
    return PyBool_FromLong(sbx_views_stale(mounts_fd, watch_fd, root, ns));
}

PyDoc_STRVAR(tree_signal_doc, "tree_signal(pid, sig, pgid) -> int\n"
                              "--\n\n"
                              "Signal the tree rooted at pid and, when pgid > 0, that process\n"
                              "group.  SIGKILL stops the tree first so a fork loop cannot\n"
                              "outrun it.  Returns how many processes were signalled.");

static PyObject *core_tree_signal(PyObject *self, PyObject *args)
{
    int pid, sig, pgid, rc;

    (void)self;
    if (!PyArg_ParseTuple(args, "iii:tree_signal", &pid, &sig, &pgid))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
        rc = sbx_tree_signal((pid_t)pid, sig, (pid_t)pgid);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return PyErr_SetFromErrnoWithFilename(PyExc_OSError, "sbx_tree_signal");
    return PyLong_FromLong(rc);
}

PyDoc_STRVAR(probe_doc, "probe(kind, arg=0, timeout_ms=1000) -> int\n"
                        "--\n\n"
                        "Try a mechanism for real (see PROBE_* constants); 0 when it works,\n"
                        "else the errno it failed with.  Side effects stay in a short-lived\n"
                        "child.");

static PyObject *core_probe(PyObject *self, PyObject *args)
{
    int kind, timeout_ms = 1000, rc;
    long arg = 0;

    (void)self;
    if (!PyArg_ParseTuple(args, "i|li:probe", &kind, &arg, &timeout_ms))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
        rc = sbx_probe(kind, arg, timeout_ms);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

PyDoc_STRVAR(landlock_abi_doc, "landlock_abi() -> int\n"
                               "--\n\n"
                               "The kernel's Landlock ABI version, or -errno.");

static PyObject *core_landlock_abi(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromLong(sbx_probe_landlock_abi());
}

PyDoc_STRVAR(cgroup_fs_kind_doc, "cgroup_fs_kind(path, /) -> int\n"
                                 "--\n\n"
                                 "2 when path is on cgroup2, 1 on cgroup v1, 0 elsewhere.\n"
                                 "Raises OSError when path cannot be stat'ed.");

static PyObject *core_cgroup_fs_kind(PyObject *self, PyObject *arg)
{
    PyObject *b = NULL;
    int kind;

    (void)self;
    if (!PyUnicode_FSConverter(arg, &b))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
        kind = sbx_cgroup_fs_kind(PyBytes_AS_STRING(b));
    Py_END_ALLOW_THREADS
    if (kind < 0) {
        errno = -kind;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, arg);
        Py_DECREF(b);
        return NULL;
    }
    Py_DECREF(b);
    return PyLong_FromLong(kind);
}

/* A list of n ints (watch descriptors, or -errno). */
static PyObject *int_list(const int *v, size_t n)
{
    PyObject *out = PyList_New((Py_ssize_t)n);
    size_t i;

    for (i = 0; out && i < n; i++) {
        PyObject *x = PyLong_FromLong(v[i]);

        if (!x) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, x);
    }
    return out;
}

PyDoc_STRVAR(watch_open_doc, "watch_open() -> int\n"
                             "--\n\n"
                             "A new inotify fd (non-blocking, close-on-exec) for watch_add.");

static PyObject *core_watch_open(PyObject *self, PyObject *unused)
{
    int fd;

    (void)self;
    (void)unused;
    fd = sbx_watch_open();
    if (fd < 0) {
        errno = -fd;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLong(fd);
}

PyDoc_STRVAR(watch_add_doc,
             "watch_add(fd, paths, what, /) -> list[int]\n"
             "--\n\n"
             "Watch each of paths on the inotify fd (what: 1 (True) their entries,\n"
             "0 (False) the files' contents, WATCH_SELF each file or directory\n"
             "itself), the GIL released once; returns each one's watch\n"
             "descriptor, or -errno.  On a filesystem whose changes this kernel may\n"
             "not all see (network, FUSE), the descriptor has WATCH_REMOTE set.");

static PyObject *core_watch_add(PyObject *self, PyObject *args)
{
    PyObject *seq, *keep, *out = NULL;
    char **paths = NULL;
    int *wds = NULL;
    size_t i, n = 0;
    int fd, dirs;

    (void)self;
    if (!PyArg_ParseTuple(args, "iOi:watch_add", &fd, &seq, &dirs))
        return NULL;
    keep = PyList_New(0);
    if (!keep)
        return NULL;
    paths = to_cstrings_keep(seq, "watch_add: paths must be a sequence", keep, &n);
    if (!paths)
        goto done;
    wds = PyMem_Calloc(n + 1, sizeof *wds);
    if (!wds) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
        for (i = 0; i < n; i++)
            wds[i] = sbx_watch_add(fd, paths[i], dirs);
    Py_END_ALLOW_THREADS
    out = int_list(wds, n);
done:
    PyMem_Free(paths);
    PyMem_Free(wds);
    Py_DECREF(keep);
    return out;
}

PyDoc_STRVAR(watch_changed_doc,
             "watch_changed(fd, skip, /) -> list[int]\n"
             "--\n\n"
             "Drain the inotify fd's queue: the watch descriptors on which an event\n"
             "that can change the protected paths' search was queued (a subdirectory\n"
             "but those named in skip, where a name ending in '*' is a prefix, a\n"
             ".git or a commondir made, removed or\n"
             "renamed; a watched file changed; a watch lost), or [-1] (an overflow,\n"
             "or too many to list: anything may have changed).");

static PyObject *core_watch_changed(PyObject *self, PyObject *args)
{
    PyObject *seq, *keep, *out = NULL;
    char **skip;
    int wds[256];
    size_t n = 0, n_wds = 0;
    int fd, r;

    (void)self;
    if (!PyArg_ParseTuple(args, "iO:watch_changed", &fd, &seq))
        return NULL;
    keep = PyList_New(0);
    if (!keep)
        return NULL;
    skip = to_cstrings_keep(seq, "watch_changed: skip must be a sequence", keep, &n);
    if (!skip)
        goto done;
    r = sbx_watch_changed(fd, (const char *const *)skip, n, wds, sizeof wds / sizeof wds[0],
                          &n_wds);
    if (r < 0) {
        errno = -r;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    out = int_list(wds, n_wds);
done:
    PyMem_Free(skip);
    Py_DECREF(keep);
    return out;
}

PyDoc_STRVAR(fs_batch_doc,
             "fs_batch(steps, stop_at_error, anchors=(), /) -> list\n"
             "--\n\n"
             "Run (op, path, data[, fd[, dir]]) steps (FS_MKDIR, FS_RMDIR, FS_WRITE,\n"
             "FS_WRITE_OPTIONAL, FS_READ, FS_STAT, FS_OPEN_WRITE, FS_OPEN_READ,\n"
             "FS_V1_EVENT, FS_CLOSE, FS_RM_WORKSPACE, FS_PREAD; data: bytes for a\n"
             "write or an event, else None; fd: the eventfd of FS_V1_EVENT, the fd\n"
             "FS_CLOSE closes, the fd FS_PREAD reads from its start; dir: the\n"
             "directory fd a relative path, and FS_V1_EVENT's watched path, are\n"
             "resolved from, -1 for the working directory) in order with\n"
             "the GIL released once for all of them.  anchors: (dir, fd, rel)\n"
             "each, a directory kept open: a step path (-1 dir) in dir is named\n"
             "rel + what follows dir, from fd.  Returns\n"
             "each step's errno (0: done, -1: not run, after a failure with\n"
             "stop_at_error), for a read that succeeded the bytes read (a file of\n"
             "FS_READ_MAX bytes or more fails with EFBIG: never a truncated read),\n"
             "for a stat that succeeded (st_dev, st_ino), links followed, for an\n"
             "open (fd,) (close-on-exec, the caller's to close), for a workspace\n"
             "removed (bytes its tmp/ held,).");

/* A directory the caller keeps open, and the path a step names it by. */
struct fs_anchor {
    const char *dir; /* the path from "/" */
    size_t dir_len;
    const char *rel; /* the same directory from at */
    size_t rel_len;
    int at;
};

/* The anchors of fs_batch: (dir, at, rel) each, the strings kept in keep.
 * NULL with an exception set; *n_out 0 for none. */
static struct fs_anchor *fs_anchors(PyObject *seq, PyObject *keep, Py_ssize_t *n_out)
{
    PyObject *fast;
    Py_ssize_t i, n;
    struct fs_anchor *out =
        fast_array(seq, "fs_batch: anchors must be a sequence", sizeof *out, &fast, &n);

    *n_out = 0;
    if (!out)
        return NULL;
    for (i = 0; i < n; i++) {
        PyObject *dir = NULL, *rel = NULL, *item = PySequence_Fast_GET_ITEM(fast, i);

        if (!PyTuple_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "fs_batch: an anchor is a (dir, fd, rel) tuple");
            goto fail;
        }
        if (!PyArg_ParseTuple(item, "O&iO&:fs_batch anchor", PyUnicode_FSConverter, &dir,
                              &out[i].at, PyUnicode_FSConverter, &rel)) {
            Py_XDECREF(dir);
            goto fail;
        }
        if (PyList_Append(keep, dir) < 0 || PyList_Append(keep, rel) < 0) {
            Py_DECREF(dir);
            Py_DECREF(rel);
            goto fail;
        }
        Py_DECREF(dir); /* keep holds them */
        Py_DECREF(rel);
        if (out[i].at < 0) { /* -1 would be the working directory */
            PyErr_SetString(PyExc_ValueError, "fs_batch: an anchor's fd must be >= 0");
            goto fail;
        }
        out[i].dir = PyBytes_AS_STRING(dir);
        out[i].dir_len = (size_t)PyBytes_GET_SIZE(dir);
        out[i].rel = PyBytes_AS_STRING(rel);
        out[i].rel_len = (size_t)PyBytes_GET_SIZE(rel);
    }
    Py_DECREF(fast);
    *n_out = n;
    return out;
fail:
    Py_DECREF(fast);
    PyMem_Free(out);
    return NULL;
}

/* `path` (len bytes, then any tail: v1 events' NUL and argument) named from
 * the anchor whose directory holds it: a new bytes object kept in keep, and
 * *at; else NULL with *at untouched.  -1 with an exception set on failure. */
static int fs_anchored(const struct fs_anchor *a, Py_ssize_t n_anchors, const char *path,
                       size_t len, size_t tail, PyObject *keep, const char **out, int *at)
{
    Py_ssize_t i;

    *out = NULL;
    for (i = 0; i < n_anchors; i++) {
        PyObject *b;

        if (len < a[i].dir_len || memcmp(path, a[i].dir, a[i].dir_len) != 0 ||
            (len > a[i].dir_len && path[a[i].dir_len] != '/'))
            continue;
        b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(a[i].rel_len + len + tail - a[i].dir_len));
        if (!b || PyList_Append(keep, b) < 0) {
            Py_XDECREF(b);
            return -1;
        }
        Py_DECREF(b);
        memcpy(PyBytes_AS_STRING(b), a[i].rel, a[i].rel_len);
        memcpy(PyBytes_AS_STRING(b) + a[i].rel_len, path + a[i].dir_len, len + tail - a[i].dir_len);
        *out = PyBytes_AS_STRING(b);
        *at = a[i].at;
        return 0;
    }
    return 0;
}

static PyObject *core_fs_batch(PyObject *self, PyObject *args)
{
    PyObject *seq, *fast = NULL, *keep = NULL, *out = NULL, *anchors_seq = NULL;
    struct sbx_fs_step *steps = NULL;
    struct fs_anchor *anchors = NULL;
    char *bufs = NULL;
    size_t n_reads = 0;
    Py_ssize_t i, n, n_anchors = 0;
    int stop_at_error;

    (void)self;
    if (!PyArg_ParseTuple(args, "Op|O:fs_batch", &seq, &stop_at_error, &anchors_seq))
        return NULL;
    fast = PySequence_Fast(seq, "fs_batch: steps must be a sequence");
    if (!fast)
        return NULL;
    n = PySequence_Fast_GET_SIZE(fast);
    keep = PyList_New(0);
    steps = PyMem_Calloc((size_t)n + 1, sizeof *steps);
    if (!keep || !steps) {
        PyErr_NoMemory();
        goto done;
    }
    if (anchors_seq && !(anchors = fs_anchors(anchors_seq, keep, &n_anchors)))
        goto done;
    for (i = 0; i < n; i++) {
        PyObject *path = NULL, *data, *item = PySequence_Fast_GET_ITEM(fast, i);
        int op, fd = -1, dir = -1;

        if (!PyTuple_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "fs_batch: a step is a tuple");
            goto done;
        }
        if (!PyArg_ParseTuple(item, "iO&O|ii:fs_batch step", &op, PyUnicode_FSConverter, &path,
                              &data, &fd, &dir))
            goto done;
        steps[i].fd = fd;
        steps[i].dir = dir;
        if (PyList_Append(keep, path) < 0) {
            Py_DECREF(path);
            goto done;
        }
        Py_DECREF(path); /* keep holds it */
        steps[i].op = op;
        steps[i].path = PyBytes_AS_STRING(path);
        if (data != Py_None) {
            if (!PyBytes_Check(data)) {
                PyErr_SetString(PyExc_TypeError, "fs_batch: data must be bytes or None");
                goto done;
            }
            /* Held: another thread may change the list while the GIL is
             * released, and with it the step that held data. */
            if (PyList_Append(keep, data) < 0)
                goto done;
            steps[i].data = PyBytes_AS_STRING(data);
            steps[i].len = (size_t)PyBytes_GET_SIZE(data);
        } else if (op == SBX_FS_WRITE || op == SBX_FS_WRITE_OPTIONAL || op == SBX_FS_V1_EVENT) {
            PyErr_SetString(PyExc_TypeError, "fs_batch: a write or an event needs bytes");
            goto done;
        }
        if (op == SBX_FS_READ || op == SBX_FS_PREAD)
            n_reads++;
        if (n_anchors > 0 && steps[i].dir < 0) {
            const char *rel;
            int at = -1;

            if (fs_anchored(anchors, n_anchors, steps[i].path, strlen(steps[i].path), 0, keep, &rel,
                            &at) < 0)
                goto done;
            if (rel) {
                steps[i].path = rel;
                steps[i].dir = at;
            }
            /* The watched file of a v1 event: from the same directory. */
            if (rel && op == SBX_FS_V1_EVENT && steps[i].data) {
                size_t plen = strnlen(steps[i].data, steps[i].len);
                int w_at = -1;

                if (fs_anchored(anchors, n_anchors, steps[i].data, plen, steps[i].len - plen, keep,
                                &rel, &w_at) < 0)
                    goto done;
                if (rel && w_at == at) {
                    steps[i].len = steps[i].len - plen + strlen(rel);
                    steps[i].data = rel;
                }
            }
        }
    }
    if (n_reads > 0) {
        size_t r = 0;

        bufs = PyMem_Malloc(n_reads * SBX_FS_READ_MAX);
        if (!bufs) {
            PyErr_NoMemory();
            goto done;
        }
        for (i = 0; i < n; i++) {
            if (steps[i].op != SBX_FS_READ && steps[i].op != SBX_FS_PREAD)
                continue;
            steps[i].buf = bufs + r++ * SBX_FS_READ_MAX;
            steps[i].cap = SBX_FS_READ_MAX;
        }
    }
    Py_BEGIN_ALLOW_THREADS
        sbx_fs_batch(steps, (size_t)n, stop_at_error);
    Py_END_ALLOW_THREADS
    out = PyList_New(n);
    for (i = 0; out && i < n; i++) {
        PyObject *err;

        if (steps[i].err != 0)
            err = PyLong_FromLong(steps[i].err);
        else if (steps[i].op == SBX_FS_READ || steps[i].op == SBX_FS_PREAD)
            err = PyBytes_FromStringAndSize(steps[i].buf, (Py_ssize_t)steps[i].len);
        else if (steps[i].op == SBX_FS_STAT)
            err = Py_BuildValue("(KK)", steps[i].dev, steps[i].ino);
        else if (steps[i].op == SBX_FS_OPEN_WRITE || steps[i].op == SBX_FS_OPEN_READ)
            err = Py_BuildValue("(i)", steps[i].fd);
        else if (steps[i].op == SBX_FS_RM_WORKSPACE)
            err = Py_BuildValue("(n)", (Py_ssize_t)steps[i].len);
        else
            err = PyLong_FromLong(0);
        if (!err) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, err);
    }
    if (!out) /* the fds opened would be nobody's */
        for (i = 0; i < n; i++)
            if ((steps[i].op == SBX_FS_OPEN_WRITE || steps[i].op == SBX_FS_OPEN_READ) &&
                steps[i].err == 0)
                close(steps[i].fd);
done:
    PyMem_Free(bufs);
    PyMem_Free(steps);
    PyMem_Free(anchors);
    Py_XDECREF(keep);
    Py_DECREF(fast);
    return out;
}

/* ---- the Seatbelt profile builder (every OS: it is plain C) ------------ */

/* A const char* array over a list of str/bytes paths; the bytes objects are
 * kept in keep.  NULs are refused here (a C string cannot carry one). */
static const char **path_array(PyObject *seq, const char *what, PyObject *keep, size_t *n_out)
{
    char **out = to_cstrings_keep(seq, what, keep, n_out);
    return (const char **)out;
}

PyDoc_STRVAR(seatbelt_profile_doc,
             "seatbelt_profile(*, workspace=None, workspaces_root=None, writable_roots=(),\n"
             "                 deny_read=(), deny_write=(), protect_dotfiles=False,\n"
             "                 protected_paths=(), ttys=(), unix_sockets=(), network=0,\n"
             "                 proxy_ports=()) -> str\n"
             "--\n\n"
             "Render a Seatbelt (SBPL) profile (csrc/darwin/seatbelt.c; the fields are\n"
             "struct sbx_seatbelt_policy's).  Paths must be canonical already\n"
             "(seatbelt_canonical).  network: 0 allow, 1 deny, 2 proxy.  Raises\n"
             "ValueError naming an invalid path.");

/* An optional path argument (None: NULL), its bytes kept in keep. */
static int opt_path(PyObject *arg, PyObject *keep, const char **out)
{
    PyObject *b = NULL;
    int rc;

    *out = NULL;
    if (arg == NULL || arg == Py_None)
        return 0;
    if (!PyUnicode_FSConverter(arg, &b))
        return -1;
    rc = PyList_Append(keep, b);
    *out = PyBytes_AS_STRING(b);
    Py_DECREF(b); /* keep holds it */
    return rc;
}

static PyObject *core_seatbelt_profile(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"workspace",    "workspaces_root",  "writable_roots",  "deny_read",
                             "deny_write",   "protect_dotfiles", "protected_paths", "ttys",
                             "unix_sockets", "network",          "proxy_ports",     NULL};
    PyObject *workspace = NULL, *root = NULL, *empty = NULL, *keep = NULL, *result = NULL;
    PyObject *lists[6] = {NULL, NULL, NULL, NULL, NULL, NULL}, *ports = NULL;
    const char **arrays[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    size_t counts[6] = {0, 0, 0, 0, 0, 0};
    static const char *const what[6] = {
        "writable_roots must be a sequence", "deny_read must be a sequence",
        "deny_write must be a sequence",     "protected_paths must be a sequence",
        "ttys must be a sequence",           "unix_sockets must be a sequence",
    };
    int *port_v = NULL;
    int protect = 0, network = 0, rc, i;
    struct sbx_seatbelt_policy pol;
    size_t needed = 0, n_ports = 0;
    const char *bad = NULL;
    char *buf = NULL;

    (void)self;
    memset(&pol, 0, sizeof pol);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOOOpOOOiO:seatbelt_profile", kwlist,
                                     &workspace, &root, &lists[0], &lists[1], &lists[2], &protect,
                                     &lists[3], &lists[4], &lists[5], &network, &ports))
        return NULL;
    if (!(keep = PyList_New(0)) || !(empty = PyTuple_New(0)))
        goto done;
    if (opt_path(workspace, keep, &pol.workspace) < 0 ||
        opt_path(root, keep, &pol.workspaces_root) < 0)
        goto done;
    for (i = 0; i < 6; i++)
        if (!(arrays[i] = path_array(lists[i] ? lists[i] : empty, what[i], keep, &counts[i])))
            goto done;
    if (to_ints(ports ? ports : empty, "proxy_ports must be a sequence", &port_v, &n_ports) < 0)
        goto done;
    pol.writable_roots = arrays[0];
    pol.n_writable_roots = counts[0];
    pol.deny_read = arrays[1];
    pol.n_deny_read = counts[1];
    pol.deny_write = arrays[2];
    pol.n_deny_write = counts[2];
    pol.protect_dotfiles = protect;
    pol.protected_paths = arrays[3];
    pol.n_protected_paths = counts[3];
    pol.ttys = arrays[4];
    pol.n_ttys = counts[4];
    pol.unix_sockets = arrays[5];
    pol.n_unix_sockets = counts[5];
    pol.network = (enum sbx_seatbelt_net)network;
    pol.proxy_ports = port_v;
    pol.n_proxy_ports = n_ports;

    rc = sbx_seatbelt_render(&pol, NULL, 0, &needed, &bad);
    if (rc == ENOSPC) {
        buf = PyMem_Malloc(needed);
        if (!buf) {
            PyErr_NoMemory();
            goto done;
        }
        rc = sbx_seatbelt_render(&pol, buf, needed, &needed, &bad);
    }
    if (rc == EINVAL) {
        PyObject *bad_b = bad ? PyBytes_FromString(bad) : NULL;

        if (bad_b) {
            PyErr_Format(PyExc_ValueError, "invalid path for the profile: %R", bad_b);
            Py_DECREF(bad_b);
        } else if (!bad)
            PyErr_SetString(PyExc_ValueError, "invalid network mode or proxy ports");
        goto done;
    }
    if (rc != 0) {
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    result = PyUnicode_DecodeFSDefaultAndSize(buf, (Py_ssize_t)needed - 1);
done:
    PyMem_Free(buf);
    for (i = 0; i < 6; i++)
        PyMem_Free(arrays[i]);
    PyMem_Free(port_v);
    Py_XDECREF(empty);
    Py_XDECREF(keep);
    return result;
}

PyDoc_STRVAR(seatbelt_canonical_doc,
             "seatbelt_canonical(path, /) -> str\n"
             "--\n\n"
             "The path as Seatbelt sees it: the existing prefix resolved, /tmp, /var,\n"
             "/etc mapped to /private/...  Raises ValueError for a relative path.");

static PyObject *core_seatbelt_canonical(PyObject *self, PyObject *arg)
{
    PyObject *b = NULL;
    char out[PATH_MAX + 16];
    int rc;

    (void)self;
    if (!PyUnicode_FSConverter(arg, &b))
        return NULL;
    rc = sbx_seatbelt_canonical(PyBytes_AS_STRING(b), out, sizeof out);
    Py_DECREF(b);
    if (rc == EINVAL) {
        PyErr_Format(PyExc_ValueError, "not an absolute path: %R", arg);
        return NULL;
    }
    if (rc != 0) {
        errno = rc;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, arg);
        return NULL;
    }
    return PyUnicode_DecodeFSDefault(out);
}

PyDoc_STRVAR(landlock_ruleset_doc,
             "landlock_ruleset(handled, rules, handled_net=0, net_access=0, ports=(),\n"
             "                 scoped=0, /) -> (fd, added)\n"
             "--\n\n"
             "A Landlock ruleset handling `handled` that allows `access` beneath each\n"
             "`path` of rules ((path, access) pairs; missing paths are skipped);\n"
             "with handled_net (ABI 4) it allows net_access on each TCP port of\n"
             "ports, and scoped (ABI 6) restricts IPC scopes.\n"
             "Returns its fd (close-on-exec, the caller closes it) and the rules made.");

static PyObject *core_landlock_ruleset(PyObject *self, PyObject *args)
{
    unsigned long long handled, handled_net = 0, net_access = 0, scoped = 0;
    PyObject *rules, *fast = NULL, *keep = NULL, *result = NULL, *ports = NULL;
    struct sbx_landlock_net net;
    uint16_t *port_list = NULL;
    const char **paths = NULL;
    uint64_t *access = NULL;
    Py_ssize_t i, n;
    size_t added = 0;
    int fd;

    (void)self;
    if (!PyArg_ParseTuple(args, "KO|KKOK:landlock_ruleset", &handled, &rules, &handled_net,
                          &net_access, &ports, &scoped))
        return NULL;
    memset(&net, 0, sizeof net);
    net.handled_net = handled_net;
    net.net_access = net_access;
    net.scoped = scoped;
    if (ports && ports != Py_None) {
        int *tmp = NULL;
        size_t k;

        if (to_ints(ports, "ports must be a sequence of ints", &tmp, &net.n_ports) < 0) {
            PyMem_Free(tmp);
            return NULL;
        }
        port_list = PyMem_Calloc(net.n_ports + 1, sizeof *port_list);
        if (!port_list) {
            PyMem_Free(tmp);
            return PyErr_NoMemory();
        }
        for (k = 0; k < net.n_ports; k++) {
            if (tmp[k] < 0 || tmp[k] > 65535) {
                PyMem_Free(tmp);
                PyMem_Free(port_list);
                PyErr_SetString(PyExc_ValueError, "ports must be 0..65535");
                return NULL;
            }
            port_list[k] = (uint16_t)tmp[k];
        }
        PyMem_Free(tmp);
        net.ports = port_list;
    }
    fast = PySequence_Fast(rules, "rules must be a sequence of (path, access)");
    if (!fast)
        goto done;
    n = PySequence_Fast_GET_SIZE(fast);
    keep = PyList_New(0);
    paths = PyMem_Calloc((size_t)n + 1, sizeof *paths);
    access = PyMem_Calloc((size_t)n + 1, sizeof *access);
    if (!keep || !paths || !access) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < n; i++) {
        PyObject *path, *b = NULL;
        unsigned long long acc;

        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i),
                              "OK;rules items are (path, access)", &path, &acc))
            goto done;
        if (!PyUnicode_FSConverter(path, &b))
            goto done;
        if (PyList_Append(keep, b) < 0) {
            Py_DECREF(b);
            goto done;
        }
        paths[i] = PyBytes_AS_STRING(b);
        Py_DECREF(b);
        access[i] = acc;
    }
    Py_BEGIN_ALLOW_THREADS
        fd = sbx_landlock_ruleset(handled, paths, access, (size_t)n, &net, &added);
    Py_END_ALLOW_THREADS
    if (fd < 0) {
        errno = -fd;
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, "landlock ruleset");
        goto done;
    }
    result = Py_BuildValue("(in)", fd, (Py_ssize_t)added);
done:
    PyMem_Free(port_list);
    PyMem_Free(paths);
    PyMem_Free(access);
    Py_XDECREF(keep);
    Py_XDECREF(fast);
    return result;
}

PyDoc_STRVAR(seccomp_program_doc,
             "seccomp_program(what, caller, caller_pgid, guard=0, /) -> bytes\n"
             "--\n\n"
             "The filter spawn() loads for `what` (SECCOMP_* bits): struct sock_filter\n"
             "instructions, 8 bytes each.  For tests and inspection.");

static PyObject *core_seccomp_program(PyObject *self, PyObject *args)
{
    uint64_t filter[SBX_SECCOMP_MAX];
    size_t n = 0;
    int what, caller, pgid, guard = 0, rc;

    (void)self;
    if (!PyArg_ParseTuple(args, "iii|i:seccomp_program", &what, &caller, &pgid, &guard))
        return NULL;
    rc = sbx_seccomp_build(filter, SBX_SECCOMP_MAX, &n, what, caller, pgid, guard);
    if (rc < 0) {
        errno = -rc;
        return PyErr_SetFromErrnoWithFilename(PyExc_OSError, "seccomp filter");
    }
    return PyBytes_FromStringAndSize((const char *)filter, (Py_ssize_t)(n * sizeof filter[0]));
}

#ifdef __APPLE__
PyDoc_STRVAR(seatbelt_apply_doc,
             "seatbelt_apply(profile, /) -> None\n"
             "--\n\n"
             "Put this process under the Seatbelt profile (SBPL text) for good: the\n"
             "forked-callable path (darwin/seatbelt_apply.c).  OSError(errno, libsandbox's\n"
             "message) when macOS refuses it.");

static PyObject *core_seatbelt_apply(PyObject *self, PyObject *arg)
{
    char msg[512];
    const char *profile;
    Py_ssize_t len;
    int err;

    (void)self;
    if (!PyUnicode_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "profile must be a str");
        return NULL;
    }
    profile = PyUnicode_AsUTF8AndSize(arg, &len);
    if (!profile)
        return NULL;
    if (strlen(profile) != (size_t)len) {
        PyErr_SetString(PyExc_ValueError, "profile holds a NUL");
        return NULL;
    }
    /* The forked child is single-threaded: no need to release the GIL. */
    err = sbx_seatbelt_apply(profile, msg, sizeof msg);
    if (err != 0) {
        PyObject *e = Py_BuildValue("(is)", err, msg);

        if (e) {
            PyErr_SetObject(PyExc_OSError, e);
            Py_DECREF(e);
        }
        return NULL;
    }
    Py_RETURN_NONE;
}
#endif

static PyMethodDef core_methods[] = {
    {"seccomp_program", core_seccomp_program, METH_VARARGS, seccomp_program_doc},
    {"landlock_ruleset", core_landlock_ruleset, METH_VARARGS, landlock_ruleset_doc},
    {"seatbelt_profile", (PyCFunction)(void (*)(void))core_seatbelt_profile,
     METH_VARARGS | METH_KEYWORDS, seatbelt_profile_doc},
    {"seatbelt_canonical", core_seatbelt_canonical, METH_O, seatbelt_canonical_doc},
    {"cgroup_fs_kind", core_cgroup_fs_kind, METH_O, cgroup_fs_kind_doc},
    {"fs_batch", core_fs_batch, METH_VARARGS, fs_batch_doc},
    {"watch_open", core_watch_open, METH_NOARGS, watch_open_doc},
    {"watch_add", core_watch_add, METH_VARARGS, watch_add_doc},
    {"watch_changed", core_watch_changed, METH_VARARGS, watch_changed_doc},
    {"probe", core_probe, METH_VARARGS, probe_doc},
    {"landlock_abi", core_landlock_abi, METH_NOARGS, landlock_abi_doc},
    {"spawn", core_spawn, METH_VARARGS, spawn_doc},
    {"tree_sample", core_tree_sample, METH_VARARGS, tree_sample_doc},
    {"tree_sample_many", core_tree_sample_many, METH_O, tree_sample_many_doc},
    {"ns_make", core_ns_make, METH_O, ns_make_doc},
    {"dev_template", core_dev_template, METH_NOARGS, dev_template_doc},
    {"view_ns", core_view_ns, METH_VARARGS, view_ns_doc},
    {"views_stale", core_views_stale, METH_VARARGS, views_stale_doc},
    {"caller_place", core_caller_place, METH_NOARGS, caller_place_doc},
    {"tree_signal", core_tree_signal, METH_VARARGS, tree_signal_doc},
#ifdef __APPLE__
    {"seatbelt_apply", core_seatbelt_apply, METH_O, seatbelt_apply_doc},
#endif
    {NULL, NULL, 0, NULL},
};

static int core_exec(PyObject *m)
{
    PyObject *steps = PyTuple_New(SBX_STEP__COUNT);
    int i;

    if (!steps)
        return -1;
    for (i = 0; i < SBX_STEP__COUNT; i++) {
        PyObject *name = PyUnicode_FromString(sbx_step_name(i));
        if (!name) {
            Py_DECREF(steps);
            return -1;
        }
        PyTuple_SET_ITEM(steps, i, name);
    }
    if (PyModule_AddObject(m, "STEPS", steps) < 0) {
        Py_DECREF(steps);
        return -1;
    }
    if (PyModule_AddIntConstant(m, "TREE_CACHE_SIZE", (long)sizeof(struct sbx_tree_cache)) < 0 ||
        PyModule_AddIntConstant(m, "PROBE_PIDFD", SBX_PROBE_PIDFD) < 0 ||
        PyModule_AddIntConstant(m, "PROBE_CLOSE_RANGE", SBX_PROBE_CLOSE_RANGE) < 0 ||
        PyModule_AddIntConstant(m, "PROBE_NO_NEW_PRIVS", SBX_PROBE_NO_NEW_PRIVS) < 0 ||
        PyModule_AddIntConstant(m, "PROBE_SECCOMP", SBX_PROBE_SECCOMP) < 0 ||
        PyModule_AddIntConstant(m, "PROBE_UNSHARE", SBX_PROBE_UNSHARE) < 0 ||
        PyModule_AddIntConstant(m, "PROBE_CLONE3_CGROUP", SBX_PROBE_CLONE3_CGROUP) < 0 ||
        PyModule_AddIntConstant(m, "PROBE_HANG", SBX_PROBE_HANG) < 0 ||
        PyModule_AddIntConstant(m, "PROBE_NAMESPACES", SBX_PROBE_NAMESPACES) < 0 ||
        PyModule_AddIntConstant(m, "PROBE_RO_VIEW", SBX_PROBE_RO_VIEW) < 0 ||
        PyModule_AddIntConstant(m, "SECCOMP_HARDEN", SBX_SECCOMP_HARDEN) < 0 ||
        PyModule_AddIntConstant(m, "SECCOMP_NET_DENY", SBX_SECCOMP_NET_DENY) < 0 ||
        PyModule_AddIntConstant(m, "SECCOMP_NET_PROXY", SBX_SECCOMP_NET_PROXY) < 0 ||
        PyModule_AddIntConstant(m, "SECCOMP_FAMILIES", SBX_SECCOMP_FAMILIES) < 0 ||
        PyModule_AddIntConstant(m, "SECCOMP_SIGNALS", SBX_SECCOMP_SIGNALS) < 0 ||
        PyModule_AddIntConstant(m, "SECCOMP_VERSION", SBX_SECCOMP_VERSION) < 0 ||
        PyModule_AddIntConstant(m, "CAPS_DROP", SBX_CAPS_DROP) < 0 ||
        PyModule_AddIntConstant(m, "CAPS_BOUNDING", SBX_CAPS_BOUNDING) < 0 ||
        PyModule_AddIntConstant(m, "VIEW_RW", SBX_VIEW_RW) < 0 ||
        PyModule_AddIntConstant(m, "VIEW_RW_DEV", SBX_VIEW_RW_DEV) < 0 ||
        PyModule_AddIntConstant(m, "VIEW_RO", SBX_VIEW_RO) < 0 ||
        PyModule_AddIntConstant(m, "VIEW_RO_MOUNT", SBX_VIEW_RO_MOUNT) < 0 ||
        PyModule_AddIntConstant(m, "VIEW_HIDE_DIR", SBX_VIEW_HIDE_DIR) < 0 ||
        PyModule_AddIntConstant(m, "VIEW_HIDE", SBX_VIEW_HIDE) < 0 ||
        PyModule_AddIntConstant(m, "VIEW_TMPFS", SBX_VIEW_TMPFS) < 0 ||
        PyModule_AddIntConstant(m, "VIEW_PIN", SBX_VIEW_PIN) < 0 ||
        PyModule_AddIntConstant(m, "WATCH_SELF", SBX_WATCH_SELF) < 0 ||
        PyModule_AddIntConstant(m, "WATCH_REMOTE", SBX_WATCH_REMOTE) < 0 ||
        PyModule_AddIntConstant(m, "VIEW_MAX_RW", SBX_VIEW_MAX_RW) < 0 ||
        PyModule_AddIntConstant(m, "HOW_VM", SBX_HOW_VM) < 0 ||
        PyModule_AddIntConstant(m, "HOW_CLONE3", SBX_HOW_CLONE3) < 0 ||
        PyModule_AddIntConstant(m, "HOW_INTO_CGROUP", SBX_HOW_INTO_CGROUP) < 0 ||
        PyModule_AddIntConstant(m, "MNT_NS_ASK", SBX_MNT_NS_ASK) < 0 ||
        PyModule_AddIntConstant(m, "FS_MKDIR", SBX_FS_MKDIR) < 0 ||
        PyModule_AddIntConstant(m, "FS_RMDIR", SBX_FS_RMDIR) < 0 ||
        PyModule_AddIntConstant(m, "FS_WRITE", SBX_FS_WRITE) < 0 ||
        PyModule_AddIntConstant(m, "FS_WRITE_OPTIONAL", SBX_FS_WRITE_OPTIONAL) < 0 ||
        PyModule_AddIntConstant(m, "FS_READ", SBX_FS_READ) < 0 ||
        PyModule_AddIntConstant(m, "FS_STAT", SBX_FS_STAT) < 0 ||
        PyModule_AddIntConstant(m, "FS_OPEN_WRITE", SBX_FS_OPEN_WRITE) < 0 ||
        PyModule_AddIntConstant(m, "FS_OPEN_READ", SBX_FS_OPEN_READ) < 0 ||
        PyModule_AddIntConstant(m, "FS_V1_EVENT", SBX_FS_V1_EVENT) < 0 ||
        PyModule_AddIntConstant(m, "FS_CLOSE", SBX_FS_CLOSE) < 0 ||
        PyModule_AddIntConstant(m, "FS_RM_WORKSPACE", SBX_FS_RM_WORKSPACE) < 0 ||
        PyModule_AddIntConstant(m, "FS_PREAD", SBX_FS_PREAD) < 0 ||
        PyModule_AddIntConstant(m, "FS_READ_MAX", SBX_FS_READ_MAX) < 0)
        return -1;
#if defined(__linux__) && !defined(SBX_NO_VFORK)
    if (PyModule_AddIntConstant(m, "HAS_VFORK", 1) < 0)
        return -1;
#else
    if (PyModule_AddIntConstant(m, "HAS_VFORK", 0) < 0)
        return -1;
#endif
    {
        uint64_t probe[SBX_SECCOMP_MAX];
        size_t n;

        if (PyModule_AddIntConstant(m, "HAS_SECCOMP",
                                    sbx_seccomp_build(probe, SBX_SECCOMP_MAX, &n,
                                                      SBX_SECCOMP_HARDEN, 0, 0, 0) == 0) < 0)
            return -1;
    }
#if defined(__linux__) || defined(__APPLE__)
    if (PyModule_AddIntConstant(m, "HAS_PROCTREE", 1) < 0)
        return -1;
#else
    if (PyModule_AddIntConstant(m, "HAS_PROCTREE", 0) < 0)
        return -1;
#endif
    return 0;
}

static PyModuleDef_Slot core_slots[] = {
    {Py_mod_exec, core_exec},
    {0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "sbxlimit._core",
    .m_doc = "The C core of sbxlimit: spawn with limits, process-tree sampling and signals.",
    .m_size = 0,
    .m_methods = core_methods,
    .m_slots = core_slots,
};

PyMODINIT_FUNC PyInit__core(void)
{
    return PyModuleDef_Init(&core_module);
}
