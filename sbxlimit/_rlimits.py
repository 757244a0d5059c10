"""The rlimit mechanism: per-process limits the child sets before exec
(csrc/rlimit.c), and the planners of the fields they hold.

An unprivileged caller cannot raise a hard limit: a request above the
inherited one is clamped to it, and the caveat says so.  The verdicts
rlimits leave are signals (SIGXCPU, SIGXFSZ) and refused calls, read by
``_termination`` from the wait status.
"""

from __future__ import annotations

import math
import resource

from . import _core, _platform
from ._cgroup import why_not
from ._plan import Held, Holder, Plan, Request
from ._platform import CLONE_NEWPID

__all__ = [
    "plan_address_space",
    "plan_core_dumps",
    "plan_cpu_time",
    "plan_file_size",
    "plan_memory",
    "plan_nproc_room",
    "plan_open_files",
    "plan_pids",
]

_INF = resource.RLIM_INFINITY


def _set(p: Plan, r: Request, res: int, soft: int, hard: int) -> tuple[str, ...]:
    """Add one rlimit, clamped to the inherited hard limit when we cannot
    raise it (setrlimit would fail with EPERM in the child); returns the
    caveat, if clamped."""
    note: tuple[str, ...] = ()
    # 0/0 (core dumps off) is never clamped: no hard limit to depend on.
    if not r.privileged and (soft or hard):
        cur_hard = _inherited_hard(p, res)
        if cur_hard != _INF:
            if soft > cur_hard:
                soft = cur_hard
                note = (f"clamped to the inherited hard limit {cur_hard}",)
            hard = min(hard, cur_hard)
    p.rlimits.append((res, soft, hard))
    return note


def _inherited_hard(p: Plan, res: int) -> int:
    """The hard limit of `res` this process passes on, noted as one the
    plan depends on (see _plan.plan)."""
    hard = resource.getrlimit(res)[1]
    p.hard_seen.append((res, hard))
    return hard


def plan_core_dumps(p: Plan, r: Request) -> None:
    """Core dumps off for every sandbox: they can leak memory contents and
    fill the disk."""
    _set(p, r, resource.RLIMIT_CORE, 0, 0)
    p.hold("core_dumps", "rlimit:RLIMIT_CORE")


def plan_cpu_time(p: Plan, r: Request, whole: str, note: str = "") -> None:
    """RLIMIT_CPU as a per-process backstop (SIGXCPU at the soft limit,
    SIGKILL one second later) beside `whole`, what holds the sandbox's CPU
    as a whole ("" for nothing)."""
    assert r.limits is not None and r.limits.cpu_time is not None
    soft = math.ceil(r.limits.cpu_time)
    clamped = _set(p, r, resource.RLIMIT_CPU, soft, soft + 1)
    mech = f"{whole}+rlimit:RLIMIT_CPU" if whole else "rlimit:RLIMIT_CPU"
    caveats = clamped
    if not whole:
        caveats += ("per process: no cgroup and no tree watchdog here",)
    elif note:
        caveats += (note,)
    p.hold("cpu_time", mech, *caveats)


def plan_file_size(p: Plan, r: Request) -> None:
    if r.limits is None or r.limits.file_size is None:
        return
    n = r.limits.file_size
    p.hold("file_size", "rlimit:RLIMIT_FSIZE", *_set(p, r, resource.RLIMIT_FSIZE, n, n))


def plan_open_files(p: Plan, r: Request) -> None:
    if r.limits is None or r.limits.open_files is None:
        return
    n = r.limits.open_files
    p.hold("open_files", "rlimit:RLIMIT_NOFILE", *_set(p, r, resource.RLIMIT_NOFILE, n, n))


