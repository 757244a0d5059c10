"""Run Python code, not a program, in a sandbox: ``ForkedSandbox``.

The C core forks this process and applies the sandbox's setup (cgroup,
rlimits, process group, parent-death signal...) exactly as for a program,
then returns into Python in the child, which runs the target and exits with
its status.  The parent side is a :class:`sbxlimit.Popen`: ``wait``,
``termination``, ``usage``, ``kill_tree`` and every limit work the same.

The child is a copy of this interpreter at the moment of the fork: with a
cgroup, memory allocated before the fork counts only as far as the child
touches (copies) it; without one, RLIMIT_DATA counts the whole inherited
data segment (callers that mean "what the target adds" raise the limit by
the parent's VmData, as the pytest plugin does).  Only the thread that
forked exists in the child.
Used by the pytest plugin for test bodies.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from ._errors import ConfigError
from ._limits import Limits
from ._policy import Policy
from ._popen import Popen

__all__ = ["ForkedSandbox"]


class ForkedSandbox(Popen):
    """``target()`` in a forked child under `limits` and `policy`.

    The child's exit status is the target's int return value (0 for None),
    a ``SystemExit`` code, or 1 after an uncaught exception (its traceback
    printed to stderr).  Results travel back however the caller arranges (a
    pipe, a file); stdin/stdout/stderr and the other keyword arguments are
    those of :class:`subprocess.Popen`, except that nothing is executed:
    ``executable``, ``env``, ``preexec_fn`` and ``close_fds`` do not apply.
    `name` is the program name used in messages.
    """

    def __init__(
        self,
        target: Callable[[], Any],
        *,
        name: str | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        policy: Policy | Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._child_created = False
        if not callable(target):
            raise ConfigError("target", target, "expected a callable")
        for bad in ("executable", "preexec_fn", "shell", "env"):
            if kwargs.get(bad) not in (None, False):
                raise ConfigError(bad, kwargs[bad], "does not apply to a forked sandbox")
        self._sbx_handle().target = target
        # Buffered output would be written twice: by us, and by the child
        # that inherits the buffer.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        label = name or getattr(target, "__qualname__", None) or "python"
        super().__init__([label], limits=limits, policy=policy, executable=sys.executable, **kwargs)
