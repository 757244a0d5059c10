"""run() without subprocess.Popen (sbxlimit/_direct.py): the calls it
takes, the same verdicts as the Popen path, the watch made only for a
program that outlives its first due time, and nothing left behind when a
timeout or an interruption ends the run."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

import sbxlimit
from sbxlimit import Limits, Policy, _direct, _monitor, _popen, _sandbox
from sbxlimit._cgroup import discover

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the direct path is Linux's"
)
PY = sys.executable
# Accepted by subprocess.Popen and meaningless without a pipe: the same
# call through the Popen path.
VIA_POPEN = {"bufsize": -1}


@pytest.fixture
def popens(monkeypatch):
    """How many sbxlimit.Popen objects were made."""
    made: list[object] = []
    real = _popen.Popen.__init__

    def counting(self, *a, **kw):
        made.append(self)
        real(self, *a, **kw)

    monkeypatch.setattr(_popen.Popen, "__init__", counting)
    return made


@pytest.fixture
def registered(monkeypatch):
    """The watches given to the supervisor."""
    got: list[_monitor.Watch] = []
    real = _monitor.Monitor.register

    def counting(self, w, **kw):
        got.append(w)
        real(self, w, **kw)

    monkeypatch.setattr(_monitor.Monitor, "register", counting)
    return got


LIM = Limits(cpu_time=10, memory="1Gi")


@pytest.mark.parametrize(
    ("kw", "direct"),
    [
        ({"limits": LIM}, True),
        ({"limits": LIM, "cgroup_parent": "none", "timeout": 30}, True),
        ({"policy": Policy(workdir="/")}, True),
        ({"limits": LIM, "stdout": None, "cwd": "/", "env": {"A": "1"}}, True),
        ({}, False),  # neither limits nor policy: subprocess's own child
        ({"limits": LIM, "capture_output": True}, False),
        ({"limits": LIM, "input": b""}, False),
        ({"limits": LIM, "stdout": -3}, False),  # DEVNULL
        ({"limits": LIM, "text": True}, False),
        ({"limits": {"output": "1Mi"}}, False),  # its pumps are Popen's
        ({"limits": LIM, **VIA_POPEN}, False),
    ],
)
def test_run_skips_subprocess_popen_only_when_nothing_of_it_is_needed(popens, kw, direct):
    r = sbxlimit.run(["true"], **kw)
    assert r.returncode == 0
    assert (len(popens) == 0) is direct


def test_run_from_another_thread_goes_through_popen(popens):
    # Its sandbox must be ended at the interpreter's exit through a Popen.
    got = []
    t = threading.Thread(target=lambda: got.append(sbxlimit.run(["true"], limits=LIM)))
    t.start()
    t.join()
    assert got[0].returncode == 0 and len(popens) == 1


def test_shell_and_string_commands_go_through_popen(popens):
    sbxlimit.run("true", shell=True, limits=LIM)
    sbxlimit.run("true", limits=LIM)
    assert len(popens) == 2


# Each ends by a different limit or way; the tree ones need the supervisor's
# watch (two processes, each under its own rlimit).
BUSY2 = "(while :; do :; done) & (while :; do :; done) & wait"
ALLOC2 = (
    f"{PY} -c 'import time; x = bytearray(150 << 20); time.sleep(5)' & "
    f"{PY} -c 'import time; x = bytearray(150 << 20); time.sleep(5)' & wait"
)
SCENARIOS = {
    "exit status": (["sh", "-c", "exit 3"], {}),
    "its own signal": (["sh", "-c", "kill -TERM $$"], {}),
    "cpu_time of a tree": (["sh", "-c", BUSY2], {"cpu_time": 1}),
    "memory of a tree": (["sh", "-c", ALLOC2], {"memory": "200Mi"}),
    "wall_time": (["sleep", "5"], {"wall_time": 0.3}),
    "file_size": (
        ["dd", "if=/dev/zero", "of=big", "bs=1M", "count=2", "status=none"],
        {"file_size": "1Mi"},
    ),
}


@pytest.mark.parametrize("cgroup", ["none", None], ids=["no cgroup", "cgroup where one can be"])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_direct_path_gives_the_popen_path_s_verdict(tmp_path, popens, name, cgroup):
    argv, limits = SCENARIOS[name]
    verdicts = []
    for extra in ({}, VIA_POPEN):
        r = sbxlimit.run(argv, limits=limits, cwd=tmp_path, cgroup_parent=cgroup, **extra)
        t = r.termination
        verdicts.append((t.reason, t.limit, t.mechanism, t.returncode, t.hits))
        if limits:
            assert t.reason == next(iter(limits)), t
    assert len(popens) == 1  # the first went the direct way
    assert verdicts[0] == verdicts[1]


def test_a_watch_is_made_only_for_a_program_that_outlives_its_first_sample(registered):
    lim = {"cpu_time": 10, "memory": "1Gi"}
    for _ in range(5):
        # (Its first sample 5 s away: a loaded machine's slow spawn too.)
        r = sbxlimit.run(["true"], limits=lim, cgroup_parent="none", sample_interval=5)
        assert r.returncode == 0
    assert registered == []  # each ended before its first sample was due
    r = sbxlimit.run(["sleep", "0.5"], limits=lim, cgroup_parent="none")
    assert r.returncode == 0
    assert len(registered) == 1
    assert registered[0].done  # and taken back at the exit


def test_a_watch_made_late_still_ends_the_tree(registered):
    # The first sample is due 1 s in: the watch is made then, by the
    # supervisor, and its later samples end the tree at the limit.
    r = sbxlimit.run(
        ["sh", "-c", BUSY2],
        limits={"cpu_time": 1.5},
        sample_interval=1.0,
        cgroup_parent="none",
    )
    assert r.termination.reason == "cpu_time"
    assert r.termination.mechanism == "watchdog:cpu_time"
    assert len(registered) == 1


def _tree_with_a_grandchild(tmp_path):
    """A program whose child outlives it unless the tree is ended: the
    child's `sleep` has a duration of its own to be found by (a PID
    namespace gives it a number of its own)."""
    mark = f"{100 + os.getpid() % 1000}.{time.monotonic_ns() % 10**6:06d}"
    started = tmp_path / "started"
    return mark, started, ["sh", "-c", f"sleep {mark} & touch {started}; sleep 100"]


def _tree_with_a_grandchild_elsewhere(tmp_path):
    """The same, with the grandchild in a session (and group) of its own:
    the group's kill at the reap misses it; only the tree's kill ends it."""
    mark, started, argv = _tree_with_a_grandchild(tmp_path)
    argv[-1] = argv[-1].replace(f"sleep {mark} &", f"setsid sleep {mark} &")
    return mark, started, argv


def _running(mark: str) -> list[int]:
    """Live processes running `sleep <mark>` (a zombie is being collected)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if argv[:2] == [b"sleep", mark.encode()] and state != "Z":
            found.append(int(pid))
    return found


