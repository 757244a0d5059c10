"""Shared fixtures.  A session-level check proves the suite leaks nothing:
no process left behind, no file descriptor, no temp entry of ours."""

from __future__ import annotations

import functools
import os
import sys
import tempfile
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from sbxlimit import Report

PY = sys.executable

if sys.platform == "win32":
    # The POSIX mechanisms' tests import and run what Windows lacks (fork,
    # rlimits, /proc): the suite there is the files about Windows and about
    # what ships (docs/windows.md, the GitHub workflow's windows job).
    WINDOWS_SUITE = {"test_windows.py", "test_windows_wine.py", "test_packaging.py"}
    _here = os.path.dirname(os.path.abspath(__file__))
    collect_ignore = [
        f for f in os.listdir(_here) if f.startswith("test_") and f not in WINDOWS_SUITE
    ]
# Seconds the session's leak check waits for processes to go and cgroups to
# be removed; a User-Mode-Linux guest (tests/test_cgroup2_vm.py) on a busy
# host is 10-30 times slower at both.
_SLACK = 30.0 if os.environ.get("SBXLIMIT_IN_UML") == "1" else 5.0


@functools.cache
def report() -> Report:
    """The doctor's report for this machine: skips quote its reasons."""
    import sbxlimit

    return sbxlimit.doctor()


def why_not(check: str) -> str:
    """A skip reason from doctor(): the check's status and reason."""
    c = report().check(check)
    return f"doctor: {c.name} {c.status}: {c.reason}"


@functools.cache
def view_copy_error() -> str | None:
    """Why sandboxes here do not copy a view made once (_viewns), or None:
    a skip reason naming doctor's mount_namespace row where that is why."""
    if not sys.platform.startswith("linux"):
        return "the view made once is Linux's"
    import sbxlimit
    from sbxlimit import _viewns

    c = report().check("mount_namespace")
    if c.status != "ok" or os.geteuid() != 0:
        return (
            f"the view made once is root's (doctor: {c.name} {c.status}: {c.reason}; "
            f"uid {os.geteuid()})"
        )
    _viewns.drop()
    sbxlimit.run(["true"], policy=sbxlimit.Policy(workdir="/"))
    kept = bool(_viewns._kept)
    _viewns.drop()
    return None if kept else "the view made once was refused here (a /dev template, a watch)"


@pytest.fixture(params=["copied", "built"])
def view_made(request, monkeypatch):
    """The view copied from one made once (_viewns, root), or built by the
    child, as unprivileged or where it cannot be kept.  (A view with no
    entry but "/" read-only and /dev is built either way.)"""
    from sbxlimit import _viewns

    if request.param == "built":
        monkeypatch.setattr(_viewns, "take", lambda *a: None)
        yield request.param
        return
    copied = []
    real = _viewns.take
    monkeypatch.setattr(_viewns, "take", lambda *a: copied.append(real(*a)) or copied[-1])
    yield request.param
    # As root, each view that could be copied was.
    if view_copy_error() is None:
        assert all(got is not None for got in copied), copied


def holds(field: str) -> str:
    """A skip reason from doctor()'s summary: what holds `field` here."""
    return f"doctor: {field} is held by {report().summary.get(field)!r} here"


def can_choose_the_next_pid() -> bool:
    """This process may choose the next pid (ns_last_pid)."""
    # The file is writable by all; the write needs CAP_SYS_ADMIN.
    path = "/proc/sys/kernel/ns_last_pid"
    try:
        with open(path) as f:
            last = f.read()
        with open(path, "w") as f:
            f.write(last)
    except OSError:
        return False
    return True


def fs_type(path: str) -> str:
    """The type of the filesystem `path` is on (its mount's, in
    /proc/self/mountinfo)."""
    best, kind = "", ""
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            point = left.split()[4].replace("\\040", " ")
            if (real + "/").startswith(point.rstrip("/") + "/") and len(point) >= len(best):
                best, kind = point, right.split()[0]
    return kind


def privileges() -> str:
    """A skip reason from doctor()'s facts about this process."""
    s = report().system
    caps = ", ".join(s["capabilities"]) or "none"
    return f"doctor: uid {s['uid']}, capabilities: {caps}"


def alive(pid: int) -> bool:
    """True while pid runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False  # gone (ESRCH: it went while we read its stat)


def wait_gone(pids, timeout: float = 5.0) -> list[int]:
    """Wait until none of pids runs; return those still running."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.02)
    return [p for p in pids if alive(p)]


