"""The bridge to ``_core.spawn``: executable lookup in the parent, and the one
place that turns a child's error record into an exception.

Errors for steps that :mod:`subprocess` also has keep subprocess's exact
exception: exec failures are ``OSError`` subclasses carrying the program as
``filename``, chdir failures carry the cwd.  Other steps raise
:class:`SandboxSetupError` combined with the matching ``OSError`` subclass,
so ``except PermissionError`` still works and ``.step`` names the step.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from . import _core
from ._errors import setup_error

__all__ = ["STEPS", "child_error", "fail_child_at", "resolve_executable"]

STEPS: tuple[str, ...] = _core.STEPS
_STEP_INDEX = {name: i for i, name in enumerate(STEPS)}

# The testing switch (see sbxlimit._testing): (step index, errno) or None.
_fail_at: tuple[int, int] | None = None
_fail_lock = threading.Lock()


@contextmanager
def fail_child_at(step: str, err: int = errno.EPERM) -> Iterator[None]:
    """Make every child spawned inside the block fail at `step` with `err`."""
    global _fail_at
    if step not in _STEP_INDEX or step == "none":
        raise ValueError(f"unknown child step {step!r}; known: {', '.join(STEPS[1:])}")
    with _fail_lock:
        _fail_at = (_STEP_INDEX[step], err)
    try:
        yield
    finally:
        with _fail_lock:
            _fail_at = None


def fail_switch() -> tuple[int, int]:
    return _fail_at or (0, 0)


def _candidates(executable: bytes, env: Mapping[Any, Any] | None) -> tuple[bytes, ...]:
    if os.path.dirname(executable):
        return (executable,)
    # The same list os._execvpe and subprocess use.
    return tuple(os.path.join(os.fsencode(d), executable) for d in os.get_exec_path(env))


def resolve_executable(
    executable: bytes,
    orig: Any,
    env: Mapping[Any, Any] | None,
    *,
    child_decides: bool,
) -> tuple[bytes, ...]:
    """PATH lookup in the parent: the child gets one path to execve.

    When the answer could differ in the child (relative PATH entries with a
    cwd change, or a uid/gid change that alters permissions), the candidate
    list is passed on and the child tries each, as subprocess does.  When no
    candidate can work, raise here, before any process starts, the error the
    child's execve would have reported.
    """
    cands = _candidates(executable, env)
    if len(cands) == 1:
        return cands
    if child_decides or not all(os.path.isabs(c) for c in cands):
        return cands
    saved = 0
    for c in cands:
        try:
            st = os.stat(c)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENOTDIR) and not saved:
                saved = e.errno or errno.EACCES
            continue
        if stat.S_ISREG(st.st_mode) and os.access(c, os.X_OK, effective_ids=_EFFECTIVE):
            return (c,)
        saved = saved or errno.EACCES
    err = saved or errno.ENOENT
    raise OSError(err, os.strerror(err), orig)


_EFFECTIVE = os.access in os.supports_effective_ids


def child_error(
    step: str, err: int, detail: int, *, executable: Any, cwd: Any, reason: str | None = None
) -> BaseException:
    """The exception for a child that failed at `step` with `err` (`reason`:
    what the failing call said, where it says more than errno)."""
    message = os.strerror(err) if err else ""
    if step == "exec":
        return OSError(err, message, executable)
    if step == "chdir":
        return OSError(err, message, cwd)
    if step == "preexec_fn":
        return subprocess.SubprocessError("Exception occurred in preexec_fn.")
    return setup_error(step, err, detail, reason=reason)
