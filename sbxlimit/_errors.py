"""The exception hierarchy (SPEC section 10).

Every error sbxlimit raises on purpose derives from :class:`Error`.  Where a
subprocess-compatible error exists, ours also derives from it, so code written
for :mod:`subprocess` keeps catching what it caught before.
"""

from __future__ import annotations

import difflib
import os
import subprocess
from collections.abc import Hashable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from ._evidence import Usage
    from ._termination import Termination

__all__ = [
    "CallTimeout",
    "ConcurrencyLimited",
    "ConfigError",
    "Error",
    "LimitExceeded",
    "QuotaExceeded",
    "RateLimited",
    "RunTimeout",
    "SandboxSetupError",
    "StoreUnavailable",
    "UnknownFieldError",
    "UnsupportedError",
]


class Error(Exception):
    """Base class of sbxlimit's own exceptions."""


class ConfigError(Error, ValueError):
    """A limit, policy or argument was rejected before any process started.

    ``field`` names what was wrong (``"Limits.memory"``,
    ``"resources.memory.limit"``), ``value`` is the input as given.
    """

    def __init__(self, field: str, value: object, problem: str) -> None:
        self.field = field
        self.value = value
        self.problem = problem
        super().__init__(f"{field}: {problem} (got {value!r})")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.field, self.value, self.problem))


class UnknownFieldError(ConfigError, TypeError):
    """A field name Limits, Policy or a settings source does not have
    (``Limits(memroy=...)``, ``{"memroy": ...}``, ``memroy=1Gi``), with the
    closest names as a hint.  Also a :class:`TypeError`, as Python's own
    error for an unexpected keyword argument is."""

    def __init__(self, field: str, names: Iterable[str], known: Iterable[str]) -> None:
        # repr: keys of any type (an int among strs cannot be sorted as is)
        names = sorted(n if isinstance(n, str) else repr(n) for n in names)
        known = sorted(known)
        close = {m for n in names for m in difflib.get_close_matches(n, known, n=2)}
        hint = f"did you mean {' or '.join(map(repr, sorted(close)))}? " if close else ""
        what = "field" if len(names) == 1 else "fields"
        problem = f"unknown {what} {', '.join(map(repr, names))}; {hint}known: {', '.join(known)}"
        ConfigError.__init__(self, field, names, problem)
        self.args = (f"{field}: {problem}",)  # the names are in it: no "(got ...)"
        self.names = names
        self.known = known

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.field, self.names, self.known))


class UnsupportedError(Error):
    """``strict=True`` asked for something this machine cannot enforce.

    Raised before the process starts.  ``items`` maps each field to the reason
    it cannot be held here.
    """

    def __init__(self, items: dict[str, str]) -> None:
        self.items = dict(items)
        lines = "; ".join(f"{k}: {v}" for k, v in self.items.items())
        super().__init__(
            f"cannot enforce what strict=True requires: {lines}. "
            "Hint: run `python -m sbxlimit doctor` to see what this machine supports, "
            "or pass strict=False to run with what it can hold."
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.items,))


