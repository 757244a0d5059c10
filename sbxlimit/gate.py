"""``Gate``: portable call-level limits per key (SPEC section 7).

A :class:`Gate` guards tool calls per key (an agent id, a tool name, a tuple
of both): at most ``max_concurrent`` calls in flight, at most ``rate`` calls
per period (a token bucket), each call at most ``timeout`` long.  It works
the same on every OS: nothing here touches the system.

Admission (concurrency, the token bucket, first come first served waiting
by threads and asyncio tasks alike) is the store's business:
``_admission.Admission`` in this process's memory (the default), or
``_redis.RedisAdmission`` shared by processes and hosts.  The gate adds
call timeouts, the audit events of denials and the API below.  ``sbxlimit.Gate`` is this
module's ``Gate``.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import enum
import inspect
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar

from . import audit
from ._admission import Admission
from ._errors import CallTimeout, ConcurrencyLimited, ConfigError, RateLimited, _key_text
from ._limits import Count, Duration
from ._settings import manifest_execution
from ._units import MAX_SECONDS, parse_count, parse_rate, parse_seconds

__all__ = ["Gate", "GateCall", "GateStats"]

if TYPE_CHECKING:
    from ._redis import RedisAdmission, RedisStore

_P = ParamSpec("_P")
_R = TypeVar("_R")

_log = logging.getLogger("sbxlimit.gate")

_PERIOD_NAMES = {1.0: "second", 60.0: "minute", 3600.0: "hour"}


class _Default(enum.Enum):
    """The type of :data:`DEFAULT`."""

    DEFAULT = "DEFAULT"

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Literal[_Default.DEFAULT] = _Default.DEFAULT
"""``gate.call(key, wait=DEFAULT)``: use the gate's own ``wait``."""


def _duration_text(seconds: float) -> str:
    """30.0 → '30s', 0.25 → '250ms', 120.0 → '2m': the form people write,
    and one that :func:`parse_seconds` reads back."""

    def num(x: float) -> str:
        return f"{x:.6f}".rstrip("0").rstrip(".")

    if seconds < 1:
        return f"{num(seconds * 1000)}ms"
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{num(seconds)}s"


def _parse_wait(field: str, value: object) -> float | None:
    """``0`` (refuse at once), a duration (queue that long), or ``None`` (for ever)."""
    if value is None:
        return None
    return parse_seconds(field, value, allow_zero=True)


