"""Sandbox cgroups made ahead of need, off the caller's path.

Making a cgroup (a directory per v1 hierarchy, the limits written) is most
of what a cgroup costs a spawn.  Spawns come in bursts of the same kind
(an agent's tool calls under one set of limits), so once a kind has been
asked for, the supervisor thread keeps ``SIZE`` cgroups of it ready, made
and limited exactly as ``Cgroup.create`` would make them, while the caller
waits for its children.  A spawn takes one (and its name: the sandbox's id
is the cgroup's, as without the pool) or, when none is ready, makes its own
as before; a kind whose spawns found none ready is then kept one deeper,
up to ``MOST`` (back to back, two were taken faster than they were made
for a quarter of the spawns; four kept up).  A kind unused for ``IDLE``
seconds gives its cgroups back; ``drain()`` removes them all (at exit, with
the retired ones).

Only the default site is pooled: a cgroup_parent the caller names is the
caller's to remove, and must not be left holding our directories.  A pooled
cgroup is empty: nothing runs in it before a sandbox takes it.  After a
fork the child has a supervisor (and pool) of its own; the parent's ready
cgroups stay the parent's.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from ._cgroup import Cgroup, Site

__all__ = ["IDLE", "KINDS", "MOST", "SIZE", "Pool"]

log = logging.getLogger("sbxlimit")

SIZE = 2  # ready cgroups per kind, at first
MOST = 4  # ready cgroups per kind once its spawns outran the pool
KINDS = 4  # kinds kept ready at once (the most recently used)
IDLE = 10.0  # seconds a kind may go unused before its cgroups go

Settings = tuple[tuple[str, str, str], ...]
Kind = tuple[Site, Settings]


class Pool:
    """Ready cgroups per kind (site and settings); thread-safe.  The
    supervisor thread calls :meth:`work`; spawning threads :meth:`take`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: dict[Kind, list[Cgroup]] = {}
        self._used: dict[Kind, float] = {}  # kind -> last asked for
        self._depth: dict[Kind, int] = {}  # kind -> how many to keep ready
        self._names: dict[Kind, Callable[[], str]] = {}
        self._closed = False
        # Held while one is made: drain() waits for it, so that no cgroup
        # of the pool is made after drain() returns.
        self._busy = threading.Lock()
        self._making: Cgroup | None = None
        # The directories of the one being made, from before its mkdir: a
        # file of theirs open for a moment (a limit written, a counter
        # read) when a fork happens is the child's to close (dirs()).
        self._making_dirs: tuple[str, ...] = ()

    def take(
        self, site: Site, settings: Settings, name: Callable[[], str]
    ) -> tuple[Cgroup | None, int]:
        """A ready cgroup of this kind, or None, and how many are left ready
        (-1: none will be made, as the pool is closed or the site is not
        pooled).  Either way the kind is kept ready from now on.  `name`
        makes a new cgroup's name.  One lock, as a spawn calls it."""
        if site.explicit or not site.version:
            return None, -1
        kind = (site, settings)
        with self._lock:
            if self._closed:
                return None, -1
            known = kind in self._used
            self._used[kind] = time.monotonic()
            self._names[kind] = name
            ready = self._ready.get(kind)
            if not ready:
                if known:  # not the kind's first spawn: the pool fell behind
                    self._depth[kind] = min(MOST, self._depth.get(kind, SIZE) + 1)
                return None, 0
            return ready.pop(), len(ready)

    def has_ready(self, site: Site, settings: Settings) -> bool:
        """A cgroup of this kind is ready for the next spawn."""
        with self._lock:
            return bool(self._ready.get((site, settings)))

    def wanted(self) -> bool:
        """Whether :meth:`work` has something to do now."""
        with self._lock:
            if self._closed:
                return False
            return any(self._short(k) for k in self._recent())

    def next_expiry(self) -> float | None:
        """When the least recently used kind expires (monotonic), if any is
        kept."""
        with self._lock:
            return min(self._used.values()) + IDLE if self._used else None

    def _recent(self) -> list[Kind]:
        return sorted(self._used, key=self._used.__getitem__, reverse=True)[:KINDS]

    def _short(self, kind: Kind) -> bool:
        return len(self._ready.get(kind, ())) < self._depth.get(kind, SIZE)

    def work(self, now: float) -> None:
        """Supervisor thread: give back what expired, make what is missing
        (one cgroup per call, so the loop's other work is not held up)."""
        with self._busy:
            self._work(now)

    def _work(self, now: float) -> None:
        with self._lock:
            recent = set(self._recent())
            expired = [k for k, t in self._used.items() if now - t > IDLE or k not in recent]
            gone = [cg for k in expired for cg in self._ready.pop(k, [])]
            for k in expired:
                self._used.pop(k, None)
                self._names.pop(k, None)
                self._depth.pop(k, None)
            todo = next(
                (k for k in self._recent() if self._short(k) and not self._closed),
                None,
            )
            name = self._names.get(todo) if todo is not None else None
        for old in gone:
            _remove(old)
        if todo is None or name is None:
            return
        site, settings = todo
        cg_name = f"sbx-{name()}"
        with self._lock:
            self._making_dirs = tuple(os.path.join(p, cg_name) for _c, p in site.parents)
        cg: Cgroup | None = None
        try:
            cg = Cgroup.create(site, cg_name, settings)
            with self._lock:
                self._making = cg  # its fds are a fork's to close from now on
            # Ready to join and to watch: the spawn and the registration
            # then open nothing (see Cgroup.arm).
            cg.arm(_watched(settings))
            with self._lock:
                if not self._closed and todo in self._used:
                    # Ready before no longer being made: a fork in between
                    # would leave its child fds nobody lists (owned()).
                    self._ready.setdefault(todo, []).append(cg)
                    cg = None
        except FileExistsError:
            pass  # the name is another process's (_mkdir_sandbox): the next call takes another
        except OSError as e:
            # Spawns make their own, and say what failed; stop asking.
            log.debug("sbxlimit: cgroup pool: %s", e)
            with self._lock:
                self._used.pop(todo, None)
                self._depth.pop(todo, None)
        finally:
            if cg is not None:
                _remove(cg)  # still listed as being made while its fds close
            with self._lock:
                self._making = None
                self._making_dirs = ()

    def dirs(self) -> set[str]:
        """The directories of its cgroups, ready or being made.  For a
        forked child: read without the lock (the parent's thread may have
        held it at the fork; the child has no other thread)."""
        out = set(self._making_dirs)
        for cgs in list(self._ready.values()):
            for cg in cgs:
                out.update(cg.dirs.values())
        return out

    def owned(self) -> dict[int, str | tuple[int, int]]:
        """The fds its ready cgroups hold, for a forked child to close:
        read without the lock, as dirs()."""
        ready = [cg for cgs in list(self._ready.values()) for cg in cgs]
        making = self._making
        if making is not None:  # the one being armed
            ready.append(making)
        out: dict[int, str | tuple[int, int]] = {}
        for cg in ready:
            out.update(cg.owned_fds())
        return out

    def drain(self, *, close: bool = False) -> None:
        """Remove every ready cgroup; `close`: and make no more (exit)."""
        with self._busy:
            with self._lock:
                self._closed = self._closed or close
                gone = [cg for ready in self._ready.values() for cg in ready]
                self._ready.clear()
                self._used.clear()
                self._names.clear()
                self._depth.clear()
            for cg in gone:
                _remove(cg)


def _watched(settings: Settings) -> list[str]:
    """The fields a sandbox with these settings has the kernel report."""
    names = {fname for _c, fname, _v in settings}
    fields = []
    if names & {"memory.max", "memory.limit_in_bytes"}:
        fields.append("memory")
    if "pids.max" in names:
        fields.append("pids")
    return fields


def _remove(cg: Cgroup) -> None:
    if not cg.remove():
        log.warning("sbxlimit: pooled cgroup %s could not be removed", cg.name)