def _gone(mark: str) -> bool:
    end = time.monotonic() + 5
    while _running(mark):
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def _wait_for(path) -> None:
    end = time.monotonic() + 10
    while not path.exists():
        if time.monotonic() > end:
            raise AssertionError(f"{path} never made")
        time.sleep(0.01)


# Where the tree's kill is all there is: no cgroup, no PID namespace.
WALKED = {"policy": Policy(workdir="/", isolate_pids=False), "cgroup_parent": "none"}
HOW = {"default": {}, "no cgroup, no PID namespace": WALKED}


@pytest.mark.parametrize("how", list(HOW))
@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "no pidfd (before Linux 5.3)"])
def test_a_timeout_ends_the_whole_tree(tmp_path, popens, monkeypatch, pidfd, how):
    if not pidfd:

        def no_pidfd(pid, flags=0):
            raise OSError(38, "Function not implemented")

        monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    mark, started, argv = _tree_with_a_grandchild_elsewhere(tmp_path)
    t0 = time.monotonic()
    with pytest.raises(sbxlimit.RunTimeout) as e:
        sbxlimit.run(argv, limits={"cpu_time": 10}, timeout=0.5, **HOW[how])
    assert time.monotonic() - t0 >= 0.5  # never early
    assert popens == []
    assert e.value.termination.signal == signal.SIGKILL
    assert "kill_tree() was called" in e.value.termination.message
    assert e.value.timeout == 0.5 and e.value.cmd == argv
    _wait_for(started)
    assert _gone(mark)


