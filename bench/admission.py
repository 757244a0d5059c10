"""What a shared store costs a Gate or Quota admission (issue 22).

Starts a redis-server of its own on a free loopback port and times N
rounds, interleaved so that load drifts hit every variant alike, of:

* gate, memory / redis: ``with gate.call(key): pass`` (admission and
  release) with ``max_concurrent`` and a rate;
* gate admit only, redis: the admission's round trip alone (the release
  is done outside the timer);
* quota, memory / redis: ``quota.admit(limits).release()``;
* gate, redis, 4 processes: the same call from 4 other processes at once
  on the same key (contention on one key's script), timed in this one.

Prints the median and 90th percentile of each in microseconds, and the
issue's target (< 1 ms per admission on loopback).

    python bench/admission.py [--n 3000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import sbxlimit

LOAD = """
import sys, sbxlimit
gate = sbxlimit.Gate(max_concurrent=64, rate="1000000/second", store=sys.argv[1], name="bench")
while True:
    with gate.call("k"):
        pass
"""


def start_redis(workdir: str) -> tuple[subprocess.Popen[bytes], str]:
    server = shutil.which("redis-server")
    if server is None:
        sys.exit("needs redis-server (Debian: apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", workdir],
        stdout=subprocess.DEVNULL,
    )
    for _ in range(500):
        try:
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            break
        except OSError:
            time.sleep(0.01)
    return proc, f"redis://127.0.0.1:{port}/0"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3000)
    n = ap.parse_args().n
    with tempfile.TemporaryDirectory(prefix="bench-admission-") as workdir:
        server, url = start_redis(workdir)
        try:
            run(n, url)
        finally:
            server.kill()
            server.wait()


def run(n: int, url: str) -> None:
    store = sbxlimit.RedisStore(url)
    limits = sbxlimit.Limits(memory="64Mi")
    gates = {
        "memory": sbxlimit.Gate(max_concurrent=64, rate="1000000/second"),
        "redis": sbxlimit.Gate(max_concurrent=64, rate="1000000/second", store=store, name="a"),
    }
    quotas = {
        "memory": sbxlimit.Quota(max_sandboxes=64, memory="64Gi"),
        "redis": sbxlimit.Quota(max_sandboxes=64, memory="64Gi", store=store, name="a"),
    }
    contended = sbxlimit.Gate(max_concurrent=64, rate="1000000/second", store=store, name="bench")

    def gate_call(gate: sbxlimit.Gate) -> Callable[[], float]:
        def once() -> float:
            t = time.perf_counter()
            with gate.call("k"):
                pass
            return time.perf_counter() - t

        return once

    def admit_only() -> float:
        call = gates["redis"].call("k2")
        t = time.perf_counter()
        call.__enter__()
        dt = time.perf_counter() - t
        call.__exit__(None, None, None)
        return dt

    def quota_round(q: sbxlimit.Quota) -> Callable[[], float]:
        def once() -> float:
            t = time.perf_counter()
            q.admit(limits).release()
            return time.perf_counter() - t

        return once

    variants: dict[str, Callable[[], float]] = {
        "gate call, memory": gate_call(gates["memory"]),
        "gate call, redis": gate_call(gates["redis"]),
        "gate admit only, redis": admit_only,
        "quota admit+release, memory": quota_round(quotas["memory"]),
        "quota admit+release, redis": quota_round(quotas["redis"]),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(200):  # warm up connections and script caches
        for f in variants.values():
            f()
    for _ in range(n):
        for name, f in variants.items():
            times[name].append(f())
    # Contention: 4 other processes hammer the same key meanwhile.
    env = dict(os.environ)
    load = [subprocess.Popen([sys.executable, "-c", LOAD, url], env=env) for _ in range(4)]
    try:
        time.sleep(1.0)
        once = gate_call(contended)
        times["gate call, redis, 4 processes on the key"] = [once() for _ in range(n)]
    finally:
        for p in load:
            p.kill()
            p.wait()
    store.close()
    rows = {}
    for name, ts in times.items():
        ts.sort()
        rows[name] = {
            "median_us": round(statistics.median(ts) * 1e6, 1),
            "p90_us": round(ts[int(len(ts) * 0.9)] * 1e6, 1),
        }
    width = max(map(len, rows))
    print(f"{'variant':<{width}}  median µs  p90 µs   (n={n}, target < 1000 µs per admission)")
    for name, r in rows.items():
        print(f"{name:<{width}}  {r['median_us']:>9}  {r['p90_us']:>6}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
