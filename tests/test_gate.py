"""sbxlimit.Gate: call-level limits per key (SPEC section 7).

Rates run on an injected clock, so no test sleeps to wait for a token.  The
few tests that need real time (bounded waits, timeouts) use margins of
seconds: they assert "promptly", never "exactly".
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime
import logging
import math
import pickle
import threading
import time

import pytest

import sbxlimit
from sbxlimit import (
    CallTimeout,
    ConcurrencyLimited,
    ConfigError,
    Gate,
    GateStats,
    RateLimited,
)

# Generous: a loaded 2-core VM may stall a thread for a long time, but a
# prompt return still comes well under this.
PROMPT = 5.0


class FakeClock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.001)


def check_config_error(exc: BaseException, field: str, value: object) -> None:
    assert isinstance(exc, ConfigError)
    assert isinstance(exc, ValueError)
    assert exc.field == field
    assert field in str(exc)
    assert repr(value) in str(exc)


def admit(gate: Gate, key: object = "k", **kw) -> bool:
    """One call that returns at once: True if admitted, False if refused."""
    try:
        with gate.call(key, **kw):
            return True
    except (RateLimited, ConcurrencyLimited):
        return False


# ---------------------------------------------------------------------------
# Construction and bad input
# ---------------------------------------------------------------------------


def test_normalised_configuration_and_repr():
    g = Gate(5, "100 / min", "30s")
    assert (g.max_concurrent, g.rate, g.timeout, g.burst, g.wait) == (
        5,
        "100/minute",
        30.0,
        100,
        0,
    )
    assert repr(g) == "Gate(max_concurrent=5, rate='100/minute', timeout='30s')"
    g = Gate(rate="10/second", burst=3, timeout=datetime.timedelta(milliseconds=250), wait=None)
    assert (
        repr(g)
        == "Gate(max_concurrent=None, rate='10/second', timeout='250ms', burst=3, wait=None)"
    )
    assert Gate().max_concurrent is None and Gate().rate is None and Gate().burst is None
    assert Gate(max_concurrent="4", wait="2s").wait == 2.0


@pytest.mark.parametrize(
    ("kwargs", "field", "value"),
    [
        ({"max_concurrent": 0}, "Gate.max_concurrent", 0),
        ({"max_concurrent": -1}, "Gate.max_concurrent", -1),
        ({"max_concurrent": "many"}, "Gate.max_concurrent", "many"),
        ({"max_concurrent": True}, "Gate.max_concurrent", True),
        ({"max_concurrent": 2.5}, "Gate.max_concurrent", 2.5),
        ({"rate": "100/fortnight"}, "Gate.rate", "100/fortnight"),
        ({"rate": 100}, "Gate.rate", 100),
        ({"rate": "0/minute"}, "Gate.rate", "0/minute"),
        ({"rate": "-1/second"}, "Gate.rate", "-1/second"),
        ({"timeout": "forever"}, "Gate.timeout", "forever"),
        ({"timeout": 0}, "Gate.timeout", 0),
        ({"timeout": -1}, "Gate.timeout", -1),
        ({"timeout": math.inf}, "Gate.timeout", math.inf),
        ({"burst": 5}, "Gate.burst", 5),
        ({"rate": "1/second", "burst": 0}, "Gate.burst", 0),
        ({"wait": -1}, "Gate.wait", -1),
        ({"wait": "soon"}, "Gate.wait", "soon"),
        ({"clock": 5}, "Gate.clock", 5),
    ],
)
def test_bad_configuration_names_the_field(kwargs, field, value):
    with pytest.raises(ConfigError) as info:
        Gate(**kwargs)
    check_config_error(info.value, field, value)


@pytest.mark.parametrize(
    ("kwargs", "field", "value"),
    [
        ({"timeout_ms": 0}, "timeout_ms", 0),
        ({"timeout_ms": -5}, "timeout_ms", -5),
        ({"timeout_ms": "100"}, "timeout_ms", "100"),
        ({"timeout_ms": True}, "timeout_ms", True),
        ({"timeout_ms": math.nan}, "timeout_ms", math.nan),
        ({"wait": "later"}, "wait", "later"),
        ({"wait": -0.5}, "wait", -0.5),
    ],
)
def test_bad_call_arguments_raise_before_anything_runs(kwargs, field, value):
    clock = FakeClock()
    g = Gate(max_concurrent=1, rate="1/minute", clock=clock)
    with pytest.raises(ConfigError) as info:
        g.call("k", **kwargs)
    check_config_error(info.value, field, value)
    assert g.stats("k") == GateStats("k", 0, 0, 1.0, 1, 1)


def test_bad_key_or_callable_takes_no_slot_and_no_token():
    clock = FakeClock()
    g = Gate(max_concurrent=1, rate="1/minute", clock=clock)
    ran = []
    with pytest.raises(ConfigError) as info:
        g.run(["unhashable"], ran.append, 1)
    assert info.value.field == "key"
    with pytest.raises(ConfigError) as info:
        g.run("k", "not callable")  # type: ignore[arg-type]
    assert info.value.field == "fn"
    with pytest.raises(ConfigError) as info:
        asyncio.run(g.arun("k", None))  # type: ignore[arg-type]
    assert info.value.field == "coro_fn"

    async def coro():
        pass

    with pytest.raises(ConfigError, match="arun") as info:
        g.run("k", coro)
    assert info.value.field == "fn"
    assert ran == []
    assert g.stats("k") == GateStats("k", 0, 0, 1.0, 1, 1)
    assert g.run("k", ran.append, 1) is None and ran == [1]


def test_a_call_is_single_use():
    g = Gate()
    call = g.call("k")
    with call:
        pass
    with pytest.raises(RuntimeError, match="single use"), call:
        pass


def test_exports():
    for name in (
        "Gate",
        "GateCall",
        "GateStats",
        "RateLimited",
        "ConcurrencyLimited",
        "CallTimeout",
    ):
        assert name in sbxlimit.__all__
    assert sbxlimit.__all__ == sorted(sbxlimit.__all__, key=lambda n: (not n.isupper(), n))


# ---------------------------------------------------------------------------
# Token bucket, on an injected clock
# ---------------------------------------------------------------------------


def test_bucket_starts_full_and_refills_one_token_per_interval():
    clock = FakeClock()
    g = Gate(rate="100/minute", clock=clock)
    assert sum(admit(g) for _ in range(150)) == 100
    with pytest.raises(RateLimited) as info:
        g.run("k", lambda: None)
    assert info.value.retry_after == pytest.approx(0.6)
    clock.advance(0.599)
    with pytest.raises(RateLimited) as info:
        g.run("k", lambda: None)
    assert info.value.retry_after == pytest.approx(0.001, abs=1e-6)
    clock.advance(0.001)  # exactly one interval: exactly one token
    assert [admit(g) for _ in range(3)] == [True, False, False]
    clock.advance(6.0)
    assert sum(admit(g) for _ in range(20)) == 10
    clock.advance(3600)  # refills to the bucket's size, no further
    assert sum(admit(g) for _ in range(150)) == 100


def test_burst_sizes_the_bucket():
    clock = FakeClock()
    g = Gate(rate="10/second", burst=2, clock=clock)
    assert [admit(g) for _ in range(3)] == [True, True, False]
    clock.advance(0.1)
    assert [admit(g) for _ in range(2)] == [True, False]
    clock.advance(10)
    assert sum(admit(g) for _ in range(5)) == 2
    assert g.stats("k").tokens == pytest.approx(0.0)


def test_keys_have_their_own_buckets_and_slots():
    clock = FakeClock()
    g = Gate(max_concurrent=1, rate="2/hour", clock=clock)
    assert [admit(g, "a"), admit(g, "a"), admit(g, "a")] == [True, True, False]
    assert [admit(g, ("agent-1", "search")), admit(g, ("agent-1", "fetch"))] == [True, True]
    with g.call("b"):
        assert admit(g, "c")
        assert not admit(g, "b")


def test_a_refused_call_uses_no_token():
    clock = FakeClock()
    g = Gate(max_concurrent=1, rate="2/minute", clock=clock)
    with g.call("k"):
        for _ in range(5):
            with pytest.raises(ConcurrencyLimited):
                g.run("k", lambda: None)
        assert g.stats("k").tokens == pytest.approx(1.0)
    assert admit(g) and not admit(g)


def test_retry_after_counts_the_calls_queued_ahead():
    clock = FakeClock()
    g = Gate(rate="1/second", burst=1, clock=clock, wait=None)
    assert admit(g)
    # Two threads queue for tokens.  A caller that will not wait learns how
    # far back in line it would be: three tokens away.
    admitted = []
    threads = [threading.Thread(target=lambda: admitted.append(admit(g))) for _ in range(2)]
    for i, t in enumerate(threads):
        t.start()
        wait_until(lambda i=i: g.stats("k").queued == i + 1)
    with pytest.raises(RateLimited) as info:
        g.call("k", wait=0).run(lambda: None)
    assert info.value.retry_after == pytest.approx(3.0)
    # A token is due: the queue is served before the newcomer, who is refused.
    clock.advance(1.0)
    with pytest.raises(RateLimited) as info:
        g.call("k", wait=0).run(lambda: None)
    assert info.value.retry_after == pytest.approx(2.0)
    wait_until(lambda: admitted == [True])
    clock.advance(1.0)
    assert not admit(g, wait=0)
    for t in threads:
        t.join(PROMPT)
    assert admitted == [True, True]
    assert g.stats("k").queued == 0


def test_stats_is_a_read_only_view():
    clock = FakeClock()
    g = Gate(max_concurrent=3, rate="4/second", clock=clock)
    assert g.stats("never") == GateStats("never", 0, 0, 4.0, 4, 3)
    with g.call("k"), g.call("k"):
        s = g.stats("k")
        assert (s.in_flight, s.queued, s.tokens) == (2, 0, 2.0)
        clock.advance(0.125)
        assert g.stats("k").tokens == pytest.approx(2.5)
    assert Gate().stats("k") == GateStats("k", 0, 0, None, None, None)


def test_idle_keys_are_forgotten():
    clock = FakeClock()
    g = Gate(rate="1/second", clock=clock)
    for i in range(5000):
        assert admit(g, i)
    clock.advance(1.0)
    for i in range(5000, 10000):
        assert admit(g, i)
    assert len(g._admission) < 6000  # refilled keys were swept, not kept for ever


# ---------------------------------------------------------------------------
# Concurrency and waiting
# ---------------------------------------------------------------------------


def test_wait_zero_refuses_at_once():
    g = Gate(max_concurrent=2)
    with g.call("k"), g.call("k"):
        start = time.monotonic()
        with pytest.raises(ConcurrencyLimited) as info:
            g.run("k", lambda: None)
        assert time.monotonic() - start < PROMPT
        assert (info.value.limit, info.value.waited) == (2, 0.0)
        assert "wait=" in str(info.value)
    assert admit(g)


def test_bounded_wait_gives_up_after_its_wait():
    g = Gate(max_concurrent=1, wait="200ms")
    with g.call("k"):
        start = time.monotonic()
        with pytest.raises(ConcurrencyLimited) as info:
            g.run("k", lambda: None)
        elapsed = time.monotonic() - start
    assert 0.19 <= elapsed < PROMPT
    assert info.value.waited >= 0.19
    assert g.stats("k").queued == 0


def test_bounded_wait_is_admitted_when_a_slot_frees():
    g = Gate(max_concurrent=1)
    result = []
    with g.call("k"):
        t = threading.Thread(target=lambda: result.append(g.call("k", wait="30s").run(lambda: 7)))
        t.start()
        wait_until(lambda: g.stats("k").queued == 1)
    t.join(PROMPT)
    assert result == [7]


def test_unbounded_wait_waits_for_a_slot():
    g = Gate(max_concurrent=1, wait=None)
    result = []
    with g.call("k"):
        t = threading.Thread(target=lambda: result.append(g.run("k", lambda: "done")))
        t.start()
        wait_until(lambda: g.stats("k").queued == 1)
        time.sleep(0.05)  # still queued: nothing gives up on its own
        assert g.stats("k").queued == 1 and result == []
    t.join(PROMPT)
    assert result == ["done"]


def test_waiting_for_a_token_with_a_real_clock():
    g = Gate(rate="20/second", burst=1, wait="5s")
    assert admit(g)
    start = time.monotonic()
    assert admit(g)  # the next token is 50 ms away
    assert 0.04 <= time.monotonic() - start < PROMPT


def test_a_token_due_after_the_wait_is_refused_at_once():
    g = Gate(rate="1/minute", wait="1s")
    assert admit(g)
    start = time.monotonic()
    with pytest.raises(RateLimited) as info:
        g.run("k", lambda: None)
    assert time.monotonic() - start < 0.5  # no point waiting 1 s for a token 60 s away
    assert info.value.retry_after == pytest.approx(60, abs=1)
    assert info.value.limit == "1/minute"


def test_a_head_freed_of_its_slot_then_times_its_token():
    # The queued call first lacks a slot; when the slot comes back the token
    # is still missing, and nothing else happens: the waiter must time the
    # token itself instead of sleeping for ever.
    clock = FakeClock()
    g = Gate(max_concurrent=1, rate="20/second", burst=1, clock=clock, wait=None)
    result = []
    with g.call("k"):
        t = threading.Thread(target=lambda: result.append(g.run("k", lambda: "in")))
        t.start()
        wait_until(lambda: g.stats("k").queued == 1)
    assert g.stats("k").queued == 1  # no token yet: the clock stands still
    clock.advance(0.05)
    t.join(PROMPT)
    assert result == ["in"]


def test_the_same_for_an_asyncio_waiter():
    clock = FakeClock()
    g = Gate(max_concurrent=1, rate="20/second", burst=1, clock=clock, wait=None)

    async def main():
        async with g.call("k"):
            task = asyncio.create_task(g.arun("k", asyncio.sleep, 0, result="in"))
            await asyncio.sleep(0)
            assert g.stats("k").queued == 1
        await asyncio.sleep(0.01)
        assert g.stats("k").queued == 1
        clock.advance(0.05)
        return await asyncio.wait_for(task, PROMPT)

    assert asyncio.run(main()) == "in"


def test_fifo_admission_under_contention():
    g = Gate(max_concurrent=1, wait=None)
    order = []
    threads = []
    with g.call("k"):
        for i in range(10):
            t = threading.Thread(target=lambda i=i: g.run("k", order.append, i))
            t.start()
            threads.append(t)
            wait_until(lambda i=i: g.stats("k").queued == i + 1)
    for t in threads:
        t.join(PROMPT)
    assert order == list(range(10))


def test_a_freed_slot_goes_to_the_queue_not_to_a_newcomer():
    g = Gate(max_concurrent=1, wait=None)
    entered, leave = threading.Event(), threading.Event()

    def waiter():
        with g.call("k"):
            entered.set()
            leave.wait(PROMPT)

    with g.call("k"):
        t = threading.Thread(target=waiter)
        t.start()
        wait_until(lambda: g.stats("k").queued == 1)
    # The slot was handed to the queued thread on release, before it ran.
    with pytest.raises(ConcurrencyLimited):
        g.call("k", wait=0).run(lambda: None)
    assert entered.wait(PROMPT)
    leave.set()
    t.join(PROMPT)
    assert admit(g)


def test_exact_admission_counts_under_50_threads_concurrency():
    g = Gate(max_concurrent=7)
    release = threading.Event()
    counts = {"admitted": 0, "refused": 0}
    lock = threading.Lock()
    start = threading.Barrier(50)

    def worker():
        start.wait()
        try:
            with g.call("k"):
                with lock:
                    counts["admitted"] += 1
                release.wait(PROMPT * 2)
        except ConcurrencyLimited:
            with lock:
                counts["refused"] += 1

    threads = [threading.Thread(target=worker) for _ in range(50)]
    for t in threads:
        t.start()
    wait_until(lambda: counts["admitted"] + counts["refused"] == 50)
    assert counts == {"admitted": 7, "refused": 43}
    release.set()
    for t in threads:
        t.join(PROMPT)
    assert g.stats("k").in_flight == 0


def test_exact_admission_counts_under_50_threads_rate():
    clock = FakeClock()
    g = Gate(rate="10/minute", clock=clock)
    start = threading.Barrier(50)
    results = []

    def worker():
        start.wait()
        results.append(admit(g))

    threads = [threading.Thread(target=worker) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(PROMPT)
    assert (results.count(True), results.count(False)) == (10, 40)


def test_50_threads_queueing_never_exceed_the_limit():
    g = Gate(max_concurrent=5, wait=None)
    lock = threading.Lock()
    state = {"now": 0, "peak": 0, "done": 0}

    def body():
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        time.sleep(0.001)
        with lock:
            state["now"] -= 1
            state["done"] += 1

    def worker():
        for _ in range(10):
            g.run("k", body)

    threads = [threading.Thread(target=worker) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(PROMPT * 2)
    assert state["done"] == 500
    assert 1 <= state["peak"] <= 5
    assert g.stats("k") == GateStats("k", 0, 0, None, None, 5)


def test_500_tasks_exact_count_and_fifo_order():
    g = Gate(max_concurrent=10, wait=None)
    order = []
    state = {"now": 0, "peak": 0}

    async def task(i):
        async with g.call("k"):
            order.append(i)
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
            await asyncio.sleep(0)
            state["now"] -= 1

    async def main():
        await asyncio.gather(*(task(i) for i in range(500)))

    asyncio.run(main())
    assert order == list(range(500))
    assert state == {"now": 0, "peak": 10}
    assert g.stats("k").in_flight == 0


def test_500_tasks_exact_rate_count():
    clock = FakeClock()
    g = Gate(rate="100/minute", clock=clock)

    async def task():
        try:
            await g.arun("k", asyncio.sleep, 0)
        except RateLimited:
            return False
        return True

    async def main():
        return await asyncio.gather(*(task() for _ in range(500)))

    results = asyncio.run(main())
    assert (results.count(True), results.count(False)) == (100, 400)


def test_threads_and_several_event_loops_share_one_gate():
    g = Gate(max_concurrent=3, wait=None)
    lock = threading.Lock()
    state = {"now": 0, "peak": 0, "done": 0}

    def enter():
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])

    def leave():
        with lock:
            state["now"] -= 1
            state["done"] += 1

    async def atask():
        async with g.call("shared"):
            enter()
            await asyncio.sleep(0.001)
            leave()

    def loop_thread():
        async def main():
            await asyncio.gather(*(atask() for _ in range(50)))

        asyncio.run(main())

    def sync_thread():
        for _ in range(10):
            with g.call("shared"):
                enter()
                time.sleep(0.001)
                leave()

    threads = [threading.Thread(target=loop_thread) for _ in range(2)]
    threads += [threading.Thread(target=sync_thread) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(PROMPT * 2)
    assert state["done"] == 150
    assert 1 <= state["peak"] <= 3
    assert g.stats("shared").in_flight == 0


def test_a_cancelled_waiter_leaves_the_queue_and_a_cancelled_grant_is_given_back():
    clock = FakeClock()
    g = Gate(max_concurrent=1, rate="10/minute", clock=clock, wait=None)

    async def main():
        async with g.call("k"):
            queued = asyncio.create_task(g.arun("k", asyncio.sleep, 0))
            second = asyncio.create_task(g.arun("k", asyncio.sleep, 0, result="second"))
            await asyncio.sleep(0)
            assert g.stats("k").queued == 2
            queued.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await queued
            assert g.stats("k").queued == 1
        # The slot went to `second`; cancel it before it runs: the grant and
        # its token come back.
        second.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await second
        assert g.stats("k").in_flight == 0
        assert g.stats("k").tokens == pytest.approx(9.0)

    asyncio.run(main())


def test_blocking_wait_inside_an_event_loop_is_refused():
    g = Gate(max_concurrent=1, wait=None)

    async def main():
        with pytest.raises(RuntimeError, match="async with"):
            g.run("k", lambda: None)
        g.call("k", wait=0).run(lambda: None)  # never blocks: allowed

    asyncio.run(main())


# ---------------------------------------------------------------------------
# Timeouts
# ---------------------------------------------------------------------------


def test_timeout_ms_is_capped_by_the_gate_ceiling():
    assert Gate(timeout="100ms").call("k", timeout_ms=60_000).timeout == pytest.approx(0.1)
    assert Gate(timeout="30s").call("k", timeout_ms=250).timeout == pytest.approx(0.25)
    assert Gate().call("k", timeout_ms=250).timeout == pytest.approx(0.25)
    assert Gate(timeout="2m").call("k").timeout == 120.0
    assert Gate().call("k").timeout is None
    assert Gate().call("k").remaining() is None


def test_async_timeout_cancels_the_call_and_returns_promptly():
    g = Gate(timeout="100ms")
    seen = []

    async def slow():
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def main():
        start = time.monotonic()
        with pytest.raises(CallTimeout) as info:
            await g.arun("k", slow)
        return time.monotonic() - start, info.value

    elapsed, err = asyncio.run(main())
    assert elapsed < PROMPT
    assert seen == ["cancelled"]
    assert (err.code, err.key, err.limit, err.timeout) == ("call_timeout", "k", "100ms", 0.1)
    assert g.stats("k").in_flight == 0


def test_async_timeout_ms_capped_by_the_ceiling_fires_at_the_ceiling():
    g = Gate(timeout="100ms")

    async def main():
        start = time.monotonic()
        with pytest.raises(CallTimeout) as info:
            await g.call("k", timeout_ms=60_000).arun(asyncio.sleep, 30)
        return time.monotonic() - start, info.value

    elapsed, err = asyncio.run(main())
    assert elapsed < PROMPT
    assert err.limit == "100ms"


def test_async_with_block_is_cancelled_at_its_timeout():
    g = Gate()

    async def main():
        with pytest.raises(CallTimeout) as info:
            async with g.call("k", timeout_ms=50) as call:
                assert 0 < call.remaining() <= 0.05
                await asyncio.sleep(30)
        assert info.value.limit == "50ms"
        # The body's own TimeoutError is not ours: it passes unchanged.
        with pytest.raises(TimeoutError) as own:
            async with g.call("k", timeout_ms=10_000):
                async with asyncio.timeout(0.01):
                    await asyncio.sleep(30)
        assert not isinstance(own.value, CallTimeout)
        # A body that swallows the cancellation still ran too long.
        with pytest.raises(CallTimeout):
            async with g.call("k", timeout_ms=20):
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(30)
        async with g.call("k", timeout_ms=10_000):
            pass

    asyncio.run(main())
    assert g.stats("k").in_flight == 0


def test_async_results_and_errors_pass_through():
    g = Gate(max_concurrent=2, timeout="10s")

    async def add(a, b=0):
        return a + b

    async def fail():
        raise KeyError("x")

    async def main():
        assert await g.arun("k", add, 1, b=2) == 3
        with pytest.raises(KeyError):
            await g.arun("k", fail)

    asyncio.run(main())
    assert g.stats("k").in_flight == 0


def test_sync_run_timeout_returns_promptly_and_keeps_the_slot(caplog):
    g = Gate(max_concurrent=1, timeout="100ms")
    release = threading.Event()
    start = time.monotonic()
    with pytest.raises(CallTimeout) as info:
        g.run("k", release.wait, PROMPT * 2)
    assert time.monotonic() - start < PROMPT
    assert info.value.limit == "100ms"
    # The worker still runs: its slot stays taken until it ends.
    assert g.stats("k").in_flight == 1
    with pytest.raises(ConcurrencyLimited):
        g.run("k", lambda: None)
    with caplog.at_level(logging.WARNING, logger="sbxlimit.gate"):
        release.set()
        wait_until(lambda: g.stats("k").in_flight == 0)
        wait_until(lambda: "discarded" in caplog.text)
    assert "'k'" in caplog.text
    assert g.run("k", lambda: "ok") == "ok"


def test_sync_run_threads_and_context():
    var = contextvars.ContextVar("var", default="unset")
    var.set("caller")
    g_untimed, g_timed = Gate(), Gate(timeout="10s")
    me = threading.get_ident()
    assert g_untimed.run("k", threading.get_ident) == me  # no timeout: caller's thread
    assert g_timed.run("k", threading.get_ident) != me  # timeout: a worker thread
    assert g_timed.run("k", var.get) == "caller"
    with pytest.raises(ZeroDivisionError):
        g_timed.run("k", lambda: 1 / 0)
    assert g_timed.run("k", lambda a, *, b: a + b, 1, b=2) == 3
    assert g_timed.stats("k").in_flight == 0


def test_sync_with_block_ending_late_raises_call_timeout():
    g = Gate(max_concurrent=1)
    with pytest.raises(CallTimeout) as info, g.call("k", timeout_ms=1):
        time.sleep(0.02)
    assert info.value.limit == "1ms"
    assert g.stats("k").in_flight == 0
    # The block's own error wins over the late finish.
    with pytest.raises(KeyError), g.call("k", timeout_ms=1):
        time.sleep(0.02)
        raise KeyError("mine")
    with g.call("k", timeout_ms=10_000) as call:
        assert 0 < call.remaining() <= 10


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


def test_denials_are_structured_and_carry_no_call_data():
    clock = FakeClock()
    g = Gate(max_concurrent=1, rate="1/minute", clock=clock)
    secret = "sk-live-SECRET-TOKEN"
    g.run("agent-7", lambda s: None, secret)
    with pytest.raises(RateLimited) as rate:
        g.run("agent-7", lambda s: None, secret)
    with g.call("agent-8"), pytest.raises(ConcurrencyLimited) as conc:
        g.run("agent-8", lambda s: None, secret)
    e = rate.value
    assert (e.code, e.key, e.limit) == ("rate_limited", "agent-7", "1/minute")
    assert e.retry_after == pytest.approx(60.0)
    assert (conc.value.code, conc.value.key, conc.value.limit) == (
        "concurrency_limited",
        "agent-8",
        1,
    )
    for err in (rate.value, conc.value):
        assert isinstance(err, sbxlimit.Error)
        assert secret not in str(err) and secret not in repr(err)
        assert "Hint:" in str(err)
        assert "'agent-" in str(err)


@pytest.mark.parametrize(
    "err",
    [
        RateLimited(("agent-1", "search"), "100/minute", 0.6),
        ConcurrencyLimited("agent-1", 5, 2.0),
        ConcurrencyLimited("agent-1", 5),
        CallTimeout("agent-1", "30s", 30.0),
    ],
)
def test_errors_pickle_with_their_fields(err):
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert str(back) == str(err)
    assert repr(back) == repr(err)
    for name in ("code", "key", "limit"):
        assert getattr(back, name) == getattr(err, name)
    assert isinstance(back, sbxlimit.Error)


def test_error_reprs_and_codes():
    assert repr(RateLimited("a", "1/second", 0.5)) == (
        "RateLimited(key='a', limit='1/second', retry_after=0.5)"
    )
    assert repr(ConcurrencyLimited("a", 3)) == "ConcurrencyLimited(key='a', limit=3, waited=0.0)"
    assert repr(CallTimeout("a", "30s", 30.0)) == "CallTimeout(key='a', limit='30s', timeout=30.0)"
    assert [c.code for c in (RateLimited, ConcurrencyLimited, CallTimeout)] == [
        "rate_limited",
        "concurrency_limited",
        "call_timeout",
    ]
    assert isinstance(CallTimeout("a", "30s", 30.0), TimeoutError)
    assert "x" * 200 not in str(RateLimited("x" * 200, "1/second", 1.0))


# ---------------------------------------------------------------------------
# Manifests
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "manifest",
    [
        {},
        {"execution_limits": {}},
        {"resources": {"memory": {"limit": "1Gi"}}},
    ],
)
def test_from_manifest_defaults(manifest):
    g = Gate.from_manifest(manifest)
    assert (g.max_concurrent, g.rate, g.timeout, g.burst, g.wait) == (3, "60/minute", 15.0, 60, 0)


def test_from_manifest_reads_execution_limits():
    clock = FakeClock()
    manifest = {
        "resources": {"cpu": {"limit": "500m"}},
        "execution_limits": {
            "max_tool_call_duration": "30s",
            "max_concurrent_calls": 5,
            "rate_limit": "100/minute",
        },
    }
    g = Gate.from_manifest(manifest, wait="1s", burst=10, clock=clock)
    assert (g.max_concurrent, g.rate, g.timeout, g.burst, g.wait) == (
        5,
        "100/minute",
        30.0,
        10,
        1.0,
    )
    assert sum(admit(g, wait=0) for _ in range(20)) == 10  # the injected clock is used
    partial = Gate.from_manifest({"execution_limits": {"max_concurrent_calls": 1}})
    assert (partial.max_concurrent, partial.rate, partial.timeout) == (1, "60/minute", 15.0)


@pytest.mark.parametrize(
    ("manifest", "path", "value"),
    [
        (
            {"execution_limits": {"rate_limit": "100/fortnight"}},
            "execution_limits.rate_limit",
            "100/fortnight",
        ),
        ({"execution_limits": {"rate_limit": 100}}, "execution_limits.rate_limit", 100),
        (
            {"execution_limits": {"max_concurrent_calls": 0}},
            "execution_limits.max_concurrent_calls",
            0,
        ),
        (
            {"execution_limits": {"max_concurrent_calls": True}},
            "execution_limits.max_concurrent_calls",
            True,
        ),
        (
            {"execution_limits": {"max_tool_call_duration": "forever"}},
            "execution_limits.max_tool_call_duration",
            "forever",
        ),
        (
            {"execution_limits": {"max_tool_call_duration": 0}},
            "execution_limits.max_tool_call_duration",
            0,
        ),
        ({"execution_limits": {"foo": 1}}, "execution_limits.foo", 1),
        ({"execution_limits": ["rate_limit"]}, "execution_limits", ["rate_limit"]),
        ({"other": {}}, "other", {}),
        ("not a manifest", "manifest", "not a manifest"),
    ],
)
def test_from_manifest_errors_name_the_json_path(manifest, path, value):
    with pytest.raises(ConfigError) as info:
        Gate.from_manifest(manifest)
    check_config_error(info.value, path, value)


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: sbxlimit.Gate(max_concurrent=1, wait="200000d"), "Gate.wait"),
        (lambda: sbxlimit.Gate(max_concurrent=1, timeout=1e12), "Gate.timeout"),
        (lambda: sbxlimit.Gate(rate=f"{2**60}/second"), "Gate.rate"),
        (lambda: sbxlimit.Quota(max_sandboxes=1, wait="200000d"), "Quota.wait"),
    ],
)
def test_waits_and_rates_past_what_can_be_held_are_refused(make, field):
    # Past threading.TIMEOUT_MAX the first queued call would raise
    # OverflowError; refused at construction instead.
    with pytest.raises(sbxlimit.ConfigError, match="too large") as info:
        make()
    assert info.value.field == field


def test_a_calls_own_wait_past_what_can_be_held_is_refused():
    q = sbxlimit.Quota(max_sandboxes=1)
    with pytest.raises(sbxlimit.ConfigError, match="too large"):
        q.admit(None, wait="200000d")
    gate = sbxlimit.Gate(max_concurrent=1)
    with pytest.raises(sbxlimit.ConfigError, match="too large"):
        gate.call("k", timeout_ms=1e16)
