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
        by_owner: dict[int, list[str]] = {}  # sandbox cgroups by owner pid
        probes: dict[int, list[str]] = {}  # the doctor's, never locked
        locked: set[int] = set()  # owners with a lock here
        for name in names:
            pid = _owner(name, (_OWNER, 16))
            if pid is not None:
                locked.add(pid)
            pid = _owner(name, (_CGROUP, 16))
            if pid is not None:
                by_owner.setdefault(pid, []).append(name)
            pid = _owner(name, (_PROBE, 10))
            if pid is not None:
                probes.setdefault(pid, []).append(name)
        for pid in locked:
            # One lock at a time, held only while its cgroups go: a new
            # process with that pid waits for it.
            fd = claim(parent, pid)
            if fd is None:
                continue  # its owner runs, in whatever namespace
            try:
                # Nobody holds it.  Its pid alive here: a process with its
                # pid (here or elsewhere), or the owner itself had it failed
                # to keep the lock: only what is old goes.
                age = max(min_age, AUTO_MIN_AGE) if owner_alive(pid) else 0.0
                left = False
                for name in by_owner.pop(pid, []):
                    path = os.path.join(parent, name)
                    if old_enough(path, age) and _rmdir(path, dry_run):
                        removed.append(f"cgroup {path}")
                    elif os.path.isdir(path):
                        left = True
                path = owner_path(parent, pid)
                if not left and _rmdir(path, dry_run):
                    removed.append(f"cgroup {path}")
            finally:
                let_go(fd)
        unlocked = [(p, n) for p, n in by_owner.items() if p not in locked]
        for pid, owned in unlocked + list(probes.items()):
            if owner_alive(pid):
                continue
            for name in owned:
                path = os.path.join(parent, name)
                if os.path.isdir(path) and old_enough(path, min_age) and _rmdir(path, dry_run):
                    removed.append(f"cgroup {path}")
    return removed


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
