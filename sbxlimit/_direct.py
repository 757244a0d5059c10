"""``run()`` without ``subprocess.Popen``, for a call that needs nothing of it.

A sandbox whose program inherits the caller's stdin, stdout and stderr
(no pipe, no ``input``, no text mode) and is waited for by the main thread
that made it needs none of what subprocess builds around a child: its
pipes and file objects, ``communicate()``, its polling timed wait, its
``__del__`` bookkeeping.  That machinery is some 25 us of Python a spawn,
4-5% of the cheapest sandbox (docs/performance.md).  Here ``run()`` drives
the same ``Sandbox`` a Popen drives, through the same calls (configure,
spawn, started, reap, exited, close), and nothing else.

Only the main thread: a sandbox started from another thread is ended at
the interpreter's exit through its Popen (``_popen._end_at_exit``); one
the main thread waits for cannot outlive its ``run()``.
"""

from __future__ import annotations

import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from ._errors import RunTimeout
from ._limits import Limits
from ._sandbox import DEFAULT_INTERVAL, Sandbox
from ._termination import program_name

__all__ = ["eligible", "run"]

# run()'s keywords this path takes (the rest go to subprocess.Popen) ...
_OWN = frozenset(
    {
        "cwd",
        "env",
        "cgroup_parent",
        "sample_interval",
        "die_with_parent",
        "audit_key",
        "warn_at",
        "quota",
    }
)
# ... and subprocess's, when they ask for what it does by default.
_DEFAULTS = {"stdin": None, "stdout": None, "stderr": None}
_POLL_MAX = 2**31 - 1  # poll()'s timeout is an int of milliseconds
_EXITED_NOW = os.WEXITED | os.WNOWAIT | os.WNOHANG


def eligible(popenargs: tuple[Any, ...], kwargs: Mapping[str, Any], limits: Any) -> bool:
    """This call can skip subprocess.Popen: an argument list, nothing but
    the sandbox's own keywords (and subprocess's defaults), no output cap
    (its pumps pass the output on through Popen), the main thread."""
    if len(popenargs) != 1:
        return False
    args = popenargs[0]
    if (type(args) is not list and type(args) is not tuple) or not args:
        return False
    for k, v in kwargs.items():
        if k not in _OWN and (k not in _DEFAULTS or v is not None):
            return False
    if limits is not None:
        lim = Limits.coerce(limits)
        if lim is not None and lim.output is not None:
            return False
    return threading.current_thread() is threading.main_thread()


def _nothing() -> None:
    pass


def run(
    args: list[Any] | tuple[Any, ...],
    limits: Any,
    policy: Any,
    timeout: float | None,
    kwargs: Mapping[str, Any],
) -> tuple[int, Sandbox]:
    """Run `args` in a sandbox and wait for it, as run() does through a
    Popen: (its exit code, the Sandbox closed).  A timeout or an exception
    (KeyboardInterrupt) ends the whole tree before it propagates."""
    sbx = Sandbox()
    cwd, env = kwargs.get("cwd"), kwargs.get("env")
    sbx.configure(
        limits,
        policy,
        user=None,
        group=None,
        cgroup_parent=kwargs.get("cgroup_parent"),
        sample_interval=kwargs.get("sample_interval", DEFAULT_INTERVAL),
        die_with_parent=kwargs.get("die_with_parent"),
        audit_key=kwargs.get("audit_key"),
        warn_at=kwargs.get("warn_at", 0.9),
        quota=kwargs.get("quota"),
    )
    try:
        # run() closes it right after the reap (see Popen._sbx_closed_at_reap).
        sbx.closed_at_reap = not sbx.plan.keep_workspace
        argv = list(args)
        sys.audit("subprocess.Popen", argv[0], argv, cwd, env)
        pid = sbx.spawn(
            argv,
            argv[0],
            env=env,
            cwd=cwd,
            preexec_fn=None,
            close_fds=True,
            pass_fds=(),
            stdio=(-1, -1, -1, -1, -1, -1),
            devnull=-1,
            restore_signals=True,
            start_new_session=False,
            process_group=-1,
            gid=None,
            gids=None,
            uid=None,
            umask=-1,
            handed_over=_nothing,
        )
    except BaseException:
        if sbx.pid > 0:  # interrupted as spawn() returned: the child runs
            _kill(sbx)
        sbx.release_quota()
        sbx.finalize(reaped=sbx.failed_status is not None or sbx.gone)
        raise
    try:
        try:
            # What needs no exit is done while the program runs.
            sbx.program = program_name(args)
            # A watch of timers alone is made only if the program outlives
            # the first of them (Monitor.defer): most do not.
            sbx.started(pid, piped=False, defer=True)
            sbx.id  # noqa: B018  (made now, not after the exit)
            if timeout is not None:
                _wait_exit(sbx, timeout)
            _pid, sts = sbx.reap(0)
            rc = _exited(sbx, sts)
        except subprocess.TimeoutExpired:
            rc = _kill(sbx)
            o = sbx.outcome(rc, created=True)
            assert timeout is not None
            raise RunTimeout(o.termination(), o.usage(), args, timeout) from None
        except BaseException:
            _kill(sbx)
            raise
    finally:
        # As a Popen's with-block ends (a kill interrupted in turn is tried
        # again), then as it is dropped: the workspace goes only once the
        # program is reaped.
        if sbx.returncode is None:
            _kill(sbx)
        if sbx.holds_files:
            try:
                sbx.close_workspace()
            finally:
                sbx.finalize(reaped=sbx.gone)
    return rc, sbx


