"""The supervisor's limits: what the one supervisor thread (``_monitor``)
holds by timing and sampling, and the planners of those fields.

``wall_time`` and ``output`` are always the supervisor's.  Where no cgroup
counts for the kernel, the tree watchdog samples the process tree
(csrc/linux/proctree.c, csrc/darwin/proctree.c) every ``sample_interval``
for ``memory``, ``pids`` and ``cpu_time``, and ends the whole tree past a
limit; ``disk`` is the workspace's size, sampled.  Its evidence is the kill
record and the samples (``_evidence``).
"""

from __future__ import annotations

from . import _core, _platform, _rlimits
from ._cgroup import why_not
from ._plan import Holder, Plan, Request

__all__ = [
    "plan_cpu_time",
    "plan_disk",
    "plan_memory",
    "plan_pids",
    "plan_wall_time",
]


def plan_cpu_time(p: Plan, r: Request) -> None:
    """The tree's CPU with the children it reaped (in a PID namespace, PID 1
    reaps every orphan), beside RLIMIT_CPU; RLIMIT_CPU alone where the tree
    cannot be walked."""
    if r.limits is None or r.limits.cpu_time is None or not p.takes("cpu_time"):
        return
    whole = ""
    note = ""
    if _core.HAS_PROCTREE:
        whole = "watchdog:cpu_time"
        p.watch_cpu_time = r.limits.cpu_time
        if _platform.DARWIN:
            # XNU sends one SIGXCPU at the soft limit and never acts on the
            # hard one: only the watchdog stops a program that ignores it.
            note = "the watchdog ends the tree; RLIMIT_CPU only sends SIGXCPU on macOS"
    _rlimits.plan_cpu_time(p, r, whole, note)


def plan_memory(p: Plan, r: Request) -> None:
    """macOS: no rlimit (since macOS 12 setrlimit(RLIMIT_DATA) fails below
    the address map's size, hundreds of GiB on arm64, which a child copied
    from the caller already has).  The watchdog sums phys_footprint, what
    macOS itself charges a process."""
    if r.limits is None or r.limits.memory is None or not p.takes("memory"):
        return
    p.fallbacks["memory"] = "no cgroups on macOS"
    p.watch_memory = r.limits.memory
    p.memory_by = Holder.WATCHDOG
    p.hold(
        "memory",
        "watchdog:memory",
        "phys_footprint of every process of the tree, sampled: a fast allocator can overshoot "
        "between samples; the whole tree is ended",
    )


def plan_pids(p: Plan, r: Request) -> None:
    """The tree's process count, where RLIMIT_NPROC is per user and known to
    misbehave (macOS): not used."""
    if r.limits is None or r.limits.pids is None or not p.takes("pids"):
        return
    p.fallbacks["pids"] = why_not(r.site, "pids")
    if not _core.HAS_PROCTREE:
        p.downgrade("pids", "RLIMIT_NPROC is per user on this platform and there is no cgroup")
        return
    p.watch_pids = r.limits.pids
    p.pids_by = Holder.WATCHDOG
    p.hold(
        "pids",
        "watchdog:pids",
        "RLIMIT_NPROC is per user here; a fast fork loop can overshoot between samples; the "
        "whole tree is ended",
    )


def plan_wall_time(p: Plan, r: Request) -> None:
    if r.limits is None or r.limits.wall_time is None:
        return
    p.wall_time = r.limits.wall_time
    p.hold("wall_time", "watchdog:wall_time")


def plan_disk(p: Plan, r: Request, no_tmpfs: str = "") -> None:
    """The workspace's size, sampled: the private one, or workdir.
    `no_tmpfs`: why no size-capped tmpfs holds it instead."""
    if r.limits is None or r.limits.disk is None or not p.takes("disk"):
        return
    p.disk = r.limits.disk
    caveats = [
        "the workspace's size, sampled; a burst between samples can pass the cap before the kill"
    ]
    if no_tmpfs:
        caveats.append(f"no tmpfs: {no_tmpfs}")
    p.hold("disk", "watchdog:disk", *caveats)
    if r.policy is None or r.policy.workdir is None:
        p.workspace = True
