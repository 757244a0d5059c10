"""Where a sandbox's CPU goes: every thread and process that works for it.

A spawn's wall time is what the caller waits; its CPU is spread over the
caller's thread, sbxlimit's supervisor (pools made ahead, cgroups retired,
workspaces removed), the core's short-lived helper threads (namespaces made
ahead), the sandboxed program with its set-up before exec, and the
kernel's own threads (a network namespace's or a cgroup's teardown, RCU).
Back to back on a small machine, all of it competes for the same cores.

Each variant runs alone, back to back (or --gap seconds apart), for
--seconds; per spawn it reports the wall time and the CPU time of:

  caller       the spawning thread (time.thread_time)
  supervisor   sbxlimit's supervisor thread (its /proc schedstat)
  helpers      every other thread of this process, gone ones included
               (getrusage(RUSAGE_SELF) less the two above)
  programs     the children: the program and its set-up before exec
               (getrusage(RUSAGE_CHILDREN))
  machine      the rest of the machine's busy time (/proc/stat, in ticks
               of 10 ms: a few us per spawn over a few seconds): mostly
               kernel threads working for the sandboxes; any other
               process's work counts here too

    python bench/budget.py [--seconds 4] [--gap 0] [--only typical,...]

Linux only.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import threading
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spawn  # this directory's benchmark: the same variants

import sbxlimit

TICK = os.sysconf("SC_CLK_TCK")


def variants() -> dict[str, Callable[[], object]]:
    ns = spawn.ns_variants()
    sbx = spawn.sbx_variants()
    v: dict[str, Callable[[], object]] = {"subprocess.run": sbx["subprocess.run"]}
    v["4 rlimits, no PID ns"] = sbx["+4 limits, no PID ns"]
    v.update({k: f for k, f in sbx.items() if k.endswith("per sandbox")})
    for k in ("policy (landlock+seccomp)", "policy, private workspace", "+network=deny (netns)"):
        if k in ns:
            v[k] = ns[k]
    v[spawn.TYPICAL] = ns[spawn.TYPICAL]
    return v


def _busy_seconds() -> float:
    """All CPUs' busy time so far (user, nice, system, irq, softirq)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / TICK


def _thread_seconds(name: str) -> float:
    for t in threading.enumerate():
        if t.name == name and t.native_id is not None:
            try:
                with open(f"/proc/self/task/{t.native_id}/schedstat") as f:
                    return int(f.read().split()[0]) / 1e9
            except OSError:
                return 0.0
    return 0.0


def _rusage(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _snapshot() -> tuple[float, ...]:
    return (
        time.perf_counter(),
        time.thread_time(),
        _thread_seconds("sbxlimit-monitor"),
        _rusage(resource.RUSAGE_SELF),
        _rusage(resource.RUSAGE_CHILDREN),
        _busy_seconds(),
    )


def measure(f: Callable[[], object], seconds: float, gap: float) -> dict[str, float]:
    for _ in range(50):
        f()
    time.sleep(0.5)  # what the warm-up left behind settles first
    n = 0
    a = _snapshot()
    end = a[0] + seconds
    while time.perf_counter() < end:
        if gap:
            time.sleep(gap)
        f()
        n += 1
    time.sleep(0.5)  # the kernel's deferred work for the last ones
    b = _snapshot()
    d = [(y - x) / n * 1e6 for x, y in zip(a, b, strict=True)]
    wall, caller, supervisor, own, programs, busy = d
    wall -= 0.5e6 / n
    helpers = own - caller - supervisor
    machine = busy - own - programs
    return {
        "wall": wall - gap * 1e6,
        "caller": caller,
        "supervisor": supervisor,
        "helpers": helpers,
        "programs": programs,
        "machine": machine,
        "total": busy,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--gap", type=float, default=0.0, help="seconds between spawns")
    ap.add_argument("--only", default="", help="variants whose name contains one of these")
    a = ap.parse_args()
    if not sys.platform.startswith("linux"):
        sys.exit("budget: Linux only (/proc)")
    vs = variants()
    if a.only:
        keys = a.only.split(",")
        vs = {k: f for k, f in vs.items() if any(s in k for s in keys)}
    print(f"# sbxlimit {sbxlimit.__version__}, {os.cpu_count()} CPUs, gap {a.gap * 1e3:.0f} ms")
    print("# us per spawn; busy: the machine's CPUs busy, in cores")
    cols = ("wall", "caller", "supervisor", "helpers", "programs", "machine", "total")
    print("| variant | " + " | ".join(cols) + " | busy |")
    print("|---|" + "---|" * (len(cols) + 1))
    for name, f in vs.items():
        r = measure(f, a.seconds, a.gap)
        cells = " | ".join(f"{r[c]:.0f}" for c in cols)
        busy = r["total"] / (r["wall"] + a.gap * 1e6)
        print(f"| {name} | {cells} | {busy:.2f} |", flush=True)


if __name__ == "__main__":
    main()
