"""The private /dev of a read-only view, made once per process (root).

A view gives its sandbox a /dev of its own (``_namespaces.view``,
``own_dev``): a read-only tmpfs with six of the host's device nodes bound
in, links, and a devpts instance of its own.  Built in each child, that
took some 70 us of its setup, 30 system calls.

So the core builds the tree once as a detached mount
(``_core.dev_template``; mounting onto a detached tree needs Linux 6.15)
and each child clones it whole before its unshare, then mounts only its
own devpts and /dev/shm on the clone: 16 us.  The template is read-only in
every clone, its nodes are the host's, and no sandbox is given its fd.
What a sandbox writes lives in its own devpts and tmpfs, never in the
template; and no Landlock rule names the template (see
``_namespaces.Spawn``).

Without CAP_SYS_ADMIN (an unprivileged sandbox's mounts belong to its own
user namespace), or on a kernel that cannot build it, the child builds its
/dev as before.  ``drop()`` closes it (``Monitor.drain``); a forked child
closes its copy.
"""

from __future__ import annotations

import os
import threading

from . import _core

__all__ = ["drop", "release", "take"]

_lock = threading.Lock()
_fd = -1
_users = 0  # spawns between take() and release()
_stale = False  # dropped while in use: the last release() closes it
_broken = False  # the kernel refused: build no more in this process


def take() -> int:
    """The template's fd, or -1.  Unless -1, the caller calls ``release()``
    once its child is set up: until then the fd is not closed, nor its
    number given to another file (no dup per spawn)."""
    global _fd, _broken, _users
    with _lock:
        if _fd < 0 and not _broken and not _stale:
            try:
                _fd = _core.dev_template()
            except (OSError, AttributeError):
                _broken = True
        if _fd < 0 or _stale:
            return -1
        _users += 1
        return _fd


def release() -> None:
    global _users
    with _lock:
        _users -= 1
        if _stale and _users == 0:
            _close()


def drop() -> None:
    """Close the template (once no spawn uses it); the next view after
    that builds it again."""
    global _stale
    with _lock:
        if _users:
            _stale = True
        else:
            _close()


def _close() -> None:
    global _fd, _stale
    fd, _fd, _stale = _fd, -1, False
    if fd >= 0:
        os.close(fd)


def _after_fork_in_child() -> None:
    # The parent's thread that held the lock is not here; its fd is ours to
    # close (taken under the lock, so not closed meanwhile).
    global _lock, _fd, _users, _stale
    _lock = threading.Lock()
    fd, _fd, _users, _stale = _fd, -1, 0, False
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=lambda: _lock.acquire(),
        after_in_parent=lambda: _lock.release(),
        after_in_child=_after_fork_in_child,
    )
