"""A figure computed once, by whoever asks first.

The supervisor computes a sandbox's final figures (its cgroup's counters,
its workspace's size) right before it removes what they are read from, off
the caller's path; a caller who asks sooner computes them itself, and the
supervisor then waits for that before it removes anything.  A fork first
computes those still pending: in the child, what they are read from may be
gone (the parent's supervisor removes it).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

# Imported first, so that its at-fork hooks are registered before ours:
# at a fork ours runs first (reverse order), and may walk (a workspace's
# size), or wait for another thread's walk, before the walks' step lock
# is taken (see _fstree._step_lock).
from . import _fstree  # noqa: F401

T = TypeVar("T")
log = logging.getLogger("sbxlimit")

# Not computed yet, in this process.
_pending: weakref.WeakSet[Once[Any]] = weakref.WeakSet()


class Once(Generic[T]):
    """`compute()`'s value, computed at the first get(); None if it
    failed (logged: the supervisor goes on to remove what it was read
    from).  `lock` is held while it computes (reentrant: what moves its
    source holds it too)."""

    __slots__ = ("__weakref__", "_compute", "_lock", "_pid", "_value")

    def __init__(self, compute: Callable[[], T]) -> None:
        self._compute: Callable[[], T] | None = compute
        self._value: T | None = None
        self._pid = os.getpid()
        self._lock = threading.RLock()
        _pending.add(self)

    @property
    def lock(self) -> threading.RLock:
        if self._pid != os.getpid():
            # A forked child: the lock may have been held at the fork by
            # a thread (the supervisor) that does not run here.
            self._lock = threading.RLock()
            self._pid = os.getpid()
        return self._lock

    def get(self) -> T | None:
        with self.lock:
            compute = self._compute
            if compute is not None:
                try:
                    self._value = compute()
                except Exception:
                    log.exception("sbxlimit: a sandbox's final figure could not be read")
                self._compute = None  # what it closed over goes
                _pending.discard(self)
            return self._value

    def put(self, value: T) -> None:
        """`value` is what compute() would give now: kept unless computed
        already (hold `lock` from before what `value` was read from moved)."""
        with self.lock:
            if self._compute is not None:
                self._value = value
                self._compute = None
                _pending.discard(self)

    @property
    def done(self) -> bool:
        return self._compute is None


def _before_fork() -> None:
    pid = os.getpid()
    for once in list(_pending):
        if once._pid == pid:
            once.get()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork)
