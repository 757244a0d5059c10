"""Gate and Quota shared through a real Redis (issue 22).

A real ``redis-server`` (Debian's package) is started per module on a free
port; several real worker processes share one Gate or one Quota through it.
Limits are checked from what the workers record while they hold their
admission (so a recorded interval lies inside the held one: an overlap
seen is an overlap that happened).  Redis is stopped, slowed and restarted
under them for real.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import sbxlimit

pytest.importorskip("redis", reason="the Redis store needs redis-py: pip install 'sbxlimit[redis]'")
SERVER = shutil.which("redis-server")
pytestmark = pytest.mark.skipif(
    SERVER is None, reason="needs redis-server (Debian: apt-get install redis-server)"
)

PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Server:
    """One redis-server on a free loopback port, restartable."""

    def __init__(self, workdir: str) -> None:
        self.dir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self, *, persist: bool = False) -> None:
        args = [SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir]
        args += ["--save", "", "--daemonize", "no", "--logfile", ""]
        args += ["--enable-debug-command", "local"]  # DEBUG SLEEP: a slow server
        args += ["--appendonly", "yes", "--appendfsync", "always"] if persist else []
        args += ["--appendonly", "no"] if not persist else []
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.2) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()  # as a crash: what was not persisted is lost
            self.proc.wait()
            self.proc = None

    def cli(self, *args: str) -> str:
        import redis

        r = redis.Redis.from_url(self.url, decode_responses=True)
        try:
            return str(r.execute_command(*args))
        finally:
            r.close()


@pytest.fixture
def server(tmp_path):
    srv = Server(str(tmp_path))
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def store(server):
    st = sbxlimit.RedisStore(server.url, lease="1.5s", timeout="0.5s")
    yield st
    st.close()


_started: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def no_worker_left():
    """A failed test leaves no worker behind."""
    yield
    while _started:
        p = _started.pop()
        if p.poll() is None:
            p.kill()
        p.wait()
        for f in (p.stdin, p.stdout):
            if f is not None:
                f.close()


def workers(n: int, code: str, *args: str, stdin: int | None = None) -> list[subprocess.Popen[str]]:
    env = dict(os.environ, PYTHONPATH=ROOT)
    procs = [
        subprocess.Popen(
            [PY, "-c", code, str(i), *args],
            env=env,
            stdin=stdin,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    _started.extend(procs)
    return procs


def collect(procs: list[subprocess.Popen[str]]) -> list[dict]:
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=120)
        assert p.returncode == 0, stdout
        out += [json.loads(line) for line in stdout.splitlines()]
    return out


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    now = peak = 0
    for _, d in edges:  # an end sorts before a start at the same instant
        now += d
        peak = max(peak, now)
    return peak


# -- one gate, many processes ------------------------------------------------------

GATE_WORKER = """
import json, sys, time, sbxlimit
url, calls = sys.argv[2], int(sys.argv[3])
gate = sbxlimit.Gate(max_concurrent=3, rate="20/second", burst=4, wait=None,
                     store=url, name="fleet")
for _ in range(calls):
    with gate.call("tenant-1"):
        start = time.time()
        time.sleep(0.02)
        print(json.dumps({"start": start, "end": time.time()}), flush=True)
"""


def test_processes_sharing_a_gate_never_exceed_its_concurrency_or_rate(server):
    calls = collect(workers(5, GATE_WORKER, server.url, "10"))
    assert len(calls) == 50
    assert max_overlap([(c["start"], c["end"]) for c in calls]) <= 3
    # A token bucket of 4 refilled at 20/s admits at most 4 + 20 * d calls
    # in any span of d seconds (two more for the time, up to 100 ms, a start
    # may be recorded after its admission).
    starts = sorted(c["start"] for c in calls)
    for i, a in enumerate(starts):
        for j in range(i, len(starts)):
            assert j - i + 1 <= 4 + 20 * (starts[j] - a) + 2, (i, j, starts[j] - a)
    # Without the store, five gates would each admit their own 4 at once.
    assert starts[-1] - starts[0] >= (50 - 4 - 2) / 20


def test_a_killed_workers_slot_comes_back_after_its_lease(server, store):
    holder = workers(
        1,
        """