@pytest.mark.parametrize("how", list(HOW))
def test_an_interrupted_run_ends_the_whole_tree(tmp_path, popens, how):
    mark, _started, argv = _tree_with_a_grandchild_elsewhere(tmp_path)
    assert threading.current_thread() is threading.main_thread()
    seen = []

    def interrupt():
        # Once the grandchild runs (in a loaded guest, some time after
        # `started`); never left waiting for the program's 100 s.
        end = time.monotonic() + 30
        try:
            while not _running(mark) and time.monotonic() < end:
                time.sleep(0.01)
            seen.append(bool(_running(mark)))
        finally:
            os.kill(os.getpid(), signal.SIGINT)

    t = threading.Thread(target=interrupt)
    t.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            sbxlimit.run(argv, limits={"cpu_time": 10}, **HOW[how])
    finally:
        t.join()
    assert seen == [True] and popens == []
    assert _gone(mark)


def test_what_the_leader_leaves_in_its_group_is_ended(tmp_path, popens):
    mark, started, argv = _tree_with_a_grandchild(tmp_path)
    argv[-1] = argv[-1].replace("; sleep 100", "")  # the leader exits at once
    for isolate_pids in (True, False):  # its reaper ends it, else its group's kill
        r = sbxlimit.run(
            argv,
            limits={"cpu_time": 10},
            policy=Policy(workdir="/", isolate_pids=isolate_pids),
            cgroup_parent="none",
        )
        assert r.returncode == 0 and popens == []
        _wait_for(started)
        assert _gone(mark)
        started.unlink()


def test_a_quota_is_given_back_on_every_way_out(tmp_path):
    q = sbxlimit.Quota(max_sandboxes=1)
    assert sbxlimit.run(["true"], limits={"cpu_time": 5}, quota=q).returncode == 0
    assert q.in_use().get("sandboxes", 0) == 0
    with pytest.raises(FileNotFoundError):
        sbxlimit.run(["/nonexistent/prog"], limits={"cpu_time": 5}, quota=q)
    assert q.in_use().get("sandboxes", 0) == 0
    with pytest.raises(sbxlimit.RunTimeout):
        sbxlimit.run(["sleep", "10"], limits={"cpu_time": 5}, quota=q, timeout=0.2)
    assert q.in_use().get("sandboxes", 0) == 0


def test_a_failed_spawn_raises_as_popen_and_a_workspace_goes(tmp_path):
    # What the session's check finds left (conftest) would include the
    # failed spawn's workspace.
    for extra in ({}, VIA_POPEN):
        with pytest.raises(FileNotFoundError) as e:
            sbxlimit.run(["/nonexistent/prog"], policy=Policy(), **extra)
        assert e.value.filename == "/nonexistent/prog"
    r = sbxlimit.run(["sh", "-c", "echo hi > f"], policy=Policy())
    assert r.returncode == 0 and not os.path.exists(r.workspace)
    r = sbxlimit.run(["sh", "-c", "echo hi > f"], policy=Policy(keep_workdir=True))
    try:
        with open(os.path.join(r.workspace, "f")) as f:
            assert f.read() == "hi\n"
    finally:
        import shutil

        shutil.rmtree(r.workspace)


