"""Capabilities (csrc/linux/caps.c): the planner of what a sandbox keeps.

Every capability but those the caller grants leaves the program: the
bounding set (with CAP_SETPCAP, or in a user namespace of its own),
ambient, inheritable, permitted and effective, and securebits so that uid 0
gets none back at execve."""

from __future__ import annotations

from . import _core, _platform
from ._plan import Plan, Request
from ._policy import CAPABILITIES

__all__ = ["plan_caps"]


def plan_caps(p: Plan, r: Request) -> None:
    policy = r.policy
    if policy is None:
        return
    keep = 0
    for name in policy.capabilities:
        keep |= 1 << CAPABILITIES.index(name)
    bounding = _platform.capability(_platform.CAP_SETPCAP) or p.user_ns
    p.drop_caps = _core.CAPS_DROP | (_core.CAPS_BOUNDING if bounding else 0)
    p.caps_keep = keep
    kept = f" but {', '.join(policy.capabilities)}" if keep else ""
    if bounding:
        p.hold(
            "capabilities",
            f"prctl:dropped{kept}",
            "bounding set, ambient, securebits: root gets none back at execve",
        )
    elif p.no_new_privs or r.uid != 0:
        p.hold(
            "capabilities",
            f"prctl:dropped{kept}",
            "no CAP_SETPCAP to empty the bounding set; no_new_privs keeps execve from granting any",
        )
    else:
        p.downgrade(
            "capabilities",
            "root regains the bounding set at execve: no CAP_SETPCAP to empty it, and "
            "harden=False leaves no_new_privs off",
        )
