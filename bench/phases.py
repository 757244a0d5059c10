"""Where a spawn's wall time goes, phase by phase, against subprocess.run.

bench/spawn.py says how much slower a sandbox is; bench/budget.py where
its CPU goes.  This says when, on the caller's clock: each run() is cut
at the child's creation (the core call, or _posixsubprocess.fork_exec for
subprocess) and at the wait for its exit:

  before     run() called -> the child's creation begins (argument
             checks, the plan, a cgroup taken from the pool: Python)
  create     the core call: clone, the child's set-up, its exec (the
             caller waits for the exec; C and the kernel)
  register   the child exists -> the caller waits for its exit (the
             watch given to the supervisor: Python)
  wait       the program runs and exits (the kernel, the program)
  after      the exit seen -> run() returns (the reap, the leftovers'
             check, the cgroup handed back, the result: Python)

The variants run interleaved, in a fresh order each round, as in
bench/spawn.py; --gap seconds of sleep after each spawn shows the same
phases on a machine that went idle in between (as tool calls arrive).
The clocks are wrapped around the two calls, a few hundred ns each.

    python bench/phases.py [--rounds 400] [--gap 0] [--with-teardown]

--with-teardown adds a PID namespace sandbox to the rounds (timed apart):
its teardown, like a cgroup's, is kernel work that the next spawns meet.

Linux only.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spawn  # this directory's benchmark: the same variants

import sbxlimit
from sbxlimit import _core, _sandbox

PHASES = ("before", "create", "register", "wait", "after")
_now = time.perf_counter
_marks: dict[str, float] = {}


def _timed(f: Callable[..., object], start: str, end: str) -> Callable[..., object]:
    def timed(*args: object) -> object:
        _marks[start] = _now()
        try:
            return f(*args)
        finally:
            _marks[end] = _now()

    return timed


def _install_clocks() -> None:
    """Clocks around the child's creation and the wait for its exit, for
    subprocess and for sbxlimit (which waits with waitid, then reaps)."""
    _core.spawn = _timed(_core.spawn, "c0", "c1")  # type: ignore[assignment]
    subprocess._fork_exec = _timed(subprocess._fork_exec, "c0", "c1")  # type: ignore[attr-defined]
    wait_pid = os.waitpid
    os.waitpid = _timed(wait_pid, "w0", "w1")  # type: ignore[assignment]
    waitid = _timed(os.waitid, "w0", "w1")
    wait4 = _timed(os.wait4, "w0", "w1")
    reap = _sandbox.Sandbox.reap

    def sbx_reap(self: _sandbox.Sandbox, flags: int) -> tuple[int, int]:
        # A sandbox waits for the exit (waitid), then reaps; else it reaps.
        # (Popen's wait and run()'s direct path both reap through here.)
        if self.reaps_carefully:
            return reap(self, flags, waitid)
        return reap(self, flags, os.waitid, wait4)

    _sandbox.Sandbox.reap = sbx_reap  # type: ignore[method-assign,assignment]


def _cut(t0: float, t1: float) -> tuple[float, ...]:
    m = _marks
    return (m["c0"] - t0, m["c1"] - m["c0"], m["w0"] - m["c1"], m["w1"] - m["w0"], t1 - m["w1"])


def measure(
    rounds: int, variants: dict[str, Callable[[], object]], gap: float, apart: set[str]
) -> dict[str, list[tuple[float, ...]]]:
    out: dict[str, list[tuple[float, ...]]] = {name: [] for name in variants}
    order = list(variants)
    for name in order:  # warm up: caches, pools, the supervisor
        for _ in range(20):
            variants[name]()
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            _marks.clear()
            t0 = _now()
            variants[name]()
            t1 = _now()
            if name not in apart and {"c0", "w1"} <= _marks.keys():
                out[name].append(_cut(t0, t1))
            if gap:
                time.sleep(gap)
    return out


def report(title: str, got: dict[str, list[tuple[float, ...]]]) -> None:
    print(f"\n{title}")
    print(f"{'variant':34}" + "".join(f"{p:>10}" for p in PHASES) + f"{'total':>10}")
    for name, rows in got.items():
        if not rows:
            continue
        med = [statistics.median(r[i] for r in rows) * 1e6 for i in range(len(PHASES))]
        total = statistics.median(sum(r) for r in rows) * 1e6
        print(f"{name:34}" + "".join(f"{m:9.0f}u" for m in med) + f"{total:9.0f}u")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=400)
    ap.add_argument("--gap", type=float, default=0.0, help="seconds of sleep after each spawn")
    ap.add_argument("--with-teardown", action="store_true", help="add a PID namespace sandbox")
    a = ap.parse_args()
    if not sys.platform.startswith("linux"):
        sys.exit("bench/phases.py: Linux only")
    all_variants = spawn.sbx_variants()
    variants = {
        name: f
        for name, f in all_variants.items()
        if name != "sbxlimit.run+4 limits" or a.with_teardown
    }
    _install_clocks()
    apart = {"sbxlimit.run+4 limits"}  # with its reaper: not one core call and one wait
    got = measure(a.rounds, variants, a.gap, apart)
    what = "back to back" if not a.gap else f"{a.gap * 1e3:g} ms apart"
    extra = ", with a PID namespace sandbox in each round" if a.with_teardown else ""
    report(f"median per phase, {what}{extra} (sbxlimit {sbxlimit.__version__})", got)


if __name__ == "__main__":
    main()