def test_the_direct_path_emits_the_popen_path_s_audit_events(events):
    for extra in ({}, VIA_POPEN):
        sbxlimit.run(["sh", "-c", "exit 2"], limits={"cpu_time": 5}, audit_key="k", **extra)
    runs: dict[str, list[tuple[str, object]]] = {}
    for e in events:
        runs.setdefault(e.sandbox_id, []).append((e.name, e.observed))
    assert len(runs) == 2
    first, second = runs.values()
    assert first == second
    assert first[-1] == ("exit", 2)


def test_the_result_is_the_popen_path_s(tmp_path):
    import pickle

    a, b = (
        sbxlimit.run(["sh", "-c", "exit 4"], limits={"cpu_time": 5}, **extra)
        for extra in ({}, VIA_POPEN)
    )
    # Its facts are made when first asked, pickled too (not its sandbox).
    back = pickle.loads(pickle.dumps(a))
    assert (a.args, a.returncode, a.stdout, a.stderr) == (b.args, b.returncode, b.stdout, b.stderr)
    assert a.enforced.keys() == b.enforced.keys()
    assert a.termination.message == b.termination.message
    assert back.termination == a.termination and back.usage.wall == a.usage.wall
    with pytest.raises(subprocess_error()):
        a.check_returncode()


def subprocess_error() -> type[BaseException]:
    import subprocess

    return subprocess.CalledProcessError


@pytest.mark.parametrize("timeout", [float("inf"), 1e308, float("nan")])
def test_a_timeout_of_for_ever_waits_as_subprocess_s(popens, timeout):
    r = sbxlimit.run(["sleep", "0.2"], limits={"cpu_time": 5}, timeout=timeout)
    assert r.returncode == 0 and popens == []


