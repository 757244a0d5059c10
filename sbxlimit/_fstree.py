"""Walking a tree a sandboxed program made: its removal and its size.

The program chooses the tree's depth, its names' length and its modes, and
leaves links: a walk that recursed (``shutil.rmtree``: RecursionError past
some 1000 levels), built paths (ENAMETOOLONG past PATH_MAX, where what is
below is neither removed nor counted) or followed a link (``chmod``) is
the program's to steer.  This one holds a single directory open at a
time, reaches each entry by name from it (``*at`` calls, never through a
link), and goes back up through ``..``, checked against the directory it
came from.
"""

from __future__ import annotations

import os
import stat
import threading
import time
import weakref
from collections.abc import Callable
from typing import TypeVar

__all__ = ["TreeSize", "Walk", "remove_tree", "tree_size", "usable", "walk"]

_DIR = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)

# Where the *at calls exist (not Windows): else the callers use the paths.
usable = hasattr(os, "O_DIRECTORY") and os.open in os.supports_dir_fd

# visit(the directory's fd, an entry's name in it, whether it is a directory)
Visit = Callable[[int, str, bool], None]
T = TypeVar("T")


def _ident(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _retry(fd: int, open_up: bool, op: Callable[[], T]) -> T:
    """op(), again once after making directory `fd` ours to search and
    change (`open_up`), if it was refused."""
    try:
        return op()
    except PermissionError:
        if not open_up:
            raise
        os.fchmod(fd, stat.S_IRWXU)  # the directory itself: never a link
        return op()


def _open_dir(fd: int, name: str, open_up: bool) -> int:
    """Directory `name` in `fd`, opened as itself (a link is refused)."""
    try:
        return _retry(fd, open_up, lambda: os.open(name, _DIR, dir_fd=fd))
    except PermissionError:
        if not open_up:
            raise
        # Unreadable itself (mode 000): opened up without following a link.
        try:
            os.chmod(name, stat.S_IRWXU, dir_fd=fd, follow_symlinks=False)
        except NotImplementedError:  # a libc that cannot tell: only a directory
            if not stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                raise
            os.chmod(name, stat.S_IRWXU, dir_fd=fd)
        return os.open(name, _DIR, dir_fd=fd)


def walk(path: str, visit: Visit, *, open_up: bool = False, deadline: float | None = None) -> bool:
    """visit(dir_fd, name, is_dir) for every entry under `path`, each
    directory after what is in it; `path` itself is not visited.  With
    `open_up`, what cannot be searched or opened is made so (chmod 0700;
    the removal's).  False if the walk stopped early: `path` could not be
    opened, a directory moved while it was below it, `deadline` (of
    `time.monotonic()`) passed (or this is Windows: no *at calls)."""
    w = Walk(path, visit, open_up=open_up)
    try:
        return w.run(deadline) and w.whole is True
    finally:
        w.close()


# The directory a walk is in: its name in its parent, its identity.
_Here = tuple[str, tuple[int, int]]

# Held for each step of a walk (an entry visited, a directory entered or
# left): a fork waits for the step to end, so that the child finds each
# walk's directory where `fd` says, and no fd a step holds for a moment.
# Registered before _once's hook (it imports this module first), so that
# a fork takes it after that hook has waited for another thread's final
# size or walked one itself (on the forking thread: re-entrant).
_step_lock = threading.RLock()
# The walks holding a directory open: a forked child closes them (a
# ForkedSandbox's program must not keep another sandbox's workspace open).
_open_walks: weakref.WeakSet[Walk] = weakref.WeakSet()


class Walk:
    """walk()'s walk, which can stop at a deadline and go on from there
    later (the sizer's: one program's tree, made to grow ahead of its
    walk, must not hold the walks of the others).  It holds one directory
    open at a time (`fd`), none once done."""

    def __init__(self, path: str, visit: Visit, *, open_up: bool = False) -> None:
        self.path, self._visit, self._open_up = path, visit, open_up
        self.fd = -1
        self.whole: bool | None = None  # how it ended: None while under way
        # Each level above the current one: (its name in its parent, its
        # identity, the entries still to visit in it).
        self._stack: list[tuple[str, tuple[int, int], list[tuple[str, bool]]]] = []
        self._here: _Here = ("", (0, 0))
        self._entries: list[tuple[str, bool]] | None = None  # None: not begun
        # `path` is the caller's (a workdir may be a link): the rest is the program's.
        self._top = _DIR & ~getattr(os, "O_NOFOLLOW", 0)

    def run(self, deadline: float | None = None) -> bool:
        """Walk on until the end (True: `whole` says whether everything
        was visited) or until `deadline` (of `time.monotonic()`) passes
        (False: call again to go on; one step is taken at least)."""
        if self.whole is not None:
            return True
        try:
            while True:
                # A program that makes files (or deeper directories) where
                # the walk has yet to go, faster than it goes, would keep it
                # going: the deadline is looked at after each step.
                with _step_lock:
                    going = self._step()
                if not going:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    return False
        except OSError:
            self.whole = False
        except BaseException:
            self.close()
            raise
        if self.whole is None:
            self.whole = True
        self.close()
        return True

    def close(self) -> None:
        """Give up the walk (if not done) and its directory."""
        with _step_lock:
            if self.whole is None:
                self.whole = False
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1
            _open_walks.discard(self)

    def _step(self) -> bool:
        """One step from where the walk is: True if there is more to do;
        else it is done (whole, unless this set `whole` False)."""
        if not usable:
            self.whole = False
            return False
        open_up, stack, fd, entries = self._open_up, self._stack, self.fd, self._entries
        if entries is None:  # the first
            try:
                self.fd = os.open(self.path, self._top)
            except PermissionError:
                if not open_up:
                    raise
                os.chmod(self.path, stat.S_IRWXU)  # (the workspace itself, made 000)
                self.fd = os.open(self.path, self._top)
            _open_walks.add(self)
            self._here = ("", _ident(os.fstat(self.fd)))
            self._entries = _list(self.fd, open_up)
            return True
        if entries:
            name, is_dir = entries.pop()
            if not is_dir:
                self._visit(fd, name, False)
                return True
            try:
                child = _open_dir(fd, name, open_up)
            except OSError:
                self._visit(fd, name, True)  # as it is: what is in it stays
                return True
            stack.append((*self._here, entries))
            os.close(fd)
            self.fd = child
            self._here = (name, _ident(os.fstat(child)))
            self._entries = _list(child, open_up)
            return True
        if not stack:
            return False
        up = os.open("..", _DIR, dir_fd=fd)
        os.close(fd)
        self.fd = fd = up
        done = self._here[0]
        parent_name, parent_ident, self._entries = stack.pop()
        if _ident(os.fstat(fd)) != parent_ident:
            # The directory we were in moved meanwhile: ".." is not where
            # we came from.  Its parent again by name from the top, each
            # level checked; a program that moves what it is measured in
            # must not end the walk there (what comes after it would not
            # be counted).  Gone too: the walk stops.
            os.close(fd)
            self.fd = -1
            chain = [(n, i) for n, i, _e in stack] + [(parent_name, parent_ident)]
            self.fd = fd = _reopen(self.path, self._top, chain)
            if fd < 0:
                self.whole = False
                return False
        self._here = (parent_name, parent_ident)
        self._visit(fd, done, True)
        return True


def _before_fork() -> None:
    _step_lock.acquire()


def _after_fork_in_parent() -> None:
    _step_lock.release()


def _after_fork_in_child() -> None:
    # The walks are other threads', gone here: their directories closed.
    global _step_lock
    for w in list(_open_walks):
        if w.fd >= 0:
            try:
                os.close(w.fd)
            except OSError:
                pass
            w.fd = -1
        if w.whole is None:
            w.whole = False
    _open_walks.clear()
    _step_lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )


def _reopen(path: str, top: int, chain: list[tuple[str, tuple[int, int]]]) -> int:
    """The directory `chain` names from `path` (each level's name in its
    parent and identity; the first is `path` itself), or -1 if a level is
    not the one it was."""
    try:
        fd = os.open(path, top)
    except OSError:
        return -1
    for depth, (name, ident) in enumerate(chain):
        if depth:
            try:
                child = os.open(name, _DIR, dir_fd=fd)
            except OSError:
                child = -1
            os.close(fd)
            fd = child
            if fd < 0:
                return -1
        if _ident(os.fstat(fd)) != ident:
            os.close(fd)
            return -1
    return fd


def _list(fd: int, open_up: bool) -> list[tuple[str, bool]]:
    """(name, is a directory) of each entry of directory `fd`: its type as
    the listing gives it (a stat only where the filesystem gives none),
    taken now, while `fd` is the one they were listed from."""

    def listing() -> list[tuple[str, bool]]:
        with os.scandir(fd) as it:
            return [(e.name, e.is_dir(follow_symlinks=False)) for e in it]

    return _retry(fd, open_up, listing)


def remove_tree(path: str) -> bool:
    """Remove `path` and everything under it, opening up what the program
    made unsearchable or read-only; never following a link.  True if it
    is gone."""

    removed = 0

    def remove(fd: int, name: str, is_dir: bool) -> None:
        nonlocal removed
        try:
            if is_dir:
                _retry(fd, True, lambda: os.rmdir(name, dir_fd=fd))
            else:
                _retry(fd, True, lambda: os.unlink(name, dir_fd=fd))
            removed += 1
        except OSError:
            pass  # (immutable, a mount point: left, and so are the directories above)

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        try:
            os.unlink(path)
        except OSError:
            pass
        return not os.path.lexists(path)
    # Again while a pass gets further (a few times), or is cut short by
    # what another thread removes (the exit's removal meeting the
    # janitor's): the tree is gone when this returns True, whoever removed
    # it.  Each pass is cut short where the removal would stop after it.
    start = time.monotonic()
    further = 0  # passes that got further
    first = True
    while True:
        before = removed
        limit = start + (_FIRST if first else _FURTHER if further else _CONTENDED)
        first = False
        whole = walk(path, remove, open_up=True, deadline=limit)
        try:
            os.rmdir(path)
        except OSError:
            pass
        if not os.path.lexists(path):
            return True
        now = time.monotonic()
        if now > limit:
            return False  # a program still makes what is removed (or another removes it)
        if removed == before:
            if whole:
                return False  # what is left cannot be removed
            time.sleep(0.01)
            continue
        further += 1
        if further >= _PASSES or now > start + _FURTHER:
            return False  # a program still makes what is removed


