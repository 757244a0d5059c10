"""``sbxlimit.run()``: :func:`subprocess.run` with limits, usage and termination."""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Callable, Mapping
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
# Linux: a call with nothing for subprocess.Popen to do skips it.
_DIRECT = sys.platform.startswith("linux")
if _DIRECT:
    from . import _direct

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
        outcome: Outcome | Callable[[], Outcome],
        sandbox_id: str | None = None,
        workspace: str | None = None,
        network: list[NetEvent] | None = None,
    ) -> None:
        super().__init__(args, returncode, stdout, stderr)
        # Or what makes it, when first asked: many callers read only the
        # return code.
        self._outcome: Outcome | Callable[[], Outcome] = outcome
        self._network = network or []
        self.sandbox_id = sandbox_id
        # The path only: run() removed the directory before returning,
        # unless keep_workdir.
        self.workspace = workspace

    def _facts(self) -> Outcome:
        o = self._outcome
        if not isinstance(o, Outcome):
            o = self._outcome = o()
        return o

    def __getstate__(self) -> dict[str, Any]:
        # Pickled with its facts, not what makes them (a Sandbox).
        self._facts()
        return self.__dict__

    @property
    def usage(self) -> Usage:
        """What the sandbox used (final figures)."""
        return self._facts().usage()

    @property
    def termination(self) -> Termination:
        """How it ended: reason, limit, observed, mechanism, message."""
        return self._facts().termination()

    @property
    def network(self) -> list[NetEvent]:
        """The program's connections through sbxlimit's filtering proxy
        (``allow_domains``): see :meth:`Popen.network_log`."""
        return list(self._network)

    @property
    def enforced(self) -> dict[str, Enforcement]:
        """For each limit and protection asked for, what held it."""
        return dict(self._facts().enforced)

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
    if (
        _DIRECT
        and span is None
        and input is None
        and not capture_output
        and (limits is not None or policy is not None)
        and _direct.eligible(popenargs, kwargs, limits)
    ):
        # Nothing for subprocess.Popen to do: the sandbox alone (_direct).
        rc, sbx = _direct.run(popenargs[0], limits, policy, timeout, kwargs)
        result = SandboxResult(
            popenargs[0],
            rc,
            outcome=functools.partial(sbx.outcome, rc, created=True),
            sandbox_id=sbx.id,
            workspace=sbx.workspace_view(),
            network=sbx.network_log(),
        )
        if check:
            result.check_returncode()
        return result
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
