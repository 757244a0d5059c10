"""``sbxlimit.run()``: :func:`subprocess.run` with limits, usage and termination."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import _tracing
from ._enforcement import Enforcement
from ._errors import LimitExceeded, RunTimeout
from ._evidence import Usage
from ._limits import Limits
from ._policy import Policy
from ._termination import Outcome, Termination

if sys.platform == "win32":  # the Job Object one (_winjob)
    from ._winpopen import Popen
else:
    from ._popen import Popen

if TYPE_CHECKING:
    from ._proxy import NetEvent

__all__ = ["SandboxResult", "run"]


class SandboxResult(subprocess.CompletedProcess):  # type: ignore[type-arg]
    """A :class:`subprocess.CompletedProcess` plus what the sandbox used
    (``usage``), how it ended (``termination``), what held each limit
    (``enforced``), its ``sandbox_id`` and its ``workspace``."""

    def __init__(
        self,
        args: Any,
        returncode: int,
        stdout: Any = None,
        stderr: Any = None,
        *,
        outcome: Outcome,
        sandbox_id: str | None = None,
        workspace: str | None = None,
        network: list[NetEvent] | None = None,
    ) -> None:
        super().__init__(args, returncode, stdout, stderr)
        self._outcome = outcome
        self._network = network or []
        self.sandbox_id = sandbox_id
        # The path only: run() removed the directory before returning,
        # unless keep_workdir.
        self.workspace = workspace

    @property
    def usage(self) -> Usage:
        """What the sandbox used (final figures)."""
        return self._outcome.usage()

    @property
    def termination(self) -> Termination:
        """How it ended: reason, limit, observed, mechanism, message."""
        return self._outcome.termination()

    @property
    def network(self) -> list[NetEvent]:
        """The program's connections through sbxlimit's filtering proxy
        (``allow_domains``): see :meth:`Popen.network_log`."""
        return list(self._network)

    @property
    def enforced(self) -> dict[str, Enforcement]:
        """For each limit and protection asked for, what held it."""
        return dict(self._outcome.enforced)

    def check_returncode(self) -> None:
        """Raise LimitExceeded if a limit ended the program, else
        CalledProcessError for a non-zero status."""
        if self.termination.is_limit:
            raise LimitExceeded(self.termination, self.args, self.stdout, self.stderr)
        super().check_returncode()


def run(
    *popenargs: Any,
    input: Any = None,
    capture_output: bool = False,
    timeout: float | None = None,
    check: bool = False,
    limits: Limits | Mapping[str, Any] | None = None,
    policy: Policy | Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> SandboxResult:
    """Run a command in a sandbox and wait for it; as :func:`subprocess.run`.

    Returns a :class:`SandboxResult`.  With ``check=True`` a limit hit raises
    :class:`LimitExceeded` (a :class:`subprocess.CalledProcessError`), any
    other non-zero exit :class:`subprocess.CalledProcessError`.  On
    ``timeout`` (or any exception) the whole tree is killed, not only the
    first process, before the exception propagates; a timeout raises
    :class:`RunTimeout` (a :class:`subprocess.TimeoutExpired`) with the
    killed sandbox's ``termination`` and ``usage``.
    """
    trace = _tracing.hook  # None unless sbxlimit.otel.instrument(): a span around it
    if trace is not None:
        with trace() as span:
            return _run(
                popenargs, input, capture_output, timeout, check, limits, policy, kwargs, span
            )
    return _run(popenargs, input, capture_output, timeout, check, limits, policy, kwargs, None)


def _run(
    popenargs: tuple[Any, ...],
    input: Any,
    capture_output: bool,
    timeout: float | None,
    check: bool,
    limits: Limits | Mapping[str, Any] | None,
    policy: Policy | Mapping[str, Any] | None,
    kwargs: dict[str, Any],
    span: _tracing.RunSpan | None,
) -> SandboxResult:
    if input is not None:
        if kwargs.get("stdin") is not None:
            raise ValueError("stdin and input arguments may not both be used.")
        kwargs["stdin"] = subprocess.PIPE
    if capture_output:
        if kwargs.get("stdout") is not None or kwargs.get("stderr") is not None:
            raise ValueError("stdout and stderr arguments may not be used with capture_output.")
        kwargs["stdout"] = subprocess.PIPE
        kwargs["stderr"] = subprocess.PIPE

    with Popen(*popenargs, limits=limits, policy=policy, **kwargs) as process:
        process._sbx_closed_at_reap()
        if span is not None:
            span.spawned(process)
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            process.kill_tree(grace=0)  # reaps it: the verdict is final
            t = process.termination
            assert t is not None
            u = process.usage()
            # The timeout asked for (subprocess's may carry what was left of it).
            assert timeout is not None
            raise RunTimeout(t, u, e.cmd, timeout, e.output, e.stderr) from None
        except BaseException:
            process.kill_tree(grace=0)
            raise
        retcode = process.poll()
    assert retcode is not None
    result = SandboxResult(
        process.args,
        retcode,
        stdout,
        stderr,
        outcome=process._sbx_outcome(),
        sandbox_id=process.sandbox_id,
        workspace=process.workspace,
        network=process.network_log(),
    )
    if check:
        result.check_returncode()
    return result
