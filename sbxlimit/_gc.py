"""Remove what a crashed supervisor left behind.

sbxlimit names everything it creates after the process that created it:
cgroups ``sbx-<pid hex>-<n>`` (and the doctor's ``sbxlimit-probe-<pid>``),
temporary workspaces ``sbxlimit-<pid hex>-<n>-*``.  An entry whose owner is
no longer running is a leftover; an entry of a live process is never
touched, and neither is anything with another name.

"No longer running" is first asked of the owner's lock (_owner), which
every PID namespace sees alike: a cgroup parent's, or the temp
directory's for a workspace.  When it can be taken, the owner is gone and
its entries go, however recent.  Without an owner lock (one that could not
be made; a doctor's probe; an older sbxlimit's) it is asked by pid, in the
asker's PID namespace, where a live process of another one (a container
sharing the cgroup tree or the temp directory, an sbxlimit running inside
a sandbox with a PID namespace of its own) looks dead.

Each process collects by itself: at its first sandbox the cgroups (those
without a lock only once older than ``AUTO_MIN_AGE``: a live process
never leaves its own empty cgroups that long, those made ahead and those
ending go within seconds), and at its first workspace, on the janitor
thread, the workspaces whose lock says their owner is gone (never by pid:
a workspace is a live program's files).  ``python -m sbxlimit gc``, asked
for by an operator, takes every leftover it sees.  It also looks through
every mounted hierarchy for the owner locks of processes that ran in other
cgroups (v1: each process makes its sandbox cgroups under its own cgroup),
and there takes only what a free lock says is a dead owner's: a tree it
does not know may hold a live sbxlimit of another PID namespace that has
no lock.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
import time
from collections.abc import Iterable

from . import _workspace
from ._cgroupfs import mounts, sandbox_parents
from ._owner import OWNER_SUFFIX, WORKSPACE_PREFIX, claim, let_go, owner_path

__all__ = [
    "AUTO_MIN_AGE",
    "collect",
    "collect_cgroups",
    "collect_workspaces",
    "old_enough",
    "owner_alive",
    "owner_lock_parents",
]

AUTO_MIN_AGE = 600.0  # seconds: see the module's docstring
_WALK_MAX = 100_000  # directories looked at by owner_lock_parents: a bound for a huge tree

_CGROUP = re.compile(r"^sbx-([0-9a-f]+)-[0-9]+$")
_OWNER = re.compile(r"^sbx-([0-9a-f]+)" + re.escape(OWNER_SUFFIX) + "$")
_PROBE = re.compile(r"^sbxlimit-probe-([0-9]+)$")
_WORKSPACE = re.compile(r"^sbxlimit-([0-9a-f]+)-[0-9]+-")
_WS_OWNER = re.compile(r"^sbxlimit-([0-9a-f]+)" + re.escape(OWNER_SUFFIX) + "$")


def owner_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's: alive
    return True


def _owner_pid(name: str, *patterns: tuple[re.Pattern[str], int]) -> int | None:
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


def owner_lock_parents(skip: Iterable[str]) -> list[str]:
    """The directories of every mounted cgroup hierarchy, `skip` aside, that
    hold an owner lock: where processes in other cgroups made theirs."""
    skipped = {os.path.normpath(p) for p in skip}
    found: list[str] = []
    seen: set[tuple[int, int]] = set()  # a hierarchy mounted twice is walked once
    todo: list[str] = []
    for point, _kind, _opts in mounts():
        try:
            st = os.stat(point)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            todo.append(point)
    walked = 0
    while todo and walked < _WALK_MAX:
        d = todo.pop()
        walked += 1
        locks = False
        try:
            with os.scandir(d) as entries:
                for e in entries:
                    if _OWNER.match(e.name):
                        locks = True
                    elif not _CGROUP.match(e.name) and e.is_dir(follow_symlinks=False):
                        todo.append(e.path)  # (a sandbox's own cgroup holds no lock)
        except OSError:
            continue
        if locks and os.path.normpath(d) not in skipped:
            found.append(d)
    return found


def collect_cgroups(
    parents: Iterable[str],
    *,
    dry_run: bool = False,
    min_age: float = 0.0,
    locked_only: bool = False,
) -> list[str]:
    """Remove empty sbx-* cgroups of dead owners under `parents`: those
    whose owner lock can be taken, and (unless `locked_only`) those
    without one whose pid is gone here, made `min_age` seconds ago or
    more."""
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
            pid = _owner_pid(name, (_OWNER, 16))
            if pid is not None:
                locked.add(pid)
            pid = _owner_pid(name, (_CGROUP, 16))
            if pid is not None:
                by_owner.setdefault(pid, []).append(name)
            pid = _owner_pid(name, (_PROBE, 10))
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
        if locked_only:
            continue
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
    # Where processes in other cgroups made theirs (v1: under each one's
    # own cgroup): only what a free owner lock says is a dead owner's.
    elsewhere = owner_lock_parents(skip=parents)
    removed += collect_cgroups(elsewhere, dry_run=dry_run, locked_only=True)
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
    removed += collect_workspaces(tempfile.gettempdir(), dry_run=dry_run)
    return removed


def collect_workspaces(tmp: str, *, dry_run: bool = False, locked_only: bool = False) -> list[str]:
    """Remove the workspaces of our user's that dead owners left in `tmp`:
    those whose owner lock can be taken (and is our user's: another user
    could plant one), and (unless `locked_only`) those without one whose
    pid is gone here."""
    try:
        names = os.listdir(tmp)
    except OSError:
        return []
    by_owner: dict[int, list[str]] = {}
    locked: set[int] = set()
    for name in names:
        pid = _owner_pid(name, (_WS_OWNER, 16))
        if pid is not None:
            locked.add(pid)
        pid = _owner_pid(name, (_WORKSPACE, 16))
        if pid is not None:
            by_owner.setdefault(pid, []).append(name)
    removed: list[str] = []
    locks: list[str] = []  # dead owners' locks removed
    taken: list[tuple[str, str]] = []  # (path, renamed as ours): removed once let go
    judged: set[int] = set()  # by their lock
    for pid in locked:
        lock = owner_path(tmp, pid, WORKSPACE_PREFIX)
        if not _ours(lock):
            continue  # planted by another user (or a link): judged by pid, if at all
        judged.add(pid)
        if owner_alive(pid):
            # A process with its pid here (its own, or another's since):
            # its workspaces could be a live program's files.
            continue
        names = [n for n in by_owner.get(pid, []) if _ours(os.path.join(tmp, n))]
        # A workspace a program still works in (a sandbox that outlived its
        # caller) is its own: left until it is done there.
        busy = _workspace.in_use(os.path.join(tmp, n) for n in names)
        names = [n for n in names if os.path.join(tmp, n) not in busy]
        if dry_run:
            if _nobody_holds(tmp, pid):
                removed += [f"workspace {os.path.join(tmp, n)}" for n in names]
                locks.append(f"workspace lock {lock}")
            continue
        got = _take_workspaces(tmp, pid, names)
        if got is None:
            continue  # its owner (or a new process with its pid) holds it
        moved, whole = got
        taken += moved
        if whole and _rmdir_claimed(tmp, pid, lock):
            locks.append(f"workspace lock {lock}")
    # Said removed only once gone (a tree the program made unremovable
    # stays ours, tried again at our exit and then by the next collector).
    removed += [f"workspace {path}" for path, trash in taken if _workspace.remove(trash)]
    removed += locks
    if locked_only:
        return removed
    for pid, owned in by_owner.items():
        if pid in judged or owner_alive(pid):
            continue
        busy = _workspace.in_use(os.path.join(tmp, n) for n in owned)
        for name in owned:
            path = os.path.join(tmp, name)
            if path in busy:
                continue
            if _ours(path) and (dry_run or _workspace.remove(path)):
                removed.append(f"workspace {path}")
    return removed


# Renames under one claim of an owner's lock: then it is let go for a
# moment, so that a new process with that pid is not kept waiting (it
# waits 0.1 s, then goes on without a lock).
_BATCH = 64
_BREATHE = 0.005  # seconds between two claims


def _take_workspaces(
    tmp: str, pid: int, names: list[str]
) -> tuple[list[tuple[str, str]], bool] | None:
    """Rename `names` (a dead owner's workspaces) as ours, under its lock,
    in batches: (each (path, its new name), all were looked at), or None
    if its lock was held from the start.  Stops where the lock is held
    meanwhile (a new process with that pid: the rest is under its lock)."""
    moved: list[tuple[str, str]] = []
    done = 0
    while True:
        fd = claim(tmp, pid, WORKSPACE_PREFIX)
        if fd is None:
            return None if done == 0 else (moved, False)
        try:
            for name in names[done : done + _BATCH]:
                path = os.path.join(tmp, name)
                trash = _workspace.adopt(path)
                if trash is not None:
                    moved.append((path, trash))
                done += 1
        finally:
            let_go(fd)
        if done >= len(names):
            return moved, True
        time.sleep(_BREATHE)


def _rmdir_claimed(tmp: str, pid: int, lock: str) -> bool:
    """Remove a dead owner's lock if nothing of its is left in `tmp`."""
    fd = claim(tmp, pid, WORKSPACE_PREFIX)
    if fd is None:
        return False
    try:
        prefix = f"{WORKSPACE_PREFIX}{pid:x}-"
        if any(n.startswith(prefix) for n in os.listdir(tmp)):
            return False
        return _rmdir(lock, False)
    except OSError:
        return False
    finally:
        let_go(fd)


def _nobody_holds(tmp: str, pid: int) -> bool:
    """Nobody holds `pid`'s lock in `tmp` (a dry run's question)."""
    fd = claim(tmp, pid, WORKSPACE_PREFIX)
    if fd is not None:
        let_go(fd)
    return fd is not None


def _ours(path: str) -> bool:
    """A directory of our user's (never a link)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
