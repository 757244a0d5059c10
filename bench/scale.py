"""What many live sandboxes cost their caller.

For 100, 500 and 1000 live sandboxes (`sleep 600`) of each kind, in a fresh
interpreter per (kind, count), beside `subprocess.Popen` in the same run:

* spawn latency, median of the first and of the last 10% of the spawns;
* the supervisor's CPU while the caller idles (the process's own
  getrusage over `--idle` seconds: the caller only sleeps, so it is the
  supervisor's), in % of one core;
* the caller's resident memory, open fds and threads with all of them live;
* the time to kill and reap them all (kill() each, then wait() each).

Kinds (cgroup ones only where `sbxlimit doctor` finds a usable cgroup;
on a v1 host, cgroup v2 runs in the UML guest:
tests/vm/run-in-uml.sh python bench/scale.py):

* cgroup: Limits(memory, pids, wall_time): the kernel holds all three;
* cgroup-pids: Limits(pids, wall_time);
* watchdog: Limits(memory, wall_time) with cgroup_parent="none": the tree's
  memory is sampled;
* subprocess: subprocess.Popen.

    python bench/scale.py [--counts 100,500,1000] [--idle 3] [--kinds cgroup,watchdog]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

SLEEP = ["sleep", "600"]
KINDS = ("subprocess", "cgroup", "cgroup-pids", "watchdog")


def _start(kind: str) -> Any:
    if kind == "subprocess":
        return subprocess.Popen(SLEEP)
    import sbxlimit

    if kind == "cgroup":
        lim = sbxlimit.Limits(memory="64Mi", pids=16, wall_time=3600)
        return sbxlimit.Popen(SLEEP, limits=lim)
    if kind == "cgroup-pids":
        return sbxlimit.Popen(SLEEP, limits=sbxlimit.Limits(pids=16, wall_time=3600))
    lim = sbxlimit.Limits(memory="64Mi", wall_time=3600)
    return sbxlimit.Popen(SLEEP, limits=lim, cgroup_parent="none")


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def one(kind: str, n: int, idle: float) -> dict[str, Any]:
    """Runs in its own interpreter: n live sandboxes of one kind."""
    import gc

    gc.collect()
    fds0 = len(os.listdir("/proc/self/fd"))
    procs, lat = [], []
    for _ in range(n):
        t = time.perf_counter()
        procs.append(_start(kind))
        lat.append(time.perf_counter() - t)
    time.sleep(1.0)  # the supervisor settles (cgroups made ahead, first samples)
    c0, t0 = _cpu(), time.monotonic()
    time.sleep(idle)
    busy = (_cpu() - c0) / (time.monotonic() - t0)
    live = {
        "rss_mib": round(_rss_kib() / 1024, 1),
        "fds": len(os.listdir("/proc/self/fd")) - fds0,
        "threads": len(os.listdir("/proc/self/task")),
    }
    t = time.perf_counter()
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()
    reap = time.perf_counter() - t
    tenth = max(1, n // 10)
    return {
        "kind": kind,
        "n": n,
        "first_ms": statistics.median(lat[:tenth]) * 1e3,
        "last_ms": statistics.median(lat[-tenth:]) * 1e3,
        "idle_cpu_pct": busy * 100,
        "reap_s": reap,
        **live,
    }


def _usable_kinds() -> list[str]:
    from sbxlimit import _cgroup

    site = _cgroup.discover()
    kinds = ["subprocess", "watchdog"]
    if site.version and site.has("memory") and site.has("pids"):
        kinds[1:1] = ["cgroup", "cgroup-pids"]
    else:
        print(f"# no cgroup kinds: {site.reason or 'memory and pids not both delegated'}")
    return kinds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts", default="100,500,1000")
    ap.add_argument("--idle", type=float, default=3.0)
    ap.add_argument("--kinds", default="")
    ap.add_argument("--one", nargs=2, metavar=("KIND", "N"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one[0], int(a.one[1]), a.idle)))
        return
    kinds = a.kinds.split(",") if a.kinds else _usable_kinds()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    from sbxlimit import _cgroup

    site = _cgroup.discover()
    print(
        f"# {os.cpu_count()} CPUs, kernel {os.uname().release}, cgroup v{site.version or '-'}, "
        f"uid {os.getuid()}, Python {sys.version.split()[0]}; idle window {a.idle} s"
    )
    cols = ("kind", "live", "spawn first 10%", "last 10%", "idle CPU", "RSS", "fds", "threads")
    hdr = "| " + " | ".join((*cols, "kill+reap all")) + " |"
    print(hdr)
    print("|---" * (hdr.count("|") - 1) + "|")
    for n in (int(x) for x in a.counts.split(",")):
        order = list(kinds)
        random.shuffle(order)  # no kind always runs on a machine the last one just loaded
        rows = {}
        for kind in order:
            out = subprocess.run(
                [sys.executable, __file__, "--one", kind, str(n), "--idle", str(a.idle)],
                capture_output=True,
                text=True,
                check=False,
            )
            if out.returncode != 0:
                print(f"# {kind} x{n} failed: {out.stderr.strip()[-400:]}")
                continue
            rows[kind] = json.loads(out.stdout.strip().splitlines()[-1])
        for kind in kinds:
            r = rows.get(kind)
            if r is None:
                continue
            print(
                f"| {kind} | {n} | {r['first_ms']:.2f} ms | {r['last_ms']:.2f} ms | "
                f"{r['idle_cpu_pct']:.1f}% | {r['rss_mib']} MiB | {r['fds']} | {r['threads']} | "
                f"{r['reap_s']:.2f} s |"
            )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
