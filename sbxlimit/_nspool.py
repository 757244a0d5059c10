"""Network and IPC namespaces made ahead of need, off the caller's path
(root).

A new network namespace costs its child about 0.3 ms (the kernel sets up
its loopback and tables), an IPC namespace 9-15 us (its own mqueue
filesystem); joining one made earlier costs a ``setns``.  So once a
sandbox has asked for one, the supervisor thread keeps ``SIZE`` of that
kind ready (``_core.ns_make``: a short-lived thread of the core makes it,
brings lo up and hands back an fd, so no thread of ours ever enters it).
A spawn takes one and its child joins it first thing; each is used by one
sandbox only, then its fd is closed, and the namespace goes with its last
process, as an unshared one does.

Only where the caller makes namespaces without a user namespace (root):
an unprivileged sandbox's namespaces must belong to its own user
namespace, made in the child.  Unused for ``IDLE`` seconds, the ready
ones are closed; ``drain()`` closes them all (at exit).  After a fork
the child has a pool of its own (the parent's fds are closed there).
"""

from __future__ import annotations

import logging
import os
import threading
import time

from . import _core
from ._platform import CLONE_NEWIPC, CLONE_NEWNET

__all__ = ["IDLE", "SIZE", "NsPool"]

log = logging.getLogger("sbxlimit")

SIZE = 2  # ready namespaces
IDLE = 10.0  # seconds without a taker before they go


_NAMES = {CLONE_NEWNET: "net", CLONE_NEWIPC: "ipc"}


class NsPool:
    """Namespaces of one kind (CLONE_NEWNET, CLONE_NEWIPC).  Thread-safe;
    the supervisor thread calls :meth:`work`."""

    def __init__(self, kind: int) -> None:
        self.kind = kind
        self.name = _NAMES[kind]  # as in /proc/self/ns/ and its links
        self._lock = threading.Lock()
        self._ready: list[int] = []
        self._used = -1.0  # monotonic time of the last take; < 0: none asked
        self._closed = False
        self._broken = False  # ns_make failed: stop asking
        self.taken = 0  # namespaces handed out, for tests and benchmarks

    def take(self) -> int:
        """A ready namespace's fd (the caller closes it after the spawn), or
        -1; either way namespaces are kept ready from now on."""
        with self._lock:
            if self._closed:
                return -1
            self._used = time.monotonic()
            if not self._ready:
                return -1
            self.taken += 1
            return self._ready.pop()

    def has_ready(self) -> bool:
        with self._lock:
            return bool(self._ready)

    def wanted(self) -> bool:
        with self._lock:
            return (
                self._used >= 0
                and not self._closed
                and not self._broken
                and len(self._ready) < SIZE
            )

    def next_expiry(self) -> float | None:
        with self._lock:
            return self._used + IDLE if self._used >= 0 else None

    def owned(self) -> list[int]:
        """The fds it holds now (for a forked child to close)."""
        return list(self._ready)

    def work(self, now: float) -> None:
        """Supervisor thread: close what went unused, make one if missing."""
        with self._lock:
            gone: list[int] = []
            if self._used >= 0 and now - self._used > IDLE:
                gone, self._ready, self._used = self._ready, [], -1.0
            make = self._used >= 0 and not self._closed and not self._broken
            make = make and len(self._ready) < SIZE
        for fd in gone:
            os.close(fd)
        if not make:
            return
        try:
            fd = _core.ns_make(self.kind)
        except OSError as e:
            # Spawns unshare their own, and say what failed.
            log.debug("sbxlimit: %s namespace pool: %s", self.name, e)
            with self._lock:
                self._broken = True
            return
        with self._lock:
            if not self._closed and self._used >= 0:
                self._ready.append(fd)
                return
        os.close(fd)

    def drain(self, *, close: bool = False) -> None:
        """Close every ready namespace; `close`: and make no more (exit)."""
        with self._lock:
            self._closed = self._closed or close
            gone, self._ready, self._used = self._ready, [], -1.0
        for fd in gone:
            os.close(fd)