def plan_memory(p: Plan, r: Request) -> None:
    """RLIMIT_DATA, not RLIMIT_AS: runtimes that reserve large PROT_NONE
    ranges (V8, the JVM, Go) break under an AS cap.  With the tree
    watchdog beside it where the platform can walk the tree."""
    if r.limits is None or r.limits.memory is None or not p.takes("memory"):
        return
    p.fallbacks["memory"] = why_not(r.site, "memory")
    n = r.limits.memory
    tree = bool(_core.HAS_PROCTREE)
    clamped = _set(p, r, resource.RLIMIT_DATA, n, n)
    if tree:
        p.hold("memory", "rlimit:RLIMIT_DATA+watchdog:memory", *clamped)
        p.watch_memory = n
    else:
        p.hold(
            "memory",
            "rlimit:RLIMIT_DATA",
            *clamped,
            "per process; no tree watchdog on this platform",
        )
    p.memory_by = Holder.RLIMIT


def plan_address_space(p: Plan, r: Request) -> None:
    if r.limits is None or r.limits.address_space is None or not p.takes("address_space"):
        return
    if _platform.DARWIN:
        p.downgrade(
            "address_space",
            "macOS 12+ refuses an RLIMIT_AS below the size of the address map, which starts at "
            "hundreds of GiB on arm64: it cannot cap a program; use memory",
        )
        return
    n = r.limits.address_space
    p.hold("address_space", "rlimit:RLIMIT_AS", *_set(p, r, resource.RLIMIT_AS, n, n))


def plan_pids(p: Plan, r: Request) -> None:
    """RLIMIT_NPROC, which counts every process of the user (in a user
    namespace of the sandbox's own: the sandbox's alone), with the tree
    watchdog beside it.  It does not bind root: the watchdog alone then."""
    if r.limits is None or r.limits.pids is None or not p.takes("pids"):
        return
    pids = r.limits.pids
    p.fallbacks["pids"] = why_not(r.site, "pids")
    tree = bool(_core.HAS_PROCTREE)
    if r.uid == 0:
        # The kernel does not apply RLIMIT_NPROC to root (or CAP_SYS_RESOURCE).
        if tree:
            p.watch_pids = pids
            p.pids_by = Holder.WATCHDOG
            p.hold(
                "pids",
                "watchdog:pids",
                "RLIMIT_NPROC does not bind root; a fast fork loop can overshoot between samples",
            )
        else:
            p.downgrade("pids", "RLIMIT_NPROC does not bind root and there is no cgroup")
        return
    clamped = _set(p, r, resource.RLIMIT_NPROC, pids, pids)
    caveat = f"RLIMIT_NPROC counts every process of uid {r.uid}, not only this sandbox's"
    p.hold("pids", "rlimit:RLIMIT_NPROC" + ("+watchdog:pids" if tree else ""), *clamped, caveat)
    p.pids_by = Holder.RLIMIT
    if tree:
        p.watch_pids = pids


def plan_nproc_room(p: Plan, r: Request) -> None:
    """In a user namespace of its own the kernel counts RLIMIT_NPROC for
    the sandbox alone (PID 1 included): a margin past the limit (1/8, at
    least 4), so that the watchdog's samples see a tree past it and end the
    sandbox.  At the limit, a program that retries refused forks would spin
    until wall_time; one past it, a fork loop that reaps quickly is seen
    there only now and then.  After the namespaces are planned."""
    lim = r.limits
    if (
        lim is None
        or lim.pids is None
        or "pids" in lim.tolerate
        or p.pids_by is not Holder.RLIMIT
        or not p.user_ns
    ):
        return
    pids = lim.pids
    room = pids + max(4, pids // 8) + (1 if p.ns_flags & CLONE_NEWPID else 0)
    if not r.privileged:
        cur_hard = _inherited_hard(p, resource.RLIMIT_NPROC)
        room = room if cur_hard == _INF else min(room, cur_hard)
    p.rlimits = [
        (res, room, room) if res == resource.RLIMIT_NPROC and soft >= pids else (res, soft, hard)
        for res, soft, hard in p.rlimits
    ]
    held = p.held["pids"]
    assert isinstance(held, Held)
    p.hold(
        "pids",
        held.mechanism,
        "counted in the sandbox's own user namespace; a fork past the limit ends the sandbox; "
        f"the kernel refuses forks beyond {room} tasks",
    )