_STEP_HINTS = {
    "setuid": "changing the user needs root or CAP_SETUID.",
    "setgid": "changing the group needs root or CAP_SETGID.",
    "setgroups": "setting supplementary groups needs root or CAP_SETGID.",
    "pdeathsig": "the parent-death signal needs Linux; pass die_with_parent=False elsewhere.",
    "session:setpgid": "the process group must exist and be in the same session.",
    "cgroup:create": "sbxlimit could not create or limit the sandbox's cgroup; run "
    "`sbxlimit doctor`, or pass cgroup_parent='none' to run without one.",
    "cgroup:procs": "the child could not join its cgroup: the parent cgroup must be "
    "writable by this user up to the common ancestor (docs/cgroups.md).",
    "ns:unshare": "new namespaces need root or unprivileged user namespaces; `sbxlimit doctor` "
    "says which are blocked here (a seccomp profile or AppArmor may forbid unshare).",
    "ns:idmap": "an unprivileged user namespace may map only your own uid and gid; "
    "AppArmor (Ubuntu 24.04) may allow the namespace but refuse the map.",
    "ns:loopback": "bringing lo up needs CAP_NET_ADMIN in the new network namespace.",
    "ns:setns": "the child could not join a namespace made for it ahead of time (detail: 0 "
    "network, 1 IPC, 2 the read-only view's mount namespace); a seccomp profile may forbid "
    "setns.",
    "ns:proxy": "the child could not listen for the filtering proxy on its own loopback "
    "(detail: the port); its network namespace may lack a loopback.",
    "ns:mount": "the workspace's tmpfs needs a mount namespace of the sandbox's own; pass "
    "workdir= to hold disk with the watchdog instead.",
    "ns:pid": "the PID namespace's reaper or the program could not be forked (pids limit?).",
    "ns:view": "the read-only view of the host could not be mounted (detail: which entry; -1: "
    "'/' read-only); it needs Linux 5.12, and SBXLIMIT_NAMESPACES=0 runs without it.",
    "caps:drop": "dropping capabilities failed; the bounding set and securebits need "
    "CAP_SETPCAP, which sbxlimit asks for only where the caller has it.",
    "seatbelt:apply": "macOS refused the sandbox's Seatbelt profile: the caller may already "
    "run under a sandbox (macOS applies one per process; EPERM), or this macOS does not know "
    "one of its rules; `sbxlimit doctor` tries the profile.",
    "seatbelt:profile": "the Seatbelt helper could not read the profile sbxlimit wrote for it.",
}


def _hint_for(step: str, errno_: int) -> str:
    if step == "rlimit:RLIMIT_NOFILE" and os.geteuid() == 0:
        return (
            "RLIMIT_NOFILE cannot exceed the kernel's fs.nr_open, and raising any hard "
            "limit needs CAP_SYS_RESOURCE, which root in a container may lack."
        )
    if step.startswith("rlimit:"):
        return (
            "a limit above the inherited hard limit needs CAP_SYS_RESOURCE; "
            "ask for at most `ulimit -H` of that resource."
        )
    return _STEP_HINTS.get(step, "see docs/errors.md for what each step does.")


class SandboxSetupError(Error, OSError):
    """The child failed while setting up the sandbox, before exec.

    ``step`` is the stable name of the failing step (``"rlimit:RLIMIT_NOFILE"``),
    ``errno`` the error of the failing call, ``detail`` the step's number
    (the fd, id or limit involved).  Also an :class:`OSError`, so a handler
    for ``PermissionError``-style errors can inspect ``errno``.
    """

    step: str
    detail: int
    reason: str | None  # what the failing call said beyond errno (libsandbox's message)

    def __init__(
        self,
        step: str,
        errno_: int,
        detail: int = 0,
        filename: Any = None,
        reason: str | None = None,
    ) -> None:
        strerror = os.strerror(errno_) if errno_ else "failed"
        if filename is None:
            OSError.__init__(self, errno_, strerror)
        else:
            OSError.__init__(self, errno_, strerror, filename)
        self.step = step
        self.detail = detail
        self.reason = reason

    def __str__(self) -> str:
        where = f" ({self.filename!r})" if self.filename is not None else ""
        said = f": {self.reason}" if self.reason else ""
        return (
            f"sandbox setup failed at step {self.step!r} (detail {self.detail}): "
            f"[Errno {self.errno}] {self.strerror}{where}{said}. "
            f"Hint: {_hint_for(self.step, self.errno or 0)}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        args = (self.step, self.errno, self.detail, self.filename, self.reason)
        if type(self) in _combined.values():
            # The errno-mixed subclasses are made at run time: rebuild by errno.
            return (setup_error, args)
        return (type(self), args)


_combined: dict[type[OSError], type[SandboxSetupError]] = {}


def setup_error(
    step: str, errno_: int | None, detail: int = 0, filename: Any = None, reason: str | None = None
) -> SandboxSetupError:
    """A SandboxSetupError that is also the OSError subclass for `errno_`
    (PermissionError for EPERM...), so `except PermissionError` still works."""
    err = errno_ or 0
    base = type(OSError(err, "")) if err else OSError
    cls: type[SandboxSetupError] = SandboxSetupError
    if base is not OSError:
        found = _combined.get(base)
        if found is None:
            found = type(f"SandboxSetupError_{base.__name__}", (SandboxSetupError, base), {})
            found.__module__ = "sbxlimit"
            _combined[base] = found
        cls = found
    return cls(step, err, detail, filename, reason)


class LimitExceeded(Error, subprocess.CalledProcessError):
    """``run(check=True)``: the program was stopped by one of its limits.

    Also a :class:`subprocess.CalledProcessError`, with ``returncode``,
    ``cmd``, ``output`` and ``stderr``; ``termination`` says which limit, how
    much was used and by what mechanism.
    """

    def __init__(
        self,
        termination: Termination,
        cmd: Any,
        output: Any = None,
        stderr: Any = None,
    ) -> None:
        rc = termination.returncode if termination.returncode is not None else -1
        subprocess.CalledProcessError.__init__(self, rc, cmd, output, stderr)
        self.termination = termination

    def __str__(self) -> str:
        return self.termination.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.termination, self.cmd, self.output, self.stderr))


