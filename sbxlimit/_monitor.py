"""The supervisor: one thread watches every live sandbox of this process.

It owns four kinds of work, all driven by one selector loop:

* deadlines: ``wall_time`` (SIGTERM to the tree, SIGKILL ``kill_grace``
  later), and the pending SIGKILL of a tree kill;
* sampling, every ``sample_interval``: the tree's memory and task count
  against ``memory``/``pids`` where no cgroup holds them;
* a cgroup's limits without periodic work where the kernel says when one
  is hit (``Cgroup.open_events``: an eventfd for a v1 OOM kill, kernfs
  ``POLLPRI`` on v2's ``*.events``); v1's ``pids.events`` gives no event,
  so those files are read in one batch per interval;
* output pumps (``_pump``): their fds are in its selector;
* cgroups: removing those of ended sandboxes, and making the next ones
  ahead of need (``_cgpool``).

There is no thread per sandbox.  Deadlines and samples sit in one heap, so
a wake-up costs what is due, not what is live; samples fall on a grid of
``sample_interval / 4`` (at most 10 ms), never later than asked, so many
sandboxes' samples share a wake-up.  Registering a sandbox wakes the loop
only when it is due earlier than the loop's next wake-up.  Kills are recorded
before they are sent, so the reason is known when the program dies; a
kill is never sent to a leader that has already exited (checked with
``waitid(WNOWAIT)``), and a leader is unregistered before it is reaped, so
its pid cannot be reused under us.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import select
import selectors
import signal
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any

from . import _core, _namespaces, _viewns, _workspace, audit
from ._cgpool import Pool
from ._cgroup import read_quiet
from ._evidence import KillRecord, Samples
from ._exit import DRAIN, at_exit, watch_multiprocessing
from ._gc import collect_workspaces
from ._nspool import NsPool
from ._platform import CLONE_NEWIPC, CLONE_NEWNET
from ._pump import Pump, fd_ident

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._cgroup import Cgroup, Site

__all__ = [
    "Monitor",
    "Watch",
    "drain_before_exit",
    "get_monitor",
    "kill_group_left",
    "settle_monitor",
    "signal_tree",
]

log = logging.getLogger("sbxlimit")

_HAS_PIDFD = hasattr(os, "pidfd_open") and hasattr(select, "epoll")
_RM_WORKSPACE = getattr(_core, "FS_RM_WORKSPACE", 0)  # the POSIX core's
# After the last sandbox goes, keep ticking this long before sleeping for
# good: a burst of spawns then registers without waking the thread.
_LINGER = 5.0
_IDLE_TICK = 0.1
_EXIT_POLL = 0.05
# What may wait for the loop's next pass (retiring a cgroup, refilling the
# pool) does not wake it when that pass is this close.
_SOON = 0.1
_RETIRE_TICK = 0.01
_RETIRE_FOR = 30.0
_RECHECKS, _RECHECK_AFTER = 10, 0.005  # an OOM's kill counted within 50 ms
# Seconds of one workspace's size walk before the next waiting takes its
# turn (a walk alone goes on: its next turn is at once).
_SIZE_TURN = 0.2
_GRID = 0.01  # samples are aligned to multiples of min(this, interval / 4)


def next_sample(now: float, interval: float) -> float:
    """`interval` after `now`, rounded down to the sampling grid: never
    later than asked, and many sandboxes' samples share one wake-up."""
    q = min(_GRID, interval / 4)
    return math.floor((now + interval) / q) * q


class _Dispatch:
    """A selector entry that is neither a pump nor the wake pipe."""

    __slots__ = ("on_event",)

    def __init__(self, on_event: Callable[[int], None]) -> None:
        self.on_event = on_event