import sys, time, sbxlimit
st = sbxlimit.RedisStore(sys.argv[2], lease="1s")
gate = sbxlimit.Gate(max_concurrent=1, store=st, name="crash")
call = gate.call("k")
call.__enter__()
print("held", flush=True)
time.sleep(600)
""",
        server.url,
    )[0]
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    gate = sbxlimit.Gate(max_concurrent=1, store=store, name="crash")
    with pytest.raises(sbxlimit.ConcurrencyLimited):
        gate.call("k").__enter__()
    # The holder is alive past its lease: its keeper renews the slot.
    time.sleep(1.2)
    with pytest.raises(sbxlimit.ConcurrencyLimited):
        gate.call("k").__enter__()
    holder.kill()
    holder.wait()
    holder.stdout.close()
    with gate.call("k", wait="10s"):
        assert gate.stats("k").in_flight == 1
    assert gate.stats("k").in_flight == 0


def test_a_killed_waiter_leaves_the_queue(server, store):
    gate = sbxlimit.Gate(max_concurrent=1, store=store, name="queue")
    with gate.call("k"):
        waiter = workers(
            1,
            """
import sys, sbxlimit
gate = sbxlimit.Gate(max_concurrent=1, wait=None, store=sys.argv[2], name="queue")
with gate.call("k"):
    pass
""",
            server.url,
        )[0]
        deadline = time.monotonic() + 10
        while gate.stats("k").queued == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert gate.stats("k").queued == 1
        waiter.kill()
        waiter.communicate()
    # Its ticket expires after 3 s (the queue's key would only after 6 s).
    with gate.call("k", wait="5s"):
        pass
    assert gate.stats("k").queued == 0


# -- quotas across processes ---------------------------------------------------------

QUOTA_WORKER = """
import json, sys, sbxlimit
url, out = sys.argv[2], sys.argv[3]
stamp = 'echo "$(date +%s.%N) 1" >> "$0"; sleep 0.15; echo "$(date +%s.%N) -1" >> "$0"'
quota = sbxlimit.Quota(max_sandboxes=2, memory="300Mi", wait=None, store=url, name="tenant")
for _ in range(3):
    r = sbxlimit.run(
        ["sh", "-c", stamp, out],
        limits=sbxlimit.Limits(memory="128Mi", wall_time="20s"),
        quota=quota,
    )
    assert r.returncode == 0, r
"""


def test_quotas_hold_across_processes(server, store, tmp_path):
    log = tmp_path / "sandboxes.log"
    log.touch()
    collect(workers(4, QUOTA_WORKER, server.url, str(log)))
    events = sorted(
        (float(t), int(d))
        for t, d in (line.split() for line in log.read_text().split("\n") if line)
    )
    assert len(events) == 24
    now = peak = 0
    for _, d in events:
        now += d
        peak = max(peak, now)
    # 2 sandboxes, and 300Mi holds only two of 128Mi.
    assert peak == 2
    q = sbxlimit.Quota(max_sandboxes=2, memory="300Mi", store=store, name="tenant")
    assert q.in_use() == {"sandboxes": 0, "memory": 0}


def test_a_killed_workers_quota_room_comes_back(server, store):
    holder = workers(
        1,
        """