@pytest.fixture
def no_namespaces(monkeypatch):
    """Sandboxes planned as where no namespace can be made."""
    from sbxlimit import _namespaces, _plan

    monkeypatch.setenv("SBXLIMIT_NAMESPACES", "0")
    _namespaces.namespaces.cache_clear()
    _plan._cache.clear()
    yield
    _namespaces.namespaces.cache_clear()
    _plan._cache.clear()


def tagged_sleep() -> str:
    """An argument for sleep(1) that names one test's sleepers host-wide:
    a program in a PID namespace of its own reports pids the host does
    not share, so tests find its processes by this instead."""
    import secrets

    return f"60.{secrets.randbelow(10**6):06d}"


def sleeping(tag: str) -> list[int]:
    """Host pids of the running `sleep <tag>` processes."""
    found = []
    want = [b"sleep", tag.encode()]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:2] == want and alive(int(pid)):
                    found.append(int(pid))
        except OSError:
            continue
    return found


def wait_no_sleepers(tags, timeout: float = 5.0) -> list[str]:
    """Wait until no `sleep <tag>` of tags runs; return the tags left."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(sleeping(t) for t in tags):
        time.sleep(0.02)
    return [t for t in tags if sleeping(t)]


def _children(pid: int) -> set[int]:
    """Descendants of pid, through /proc/PID/task/*/children."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    kids = {int(x) for x in f.read().split()}
            except OSError:
                continue
            todo += list(kids - found)
            found |= kids
    return found


def settled_fds(timeout: float = 3.0) -> set[str]:
    """This process's open fds once the supervisor has let go of the pidfds
    of sandboxes already reaped (it closes them on its own thread), and its
    threads are done with earlier sandboxes' output and workspaces: a
    tree's removal holds a directory fd at a time, a pump its pipes."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "anon_inode:[pidfd]" not in _fds().values() and _background_done():
            break
        time.sleep(0.02)
    return own_fds()


def _background_done() -> bool:
    from sbxlimit import _monitor

    m = _monitor._monitor
    if m is None:
        return True
    with m._lock:
        return not (m._pumps or m._new_pumps or m._trash or m._trees or m._emptying)


def in_a_fork(fn) -> str:
    """What fn() returns (a str) in a child made by os.fork(), after the
    at-fork handlers ran there."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(w, fn().encode())
        finally:
            try:  # what its sandboxes left (os._exit runs no atexit)
                from sbxlimit._monitor import drain_before_exit

                drain_before_exit()
            finally:
                os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        text = f.read()
    os.waitpid(pid, 0)
    return text


def kept_in_a_fork(fds) -> dict[int, str]:
    """Which of `fds` a child made by os.fork() still has open, and what
    they are there (the at-fork handlers ran in it)."""

    def kept() -> str:
        out = {}
        for fd in fds:
            try:
                out[fd] = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                pass
        return repr(out)

    import ast

    return ast.literal_eval(in_a_fork(kept))


@pytest.fixture
def events():
    """The audit events emitted while a test runs."""
    from sbxlimit import audit

    got: list[audit.Event] = []
    unsubscribe = audit.subscribe(got.append)
    yield got
    unsubscribe()


def own_fds() -> set[str]:
    """Open fds, but for what the supervisor keeps ready and opens and
    closes on its own thread at any time: network and IPC namespaces (_nspool),
    and the join files and event fds of the cgroups it makes ahead
    (_cgpool, Cgroup.arm); and what is kept for the next spawn: the
    Landlock rulesets (_landlock.ruleset), the protected paths' watches
    (_protected._Listings), the views' namespaces, their watches and the
    mount table they poll (_viewns); and the mount namespaces of sandboxes
    just reaped, which a thread of their own lets go (_namespaces.hold_mounts).
    The session's check drains them first and counts everything."""
    return {str(fd) for fd, target in _fds().items() if not _supervisors(target)}


def _supervisors(target: str) -> bool:
    return (
        target.startswith(("net:[", "ipc:[", "mnt:["))
        or target in ("anon_inode:[eventfd]", "anon_inode:[landlock-ruleset]", "anon_inode:inotify")
        or (target.startswith(f"/proc/{os.getpid()}/") and target.endswith("/mountinfo"))
        or (target.startswith("/sys/fs/cgroup/") and "/sbx-" in target)
    )


def _fds() -> dict[int, str]:
    """Open fds and what they point to; the fd of the listing itself (and any
    fd closed while listing) drops out because it cannot be read back."""
    out = {}
    for x in os.listdir("/proc/self/fd"):
        try:
            out[int(x)] = os.readlink(f"/proc/self/fd/{x}")
        except OSError:
            pass
    return out


def _new_fds(before: dict[int, str]) -> dict[int, str]:
    """Fds opened since `before`, but for the owner locks this process
    holds for its life (_owner: one per cgroup parent it has used, and
    those let go, kept open until exit) and its sentinel's pipe (_sentinel)."""
    from sbxlimit import _owner, _sentinel

    held = {*_owner._held.values(), *_owner._let_go, _sentinel._fd}
    return {fd: t for fd, t in _fds().items() if before.get(fd) != t and fd not in held}


def settled_temp(path: str, timeout: float = 3.0) -> set[str]:
    """The entries of `path` once the supervisor has removed the
    workspaces of closed sandboxes (renamed to *.removing at close), but
    for the ones it keeps ready (id 0: made and taken on its own thread)
    and our owner lock (held for life)."""
    import time

    ready = f"sbxlimit-{os.getpid():x}-0-"
    deadline = time.monotonic() + timeout
    while True:
        names = {n for n in os.listdir(path) if not n.startswith(ready) and n != _own_lock()}
        if not any(n.endswith(".removing") for n in names) or time.monotonic() > deadline:
            return names
        time.sleep(0.02)


def _own_lock() -> str:
    """Our owner lock in a temp directory where we made workspaces (_owner):
    held for life, removed at exit."""
    return f"sbxlimit-{os.getpid():x}.owner"


def _temp_entries() -> set[str]:
    tmp = tempfile.gettempdir()
    return {e for e in os.listdir(tmp) if e.startswith("sbxlimit") and e != _own_lock()}


def _own_cgroups() -> list[str]:
    """Sandbox cgroups of this process still present, once the supervisor
    has removed what it was retiring."""
    from sbxlimit._cgroup import discover
    from sbxlimit._monitor import get_monitor

    get_monitor().drain(_SLACK)
    prefix = f"sbx-{os.getpid():x}-"
    found = []
    for _c, parent in discover().parents:
        try:
            found += [os.path.join(parent, n) for n in os.listdir(parent) if n.startswith(prefix)]
        except OSError:
            pass
    return found


@pytest.fixture(scope="session", autouse=True)
def no_leaks():
    """Fail the session if processes, fds or temp entries leak."""
    if sys.platform == "win32":  # what follows reads /proc: there, temp entries only
        before = _temp_entries()
        yield
        assert not _temp_entries() - before, "temp entries leaked"
        return
    import sbxlimit

    # Warm up what lives for the whole process (the monitor thread, its
    # selector and wake pipe) so it does not count as a leak.
    sbxlimit.run([PY, "-c", "pass"], limits=sbxlimit.Limits(wall_time=5, output="1Mi"))
    before_fds = _fds()
    before_tmp = _temp_entries()
    yield
    import time

    from sbxlimit._monitor import get_monitor

    # What the supervisor keeps ready (cgroups, network namespaces) is not
    # a leak: it goes at exit, or now.
    get_monitor().drain(_SLACK)
    deadline = time.monotonic() + _SLACK
    while _children(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _children(os.getpid())
    # The monitor closes a leader's pidfd when it sees the exit: give it a moment.
    deadline = time.monotonic() + _SLACK
    while _new_fds(before_fds) and time.monotonic() < deadline:
        time.sleep(0.05)
    leaked_fds = _new_fds(before_fds)
    leaked_tmp = _temp_entries() - before_tmp
    leaked_cgroups = _own_cgroups()
    problems = []
    if leaked_cgroups:
        problems.append(f"cgroups left behind: {leaked_cgroups}")
    if left:
        names = {}
        for p in left:
            try:
                with open(f"/proc/{p}/comm") as f:
                    names[p] = f.read().strip()
            except OSError:
                pass
        problems.append(f"processes left running: {names}")
    if leaked_fds:
        problems.append(f"file descriptors leaked: {leaked_fds}")
    if leaked_tmp:
        problems.append(f"temp entries leaked: {sorted(leaked_tmp)}")
    assert not problems, "; ".join(problems)


@pytest.fixture(autouse=True)
def fresh_downgrade_warnings():
    """Downgrade warnings come once per process: each test starts with none
    given yet, so that what one test triggers cannot silence another's."""
    from sbxlimit import _plan

    _plan._warned.clear()


@pytest.fixture
def py() -> str:
    return PY
