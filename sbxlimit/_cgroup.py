"""Cgroup placement: where sandboxes' cgroups may go, and one per sandbox.

``discover()`` finds a parent under which this process may create cgroups
(cgroup v2 first, v1 as the fallback) and says why when there is none.
``Cgroup`` is one sandbox's cgroup: created and limited in the parent before
the spawn, joined by the child as its first step (or at birth, with
``clone3(CLONE_INTO_CGROUP)``), read for evidence and usage, killed as a
whole, and removed once empty.

Rules kept here, and why:

* Nothing sbxlimit did not create is modified: limits are written only into
  ``sbx-*`` cgroups and the ``sbxlimit`` grouping cgroup we make at a
  hierarchy root; a delegated parent's ``cgroup.subtree_control`` is written
  only when asked (``SBXLIMIT_CGROUP_MOVE_SELF=1``), since that requires
  moving this process into a leaf (cgroup v2's no-internal-process rule).
* The simple file I/O is Python, as psutil does it; the child's move into
  the cgroup and the statfs probe are C (csrc/linux/cgroup.c).
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import math
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable

from . import _core, _owner, _sentinel
from ._cgroupfs import mounts, own_cgroups
from ._exit import CGROUPS, at_exit
from ._once import Once
from ._plan import Holder, Plan, Request
from ._pump import fd_ident

__all__ = [
    "GROUP_DIR",
    "SUPERVISOR_LEAF",
    "Cgroup",
    "CgroupStats",
    "Site",
    "discover",
    "fd_budget",
    "move_self_to_leaf",
    "warn_explicit_site",
]

GROUP_DIR = "sbxlimit"  # made by root at a hierarchy root, holds sbx-* cgroups
SUPERVISOR_LEAF = "sbx-supervisor"  # where move_self_to_leaf puts this process
_WANTED = ("memory", "pids", "cpu")
# v1: the limit controllers, plus cpuacct for CPU usage and freezer for a
# tree kill that a fork loop cannot outrun (where no pids controller can
# stop the loop instead: Cgroup._block_forks).
_V1 = ("memory", "pids", "cpu", "cpuacct", "freezer")
log = logging.getLogger("sbxlimit")
# A step of _core.fs_batch and what it gives back.
_Step = tuple[int, str, bytes | None] | tuple[int, str, bytes | None, int]
_Result = int | bytes | tuple[int, int] | tuple[int]
# kill(until_empty=False): listings at most (each kills what forked since).
_QUICK_PASSES = 20


def _v1_unneeded(site: Site, settings: Iterable[tuple[str, str, str]]) -> frozenset[str]:
    """The v1 hierarchies a sandbox cgroup can do without (every directory
    costs a mkdir, the child's join and an rmdir): cpu without a cpu limit
    (cpuacct counts usage), the freezer where the pids controller can stop
    a kill's fork loop (Cgroup._block_forks)."""
    if site.version != 1:
        return frozenset()
    unneeded = set()
    if all(c != "cpu" for c, _f, _v in settings):
        unneeded.add("cpu")
    if any(c == "pids" for c, _p in site.parents):
        unneeded.add("freezer")
    return frozenset(unneeded)


def _send(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass  # gone already, or (v1) not ours to signal


@dataclasses.dataclass(frozen=True, slots=True)
class Site:
    """Where this process creates sandbox cgroups.

    version: 2, 1, or 0 when no cgroup can be used (``reason`` says why).
    parents: (controller, directory) pairs; controller is "" for v2.
    controllers: the limits it can hold: a subset of memory, pids, cpu.
    swap: memory.swap.max (v2) or memory.memsw.* (v1) exists.
    reason: why cgroups are missing or partial, with the fix; "" when whole.
    """

    version: int
    parents: tuple[tuple[str, str], ...] = ()
    controllers: frozenset[str] = frozenset()
    swap: bool = False
    reason: str = ""
    explicit: bool = False  # chosen by SBXLIMIT_CGROUP_PARENT or cgroup_parent

    def has(self, controller: str) -> bool:
        return controller in self.controllers

    @property
    def label(self) -> str:
        return f"cgroup{self.version}"


NO_SITE = Site(0, reason="cgroups not considered")


def why_not(site: Site, controller: str) -> str:
    """Why no cgroup holds limits of `controller` here."""
    if site.version:
        return f"the {controller} controller is not available here ({site.reason})"
    return f"no cgroup can be used: {site.reason}"


def read_quiet(path: str) -> bytes:
    """A counter file's bytes, or b"" (gone, unreadable): compared whole
    from one read to the next."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.read(fd, 4096)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _read(path: str) -> str:
    # os-level I/O: io.open's layers cost more than the three system calls,
    # and usage() reads several of these files per sandbox.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        return os.read(fd, 65536).decode()
    except OSError:
        return ""
    finally:
        os.close(fd)


def fd_budget() -> int:
    """The fd number from which sbxlimit holds nothing of its own for long:
    the last quarter of the table is the caller's."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return sys.maxsize if soft == resource.RLIM_INFINITY else soft * 3 // 4


def _writable(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)


def _fs_kind(path: str) -> int:
    try:
        return int(_core.cgroup_fs_kind(path))
    except OSError:
        return 0


def _enabled(path: str) -> set[str]:
    return set(_read(os.path.join(path, "cgroup.subtree_control")).split()) & set(_WANTED)


def _ensure_group_dir(root: str, controllers: Iterable[str]) -> str:
    """root/sbxlimit, ours, holding no processes: controllers may be enabled
    in it.  Raises OSError."""
    path = os.path.join(root, GROUP_DIR)
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        pass
    want = set(controllers) - _enabled(path)
    if want and root != path:
        with open(os.path.join(path, "cgroup.subtree_control"), "w") as f:
            f.write(" ".join(f"+{c}" for c in sorted(want)))
    return path


def _v2_site(mount: str, explicit: str | None) -> Site:
    if explicit is not None:
        enabled = _enabled(explicit)
        if not _writable(explicit):
            return Site(0, reason=f"cannot create cgroups in {explicit} (not writable)")
        if not enabled:
            return Site(
                0,
                reason=f"{explicit} has none of memory, pids, cpu in cgroup.subtree_control; "
                f'enable them: echo "+memory +pids +cpu" > {explicit}/cgroup.subtree_control',
            )
        return _v2_result(explicit, enabled)
    own = os.path.join(mount, own_cgroups().get("", "/").lstrip("/")).rstrip("/") or mount
    # After move_self_to_leaf: our leaf's parent is the delegated subtree.
    if os.path.basename(own) == SUPERVISOR_LEAF:
        parent = os.path.dirname(own)
        enabled = _enabled(parent)
        if enabled and _writable(parent):
            return _v2_result(parent, enabled)
    # A delegated cgroup holding this process, when asked to use it.
    delegated = set(_read(os.path.join(own, "cgroup.controllers")).split()) & set(_WANTED)
    is_delegated = bool(delegated) and _writable(own) and own != mount
    if is_delegated and os.environ.get("SBXLIMIT_CGROUP_MOVE_SELF") == "1":
        try:
            return _v2_result(move_self_to_leaf(), delegated)
        except OSError as e:
            return Site(0, reason=f"cannot move into a leaf of {own}: {e.strerror}")
    # Root of the hierarchy (root, or a writable cgroup namespace root whose
    # controllers are enabled): a grouping cgroup of our own.
    avail = _enabled(mount)
    if avail and _writable(mount):
        try:
            return _v2_result(_ensure_group_dir(mount, avail), avail)
        except OSError as e:
            return Site(0, reason=f"cannot prepare {mount}/{GROUP_DIR}: {e.strerror}")
    if is_delegated:
        return Site(
            0,
            reason=f"{own} is delegated to this user but holds this process, so cgroup v2 "
            "forbids enabling controllers in it; set SBXLIMIT_CGROUP_MOVE_SELF=1 to move "
            f"this process into {own}/{SUPERVISOR_LEAF} and use {own}",
        )
    return Site(
        0,
        reason="no writable cgroup v2 subtree with memory, pids or cpu (needs root or "
        "a delegated cgroup: see docs/cgroups.md)",
    )


def _v2_result(parent: str, enabled: set[str]) -> Site:
    missing = set(_WANTED) - enabled
    # A parent that is not the root has the file when swap is accounted.
    swap = "memory" in enabled and os.path.exists(os.path.join(parent, "memory.swap.max"))
    return Site(
        2,
        (("", parent),),
        frozenset(enabled),
        swap,
        f"{', '.join(sorted(missing))} not enabled in {parent}/cgroup.subtree_control"
        if missing
        else "",
    )


def _v1_site(explicit: str | None) -> Site:
    own = own_cgroups()
    rel = None
    if explicit is not None:
        for point, kind, _opts in mounts():
            if kind == "cgroup" and (explicit + "/").startswith(point.rstrip("/") + "/"):
                rel = os.path.relpath(explicit, point)
                break
        if rel is None:
            return Site(0, reason=f"{explicit} is not in a cgroup hierarchy")
    parents: list[tuple[str, str]] = []
    problems: list[str] = []
    unwritable: list[str] = []
    for ctrl in _V1:
        found = next((p for p, k, o in mounts() if k == "cgroup" and ctrl in o), None)
        if found is None:
            problems.append(f"{ctrl}: not mounted")
            continue
        point = found
        if rel is not None:
            parent = os.path.normpath(os.path.join(point, rel))
        else:
            mine = own.get(ctrl, "/")
            parent = os.path.join(point, mine.lstrip("/")) if mine != "/" else point
        try:
            if parent == point and rel is None:
                if not _writable(point):
                    unwritable.append(ctrl)
                    continue
                parent = _ensure_group_dir(point, ())
            elif not _writable(parent):
                unwritable.append(ctrl)
                continue
        except OSError as e:
            problems.append(f"{ctrl}: {e.strerror}")
            continue
        parents.append((ctrl, parent))
    if unwritable:
        problems.append(
            f"{', '.join(unwritable)} not writable by this user (v1 cgroups need root "
            "or a cgroup prepared for this user)"
        )
    have = frozenset(c for c, _p in parents if c in _WANTED)
    if not have:
        return Site(0, reason="; ".join(problems) or "no v1 controllers")
    mem = dict(parents).get("memory")
    swap = mem is not None and os.path.exists(os.path.join(mem, "memory.memsw.limit_in_bytes"))
    return Site(1, tuple(parents), have, swap, "; ".join(problems))


_cache: dict[tuple[object, ...], Site] = {}
_cache_lock = threading.RLock()  # move_self_to_leaf clears the cache inside discover()
_collected = False


def discover(cgroup_parent: str | None = None) -> Site:
    """The site sandboxes go to: `cgroup_parent`, else $SBXLIMIT_CGROUP_PARENT,
    else the first safe candidate (v2 first).  ``"none"`` turns cgroups off.
    Cached per argument and environment."""
    data = getattr(os.environ, "_data", None)
    if type(data) is dict and os.name == "posix":
        # os.environ's own bytes, read without the KeyError that
        # os.environ.get raises inside for a name not set (each spawn).
        raw, move = data.get(b"SBXLIMIT_CGROUP_PARENT"), data.get(b"SBXLIMIT_CGROUP_MOVE_SELF")
        env = os.fsdecode(raw) if raw else None
        moves = None if move is None else os.fsdecode(move)
    else:
        env = os.environ.get("SBXLIMIT_CGROUP_PARENT") or None
        moves = os.environ.get("SBXLIMIT_CGROUP_MOVE_SELF")
    key = (cgroup_parent, env, moves, os.geteuid())
    site = _cache.get(key)
    if site is not None:
        return site
    with _cache_lock:
        site = _cache.get(key)
        if site is None:
            site = _discover(cgroup_parent or env)
            if (cgroup_parent or env) not in (None, "none"):
                site = dataclasses.replace(site, explicit=True)
            _cache[key] = site
            _collect_once(site)
    return site


def _discover(explicit: str | None) -> Site:
    if not os.path.isdir("/sys/fs/cgroup"):
        return Site(0, reason="this platform has no cgroups")
    if explicit == "none":
        return Site(0, reason="cgroups turned off (cgroup_parent='none')")
    if explicit is not None:
        if not os.path.isabs(explicit):
            return Site(0, reason=f"cgroup parent {explicit!r} is not an absolute path")
        kind = _fs_kind(explicit)
        if kind == 2:
            return _v2_site(_v2_mount_of(explicit), explicit)
        if kind == 1:
            return _v1_site(explicit)
        return Site(0, reason=f"{explicit} is not a cgroup directory")
    v2 = next((p for p, k, _o in mounts() if k == "cgroup2"), None)
    why = []
    if v2 is not None and _fs_kind(v2) == 2:
        site = _v2_site(v2, None)
        if site.version:
            return site
        why.append(f"v2: {site.reason}")
    if any(k == "cgroup" for _p, k, _o in mounts()):
        site = _v1_site(None)
        if site.version:
            return site
        why.append(f"v1: {site.reason}")
    return Site(0, reason="; ".join(why) or "no cgroup filesystem is mounted")


_warned: set[str] = set()


def warn_explicit_site(site: Site) -> None:
    """SBXLIMIT_CGROUP_PARENT names a cgroup that cannot be used: say so,
    once per process, instead of falling back quietly."""
    if site.reason in _warned:
        return
    _warned.add(site.reason)
    import warnings

    warnings.warn(
        f"sbxlimit: SBXLIMIT_CGROUP_PARENT cannot be used ({site.reason}); "
        "limits fall back to rlimits and the watchdog",
        RuntimeWarning,
        stacklevel=4,
    )


def _v2_mount_of(path: str) -> str:
    best = "/"
    for point, kind, _o in mounts():
        if kind == "cgroup2" and (path + "/").startswith(point.rstrip("/") + "/"):
            best = point if len(point) > len(best) else best
    return best


@at_exit(CGROUPS)
def _remove_group_dirs() -> None:
    """At exit, our owner cgroups go (_owner), then the ``sbxlimit``
    grouping cgroups if they are empty (rmdir refuses otherwise); a process
    that needs one makes it again."""
    _owner.release_all()
    for site in list(_cache.values()):
        for _c, parent in site.parents:
            if os.path.basename(parent) == GROUP_DIR:
                try:
                    os.rmdir(parent)
                except OSError:
                    pass


def _collect_once(site: Site) -> None:
    """The first start in a process removes what crashed supervisors left."""
    global _collected
    if _collected or not site.version:
        return
    _collected = True
    from ._gc import AUTO_MIN_AGE, collect_cgroups

    # Only what no live process can hold: its owner may live in another PID
    # namespace, where its pid means nothing here (_gc).
    collect_cgroups((parent for _c, parent in site.parents), min_age=AUTO_MIN_AGE)


def move_self_to_leaf() -> str:
    """Move this process into <own cgroup>/sbx-supervisor and enable memory,
    pids and cpu in <own cgroup>, which then holds the sandboxes.  Only when
    asked (SBXLIMIT_CGROUP_MOVE_SELF=1): it changes this process's cgroup.
    Returns the new parent.  Raises OSError (EBUSY when other processes
    share the cgroup)."""
    mount = next((p for p, k, _o in mounts() if k == "cgroup2"), None)
    if mount is None:
        raise OSError(errno.ENOENT, "no cgroup v2 mount")
    own = os.path.join(mount, own_cgroups().get("", "/").lstrip("/")).rstrip("/")
    if os.path.basename(own) == SUPERVISOR_LEAF:
        return os.path.dirname(own)
    leaf = os.path.join(own, SUPERVISOR_LEAF)
    try:
        os.mkdir(leaf, 0o755)
    except FileExistsError:
        pass
    with open(os.path.join(leaf, "cgroup.procs"), "w") as f:
        f.write("0")
    avail = set(_read(os.path.join(own, "cgroup.controllers")).split()) & set(_WANTED)
    try:
        with open(os.path.join(own, "cgroup.subtree_control"), "w") as f:
            f.write(" ".join(f"+{c}" for c in sorted(avail)))
    except OSError:
        with open(os.path.join(own, "cgroup.procs"), "w") as f:
            f.write("0")  # put things back as they were
        raise
    with _cache_lock:
        _cache.clear()
    return own


@dataclasses.dataclass(slots=True)
class CgroupStats:
    """Figures read from a sandbox's cgroup; None where not available."""

    memory_now: int | None = None
    memory_peak: int | None = None
    pids_now: int | None = None
    pids_peak: int | None = None
    cpu_user: float | None = None
    cpu_system: float | None = None
    throttled_periods: int | None = None
    throttled_seconds: float | None = None
    oom_kills: int = 0
    # OOM kills here that the sandbox's own limit did not cause: memory ran
    # out above it (a parent cgroup's limit, the host) and the kernel's
    # OOM killer chose its victim among the sandbox's processes.
    oom_kills_outside: int = 0
    pids_refused: int = 0


def _own_limit_reached(get: Callable[[str, str], str]) -> bool:
    """v1, once an OOM kill is counted: did the sandbox's own limit run out?

    Its own counter refused a charge (``memory.failcnt``), or its peak came
    within a few charges of its limit.  The peak is needed because newer
    kernels (6.16+) keep no ``memory.memsw.failcnt``, and memory+swap is
    the counter charged first, so the one refused where both limits are
    set.  A figure that cannot be read says yes: the kill is then judged
    the sandbox's own, as before these were read."""
    failcnt = get("memory", "memory.failcnt").strip()
    if not failcnt.isdigit() or int(failcnt) > 0:
        return True
    limit = get("memory", "memory.limit_in_bytes").strip()
    peaks = [
        get("memory", f).strip()
        for f in ("memory.max_usage_in_bytes", "memory.memsw.max_usage_in_bytes")
    ]
    if not limit.isdigit() or not peaks[0].isdigit():
        return True
    # A refused charge is at most a huge page (512 pages) past the peak; a
    # limit's last 1/64 is the same "reached" on small limits.
    slack = max(4 << 20, int(limit) // 64)
    return max(int(p) for p in peaks if p.isdigit()) >= int(limit) - slack


def _kv(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _scaled(
    user: float, system: float, total: int | None, per_second: float
) -> tuple[float, float]:
    """User and system seconds scaled to the precise `total` (in units of
    1/`per_second`): the split is coarser than the sum, which the
    cpu_time verdict reads, and the two must agree."""
    if total is None:
        return user, system
    secs = total / per_second
    both = user + system
    if both <= 0:
        return secs, 0.0
    system = secs * system / both
    user = secs - system
    if user + system < secs:  # rounding: never report less than the total
        user = math.nextafter(user, math.inf)
    return user, system


# A forked child closes the fds of ours it inherits: those recorded (by
# identity) and any file in a cgroup directory of ours (Monitor
# .close_in_child).  An eventfd is neither until it is recorded, nor
# once forgotten until it is closed: a fork waits for both moments.
_recording = threading.Lock()


def _fork_waits() -> None:
    _recording.acquire()


def _fork_done() -> None:
    _recording.release()


def _fork_child() -> None:
    global _recording
    _recording = threading.Lock()
    # usage()'s kept files, recorded under the lock the fork held: these
    # very numbers, closed and forgotten, so that the child never reads or
    # closes a number given since to a file of its own.
    for cg in list(_reading):
        for fd in (cg.readers or {}).values():
            try:
                os.close(fd)
            except OSError:
                pass
        cg.readers = {}
    _reading.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_fork_waits, after_in_parent=_fork_done, after_in_child=_fork_child)


def _close_all(fds: list[int]) -> None:
    """Close fds of ours in one core call (the GIL released once).  Those
    recorded for a fork's child: hold _recording from before they were
    forgotten (an eventfd is in no directory a child looks in), so that a
    number given again meanwhile is never taken for ours (Monitor
    .close_in_child).  Unrecorded files of a cgroup directory of ours need
    not: a child closes those by their directory."""
    if fds:
        errs = _core.fs_batch([(_core.FS_CLOSE, "", None, fd) for fd in fds], False)
        for fd, err in zip(fds, errs, strict=True):
            if type(err) is int and err:  # closed twice: our records are wrong somewhere
                log.warning("sbxlimit: closing fd %d: %s", fd, os.strerror(err))


# Cgroups whose usage files are kept open (Cgroup._kept_readers): a forked
# child closes what it inherited of them (_fork_child).
_reading: set[Cgroup] = set()


def _pread_all(fds: list[int]) -> list[_Result]:
    """Each kept file read whole from its start in one core call, as
    fs_batch's FS_READ reports it: the bytes (to the end: never a short
    read taken for the file), EFBIG when they fill the buffer, else the
    errno."""
    return _core.fs_batch([(_core.FS_PREAD, "", None, fd) for fd in fds], False)


# Settings a kernel may lack (no swap accounting, older kernels): skipped.
_HAS_FS_BATCH = hasattr(_core, "fs_batch")  # the POSIX core's


def _kernel_at_least(*want: int) -> bool:
    try:
        got = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
    except ValueError:
        return False
    return got >= want


# Linux 5.3 keeps a zombie in its cgroup, charged to the pids controller
# until it is reaped; before, it was uncharged at its exit.
_ZOMBIE_COUNTED = 1 if _kernel_at_least(5, 3) else 0

OPTIONAL = frozenset({"memory.swap.max", "memory.memsw.limit_in_bytes", "memory.oom.group"})
_USER_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class Cgroup:
    """One sandbox's cgroup (a directory per v1 hierarchy, one in v2)."""

    __slots__ = (
        "anchored_at",
        "anchors",
        "armed",
        "baselines",
        "batches",
        "block_counts",
        "count_fd",
        "count_pid",
        "dirfd",
        "dirs",
        "events",
        "figures",
        "forks_blocked",
        "forks_blocked_at",
        "name",
        "paths",
        "peak_memory",
        "peak_pids",
        "readers",
        "ready_procs",
        "removed",
        "site",
    )

    def __init__(self, site: Site, name: str) -> None:
        self.site = site
        self.name = name
        self.dirs: dict[str, str] = {}
        self.dirfd = -1
        # fs_batch's anchors: (our directory, our owner cgroup's fd in its
        # parent, "../<name>") for the directories made from one (create()),
        # whose files are then reached from it (_anchors).
        self.anchors: tuple[tuple[str, int, str], ...] = ()
        # (_owner.generation, pid) when they were checked: a fork's child,
        # or another process (a copy), checks them again.
        self.anchored_at = (0, 0)
        # (fd, field) the supervisor watches instead of sampling (open_events).
        self.events: list[tuple[int, str]] = []
        self.armed: set[str] = set()  # fields whose event fds were opened ahead (arm)
        # Counter files no event covers, read ahead (arm) while the cgroup
        # was still empty: what "nothing hit yet" reads as.
        self.baselines: dict[str, bytes] = {}
        # The files the child joins through, opened ahead (arm): a spawn takes them.
        self.ready_procs: list[int] = []
        # v1's pids.current, opened ahead (arm): at the leader's exit one
        # read says whether anything else is left (_only_the_leader).
        self.count_fd = -1
        self.count_pid = 0  # the process that opened count_fd
        # v1: pids.events' "max" when a kill stopped every fork (pids.max
        # = 0); what it refuses after is the kill's, not the program's.
        self.forks_blocked_at: int | None = None
        self.block_counts: list[int] = []  # each kill's, the first one wins
        self.forks_blocked = False  # pids.max = 0 was written
        self.paths: dict[tuple[str, str], str | None] = {}
        # stats()'s reads as one core call, per (final, evidence): memoized.
        self.batches: dict[
            tuple[bool, bool], tuple[list[tuple[str, str]], list[tuple[int, str, None]]]
        ] = {}
        # The files usage() reads, kept open from its first call
        # (_kept_readers); {} once refused (the fd budget).
        self.readers: dict[tuple[str, str], int] | None = None
        self.peak_memory = 0
        self.peak_pids = 0
        self.removed = False
        # Its final figures, read once: made when its sandbox ends (ended()).
        self.figures: Once[CgroupStats | None] | None = None

    @classmethod
    def create(cls, site: Site, name: str, settings: Iterable[tuple[str, str, str]]) -> Cgroup:
        """mkdir and limit; on any failure, undo and raise OSError naming the
        file.  The sentinel learns of it (it ends it should this process be
        killed): where first, then that it is ours, once it is."""
        _sentinel.announce(site)
        cg = cls._create(site, name, settings)
        _sentinel.made(cg)
        return cg

    @classmethod
    def _create(cls, site: Site, name: str, settings: Iterable[tuple[str, str, str]]) -> Cgroup:
        cg = cls(site, name)
        settings = tuple(settings)
        skip = _v1_unneeded(site, settings)
        cg._hold_owner_locks(skip)  # before the name is ours: see _owner
        if cg._create_in_one_call(skip, settings):
            return cg
        try:
            for ctrl, parent in site.parents:
                if ctrl in skip:
                    continue
                path = os.path.join(parent, name)
                _mkdir_sandbox(path, ctrl, site)
                cg.dirs[ctrl] = path
            for ctrl, fname, value in settings:
                path = os.path.join(cg.dirs[ctrl], fname)
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                    try:
                        os.write(fd, value.encode())
                    finally:
                        os.close(fd)
                except FileNotFoundError:
                    if fname not in OPTIONAL:
                        raise
                except OSError as e:
                    raise OSError(e.errno, f"cannot set {fname}={value}: {e.strerror}", path) from e
            if site.version == 2:
                cg.dirfd = os.open(cg.dirs[""], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except BaseException:
            cg.remove()
            raise
        cg._hold_owner_locks(skip)  # where our grouping cgroup was made again
        return cg

    def _hold_owner_locks(self, skip: Iterable[str]) -> None:
        """This process's owner lock in each parent it makes a directory
        in (a dict lookup once taken).  A parent the caller names keeps
        none of ours."""
        if not self.site.explicit:
            for ctrl, parent in self.site.parents:
                if ctrl not in skip:
                    _owner.hold(parent)

    def _create_in_one_call(
        self, skip: Iterable[str], settings: tuple[tuple[str, str, str], ...]
    ) -> bool:
        """The usual case in one core call (the GIL released once for a
        dozen system calls: the supervisor makes these while callers spawn).
        False, with nothing left behind, when any step fails: create()'s
        step-by-step way then handles (and reports) it."""
        dirs = {
            ctrl: os.path.join(parent, self.name)
            for ctrl, parent in self.site.parents
            if ctrl not in skip
        }
        if not self.site.explicit:
            self.anchored_at = (_owner.generation, os.getpid())
            self.anchors = tuple(
                (dirs[ctrl], fd, "../" + self.name)
                for ctrl, parent in self.site.parents
                if ctrl in dirs and (fd := _owner.anchor(parent)) >= 0
            )
        steps: list[_Step] = [(_core.FS_MKDIR, path, None) for path in dirs.values()]
        for ctrl, fname, value in settings:
            if ctrl not in dirs:
                self.anchors = ()
                return False
            op = _core.FS_WRITE_OPTIONAL if fname in OPTIONAL else _core.FS_WRITE
            steps.append((op, os.path.join(dirs[ctrl], fname), value.encode()))
        errs = _core.fs_batch(steps, True, self.anchors)
        if any(errs):
            made = [path for path, err in zip(dirs.values(), errs, strict=False) if err == 0]
            _core.fs_batch([(_core.FS_RMDIR, path, None) for path in made], False, self.anchors)
            gone = {p for p, err in zip(dirs.values(), errs, strict=False) if err == errno.ENOENT}
            for d, owner, _rel in self.anchors:
                if d in gone:
                    # No parent there: our owner cgroup was removed from
                    # outside, and the parent with it.  Take a lock anew.
                    _owner.forget(os.path.dirname(d), owner)
            # create()'s step by step way makes them from "/" (a parent
            # made again is not the one an anchor is in).
            self.anchors = ()
            return False
        self.dirs.update(dirs)
        if self.site.version == 2:
            _d, at, rel = self.anchors[0] if self.anchors else ("", None, dirs[""])
            try:
                self.dirfd = os.open(rel, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=at)
            except BaseException:
                self.remove()
                raise
        return True

    def arm(self, fields: Iterable[str]) -> None:
        """Open ahead of need what a sandbox's spawn and supervision open:
        the files its child joins through, and the event fds of `fields`
        (memory, pids).  The supervisor arms the cgroups it makes ahead
        (_cgpool), off the caller's path, in one core call (the GIL
        released once, not at each of a dozen opens).  Best effort: what
        fails here is opened at the spawn as without arming."""
        fields = list(fields)
        steps, todo = self._event_steps(fields, None)
        # The join files.  A fork meanwhile closes in its child what the
        # call opens: files in a cgroup directory of ours (Pool.dirs).
        procs = [] if self.ready_procs else self._join_files()
        steps += [(_core.FS_OPEN_WRITE, path, None) for path in procs]
        # What "nothing hit yet" reads as, for the fields no event covers.
        counters: list[tuple[str, str]] = []
        for f in fields:
            path = self.counter_file(f)
            if path is not None:
                counters.append((f, path))
        steps += [(_core.FS_READ, path, None) for _f, path in counters]
        # What the caller reads at the exit (kill()): on v1 the task count,
        # kept open; else the process list, read once here (its first
        # lookup in a new cgroup makes the kernel's inode).
        count = self.dirs.get("pids") if self.site.version == 1 and self.count_fd < 0 else None
        procs_path = self._procs_path() if count is None and self.count_fd < 0 else None
        if count is not None:
            steps.append((_core.FS_OPEN_READ, os.path.join(count, "pids.current"), None))
        elif procs_path is not None:
            steps.append((_core.FS_READ, procs_path, None))
        got = _core.fs_batch(steps, False, self._anchors())
        try:
            self._take_armed(fields, todo, got, len(procs), counters, count is not None)
        except BaseException:
            # Whatever was opened and is not kept yet is nobody's.
            kept = {fd for fd, _f in self.events} | set(self.ready_procs) | {self.count_fd}
            _close_all([r[0] for r in got if type(r) is tuple and len(r) == 1 and r[0] not in kept])
            raise

    def _take_armed(
        self,
        fields: list[str],
        todo: list[str],
        got: list[_Result],
        n_procs: int,
        counters: list[tuple[str, str]],
        count: bool,
    ) -> None:
        """Keep what arm()'s core call opened and read."""
        covered = self._events_opened(fields, todo, got[: len(todo)])
        rest = got[len(todo) :]
        fds = [r[0] for r in rest[:n_procs] if type(r) is tuple]
        budget = fd_budget()
        if n_procs and len(fds) == n_procs and all(fd < budget for fd in fds):
            # The caller's own files come first: past the budget, none is
            # kept (opened at the spawn).
            self.ready_procs = fds
        else:
            _close_all(fds)
        rest = rest[n_procs:]
        for (field, path), r in zip(counters, rest, strict=False):
            if field not in covered:
                self.baselines[path] = r if type(r) is bytes else b""
        if count:
            r = rest[-1]
            if type(r) is tuple and r[0] < budget:
                self.count_fd = r[0]
                self.count_pid = os.getpid()
            elif type(r) is tuple:
                _close_all([r[0]])

    def _event_steps(
        self, fields: Iterable[str], warn_at: int | None
    ) -> tuple[list[_Step], list[str]]:
        """The core steps that open the event fds of `fields` (see
        open_events), and the field each is for."""
        steps: list[_Step] = []
        todo: list[str] = []
        v2 = self.site.version == 2
        for field in fields:
            if field in self.armed:
                continue
            if v2 and field in ("memory", "pids"):
                path = self._path(field, f"{field}.events")
                if path is not None:
                    # Kept open; its read arms kernfs's poll.
                    steps.append((_core.FS_OPEN_READ, path, None))
                    todo.append(field)
            elif field == "memory" and not v2:
                control = self._path("memory", "cgroup.event_control")
                try:
                    efd = self._eventfd()
                except OSError:
                    continue
                watched = [("memory", "memory.oom_control", "")]
                if warn_at is not None:
                    watched.append(("warn", "memory.usage_in_bytes", f" {warn_at}"))
                for what, fname, arg in watched:
                    path = self._path("memory", fname) or ""
                    data = os.fsencode(path) + b"\0" + arg.encode()
                    steps.append((_core.FS_V1_EVENT, control or "", data, efd))
                    todo.append(what)
        return steps, todo

    def _events_opened(
        self, fields: Iterable[str], todo: list[str], got: list[_Result]
    ) -> list[str]:
        """Keep what _event_steps' steps opened; the fields now covered."""
        done: dict[str, bool] = {}
        for what, r in zip(todo, got, strict=True):
            if type(r) is tuple:  # an events file opened (v2)
                try:
                    self._keep_event(r[0], what)
                except OSError:
                    continue
                done[what] = True
            else:  # v1: a registration on the eventfd
                done[what] = r == 0
        # The warning rides on the OOM registration's eventfd: without it,
        # sampled (a threshold registered all the same only signals an
        # eventfd nobody watches).
        if not done.get("memory", True):
            done.pop("warn", None)
        covered = []
        for field in [*fields, "warn"]:
            if field in self.armed or done.get(field):
                covered.append(field)
                if field != "warn":
                    self.armed.add(field)
        return covered

    def _eventfd(self) -> int:
        """The eventfd v1 memory events signal (one per cgroup), recorded
        before a fork can see it."""
        efd = next((fd for fd, f in self.events if f == "memory"), -1)
        if efd < 0:
            with _recording:  # a fork waits until it is recorded
                efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
                self._keep_event(efd, "memory")
        return efd

    def owned_fds(self) -> dict[int, str | tuple[int, int]]:
        """The fds this cgroup holds, each with what it should still be (a
        forked child closes those of the parent's ready cgroups)."""
        out: dict[int, str | tuple[int, int]] = {}
        for fd in [self.dirfd, self.count_fd, *self.ready_procs, *(self.readers or {}).values()]:
            if fd >= 0:
                try:
                    out[fd] = fd_ident(fd)
                except OSError:
                    pass
        for fd, field in self.events:
            if self.site.version == 1 and field == "memory":
                out[fd] = "eventfd"
            else:
                try:
                    out[fd] = fd_ident(fd)
                except OSError:
                    pass
        return out

    def procs_fds(self) -> list[int]:
        """Open, for the child, the file of every directory (v2's first) that
        moves it in: cgroup.procs on v2; on v1 ``tasks``, which moves one
        thread.  The child is one thread when it writes "0" there, and the
        kernel (6.1+) moves the writing thread itself without taking the
        global threadgroup lock, whose writer waits for an RCU grace period
        (cgroup.procs: 40 us to 16 ms per join here, tasks: 20-35 us)."""
        if self.ready_procs:  # armed ahead: the spawn takes them
            fds, self.ready_procs = self.ready_procs, []
            return fds
        return self._open_procs()

    def spawned(self) -> None:
        """The child was made: the directory's fd (v2: the clone's
        CLONE_INTO_CGROUP) is done with.  A live sandbox keeps no fd it
        does not use: 45 of them would otherwise hold 45 (the fd budget
        counts event fds only)."""
        fd, self.dirfd = self.dirfd, -1
        if fd >= 0:
            os.close(fd)

    def _open_procs(self) -> list[int]:
        """The join files, opened in one core call; OSError naming the
        first that failed (none kept)."""
        paths = self._join_files()
        steps = [(_core.FS_OPEN_WRITE, path, None) for path in paths]
        got = _core.fs_batch(steps, True, self._anchors())
        fds = [r[0] for r in got if type(r) is tuple]
        if len(fds) < len(paths):
            _close_all(fds)
            err = next((r for r in got if type(r) is int and r > 0), errno.EIO)
            raise OSError(err, os.strerror(err), paths[len(fds)])
        return fds

    def _join_files(self) -> list[str]:
        """The file of each directory the child joins through: on v1
        ``tasks``, on v2 ``cgroup.procs`` (see procs_fds)."""
        join = "tasks" if self.site.version == 1 else "cgroup.procs"
        return [os.path.join(d, join) for d in self.dirs.values()]

    def _path(self, ctrl: str, fname: str) -> str | None:
        # Memoized: usage() asks for the same seven files at every call.
        key = (ctrl, fname)
        try:
            return self.paths[key]
        except KeyError:
            pass
        d = self.dirs.get("" if self.site.version == 2 else ctrl)
        path = self.paths[key] = None if d is None else os.path.join(d, fname)
        return path

    def _anchors(self) -> tuple[tuple[str, int, str], ...]:
        """fs_batch's anchors for this cgroup's files: "../<name>/<file>"
        from our owner cgroup beside it, two names to look up where the path
        from "/" has seven or eight, each a slow lookup on kernfs (some 40
        us of the machine's CPU a sandbox).  One let go since (a fork's
        child, the exit) is dropped: its paths are walked whole again."""
        anchors, now = self.anchors, (_owner.generation, os.getpid())
        if anchors and self.anchored_at != now:
            anchors = tuple(a for a in anchors if _owner.anchor(os.path.dirname(a[0])) == a[1])
            # The anchors first: a thread that sees the new check sees them.
            self.anchors = anchors
            self.anchored_at = now
        return anchors

    def _get(self, ctrl: str, fname: str) -> str:
        path = self._path(ctrl, fname)
        return "" if path is None else self._read(path)

    def _read(self, path: str) -> str:
        """_read(path), from the anchor where there is one (_anchors)."""
        anchors = self._anchors()
        if not anchors:
            return _read(path)
        r = _core.fs_batch([(_core.FS_READ, path, None)], False, anchors)[0]
        if type(r) is bytes:
            return r.decode()
        return _read(path) if r == errno.EFBIG else ""

    def _procs_path(self) -> str | None:
        d = next(iter(self.dirs.values()), None)
        if d is None:
            return None
        if self.site.version == 1 and "freezer" in self.dirs:
            d = self.dirs["freezer"]
        elif self.site.version == 1 and "pids" in self.dirs:
            d = self.dirs["pids"]
        return os.path.join(d, "cgroup.procs")

    def pids(self) -> list[int]:
        """Processes in the cgroup now."""
        path = self._procs_path()
        return [] if path is None else [int(x) for x in self._read(path).split()]

    def ended(self) -> Once[CgroupStats | None]:
        """Its sandbox ended (the leader reaped, what it left killed): its
        final figures, read once, by the supervisor right before it removes
        the cgroup (Monitor.retire), off the caller's path, or by a caller
        who asks first.  None when they could not be read."""
        if self.figures is None:
            self.figures = Once(self._final_stats)
        return self.figures

    def final(self) -> CgroupStats | None:
        """The final figures, if its sandbox ended (see ended())."""
        return self.figures.get() if self.figures is not None else None

    def _final_stats(self) -> CgroupStats | None:
        try:
            return self.stats(final=True)
        except OSError:
            return None

    def populated(self) -> bool:
        if self.site.version == 2:
            return _kv(self._get("", "cgroup.events")).get("populated", 0) == 1
        return any(self._read(os.path.join(d, "cgroup.procs")).strip() for d in self.dirs.values())

    def signal(self, sig: int, *, until_empty: bool = True) -> list[int]:
        """Send `sig` to every process in the cgroup (no escape by setsid or
        double fork); returns the pids signalled (none listed for SIGKILL,
        which is kill(until_empty=until_empty))."""
        if sig == signal.SIGKILL:
            self.kill(until_empty=until_empty)
            return []
        pids = self.pids()
        _send(pids, sig)
        return pids

    def kill(self, *, until_empty: bool = True, leader_gone: bool = False) -> None:
        """SIGKILL everything inside, atomically where the kernel can
        (cgroup.kill, Linux 5.14); else (v1) stop every fork with the pids
        controller (or freeze, where a cgroup has no pids directory), then
        kill what is listed until nothing is (up to some 5 s for processes
        that will not freeze: asleep in the kernel, uninterruptibly).
        Without `until_empty` (the supervisor, whose timers end every
        other sandbox): the forks stopped as well, SIGKILL what is listed,
        a few passes for what forked meanwhile, no freezer, no wait.  `leader_gone`: the leader
        has exited (its caller's common case, where nothing else is
        left)."""
        if self.removed:
            return
        if self.site.version == 2:
            path = os.path.join(self.dirs[""], "cgroup.kill")
            try:
                with open(path, "w") as f:
                    f.write("1")
                return
            except OSError:
                pass
        if not until_empty:
            self._block_forks()
            self._kill_listed()
            return
        if leader_gone and self._only_the_leader():
            return  # the common case at a leader's exit: nothing left
        if not self.pids():
            return
        self._block_forks()
        freezer = self.dirs.get("freezer")
        state = os.path.join(freezer, "freezer.state") if freezer else None
        for _ in range(100):
            if state is not None:
                _write_quiet(state, "FROZEN")
                # Frozen tasks cannot fork or exit: the pid list holds still.
                for _ in range(50):
                    if _read(state).strip() != "FREEZING":
                        break
                    time.sleep(0.001)
            victims = self.pids()
            _send(victims, signal.SIGKILL)
            if state is not None:
                _write_quiet(state, "THAWED")
            if not victims:
                return
            time.sleep(0.001)

    def _block_forks(self) -> None:
        """(v1, a kill.)  Every fork in the cgroup fails from now on (pids.max
        = 0): what is listed can only shrink, and no fork loop outruns the
        kill.  A fork refused then counts in pids.events as one past the
        sandbox's own limit would: the count it had before is kept first,
        and the evidence reads no further (counters())."""
        d = self.dirs.get("pids")
        if self.site.version != 1 or d is None or self.forks_blocked:
            return
        counts = _kv(self._read(os.path.join(d, "pids.events")))
        if "max" not in counts:
            return  # unread: no block, whose refusals would read as the program's
        # The first count taken wins (the caller's and the supervisor's
        # kills may race; an append is atomic): read before any block, and
        # published before this write, so that a reader that sees a refusal
        # of the block's sees it too.
        self.block_counts.append(counts["max"])
        self.forks_blocked_at = self.block_counts[0]
        self.forks_blocked = _write_quiet(os.path.join(d, "pids.max"), "0")

    def _only_the_leader(self) -> bool:
        """(v1, the leader exited, not reaped.)  Nothing else is left: the
        pids controller counts every task until it is reaped (its zombie
        too, from Linux 5.3), so a count of one is the leader's.  One read
        of a file kept open, where the process list costs an open, a
        listing and a close."""
        fd = self.count_fd
        if fd < 0:
            return False
        try:
            n = int(os.pread(fd, 32, 0))
        except (OSError, ValueError):
            return False
        return n <= _ZOMBIE_COUNTED

    def _kill_listed(self) -> None:
        """kill(until_empty=False): SIGKILL what is listed until a listing
        shows nothing new (what is killed but still listed is dying, or
        asleep in the kernel and dying at its wake).  Once something was
        killed, one more listing a moment later: a fork already under way
        when its parent got the SIGKILL still makes a child, listed only at
        the fork's end."""
        signalled: set[int] = set()
        looked_again = False
        for _ in range(_QUICK_PASSES):
            new = set(self.pids()) - signalled
            if not new and signalled and not looked_again:
                looked_again = True
                time.sleep(0.001)
                continue
            if not new:
                return
            _send(new, signal.SIGKILL)
            signalled |= new

    def _stats_files(self, final: bool, evidence: bool) -> list[tuple[str, str]]:
        """The files stats() reads, as (controller, name)."""
        if self.site.version == 2:
            files = [("memory", "memory.peak"), ("pids", "pids.peak"), ("cpu", "cpu.stat")]
            if not final:
                files += [("memory", "memory.current"), ("pids", "pids.current")]
            if evidence:
                files += [("memory", "memory.events"), ("pids", "pids.events")]
            return files
        files = [
            ("memory", "memory.max_usage_in_bytes"),
            ("pids", "pids.peak"),
            ("cpuacct", "cpuacct.stat"),
            ("cpuacct", "cpuacct.usage"),
        ]
        if "cpu" in self.dirs:
            files.append(("cpu", "cpu.stat"))
        if not final:
            files += [("memory", "memory.usage_in_bytes"), ("pids", "pids.current")]
        if evidence:
            files += [("memory", "memory.oom_control"), ("pids", "pids.events")]
        return files

    def _read_all(self, final: bool, evidence: bool) -> Callable[[str, str], str]:
        """Read what stats() needs in one core call (the GIL released once,
        not once per open, read and close); returns a reader of what was
        read that falls back to _get for anything else."""
        batch = self.batches.get((final, evidence))
        if batch is None:
            keys = [k for k in self._stats_files(final, evidence) if self._path(*k) is not None]
            steps = [(_core.FS_READ, self._path(*k) or "", None) for k in keys]
            batch = self.batches[(final, evidence)] = (keys, steps)
        keys, steps = batch
        got: dict[tuple[str, str], str] = {}
        results = None
        if not final and not evidence:
            # Under the lock remove() closes them under: never a number
            # closed and given to another file meanwhile.
            with _recording:
                readers = self._kept_readers(keys, steps)
                if readers:
                    # The one not kept as a reader is v1's task count.
                    results = _pread_all([readers.get(k, self.count_fd) for k in keys])
        if results is None:
            results = _core.fs_batch(steps, False, self._anchors())
        for k, (_op, path, _d), r in zip(keys, steps, results, strict=True):
            if type(r) is bytes:
                got[k] = r.decode()
            elif r == errno.EFBIG:
                got[k] = _read(path)  # larger than the core's buffer
            else:
                got[k] = ""  # as _read: a file not there reads as nothing

        def get(ctrl: str, fname: str) -> str:
            text = got.get((ctrl, fname))
            return self._get(ctrl, fname) if text is None else text

        return get

    def _kept_readers(
        self, keys: list[tuple[str, str]], steps: list[tuple[int, str, None]]
    ) -> dict[tuple[str, str], int] | None:
        """usage()'s files, opened at its first call and kept: then read
        again from their start, all in one core call (where an open, a read
        and a close took 6.6 us a file), for a dashboard that polls many
        sandboxes.  None past the
        first half of the fd budget, the rest left to the event fds that
        enforce limits (read by path then, as before); recorded for a
        fork's child, which closes them (_fork_child).  (_recording held:
        a fork waits until they are recorded.)"""
        if self.readers is not None or self.removed:
            return self.readers or None
        # v1's task count is open already (the exit's check, Cgroup.arm):
        # read through it, one fd fewer a sandbox (more of them fit).
        # Only in the process that opened it: a fork's child may have closed
        # the number (by its directory) and given it to a file of its own.
        shared = self.count_fd >= 0 and self.count_pid == os.getpid()
        todo = [
            (k, path)
            for k, (_op, path, _d) in zip(keys, steps, strict=True)
            if not (k == ("pids", "pids.current") and shared)
        ]
        steps = [(_core.FS_OPEN_READ, path, None) for _k, path in todo]
        got = _core.fs_batch(steps, True, self._anchors())
        fds = [r[0] for r in got if type(r) is tuple]
        if len(fds) < len(todo) or any(fd >= fd_budget() // 2 for fd in fds):
            _close_all(fds)
            self.readers = {}
            return None
        self.readers = dict(zip([k for k, _p in todo], fds, strict=True))
        _reading.add(self)
        return self.readers

    def stats(
        self,
        *,
        final: bool = False,
        evidence: bool = True,
        get: Callable[[str, str], str] | None = None,
    ) -> CgroupStats:
        """Usage and (`evidence`) the event counters now; `final`: once
        empty, without the "now" figures.  Peaks fall back to the largest
        sample.  `get`: the files read already (_read_all)."""
        s = CgroupStats()
        v2 = self.site.version == 2
        if get is None:
            get = self._read_all(final, evidence) if _HAS_FS_BATCH else self._get
        mem = "" if final else get("memory", "memory.current" if v2 else "memory.usage_in_bytes")
        if mem.strip().isdigit():
            s.memory_now = int(mem)
            self.peak_memory = max(self.peak_memory, s.memory_now)
        peak = get("memory", "memory.peak" if v2 else "memory.max_usage_in_bytes")
        s.memory_peak = int(peak) if peak.strip().isdigit() else (self.peak_memory or None)
        pids = "" if final else get("pids", "pids.current")
        if pids.strip().isdigit():
            s.pids_now = int(pids)
            self.peak_pids = max(self.peak_pids, s.pids_now)
        ppeak = get("pids", "pids.peak")
        s.pids_peak = int(ppeak) if ppeak.strip().isdigit() else (self.peak_pids or None)
        if v2:
            cpu = _kv(get("cpu", "cpu.stat"))
            if "user_usec" in cpu:
                # usage_usec is what the cpu_time verdict reads; the kernel
                # splits it into user and system apart, and their sum can
                # fall short of it by a microsecond: scale them to it.
                s.cpu_user, s.cpu_system = _scaled(
                    cpu["user_usec"] / 1e6,
                    cpu.get("system_usec", 0) / 1e6,
                    cpu.get("usage_usec"),
                    1e6,
                )
            if "nr_throttled" in cpu:
                s.throttled_periods = cpu["nr_throttled"]
                s.throttled_seconds = cpu.get("throttled_usec", 0) / 1e6
        else:
            acct = _kv(get("cpuacct", "cpuacct.stat"))
            if "user" in acct:
                total = get("cpuacct", "cpuacct.usage").strip()
                # ns, more precise than ticks, and what the verdict reads
                s.cpu_user, s.cpu_system = _scaled(
                    acct["user"] / _USER_HZ,
                    acct.get("system", 0) / _USER_HZ,
                    int(total) if total.isdigit() else None,
                    1e9,
                )
            if "cpu" in self.dirs:
                cpu = _kv(get("cpu", "cpu.stat"))
                if "nr_throttled" in cpu:
                    s.throttled_periods = cpu["nr_throttled"]
                    s.throttled_seconds = cpu.get("throttled_time", 0) / 1e9
        if evidence:
            s.oom_kills, s.oom_kills_outside = self.oom_kills(get)
            s.pids_refused = self.counters(("pids",), get)[1]
        return s

    def counters(
        self, which: Iterable[str], get: Callable[[str, str], str] | None = None
    ) -> tuple[int, int, float | None]:
        """(OOM kills, refused forks, CPU seconds) now, of the fields in
        `which` (memory, pids, cpu_time): the evidence that a limit was hit,
        read cheaply enough to sample.  CPU is None where not read or where
        no counter exists (a v1 machine without cpuacct)."""
        oom = refused = 0
        cpu: float | None = None
        v2 = self.site.version == 2
        get = get or self._get
        for field in which:
            if field == "memory":
                oom = self.oom_kills(get)[0]
            elif field == "pids":
                refused = _kv(get("pids", "pids.events")).get("max", 0)
                blocked = self.forks_blocked_at  # read after the file: see _block_forks
                if blocked is not None:
                    refused = min(refused, blocked)
            elif v2:
                usec = _kv(get("cpu", "cpu.stat")).get("usage_usec")
                cpu = None if usec is None else usec / 1e6
            else:
                ns = get("cpuacct", "cpuacct.usage").strip()
                cpu = int(ns) / 1e9 if ns.isdigit() else None
        return oom, refused, cpu

    def oom_kills(self, get: Callable[[str, str], str] | None = None) -> tuple[int, int]:
        """(OOM kills the sandbox's own limit caused, those it did not).

        The kernel counts a kill where its victim lived, whichever limit
        ran out: a parent cgroup's limit, or the host's memory, also kills
        in here.  Its own limit leaves a trace of its own: v2 counts
        ``oom`` (hierarchically, never from above) in ``memory.events``;
        v1 a refused charge or a peak at the limit, read only once a kill
        is counted (_own_limit_reached).  On v1 a sandbox whose own limit
        was reached earlier (page cache reclaimed there) cannot be told
        apart: its kills count as its own."""
        get = get or self._get
        if self.site.version == 2:
            events = _kv(get("memory", "memory.events"))
            kills = events.get("oom_kill", 0)
            own = events.get("oom", 0) > 0
        else:
            kills = _kv(get("memory", "memory.oom_control")).get("oom_kill", 0)
            own = kills > 0 and _own_limit_reached(get)
        return (kills, 0) if own else (0, kills)

    def open_events(self, fields: Iterable[str], warn_at: int | None = None) -> list[str]:
        """Fds that tell the supervisor a limit was hit, so that it need not
        sample; returns the fields they cover (the rest stay sampled).

        * v2: ``memory.events`` and ``pids.events``; kernfs wakes a poller
          (``POLLPRI``) when a counter changes.
        * v1 memory: an eventfd registered through ``cgroup.event_control``
          for ``memory.oom_control`` (every OOM kill), and for a
          ``memory.usage_in_bytes`` threshold (`warn_at`: field "warn").
        * v1 ``pids.events`` never wakes a poller (the kernel notifies the
          v2 file only): not covered; the supervisor reads it in a batch.

        Never the last quarter of the fd table: past it the fields stay
        sampled (the caller's own files come first)."""
        fields = list(fields)
        steps, todo = self._event_steps(fields, warn_at)
        got = _core.fs_batch(steps, False, self._anchors()) if steps else []
        return self._events_opened(fields, todo, got)

    def _keep_event(self, fd: int, field: str) -> None:
        try:
            if fd >= fd_budget():
                raise OSError(errno.EMFILE, "fd table three quarters full: sampled instead")
        except BaseException:
            os.close(fd)
            raise
        self.events.append((fd, field))

    def counter_file(self, field: str) -> str | None:
        """The file whose change means `field` (memory, pids) was hit."""
        if field == "memory":
            v2 = self.site.version == 2
            return self._path("memory", "memory.events" if v2 else "memory.oom_control")
        return self._path("pids", "pids.events")

    def cpu_gate(self) -> str | None:
        """A file of the parent cgroup that changes whenever any process in
        any of its sandboxes runs: its CPU counter (hierarchical)."""
        want = "" if self.site.version == 2 else "cpuacct"
        parent = next((d for c, d in self.site.parents if c == want), None)
        if parent is None:
            return None
        return os.path.join(parent, "cpu.stat" if want == "" else "cpuacct.usage")

    def remove(self) -> bool:
        """rmdir every directory; True when all are gone.  An EBUSY (still
        populated) leaves the rest for a later call."""
        with _recording:  # see _close_all
            fds = [fd for fd, _f in self.events] + self.ready_procs
            fds += [fd for fd in (self.dirfd, self.count_fd) if fd >= 0]
            fds += list((self.readers or {}).values())
            self.readers = {}
            _reading.discard(self)
            self.events, self.ready_procs = [], []
            self.armed.clear()
            self.dirfd = self.count_fd = -1
            _close_all(fds)
        # One core call for every directory (the supervisor removes these
        # while callers spawn: the GIL is released once).
        items = list(self.dirs.items())
        steps = [(_core.FS_RMDIR, path, None) for _c, path in items]
        errs = _core.fs_batch(steps, False, self._anchors())
        for (ctrl, _path), err in zip(items, errs, strict=True):
            if err in (0, errno.ENOENT):
                del self.dirs[ctrl]
                self.paths.clear()
                self.batches.clear()
        if not self.dirs and not self.removed:
            _sentinel.gone(self.name)
        self.removed = not self.dirs
        return self.removed


def _mkdir_sandbox(path: str, ctrl: str, site: Site) -> None:
    try:
        os.mkdir(path, 0o755)
        return
    except FileExistsError:
        # Left by an earlier process that had our pid (gc cannot tell it
        # from us): an old empty one is stale (rmdir refuses a populated
        # one).  A recent one may be a live process's that has our pid in
        # another PID namespace: never removed (the caller takes another
        # name).
        from ._gc import AUTO_MIN_AGE, old_enough

        if not old_enough(path, AUTO_MIN_AGE):
            raise
        os.rmdir(path)
    except FileNotFoundError:
        # Our grouping cgroup was removed under us: make it again.
        parent = os.path.dirname(path)
        if os.path.basename(parent) != GROUP_DIR:
            raise
        _ensure_group_dir(os.path.dirname(parent), site.controllers if ctrl == "" else ())
    os.mkdir(path, 0o755)


def _write_quiet(path: str, value: str) -> bool:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError:
        return False
    return True


# -- planning: the limits a cgroup holds (_platform lists these) -------------


def plan_cpu_time(p: Plan, r: Request) -> None:
    """The whole sandbox's CPU, from the cgroup's counter (every process,
    reaped ones included), beside RLIMIT_CPU."""
    from . import _rlimits

    site = r.site
    if r.limits is None or r.limits.cpu_time is None or not p.takes("cpu_time"):
        return
    if site.version == 2 or any(c == "cpuacct" for c, _d in site.parents):
        whole = f"{site.label}:" + ("cpu.stat" if site.version == 2 else "cpuacct.usage")
        p.cg_ends += (("cpu_time", r.limits.cpu_time, whole),)
        _rlimits.plan_cpu_time(p, r, whole)


def plan_memory(p: Plan, r: Request) -> None:
    lim, site = r.limits, r.site
    if lim is None or lim.memory is None or not site.has("memory") or not p.takes("memory"):
        return
    n = lim.memory
    if site.version == 2:
        settings = [("", "memory.max", str(n)), ("", "memory.swap.max", "0")]
        if "memory" not in lim.tolerate:
            # The sandbox dies as a whole, not one process of it.
            settings.append(("", "memory.oom.group", "1"))
        mech = "cgroup2:memory.max"
    else:
        settings = [("memory", "memory.limit_in_bytes", str(n))]
        if site.swap:
            settings.append(("memory", "memory.memsw.limit_in_bytes", str(n)))
        mech = "cgroup1:memory.limit_in_bytes"
    p.cgroup_settings += tuple(settings)
    p.hold("memory", mech)
    p.memory_by = Holder.CGROUP
    if "memory" not in lim.tolerate:
        p.cg_ends += (("memory", n, mech),)


_PID_MAX_LIMIT = 4 * 1024 * 1024  # linux/threads.h, 64-bit


def plan_pids(p: Plan, r: Request) -> None:
    lim, site = r.limits, r.site
    if lim is None or lim.pids is None or not site.has("pids") or not p.takes("pids"):
        return
    # Past the kernel's own bound (PID_MAX_LIMIT) no count can be reached,
    # and pids.max refuses the number: no limit is the same limit.
    n = str(lim.pids) if lim.pids <= _PID_MAX_LIMIT else "max"
    p.cgroup_settings += (("" if site.version == 2 else "pids", "pids.max", n),)
    mech = f"{site.label}:pids.max"
    p.hold("pids", mech)
    p.pids_by = Holder.CGROUP
    if "pids" not in lim.tolerate:
        p.cg_ends += (("pids", lim.pids, mech),)


def plan_cpu(p: Plan, r: Request) -> None:
    """A CPU rate: a quota per 100 ms period (the kernel's minimum quota is
    1 ms).  Nothing else can hold it."""
    lim, site = r.limits, r.site
    if lim is None or lim.cpu is None:
        return
    if not site.has("cpu"):
        p.downgrade("cpu", why_not(site, "cpu"))
        return
    quota = max(1000, lim.cpu * 100)
    if site.version == 2:
        p.cgroup_settings += (("", "cpu.max", f"{quota} 100000"),)
        p.hold("cpu", "cgroup2:cpu.max")
    else:
        p.cgroup_settings += (
            ("cpu", "cpu.cfs_period_us", "100000"),
            ("cpu", "cpu.cfs_quota_us", str(quota)),
        )
        p.hold("cpu", "cgroup1:cpu.cfs_quota_us")