def _exited(sbx: Sandbox, sts: int) -> int:
    rc = os.waitstatus_to_exitcode(sts)
    sbx.exited(rc)
    return rc


def _wait_exit(sbx: Sandbox, timeout: float) -> None:
    """Until the leader exits (it is not reaped) or `timeout` passes:
    TimeoutExpired then, the program still running.  An infinite (or NaN)
    timeout waits for ever, as subprocess's."""
    end = time.monotonic() + timeout
    try:
        fd = os.pidfd_open(sbx.pid)
    except OSError:  # Linux before 5.3
        _poll_exit(sbx, end, timeout)
        return
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while True:
            left = end - time.monotonic()
            # Whole milliseconds, rounded up: never early (inf, NaN and
            # what poll() cannot take: its longest, again and again).
            ms = max(0, math.ceil(left * 1000)) if left < _POLL_MAX / 1000 else _POLL_MAX
            if poller.poll(ms):
                return
            if time.monotonic() >= end:
                raise subprocess.TimeoutExpired(sbx.program, timeout)
    finally:
        os.close(fd)


def _poll_exit(sbx: Sandbox, end: float, timeout: float) -> None:
    """subprocess's way, without a pidfd: a poll that backs off."""
    delay = 0.0005
    while True:
        try:
            if os.waitid(os.P_PID, sbx.pid, _EXITED_NOW) is not None:
                return
        except ChildProcessError:
            return  # reaped elsewhere: the reap says so
        left = end - time.monotonic()
        if left <= 0:
            raise subprocess.TimeoutExpired(sbx.program, timeout)
        delay = min(delay * 2, left, 0.05)
        time.sleep(delay)


def _kill(sbx: Sandbox) -> int:
    """Popen.kill_tree(grace=0): the whole tree SIGKILLed, the leader
    reaped, exited() called; its exit code.  Done already: nothing."""
    if sbx.returncode is not None:
        return sbx.returncode
    if sbx.gone:
        # Interrupted after the reap: its record finished without a wait
        # (the pid may be another process's by now).
        sts = sbx.status
        if sts is None:
            sts = sbx.reaped(sbx.wait_status, sbx.rusage, time.monotonic())
        return _exited(sbx, sts)
    # What the leader leaves in its group is killed at reap, while its
    # zombie still pins the group id (Sandbox.reap).
    sbx.kill_group = sbx.pgid
    pid, sts = sbx.reap(os.WNOHANG)
    if pid == 0:
        sbx.caller_kills()
        sbx.signal_tree(signal.SIGKILL)
        _pid, sts = sbx.reap(0)
    return _exited(sbx, sts)
