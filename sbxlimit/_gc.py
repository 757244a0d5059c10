"""Remove what a crashed supervisor left behind.

sbxlimit names everything it creates after the process that created it:
cgroups ``sbx-<pid hex>-<n>`` (and the doctor's ``sbxlimit-probe-<pid>``),
temporary workspaces ``sbxlimit-<pid hex>-<n>-*``.  An entry whose owner is
no longer running is a leftover; an entry of a live process is never
touched, and neither is anything with another name.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

__all__ = ["collect", "owner_alive"]

_CGROUP = re.compile(r"^sbx-([0-9a-f]+)-[0-9]+$")
_PROBE = re.compile(r"^sbxlimit-probe-([0-9]+)$")
_WORKSPACE = re.compile(r"^sbxlimit-([0-9a-f]+)-[0-9]+-")


def owner_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's: alive
    return True


def _owner(name: str, *patterns: tuple[re.Pattern[str], int]) -> int | None:
    for pattern, base in patterns:
        m = pattern.match(name)
        if m:
            return int(m.group(1), base)
    return None


def _cgroup_parents() -> list[str]:
    """Directories where sbxlimit creates cgroups: each hierarchy's root and
    this process's own cgroup in it."""
    parents: list[str] = []
    mounts: list[tuple[str, str, set[str]]] = []
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                p = line.split()
                if len(p) >= 4 and p[2] in ("cgroup", "cgroup2"):
                    mounts.append((p[1], p[2], set(p[3].split(","))))
        with open("/proc/self/cgroup") as f:
            own = {}
            for line in f:
                _i, ctrls, path = line.rstrip("\n").split(":", 2)
                for c in ctrls.split(",") if ctrls else [""]:
                    own[c] = path
    except OSError:
        return parents
    for point, kind, opts in mounts:
        parents.append(point)
        key = "" if kind == "cgroup2" else next((c for c in opts if c in own), None)
        if key is not None and key in own:
            parents.append(os.path.join(point, own[key].lstrip("/")))
    env = os.environ.get("SBXLIMIT_CGROUP_PARENT")
    if env:
        parents.append(env)
    return list(dict.fromkeys(parents))


def collect(*, dry_run: bool = False) -> list[str]:
    """Remove leftovers of dead owners; return what was (or would be) removed."""
    removed: list[str] = []
    for parent in _cgroup_parents():
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            pid = _owner(name, (_CGROUP, 16), (_PROBE, 10))
            path = os.path.join(parent, name)
            if pid is None or owner_alive(pid) or not os.path.isdir(path):
                continue
            # rmdir refuses a cgroup that still holds processes: those are
            # left alone and reported by doctor, never killed here.
            try:
                if not dry_run:
                    os.rmdir(path)
                removed.append(f"cgroup {path}")
            except OSError:
                pass
    tmp = tempfile.gettempdir()
    try:
        names = os.listdir(tmp)
    except OSError:
        names = []
    for name in names:
        pid = _owner(name, (_WORKSPACE, 16))
        path = os.path.join(tmp, name)
        if pid is None or owner_alive(pid) or not os.path.isdir(path) or os.path.islink(path):
            continue
        try:
            if os.stat(path).st_uid != os.geteuid():
                continue  # not ours
            if not dry_run:
                shutil.rmtree(path)
            removed.append(f"workspace {path}")
        except OSError:
            pass
    return removed