class RunTimeout(Error, subprocess.TimeoutExpired):
    """``run(timeout=)`` expired: the whole tree was killed and reaped first.

    Also a :class:`subprocess.TimeoutExpired`, with ``cmd``, ``timeout``,
    ``output``/``stdout`` and ``stderr`` (what was captured before the
    kill); ``termination`` and ``usage`` are the killed sandbox's.  The
    caller's timeout is not a limit of the sandbox (that is
    ``Limits.wall_time``): ``termination.reason`` is what the evidence
    says, ``"signaled"`` (SIGKILL, "kill_tree() was called") unless the
    program ended on its own, or a limit ended it, just before the kill.
    """

    def __init__(
        self,
        termination: Termination,
        usage: Usage,
        cmd: Any,
        timeout: float,
        output: Any = None,
        stderr: Any = None,
    ) -> None:
        subprocess.TimeoutExpired.__init__(self, cmd, timeout, output, stderr)
        self.termination = termination
        self.usage = usage

    def __reduce__(self) -> tuple[Any, ...]:
        args = (self.termination, self.usage, self.cmd, self.timeout, self.output, self.stderr)
        return (type(self), args)


# -- call-level limits (sbxlimit.Gate, SPEC section 7) -------------------------


def _key_text(key: object) -> str:
    """The key for a message: its repr, cut short (keys are the caller's own
    labels; nothing else about the call goes into a message)."""
    text = repr(key)
    return text if len(text) <= 80 else text[:77] + "..."


