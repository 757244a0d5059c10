"""Windows: the Job Object mechanism (sbxlimit/_winjob.py, _winpopen.py).

Two halves.  The planners and the pure helpers run everywhere, with the
platform layer standing in for Windows (as tests/test_macos.py does for
macOS): which job field holds each limit, what is refused under
strict=True and why, the job's fields, the environment block.  The real
sandboxes -- a limit hit ends the job with its reason, kill_tree ends the
tree, subprocess's behaviour is kept -- run on Windows only (the GitHub
workflow's windows job); elsewhere they skip, saying so.  The C layer
itself runs under Wine: tests/test_windows_wine.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
import typing
import warnings

import pytest

import sbxlimit
from sbxlimit import Limits, Mechanism, Policy, _platform, _winjob

WINDOWS = sys.platform == "win32"
on_windows = pytest.mark.skipif(not WINDOWS, reason="a Job Object needs Windows")


@pytest.fixture
def as_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_platform, "LINUX", False)
    monkeypatch.setattr(_platform, "DARWIN", False)
    monkeypatch.setattr(_platform, "WINDOWS", True)


def _by(e: str) -> str:
    """What holds it, without the caveats."""
    return str(e).split(" (", 1)[0]


# -- the plan, on any OS ---------------------------------------------------


def test_the_platform_layer_picks_the_job_planners(as_windows: None) -> None:
    assert _platform.planners() == _winjob.PLANNERS


def test_each_limit_is_held_by_its_job_field(as_windows: None) -> None:
    lim = Limits(memory="256Mi", pids=16, cpu_time="10s", cpu="500m", wall_time="30s")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing asked is downgraded
        p = _winjob.plan(lim, None)
    e = p.enforced
    assert _by(e["memory"]) == "job:JobMemoryLimit"
    assert _by(e["pids"]) == "job:ActiveProcessLimit"
    assert _by(e["cpu_time"]) == "job:PerJobUserTimeLimit"
    assert _by(e["cpu"]) == "job:CpuRateControl"
    assert _by(e["wall_time"]) == "watchdog:wall_time"
    assert _by(e["die_with_parent"]) == "job:KILL_ON_JOB_CLOSE"
    assert all(v.held for v in e.values())
    assert {v.mechanism for v in e.values()} == {Mechanism.JOB, Mechanism.WATCHDOG}
    assert not p.downgrades
    assert p.wall_time == 30


def test_the_job_gets_exactly_the_fields_it_holds(as_windows: None) -> None:
    lim = Limits(memory="64Mi", pids=4, cpu_time="1.5s", cpu="250m")
    jl = _winjob.job_limits(_winjob.plan(lim, None), lim)
    assert jl == _winjob.JobLimits(64 << 20, 4, 15_000_000, 250)
    assert _winjob.job_limits(_winjob.plan(None, Policy()), None) == _winjob.JobLimits()
    only = Limits(wall_time=5)
    assert _winjob.job_limits(_winjob.plan(only, None), only) == _winjob.JobLimits()


def test_what_windows_cannot_hold_is_said_with_the_reason(as_windows: None) -> None:
    lim = Limits(open_files=64, file_size="1Mi", address_space="1Gi")
    pol = Policy(network="deny", writable_roots=[os.path.abspath("work")])
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        p = _winjob.plan(lim, pol)
    down = p.downgrades
    for field in ("open_files", "file_size", "address_space"):
        assert field in down, field
    assert "AppContainer" in down["files"]
    assert "AppContainer" in down["network"] and "internetClient" in down["network"]
    assert "protect_dotfiles" in down
    assert not p.enforced["files"].held


def test_strict_refuses_before_anything_starts(as_windows: None) -> None:
    # The Windows Popen raises what Sandbox.prepare raises: the plan's
    # downgrades, before any process or job exists.
    p = _winjob.plan(Limits(memory="1Gi"), Policy(strict=True))
    assert p.downgrades and "files" in p.downgrades
    assert _winjob.plan(Limits(memory="1Gi"), None).downgrades == {}


def test_the_environment_block() -> None:
    block = _winjob.env_block({"path": "C:\\bin", "A": "1", "=C:": "C:\\"})
    assert block == "=C:=C:\\\0A=1\0path=C:\\bin\0\0"
    assert _winjob.env_block({}) == "\0\0"
    for bad in ({"A=B": "1"}, {"A": "x\0y"}, {"": "1"}):
        with pytest.raises(ValueError):
            _winjob.env_block(bad)


@pytest.mark.skipif(WINDOWS, reason="the POSIX Popen is the one elsewhere")
def test_popen_is_the_posix_one_elsewhere() -> None:
    from sbxlimit import _popen

    assert sbxlimit.Popen is _popen.Popen


# -- real sandboxes, on Windows ----------------------------------------------

PY = sys.executable


def _run(code: str, **kw: object) -> sbxlimit.SandboxResult:
    return sbxlimit.run([PY, "-c", textwrap.dedent(code)], capture_output=True, **kw)  # type: ignore[arg-type]


@on_windows
def test_a_program_in_a_job_keeps_subprocess_behaviour() -> None:
    from sbxlimit import _winpopen

    assert sbxlimit.Popen is _winpopen.Popen
    with sbxlimit.Popen(
        [PY, "-c", "import sys; print(sys.stdin.read().upper())"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        limits={"memory": "512Mi", "pids": 8},
        creationflags=subprocess.CREATE_NEW_PROCESS_GROUP,
    ) as p:
        out, _ = p.communicate("hello", timeout=60)
    assert out.strip() == "HELLO"
    assert p.returncode == 0
    t = p.termination
    assert t is not None and t.reason == "exited"
    assert _by(p.enforced["memory"]) == "job:JobMemoryLimit"
    assert p.usage().cpu_user is not None


@on_windows
def test_the_program_is_in_its_job() -> None:
    code = """
        import ctypes
        k = ctypes.windll.kernel32
        r = ctypes.c_int()
        k.IsProcessInJob(k.GetCurrentProcess(), None, ctypes.byref(r))
        print(r.value)
    """
    r = _run(code, limits={"pids": 4})
    assert r.stdout.strip() == b"1"


@on_windows
def test_memory_limit_ends_the_job() -> None:
    r = _run("b = bytearray(512 * 1024 * 1024)", limits={"memory": "128Mi"}, timeout=60)
    assert r.termination.reason == "memory", r.termination.message
    assert r.termination.mechanism == "job:JobMemoryLimit"


@on_windows
def test_pids_limit_ends_the_job() -> None:
    code = f"""
        import subprocess
        ps = [subprocess.Popen([{PY!r}, "-c", "import time; time.sleep(20)"]) for _ in range(4)]
    """
    r = _run(code, limits={"pids": 2}, timeout=60)
    assert r.termination.reason == "pids", r.termination.message


@on_windows
def test_cpu_time_limit_ends_the_job() -> None:
    r = _run("while True: pass", limits={"cpu_time": "1s"}, timeout=60)
    assert r.termination.reason == "cpu_time", r.termination.message
    assert r.returncode == _winjob.ERROR_NOT_ENOUGH_QUOTA


@on_windows
def test_wall_time_ends_the_job() -> None:
    start = time.monotonic()
    r = _run("import time; time.sleep(60)", limits={"wall_time": "1s"}, timeout=60)
    assert r.termination.reason == "wall_time"
    assert time.monotonic() - start < 30


@on_windows
def test_disk_limit_ends_the_job() -> None:
    code = "open('f', 'wb').write(b'x' * (4 << 20)); import time; time.sleep(30)"
    r = _run(code, limits={"disk": "1Mi"}, timeout=60)
    assert r.termination.reason == "disk", r.termination.message
    assert r.workspace is not None


@on_windows
def test_output_limit_ends_the_job() -> None:
    code = "import sys, time; sys.stdout.write('x' * 100000); sys.stdout.flush(); time.sleep(30)"
    r = _run(code, limits={"output": "1Ki"}, timeout=60)
    assert r.termination.reason == "output", r.termination.message
    assert len(r.stdout) == 1024


@on_windows
def test_output_truncated_keeps_it_running() -> None:
    code = "import sys; sys.stdout.write('x' * 5000); sys.stderr.write('e'); print('end')"
    r = _run(code, limits={"output": "1Ki", "truncate_output": True}, timeout=60)
    assert r.termination.reason == "exited" and r.returncode == 0
    assert r.stdout.startswith(b"x" * 1024) and b"truncated at 1024 bytes" in r.stdout
    assert r.stderr == b"e"


@on_windows
def test_kill_tree_ends_the_child_and_its_child() -> None:
    code = f"""
        import subprocess, sys
        c = subprocess.Popen([{PY!r}, "-c", "import time; time.sleep(60)"])
        print(c.pid, flush=True)
        c.wait()
    """
    p = sbxlimit.Popen([PY, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, limits={})
    grandchild = int(p.stdout.readline())  # type: ignore[union-attr]
    p.kill_tree()
    assert p.returncode is not None
    import ctypes

    k = ctypes.windll.kernel32  # type: ignore[attr-defined]
    h = k.OpenProcess(0x00100000, False, grandchild)  # SYNCHRONIZE
    try:
        assert not h or k.WaitForSingleObject(h, 10000) == 0
    finally:
        if h:
            k.CloseHandle(h)
    p.stdout.close()  # type: ignore[union-attr]
    t = p.termination
    assert t is not None and t.reason == "exited"


@on_windows
def test_strict_policy_raises_before_the_program_starts(tmp_path) -> None:
    mark = tmp_path / "ran"
    with pytest.raises(sbxlimit.UnsupportedError):
        sbxlimit.Popen([PY, "-c", f"open({str(mark)!r}, 'w')"], policy={"strict": True})
    assert not mark.exists()


@on_windows
def test_what_is_posix_only_says_so() -> None:
    r = subprocess.run([PY, "-m", "sbxlimit", "doctor"], capture_output=True, text=True)
    assert r.returncode == 1 and "not available on Windows yet" in r.stderr
    with pytest.raises(ImportError, match="not available on Windows yet"):
        import sbxlimit.asyncio  # noqa: F401


@on_windows
def test_doctor_tries_each_job_limit() -> None:
    report = sbxlimit.doctor()
    names = {c.name for c in report.checks}
    assert {"job", "job_memory", "job_pids", "job_cpu_time", "job_cpu_rate"} <= names
    assert report.check("job").status == "ok"
    assert _by(report.summary["memory"]) == "job:JobMemoryLimit"


def test_doctor_has_a_windows_branch(as_windows: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # Off Windows the probes cannot make a job (the core has no job_*): each
    # says its probe failed; what is checked here is that the branch is
    # reached and the summary is the job planners'.
    from sbxlimit import _doctor, _windoctor

    monkeypatch.setattr(_doctor, "_LINUX", False)
    report = _doctor.doctor()
    names = [c.name for c in report.checks]
    assert names == [p.__name__.removeprefix("_check_") for p in _windoctor.PROBES]
    assert names == [
        "job",
        "job_memory",
        "job_pids",
        "job_cpu_time",
        "job_cpu_rate",
        "kill_tree",
        "files_network",
    ]
    assert _by(report.summary["memory"]) == "job:JobMemoryLimit"
    assert not report.summary["files"].held
    assert report.check("files_network").status == "unavailable"


def test_the_windows_modules_type_check_for_windows() -> None:
    # mypy on Linux sees the Windows calls as Any (the core's job_* exist in
    # the stub's win32 block only): checked here as Windows sees them.
    import importlib.util

    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (pip install -e '.[dev]')")
    pkg = os.path.dirname(sbxlimit.__file__)
    mods = [os.path.join(pkg, f) for f in ("_winjob.py", "_winpopen.py", "_windoctor.py")]
    mypy = [sys.executable, "-m", "mypy", "--strict", "--platform", "win32", "--no-incremental"]
    r = subprocess.run(
        [*mypy, "--follow-imports", "silent", *mods],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(pkg),
    )
    assert r.returncode == 0, r.stdout


# -- one job's supervisor, against a model of the core ----------------------


class FakeCore:
    """The core's job_* as Windows behaves (docs/windows.md): messages come
    from a queue, a kill empties the job (ACTIVE_PROCESS_ZERO), usage is
    what the test says."""

    JOB_MSG_END_OF_JOB_TIME = 1
    JOB_MSG_ACTIVE_PROCESS_LIMIT = 3
    JOB_MSG_ACTIVE_PROCESS_ZERO = 4
    JOB_MSG_NEW_PROCESS = 6
    JOB_MSG_EXIT_PROCESS = 7
    JOB_MSG_JOB_MEMORY_LIMIT = 10
    REASONS: typing.ClassVar = {10: "memory", 3: "pids", 1: "cpu_time"}

    def __init__(self) -> None:
        import queue

        self.events: queue.Queue[tuple[int, int]] = queue.Queue()
        self.kills: list[int] = []
        self.closed = False
        self.created: tuple[int, ...] = ()
        self.usage = (12_000_000, 3_000_000, 3, 1, 0, 0, 0, 0, 70 << 20, 40 << 20)
        self.cpu_time_reached = False
        self.flood = False  # a message always waiting (a fork loop)

    def job_create(self, *limits: int) -> tuple[object, int, None]:
        self.created = limits
        return object(), 1 if limits[3] else 0, None

    def job_next_event(self, job: object, ms: int) -> tuple[int, int] | None:
        import queue

        if self.flood and self.events.empty():
            return (self.JOB_MSG_NEW_PROCESS, 1)
        try:
            return self.events.get(timeout=ms / 1000)
        except queue.Empty:
            return None

    def job_msg_reason(self, msg: int) -> str | None:
        return self.REASONS.get(msg)

    def job_usage(self, job: object) -> tuple[int, ...]:
        return self.usage

    def job_kill(self, job: object, code: int) -> None:
        self.kills.append(code)
        self.events.put((self.JOB_MSG_ACTIVE_PROCESS_ZERO, 0))

    def job_cpu_time_reached(self, job: object) -> bool:
        return self.cpu_time_reached

    def job_close(self, job: object) -> None:
        self.closed = True


@pytest.fixture
def core(as_windows: None, monkeypatch: pytest.MonkeyPatch) -> FakeCore:
    fake = FakeCore()
    monkeypatch.setattr(_winjob, "_core", fake)
    return fake


def _job(limits: Limits) -> _winjob.Job:
    job = _winjob.Job(limits, _winjob.plan(limits, None), "prog")
    job.start(1)
    return job


def _wait_for(cond: typing.Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        time.sleep(0.01)
    assert cond()


def test_the_job_is_made_with_its_fields(core: FakeCore) -> None:
    job = _job(Limits(memory="64Mi", pids=4, cpu_time="2s", cpu="1500m"))
    assert core.created == (64 << 20, 4, 20_000_000, 1500)
    job.finish(0)
    assert core.closed and core.kills == [_winjob.KILL_EXIT_CODE]  # leftovers end with it


def test_a_memory_message_ends_the_job(core: FakeCore) -> None:
    lim = Limits(memory="64Mi")
    job = _job(lim)
    core.events.put((core.JOB_MSG_JOB_MEMORY_LIMIT, 0))
    _wait_for(lambda: bool(core.kills))
    job.finish(1)
    t = job.outcome(1, _winjob.plan(lim, None).enforced).termination()
    assert t.reason == "memory" and t.mechanism == "job:JobMemoryLimit"
    assert t.observed == 70 << 20 and t.limit == 64 << 20
    assert job.usage().cpu_user == 1.2 and job.usage().memory_peak == 70 << 20


def test_a_process_limit_message_ends_the_job(core: FakeCore) -> None:
    lim = Limits(pids=2)
    job = _job(lim)
    core.events.put((core.JOB_MSG_NEW_PROCESS, 7))
    core.events.put((core.JOB_MSG_ACTIVE_PROCESS_LIMIT, 0))
    _wait_for(lambda: bool(core.kills))
    job.finish(_winjob.KILL_EXIT_CODE)
    t = job.outcome(_winjob.KILL_EXIT_CODE, _winjob.plan(lim, None).enforced).termination()
    assert t.reason == "pids" and t.mechanism == "job:ActiveProcessLimit"


def test_a_tolerated_limit_is_a_hit_not_an_end(core: FakeCore) -> None:
    lim = Limits(memory="64Mi", tolerate=["memory"])
    job = _job(lim)
    core.events.put((core.JOB_MSG_JOB_MEMORY_LIMIT, 0))
    time.sleep(0.3)
    assert core.kills == []
    core.events.put((core.JOB_MSG_ACTIVE_PROCESS_ZERO, 0))
    job.finish(0)
    t = job.outcome(0, _winjob.plan(lim, None).enforced).termination()
    assert t.reason == "exited" and "memory" in t.hits


def test_the_user_time_limit_is_proven_by_the_jobs_count(core: FakeCore) -> None:
    # Windows ends the job itself (status 1816) and posts nothing.
    lim = Limits(cpu_time="1s")
    job = _job(lim)
    core.cpu_time_reached = True
    core.events.put((core.JOB_MSG_ACTIVE_PROCESS_ZERO, 0))
    _wait_for(job._empty.is_set)
    job.finish(_winjob.ERROR_NOT_ENOUGH_QUOTA)
    t = job.outcome(_winjob.ERROR_NOT_ENOUGH_QUOTA, {}).termination()
    assert t.reason == "cpu_time" and t.mechanism == "job:PerJobUserTimeLimit"
    assert core.kills == []  # nothing left to kill


def test_1816_without_the_count_is_an_exit(core: FakeCore) -> None:
    lim = Limits(cpu_time="100s")
    job = _job(lim)
    core.events.put((core.JOB_MSG_ACTIVE_PROCESS_ZERO, 0))
    job.finish(_winjob.ERROR_NOT_ENOUGH_QUOTA)
    assert job.outcome(_winjob.ERROR_NOT_ENOUGH_QUOTA, {}).termination().reason == "exited"


def test_wall_time_terminates_the_job(core: FakeCore) -> None:
    lim = Limits(wall_time="0.2s")
    start = time.monotonic()
    job = _job(lim)
    _wait_for(lambda: bool(core.kills))
    assert 0.15 < time.monotonic() - start < 3
    job.finish(_winjob.KILL_EXIT_CODE)
    t = job.outcome(_winjob.KILL_EXIT_CODE, {}).termination()
    assert t.reason == "wall_time" and t.mechanism == "watchdog:wall_time"


def test_wall_time_holds_under_a_stream_of_messages(core: FakeCore) -> None:
    # A fork loop's messages never leave the port empty.
    core.flood = True
    job = _job(Limits(wall_time="0.2s"))
    _wait_for(lambda: bool(core.kills), timeout=3)
    core.flood = False
    job.finish(_winjob.KILL_EXIT_CODE)
    assert job.outcome(_winjob.KILL_EXIT_CODE, {}).termination().reason == "wall_time"


def test_kill_tree_is_the_callers(core: FakeCore) -> None:
    job = _job(Limits(memory="1Gi"))
    job.caller_kills()
    job.finish(_winjob.KILL_EXIT_CODE)
    t = job.outcome(_winjob.KILL_EXIT_CODE, {}).termination()
    assert t.reason == "exited" and t.returncode == _winjob.KILL_EXIT_CODE
    assert core.kills and core.closed


def test_disk_is_the_workspaces_size_sampled(as_windows: None) -> None:
    p = _winjob.plan(Limits(disk="1Mi"), None)
    assert _by(p.enforced["disk"]) == "watchdog:disk"
    assert p.workspace and p.disk == 1 << 20  # a private one, as on POSIX
    workdir = os.path.abspath("somewhere")
    assert not _winjob.plan(Limits(disk="1Mi"), Policy(workdir=workdir)).workspace


def test_tree_size(tmp_path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 1000)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b").write_bytes(b"y" * 24)
    try:
        (tmp_path / "link").symlink_to(tmp_path / "a")  # not followed
    except OSError:  # Windows without the symlink privilege
        pass
    assert _winjob.tree_size(str(tmp_path)) == 1024


def test_the_disk_watchdog_ends_the_job(core: FakeCore, tmp_path) -> None:
    lim = Limits(disk="4Ki")
    job = _winjob.Job(lim, _winjob.plan(lim, None), "prog")
    job.watch_dir, job.interval = str(tmp_path), 0.02
    job.start(1)
    time.sleep(0.1)
    assert core.kills == []
    (tmp_path / "big").write_bytes(b"z" * 8192)
    _wait_for(lambda: bool(core.kills))
    job.finish(_winjob.KILL_EXIT_CODE)
    t = job.outcome(_winjob.KILL_EXIT_CODE, {}).termination()
    assert t.reason == "disk" and t.mechanism == "watchdog:disk" and t.observed == 8192
    assert job.usage().disk == 8192


def test_output_is_held_by_a_pump(as_windows: None) -> None:
    p = _winjob.plan(Limits(output="1Mi", truncate_output=True), None)
    assert str(p.enforced["output"]) == "supervisor:output (truncated, not killed)"
    assert p.output == 1 << 20 and p.truncate_output


def _pump(cap: int, truncate: bool, over: typing.Any = None) -> tuple[_winjob.OutputPump, int, int]:
    r, w = os.pipe()
    dr, dw = os.pipe()
    pump = _winjob.OutputPump(
        os.fdopen(r, "rb", buffering=0),
        os.fdopen(dw, "wb", buffering=0),
        cap=cap,
        truncate=truncate,
        stream="stdout",
        over=over or (lambda stream, n: None),
    )
    pump.start()
    return pump, w, dr


def _drain(fd: int) -> bytes:
    out = b""
    while chunk := os.read(fd, 65536):
        out += chunk
    os.close(fd)
    return out


def test_the_pump_passes_up_to_the_cap_then_ends_the_sandbox() -> None:
    calls: list[tuple[str, int]] = []
    pump, w, dr = _pump(10, False, lambda stream, n: calls.append((stream, n)))
    os.write(w, b"0123456789abcdef")
    os.write(w, b"more")
    os.close(w)
    assert _drain(dr) == b"0123456789"
    assert pump.done.wait(5)
    # Once, with what was written when the cap was passed (one read or two).
    assert len(calls) == 1 and calls[0][0] == "stdout" and calls[0][1] in (16, 20)
    assert pump.count == 20


def test_the_pump_truncates_with_a_mark_and_never_cuts_a_character() -> None:
    pump, w, dr = _pump(4, True)
    os.write(w, "abcé!".encode())  # é is 2 bytes at offsets 3-4: cut before it
    os.close(w)
    assert _drain(dr) == b"abc\n[sbxlimit: output truncated at 4 bytes]\n"
    assert pump.done.wait(5) and pump.count == 6


def test_the_pump_under_its_cap_passes_everything() -> None:
    pump, w, dr = _pump(1 << 20, False)
    data = os.urandom(300_000)
    t = threading.Thread(target=lambda: (os.write(w, data), os.close(w)))
    t.start()
    assert _drain(dr) == data
    t.join()
    assert pump.done.wait(5)


def test_an_output_pump_ends_the_job(core: FakeCore) -> None:
    lim = Limits(output="1Ki")
    job = _job(lim)
    job.output_over("stderr", 5000)
    _wait_for(lambda: bool(core.kills))
    job.finish(_winjob.KILL_EXIT_CODE)
    t = job.outcome(_winjob.KILL_EXIT_CODE, {}).termination()
    assert t.reason == "output" and t.observed == 5000 and "stderr" in t.message


def test_the_windows_steps_are_the_job_layers() -> None:
    # sbxlimit.STEPS on Windows (csrc/windows/_corewin.c) names every step
    # the job layer can fail at, and no other.
    import re

    csrc = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc")
    if not os.path.isdir(csrc):
        pytest.skip("the C sources are not next to the tests (installed package)")
    windows = os.path.join(csrc, "windows")
    with open(os.path.join(windows, "_corewin.c")) as f:
        binding = f.read()
    listed = re.search(r"STEPS\[\] = \{(.*?)\};", binding, re.S)
    assert listed is not None
    steps = re.findall(r'"([a-z_:]+)"', listed.group(1))
    used = set()
    for name in ("job.c", "spawn.c"):
        with open(os.path.join(windows, name)) as f:
            used |= set(re.findall(r'"((?:job|spawn):[a-z_]+)"', f.read()))
    assert steps[0] == "none" and len(steps) == len(set(steps))
    assert set(steps[1:]) == used
