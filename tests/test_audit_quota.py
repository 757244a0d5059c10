"""Audit events from real runs, the secret-free guarantee, and Quota."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys
import threading
import time

import pytest

import sbxlimit
import sbxlimit.asyncio as sa
from sbxlimit import audit
from sbxlimit._namespaces import CLONE_NEWNET, CLONE_NEWNS, namespaces

PY = sys.executable
SECRET = "s3cr3t-t0ken-do-not-leak"


def names(events) -> set[str]:
    return {e.name for e in events}


CONNECT = (
    "import socket, sys\n"
    "for host in sys.argv[1:]:\n"
    "    s = socket.create_connection(('127.0.0.1', 3128))\n"
    "    s.sendall(f'CONNECT {host} HTTP/1.1\\r\\n\\r\\n'.encode())\n"
    "    s.recv(100)\n"
)


def test_every_event_kind_from_real_runs(events, monkeypatch):
    hog = "import time; b = bytearray(80 << 20); b[::4096] = b'x' * (len(b) // 4096); time.sleep(1)"
    sbxlimit.run(["true"], limits={"memory": "64Mi"})
    # Past half of its limit (warn_at=0.5), well below the limit itself.
    sbxlimit.run([PY, "-c", hog], limits={"memory": "128Mi"}, sample_interval="20ms", warn_at=0.5)
    sbxlimit.run(["sleep", "5"], limits={"wall_time": "0.2s", "kill_grace": 0})
    p = sbxlimit.Popen(["sleep", "5"], limits={"wall_time": 10}, audit_key="agent-7")
    p.kill_tree(grace=0)
    with pytest.warns(RuntimeWarning):  # a CPU rate without a cgroup: no mechanism at all
        sbxlimit.run(["true"], limits={"cpu": "500m"}, cgroup_parent="none")
    q = sbxlimit.Quota(max_sandboxes=1)
    with sbxlimit.Popen(["sleep", "5"], limits={"wall_time": 10}, quota=q) as held:
        with pytest.raises(sbxlimit.QuotaExceeded):
            sbxlimit.Popen(["true"], limits={"wall_time": 5}, quota=q)
        held.kill_tree(grace=0)
    gate = sbxlimit.Gate(max_concurrent=1)
    with gate.call("tool-x"), pytest.raises(sbxlimit.ConcurrencyLimited), gate.call("tool-x"):
        pass
    expected = set(audit.EVENT_NAMES)
    if namespaces(CLONE_NEWNET).ok:
        # Through the filtering proxy: one refused by name, one allowed (to
        # a closed port: it ends at once).
        from sbxlimit import _proxy

        proxy = _proxy.ProxyServer(resolver={"ok.test": ["127.0.0.1"]})
        monkeypatch.setattr(_proxy, "shared", lambda: proxy)
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            port = closed.getsockname()[1]
        policy = {"network": "proxy", "allow_domains": ["ok.test", "127.0.0.1"]}
        sbxlimit.run([PY, "-c", CONNECT, f"ok.test:{port}", "no.test:443"], policy=policy)
        proxy.close()
    else:
        expected -= {"net_allowed", "net_denied"}
    assert names(events) == expected
    by = {e.name: e for e in events}
    warn = next(e for e in events if e.name == "resource_warning")
    assert warn.field == "memory" and warn.observed >= 0.5 * warn.limit
    wall = next(e for e in events if e.name == "limit_exceeded" and e.field == "wall_time")
    assert wall.limit == 0.2 and wall.mechanism == "watchdog:wall_time" and wall.program == "sleep"
    killed = [e for e in events if e.name == "killed" and e.detail == "kill_tree"]
    assert killed and killed[0].key == "agent-7"
    assert by["gate_denied"].key == "tool-x" and by["gate_denied"].detail == "concurrency_limited"
    assert by["quota_denied"].field == "sandboxes" and by["quota_denied"].limit == 1
    assert {e.field for e in events if e.name == "degraded"} >= {"cpu"}
    spawn = next(e for e in events if e.name == "spawn")
    assert spawn.sandbox_id and spawn.time > 0


def test_output_warning(events):
    sbxlimit.run(
        ["sh", "-c", "head -c 950000 /dev/zero"], limits={"output": "1Mi"}, capture_output=True
    )
    warn = [e for e in events if e.name == "resource_warning"]
    assert len(warn) == 1 and warn[0].field == "output" and warn[0].detail == "stdout"


def test_disk_warning(events):
    code = "head -c 990000 /dev/zero > f; sleep 1"  # 94% of 1 MiB
    sbxlimit.run(["sh", "-c", code], limits={"disk": "1Mi"}, sample_interval="20ms")
    warn = [e for e in events if e.name == "resource_warning"]
    assert len(warn) == 1 and warn[0].field == "disk" and warn[0].observed >= 0.9 * (1 << 20)
    # The tmpfs's own figure where the kernel holds the cap, else the watchdog's.
    mech = "tmpfs:size" if namespaces(CLONE_NEWNS).ok else "watchdog:disk"
    assert warn[0].mechanism == mech


def test_no_secret_ever_reaches_an_event(events, caplog, monkeypatch):
    monkeypatch.setenv("API_TOKEN", SECRET)
    caplog.set_level(logging.INFO, logger="sbxlimit.audit")
    code = f"import os, sys; print('{SECRET}'); print(os.environ['API_TOKEN'], file=sys.stderr)"
    sbxlimit.run(
        [PY, "-c", code, f"--token={SECRET}"], limits={"wall_time": 5}, capture_output=True
    )
    sbxlimit.run(
        [PY, "-c", f"import time; time.sleep(5)  # {SECRET}"],
        limits={"wall_time": "0.1s", "kill_grace": 0},
    )
    sbxlimit.run(["sh", "-c", f"yes {SECRET}"], limits={"output": "64Ki"}, capture_output=True)
    assert {"spawn", "exit", "limit_exceeded"} <= names(events)
    dumped = json.dumps([e.to_dict() for e in events], default=str)
    assert SECRET not in dumped
    for record in caplog.records:
        assert SECRET not in record.getMessage()
        assert SECRET not in json.dumps(getattr(record, "sbx_event", {}), default=str)
    assert any(hasattr(r, "sbx_event") for r in caplog.records)


# How a secret rides along on a command line: a shell assignment, a script,
# argv[0] with executable=, argv beyond the name, the environment.
SECRET_CALLS = [
    ({"args": f"API_TOKEN={SECRET} sh -c 'exit 3'", "shell": True}, "`sh`"),
    ({"args": [f"echo token={SECRET} | grep -q x; exit 3"], "shell": True}, "`echo`"),
    ({"args": f"'{SECRET}'; exit 3", "shell": True}, "`sh`"),
    ({"args": f"exit 3 # {SECRET}", "shell": True, "executable": "/bin/dash"}, "`exit`"),
    ({"args": [f"{SECRET}-as-argv0", "-c", "exit 3"], "executable": "/bin/sh"}, "`sh`"),
    ({"args": ["/bin/sh", "-c", f"exit 3 # {SECRET}"]}, "`sh`"),
    ({"args": ["sh", "-c", "exit 3"], "env": {"PATH": "/usr/bin:/bin", "TOKEN": SECRET}}, "`sh`"),
]


@pytest.mark.parametrize(("call", "name"), SECRET_CALLS)
def test_no_secret_from_a_command_line_in_messages_or_events(call, name, events, caplog):
    caplog.set_level(logging.INFO, logger="sbxlimit.audit")
    kw = dict(call)
    args = kw.pop("args")
    r = sbxlimit.run(args, limits={"memory": "64Mi", "wall_time": 10}, capture_output=True, **kw)
    assert r.returncode == 3
    t = r.termination
    assert t.message.startswith(f"{name} exited with status 3.")
    with pytest.raises(sbxlimit.CalledProcessError):
        r.check_returncode()
    shown = [t.message, repr(t), json.dumps(t.to_dict()), json.dumps(r.usage.to_dict())]
    shown += [json.dumps(e.to_dict(), default=str) for e in events]
    shown += [r.getMessage() for r in caplog.records]
    assert {e.program for e in events} == {name.strip("`")}
    assert not [text for text in shown if SECRET in text]


def test_no_secret_from_a_command_line_in_the_cli():
    run = ["run", "--memory", "64Mi", "--timeout", "0.3s", "--json"]
    r = subprocess.run(
        [PY, "-m", "sbxlimit", *run, "--", "sh", "-c", f"sleep 5 # {SECRET}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 124 and "`sh`" in r.stderr
    assert SECRET not in r.stderr and SECRET not in r.stdout


def test_json_lines_sink(tmp_path):
    path = tmp_path / "audit.jsonl"
    sink = audit.JsonLinesSink(str(path))
    unsubscribe = audit.subscribe(sink)
    try:
        sbxlimit.run(["true"], limits={"wall_time": 5})
    finally:
        unsubscribe()
        sink.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [d["name"] for d in lines] == ["spawn", "exit"]
    assert lines[1]["observed"] == 0 and lines[1]["detail"] == "exited"


def test_nothing_is_built_when_nobody_listens(monkeypatch):
    assert not audit.active()
    monkeypatch.setattr(audit, "Event", None)  # would fail if built
    sbxlimit.run(["true"], limits={"wall_time": 5})


# -- Quota -----------------------------------------------------------------


def test_quota_arithmetic():
    q = sbxlimit.Quota(max_sandboxes=3, memory="1Gi", cpu="1", pids=100)
    L = sbxlimit.Limits
    a = q.admit(L(memory="512Mi", cpu="500m", pids=50))
    b = q.admit(L(memory="256Mi", cpu="250m", pids=25))
    assert q.in_use() == {"sandboxes": 2, "memory": 768 << 20, "cpu": 750, "pids": 75}
    with pytest.raises(sbxlimit.QuotaExceeded) as ei:
        q.admit(L(memory="512Mi", cpu="100m", pids=1))
    assert ei.value.field == "memory" and ei.value.requested == 512 << 20
    assert ei.value.in_use == 768 << 20 and ei.value.code == "quota_exceeded"
    with pytest.raises(sbxlimit.QuotaExceeded, match="no cpu limit"):
        q.admit(L(memory="1Mi", pids=1))  # unbounded cannot fit a budget
    c = q.admit(L(memory="256Mi", cpu="250m", pids=25))  # exactly full
    with pytest.raises(sbxlimit.QuotaExceeded) as ei:
        q.admit(L(memory="1Mi", cpu="1m", pids=1))
    assert ei.value.field == "sandboxes"
    for adm in (a, b, c, c):  # release is idempotent
        adm.release()
    assert q.in_use() == {"sandboxes": 0, "memory": 0, "cpu": 0, "pids": 0}


def test_quota_waits_for_room_and_releases_at_reap():
    q = sbxlimit.Quota(max_sandboxes=1, wait="10s")
    first = sbxlimit.Popen(["sleep", "0.3"], limits={"wall_time": 10}, quota=q)
    t0 = time.monotonic()
    second = sbxlimit.Popen(
        ["true"],
        limits={"wall_time": 10},
        quota=q,
    )
    assert first.poll() is not None  # admitted only once the first was reaped
    second.wait()
    assert time.monotonic() - t0 >= 0.2 and q.in_use() == {"sandboxes": 0}


def test_quota_refused_spawn_gives_room_back():
    q = sbxlimit.Quota(max_sandboxes=1)
    with pytest.raises(FileNotFoundError):
        sbxlimit.Popen(["/nonexistent"], limits={"wall_time": 5}, quota=q)
    assert q.in_use() == {"sandboxes": 0}


def test_quota_with_asyncio_and_threads():
    q = sbxlimit.Quota(max_sandboxes=4, wait=None)
    peak = 0
    lock = threading.Lock()

    async def one():
        nonlocal peak
        p = await sa.create_subprocess_exec("sleep", "0.05", limits={"wall_time": 10}, quota=q)
        with lock:
            peak = max(peak, q.in_use()["sandboxes"])
        await p.wait()

    async def main():
        await asyncio.gather(*(one() for _ in range(20)))

    asyncio.run(main())
    assert 1 <= peak <= 4 and q.in_use() == {"sandboxes": 0}


def test_quota_bad_input():
    with pytest.raises(sbxlimit.ConfigError):
        sbxlimit.Quota()
    with pytest.raises(sbxlimit.ConfigError, match=r"Quota\.memory"):
        sbxlimit.Quota(memory="lots")
    with pytest.raises(sbxlimit.ConfigError, match="quota"):
        sbxlimit.Popen(["true"], limits={"wall_time": 5}, quota="nope")


def test_subscribers_may_call_back_without_deadlock():
    gate = sbxlimit.Gate(max_concurrent=1)
    quota = sbxlimit.Quota(max_sandboxes=1)
    seen = []

    def callback(e: audit.Event) -> None:
        # Runs where the denial happened: the gate's and quota's locks must
        # not be held by then.
        seen.append((e.name, gate.stats("k").in_flight, quota.in_use()["sandboxes"]))

    unsubscribe = audit.subscribe(callback)
    try:

        def deny() -> None:
            with gate.call("k"), pytest.raises(sbxlimit.ConcurrencyLimited), gate.call("k"):
                pass
            adm = quota.admit(None)
            with pytest.raises(sbxlimit.QuotaExceeded):
                quota.admit(None)
            adm.release()

        t = threading.Thread(target=deny)
        t.start()
        t.join(10)
        assert not t.is_alive(), "a subscriber deadlocked"
    finally:
        unsubscribe()
    assert ("gate_denied", 1, 0) in seen and ("quota_denied", 0, 1) in seen


def test_asyncio_kills_emit_killed(events):
    async def main() -> None:
        p = await sa.create_subprocess_exec("sleep", "30", limits={"wall_time": 60})
        await p.kill_tree(grace=0)
        p = await sa.create_subprocess_exec("sleep", "30", limits={"wall_time": 60})
        waiter = asyncio.ensure_future(p.wait())
        await asyncio.sleep(0.05)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await p._exited
        with pytest.raises(subprocess.TimeoutExpired):
            await sa.run(["sleep", "30"], timeout=0.1, limits={"wall_time": 60})

    asyncio.run(main())
    killed = [e for e in events if e.name == "killed"]
    assert [e.detail for e in killed] == ["kill_tree"] * 3
    assert len({e.sandbox_id for e in killed}) == 3
