"""Admission per key: at most ``max_concurrent`` calls in flight, a token
bucket (``per_second``, ``capacity``), and a FIFO queue of waiters (threads
or asyncio tasks on any event loop).  The in-memory store behind
:class:`sbxlimit.gate.Gate`; the Gate adds call timeouts, denials' audit
events and its public API.

How it is built:

* One :class:`threading.Lock` guards all state.  It is held only for a few
  arithmetic steps, never across a wait or a call, so taking it from an
  event loop's thread does not stall the loop.
* Each key has a FIFO queue of waiters.  Admission is *handed off*: when a
  slot frees up or a token is due, the admission takes the slot and the
  token on behalf of the waiter at the head of the queue and then wakes it.
  A newcomer can never overtake a queued waiter, because it is admitted
  directly only when the queue is empty.  This gives FIFO fairness and
  exact counts.
* A waiter is a thread (woken through a :class:`threading.Event`) or an
  asyncio task (woken through a future resolved with
  ``loop.call_soon_threadsafe``).
* Tokens refill continuously with ``clock()``.  No background timer runs:
  the waiter at the head of a queue that is short only of a token sleeps
  until the token is due, then polls the bucket again.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable

from ._errors import ConcurrencyLimited, RateLimited

__all__ = ["Admission", "KeyState"]

# Tokens are floats; a bucket this close to a whole token counts as having it
# (0.6 s at 100/minute must buy exactly one call, float rounding or not).
_EPS = 1e-9


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _Waiter:
    """One queued call: a thread (``loop is None``) or an asyncio task."""

    __slots__ = ("deadline", "enqueued", "event", "fut", "gone", "granted", "loop")

    def __init__(self, deadline: float | None, loop: asyncio.AbstractEventLoop | None) -> None:
        self.enqueued = time.monotonic()
        self.deadline = deadline  # time.monotonic() value, or None: for ever
        self.granted = False  # the gate took a slot and a token for it
        self.gone = False  # left the queue without a grant (refused, cancelled)
        self.loop = loop
        self.event = threading.Event() if loop is None else None
        self.fut: asyncio.Future[None] | None = None

    def notify(self) -> bool:
        """Wake the waiter (under the gate's lock).  False if it cannot be
        woken any more: its event loop is closed."""
        if self.event is not None:
            self.event.set()
            return True
        fut, loop = self.fut, self.loop
        if fut is None or loop is None:
            return True  # not waiting yet: it checks its state before it waits
        try:
            loop.call_soon_threadsafe(_resolve, fut)
        except RuntimeError:  # the loop is closed
            return False
        return True


class KeyState:
    """Everything the admission knows about one key."""

    __slots__ = ("in_flight", "queue", "stamp", "tokens")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.in_flight = 0
        self.tokens = tokens
        self.stamp = stamp  # clock() when tokens was last brought up to date
        self.queue: deque[_Waiter] = deque()


class Admission:
    """Per-key admission state of one gate (see the module docstring)."""

    __slots__ = (
        "_clock",
        "_keys",
        "_lock",
        "_sweep_at",
        "capacity",
        "max_concurrent",
        "per_second",
        "rate_text",
    )

    def __init__(
        self,
        *,
        max_concurrent: int | None,
        per_second: float | None,
        capacity: int | None,
        rate_text: str | None,
        clock: Callable[[], float],
    ) -> None:
        self.max_concurrent = max_concurrent
        self.per_second = per_second
        self.capacity = capacity
        self.rate_text = rate_text  # "100/minute", for RateLimited
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: dict[Hashable, KeyState] = {}
        self._sweep_at = 1024

    def __len__(self) -> int:
        """How many keys it holds state for (idle ones are swept)."""
        return len(self._keys)

    def snapshot(self, key: Hashable) -> tuple[int, int, float | None]:
        """(in flight, queued, tokens now) for `key`, read-only."""
        with self._lock:
            st = self._keys.get(key)
            in_flight = queued = 0
            tokens: float | None = None
            if self.per_second is not None and self.capacity is not None:
                tokens = float(self.capacity)
            if st is not None:
                in_flight, queued = st.in_flight, len(st.queue)
                if tokens is not None and self.per_second is not None:
                    elapsed = max(0.0, self._clock() - st.stamp)
                    tokens = min(tokens, st.tokens + elapsed * self.per_second)
        return in_flight, queued, tokens

    # -- admission (all under self._lock unless said otherwise) --------------

    def _state(self, key: Hashable) -> KeyState:
        st = self._keys.get(key)
        if st is None:
            if len(self._keys) >= self._sweep_at:
                self._sweep()
            st = self._keys[key] = KeyState(float(self.capacity or 0), self._clock())
        return st

    def _sweep(self) -> None:
        """Forget keys that are back to a fresh state, so that a gate fed
        many keys does not grow for ever (amortised: runs when the table has
        doubled since the last sweep)."""
        now = self._clock()
        for key, st in list(self._keys.items()):
            if st.in_flight == 0 and not st.queue:
                self._refill(st, now)
                if self.capacity is None or st.tokens >= self.capacity - _EPS:
                    del self._keys[key]
        self._sweep_at = max(1024, 2 * len(self._keys))

    def _refill(self, st: KeyState, now: float) -> None:
        if self.per_second is None or self.capacity is None:
            return
        elapsed = now - st.stamp
        if elapsed > 0:  # a clock that steps back refills nothing
            st.tokens = min(float(self.capacity), st.tokens + elapsed * self.per_second)
            st.stamp = now

    def _can_admit(self, st: KeyState) -> bool:
        return self._slot_free(st) and (self.per_second is None or st.tokens >= 1 - _EPS)

    def _slot_free(self, st: KeyState) -> bool:
        return self.max_concurrent is None or st.in_flight < self.max_concurrent

    def _take(self, st: KeyState) -> None:
        st.in_flight += 1
        if self.per_second is not None:
            st.tokens = max(0.0, st.tokens - 1)

    def _untake(self, st: KeyState) -> None:
        """Give back a grant that was never used (its caller went away)."""
        st.in_flight -= 1
        if self.per_second is not None and self.capacity is not None:
            st.tokens = min(float(self.capacity), st.tokens + 1)

    def _token_eta(self, st: KeyState, needed: int) -> float:
        """Seconds until the bucket holds `needed` tokens (0 without a rate)."""
        if self.per_second is None:
            return 0.0
        return max(0.0, (needed - st.tokens) / self.per_second)

    def _dispatch(self, st: KeyState, *, freed: bool = False) -> None:
        """Admit queued waiters, first come first served, while a slot and a
        token are free; wake a new head so that it can time the next token.

        `freed`: a slot was just given back.  A head that was waiting for a
        slot may now be short only of a token, which no one else will tell it
        about: wake it too.
        """
        self._refill(st, self._clock())
        head = st.queue[0] if st.queue else None
        while st.queue:
            w = st.queue[0]
            if w.loop is not None and w.loop.is_closed():
                st.queue.popleft()  # nobody will ever await this one
                w.gone = True
                continue
            if not self._can_admit(st):
                break
            st.queue.popleft()
            self._take(st)
            w.granted = True
            if not w.notify():
                w.granted, w.gone = False, True
                self._untake(st)
        if st.queue and (freed or st.queue[0] is not head):
            st.queue[0].notify()

    def _denial(
        self, st: KeyState, key: Hashable, position: int, waited: float
    ) -> RateLimited | ConcurrencyLimited:
        """The error for a call refused at `position` in the queue."""
        err: RateLimited | ConcurrencyLimited
        if not self._slot_free(st) or self.rate_text is None:
            assert self.max_concurrent is not None
            err = ConcurrencyLimited(key, self.max_concurrent, waited)
        else:
            err = RateLimited(key, self.rate_text, self._token_eta(st, position + 1))
        return err

    def _enter(
        self,
        st: KeyState,
        key: Hashable,
        wait: float | None,
        loop: asyncio.AbstractEventLoop | None,
    ) -> _Waiter | None:
        """Admit at once (None) or queue a waiter; refuse if `wait` is 0."""
        self._dispatch(st)
        if not st.queue and self._can_admit(st):
            self._take(st)
            return None
        if wait == 0:
            raise self._denial(st, key, len(st.queue), 0.0)
        w = _Waiter(None if wait is None else time.monotonic() + wait, loop)
        st.queue.append(w)
        return w

    def _poll(self, st: KeyState, key: Hashable, w: _Waiter) -> tuple[bool, float | None]:
        """(admitted?, seconds to sleep before polling again; None: until woken).

        Refuses the waiter when its wait is over, or at once when it is at the
        head, short only of a token, and the token is due after its deadline.
        """
        if not w.granted:
            self._dispatch(st)
        if w.granted:
            return True, None
        now = time.monotonic()
        remaining = None if w.deadline is None else w.deadline - now
        if remaining is not None and remaining <= 0:
            raise self._give_up(st, key, w, now)
        delay = remaining
        if st.queue[0] is w and self._slot_free(st):
            eta = self._token_eta(st, 1)
            if remaining is not None and eta > remaining:
                raise self._give_up(st, key, w, now)
            # A floor, so that a fake clock that stands still cannot make the
            # head spin.
            eta = max(eta, 0.001)
            delay = eta if delay is None else min(delay, eta)
        return False, delay

    def _give_up(
        self, st: KeyState, key: Hashable, w: _Waiter, now: float
    ) -> RateLimited | ConcurrencyLimited:
        position = st.queue.index(w)
        del st.queue[position]
        w.gone = True
        if position == 0 and st.queue:
            st.queue[0].notify()
        self._dispatch(st)
        return self._denial(st, key, position, now - w.enqueued)

    def _abandon(self, st: KeyState, w: _Waiter) -> None:
        """The waiter's thread or task stopped waiting (an exception, a
        cancellation): give back its grant or take it out of the queue."""
        if w.gone:
            return
        freed = w.granted
        if w.granted:
            w.granted = False
            self._untake(st)
        else:
            position = st.queue.index(w)
            del st.queue[position]
            if position == 0 and st.queue:
                st.queue[0].notify()
        w.gone = True
        self._dispatch(st, freed=freed)

    # -- acquire and release (called without the lock) ----------------------

    def acquire(self, key: Hashable, wait: float | None) -> KeyState:
        if wait != 0 and _in_event_loop():
            raise RuntimeError(
                "Gate: a blocking wait inside a running event loop would stall it. "
                "Hint: use `async with gate.call(key)` or `await gate.arun(...)` there, "
                "or pass wait=0."
            )
        with self._lock:
            st = self._state(key)
            w = self._enter(st, key, wait, None)
            if w is None:
                return st
        event = w.event
        assert event is not None
        try:
            while True:
                with self._lock:
                    admitted, delay = self._poll(st, key, w)
                    if admitted:
                        return st
                    event.clear()
                event.wait(delay)
        except BaseException:
            with self._lock:
                self._abandon(st, w)
            raise

    async def aacquire(self, key: Hashable, wait: float | None) -> KeyState:
        loop = asyncio.get_running_loop()
        with self._lock:
            st = self._state(key)
            w = self._enter(st, key, wait, loop)
            if w is None:
                return st
        try:
            while True:
                with self._lock:
                    admitted, delay = self._poll(st, key, w)
                    if admitted:
                        return st
                    fut = w.fut = loop.create_future()
                timer = None if delay is None else loop.call_later(delay, _resolve, fut)
                try:
                    await fut
                finally:
                    if timer is not None:
                        timer.cancel()
        except BaseException:
            with self._lock:
                self._abandon(st, w)
            raise

    def release(self, st: KeyState) -> None:
        with self._lock:
            st.in_flight -= 1
            self._dispatch(st, freed=True)

    async def arelease(self, st: KeyState) -> None:
        self.release(st)  # a few arithmetic steps under the lock: no need to await
