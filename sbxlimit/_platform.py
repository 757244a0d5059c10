"""The platform layer: what this OS is, what the caller may do here, and
which mechanism plans each limit and protection, in order of preference.

``planners()`` is the registry: each entry is a planner of one mechanism's
module (``_rlimits``, ``_cgroup``, ``_watchdog``, ``_namespaces``,
``_landlock``, ``_seccomp``, ``_caps``, ``_seatbelt``, ``_workspace``,
``_supervisor``; on Windows ``_winjob``'s); ``_plan.plan()`` runs them in this order, and a field an
earlier planner took is left alone by the later ones.  A new mechanism is a
module with its planners, listed here for the platforms it holds on.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._plan import Plan, Request

    Planner = Callable[[Plan, Request], None]

__all__ = [
    "CLONE_NEWIPC",
    "CLONE_NEWNET",
    "CLONE_NEWNS",
    "CLONE_NEWPID",
    "CLONE_NEWUSER",
    "DARWIN",
    "LINUX",
    "WINDOWS",
    "can_raise_hard_limits",
    "capability",
    "planners",
]

LINUX = sys.platform.startswith("linux")
DARWIN = sys.platform == "darwin"
WINDOWS = sys.platform == "win32"  # Job Objects (_winjob); no rlimits, no cgroups

# linux/sched.h
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
CLONE_NEWIPC = 0x08000000
CAP_SETPCAP, CAP_SYS_ADMIN, CAP_SYS_RESOURCE = 8, 21, 24


def capability(bit: int) -> bool:
    """An effective capability of ours (Linux), else: are we root."""
    if LINUX:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("CapEff:"):
                        return bool(int(line.split()[1], 16) >> bit & 1)
        except OSError:
            pass
    return os.geteuid() == 0


@functools.cache
def can_raise_hard_limits() -> bool:
    """Whether setrlimit may raise a hard limit here: CAP_SYS_RESOURCE on
    Linux (root in a container often lacks it), root elsewhere."""
    return capability(CAP_SYS_RESOURCE)


def planners() -> tuple[Planner, ...]:
    """The planners for this OS, in order (read at each plan: tests stand
    in for another OS by setting LINUX, DARWIN and WINDOWS)."""
    if WINDOWS:  # before the POSIX modules, which do not import there
        from . import _winjob

        return _winjob.PLANNERS
    from . import (
        _caps,
        _cgroup,
        _landlock,
        _namespaces,
        _rlimits,
        _seatbelt,
        _seccomp,
        _supervisor,
        _watchdog,
        _workspace,
    )

    limits: tuple[Planner, ...]
    policy: tuple[Planner, ...]
    if LINUX:
        limits = (
            _rlimits.plan_core_dumps,
            _cgroup.plan_cpu_time,  # the sandbox's CPU, from its counter ...
            _watchdog.plan_cpu_time,  # ... else the tree's; RLIMIT_CPU beside either
            _rlimits.plan_file_size,
            _rlimits.plan_open_files,
            _cgroup.plan_memory,
            _rlimits.plan_memory,  # with the tree watchdog
            _rlimits.plan_address_space,
            _cgroup.plan_pids,
            _rlimits.plan_pids,  # with the tree watchdog
            _watchdog.plan_wall_time,
            _supervisor.plan_output,
            _cgroup.plan_cpu,
            _namespaces.plan_disk,  # a size-capped tmpfs, else the disk watchdog
        )
        policy = (
            _workspace.plan_workspace,
            _landlock.plan_abi,
            _namespaces.plan_files,  # the read-only view, Landlock on top
            _namespaces.plan_network,  # a network namespace, else Landlock and seccomp
            _namespaces.plan_pid_namespace,  # isolate_pids, or by default without a cgroup
            _supervisor.plan_env,
            _workspace.plan_workdir,
            _seccomp.plan_harden,
            _caps.plan_caps,
            _landlock.plan_scopes,  # signals and abstract sockets
            _supervisor.plan_unix_sockets,
            _supervisor.plan_terminal,
        )
        return (*limits, *policy, _rlimits.plan_nproc_room)
    if DARWIN:
        limits = (
            _rlimits.plan_core_dumps,
            _watchdog.plan_cpu_time,  # RLIMIT_CPU only sends SIGXCPU here
            _rlimits.plan_file_size,
            _rlimits.plan_open_files,
            _watchdog.plan_memory,  # phys_footprint; no RLIMIT_DATA on macOS 12+
            _rlimits.plan_address_space,
            _watchdog.plan_pids,  # RLIMIT_NPROC is per user here
            _watchdog.plan_wall_time,
            _supervisor.plan_output,
            _cgroup.plan_cpu,
            _watchdog.plan_disk,
        )
        policy = (
            _workspace.plan_workspace,
            _seatbelt.plan_seatbelt,
            _supervisor.plan_no_pid_namespace,
            _supervisor.plan_env,
            _workspace.plan_workdir,
            _seccomp.plan_harden,
            _supervisor.plan_terminal,
        )
        return (*limits, *policy, _supervisor.plan_no_parent_death)
    limits = (
        _rlimits.plan_core_dumps,
        _watchdog.plan_cpu_time,
        _rlimits.plan_file_size,
        _rlimits.plan_open_files,
        _rlimits.plan_memory,
        _rlimits.plan_address_space,
        _rlimits.plan_pids,
        _watchdog.plan_wall_time,
        _supervisor.plan_output,
        _cgroup.plan_cpu,
        _watchdog.plan_disk,
    )
    policy = (
        _workspace.plan_workspace,
        _supervisor.plan_no_files,
        _supervisor.plan_no_pid_namespace,
        _supervisor.plan_env,
        _workspace.plan_workdir,
        _seccomp.plan_harden,
        _supervisor.plan_terminal,
    )
    return (*limits, *policy)
