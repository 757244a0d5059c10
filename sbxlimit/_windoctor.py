"""``doctor()`` on Windows: each Job Object limit tried for real.

Each check makes a job with one limit, starts a child (this interpreter)
in it through the core's spawn, and reads what happened: the exit status
and the job's completion messages.  Every wait is bounded.  ``_doctor``
calls these on Windows only (``PROBES``).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from ._doctor import DEGRADED, OK, UNAVAILABLE, Check
from ._winjob import ERROR_NOT_ENOUGH_QUOTA, KILL_EXIT_CODE

if sys.platform == "win32":
    import _winapi

    from . import _core
else:  # imported by the tests everywhere; run on Windows only
    _winapi: Any = None
    _core: Any = None

__all__ = ["PROBES"]

_WAIT_MS = 15_000
_FIX = "run on Windows 10 or later; see docs/windows.md"
_MIB = 1 << 20


# The interpreter itself: in a venv, sys.executable is a launcher that
# starts it as a second process, which a process limit of 1 would count.
_PYTHON = getattr(sys, "_base_executable", None) or sys.executable


def _child(job: object, code: str) -> tuple[int, int]:
    """Start `python -c code` in `job`; (process handle, how)."""
    cmd = subprocess.list2cmdline([_PYTHON, "-I", "-c", code])
    hp, ht, _pid, _tid, how = _core.job_spawn(
        job, _PYTHON, cmd, None, None, None, None, None, [], 0
    )
    _winapi.CloseHandle(ht)
    return hp, how


def _end(hp: int, ms: int = _WAIT_MS) -> int | None:
    """The child's exit status, or None if it is still running after `ms`."""
    try:
        if _winapi.WaitForSingleObject(hp, ms) != _winapi.WAIT_OBJECT_0:
            return None
        status: int = _winapi.GetExitCodeProcess(hp)
        return status
    finally:
        _winapi.CloseHandle(hp)


def _messages(job: object, ms: int = 2000) -> list[str]:
    """The job's messages until it is empty (or `ms` passed), by name."""
    names: list[str] = []
    end = time.monotonic() + ms / 1000
    while time.monotonic() < end:
        ev = _core.job_next_event(job, 100)
        if ev is None:
            continue
        names.append(_core.job_msg_name(ev[0]) or str(ev[0]))
        if ev[0] == _core.JOB_MSG_ACTIVE_PROCESS_ZERO:
            break
    return names


def _trial(
    name: str, limits: tuple[int, int, int, int], code: str, judge: Callable[..., Check]
) -> Check:
    job, cpu_rate, rate_error = _core.job_create(*limits)
    try:
        hp, how = _child(job, code)
        status = _end(hp)
        if status is None:
            _core.job_kill(job, KILL_EXIT_CODE)
        return judge(status, _messages(job), how, cpu_rate, rate_error)
    except OSError as e:
        return Check(name, UNAVAILABLE, f"{e.filename}: {e.strerror}", _FIX)
    finally:
        _core.job_close(job)


def _check_job() -> Check:
    def judge(status: int | None, msgs: list[str], how: int, *_: Any) -> Check:
        if status != 0:
            return Check("job", UNAVAILABLE, f"a child in a job ended with {status}", _FIX)
        way = (
            "created inside it (PROC_THREAD_ATTRIBUTE_JOB_LIST)"
            if how == _core.JOB_HOW_JOB_LIST
            else "created suspended, assigned, resumed (no JOB_LIST before Windows 10)"
        )
        return Check(
            "job",
            OK,
            f"a child runs in a Job Object from birth: {way}; KILL_ON_JOB_CLOSE, no breakaway",
            details={"messages": msgs},
        )

    return _trial("job", (0, 0, 0, 0), "pass", judge)


