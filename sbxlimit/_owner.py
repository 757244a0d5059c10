"""Whether the process that named a sandbox cgroup or a private workspace
still runs, in a way every PID namespace can ask.

A sandbox cgroup is named after its creator's pid (``sbx-<pid hex>-<n>``),
and so is a workspace (``sbxlimit-<pid hex>-<n>-*``), but a pid means
nothing in another PID namespace: a container sharing the cgroup tree or
the temp directory, or an sbxlimit running inside a sandbox with a PID
namespace of its own, sees a live owner as gone (or another process as the
owner).  So a process that makes sandbox cgroups under a parent, or
workspaces in a temp directory, first takes a shared ``flock`` on
``<parent>/sbx-<pid hex>.owner`` (an empty cgroup), or
``<temp dir>/sbxlimit-<pid hex>.owner`` (an empty directory of mode 0700),
and holds it for its life: the kernel drops the lock when the process is
gone, whatever its namespace.  One that is not the process's own user's
(planted in a shared temp directory by another user) is never trusted.

A collector that takes the lock exclusively (`claim`) knows that every
process that named cgroups ``sbx-<pid hex>-*`` (workspaces
``sbxlimit-<pid hex>-*``) there is gone: two live processes with the same
pid in two namespaces both hold it (shared), and the collector takes
neither's.  It holds the lock while it removes them; a new process with
that pid waits for it (briefly) and then makes the owner directory again.
Where none can be made, leftovers are judged by the pid and their age
(_gc).

The lock is taken once, before the first cgroup under the parent (the
first workspace in the temp directory), and kept until exit: everything
its holder makes there is made under it.  Only the default site's parents
get one: a `cgroup_parent` the caller names is the caller's to remove, and
must not be left holding our directories.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
import time

if sys.platform != "win32":  # (no flock there: Windows leftovers are judged by pid)
    import fcntl

__all__ = [
    "CGROUP_PREFIX",
    "OWNER_SUFFIX",
    "TEMP_DIRS_MAX",
    "WORKSPACE_PREFIX",
    "anchor",
    "claim",
    "forget",
    "hold",
    "let_go",
    "owner_path",
    "release_all",
]

OWNER_SUFFIX = ".owner"
CGROUP_PREFIX = "sbx-"  # what the names of a sandbox's cgroups start with
WORKSPACE_PREFIX = "sbxlimit-"  # and those of its workspace

# parent -> the fd holding our shared lock there, or -1: could not be
# taken (asked again after RETRY seconds: a collector may have held it).
_held: dict[str, int] = {}
_prefix: dict[str, str] = {}  # parent -> the prefix of the names made there
_retry_at: dict[str, float] = {}
RETRY = 1.0
_claimed: set[int] = set()  # fds a collector holds exclusively (a fork's child closes them)
# Owner fds let go (release_all, forget) but never closed: a thread may
# still resolve a path from one (anchor), and a number closed under it
# could name another directory by then.  `..` from a removed directory is
# still its parent.  A fork's child closes them.
_let_go: list[int] = []
_lock = threading.Lock()
# Bumped whenever an fd of _held changes (taken, let go at exit, closed in
# a fork's child): what a cached anchor() answer is checked against.
generation = 0


def owner_path(parent: str, pid: int, prefix: str = CGROUP_PREFIX) -> str:
    return os.path.join(parent, f"{prefix}{pid:x}{OWNER_SUFFIX}")


def hold(parent: str, prefix: str = CGROUP_PREFIX) -> None:
    """This process's shared lock in `parent`, taken before its first
    cgroup (or workspace, `prefix` WORKSPACE_PREFIX) there; cheap once
    taken.  Best effort: without it, our leftovers are judged by pid and
    age."""
    if sys.platform == "win32":
        return
    fd = _held.get(parent)
    if (
        fd is not None
        and (fd >= 0 or time.monotonic() < _retry_at.get(parent, 0.0))
        and (fd < 0 or prefix == CGROUP_PREFIX or not _removed(parent, fd, prefix))
    ):
        return
    with _lock:
        if prefix != CGROUP_PREFIX:
            _drop_removed()
        fd = _held.get(parent)
        if fd is not None and (fd >= 0 or time.monotonic() < _retry_at.get(parent, 0.0)):
            return
        temp = [p for p, f in _held.items() if f >= 0 and _prefix.get(p) != CGROUP_PREFIX]
        if prefix != CGROUP_PREFIX and len(temp) >= TEMP_DIRS_MAX:
            fd = -1  # an fd for each of many temp directories: none for more
        else:
            fd = _take(owner_path(parent, os.getpid(), prefix))
        if fd is not None:
            _held[parent] = fd
            _prefix[parent] = prefix
            _changed()
            _retry_at[parent] = time.monotonic() + RETRY


# Temp directories with a lock of ours at once (a caller may give each job
# a temp directory of its own, removed after).
TEMP_DIRS_MAX = 16


def _removed(parent: str, fd: int, prefix: str) -> bool:
    """The owner directory held by `fd` is no longer ours in `parent` (its
    temp directory was removed, say, and maybe made again): a lock there
    is taken again.  (Not its link count alone: a network filesystem's
    may not drop.)"""
    try:
        st = os.fstat(fd)
    except OSError:
        return True
    return st.st_nlink == 0 or not _same(st, owner_path(parent, os.getpid(), prefix))


def _drop_removed() -> None:
    """(_lock held.)  Let go of the temp directories' locks whose owner
    directory is gone: nothing of ours can be left there under it."""
    for parent, fd in list(_held.items()):
        prefix = _prefix.get(parent, CGROUP_PREFIX)
        if fd >= 0 and prefix != CGROUP_PREFIX and _removed(parent, fd, prefix):
            del _held[parent]
            del _prefix[parent]
            _retry_at.pop(parent, None)
            os.close(fd)  # (never an anchor: those are cgroups')
            _changed()


def _changed() -> None:
    global generation
    generation += 1


def forget(parent: str, fd: int) -> None:
    """Our owner cgroup in `parent` is gone (removed from outside: a mkdir
    from it found no parent): let go of its fd, so that the next `hold`
    takes a lock in the parent there now."""
    with _lock:
        if _held.get(parent) == fd >= 0:
            del _held[parent]
            _prefix.pop(parent, None)
            _retry_at.pop(parent, None)
            _let_go.append(fd)
            _changed()


def anchor(parent: str) -> int:
    """The fd of our owner cgroup in `parent`, or -1: a directory kept open
    in it, from which ``../<name>`` reaches a cgroup we made there without
    the walk from "/" (on kernfs each name of a path is a slow lookup).  It
    names the parent we made them in: the parent cannot go while our owner
    cgroup is in it."""
    return _held.get(parent, -1)


def _take(path: str) -> int | None:
    """The fd of `path` locked shared; -1 if it cannot be; None to ask
    again with the next cgroup (the parent is missing and is made again
    then; no fd was left).  An owner directory nobody holds says its owner
    is gone: one we made and could not lock goes again.  One of another
    user's, or a link (in a temp directory anyone may write), is never
    taken: it could be held against us, or swapped for another under us."""
    give_up = time.monotonic() + 0.1
    while time.monotonic() < give_up:
        made = False
        try:
            os.mkdir(path, 0o700)  # no other user may open it, and so lock it
            made = True
        except FileExistsError:
            pass  # a dead owner's, or a live one's with our pid elsewhere
        except FileNotFoundError:
            return None
        except OSError:
            return -1
        try:
            fd = os.open(path, _OPEN)
        except FileNotFoundError:
            continue  # a collector removed it between the two calls
        except OSError as e:
            _unmake(path, made)
            return -1 if e.errno in (errno.ELOOP, errno.ENOTDIR) else None
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid():
                os.close(fd)  # another user's (planted): before its lock, which they may hold
                return -1
            # Never waits: a collector holds it for a few renames or
            # rmdirs, and a process that holds it exclusively for longer
            # (one of our user's can) must not stop our spawns.
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            if _same(st, path):
                return fd
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.ENOENT):
                os.close(fd)
                _unmake(path, made)
                return -1
        os.close(fd)  # removed by the collector that held it: make it again
        time.sleep(0.001)
    return -1


# An owner directory is opened as itself, never through a link.
_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW


def _same(st: os.stat_result, path: str) -> bool:
    """`st` (of an fd) is what `path` names now."""
    try:
        here = os.lstat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino)


def _unmake(path: str, made: bool) -> None:
    if made:
        try:
            os.rmdir(path)
        except OSError:
            pass


def claim(parent: str, pid: int, prefix: str = CGROUP_PREFIX) -> int | None:
    """The owner directory of `pid` in `parent` locked exclusively (its
    fd: every process that held it is gone; close it when done), or None:
    one still runs, or there is none."""
    if sys.platform == "win32":
        return None
    path = owner_path(parent, pid, prefix)
    with _lock:  # a fork meanwhile: its child closes the fd (_claimed)
        try:
            fd = os.open(path, _OPEN)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _same(os.fstat(fd), path):
                _claimed.add(fd)
                return fd
        except OSError:
            pass
        os.close(fd)
        return None


def let_go(fd: int) -> None:
    """Close a claimed owner cgroup's fd."""
    with _lock:
        _claimed.discard(fd)
        os.close(fd)