@pytest.mark.parametrize("how", list(HOW))
def test_a_kill_interrupted_in_turn_is_tried_again(tmp_path, monkeypatch, how):
    # A second Ctrl-C as the first's kill begins: the tree still ends.
    mark, started, argv = _tree_with_a_grandchild_elsewhere(tmp_path)
    real = _sandbox.Sandbox.caller_kills
    calls = []

    def interrupted_once(self):
        calls.append(self)
        if len(calls) == 1:
            raise KeyboardInterrupt
        real(self)

    monkeypatch.setattr(_sandbox.Sandbox, "caller_kills", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        sbxlimit.run(argv, limits={"cpu_time": 10}, timeout=0.3, **HOW[how])
    assert len(calls) == 2
    _wait_for(started)
    assert _gone(mark)


def test_an_interrupt_right_after_the_reap_still_gives_everything_back(monkeypatch, events):
    # The leader reaped, its record not yet made: the room, the cgroup and
    # the exit's audit event all the same, and no wait for a pid that may
    # be another process's by now.
    q = sbxlimit.Quota(max_sandboxes=1)
    real = _sandbox.Sandbox.reaped
    calls = []

    def interrupted_once(self, *a):
        calls.append(a)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(self, *a)

    monkeypatch.setattr(_sandbox.Sandbox, "reaped", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        sbxlimit.run(["sh", "-c", "exit 3"], limits={"cpu_time": 5}, quota=q, audit_key="k")
    assert q.in_use().get("sandboxes", 0) == 0
    assert len(calls) == 2 and calls[1][0] == calls[0][0]  # the status wait4 gave
    exits = [e for e in events if e.name == "exit"]
    assert [e.observed for e in exits] == [3]
    monkeypatch.undo()
    assert sbxlimit.run(["true"], limits={"cpu_time": 5}, quota=q).returncode == 0


def test_a_watch_handed_over_after_the_exit_is_never_made(monkeypatch, registered):
    # The supervisor took the deferred watch just as the program exited:
    # leader_exited waits for it under the signal lock, and a hand-over
    # that comes after finds the exit seen.
    monkeypatch.setattr(_monitor.Monitor, "take_back", lambda self, key: False)
    rc, sbx = _direct.run(["true"], {"cpu_time": 10}, None, None, {"cgroup_parent": "none"})
    assert rc == 0 and sbx.deferred and sbx.exit_seen
    sbx._hand_over()
    assert registered == [] and sbx.watch is None


def test_the_supervisor_s_pass_is_not_upset_by_watches_taken_back(monkeypatch):
    # take_back() beside the supervisor's pass over the deferred watches
    # (made to yield the GIL in its middle): no error in the thread, whose
    # pass would otherwise lose what it took (another sandbox's pumps).
    import builtins
    import logging

    errors = []

    class Catch(logging.Handler):
        def emit(self, record):
            if record.exc_info:
                errors.append(record.exc_info[1])

    def slow_min(*a, **kw):
        time.sleep(0.00005)
        return builtins.min(*a, **kw)

    handler = Catch()
    logging.getLogger("sbxlimit").addHandler(handler)
    monkeypatch.setattr(_monitor, "min", slow_min, raising=False)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    stop = []
    m = _monitor.get_monitor()

    def waker():
        while not stop:
            m._wake()
            time.sleep(0.0002)

    t = threading.Thread(target=waker)
    t.start()
    try:
        for _ in range(300):
            sbxlimit.run(["true"], limits={"cpu_time": 10}, cgroup_parent="none")
    finally:
        stop.append(True)
        t.join()
        sys.setswitchinterval(interval)
        logging.getLogger("sbxlimit").removeHandler(handler)
    assert errors == []


def _children() -> list[tuple[int, str]]:
    """Our child processes: (pid, state)."""
    me, out = os.getpid(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            out.append((int(pid), fields[0]))
    return out


def test_an_interrupt_while_the_child_is_made_ends_it(tmp_path):
    # A Ctrl-C that arrives while the core makes the child is raised right
    # after the core returns, with its result (the child's pid) dropped:
    # the core itself checks for it, then ends and reaps the child.  The
    # child's preexec_fn (Python, before exec) interrupts its parent while
    # the core waits for the exec: not in a PID namespace, where it cannot
    # name its parent, nor under a policy, whose filter refuses it the
    # signal (its caller is out of its reach): with a cgroup.
    site = discover()
    if not site.version:
        pytest.skip(f"no PID namespace without a cgroup, and none here: {site.reason}")
    mark, _started, _argv = _tree_with_a_grandchild(tmp_path)
    before = _children()

    def interrupt_the_parent():
        os.kill(os.getppid(), signal.SIGINT)
        time.sleep(0.2)  # the signal is in while the core still waits

    try:
        with pytest.raises(KeyboardInterrupt):
            sbxlimit.Popen(
                ["sleep", mark],
                limits={"cpu_time": 10},
                preexec_fn=interrupt_the_parent,
            )
        assert _gone(mark)
        assert _children() == before  # reaped: no zombie either
    finally:
        for pid in _running(mark):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("extra", [{}, VIA_POPEN], ids=["direct", "popen"])
def test_a_failure_after_the_child_is_made_ends_it(tmp_path, monkeypatch, extra):
    # What the spawn does once the child runs fails (here the cgroup's
    # note that it holds the child): the child is ended and reaped, not
    # left running unknown.
    site = discover()
    if not site.version:
        pytest.skip(f"the step that fails here is a cgroup's: {site.reason}")
    from sbxlimit._cgroup import Cgroup

    def fails(self):
        raise RuntimeError("after the child")

    monkeypatch.setattr(Cgroup, "spawned", fails)
    mark, _started, _argv = _tree_with_a_grandchild(tmp_path)
    before = _children()
    try:
        with pytest.raises(RuntimeError, match="after the child"):
            sbxlimit.run(["sleep", mark], limits={"cpu_time": 10}, **extra)
        assert _gone(mark)
        assert _children() == before
    finally:
        for pid in _running(mark):
            os.kill(pid, signal.SIGKILL)
