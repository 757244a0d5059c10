"""The kernel's own cost of each sandbox mechanism: the floor under sbxlimit.

Builds bench/floor.c (the cheapest spawn C can make, with one mechanism's
system calls) and runs it, then prints, per mechanism, what the kernel adds
to a plain spawn and the floor that sets for a library on top of
subprocess.run: 1 + (C variant - C plain) / subprocess.run, with
subprocess.run's median measured just before and just after.  The view
variants use the pins and read-only binds sbxlimit's Python layer gives
``Policy(workdir="/")`` on this machine (its protected paths: HOME's
dotfiles, the git repositories found).

Then the benchmark's cgroup and policy rows whole (floor.c's ROW_*
variants): every system call sbxlimit's child makes for the row, and what
each sandbox has of its own (three v1 cgroups, an IPC and maybe a network
namespace, a workspace) made and removed per spawn, in the timed thread ("serial") or
by a second thread ahead of need ("pooled", as sbxlimit's supervisor).
Linux, root.

    python bench/floor.py [--rounds 300]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TRUE = shutil.which("true") or "/bin/true"


# floor.c's rows: (its name, bench/spawn.py's row, the target of issue 17).
ROWS = (
    ("cgroup", "limits with a cgroup per sandbox (v1)", 1.25),
    ("workdir", 'Policy(workdir="/")', 1.3),
    ("policy", "Policy() with its private workspace", 1.5),
    ("deny", 'Policy(workdir="/", network="deny")', 1.6),
    ("typical", "typical agent sandbox", 1.8),
)


def subprocess_median(rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        subprocess.run([TRUE])
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def view_entries(path: str) -> tuple[int, int]:
    """Write the view's pins ("P path") and read-only binds ("R path")
    for Policy(workdir="/") to `path`; returns how many of each."""
    import sbxlimit
    from sbxlimit import _core, _namespaces, _protected

    policy = sbxlimit.Policy(workdir="/")
    found = _protected.protected(os.path.expanduser("~"), ["/"])
    entries, _ro_root, _own_dev = _namespaces.view(policy, "/", None, found.paths)
    kinds = {_core.VIEW_PIN: "P", _core.VIEW_RO: "R"}
    lines = [
        f"{kinds[kind]} {os.fsdecode(p)}"
        for kind, p, data in entries
        if kind in kinds and not data and p not in (b"/proc", b"/sys")
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    pins = sum(1 for line in lines if line[0] == "P")
    return pins, len(lines) - pins


def write_filters(paths: list[str]) -> None:
    """sbxlimit's seccomp filters for Policy() and for network="deny", as
    its core builds them for a spawn (the rows load these)."""
    import sbxlimit
    from sbxlimit import _cgroup, _core, _plan

    site = _cgroup.discover()
    for path, policy in zip(
        paths, (sbxlimit.Policy(), sbxlimit.Policy(network="deny")), strict=True
    ):
        what = _plan.plan(None, policy, uid=os.getuid(), site=site).seccomp_what
        with open(path, "wb") as f:
            f.write(_core.seccomp_program(what, os.getpid(), os.getpgrp()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=300)
    a = ap.parse_args()
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        sys.exit("floor: Linux and root only (cgroup v1 directories, namespaces)")
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("floor: no C compiler")
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "floor")
        src = os.path.join(HERE, "floor.c")
        subprocess.run([cc, "-O2", "-pthread", "-o", exe, src], check=True)
        before = subprocess_median(a.rounds)
        from sbxlimit._namespaces import REAPER

        entries = os.path.join(tmp, "view")
        pins, binds = view_entries(entries)
        filters = [os.path.join(tmp, f"filter-{i}") for i in range(2)]
        write_filters(filters)
        cmd = [exe, str(a.rounds), os.fsdecode(REAPER), entries, *filters]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        after = subprocess_median(a.rounds)
    sub = (before + after) / 2
    lines = [line.split() for line in out.stdout.splitlines()]
    misses = next((int(w[2]) for w in lines if w[:2] == ["#", "pool-misses"]), 0)
    ns = {w[0]: int(w[1]) / 1e9 for w in lines if w[0] != "#"}
    plain = ns["plain"]
    print(
        f"# subprocess.run: {sub * 1e6:.0f} us (before {before * 1e6:.0f}, after {after * 1e6:.0f})"
    )
    print(f"# the view: {pins} pins, {binds} read-only binds (those not there are skipped)")
    print("| mechanism | C spawn (median) | kernel's extra | floor vs subprocess.run |")
    print("|---|---|---|---|")
    for name, t in ns.items():
        if name.startswith("row-"):
            continue
        extra = t - plain
        print(f"| {name} | {t * 1e6:.0f} us | {extra * 1e6:+.0f} us | {1 + extra / sub:.2f}x |")
    print()
    print("| benchmark row, whole | serial floor | pooled floor | target |")
    print("|---|---|---|---|")
    for row, label, target in ROWS:
        floors = [1 + (ns[f"row-{row}-{how}"] - plain) / sub for how in ("serial", "pooled")]
        print(f"| {label} | {floors[0]:.2f}x | {floors[1]:.2f}x | <= {target}x |")
    print(f"# pooled rows that found nothing ready (made their own): {misses} of {a.rounds * 5}")


if __name__ == "__main__":
    main()
