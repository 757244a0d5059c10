"""Where the cgroup filesystems are and where this process sits in them,
read from /proc/self/mounts and /proc/self/cgroup.  Shared by doctor(),
``sbxlimit gc`` and cgroup placement."""

from __future__ import annotations

import os
import re

__all__ = ["mount_table", "mounts", "own_cgroups", "sandbox_parents", "v2_mount"]


def mount_table() -> list[tuple[str, str, str]]:
    """(mount point, filesystem type, options) of every mount this process
    sees, in the kernel's order."""
    try:
        with open("/proc/self/mounts", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 4:
            # Octal escapes for space, tab, newline and backslash.
            point = re.sub(rb"\\([0-7]{3})", _octal, parts[1])
            out.append((os.fsdecode(point), parts[2].decode(), parts[3].decode()))
    return out


def _octal(m: re.Match[bytes]) -> bytes:
    return bytes([int(m.group(1), 8)])


def mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, "cgroup" or "cgroup2", options) of every cgroup mount."""
    return [
        (point, kind, set(opts.split(",")))
        for point, kind, opts in mount_table()
        if kind in ("cgroup", "cgroup2")
    ]


def own_cgroups() -> dict[str, str]:
    """controller (or "" for v2) → this process's cgroup path."""
    own: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _id, ctrls, path = line.rstrip("\n").split(":", 2)
                for c in ctrls.split(",") if ctrls else [""]:
                    own[c] = path
    except OSError:
        pass
    return own


def v2_mount() -> str | None:
    for point, kind, _opts in mounts():
        if kind == "cgroup2":
            return point
    return None


def sandbox_parents() -> list[str]:
    """Directories where sbxlimit may create cgroups: each hierarchy's root
    and its ``sbxlimit`` group, this process's own cgroup and that cgroup's
    parent (after a move into a leaf), and SBXLIMIT_CGROUP_PARENT."""
    own = own_cgroups()
    parents: list[str] = []
    for point, kind, opts in mounts():
        parents += [point, os.path.join(point, "sbxlimit")]
        key = "" if kind == "cgroup2" else next((c for c in opts if c in own), None)
        if key is not None and key in own:
            mine = os.path.join(point, own[key].lstrip("/")).rstrip("/")
            parents += [mine, os.path.dirname(mine)] if mine != point else []
    env = os.environ.get("SBXLIMIT_CGROUP_PARENT")
    if env:
        parents.append(env)
    return list(dict.fromkeys(parents))