def _check_job_memory() -> Check:
    code = "import sys\ntry:\n    b = bytearray(512 << 20)\nexcept MemoryError:\n    sys.exit(3)"

    def judge(status: int | None, msgs: list[str], *_: Any) -> Check:
        if status == 3 and "job_memory_limit" in msgs:
            return Check("job_memory", OK, "JobMemoryLimit refused 512 MiB under 64 MiB")
        return Check(
            "job_memory",
            UNAVAILABLE,
            f"512 MiB under a 64 MiB JobMemoryLimit: status {status}, messages {msgs}",
            _FIX,
        )

    return _trial("job_memory", (64 * _MIB, 0, 0, 0), code, judge)


def _check_job_pids() -> Check:
    code = (
        "import subprocess, sys\n"
        "try:\n"
        "    subprocess.run([sys.executable, '-I', '-c', 'pass'])\n"
        "except OSError:\n"
        "    sys.exit(3)"
    )

    def judge(status: int | None, msgs: list[str], *_: Any) -> Check:
        if status == 3 and "active_process_limit" in msgs:
            return Check("job_pids", OK, "ActiveProcessLimit 1 refused a second process")
        return Check(
            "job_pids",
            UNAVAILABLE,
            f"a second process under ActiveProcessLimit 1: status {status}, messages {msgs}",
            _FIX,
        )

    return _trial("job_pids", (0, 1, 0, 0), code, judge)


def _check_job_cpu_time() -> Check:
    code = "import time\nend = time.time() + 10\nwhile time.time() < end: pass"

    def judge(status: int | None, *_: Any) -> Check:
        if status == ERROR_NOT_ENOUGH_QUOTA:
            return Check("job_cpu_time", OK, "PerJobUserTimeLimit ended a busy child at 0.2 s")
        return Check(
            "job_cpu_time",
            UNAVAILABLE,
            f"a 10 s busy loop under PerJobUserTimeLimit 0.2 s ended with {status}",
            _FIX,
        )

    return _trial("job_cpu_time", (0, 0, 2_000_000, 0), code, judge)


def _check_job_cpu_rate() -> Check:
    def judge(status: int | None, msgs: list[str], how: int, rate: int, error: Any) -> Check:
        if rate == 1 and status == 0:
            return Check("job_cpu_rate", OK, "JOBOBJECT_CPU_RATE_CONTROL_INFORMATION hard cap")
        why = f"{error[0]} failed with Windows error {error[1]}" if error else f"status {status}"
        return Check(
            "job_cpu_rate",
            DEGRADED,
            f"no CPU rate cap: {why}; Limits.cpu is unenforced",
            "Windows 8 or later",
        )

    return _trial("job_cpu_rate", (0, 0, 0, 500), "pass", judge)


def _check_kill_tree() -> Check:
    job, _rate, _err = _core.job_create(0, 0, 0, 0)
    try:
        hp, _how = _child(job, "import time; time.sleep(60)")
        time.sleep(0.2)
        _core.job_kill(job, KILL_EXIT_CODE)
        status = _end(hp, 5000)
        if status == KILL_EXIT_CODE:
            return Check("kill_tree", OK, "TerminateJobObject ends every process of the job")
        return Check("kill_tree", UNAVAILABLE, f"TerminateJobObject: status {status}", _FIX)
    except OSError as e:
        return Check("kill_tree", UNAVAILABLE, f"{e.filename}: {e.strerror}", _FIX)
    finally:
        _core.job_close(job)


def _check_files_network() -> Check:
    return Check(
        "files_network",
        UNAVAILABLE,
        "no file rules and no network deny on Windows yet: Policy's files, protect_dotfiles "
        "and network are unenforced (refused by strict=True)",
        "the AppContainer / restricted-token design in docs/windows.md is the next step",
    )


PROBES: tuple[Callable[[], Check], ...] = (
    _check_job,
    _check_job_memory,
    _check_job_pids,
    _check_job_cpu_time,
    _check_job_cpu_rate,
    _check_kill_tree,
    _check_files_network,
)