def _parse_timeout_ms(value: object) -> float:
    """A caller's ``timeout_ms`` in seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError("timeout_ms", value, "expected milliseconds as a number, e.g. 5000")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError("timeout_ms", value, "must be a positive, finite number of milliseconds")
    if value / 1000.0 > MAX_SECONDS:
        raise ConfigError("timeout_ms", value, f"is too large (at most {MAX_SECONDS * 1000:.0f})")
    return value / 1000.0


def _check_key(key: object) -> None:
    try:
        hash(key)
    except TypeError:
        raise ConfigError(
            "key", key, "must be hashable (an agent id, a tool name, or a tuple of them)"
        ) from None


@dataclasses.dataclass(frozen=True, slots=True)
class GateStats:
    """A read-only snapshot of one key of a :class:`Gate`.

    ``in_flight``: calls admitted and not yet ended.  ``queued``: calls
    waiting for admission.  ``tokens``: calls the bucket would admit now
    (fractional while refilling; ``None`` without a rate).  ``capacity``: the
    bucket's size (``None`` without a rate).  ``max_concurrent``: the gate's
    concurrency limit.
    """

    key: Hashable
    in_flight: int
    queued: int
    tokens: float | None
    capacity: int | None
    max_concurrent: int | None


class Gate:
    """Call-level limits per key: concurrency, rate and call duration.

    ``Gate(max_concurrent=5, rate="100/minute", timeout="30s")`` admits, for
    each key separately, at most 5 calls at a time and 100 calls a minute, and
    gives each call at most 30 seconds.  Every argument is optional; ``None``
    means not limited.

    Args:
        max_concurrent: calls in flight per key (a count, at least 1).
        rate: ``"N/second"``, ``"N/minute"`` or ``"N/hour"``: a token bucket
            per key that refills at N per period and starts full.
        timeout: the ceiling of a call's duration (``"30s"``, ``2.5``,
            ``timedelta``).  A caller may ask for less with
            ``gate.call(key, timeout_ms=...)``, never for more.
        burst: the bucket's size, the calls allowed back to back after a
            quiet spell (default: N of ``rate``).  Needs ``rate``.
        wait: how long a call may queue for a slot or a token before it is
            refused: ``0`` (the default) refuses at once, a duration
            (``"2s"``) queues up to that long, ``None`` queues for ever.
            Queued calls are admitted first come, first served.
        clock: the time source of the token bucket, in seconds (default
            :func:`time.monotonic`).  Tests may inject a fake clock.  Waiting
            and call timeouts always use real time.  A shared store keeps
            time by its server's clock instead.
        store: where admission state lives: this process's memory (the
            default, or ``"memory"``), or a Redis shared by every process
            and host that names it (``"redis://host:6379/0"`` or a
            :class:`sbxlimit.RedisStore`; ``pip install 'sbxlimit[redis]'``).
            Without it, ``SBXLIMIT_STORE`` names the store.  See
            docs/distributed.md.
        name: what makes gates in different processes the same gate in a
            shared store (default: the gate's settings, so gates made alike
            share their counts).

    Denials raise :class:`RateLimited` (with ``retry_after``) or
    :class:`ConcurrencyLimited`; a call over its time raises
    :class:`CallTimeout`.  Each has ``code``, ``key`` and ``limit``.  Bad
    arguments raise :class:`ConfigError` (a :class:`ValueError`) naming the
    field, before anything runs.

    Use::

        with gate.call(key): ...                     # threads
        async with gate.call(key): ...               # asyncio: cancelled at the timeout
        gate.run(key, fn, *args, **kwargs)           # fn in a worker thread if timed
        await gate.arun(key, coro_fn, *args, **kwargs)
        gate.call(key, timeout_ms=500, wait="1s").run(fn, *args)

    What a timeout stops: in asyncio code the call is cancelled at its
    deadline.  ``run`` with a timeout runs ``fn`` in a worker thread and
    stops *waiting* for it at the deadline: Python cannot stop a thread, so
    ``fn`` keeps running and keeps its concurrency slot until it returns.
    A synchronous ``with`` block cannot be interrupted at all: ``CallTimeout``
    is raised when it ends late.  See docs/gate.md.

    A gate is safe to share between threads and between event loops.
    """

    __slots__ = (
        "_admission",
        "_capacity",
        "_max",
        "_name",
        "_per_second",
        "_rate_text",
        "_store",
        "_timeout",
        "_wait",
    )

    def __init__(
        self,
        max_concurrent: Count | None = None,
        rate: str | None = None,
        timeout: Duration | None = None,
        *,
        burst: Count | None = None,
        wait: Duration | None = 0,
        clock: Callable[[], float] = time.monotonic,
        store: str | RedisStore | None = None,
        name: str | None = None,
    ) -> None:
        self._max = (
            None if max_concurrent is None else parse_count("Gate.max_concurrent", max_concurrent)
        )
        self._rate_text: str | None = None
        self._per_second: float | None = None
        self._capacity: int | None = None
        if rate is not None:
            count, period = parse_rate("Gate.rate", rate)
            self._rate_text = f"{count}/{_PERIOD_NAMES[period]}"
            self._per_second = count / period
            self._capacity = count
        if burst is not None:
            if rate is None:
                raise ConfigError("Gate.burst", burst, "needs rate= (it sizes the token bucket)")
            self._capacity = parse_count("Gate.burst", burst)
        self._timeout = None if timeout is None else parse_seconds("Gate.timeout", timeout)
        self._wait = _parse_wait("Gate.wait", wait)
        if not callable(clock):
            raise ConfigError(
                "Gate.clock", clock, "expected a callable returning seconds, like time.monotonic"
            )
        if name is not None and (not isinstance(name, str) or not name):
            raise ConfigError("Gate.name", name, "expected a non-empty string")
        from ._redis import resolve

        self._store = resolve(store, "Gate.store")
        self._name = name or f"c{self._max}-r{self._rate_text}-b{self._capacity}"
        self._admission: Admission | RedisAdmission
        if self._store is None:
            self._admission = Admission(
                max_concurrent=self._max,
                per_second=self._per_second,
                capacity=self._capacity,
                rate_text=self._rate_text,
                clock=clock,
            )
        else:
            if clock is not time.monotonic:
                raise ConfigError(
                    "Gate.clock", clock, "a shared store keeps time by its server's clock"
                )
            from ._redis import RedisAdmission

            self._admission = RedisAdmission(
                self._store,
                self._name,
                max_concurrent=self._max,
                per_second=self._per_second,
                capacity=self._capacity,
                rate_text=self._rate_text,
            )

    # -- constructors -------------------------------------------------------

    @classmethod
    def from_manifest(
        cls,
        manifest: Mapping[str, Any],
        *,
        burst: Count | None = None,
        wait: Duration | None = 0,
        clock: Callable[[], float] = time.monotonic,
        store: str | RedisStore | None = None,
        name: str | None = None,
    ) -> Gate:
        """A gate from the ``execution_limits`` of a manifest (SPEC section 2).

        ``{"execution_limits": {"max_tool_call_duration": "30s",
        "max_concurrent_calls": 5, "rate_limit": "100/minute"}}`` becomes
        ``Gate(max_concurrent=5, rate="100/minute", timeout="30s")``.  What the
        manifest leaves out takes the SPEC defaults: 15s, 3 concurrent calls,
        60/minute.  ``resources`` is left to :meth:`Limits.from_manifest`.
        Errors are :class:`ConfigError` naming the JSON path of the bad value
        (``"execution_limits.rate_limit"``).
        """
        timeout, max_concurrent, rate = manifest_execution(manifest)
        return cls(
            max_concurrent,
            rate,
            timeout,
            burst=burst,
            wait=wait,
            clock=clock,
            store=store,
            name=name,
        )

    # -- configuration ------------------------------------------------------

    @property
    def max_concurrent(self) -> int | None:
        """Calls in flight per key, or None."""
        return self._max

    @property
    def rate(self) -> str | None:
        """The rate in its normal form (``"100/minute"``), or None."""
        return self._rate_text

    @property
    def burst(self) -> int | None:
        """The token bucket's size, or None without a rate."""
        return self._capacity

    @property
    def timeout(self) -> float | None:
        """The ceiling of a call's duration in seconds, or None."""
        return self._timeout

    @property
    def wait(self) -> float | None:
        """Seconds a call may queue by default (0: refuse at once; None: for ever)."""
        return self._wait

    @property
    def store(self) -> str:
        """Where admission state lives: ``"memory"`` or the store's address
        (without credentials)."""
        return "memory" if self._store is None else self._store.address

    @property
    def name(self) -> str:
        """The gate's name in a shared store."""
        return self._name

    def __repr__(self) -> str:
        parts = [
            f"max_concurrent={self._max!r}",
            f"rate={self._rate_text!r}",
            f"timeout={None if self._timeout is None else _duration_text(self._timeout)!r}",
        ]
        if self._rate_text is not None and self._capacity != int(self._rate_text.split("/")[0]):
            parts.append(f"burst={self._capacity!r}")
        if self._wait != 0:
            parts.append(f"wait={None if self._wait is None else _duration_text(self._wait)!r}")
        if self._store is not None:
            parts.append(f"store={self._store.address!r}, name={self._name!r}")
        return f"Gate({', '.join(parts)})"

    # -- calls --------------------------------------------------------------

    def call(
        self,
        key: Hashable,
        *,
        timeout_ms: float | None = None,
        wait: Duration | Literal[_Default.DEFAULT] | None = DEFAULT,
    ) -> GateCall:
        """One call for ``key``, to use once: ``with``, ``async with``,
        ``.run(fn, ...)`` or ``await .arun(coro_fn, ...)``.

        ``timeout_ms`` asks for a shorter timeout than the gate's; the gate's
        ``timeout`` caps it.  ``wait`` overrides the gate's ``wait`` for this
        call.  Arguments are checked here, before anything runs.
        """
        _check_key(key)
        timeout = self._timeout
        if timeout_ms is not None:
            asked = _parse_timeout_ms(timeout_ms)
            timeout = asked if timeout is None else min(timeout, asked)
        waiting = self._wait if wait is DEFAULT else _parse_wait("wait", wait)
        return GateCall(self, key, timeout, waiting)

    def run(
        self, key: Hashable, fn: Callable[_P, _R], /, *args: _P.args, **kwargs: _P.kwargs
    ) -> _R:
        """``fn(*args, **kwargs)`` admitted under ``key``; see :meth:`GateCall.run`."""
        return self.call(key).run(fn, *args, **kwargs)

    async def arun(
        self,
        key: Hashable,
        coro_fn: Callable[_P, Awaitable[_R]],
        /,
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> _R:
        """``await coro_fn(*args, **kwargs)`` admitted under ``key``; see
        :meth:`GateCall.arun`."""
        return await self.call(key).arun(coro_fn, *args, **kwargs)

    def stats(self, key: Hashable) -> GateStats:
        """What the gate holds for ``key`` now (read-only)."""
        _check_key(key)
        in_flight, queued, tokens = self._admission.snapshot(key)
        return GateStats(key, in_flight, queued, tokens, self._capacity, self._max)

    # -- acquire and release (called without the lock) ----------------------

    # -- admission (the store: _admission) --------------------------------------

    def _acquire_sync(self, key: Hashable, wait: float | None) -> Any:
        try:
            return self._admission.acquire(key, wait)
        except (RateLimited, ConcurrencyLimited) as e:
            _audit_denied(e)  # outside the lock: a subscriber may use the gate
            raise

    async def _acquire_async(self, key: Hashable, wait: float | None) -> Any:
        try:
            return await self._admission.aacquire(key, wait)
        except (RateLimited, ConcurrencyLimited) as e:
            _audit_denied(e)
            raise

    def _release(self, st: Any) -> None:
        self._admission.release(st)

    async def _arelease(self, st: Any) -> None:
        await self._admission.arelease(st)


def _audit_denied(err: RateLimited | ConcurrencyLimited) -> None:
    if audit.active():
        key = err.key if isinstance(err.key, str) else _key_text(err.key)
        audit.emit("gate_denied", key=key, limit=err.limit, detail=err.code)


class _Outcome:
    """What a worker thread of :meth:`GateCall.run` hands back."""

    __slots__ = ("abandoned", "error", "finished", "lock", "value")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.value: Any = None
        self.error: BaseException | None = None
        self.finished = False
        self.abandoned = False


class GateCall:
    """One call through a :class:`Gate`, made by :meth:`Gate.call`; single use.

    ``key``: the gate key.  ``timeout``: the seconds this call may take (the
    caller's ``timeout_ms`` capped by the gate's ``timeout``), or None.
    ``wait``: the seconds it may queue for admission (0, a number, or None).
    The timeout counts from admission; time spent queued is not part of it.
    """

    __slots__ = ("_gate", "_started", "_state", "_timer", "_used", "key", "timeout", "wait")

    def __init__(
        self, gate: Gate, key: Hashable, timeout: float | None, wait: float | None
    ) -> None:
        self._gate = gate
        self.key = key
        self.timeout = timeout
        self.wait = wait
        self._used = False
        self._state: Any = None  # what the store admitted: given back at the end
        self._started: float | None = None
        self._timer: asyncio.Timeout | None = None

    def __repr__(self) -> str:
        timeout = None if self.timeout is None else _duration_text(self.timeout)
        wait = None if self.wait is None else _duration_text(self.wait) if self.wait else 0
        return f"<GateCall key={self.key!r} timeout={timeout!r} wait={wait!r}>"

    def remaining(self) -> float | None:
        """Seconds left before this call's timeout (the whole timeout before
        admission; None without one).  Pass it on to work that can be bounded:
        ``sbxlimit.run(cmd, timeout=call.remaining())``."""
        if self.timeout is None:
            return None
        if self._started is None:
            return self.timeout
        return max(0.0, self._started + self.timeout - time.monotonic())

    def _begin(self) -> None:
        if self._used:
            raise RuntimeError("a GateCall is single use; make another with gate.call(key)")
        self._used = True

    def _timed_out(self) -> CallTimeout:
        assert self.timeout is not None
        return CallTimeout(self.key, _duration_text(self.timeout), self.timeout)

    def _late(self) -> bool:
        return (
            self.timeout is not None
            and self._started is not None
            and time.monotonic() - self._started > self.timeout
        )

    # -- threads ------------------------------------------------------------

    def __enter__(self) -> GateCall:
        """Wait for admission (up to ``wait``) in this thread.

        The block runs in the caller's thread and cannot be interrupted: if it
        ends without an error after its timeout, ``__exit__`` raises
        :class:`CallTimeout` (the slot is released first).
        """
        self._begin()
        self._state = self._gate._acquire_sync(self.key, self.wait)
        self._started = time.monotonic()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        st, self._state = self._state, None
        assert st is not None, "__exit__ without __enter__"
        self._gate._release(st)
        if exc_type is None and self._late():
            raise self._timed_out()

    def run(self, fn: Callable[_P, _R], /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        """Wait for admission, then return ``fn(*args, **kwargs)``.

        Without a timeout, ``fn`` runs in the caller's thread.  With one, it
        runs in a new daemon thread (in a copy of the caller's
        :mod:`contextvars` context) and the caller waits at most the timeout,
        then raises :class:`CallTimeout`.  Python cannot stop a thread: a
        timed-out ``fn`` keeps running to its end, its result is discarded
        (a warning is logged to ``sbxlimit.gate`` when it ends), and it keeps
        its concurrency slot until then, so runaway calls fill the key's
        slots instead of piling up unseen.  Code that must run in the
        caller's thread should use ``with gate.call(key)`` instead.
        """
        if not callable(fn):
            raise ConfigError("fn", fn, "expected a callable")
        if inspect.iscoroutinefunction(fn):
            raise ConfigError(
                "fn", fn, "is a coroutine function; use `await gate.arun(key, fn, ...)`"
            )
        self._begin()
        st = self._gate._acquire_sync(self.key, self.wait)
        self._started = time.monotonic()
        if self.timeout is None:
            try:
                return fn(*args, **kwargs)
            finally:
                self._gate._release(st)
        return self._run_in_worker(st, fn, args, kwargs)

    def _run_in_worker(self, st: Any, fn: Callable[..., _R], args: Any, kwargs: Any) -> _R:
        assert self.timeout is not None
        out = _Outcome()
        done = threading.Event()
        ctx = contextvars.copy_context()
        gate, key, timeout = self._gate, self.key, self.timeout
        started = time.monotonic()

        def work() -> None:
            try:
                out.value = ctx.run(fn, *args, **kwargs)
            except BaseException as exc:
                out.error = exc
            finally:
                gate._release(st)
                with out.lock:
                    out.finished = True
                    late = out.abandoned
                done.set()
            if late:
                what = "result" if out.error is None else f"{type(out.error).__name__}"
                _log.warning(
                    "gate call for key %s ended %.3f s after its %s timeout; its %s was discarded",
                    _key_text(key),
                    time.monotonic() - started - timeout,
                    _duration_text(timeout),
                    what,
                )
                out.value = out.error = None

        worker = threading.Thread(
            target=work, name=f"sbxlimit-gate {_key_text(key)}"[:64], daemon=True
        )
        try:
            worker.start()
        except BaseException:
            gate._release(st)
            raise
        try:
            finished = done.wait(timeout)
        except BaseException:  # KeyboardInterrupt while waiting: let the worker go
            with out.lock:
                out.abandoned = not out.finished
            raise
        if not finished:
            with out.lock:
                out.abandoned = not out.finished
                finished = out.finished
            if not finished:
                raise self._timed_out()
        if out.error is not None:
            error, out.error = out.error, None
            raise error
        value: _R = out.value
        return value

    # -- asyncio ------------------------------------------------------------

    async def __aenter__(self) -> GateCall:
        """Wait for admission (up to ``wait``) without blocking the loop; then
        the block is cancelled at its timeout and ``__aexit__`` raises
        :class:`CallTimeout`."""
        self._begin()
        st = await self._gate._acquire_async(self.key, self.wait)
        self._state = st
        self._started = time.monotonic()
        if self.timeout is not None:
            timer = asyncio.timeout(self.timeout)
            try:
                await timer.__aenter__()
            except BaseException:
                self._state = None
                await self._gate._arelease(st)
                raise
            self._timer = timer
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        st, self._state = self._state, None
        assert st is not None, "__aexit__ without __aenter__"
        timer, self._timer = self._timer, None
        try:
            if timer is not None:
                try:
                    await timer.__aexit__(exc_type, exc, tb)
                except TimeoutError:
                    raise self._timed_out() from None
                if timer.expired():
                    # The body caught the cancellation and went on (or turned
                    # it into another error): the call was still too long.
                    raise self._timed_out() from exc
        finally:
            await self._gate._arelease(st)

    async def arun(
        self, coro_fn: Callable[_P, Awaitable[_R]], /, *args: _P.args, **kwargs: _P.kwargs
    ) -> _R:
        """Wait for admission, then ``await coro_fn(*args, **kwargs)``,
        cancelled at the timeout (then :class:`CallTimeout`).  The coroutine
        is created only once the call is admitted."""
        if not callable(coro_fn):
            raise ConfigError("coro_fn", coro_fn, "expected a coroutine function")
        async with self:
            return await coro_fn(*args, **kwargs)