class RateLimited(Error):
    """A :class:`sbxlimit.Gate` refused a call: the key's rate is used up.

    ``key`` is the gate key, ``limit`` the rate as people write it
    (``"100/minute"``), ``retry_after`` the seconds until a call for this key
    could be admitted (an estimate when other calls are queued ahead).
    ``code`` is ``"rate_limited"``.  Nothing about the call's arguments is
    kept.
    """

    code: ClassVar[str] = "rate_limited"

    def __init__(self, key: Hashable, limit: str, retry_after: float) -> None:
        self.key = key
        self.limit = limit
        self.retry_after = retry_after
        super().__init__(
            f"call for key {_key_text(key)} refused: rate limit {limit} reached; "
            f"a call may be admitted in {retry_after:.3f} s. "
            "Hint: retry after `retry_after` seconds, or pass wait='2s' (or wait=None) "
            "to queue for a token."
        )

    def __repr__(self) -> str:
        return (
            f"RateLimited(key={self.key!r}, limit={self.limit!r}, retry_after={self.retry_after!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.limit, self.retry_after))


class ConcurrencyLimited(Error):
    """A :class:`sbxlimit.Gate` refused a call: the key already has
    ``limit`` calls in flight and none ended within the allowed wait.

    ``waited`` is how long the call queued before it was refused (0.0 with
    ``wait=0``).  ``code`` is ``"concurrency_limited"``.
    """

    code: ClassVar[str] = "concurrency_limited"

    def __init__(self, key: Hashable, limit: int, waited: float = 0.0) -> None:
        self.key = key
        self.limit = limit
        self.waited = waited
        if waited > 0:
            what = f"no slot of {limit} freed within {waited:.3f} s"
            hint = "wait longer (wait=None waits for ever) or raise max_concurrent"
        else:
            what = f"{limit} call(s) already in flight (max_concurrent={limit})"
            hint = "pass wait='2s' (or wait=None) to queue for a free slot"
        super().__init__(f"call for key {_key_text(key)} refused: {what}. Hint: {hint}.")

    def __repr__(self) -> str:
        return f"ConcurrencyLimited(key={self.key!r}, limit={self.limit!r}, waited={self.waited!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.limit, self.waited))


class CallTimeout(Error, TimeoutError):
    """A call admitted by a :class:`sbxlimit.Gate` ran longer than its timeout.

    ``limit`` is the timeout that applied, as people write it (``"30s"``,
    ``"250ms"``), ``timeout`` the same in seconds.  Also a
    :class:`TimeoutError`, so ``except TimeoutError`` (as with
    :func:`asyncio.timeout`) keeps working.  ``code`` is ``"call_timeout"``.
    What a timeout stops depends on the kind of call: see docs/gate.md.
    """

    code: ClassVar[str] = "call_timeout"

    def __init__(self, key: Hashable, limit: str, timeout: float) -> None:
        message = (
            f"call for key {_key_text(key)} timed out: it ran longer than {limit}. "
            "Hint: pass a larger timeout_ms= (the gate's timeout= is the ceiling), "
            "or bound the work itself, e.g. sbxlimit.run(..., timeout=call.remaining())."
        )
        TimeoutError.__init__(self, message)
        self.key = key
        self.limit = limit
        self.timeout = timeout

    def __str__(self) -> str:
        return str(self.args[0])

    def __repr__(self) -> str:
        return f"CallTimeout(key={self.key!r}, limit={self.limit!r}, timeout={self.timeout!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.limit, self.timeout))


class QuotaExceeded(Error):
    """A :class:`sbxlimit.Quota` refused a sandbox: its limits do not fit
    what the quota has left.

    ``field`` is the budget that does not fit (``"memory"``, ``"cpu"``,
    ``"pids"``, ``"sandboxes"``), ``limit`` the quota's budget for it,
    ``requested`` what the sandbox asked for (None: no limit, which cannot fit
    a budget), ``in_use`` what running sandboxes hold, ``key`` the caller's
    label.  ``code`` is ``"quota_exceeded"``.
    """

    code: ClassVar[str] = "quota_exceeded"

    def __init__(
        self, field: str, limit: int, requested: int | None, in_use: int, key: Hashable = None
    ) -> None:
        if requested is None:
            why = f"the sandbox has no {field} limit, so it cannot fit a {field} budget"
            hint = f"give the sandbox a Limits.{field}"
        else:
            why = f"it asks for {requested} of {field}, {in_use} of {limit} is in use"
            hint = "wait for sandboxes to end (Quota(wait=...)), or raise the quota"
        who = f" for key {_key_text(key)}" if key is not None else ""
        super().__init__(f"quota refused a sandbox{who}: {why}. Hint: {hint}.")
        self.field = field
        self.limit = limit
        self.requested = requested
        self.in_use = in_use
        self.key = key

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.field, self.limit, self.requested, self.in_use, self.key))


class StoreUnavailable(Error, ConnectionError):
    """A :class:`sbxlimit.Gate` or :class:`sbxlimit.Quota` could not reach
    its shared store (Redis) in time, so nothing was admitted (the store
    fails closed unless it was made with ``fail="open"``).

    ``store`` is the store's address without credentials, ``operation`` what
    was being done (``"admit"``, ``"stats"``...), ``timeout`` the seconds the
    store allows itself.  Also a :class:`ConnectionError`.  ``code`` is
    ``"store_unavailable"``.  See docs/distributed.md.
    """

    code: ClassVar[str] = "store_unavailable"

    def __init__(self, store: str, operation: str, timeout: float, cause: str = "") -> None:
        why = f": {cause}" if cause else ""
        super().__init__(
            f"the store {store} did not answer {operation} within {timeout:g} s{why}. "
            "Nothing was admitted. Hint: check that Redis is up and reachable, "
            'raise RedisStore(timeout=...), or choose RedisStore(fail="open") '
            "to admit without limits while it is down."
        )
        self.store = store
        self.operation = operation
        self.timeout = timeout
        self.cause = cause

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.store, self.operation, self.timeout, self.cause))