def release_all(prefix: str = CGROUP_PREFIX) -> None:
    """At exit: let go of the locks taken with `prefix`, and remove our
    owner directories where no one else holds them (a process with our pid
    in another namespace, a fork's body that still runs) and nothing of
    ours is left.  One that outlives us (die_with_parent=False, a drain
    that timed out) keeps it: the lock, free once we are gone, says so to
    the next collector."""
    with _lock:
        held = [(p, fd) for p, fd in _held.items() if _prefix.get(p, CGROUP_PREFIX) == prefix]
        for p, _fd in held:
            del _held[p]
        _let_go.extend(fd for _p, fd in held if fd >= 0)
        _changed()
    ours = f"{prefix}{os.getpid():x}-"
    for parent, fd in held:
        if fd < 0:
            continue
        try:
            if not any(n.startswith(ours) for n in os.listdir(parent)):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.rmdir(owner_path(parent, os.getpid(), prefix))
        except OSError:
            pass
        # Not closed (_let_go): a supervisor that outlived the drain may
        # still reach a cgroup from it.


def _before_fork() -> None:
    _lock.acquire()


def _after_fork_in_parent() -> None:
    _lock.release()


def _after_fork_in_child() -> None:
    # Our copies of the parent's fds: closing them leaves its lock held
    # (flock belongs to the open file, which the parent still has).  The
    # child names its cgroups after its own pid and takes its own lock.
    global _lock
    _lock = threading.Lock()
    for fd in [*_held.values(), *_claimed, *_let_go]:
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass
    _held.clear()
    _prefix.clear()
    _retry_at.clear()
    _claimed.clear()
    _let_go.clear()
    _changed()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )
