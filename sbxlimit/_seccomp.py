"""The seccomp filter (csrc/linux/seccomp.c): whether one loads here, and
the planner of ``Policy.harden`` (no_new_privs, the filter, what it holds
in place of PR_SET_DUMPABLE).  Its socket rules are planned with the
network (``_namespaces.plan_network``); ``_core.seccomp_program`` shows the
filter itself."""

from __future__ import annotations

import functools

from . import _core, _platform
from ._plan import Plan, Request

__all__ = ["plan_harden", "seccomp_works"]

_NOT_DUMPABLE = "execve resets PR_SET_DUMPABLE, and there is no seccomp on this platform"


@functools.cache
def seccomp_works() -> bool:
    """A filter loads here (a container may forbid it): tried once, in a
    child."""
    return _core.probe(_core.PROBE_SECCOMP, 0, 2000) == 0


def plan_harden(p: Plan, r: Request) -> None:
    if r.policy is None or not r.policy.harden:
        return
    if not _platform.LINUX:
        p.downgrade("no_new_privs", "no_new_privs exists only on Linux")
        p.downgrade("not_dumpable", _NOT_DUMPABLE)
        return
    p.no_new_privs = True
    p.hold("no_new_privs", "prctl:PR_SET_NO_NEW_PRIVS")
    if _core.HAS_SECCOMP and seccomp_works():
        p.seccomp = True
        p.hold(
            "seccomp",
            f"seccomp:allow-list v{_core.SECCOMP_VERSION}",
            "socket families: unix, inet, netlink route; no new namespaces, setns, device "
            "nodes, TIOCSTI, signals to the caller or its sentinel, prlimit to others; EPERM "
            "for ptrace, process_vm_*, bpf, perf_event_open, keys, userfaultfd, io_uring, "
            "mount, modules, open_by_handle_at, reboot, clocks",
        )
        # PR_SET_DUMPABLE does not survive execve; what it would protect
        # against (another process reading this one) is refused instead.
        p.hold("not_dumpable", "seccomp:ptrace+process_vm_readv refused")
        return
    why = (
        "no seccomp filter for this architecture"
        if not _core.HAS_SECCOMP
        else "seccomp filters cannot be loaded here (see doctor)"
    )
    p.downgrade("seccomp", why)
    p.downgrade("not_dumpable", f"execve resets PR_SET_DUMPABLE, and {why}")