def signal_tree(
    pid: int, sig: int, pgid: int, cgroup: Cgroup | None = None, *, until_empty: bool = True
) -> None:
    """Signal the tree rooted at `pid` and (pgid > 0) its process group; with
    a cgroup, every process in it too (setsid and double forks do not get
    out of a cgroup; a process that can write another cgroup's cgroup.procs,
    root in the sandbox, can, and the tree walk still finds the leader).
    `until_empty`: see Cgroup.kill (False on the supervisor's thread)."""
    if cgroup is not None and not cgroup.removed:
        members = cgroup.signal(sig, until_empty=until_empty)
        if sig != signal.SIGKILL and pid in members:
            return  # the leader had it: no second SIGTERM for anyone
    if _core.HAS_PROCTREE:
        try:
            _core.tree_signal(pid, sig, pgid)
            return
        except OSError:
            pass
    for target in ((-pgid,) if pgid > 0 else ()) + (pid,):
        try:
            os.kill(target, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _armed(w: Watch) -> bool:
    """Installing `w` opens and reads nothing: no cgroup, or one armed
    ahead for what `w` watches (Cgroup.arm), and no v1 memory warning
    (its threshold is the sandbox's own)."""
    cg = w.cgroup
    if cg is None:
        return True
    if w.warn_memory is not None and cg.site.version == 1:
        return False
    return all(
        field in cg.armed or cg.counter_file(field) in cg.baselines
        for field, _limit, _mech in w.cg_ends
        if field in ("memory", "pids")
    )


def _exit_state(pid: int) -> bool | None:
    """Whether `pid` (our child) has exited, without reaping it: True (its
    zombie pins its process group id), False (it runs), None (reaped
    elsewhere already: SIGCHLD ignored, a handler's waitpid)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return None


def leader_exited(pid: int) -> bool:
    """True once `pid` (our child) has exited; it is not reaped here."""
    return _exit_state(pid) is not False


def kill_group_left(pgid: int) -> None:
    """SIGKILL what is left in process group `pgid` once its leader was
    reaped elsewhere (SIGCHLD ignored, a handler's waitpid), so that no
    zombie pins the id.  While any member is left the kernel gives the
    number to no one (a group's id pins it), so a group of that id is
    still the sandbox's, unless a process has that pid again: then the
    group emptied and the id is another's, and nothing is signalled.  (A
    new group of that id whose leader has exited too would be taken for
    ours: two events in the gap, and no zombie of our leader.)"""
    if os.path.exists(f"/proc/{pgid}"):
        return  # the pid is in use again: its group is not ours
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Watch:
    """Supervisor state of one sandbox, shared by its Popen and the monitor."""

    __slots__ = (
        "audit",
        "cg_ends",
        "cg_sampled",
        "cgroup",
        "counts",
        "cpu_seen",
        "cpu_time",
        "deadline",
        "disk",
        "disk_ends",
        "disk_used",
        "done",
        "event_fds",
        "exited_at",
        "grace",
        "heap_at",
        "hits",
        "interval",
        "kill",
        "memory_limit",
        "memory_now",
        "memory_peak",
        "next_sample",
        "on_exit",
        "pgid",
        "pid",
        "pidfd",
        "pids_limit",
        "read_paths",
        "reaper",
        "recheck",
        "sampled_at",
        "sigkill_at",
        "sizing",
        "start",
        "swept",
        "tasks_now",
        "tasks_peak",
        "tree_cache",
        "wall_time",
        "warn_disk",
        "warn_evented",
        "warn_memory",
    )

    def __init__(
        self,
        *,
        pid: int,
        pgid: int,
        start: float,
        wall_time: float | None,
        memory: int | None,
        pids: int | None,
        grace: float,
        interval: float,
        cgroup: Cgroup | None = None,
        cg_ends: tuple[tuple[str, float, str], ...] = (),
        warn_memory: tuple[int, int, str] | None = None,
        audit_fields: dict[str, Any] | None = None,
        disk: tuple[str | int, int] | None = None,
        disk_ends: bool = True,
        cpu_time: float | None = None,
        reaper: bool = False,
    ) -> None:
        self.pid = pid
        # (workspace, limit): its size is sampled; an int is the fd of a
        # size-capped tmpfs (statvfs: cheap, and the kernel holds the cap).
        self.disk = disk
        self.disk_ends = disk_ends  # past the limit ends the sandbox (else: warnings only)
        self.disk_used = 0
        self.sizing = False  # the sizer thread is measuring it
        self.warn_disk: int | None = None  # bytes: one resource_warning past them
        self.on_exit: Any = None  # called (monitor thread) when the leader exits
        # (threshold, limit, mechanism): one resource_warning audit event
        # when the memory sample first reaches the threshold.
        self.warn_memory = warn_memory
        self.audit = audit_fields
        self.cgroup = cgroup
        # (field, limit, mechanism) decided by the cgroup's counters: an OOM
        # kill, a refused fork, the CPU used; one hit ends the sandbox.
        self.cg_ends = cg_ends
        # Those of cg_ends no event covers: sampled (see Monitor.register).
        self.cg_sampled = cg_ends
        self.warn_evented = False  # the memory warning comes as an event (v1)
        self.event_fds: list[int] = []  # registered with the monitor
        self.read_paths: list[str] = []  # counter files read in the monitor's batch
        self.heap_at = math.inf  # due time of its live heap entry
        # (when, tries left): v1 signals an OOM before the kill is counted;
        # the counter is read again shortly.
        self.recheck: tuple[float, int] | None = None
        # What the last walk of its tree saw (no cgroup): while nothing in
        # the tree has run, a sample reads one small file per process.
        self.tree_cache = bytearray(_core.TREE_CACHE_SIZE) if cgroup is None else None
        self.swept = False  # its tree is sampled by its interval's sweep, not on its own
        self.sampled_at = -math.inf  # when a sweep last confirmed memory_now etc.
        self.cpu_time = cpu_time  # the tree's CPU seconds (no cgroup)
        # The leader is a PID namespace's reaper: a copy of our memory, not
        # the sandbox's, left out of samples.
        self.reaper = reaper
        # The tree's (user, system) CPU at the last sample: it counts the
        # processes that a kill left unreaped, which rusage cannot.
        self.cpu_seen = (0.0, 0.0)
        # How often a limit was hit (OOM kills, refused forks), for messages.
        self.counts: dict[str, int] = {}
        self.pidfd = -1  # watched by the monitor for the leader's exit
        self.pgid = pgid  # > 0: the sandbox leads this process group
        self.start = start
        self.wall_time = wall_time
        self.deadline = start + wall_time if wall_time is not None else None
        self.memory_limit = memory
        self.pids_limit = pids
        self.grace = grace
        self.interval = interval
        # A cgroup's counters are sampled: its OOM killer takes one process
        # (on v2 too, when a process made itself unkillable with
        # oom_score_adj), a refused fork leaves a program that retries.
        sampled = (
            memory is not None
            or pids is not None
            or bool(cg_ends)
            or cpu_time is not None
            or warn_memory is not None
            or disk is not None
        )
        self.next_sample: float | None = next_sample(start, interval) if sampled else None
        self.kill: KillRecord | None = None
        self.sigkill_at: float | None = None
        self.done = False  # leader exited or unregistered
        self.exited_at: float | None = None
        self.hits: set[str] = set()
        self.memory_now = 0
        self.memory_peak = 0
        self.tasks_now = 0
        self.tasks_peak = 0

    def due(self) -> float:
        if self.done:
            return math.inf
        t = math.inf
        if self.sigkill_at is not None:
            t = self.sigkill_at
        if self.kill is None and self.deadline is not None:
            t = min(t, self.deadline)
        if self.next_sample is not None and not self.swept:
            t = min(t, self.next_sample)
        if self.recheck is not None:
            t = min(t, self.recheck[0])
        return t

    def sampled(self) -> bool:
        """Anything left to sample once events cover what they can."""
        if self.cgroup is None or self.memory_limit is not None or self.pids_limit is not None:
            return self.next_sample is not None
        warn = self.warn_memory is not None and not self.warn_evented
        return bool(self.cg_sampled) or warn or self.cpu_time is not None or self.disk is not None

    def fresh_tree(self, now: float) -> tuple[int, int, float, float] | None:
        """The tree's (memory, tasks, cpu user, cpu system) from a sweep no
        older than one interval, or None: usage() reads no tree twice."""
        if now - self.sampled_at > self.interval or self.done:
            return None
        return (self.memory_now, self.tasks_now, *self.cpu_seen)

    def samples(self) -> Samples:
        """What its samples saw, for the evidence record."""
        return Samples(self.memory_peak, self.tasks_peak, self.cpu_seen)

    def observe(self, memory: int, tasks: int) -> dict[str, Any] | None:
        """Record a sample; returns the fields of a resource_warning audit
        event when memory first reaches its warning threshold (the caller
        emits it, outside any lock: subscribers may call back into us)."""
        self.memory_now, self.tasks_now = memory, tasks
        self.memory_peak = max(self.memory_peak, memory)
        self.tasks_peak = max(self.tasks_peak, tasks)
        if self.warn_memory is not None and memory >= self.warn_memory[0]:
            _threshold, limit, mech = self.warn_memory
            self.warn_memory = None  # once
            return {
                "field": "memory",
                "limit": limit,
                "observed": memory,
                "mechanism": mech,
                **(self.audit or {}),
            }
        return None


class _Worker:
    """A daemon thread, started at the first wake(), that runs `work`
    each time it is woken: for what a program can make long (a walk, a
    removal), off the supervisor's thread, whose timers end every
    sandbox."""

    def __init__(self, name: str, work: Callable[[], None]) -> None:
        self._name, self._work = name, work
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        self._ready.set()

    def _run(self) -> None:
        while True:
            self._ready.wait()
            self._ready.clear()  # a wake from now on sets it again
            try:
                self._work()
            except Exception:  # never let the thread die
                log.exception("%s: unexpected error", self._name)


class Monitor:
    """The supervisor thread and its state; one per process (get_monitor)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: set[Watch] = set()
        self._new_pumps: list[Pump] = []
        self._pumps: set[Pump] = set()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._idents = {self._wake_r: fd_ident(self._wake_r), self._wake_w: fd_ident(self._wake_w)}
        # Leaders' exits: pidfds in an epoll of their own, polled every
        # _EXIT_POLL while any is registered, not woken on: a sandbox that
        # ends normally is reaped by its Popen, and waking this thread on
        # each exit would race that reap for the GIL.  The poll only matters
        # when a leftover holds an output pipe open after the leader exited.
        # epoll_ctl is safe from any thread: spawning threads register.
        self._exits: Any = select.epoll() if _HAS_PIDFD else None
        self._by_pidfd: dict[int, Watch] = {}
        # Watches register() left to this thread to install (their event
        # fds are in already): watch -> (timers, counter files, firsts).
        self._pending: dict[Watch, tuple[bool, list[tuple[str, str]], list[bytes]]] = {}
        # Deadlines and samples: (due, seq, watch); an entry is live while
        # its due equals watch.heap_at (lazy deletion).
        self._heap: list[tuple[float, int, Watch]] = []
        self._seq = itertools.count()
        self._stale = 0
        # Cgroup events (Cgroup.open_events): fd -> (watch, field).
        self._events: Any = select.epoll() if hasattr(select, "epoll") else None
        self._by_event: dict[int, tuple[Watch, str]] = {}
        self._event_idents: dict[int, tuple[int, int]] = {}  # for close_in_child
        if self._events is not None:
            efd = self._events.fileno()
            self._sel.register(efd, selectors.EVENT_READ, _Dispatch(self._on_cgroup_events))
            self._idents[efd] = fd_ident(efd)
        # Counter files no event covers (v1 pids.events; any, past the fd
        # budget): read in one batch per interval, by path (no fd held):
        # gate -> {path: (watch, last, field)}.  A gate is the parent
        # cgroup's CPU counter: a fork or an allocation needs CPU, so while
        # the parent has used none, no counter moved (a hit not yet charged
        # is seen one interval later: counters stay).
        self._reads: dict[str | None, dict[str, tuple[Watch, bytes, str]]] = {}
        self._read_gate: dict[str, str | None] = {}  # path -> its gate
        self._gates: dict[str, bytes] = {}
        self._read_every = math.inf
        self._read_at = math.inf
        # Trees without a cgroup: every tree of an interval is sampled in
        # one sweep (one call into the core; an unchanged tree costs a
        # system call per process).  interval -> [members, next sweep].
        self._sweeps: dict[float, tuple[dict[Watch, None], list[float]]] = {}
        self._retiring: dict[Cgroup, float] = {}  # cgroup → give up after
        self._retiring_lock = threading.Lock()  # one _retire_tick at a time (ours, drain's)
        # Discarded workspaces, removed here (each with its sandbox's mount
        # namespace held, or -1).
        self._trash: list[tuple[str, int, _workspace.FinalSize | None]] = []
        self._emptying = 0  # threads removing what they took from _trash
        # Workspaces to measure (Watch, its walk so far, limit), by the sizer
        # thread (started at the first): a walk as long as the program
        # makes it, taken in turns.
        self._sizes: list[tuple[Watch, _workspace.Sizing, int]] = []
        self._sizer = _Worker("sbxlimit-sizer", self._measure_sizes)
        # What a program left in its workspace, removed by the janitor
        # thread (started at the first), not by the supervisor.
        self._trees: list[tuple[str, int, _workspace.FinalSize | None]] = []
        # Temp directories where this process made workspaces, looked
        # through once by the janitor for what dead owners left there.
        self._temp_dirs: set[str] = set()
        self._to_collect: list[str] = []
        self._janitor = _Worker("sbxlimit-janitor", self._janitor_work)
        self._pool = Pool()
        self._netpool = NsPool(CLONE_NEWNET)
        self._ipcpool = NsPool(CLONE_NEWIPC)
        self._nspools = {p.kind: p for p in (self._netpool, self._ipcpool)}
        self._wspool = _workspace.Pool()
        self._deferred: list[dict[str, Any]] = []  # audit warnings, emitted unlocked
        # Watches a waiting caller put off (defer): each is made here at its
        # due time unless its program exited first (take_back):
        # key -> (due, what makes and registers it).
        self._late: dict[object, tuple[float, Callable[[], None]]] = {}
        self._sleep_until = math.inf
        self._owed = False  # a take left a pool to refill: wake at settle()
        self.wakeups = 0  # loop iterations, for tests and benchmarks
        self._last_busy = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="sbxlimit-monitor", daemon=True)
        self._thread.start()

    # -- any thread -------------------------------------------------------

    def register(self, w: Watch, *, timers: bool, exit: bool) -> None:
        """Watch a sandbox: with `timers`, its deadlines and samples; with
        `exit`, its leader's exit, to end what it leaves behind at once
        (a leftover holding an output pipe would keep readers waiting).
        The caller then calls settle(), which wakes the thread if it must
        look at the watch sooner than it planned.

        What the kernel reports was opened and read ahead (Cgroup.arm), or
        there is no cgroup: the event fds go into the thread's epoll here
        (an OOM kill may come at once), and the thread itself installs the
        rest at its next pass, which comes before anything of it is due;
        most sandboxes end before that pass, and then cost the caller
        nothing more (unregister).  Else it is installed here, as it opens
        and reads now what must be read before the program runs."""
        pidfd = -1
        if exit and self._exits is not None:
            try:
                # Here, not at the pass: the caller may reap the pid by then.
                pidfd = os.pidfd_open(w.pid)
            except OSError:
                pidfd = -1
        w.pidfd = pidfd
        armed = _armed(w)
        events, reads, firsts = self._prepare(w, timers, armed_only=armed)
        with self._lock:
            if not armed:
                wake = self._install(w, timers, events, reads, firsts)
            else:
                self._install_events(w, events)
                self._pending[w] = (timers, reads, firsts)
                wake = w.due() < self._sleep_until
                wake = wake or (pidfd >= 0 and self._sleep_until > w.start + _EXIT_POLL)
        if wake:
            self._owed = True  # the caller's settle() wakes the thread

    def _prepare(
        self, w: Watch, timers: bool, armed_only: bool = False
    ) -> tuple[list[tuple[int, str]], list[tuple[str, str]], list[bytes]]:
        """What installing `w` opens and reads: its cgroup's event fds, the
        counter files no event covers, and their first contents (see
        _open_events for `armed_only`)."""
        events: list[tuple[int, str]] = []
        reads: list[tuple[str, str]] = []
        if timers and w.cgroup is not None:
            events, reads = self._open_events(w, armed_only)
        # A cgroup armed ahead read them while still empty (Cgroup.arm).
        base = w.cgroup.baselines if w.cgroup is not None else {}
        firsts = [base.pop(path, b"") or read_quiet(path) for path, _f in reads]
        return events, reads, firsts

    def _install(
        self,
        w: Watch,
        timers: bool,
        events: list[tuple[int, str]],
        reads: list[tuple[str, str]],
        firsts: list[bytes],
    ) -> bool:
        """(Lock held.)  Put `w` where the thread looks; True if the thread
        must look sooner than it planned."""
        wake = False
        self._install_events(w, events)
        if reads:
            assert w.cgroup is not None
            gate = w.cgroup.cpu_gate()
            if gate is not None:
                # Read at the next tick whatever the gate says: the program
                # may have run (and its counters moved) since the gate was
                # last read, before this watch was installed.
                self._gates[gate] = b""
            batch = self._reads.setdefault(gate, {})
            for (path, field), first in zip(reads, firsts, strict=True):
                batch[path] = (w, first, field)
                self._read_gate[path] = gate
                w.read_paths.append(path)
            self._read_every = min(self._read_every, w.interval)
            first_read = next_sample(w.start, w.interval)
            self._read_at = min(self._read_at, first_read)
            # This watch's own first read decides: an earlier one already
            # woke the thread (its pass may not have begun yet).
            wake = first_read < self._sleep_until
        if timers:
            self._watches.add(w)
            if w.tree_cache is not None and w.next_sample is not None:
                w.swept = True
                group = self._sweeps.get(w.interval)
                # Its first sample counts from its start, not from the
                # install (the thread's pass, up to an interval later).
                due = next_sample(w.start, w.interval)
                if group is None:
                    at = min(next_sample(time.monotonic(), w.interval), due)
                    group = self._sweeps[w.interval] = ({}, [at])
                    wake = wake or at < self._sleep_until
                elif due < group[1][0]:
                    group[1][0] = due
                    wake = wake or due < self._sleep_until
                group[0][w] = None
            self._schedule(w)
            wake = wake or w.due() < self._sleep_until
        if w.pidfd >= 0:
            self._by_pidfd[w.pidfd] = w
            self._exits.register(w.pidfd, select.EPOLLIN)
            wake = wake or self._sleep_until > w.start + _EXIT_POLL
        return wake

    def _install_events(self, w: Watch, events: list[tuple[int, str]]) -> None:
        # (Lock held.)  epoll_ctl is safe beside the thread's epoll_wait.
        for fd, field in events:
            w.event_fds.append(fd)
            if field != "eventfd":
                self._event_idents[fd] = fd_ident(fd)
            self._by_event[fd] = (w, field)
            mask = select.EPOLLIN if field == "eventfd" else select.EPOLLPRI
            self._events.register(fd, mask)

    def _close_pidfd(self, w: Watch) -> None:
        # (Lock held.)  One never given to the epoll (a pending watch's).
        if w.pidfd >= 0 and w.pidfd not in self._by_pidfd:
            os.close(w.pidfd)
            w.pidfd = -1

    def _open_events(
        self, w: Watch, armed_only: bool = False
    ) -> tuple[list[tuple[int, str]], list[tuple[str, str]]]:
        """The cgroup's event fds for what the kernel reports, and the
        counter files read in batch for the rest of memory and pids; what
        either covers is no longer sampled on its own.  `armed_only`: the
        program runs already, and a v1 OOM event registered now would miss
        those before: only the fds opened ahead, the rest read in batch
        against what the cgroup read while still empty (_armed)."""
        cg = w.cgroup
        assert cg is not None
        fields = [f for f, _l, _m in w.cg_ends if f in ("memory", "pids")]
        warn_at = None
        if w.warn_memory is not None and cg.site.version == 1:
            warn_at = w.warn_memory[0]
        if not fields and warn_at is None:
            return [], []
        covered: list[str] = []
        if self._events is not None and armed_only:
            covered = [f for f in fields if f in cg.armed]
        elif self._events is not None:
            covered = cg.open_events(fields, warn_at)
        reads = []
        for field in fields:
            path = cg.counter_file(field) if field not in covered else None
            if path is not None:
                reads.append((path, field))
                covered.append(field)
        w.warn_evented = "warn" in covered
        w.cg_sampled = tuple(e for e in w.cg_ends if e[0] not in covered)
        if not w.sampled():
            w.next_sample = None
        v1_memory = cg.site.version == 1
        # Only what this sandbox asked for (a cgroup armed ahead may hold
        # more: v1's one eventfd also carries the warning's threshold).
        wanted = set(covered) | ({"memory"} if w.warn_evented else set())
        events = [
            (fd, "eventfd" if field == "memory" and v1_memory else field)
            for fd, field in cg.events
            if field in wanted
        ]
        return events, reads

    def _drop_events(self, w: Watch) -> None:
        # Before the cgroup closes them (Cgroup.remove): a number reused by
        # another file must not be read as this sandbox's.
        for path in w.read_paths:
            if path in self._read_gate:
                del self._reads[self._read_gate.pop(path)][path]
        w.read_paths = []
        for fd in w.event_fds:
            self._event_idents.pop(fd, None)
            if self._by_event.pop(fd, None) is not None:
                try:
                    self._events.unregister(fd)
                except OSError:
                    pass
        w.event_fds = []

    def unregister(self, w: Watch) -> None:
        with self._lock:
            if self._pending.pop(w, None) is not None:
                w.done = True  # its events only were installed
                self._drop_events(w)
                self._close_pidfd(w)
                return
            self._watches.discard(w)
            self._unschedule(w)
            w.done = True
            self._drop_events(w)

    def defer(self, key: object, due: float, hand_over: Callable[[], None]) -> None:
        """Call `hand_over` on this thread at `due` (it makes and registers a
        watch of timers alone), unless take_back(key) comes first: most
        sandboxes end before anything of their watch is due, and then
        cost the caller no watch at all.  The caller then calls settle()."""
        with self._lock:
            self._late[key] = (due, hand_over)
            wake = due < self._sleep_until
        if wake:
            self._owed = True

    def take_back(self, key: object) -> bool:
        """True if `key`'s hand-over was still to come (it never will)."""
        # Under the lock: the thread iterates over the dict in its pass.
        with self._lock:
            return self._late.pop(key, None) is not None

    def add_pump(self, pump: Pump) -> None:
        """Pass `pump`'s output on from the caller's settle() on."""
        with self._lock:
            self._new_pumps.append(pump)
        self._owed = True

    def limit_kill(self, w: Watch, record: KillRecord, grace: float = 0.0) -> None:
        with self._lock:
            self._start_kill(w, record, grace)

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # already pending

    # -- lock held --------------------------------------------------------

    def _schedule(self, w: Watch) -> None:
        t = w.due()
        if t != w.heap_at:
            if w.heap_at != math.inf:
                self._stale += 1
            w.heap_at = t
            if t != math.inf:
                heapq.heappush(self._heap, (t, next(self._seq), w))

    def _leave_sweep(self, w: Watch) -> None:
        if w.swept:
            w.swept = False
            group = self._sweeps.get(w.interval)
            if group is not None:
                group[0].pop(w, None)
                if not group[0]:
                    del self._sweeps[w.interval]

    def _unschedule(self, w: Watch) -> None:
        self._leave_sweep(w)
        if w.heap_at != math.inf:
            w.heap_at = math.inf
            self._stale += 1
        # Entries of ended sandboxes can be due hours from now (wall_time):
        # rebuild once they are most of the heap.
        if self._stale > 64 and self._stale * 2 > len(self._heap):
            self._heap = [e for e in self._heap if e[0] == e[2].heap_at]
            heapq.heapify(self._heap)
            self._stale = 0

    def _next_due(self) -> float:
        h = self._heap
        while h and h[0][0] != h[0][2].heap_at:
            heapq.heappop(h)
            self._stale = max(0, self._stale - 1)
        return h[0][0] if h else math.inf

    def _start_kill(self, w: Watch, record: KillRecord, grace: float) -> None:
        if w.kill is not None:
            return  # the first reason wins
        if w.done or leader_exited(w.pid):
            if record.reason == "output":
                # Written past the cap before the end was seen: the verdict
                # is the limit's all the same (SPEC 2, the verdict rule),
                # whichever of the exit and the count came first.  The
                # caller reads it after the pump is done (communicate()).
                w.kill = record
                w.hits.add(record.reason)
            if not w.done:
                self._leader_exited(w)
            return
        w.kill = record
        w.hits.add(record.reason)
        sig = signal.SIGTERM if grace > 0 else signal.SIGKILL
        signal_tree(w.pid, sig, w.pgid, w.cgroup, until_empty=False)
        if grace > 0:
            w.sigkill_at = time.monotonic() + grace
        if w in self._watches:
            self._schedule(w)

    def _leader_exited(self, w: Watch) -> None:
        # The zombie leader still holds the group id: safe to signal it
        # (checked: reaped elsewhere, it holds nothing).
        if w.on_exit is not None:
            w.on_exit()
        w.done = True
        w.exited_at = time.monotonic()
        self._watches.discard(w)
        self._unschedule(w)
        self._drop_events(w)
        if w.cgroup is not None:
            # Not until empty: its caller does that at the reap.
            w.cgroup.kill(until_empty=False)
        elif w.pgid > 0 and _exit_state(w.pid):
            try:
                os.killpg(w.pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        elif w.pgid > 0:
            kill_group_left(w.pgid)

    def _tick(self, w: Watch, now: float) -> None:
        if w.done:
            return
        if w.sigkill_at is not None and now >= w.sigkill_at:
            w.sigkill_at = None
            if leader_exited(w.pid):
                self._leader_exited(w)
                return
            signal_tree(w.pid, signal.SIGKILL, w.pgid, w.cgroup, until_empty=False)
        if w.kill is None and w.deadline is not None and now >= w.deadline:
            assert w.wall_time is not None
            record = KillRecord(
                "wall_time", w.wall_time, round(now - w.start, 3), "watchdog:wall_time"
            )
            self._start_kill(w, record, w.grace)
        if w.recheck is not None and now >= w.recheck[0] and w.cgroup is not None:
            tries = w.recheck[1]
            w.recheck = None
            self._on_memory_event(w, w.cgroup, tries)
        if w.next_sample is not None and now >= w.next_sample and not w.swept:
            w.next_sample = next_sample(now, w.interval)
            if w.cgroup is not None:
                self._sample_cgroup(w, w.cgroup)
            if w.disk is not None and not w.done:
                self._sample_disk(w, *w.disk)

    def _sweep(self, interval: float, now: float) -> None:
        """Sample every tree of this interval's sweep."""
        members, at = self._sweeps[interval]
        at[0] = next_sample(now, interval)
        ws, trees = [], []
        for w in members:
            if w.tree_cache is not None and not w.done:
                ws.append(w)
                trees.append((w.pid, w.reaper, w.tree_cache))
        for w, r in zip(ws, _core.tree_sample_many(trees), strict=True):
            w.sampled_at = now  # None: the cache answered, the figures stand
            if isinstance(r, tuple):
                self._sample(w, r)
            elif r is not None:  # unreadable: nothing more to sample
                w.next_sample = None
                self._leave_sweep(w)
                continue
            if w.disk is not None and not w.done:
                self._sample_disk(w, *w.disk)

    def _sample(self, w: Watch, sample: tuple[int, int, int, float, float, bool]) -> None:
        memory, tasks, _procs, user, system, alive = sample
        if not alive:
            self._leader_exited(w)
            return
        self._defer_warning(w.observe(memory, tasks))
        if user + system > sum(w.cpu_seen):
            w.cpu_seen = (user, system)
        if w.kill is not None:
            return
        if w.memory_limit is not None and memory > w.memory_limit:
            self._start_kill(w, KillRecord("memory", w.memory_limit, memory, "watchdog:memory"), 0)
        elif w.pids_limit is not None and tasks > w.pids_limit:
            self._start_kill(w, KillRecord("pids", w.pids_limit, tasks, "watchdog:pids"), 0)
        elif w.cpu_time is not None and user + system >= w.cpu_time:
            used = round(user + system, 3)
            self._start_kill(w, KillRecord("cpu_time", w.cpu_time, used, "watchdog:cpu_time"), 0)

    def _sample_cgroup(
        self, w: Watch, cg: Cgroup, ends: tuple[tuple[str, float, str], ...] | None = None
    ) -> None:
        """Read the counters of `ends` (default: those sampled) and end the
        sandbox on a hit; the memory warning's figures too, when due."""
        if ends is None:
            ends = w.cg_sampled
            warn = w.warn_memory is not None and not w.warn_evented
        else:
            warn = w.warn_memory is not None and any(f == "memory" for f, _l, _m in ends)
        if warn:
            st = cg.stats(evidence=False)
            self._defer_warning(w.observe(st.memory_now or 0, st.pids_now or 0))
        if not ends:
            return
        oom_kills, refused, cpu = cg.counters(f for f, _l, _m in ends)
        if oom_kills:
            w.counts["memory"] = oom_kills
            w.hits.add("memory")
        if refused:
            w.counts["pids"] = refused
            w.hits.add("pids")
        if w.kill is not None:
            return
        for field, limit, mech in ends:
            if field == "memory" and oom_kills:
                peak = cg.stats(evidence=False).memory_peak or w.memory_peak or None
                record = KillRecord("memory", limit, peak, mech, str(oom_kills))
            elif field == "pids" and refused:
                record = KillRecord("pids", limit, int(limit) + 1, mech, str(refused))
            elif field == "cpu_time" and cpu is not None and cpu >= limit:
                record = KillRecord("cpu_time", limit, round(cpu, 3), mech)
            else:
                continue
            self._start_kill(w, record, 0)
            return

    def _sample_disk(self, w: Watch, path: str | int, limit: int) -> None:
        if isinstance(path, int):
            try:
                used = _workspace.tmpfs_usage(path)[0]
            except OSError:  # closed by close(): nothing left to watch
                return
            self._disk_used(w, used, limit, "tmpfs:size")
            return
        # A tree's size is a walk as long as the program makes it (empty
        # files cost no blocks: a million of them fit any limit).  Not
        # here, where every sandbox's timers wait: the sizer thread walks
        # it, and judges what it found when it is done.
        if w.sizing:
            return
        w.sizing = True
        self._sizes.append((w, _workspace.Sizing(path), limit))
        self._sizer.wake()

    def _measure_sizes(self) -> None:
        """The sizer thread's: walk each workspace asked for, then judge.
        The walks take turns, _SIZE_TURN at a time, each going on from
        where it stopped: a program that makes its tree grow ahead of its
        walk holds its own sample, not every sandbox's."""
        while True:
            with self._lock:
                if not self._sizes:
                    return
                w, size, limit = self._sizes.pop(0)
            try:
                used = None if w.done else size.run(time.monotonic() + _SIZE_TURN)
            except BaseException:
                size.close()
                with self._lock:
                    w.sizing = False
                raise
            with self._lock:
                if used is None and not w.done:
                    self._sizes.append((w, size, limit))  # its next turn
                    continue
                w.sizing = False
                if used is not None and not w.done:
                    self._disk_used(w, used, limit, "watchdog:disk")
            size.close()
            self._flush_warnings()

    def _disk_used(self, w: Watch, used: int, limit: int, mech: str) -> None:
        """Judge a sample of the workspace's size (lock held)."""
        w.disk_used = max(w.disk_used, used)
        if used >= limit:
            w.hits.add("disk")
        if w.warn_disk is not None and used >= w.warn_disk:
            w.warn_disk = None  # once
            fields = {"field": "disk", "limit": limit, "observed": used}
            self._defer_warning({**fields, "mechanism": mech, **(w.audit or {})})
        if w.kill is None and w.disk_ends and used > limit:
            self._start_kill(w, KillRecord("disk", limit, used, mech), 0)

    def _defer_warning(self, fields: dict[str, Any] | None) -> None:
        if fields is not None:
            self._deferred.append(fields)

    def take_cgroup(
        self, site: Site, settings: tuple[tuple[str, str, str], ...], name: Callable[[], str]
    ) -> Cgroup | None:
        """A cgroup made ahead of need (see _cgpool), or None; the next is
        made here, while the caller waits for its child."""
        cg, left = self._pool.take(site, settings, name)
        # The pool is now short of this kind (unless closed).  Waking a
        # sleeping thread costs the caller tens of µs: only when the next
        # spawn of this kind would find none ready, or when the loop would
        # not pass by soon anyway.
        if left == 0 or (left > 0 and self._sleeps_long()):
            self._owed = True
        return cg

    def take_workspace(self, sandbox_id: str) -> str | None:
        """A private workspace made ahead of need (_workspace.Pool), renamed
        for `sandbox_id`, or None."""
        path = self._wspool.take(sandbox_id)
        if self._wspool.wanted() and (not self._wspool.has_ready() or self._sleeps_long()):
            self._owed = True
        return path

    def keep_views(self) -> None:
        """A spawn copied a view kept for the next (_viewns): the thread
        lets it go once unused for _viewns.IDLE; wake it at settle() if it
        would not look before."""
        if self._sleeps_long():
            self._owed = True

    def take_ns(self, kind: int) -> int:
        """A namespace of `kind` (CLONE_NEWNET, CLONE_NEWIPC) made ahead of
        need (see _nspool), or -1."""
        pool = self._nspools[kind]
        fd = pool.take()
        if pool.wanted() and (not pool.has_ready() or self._sleeps_long()):
            self._owed = True
        return fd

    def settle(self) -> None:
        """The caller's child exists and is registered: wake the thread,
        once, for what the takes above left to refill and what register()
        and add_pump() gave it.  Not at the take itself: woken then, the
        refill competes with the spawn for the GIL and the second core;
        now it runs while the caller waits for its child."""
        if self._owed:
            self._owed = False
            self._wake()

    def _sleeps_long(self) -> bool:
        return self._sleep_until > time.monotonic() + _SOON

    def retire(self, cg: Cgroup) -> None:
        """Read `cg`'s final figures, then remove it once it is empty (a
        killed cgroup takes a few ms)."""
        with self._lock:
            for fd, _f in cg.events:
                entry = self._by_event.get(fd)
                if entry is not None:
                    self._drop_events(entry[0])
            self._retiring[cg] = time.monotonic() + _RETIRE_FOR
            wake = self._sleeps_long()
        if wake:
            self._wake()

    def remove_workspace(
        self, path: str, mounts: int = -1, final_size: _workspace.FinalSize | None = None
    ) -> bool:
        """Remove a closed sandbox's workspace: renamed away now (its path
        is gone when this returns), removed by this thread (or, holding
        what the program left, by the janitor thread), after it lets go of
        the sandbox's mount namespace (`mounts`, an fd from
        _namespaces.hold_mounts, or -1), and after it measured
        `final_size` if nobody asked for it yet.  False if the path is
        still there (the rename failed, and so did the removal)."""
        trash = _workspace.discard(path, final_size)
        if trash is None:
            _namespaces.release_mounts(mounts)
            return not os.path.lexists(path)
        with self._lock:
            self._trash.append((trash, mounts, final_size))
            wake = self._sleeps_long()
        if wake:
            self._wake()
        return True

    def _collect_leftover_workspaces(self) -> None:
        """(This thread, where workspaces are made.)  Once per temp
        directory: the janitor takes what dead owners left there."""
        tmp = tempfile.gettempdir()
        if tmp in self._temp_dirs:
            return
        self._temp_dirs.add(tmp)
        with self._lock:
            self._to_collect.append(tmp)
        self._janitor.wake()

    def _janitor_work(self) -> None:
        with self._lock:
            dirs, self._to_collect = self._to_collect, []
        for tmp in dirs:
            collect_workspaces(tmp, locked_only=True)
        self._empty_trash(self._trees)

    def _empty_trash(self, which: list[tuple[str, int, _workspace.FinalSize | None]]) -> None:
        """Remove what `which` (_trash or _trees) holds now."""
        with self._lock:
            trash = which[:]
            del which[:]
            self._emptying += 1
        trees: list[tuple[str, int, _workspace.FinalSize | None]] = []
        try:
            trees = self._remove_trash(trash, bare_only=which is self._trash)
        finally:
            with self._lock:
                self._emptying -= 1
                # A program decides how many files it leaves (a million
                # take seconds to remove): not the supervisor's, whose
                # timers end every other sandbox.
                self._trees += trees
        if trees:
            self._janitor.wake()

    def _remove_trash(
        self, trash: list[tuple[str, int, _workspace.FinalSize | None]], *, bare_only: bool
    ) -> list[tuple[str, int, _workspace.FinalSize | None]]:
        """Remove each workspace; `bare_only`: only those holding nothing
        but their empty tmp/ (the usual one), the rest returned."""
        trees = []
        for path, mounts, final_size in trash:
            # Its namespace's teardown first: a workspace still mounted in
            # a live namespace costs its removal an unmount there.
            _namespaces.let_go_of_mounts(mounts)
            # The usual workspace (its empty tmp/) measured and removed in
            # one core call, the GIL released once; under the size's lock,
            # so that a caller asking meanwhile waits for the figure.  This
            # thread never waits for it (a caller measuring a tree holds
            # it): the janitor takes the workspace then.
            lock = final_size.lock if final_size is not None else None
            if lock is not None and not lock.acquire(blocking=not bare_only):
                trees.append((path, -1, final_size))
                continue
            try:
                got = (
                    _core.fs_batch([(_RM_WORKSPACE, path, None)], False)[0] if _RM_WORKSPACE else 0
                )
                if type(got) is tuple:
                    if final_size is not None:
                        final_size.put(got[0])
                    _workspace.forget(path)
                    continue
            finally:
                if lock is not None:
                    lock.release()
            if bare_only and not (_RM_WORKSPACE == 0 and _workspace.bare(path)):
                trees.append((path, -1, final_size))
                continue
            # A tree the program left, the long way.
            if final_size is not None:
                final_size.get()  # the sandbox's outcome asks for it
            _workspace.remove(path)
        return trees

    def _retire_tick(self, now: float) -> bool:
        """Read the retired cgroups' final figures, then remove them; True
        when none is left.  Not under the lock: the reads and rmdirs take
        a few hundred µs, and a caller takes the lock to spawn."""
        with self._retiring_lock:
            with self._lock:
                due = list(self._retiring.items())
            done = []
            for cg, until in due:
                cg.final()  # the figures the sandbox's outcome asks for, read before they go
                if cg.remove():
                    done.append(cg)
                elif now > until:
                    done.append(cg)
                    log.warning("sbxlimit: cgroup %s still busy; `sbxlimit gc` removes it", cg.name)
                else:
                    # Without the freezer: a freeze that never completes
                    # would keep this thread, and every other sandbox's
                    # timers, for seconds at each tick.
                    cg.kill(until_empty=False)
            with self._lock:
                for cg in done:
                    del self._retiring[cg]
                return not self._retiring

    def drain(self, timeout: float, *, close: bool = False) -> bool:
        """Remove the cgroups made ahead of need (`close`: make no more), and
        wait until every retired cgroup is removed; True if none is left.
        The Landlock rulesets, the protected paths' listings, the /dev
        template and the views' namespaces kept for the next spawn go too,
        and the mount namespaces released so far."""
        from ._devtree import drop as drop_dev_template
        from ._landlock import drop_rulesets
        from ._namespaces import flush_mounts
        from ._protected import drop_listings

        drop_rulesets()
        drop_dev_template()
        _viewns.drop()
        drop_listings()
        flush_mounts(timeout)
        self._pool.drain(close=close)
        for ns in self._nspools.values():
            ns.drain(close=close)
        self._wspool.drain(close=close)
        self._empty_trash(self._trash)
        self._empty_trash(self._trees)
        end = time.monotonic() + timeout
        while True:
            with self._lock:
                # Workspaces still to remove, or being removed by the
                # supervisor or the janitor (their namespaces let go of
                # first): not gone.
                trash = bool(self._trash) or bool(self._trees)
                emptying = self._emptying > 0
            if not trash and not emptying and self._retire_tick(time.monotonic()):
                return True
            if time.monotonic() >= end:
                return False
            if trash:
                self._empty_trash(self._trash)
                self._empty_trash(self._trees)
            else:
                time.sleep(0.005)

    # -- monitor thread -----------------------------------------------------

    def _on_exits(self) -> None:
        for fd, _ev in self._exits.poll(0):
            with self._lock:
                w = self._by_pidfd.pop(fd, None)
                try:
                    self._exits.unregister(fd)
                except OSError:
                    pass
                os.close(fd)
                if w is not None:
                    w.pidfd = -1
                    # Not done: its Popen has not reaped it (that needs this
                    # lock), so the zombie still pins the group id.
                    if not w.done:
                        self._leader_exited(w)

    def _on_cgroup_events(self, _fd: int) -> None:
        for fd, _ev in self._events.poll(0):
            with self._lock:
                entry = self._by_event.get(fd)
                if entry is None:
                    continue
                w, field = entry
                try:  # re-arm: an eventfd is read, a kernfs file read again
                    if field == "eventfd":
                        os.read(fd, 8)
                    else:
                        os.pread(fd, 4096, 0)
                except OSError:
                    pass
                self._counter_moved(w, "memory" if field == "eventfd" else field)
        self._flush_warnings()

    def _counter_moved(self, w: Watch, field: str) -> None:
        """The kernel said (an event, or a changed file in the batch read)
        that `field`'s counter may have moved: judge it now."""
        cg = w.cgroup
        if w.done or cg is None:
            return
        if field == "memory":
            self._on_memory_event(w, cg, _RECHECKS)
        else:
            self._sample_cgroup(w, cg, tuple(e for e in w.cg_ends if e[0] == field))
        if w in self._watches:
            self._schedule(w)

    def _on_memory_event(self, w: Watch, cg: Cgroup, tries: int) -> None:
        # v1's eventfd: an OOM (signalled before the kill is counted) or the
        # warning's threshold crossed.
        ends = tuple(e for e in w.cg_ends if e[0] == "memory")
        self._sample_cgroup(w, cg, ends)
        if ends and w.kill is None and tries > 0 and not w.done:
            w.recheck = (time.monotonic() + _RECHECK_AFTER, tries - 1)

    def _read_tick(self, now: float) -> None:
        """The counter files no event covers, in one pass: a changed file is
        a refused fork or an OOM kill (read and judged by _sample_cgroup)."""
        moved: dict[str | None, bool] = {None: True}
        for path, last in list(self._gates.items()):
            used = read_quiet(path)
            moved[path] = used != last or not used
            self._gates[path] = used
        changed = []
        for gate, group in self._reads.items():
            if not moved.get(gate, True):
                continue
            for path, (w, last, field) in group.items():
                data = read_quiet(path)
                if data != last and data:
                    changed.append((group, path, w, data, field))
        for group, path, w, data, field in changed:
            group[path] = (w, data, field)
            self._counter_moved(w, field)
        if self._read_gate:
            self._read_at = next_sample(now, self._read_every)
        else:
            self._read_at = self._read_every = math.inf
            self._gates.clear()
            self._reads.clear()

    def _flush_warnings(self) -> None:
        with self._lock:
            deferred, self._deferred = self._deferred, []
        for fields in deferred:
            audit.emit("resource_warning", **fields)

    def _pump_done(self, pump: Pump) -> None:
        self._pumps.discard(pump)

    def _run(self) -> None:
        while True:
            try:
                self._loop_once()
            except Exception:  # never let the supervisor die
                log.exception("sbxlimit monitor: unexpected error")
                time.sleep(0.01)

    def _loop_once(self) -> None:
        self.wakeups += 1
        with self._lock:
            # What register() left: armed ahead, so opening and reading
            # nothing here (_armed); before the due time is computed.
            pending, self._pending = self._pending, {}
            for w, (timers, reads, firsts) in pending.items():
                if w.done:  # unregistered meanwhile
                    self._close_pidfd(w)
                    continue
                try:
                    self._install(w, timers, [], reads, firsts)
                except Exception:
                    # This watch's alone: the others of the pass still go in.
                    log.exception("sbxlimit monitor: a sandbox's watch could not be installed")
            new, self._new_pumps = self._new_pumps, []
            now = time.monotonic()
            due = min(self._next_due(), self._read_at)
            for _members, at in self._sweeps.values():
                due = min(due, at[0])
            for late_at, _hand_over in self._late.values():
                due = min(due, late_at)
            if self._retiring or self._trash:
                due = min(due, now + _RETIRE_TICK)
            pool_due = now if self._pool.wanted() else self._pool.next_expiry()
            ns_due = [now if ns.wanted() else ns.next_expiry() for ns in self._nspools.values()]
            ws_due = now if self._wspool.wanted() else self._wspool.next_expiry()
            if ws_due is not None:
                due = min(due, ws_due)
            views_due = _viewns.next_expiry()
            if views_due is not None:
                due = min(due, views_due)
            if pool_due is not None:
                due = min(due, pool_due)
            for when in ns_due:
                if when is not None:
                    due = min(due, when)
            if self._watches or self._by_pidfd or self._retiring or self._late:
                self._last_busy = now
            elif now - self._last_busy < _LINGER:
                # On the sampling grid: a sandbox registered meanwhile has
                # its first sample on the same grid, no earlier than this
                # pass (with the default interval), so it need not wake us.
                due = next_sample(now, _IDLE_TICK)
            if self._by_pidfd:
                due = min(due, now + _EXIT_POLL)
            self._sleep_until = due
        for pump in new:
            self._pumps.add(pump)
            pump.attach(self._sel)
        timeout = None if due == math.inf else max(0.0, due - now)
        for key, _mask in self._sel.select(timeout):
            if key.data is None:
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
                continue
            key.data.on_event(key.fd)
        if self._by_pidfd:
            self._on_exits()
        with self._lock:
            now = time.monotonic()
            while self._heap and self._heap[0][0] <= now:
                t, _seq, w = heapq.heappop(self._heap)
                if t != w.heap_at:
                    self._stale = max(0, self._stale - 1)
                    continue
                w.heap_at = math.inf
                self._tick(w, now)
                self._schedule(w)
            if self._read_at <= now:
                self._read_tick(now)
            for interval, (_members, at) in list(self._sweeps.items()):
                if at[0] <= now:
                    self._sweep(interval, now)
            retiring, trash = bool(self._retiring), bool(self._trash)
            ripe = [k for k, (late_at, _h) in self._late.items() if late_at <= now]
            hand_overs = [self._late.pop(k)[1] for k in ripe]
        for hand_over in hand_overs:  # unlocked: it registers a watch
            try:
                hand_over()
            except Exception:
                log.exception("sbxlimit monitor: a sandbox's watch could not be made")
        if retiring:
            self._retire_tick(now)  # unlocked: reads and rmdirs take a while
        if trash:
            self._empty_trash(self._trash)  # unlocked: rmdirs take a while
        self._flush_warnings()
        if pool_due is not None and pool_due <= now:
            self._pool.work(now)  # unlocked: mkdirs and writes take a while
        for ns, when in zip(self._nspools.values(), ns_due, strict=True):
            if when is not None and when <= now:
                ns.work(now)
        if ws_due is not None and ws_due <= now:
            self._wspool.work(now)
            self._collect_leftover_workspaces()
        if views_due is not None and views_due <= now:
            _viewns.expire(now)

    def close_in_child(self) -> None:
        """After os.fork() (or a preexec_fn fork): the thread is gone;
        release what the child inherited.  Runs without the lock (the
        parent's monitor may have been mid-way), so a number is closed only
        if it still refers to our file: right after the monitor closed an
        fd, another thread may have been given the same number."""
        owned: dict[int, Any] = dict(self._idents)
        for p in list(self._pumps) + list(self._new_pumps):
            owned.update(p.idents)
        for fd in list(self._by_pidfd):
            owned[fd] = "pidfd"
        # Watches not installed yet: their pidfds, and every event fd their
        # cgroup was armed with (those it watches are in _by_event already).
        for w in list(self._pending):
            if w.pidfd >= 0:
                owned[w.pidfd] = "pidfd"
            if w.cgroup is not None:
                events = {fd for fd, _f in w.cgroup.events}
                owned.update((fd, i) for fd, i in w.cgroup.owned_fds().items() if fd in events)
        for ns in self._nspools.values():
            for fd in ns.owned():
                owned[fd] = ns.name
        owned.update(self._pool.owned())  # ready cgroups' dirfds, join files, event fds
        for cg in list(self._retiring):  # ended sandboxes' cgroups, not yet removed
            owned.update(cg.owned_fds())
        for fd, (_w, field) in list(self._by_event.items()):
            owned[fd] = "eventfd" if field == "eventfd" else self._event_idents.get(fd)
        # What the thread had open for a moment at the fork (a limit
        # written, a counter read, in a core call): any file in a cgroup
        # directory of ours.
        dirs = self._pool.dirs()
        watched = [*self._watches, *self._pending]
        for cg in [*self._retiring, *(w.cgroup for w in watched if w.cgroup)]:
            dirs.update(cg.dirs.values())
        if dirs:
            _close_files_in(dirs, keep=set(owned))
        for fd, ident in owned.items():
            try:
                if ident in ("pidfd", "eventfd"):
                    same = os.readlink(f"/proc/self/fd/{fd}") == f"anon_inode:[{ident}]"
                elif ident in ("net", "ipc"):  # a namespace made ahead: "net:[inode]"
                    same = os.readlink(f"/proc/self/fd/{fd}").startswith(f"{ident}:[")
                elif ident is None:
                    same = False
                else:
                    same = fd_ident(fd) == ident
                if same:
                    os.close(fd)
            except OSError:
                pass


def _close_files_in(dirs: set[str], keep: set[int]) -> None:
    """Close the fds on `dirs` and on files directly in them (a forked
    child's), but those in `keep` (closed only if they still are what they
    were)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in names:
        fd = int(name)
        if fd in keep:
            continue
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
            if path in dirs or os.path.dirname(path) in dirs:
                os.close(fd)
        except OSError:
            pass


_monitor: Monitor | None = None
_monitor_lock = threading.Lock()


def get_monitor() -> Monitor:
    global _monitor
    m = _monitor
    if m is None:
        with _monitor_lock:
            if _monitor is None:
                _monitor = Monitor()
                watch_multiprocessing()
            m = _monitor
    return m


def settle_monitor() -> None:
    """See Monitor.settle (nothing to do if no monitor runs)."""
    m = _monitor
    if m is not None:
        m.settle()


def _after_fork_in_child() -> None:
    global _monitor, _monitor_lock
    if _monitor is not None:
        _monitor.close_in_child()
    _monitor = None
    _monitor_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def drain_before_exit() -> None:
    """This process ends: remove the cgroups made ahead of need, and those
    of killed sandboxes (they empty within milliseconds).  At interpreter
    exit, and before a forked body's os._exit (no atexit runs there)."""
    if _monitor is not None:
        _monitor.drain(2.0, close=True)


def _drain_at_exit() -> None:
    drain_before_exit()


at_exit(DRAIN)(_drain_at_exit)