import sys, time, sbxlimit
st = sbxlimit.RedisStore(sys.argv[2], lease="1s")
q = sbxlimit.Quota(memory="1Gi", store=st, name="room")
q.admit(sbxlimit.Limits(memory="600Mi"))
print("held", flush=True)
time.sleep(600)
""",
        server.url,
    )[0]
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    q = sbxlimit.Quota(memory="1Gi", store=store, name="room")
    assert q.in_use() == {"memory": 600 * 2**20}
    with pytest.raises(sbxlimit.QuotaExceeded) as e:
        q.admit(sbxlimit.Limits(memory="600Mi"))
    assert (e.value.field, e.value.in_use) == ("memory", 600 * 2**20)
    holder.kill()
    holder.wait()
    holder.stdout.close()
    q.admit(sbxlimit.Limits(memory="600Mi"), wait="10s").release()
    assert q.in_use() == {"memory": 0}


# -- the same verdicts as in memory --------------------------------------------------


@pytest.mark.parametrize("where", ["memory", "redis"])
def test_same_verdicts_as_the_memory_store(where, store):
    shared = store if where == "redis" else "memory"
    gate = sbxlimit.Gate(max_concurrent=2, rate="3/minute", store=shared, name=f"v-{where}")
    with gate.call("a"), gate.call("a"):
        with pytest.raises(sbxlimit.ConcurrencyLimited) as c:
            gate.call("a").__enter__()
        assert (c.value.key, c.value.limit) == ("a", 2)
        s = gate.stats("a")
        assert (s.in_flight, s.queued, s.capacity, s.max_concurrent) == (2, 0, 3, 2)
    with gate.call("a"):
        pass
    with pytest.raises(sbxlimit.RateLimited) as r:
        gate.call("a").__enter__()
    assert r.value.limit == "3/minute"
    assert 19 < r.value.retry_after <= 20
    assert gate.stats("a").in_flight == 0
    # Another key has its own slots and tokens.
    with gate.call(("b", 1)):
        assert gate.stats(("b", 1)).in_flight == 1
    assert gate.stats("a").in_flight == 0

    quota = sbxlimit.Quota(max_sandboxes=1, pids=10, store=shared, name=f"v-{where}")
    held = quota.admit(sbxlimit.Limits(pids=8), key="t")
    with pytest.raises(sbxlimit.QuotaExceeded) as q:
        quota.admit(sbxlimit.Limits(pids=1), key="t")
    assert (q.value.field, q.value.in_use, q.value.limit) == ("sandboxes", 1, 1)
    with pytest.raises(sbxlimit.QuotaExceeded) as never:
        quota.admit(sbxlimit.Limits(pids=11))
    assert never.value.field == "pids"
    held.release()
    held.release()
    assert quota.in_use() == {"sandboxes": 0, "pids": 0}


def test_a_waiting_caller_gets_the_slot_when_it_frees(store):
    gate = sbxlimit.Gate(max_concurrent=1, store=store, name="handoff")
    call = gate.call("k")
    call.__enter__()
    got = []

    def waiter() -> None:
        with gate.call("k", wait="10s"):
            got.append(gate.stats("k").in_flight)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.1)
    assert not got
    call.__exit__(None, None, None)
    t.join()
    assert got == [1]


def test_a_retried_admission_admits_nothing_twice(store):
    """The store retries with the same lease id: the script finds it."""
    gate = sbxlimit.Gate(max_concurrent=5, rate="10/minute", store=store, name="idem")
    adm = gate._admission
    keys = adm._keys("k")  # type: ignore[union-attr]
    args = adm._args("lease-1", "")  # type: ignore[union-attr]
    for _ in range(3):
        assert store.run("gate_acquire", keys, args, "admit") == [1]
    s = gate.stats("k")
    assert s.in_flight == 1 and s.tokens is not None and 8.9 < s.tokens < 9.1
    budget = sbxlimit.Quota(memory="1Gi", store=store, name="idem")._shared
    assert budget is not None
    qargs, _ = budget._args("lease-2", {"memory": 100})
    for _ in range(3):
        assert store.run("quota_admit", budget._keys, qargs, "admit") == [1]
    assert budget.in_use() == {"memory": 100}


# -- Redis down, slow, restarted ---------------------------------------------------


def test_redis_down_fails_closed_then_recovers(server, events):
    st = sbxlimit.RedisStore(server.url, timeout="0.3s")
    gate = sbxlimit.Gate(max_concurrent=1, store=st, name="down")
    quota = sbxlimit.Quota(max_sandboxes=1, store=st, name="down")
    server.stop()
    try:
        with pytest.raises(sbxlimit.StoreUnavailable) as e:
            gate.call("k").__enter__()
        assert e.value.code == "store_unavailable" and e.value.operation == "admit"
        assert isinstance(e.value, ConnectionError)
        assert "Nothing was admitted" in str(e.value)
        with pytest.raises(sbxlimit.StoreUnavailable):
            sbxlimit.run(["true"], limits=sbxlimit.Limits(memory="64Mi"), quota=quota)
    finally:
        server.start()
    with gate.call("k"):
        assert gate.stats("k").in_flight == 1
    assert quota.in_use() == {"sandboxes": 0}
    st.close()


def test_redis_down_fail_open_admits_and_says_so(server, events):
    st = sbxlimit.RedisStore(server.url + "?fail=open&timeout=0.2s")
    assert st.fail == "open" and st.timeout == 0.2
    gate = sbxlimit.Gate(max_concurrent=1, store=st, name="open")
    server.stop()
    try:
        with gate.call("k"), gate.call("k"):
            pass  # both admitted: nothing counts while the store is down
    finally:
        server.start()
    degraded = [e for e in events if e.name == "degraded"]
    assert len(degraded) == 2 and degraded[0].field == "store"
    assert degraded[0].detail == "store_unavailable"
    st.close()


def test_a_slow_redis_is_a_bounded_error(server, store):
    gate = sbxlimit.Gate(max_concurrent=1, store=store, name="slow")
    sleeper = threading.Thread(target=server.cli, args=("DEBUG", "SLEEP", "1.5"))
    sleeper.start()
    time.sleep(0.1)
    try:
        with pytest.raises(sbxlimit.StoreUnavailable):
            gate.call("k").__enter__()
    finally:
        sleeper.join()
    with gate.call("k"):
        assert gate.stats("k").in_flight == 1


class ReplyLosingProxy:
    """A TCP relay to Redis that, while `lose` is set, passes requests on
    and drops the replies: the server admits, the client never hears it."""

    def __init__(self, port: int) -> None:
        self.lose = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/0"
        self.target = port
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.socks += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while data := src.recv(65536):
                if not (replies and self.lose.is_set()):
                    dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()
        for s in self.socks:
            s.close()


def test_an_admission_whose_reply_was_lost_is_given_back(server):
    proxy = ReplyLosingProxy(server.port)
    # A long lease: the slot must come back by the keeper's release, not by expiry.
    store = sbxlimit.RedisStore(proxy.url, lease="60s", timeout="0.3s")
    gate = sbxlimit.Gate(max_concurrent=1, store=store, name="lost")
    watch = sbxlimit.Gate(max_concurrent=1, store=server.url, name="lost")
    try:
        with gate.call("warm"):
            pass
        proxy.lose.set()
        with pytest.raises(sbxlimit.StoreUnavailable):
            gate.call("k").__enter__()
        assert watch.stats("k").in_flight == 1  # the server did admit it
        proxy.lose.clear()
        deadline = time.monotonic() + 10
        while watch.stats("k").in_flight and time.monotonic() < deadline:
            time.sleep(0.02)
        assert watch.stats("k").in_flight == 0
    finally:
        store.close()
        proxy.close()
        sbxlimit.RedisStore.shared(server.url).close()


HOLDER = """
import sys, time, sbxlimit
st = sbxlimit.RedisStore(sys.argv[2], lease="1.5s")
gate = sbxlimit.Gate(max_concurrent=2, store=st, name="restart")
quota = sbxlimit.Quota(memory="1Gi", store=st, name="restart")
call = gate.call("k")
call.__enter__()
room = quota.admit(sbxlimit.Limits(memory="256Mi"))
print("held", flush=True)
sys.stdin.readline()
call.__exit__(None, None, None)
room.release()
print("released", st.reasserted, flush=True)
"""


@pytest.mark.parametrize("persist", [True, False], ids=["aof", "no-persistence"])
def test_redis_restarted_loses_nothing_admitted(server, store, persist):
    server.stop()
    server.start(persist=persist)
    holder = workers(1, HOLDER, server.url, stdin=subprocess.PIPE)[0]
    assert holder.stdout is not None and holder.stdin is not None
    assert holder.stdout.readline() == "held\n"
    gate = sbxlimit.Gate(max_concurrent=2, store=store, name="restart")
    quota = sbxlimit.Quota(memory="1Gi", store=store, name="restart")
    server.stop()
    server.start(persist=persist)
    if not persist:
        # The holder's keeper puts its lease back within a third of it.
        deadline = time.monotonic() + 10
        while gate.stats("k").in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        while quota.in_use()["memory"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert gate.stats("k").in_flight == 1
    assert quota.in_use() == {"memory": 256 * 2**20}
    with gate.call("k"), pytest.raises(sbxlimit.ConcurrencyLimited):
        gate.call("k").__enter__()  # the holder's slot still counts
    holder.stdin.write("\n")
    holder.stdin.flush()
    line = holder.stdout.readline().split()
    assert line[0] == "released" and (int(line[1]) > 0) == (not persist)
    holder.communicate()
    assert gate.stats("k").in_flight == 0
    assert quota.in_use() == {"memory": 0}


# -- asyncio -------------------------------------------------------------------------


def test_asyncio_gate_and_quota_on_redis(server, store, tmp_path):
    gate = sbxlimit.Gate(max_concurrent=2, store=store, name="aio", wait=None)
    quota = sbxlimit.Quota(max_sandboxes=1, store=store, name="aio", wait=None)
    seen: list[int] = []

    async def one() -> None:
        async with gate.call("k"):
            seen.append(gate._admission.snapshot("k")[0])
            await asyncio.sleep(0.02)

    async def main() -> None:
        await asyncio.gather(*(one() for _ in range(8)))
        with pytest.raises(sbxlimit.ConcurrencyLimited):
            async with gate.call("k"), gate.call("k"), gate.call("k", wait=0):
                pass
        runs = [
            sbxlimit.asyncio.run(["true"], limits=sbxlimit.Limits(memory="64Mi"), quota=quota)
            for _ in range(3)
        ]
        assert [r.returncode for r in await asyncio.gather(*runs)] == [0, 0, 0]
        assert await gate.arun("k", asyncio.sleep, 0, "x") == "x"
        await store.aclose()

    asyncio.run(main())
    assert len(seen) == 8 and max(seen) <= 2
    assert gate.stats("k").in_flight == 0
    assert quota.in_use() == {"sandboxes": 0}


# -- configuration -------------------------------------------------------------------


def test_bad_store_settings_are_refused_before_anything(monkeypatch):
    with pytest.raises(sbxlimit.ConfigError, match="redis://"):
        sbxlimit.Gate(max_concurrent=1, store="http://localhost")
    with pytest.raises(sbxlimit.ConfigError, match="'closed' or 'open'"):
        sbxlimit.RedisStore("redis://localhost", fail="maybe")  # type: ignore[arg-type]
    with pytest.raises(sbxlimit.ConfigError, match=r"at least 0\.3"):
        sbxlimit.RedisStore("redis://localhost", lease="0.1s")
    with pytest.raises(sbxlimit.ConfigError, match="server's clock"):
        sbxlimit.Gate(max_concurrent=1, store="redis://localhost", clock=lambda: 0.0)
    with pytest.raises(sbxlimit.ConfigError, match=r"Gate\.name"):
        sbxlimit.Gate(max_concurrent=1, name="")
    st = sbxlimit.RedisStore("redis://user:s3cret@localhost:1/0", timeout="0.1s")
    assert "s3cret" not in repr(st) and st.address == "redis://user:***@localhost:1/0"
    gate = sbxlimit.Gate(max_concurrent=1, store=st)
    with pytest.raises(sbxlimit.ConfigError, match="JSON"):
        gate.call(frozenset({1})).__enter__()
    with pytest.raises(sbxlimit.StoreUnavailable) as e:
        gate.call("k").__enter__()
    assert "s3cret" not in str(e.value)
    st.close()
    monkeypatch.setenv("SBXLIMIT_STORE", "ftp://x")
    with pytest.raises(sbxlimit.ConfigError, match="SBXLIMIT_STORE"):
        sbxlimit.Quota(max_sandboxes=1)


def test_sbxlimit_store_names_the_store(server, monkeypatch):
    monkeypatch.setenv("SBXLIMIT_STORE", server.url)
    gate = sbxlimit.Gate(max_concurrent=1)
    quota = sbxlimit.Quota(max_sandboxes=1)
    assert gate.store == quota.store == server.url
    assert gate.name == "c1-rNone-bNone"
    assert sbxlimit.Gate(max_concurrent=1, store="memory").store == "memory"
    # Another gate made alike, here or in another process, is the same gate.
    with gate.call("k"), pytest.raises(sbxlimit.ConcurrencyLimited):
        sbxlimit.Gate(max_concurrent=1).call("k").__enter__()
    sbxlimit.RedisStore.shared(server.url).close()


def test_a_key_is_stored_under_one_hash_tag(server, store):
    gate = sbxlimit.Gate(max_concurrent=1, rate="5/second", store=store, name="tags")
    with gate.call(("agent", 7)):
        keys = sorted(server.cli("KEYS", "*").strip("[]").replace("'", "").split(", "))
    assert keys == [
        'sbxlimit:{gate:tags:["agent",7]}:bucket',
        'sbxlimit:{gate:tags:["agent",7]}:held',
    ]


def test_a_lease_outlives_no_holder_after_fork(store):
    """A forked child inherits no lease to renew: the parent keeps its own."""
    gate = sbxlimit.Gate(max_concurrent=1, store=store, name="fork")
    with gate.call("k"):
        pid = os.fork()
        if pid == 0:
            os._exit(0 if not store._held and store._keeper is None else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert gate.stats("k").in_flight == 1
    assert gate.stats("k").in_flight == 0


def test_signals_do_not_strand_a_waiter(store):
    gate = sbxlimit.Gate(max_concurrent=1, store=store, name="sig")
    call = gate.call("k")
    call.__enter__()

    def interrupt() -> None:
        time.sleep(0.2)
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    threading.Thread(target=interrupt).start()
    with pytest.raises(KeyboardInterrupt):
        gate.call("k", wait=None).__enter__()
    assert gate.stats("k").queued == 0
    call.__exit__(None, None, None)
    assert gate.stats("k").in_flight == 0


def test_a_release_never_crosses_a_renewal(server):
    """The keeper renews every 0.1 s here while calls come and go: a
    renewal on the wire during a release must not put the slot back."""
    store = sbxlimit.RedisStore(server.url, lease="0.3s")
    gate = sbxlimit.Gate(max_concurrent=1, store=store, name="race")
    other = gate.call("held")
    other.__enter__()  # keeps the keeper busy renewing
    try:
        stuck = 0
        for _ in range(1500):
            with gate.call("k"):
                time.sleep(0.0005)
            stuck += gate.stats("k").in_flight
        assert stuck == 0
    finally:
        other.__exit__(None, None, None)
        store.close()