# Seconds the first pass may take: a tree of some millions of entries (a
# larger one is left, to be tried again); a program that makes files where
# the pass has yet to go, faster than it goes, would otherwise hold it for
# as long as it likes, in one pass.
_FIRST = 30.0
# Seconds a removal goes on while another removes the same tree.
_CONTENDED = 10.0
# Passes that get further, at most, and seconds: a program that makes
# files as fast as they go (or more for each removed) would otherwise hold
# its remover (the caller's exit) for as long as it likes.
_PASSES = 16
_FURTHER = 2.0


# Walks of a size before its largest count is taken (each cut short).
_SIZE_TRIES = 3


def tree_size(path: str) -> int:
    """Bytes allocated under `path` (hard links once; links not followed).
    A walk cut short (a directory above the one it was in moved, or
    `path` could not be opened) is tried again, a few times: what it did
    not reach is not counted."""
    size = TreeSize(path)
    try:
        got = size.run()
    finally:
        size.close()
    assert got is not None
    return got


class TreeSize:
    """tree_size(path), measured a part at a time if need be: run() until
    a deadline, then again later from where it stopped (the sizer's)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._most = 0  # the largest count of the walks cut short
        self._tries = 0
        self._total = 0
        self._seen: set[tuple[int, int]] = set()
        self._walk: Walk | None = None

    def run(self, deadline: float | None = None) -> int | None:
        """The size, or None if `deadline` (of `time.monotonic()`) passed
        first: call again to go on."""
        while True:
            if self._walk is None:
                if self._tries and deadline is not None and time.monotonic() > deadline:
                    return None  # the next try in the next turn
                self._total, self._seen = 0, set()
                self._walk = Walk(self.path, self._count)
            if not self._walk.run(deadline):
                return None
            whole, self._walk = self._walk.whole, None
            self._tries += 1
            if whole:
                return self._total
            self._most = max(self._most, self._total)
            if self._tries >= _SIZE_TRIES:
                return self._most

    def close(self) -> None:
        if self._walk is not None:
            self._walk.close()
            self._walk = None

    def _count(self, fd: int, name: str, is_dir: bool) -> None:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return
        if st.st_nlink > 1 and not is_dir:
            if _ident(st) in self._seen:
                return
            self._seen.add(_ident(st))
        self._total += st.st_blocks * 512
