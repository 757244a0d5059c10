"""The read-only view made once per distinct view, joined and copied by
each child (root).

A policy's view is a few dozen mounts: the pins, the read-only binds of
the protected paths, /proc and /sys read-only, a /dev of its own.  Made in
each child, they cost it some 100 us (docs/performance.md, the tenth
round's floor).  So the core makes the view once, in a mount namespace of
its own (``_core.view_ns``: a thread of the core makes it, keeps an fd, and
ends), and each child joins that namespace and copies it (``unshare``)
before it adds what is its own: its workspace, its devpts and /dev/shm,
and any entry that was not there when the namespace was made.  No sandbox
ever runs in the namespace kept here, nor is given its fd: each runs in a
copy, which it cannot change (no mount system call, no capability).

A bind holds the file it was made on, not its path: a protected file
replaced by a rename, or a directory on the way moved, would stay in the
copy as it was.  So every path the namespace binds, and every directory
above it, is watched (inotify: removed, moved, its links or attributes
changed), and the spawning thread's mount table too (a ``poll`` on
/proc/thread-self/mountinfo), and the caller's "/" and
mount namespace (a ``chroot`` or an ``unshare`` since: a joined namespace
starts at its own root, and would show what the caller no longer sees);
at any change, every kept namespace is dropped and the next spawn makes
its own anew (``_core.views_stale``: one call at each spawn).  Where a path
cannot be watched (a network filesystem, the watch limit), or the caller
is chrooted (a joined namespace starts at its own root), the child makes
its view itself, as it does unprivileged (an unprivileged sandbox's mounts
belong to its own user namespace).

A kept namespace holds a copy of every mount of the host: a filesystem
the host unmounts stays busy while it is kept.  So they go once unused
for ``IDLE`` seconds (the supervisor thread's ``expire``), or when the
mount table changes (at the next spawn); ``drop()`` closes them all
(``Monitor.drain``); a forked child closes its copies.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections.abc import Callable, Sequence

from . import _core

__all__ = ["IDLE", "drop", "expire", "next_expiry", "release", "take"]

Entry = tuple[int, bytes, bytes]
_Key = tuple[tuple[Entry, ...], bool]

_KEEP = 4  # distinct views kept
IDLE = 10.0  # seconds without a spawn before they go


class _Kept:
    __slots__ = ("fd", "missing", "stale", "users")

    def __init__(self, fd: int, missing: frozenset[int]) -> None:
        self.fd = fd
        self.missing = missing
        self.users = 0  # spawns between take() and release()
        self.stale = False  # dropped while in use: the last release() closes it


_lock = threading.Lock()
_kept: dict[_Key, _Kept] = {}
_by_fd: dict[int, _Kept] = {}
_watch_fd = -1  # one inotify fd for every kept namespace's paths
_mounts_fd = -1  # /proc/self/mountinfo, polled for a change of the mount table
_broken = False  # the kernel refused, or the caller is chrooted: no more here
_used = 0.0  # monotonic time of the last take
# What the caller's "/" and mount namespace were when they were made
# (_core.view_ns): a chroot or an unshare since, and they are not its own.
_root = _mount_ns = (0, 0, 0)


def take(
    entries: Sequence[Entry], ro_root: bool, dev_fd: int, watched: Callable[[], Sequence[bool]]
) -> tuple[int, frozenset[int]] | None:
    """The fd of a namespace holding `entries` (with "/" read-only if
    `ro_root`, `dev_fd` cloned onto /dev if >= 0), and the indexes of the
    entries that were not there when it was made (the child makes those);
    or None.  `watched()[i]`, asked only when one is made: entries[i] is a
    path whose file the namespace binds (not a mount of the kernel's own
    filesystems, which the mount table's poll covers).  Unless None, the
    caller calls ``release(fd)`` once its child is set up."""
    global _used
    key: _Key = (tuple(entries), ro_root)
    with _lock:
        if _broken:
            return None
        _used = time.monotonic()
        _drop_if_changed()
        kept = _kept.get(key)
        if kept is None:
            kept = _make(key, dev_fd, watched)
            if kept is None:
                return None
        kept.users += 1
        return kept.fd, kept.missing


def release(fd: int) -> None:
    with _lock:
        kept = _by_fd.get(fd)
        if kept is None:
            return
        kept.users -= 1
        if kept.stale and kept.users == 0:
            _close(kept)


def next_expiry() -> float | None:
    """When the kept namespaces go unless a spawn takes one (monotonic)."""
    with _lock:
        return _used + IDLE if _kept else None


def expire(now: float) -> None:
    """Supervisor thread: drop them if unused for IDLE."""
    with _lock:
        if _kept and now - _used >= IDLE:
            _drop_everything()


def drop() -> None:
    """Close every kept namespace (once no spawn uses it) and the watches."""
    with _lock:
        _drop_everything()


# -- lock held ---------------------------------------------------------------


def _drop_everything() -> None:
    global _mounts_fd
    _drop_all()
    _close_watches()
    fd, _mounts_fd = _mounts_fd, -1
    if fd >= 0:
        os.close(fd)


def _make(key: _Key, dev_fd: int, which: Callable[[], Sequence[bool]]) -> _Kept | None:
    global _broken, _watch_fd, _mounts_fd, _root, _mount_ns
    entries, ro_root = key
    watched = which()
    try:
        # This thread's mount table (/proc/self's is the main thread's), and
        # from now on: views_stale, right before, saw no change until now.
        fd = os.open("/proc/thread-self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
        if _mounts_fd >= 0:
            os.close(_mounts_fd)
        _mounts_fd = fd
        if _watch_fd < 0:
            _watch_fd = _core.watch_open()
    except OSError:
        _broken = True
        return None
    # Watched before the namespace is made: a change from here on is seen.
    # Each path, and every directory above it: a bind stays on the file it
    # was made on when the host renames a directory on the way (a secret's
    # directory swapped for a new one; a writable root's parent moved).
    paths = [e[1] for e, w in zip(entries, watched, strict=True) if w]
    above = {a for p in paths for a in _ancestors(p)} - set(paths)
    every = [*paths, *sorted(above)]
    wds = dict(zip(every, _core.watch_add(_watch_fd, every, _core.WATCH_SELF), strict=True))
    try:
        fd, missing, root, mount_ns = _core.view_ns(entries, ro_root, dev_fd)
    except OSError:
        # EXDEV: chrooted (a child that joins starts at the namespace's
        # root); else the kernel refused.  Each child makes its view.
        _broken = True
        return None
    if _kept and (root, mount_ns) != (_root, _mount_ns):
        _drop_all()  # (views_stale at the take saw no change: a race; start over)
    _root, _mount_ns = root, mount_ns
    unwatched = [
        p
        for i, (e, w) in enumerate(zip(entries, watched, strict=True))
        if w and i not in missing
        for p in (e[1], *_ancestors(e[1]))
        # On a network filesystem another client's change is not seen.
        if wds[p] < 0 or wds[p] & _core.WATCH_REMOTE
    ]
    if unwatched:
        # A path bound but not watched: not kept.  A network filesystem, the
        # watch limit: never; one made between the watch and the bind: the
        # next spawn tries again.
        os.close(fd)
        if any(wds[p] != -errno.ENOENT for p in unwatched):
            _broken = True
        return None
    if len(_kept) >= _KEEP:
        _drop_all()
    kept = _kept[key] = _by_fd[fd] = _Kept(fd, frozenset(missing))
    return kept


def _ancestors(path: bytes) -> list[bytes]:
    out = []
    while path != b"/":
        path = os.path.dirname(path)
        out.append(path)
    return out


def _drop_if_changed() -> None:
    if not _kept:
        return
    try:
        changed = _core.views_stale(_mounts_fd, _watch_fd, _root, _mount_ns)
    except OSError:
        changed = True
    if changed:
        # The mount table's fd too: it shows the namespace it was opened in.
        _drop_everything()


def _drop_all() -> None:
    for kept in _kept.values():
        if kept.users:
            kept.stale = True
        else:
            _close(kept)
    _kept.clear()


def _close(kept: _Kept) -> None:
    _by_fd.pop(kept.fd, None)
    os.close(kept.fd)


def _close_watches() -> None:
    global _watch_fd
    fd, _watch_fd = _watch_fd, -1
    if fd >= 0:
        os.close(fd)


def _after_fork_in_child() -> None:
    # The parent's fds are ours to close (taken under the lock: not closed
    # meanwhile); its spawns' users are not here.
    global _lock, _watch_fd, _mounts_fd
    _lock = threading.Lock()
    fds = [fd for fd in (*_by_fd, _watch_fd, _mounts_fd) if fd >= 0]
    _kept.clear()
    _by_fd.clear()
    _watch_fd = _mounts_fd = -1
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=lambda: _lock.acquire(),
        after_in_parent=lambda: _lock.release(),
        after_in_child=_after_fork_in_child,
    )
