"""Remove what a crashed supervisor left behind.

sbxlimit names everything it creates after the process that created it:
cgroups ``sbx-<pid hex>-<n>`` (and the doctor's ``sbxlimit-probe-<pid>``),
temporary workspaces ``sbxlimit-<pid hex>-<n>-*``.  An entry whose owner is
no longer running is a leftover; an entry of a live process is never
touched, and neither is anything with another name.

For a cgroup, "no longer running" is first asked of its owner's lock
(_cgowner), which every PID namespace sees alike: when it can be taken, the
owner is gone and its cgroups go, however recent.  Without an owner lock
(one that could not be made; a doctor's probe) it is asked by pid, in the
asker's PID namespace, where a live process of another one (a container
sharing the cgroup tree, an sbxlimit running inside a sandbox with a PID
namespace of its own) looks dead.  The collection each process makes by
itself at its first sandbox (which runs wherever sbxlimit runs) then takes
only entries older than ``AUTO_MIN_AGE``: a live process never leaves its
own empty cgroups that long (those made ahead and those ending go within
seconds).  ``python -m sbxlimit gc``, asked for by an operator, takes every
leftover it sees.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable

from ._cgowner import OWNER_SUFFIX, claim, let_go, owner_path
from ._cgroupfs import sandbox_parents

__all__ = ["AUTO_MIN_AGE", "collect", "collect_cgroups", "old_enough", "owner_alive"]

AUTO_MIN_AGE = 600.0  # seconds: see the module's docstring

_CGROUP = re.compile(r"^sbx-([0-9a-f]+)-[0-9]+$")
_OWNER = re.compile(r"^sbx-([0-9a-f]+)" + re.escape(OWNER_SUFFIX) + "$")
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


def old_enough(path: str, min_age: float) -> bool:
    """`path` was last modified `min_age` seconds ago or more (a cgroup
    directory's modification time is its mkdir's)."""
    if min_age <= 0:
        return True
    try:
        return time.time() - os.stat(path).st_mtime >= min_age
    except OSError:
        return False


def collect_cgroups(
    parents: Iterable[str], *, dry_run: bool = False, min_age: float = 0.0
) -> list[str]:
    """Remove empty sbx-* cgroups of dead owners under `parents`: those
    whose owner lock can be taken, and those without one whose pid is gone
    here, made `min_age` seconds ago or more."""
    removed: list[str] = []
    for parent in parents:
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        locked: set[int] = set()  # owners with a lock here
        claimed: dict[int, tuple[int, int]] = {}  # the gone ones: (fd, made at, ns)
        for name in names:
            pid = _owner(name, (_OWNER, 16))
            if pid is not None:
                locked.add(pid)
                fd = claim(parent, pid)
                if fd is not None:
                    claimed[pid] = (fd, os.fstat(fd).st_mtime_ns)
        try:
            kept: set[int] = set()  # gone owners whose cgroups stay
            for name in names:
                pid = _owner(name, (_CGROUP, 16), (_PROBE, 10))
                path = os.path.join(parent, name)
                if pid is None or not os.path.isdir(path):
                    continue
                if pid in locked and _CGROUP.match(name):
                    if pid not in claimed:
                        continue  # its owner runs, in whatever namespace
                    if not _gone(path, pid, claimed[pid][1], min_age):
                        kept.add(pid)
                        continue
                elif owner_alive(pid) or not old_enough(path, min_age):
                    continue
                if _rmdir(path, dry_run):
                    removed.append(f"cgroup {path}")
                else:
                    kept.add(pid)
            for pid in claimed.keys() - kept:
                path = owner_path(parent, pid)
                if _rmdir(path, dry_run):
                    removed.append(f"cgroup {path}")
        finally:
            for fd, _made in claimed.values():
                let_go(fd)
    return removed


def _gone(path: str, pid: int, lock_made_ns: int, min_age: float) -> bool:
    """Whether the cgroup at `path`, whose owner lock nobody holds, is a
    leftover.  The lock vouches for the cgroups made after it: an owner
    takes it before its first cgroup there, and again after a drain let it
    go (one made meanwhile is older than the new lock, and the new lock is
    free for a moment as it is made).  And only while its pid runs nowhere
    here: the owner itself, had it failed to keep its lock.  Otherwise the
    cgroup is judged by pid and age, a live pid's only once
    ``AUTO_MIN_AGE`` old."""
    try:
        vouched = os.stat(path).st_mtime_ns >= lock_made_ns
    except OSError:
        return False
    if not owner_alive(pid):
        return vouched or old_enough(path, min_age)
    return old_enough(path, max(min_age, AUTO_MIN_AGE))


def _rmdir(path: str, dry_run: bool) -> bool:
    # rmdir refuses a cgroup that still holds processes: those are left
    # alone and reported by doctor, never killed here.
    try:
        if not dry_run:
            os.rmdir(path)
        return True
    except OSError:
        return False


def collect(*, dry_run: bool = False) -> list[str]:
    """Remove leftovers of dead owners; return what was (or would be) removed."""
    parents = sandbox_parents()
    removed = collect_cgroups(parents, dry_run=dry_run)
    # Empty `sbxlimit` grouping cgroups (rmdir refuses one that is in use).
    for parent in parents:
        if os.path.basename(parent) == "sbxlimit" and os.path.isdir(parent):
            try:
                if any(os.path.isdir(os.path.join(parent, n)) for n in os.listdir(parent)):
                    continue
                if not dry_run:
                    os.rmdir(parent)
                removed.append(f"cgroup {parent}")
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
