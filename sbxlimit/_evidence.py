"""What a sandbox left behind, and what it used: the one evidence record
(``Evidence``, collected at reap) and the one usage builder (``usage``,
live and final).

Everything a verdict rests on is copied here when the leader is reaped:
the wait status and rusage, the supervisor's kill record and samples, the
cgroup's final counters, the workspace's size.  ``_termination`` decides
from this record alone; neither it nor ``usage`` reaches into the monitor or
the cgroup.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import TYPE_CHECKING, Any

from . import _platform

if sys.platform != "win32":  # rusage: POSIX (Windows's usage is its job's, _winjob)
    import resource

if TYPE_CHECKING:
    from ._cgroup import CgroupStats

__all__ = ["Evidence", "KillRecord", "Samples", "Usage", "usage"]


@dataclasses.dataclass(frozen=True, slots=True)
class Usage:
    """What a sandbox used.  Live while it runs (``Popen.usage()``), final after.

    ``None`` means "not measured here" (e.g. disk before workspaces exist).
    With a cgroup, every figure is the cgroup's: all processes the sandbox
    ever ran, CPU throttling (``throttled_periods``, ``throttled_seconds``:
    time the ``cpu`` limit held it back) included.  Without one, CPU and the
    memory peak after exit come from ``wait4`` rusage (the program and the
    descendants it waited for) and the supervisor's samples.
    """

    cpu_user: float | None = None
    cpu_system: float | None = None
    memory_now: int | None = None
    memory_peak: int | None = None
    pids_now: int | None = None
    pids_peak: int | None = None
    disk: int | None = None
    wall: float = 0.0
    throttled_periods: int | None = None
    throttled_seconds: float | None = None

    @property
    def cpu_total(self) -> float | None:
        """User + system CPU seconds."""
        if self.cpu_user is None or self.cpu_system is None:
            return None
        return self.cpu_user + self.cpu_system

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["cpu_total"] = self.cpu_total
        return d


@dataclasses.dataclass(frozen=True, slots=True)
class KillRecord:
    """The supervisor's note of why it ended a sandbox (first kill wins)."""

    reason: str
    limit: float | int | None
    observed: float | int | None
    mechanism: str
    detail: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Samples:
    """What the supervisor saw of a tree without a cgroup's counters: the
    peaks of its samples, and the CPU of the last one (it counts processes
    a kill left unreaped, which rusage cannot)."""

    memory_peak: int = 0
    tasks_peak: int = 0
    cpu: tuple[float, float] = (0.0, 0.0)


@dataclasses.dataclass(frozen=True, slots=True)
class Evidence:
    """The final facts of a reaped sandbox, kept small (no output, no argv)."""

    program: str
    returncode: int
    created: bool  # a child was made (a failed spawn leaves only the figures)
    wall: float
    rusage: Any = None  # wait4's, None when the status was lost (SIGCHLD ignored)
    kill: KillRecord | None = None
    hits: frozenset[str] = frozenset()  # limits the supervisor saw hit
    samples: Samples | None = None  # None: nothing was sampled
    killed_by_caller: bool = False
    cgroup: CgroupStats | None = None  # its final counters
    disk: int | None = None  # the workspace's size at the end
    disk_full: bool = False  # the size-capped tmpfs was past the limit (or full) at the end


# ru_maxrss is KiB on Linux, bytes on macOS.
_MAXRSS_UNIT = 1 if _platform.DARWIN else 1024


def usage(
    *,
    wall: float,
    disk: int | None,
    final: bool,
    cgroup: CgroupStats | None = None,
    samples: Samples | None = None,
    tree: tuple[int | None, int | None, float | None, float | None] | None = None,
    rusage: Any = None,
    created: bool = True,
) -> Usage:
    """The one builder of Usage, live and final.

    `cgroup`: its counters (now, or final); `samples`: the supervisor's (None
    when nothing was sampled); `tree`: while it runs without a cgroup, the
    tree sampled now (memory, tasks, user CPU, system CPU); `rusage`: once
    reaped, the leader's wait4 figures.  A cgroup's figures win wherever it
    has them: it saw every process, waited for or not."""
    cg = cgroup
    if not final and cg is not None:
        return Usage(
            cpu_user=cg.cpu_user,
            cpu_system=cg.cpu_system,
            memory_now=cg.memory_now,
            memory_peak=cg.memory_peak,
            pids_now=cg.pids_now,
            pids_peak=cg.pids_peak,
            wall=wall,
            disk=disk,
            throttled_periods=cg.throttled_periods,
            throttled_seconds=cg.throttled_seconds,
        )
    if not final:
        memory, tasks, user, system = tree if tree is not None else (None, None, None, None)
        return Usage(
            cpu_user=user,
            cpu_system=system,
            memory_now=memory,
            memory_peak=max(samples.memory_peak, memory or 0) if samples is not None else memory,
            pids_now=tasks,
            pids_peak=max(samples.tasks_peak, tasks or 0) if samples is not None else tasks,
            wall=wall,
            disk=disk,
        )
    peak = None
    # A spawned child starts with its parent's RSS high-water mark (it
    # shares or copies the parent's memory until execve), so ru_maxrss says
    # something about the child only when it is above ours.  Ours only
    # grows: reading it now errs on the safe side.
    if rusage is not None and rusage.ru_maxrss > resource.getrusage(resource.RUSAGE_SELF).ru_maxrss:
        peak = rusage.ru_maxrss * _MAXRSS_UNIT
    if samples is not None and samples.memory_peak:
        peak = max(peak or 0, samples.memory_peak)
    tasks_peak = (samples.tasks_peak or None) if samples is not None else None
    if cg is not None:
        return Usage(
            cpu_user=cg.cpu_user if cg.cpu_user is not None else rusage and rusage.ru_utime,
            cpu_system=cg.cpu_system if cg.cpu_system is not None else rusage and rusage.ru_stime,
            memory_now=0,
            memory_peak=cg.memory_peak if cg.memory_peak is not None else peak,
            pids_now=0,
            pids_peak=cg.pids_peak or tasks_peak,
            wall=wall,
            disk=disk,
            throttled_periods=cg.throttled_periods,
            throttled_seconds=cg.throttled_seconds,
        )
    user, system = (rusage.ru_utime, rusage.ru_stime) if rusage is not None else (None, None)
    if samples is not None and sum(samples.cpu) > (user or 0) + (system or 0):
        user, system = samples.cpu  # a kill left processes nobody waited for
    return Usage(
        cpu_user=user,
        cpu_system=system,
        memory_now=0 if created else None,
        memory_peak=peak,
        pids_now=0 if created else None,
        pids_peak=tasks_peak,
        wall=wall,
        disk=disk,
    )
