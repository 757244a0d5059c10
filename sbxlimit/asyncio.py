"""Sandboxes for asyncio programs: ``sbxlimit.asyncio``.

    import sbxlimit.asyncio as sbx_asyncio

    proc = await sbx_asyncio.create_subprocess_exec(
        "python3", "tool.py", stdout=asyncio.subprocess.PIPE, limits={"memory": "256Mi"}
    )
    out, _ = await proc.communicate()
    proc.termination.reason, proc.usage()

    r = await sbx_asyncio.run(["python3", "tool.py"], capture_output=True,
                              limits={"memory": "256Mi", "wall_time": "30s"})

The child is made by the same C core as :class:`sbxlimit.Popen` (a spawn
takes about a millisecond, done in the loop's thread).  Its exit is watched
through a pidfd registered with the event loop (Linux 5.3+), elsewhere by a
loop timer; its pipes are asyncio streams.  No thread is started per
process: the limits that need watching (``wall_time``, the memory and pids
watchdogs, ``output``) are held by sbxlimit's one supervisor thread, shared
by every sandbox of the interpreter.  Cancelling a task that awaits
``wait()`` or ``communicate()`` kills the sandbox's whole tree, and reaps
it before the cancellation propagates.  ``async with proc:`` ends as
``with Popen(...)`` does.
"""

from __future__ import annotations

import sys

if sys.platform == "win32":  # its sandboxes are the POSIX supervisor's
    raise ImportError("sbxlimit.asyncio is not available on Windows yet (docs/windows.md)")

import asyncio
import os
import signal
import subprocess
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import _tracing
from ._enforcement import Enforcement
from ._errors import ConfigError, RunTimeout
from ._evidence import Usage
from ._limits import Limits
from ._policy import Policy
from ._popen import Popen
from ._quota import Quota
from ._run import SandboxResult
from ._termination import Termination
from ._units import parse_seconds

if TYPE_CHECKING:
    from ._proxy import NetEvent

__all__ = ["Process", "create_subprocess_exec", "create_subprocess_shell", "run"]

_POLL = 0.05  # exit polling where there is no pidfd
_PIPE = subprocess.PIPE


class Process:
    """The :class:`asyncio.subprocess.Process` interface for a sandbox, plus
    ``usage()``, ``termination``, ``enforced``, ``kill_tree()``,
    ``workspace`` and ``close()``; ``async with`` ends as Popen's ``with``."""

    def __init__(self, popen: Popen, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self._popen = popen
        self._loop = loop
        self._limit = limit
        self._exited: asyncio.Future[int] = loop.create_future()
        self._pidfd = -1
        self._pidfd_closer: weakref.finalize[Any, Any] | None = None
        self.stdin: asyncio.StreamWriter | None = None
        self.stdout: asyncio.StreamReader | None = None
        self.stderr: asyncio.StreamReader | None = None
        self._read_transports: list[asyncio.ReadTransport] = []  # closed by async with

    async def _connect(self) -> None:
        p, loop = self._popen, self._loop
        if p.stdin is not None:
            transport, protocol = await loop.connect_write_pipe(
                lambda: _WriteProtocol(loop), p.stdin
            )
            self.stdin = asyncio.StreamWriter(transport, protocol, None, loop)
        if p.stdout is not None:
            self.stdout = await self._reader(p.stdout)
        if p.stderr is not None:
            self.stderr = await self._reader(p.stderr)
        self._watch_exit()

    async def _reader(self, pipe: Any) -> asyncio.StreamReader:
        reader = asyncio.StreamReader(limit=self._limit, loop=self._loop)

        def protocol() -> asyncio.StreamReaderProtocol:
            return asyncio.StreamReaderProtocol(reader, loop=self._loop)

        transport, _ = await self._loop.connect_read_pipe(protocol, pipe)
        self._read_transports.append(transport)
        return reader

    # -- exit -------------------------------------------------------------

    def _watch_exit(self) -> None:
        if hasattr(os, "pidfd_open"):
            try:
                self._pidfd = os.pidfd_open(self._popen.pid)
            except OSError:
                self._pidfd = -1
        if self._pidfd >= 0:
            # Closed at the exit, or with this object if the loop is gone
            # first (a closed loop forgets its readers, and us with them).
            self._pidfd_closer = weakref.finalize(self, os.close, self._pidfd)
            self._loop.add_reader(self._pidfd, self._check_exit)
        else:
            self._loop.call_soon(self._check_exit)
        self._check_exit()

    def _check_exit(self) -> None:
        if self._exited.done():
            return
        rc = self._popen.poll()  # reaps through sbxlimit: rusage, cgroup, leftovers
        if rc is None:
            if self._pidfd < 0:
                self._loop.call_later(_POLL, self._check_exit)
            return
        if self._pidfd >= 0:
            self._loop.remove_reader(self._pidfd)
            assert self._pidfd_closer is not None
            self._pidfd_closer()
            self._pidfd = -1
        self._exited.set_result(rc)

    # -- asyncio.subprocess.Process ---------------------------------------

    @property
    def pid(self) -> int:
        return int(self._popen.pid)

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode if self._exited.done() else None

    async def wait(self) -> int:
        """Wait for the program to exit; cancelling this kills its tree, and
        the cancellation propagates once the program is reaped."""
        try:
            return await asyncio.shield(self._exited)
        except asyncio.CancelledError:
            await self._end_cancelled()
            raise

    async def communicate(self, input: bytes | None = None) -> tuple[bytes | None, bytes | None]:
        """As asyncio's: feed `input`, read both streams to EOF, wait."""
        try:
            if self.stdin is not None:
                if input:
                    self.stdin.write(input)
                    try:
                        await self.stdin.drain()
                    except (BrokenPipeError, ConnectionResetError):
                        pass
                self.stdin.close()
            out, err = await asyncio.gather(_read(self.stdout), _read(self.stderr))
            await self.wait()
            return out, err
        except asyncio.CancelledError:
            await self._end_cancelled()
            raise

    def send_signal(self, sig: int) -> None:
        self._popen.send_signal(sig)

    def terminate(self) -> None:
        self._popen.terminate()

    def kill(self) -> None:
        self._popen.kill()

    # -- sbxlimit's additions ---------------------------------------------

    def _kill_now(self) -> None:
        if not self._exited.done():
            sbx = self._popen._sbx
            sbx.caller_kills()
            sbx.signal_tree(signal.SIGKILL)

    async def _end_cancelled(self) -> None:
        """A cancelled wait: kill the tree, then wait for the reap, so that
        `returncode` and `termination` are set when the cancellation
        arrives (the kernel takes tens of ms, or more, to tear down a large
        killed process).  Unbounded after SIGKILL, as sync kill_tree() is;
        a second cancellation stops the wait."""
        self._kill_now()
        if not self._exited.done():
            try:
                await asyncio.shield(self._exited)
            except asyncio.CancelledError:
                pass  # the caller's cancellation propagates all the same

    async def kill_tree(self, grace: float | str | None = None) -> int:
        """SIGTERM to the whole tree, SIGKILL after `grace` (default
        ``limits.kill_grace``, else 5; 0: SIGKILL at once); returns the exit
        status once reaped."""
        p = self._popen
        if grace is None:
            grace = p.limits.kill_grace if p.limits is not None else 5.0
        g = parse_seconds("grace", grace, allow_zero=True)
        if self._exited.done():
            return int(self._exited.result())
        if p._sbx.owner_pid != os.getpid():
            return 0  # a fork's copy owns nothing: as its Popen, "no such child"
        p._sbx.caller_kills()
        if g > 0:
            p._sbx.signal_tree(signal.SIGTERM)
            try:
                return await asyncio.wait_for(asyncio.shield(self._exited), g)
            except TimeoutError:
                pass
        self._kill_now()
        return await asyncio.shield(self._exited)

    def usage(self) -> Usage:
        """What the sandbox used: live while it runs, final once it exited."""
        return self._popen.usage()

    @property
    def termination(self) -> Termination | None:
        """How it ended (None while it runs)."""
        return self._popen.termination if self._exited.done() else None

    @property
    def enforced(self) -> dict[str, Enforcement]:
        return self._popen.enforced

    def network_log(self) -> list[NetEvent]:
        """As :meth:`sbxlimit.Popen.network_log`."""
        return self._popen.network_log()

    @property
    def sandbox_id(self) -> str:
        return self._popen.sandbox_id

    @property
    def workspace(self) -> str | None:
        """As :attr:`sbxlimit.Popen.workspace`: readable until close() (the
        end of ``async with``); after it, the directory's path."""
        return self._popen.workspace

    @property
    def workspace_removed(self) -> bool:
        """As :attr:`sbxlimit.Popen.workspace_removed`."""
        return self._popen.workspace_removed

    def close(self) -> None:
        """Remove the private workspace, unless ``keep_workdir``; the end of
        ``async with`` calls it.  As :meth:`sbxlimit.Popen.close`, a
        sandbox still running is ended first (SIGKILL to the tree, then a
        blocking reap: end it with ``kill_tree()`` to keep the loop free)."""
        self._popen.close()
        if self._popen.returncode is not None and not self._loop.is_closed():
            self._check_exit()  # reaped just now: settle returncode at once

    async def __aenter__(self) -> Process:
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """As :class:`sbxlimit.Popen`'s ``with`` block: close the pipes, wait
        for the program to exit, then close() (the workspace).  A block
        left by a cancellation or KeyboardInterrupt does not wait: the tree
        is killed and reaped, as the sync block does after a
        KeyboardInterrupt."""
        try:
            for transport in self._read_transports:
                transport.close()
            if self.stdin is not None:
                self.stdin.close()
            if exc_type is not None and issubclass(
                exc_type, (asyncio.CancelledError, KeyboardInterrupt)
            ):
                await self._end_cancelled()
            else:
                await self.wait()
        finally:
            self.close()

    def __repr__(self) -> str:
        return f"<sbxlimit.asyncio.Process {self.pid}>"


class _WriteProtocol(asyncio.streams.FlowControlMixin, asyncio.Protocol):
    """Flow control for the stdin pipe (what asyncio's own subprocess uses)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop=loop)
        self._closed = loop.create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self._closed.done():
            self._closed.set_result(None)

    def _get_close_waiter(self, stream: asyncio.StreamWriter) -> asyncio.Future[None]:
        return self._closed


class _Admitted(Popen):
    """A Popen that holds an admission made before it (asyncio queues for
    room without blocking the loop): given back when the program exits,
    reaped or not, or now if the spawn fails, as Popen(quota=...) does."""

    def __init__(self, admission: Any, *args: Any, **kwargs: Any) -> None:
        sbx = self._sbx_handle()
        sbx.quota = admission
        try:
            super().__init__(*args, **kwargs)
        except BaseException:
            sbx.release_quota()  # a bad argument, before any spawn
            raise


async def _read(stream: asyncio.StreamReader | None) -> bytes | None:
    return None if stream is None else await stream.read()


async def create_subprocess_exec(
    program: Any,
    *args: Any,
    stdin: Any = None,
    stdout: Any = None,
    stderr: Any = None,
    limit: int = 2**16,
    limits: Limits | Mapping[str, Any] | None = None,
    policy: Policy | Mapping[str, Any] | None = None,
    **kwds: Any,
) -> Process:
    """As :func:`asyncio.create_subprocess_exec`, in a sandbox.  Every
    :class:`sbxlimit.Popen` keyword works (``cgroup_parent``, ``cwd``,
    ``env``...); bad limits raise before anything starts."""
    return await _create([program, *args], stdin, stdout, stderr, limit, limits, policy, kwds)


async def create_subprocess_shell(
    cmd: str | bytes,
    stdin: Any = None,
    stdout: Any = None,
    stderr: Any = None,
    limit: int = 2**16,
    limits: Limits | Mapping[str, Any] | None = None,
    policy: Policy | Mapping[str, Any] | None = None,
    **kwds: Any,
) -> Process:
    """As :func:`asyncio.create_subprocess_shell`, in a sandbox."""
    kwds["shell"] = True
    return await _create(cmd, stdin, stdout, stderr, limit, limits, policy, kwds)


async def _create(
    args: Any,
    stdin: Any,
    stdout: Any,
    stderr: Any,
    limit: int,
    limits: Any,
    policy: Any,
    kwds: dict[str, Any],
) -> Process:
    loop = asyncio.get_running_loop()
    # Streams are unbuffered byte pipes, as asyncio's are.
    for bad in ("text", "universal_newlines", "encoding", "errors"):
        if kwds.get(bad):
            raise ValueError(f"{bad} is not supported: asyncio streams are bytes")
    kwds.setdefault("close_fds", True)
    quota = kwds.pop("quota", None)
    admission = None
    if quota is not None:
        if not isinstance(quota, Quota):
            raise ConfigError("quota", quota, "expected a sbxlimit.Quota")
        # Queue for room without blocking the loop; Popen then holds it.
        admission = await quota.aadmit(Limits.coerce(limits), key=kwds.get("audit_key"))
    p = _Admitted(
        admission,
        args,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        bufsize=0,
        limits=limits,
        policy=policy,
        **kwds,
    )
    proc = Process(p, loop, limit)
    try:
        await proc._connect()
    except BaseException:
        p.kill_tree(grace=0)
        raise
    return proc


async def run(
    args: Any,
    *,
    input: bytes | None = None,
    capture_output: bool = False,
    timeout: float | str | None = None,
    check: bool = False,
    limits: Limits | Mapping[str, Any] | None = None,
    policy: Policy | Mapping[str, Any] | None = None,
    shell: bool = False,
    **kwds: Any,
) -> SandboxResult:
    """As :func:`sbxlimit.run`, awaited: returns a :class:`SandboxResult`.
    On `timeout` the whole tree is killed and :class:`sbxlimit.RunTimeout`
    (a TimeoutExpired) raised; when the awaiting task is cancelled, the
    tree is killed too.  The workspace is removed before it returns, unless
    ``keep_workdir``."""
    trace = _tracing.hook  # None unless sbxlimit.otel.instrument(): a span around it
    if trace is not None:
        with trace() as span:
            return await _run(
                args, input, capture_output, timeout, check, limits, policy, shell, kwds, span
            )
    return await _run(
        args, input, capture_output, timeout, check, limits, policy, shell, kwds, None
    )


async def _run(
    args: Any,
    input: bytes | None,
    capture_output: bool,
    timeout: float | str | None,
    check: bool,
    limits: Limits | Mapping[str, Any] | None,
    policy: Policy | Mapping[str, Any] | None,
    shell: bool,
    kwds: dict[str, Any],
    span: _tracing.RunSpan | None,
) -> SandboxResult:
    if input is not None:
        kwds["stdin"] = _PIPE
    if capture_output:
        kwds["stdout"] = kwds["stderr"] = _PIPE
    secs = None if timeout is None else parse_seconds("timeout", timeout)
    if shell:
        proc = await create_subprocess_shell(args, limits=limits, policy=policy, **kwds)
    elif isinstance(args, (str, bytes, os.PathLike)):
        proc = await create_subprocess_exec(args, limits=limits, policy=policy, **kwds)
    else:
        proc = await create_subprocess_exec(*args, limits=limits, policy=policy, **kwds)
    proc._popen._sbx_closed_at_reap()
    if span is not None:
        span.spawned(proc._popen)
    async with proc:
        try:
            out, err = await asyncio.wait_for(proc.communicate(input), secs)
        except TimeoutError:
            await proc.kill_tree(grace=0)
            t = proc.termination
            assert t is not None
            raise RunTimeout(t, proc.usage(), args, secs or 0.0) from None
    p = proc._popen
    rc = p.returncode
    assert rc is not None
    result = SandboxResult(
        p.args,
        rc,
        out,
        err,
        outcome=p._sbx_outcome(),
        sandbox_id=proc.sandbox_id,
        workspace=proc.workspace,
        network=proc.network_log(),
    )
    if check:
        result.check_returncode()
    return result
