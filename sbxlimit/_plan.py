"""The plan of one sandbox: which mechanism holds each limit and protection.

``plan()`` is the single place where a request meets the platform.  It
builds a ``Request`` and runs the planners the platform layer lists
(``_platform.planners()``), in order; each planner belongs to one
mechanism's module (``_rlimits``, ``_cgroup``, ``_watchdog``,
``_namespaces``, ``_landlock``, ``_seccomp``, ``_caps``, ``_seatbelt``,
``_workspace``) and fills that mechanism's part of the ``Plan``: its
settings, and for each field it takes, a ``Held`` (the mechanism and its
caveats) or an ``Unenforced`` (why not).  A field taken by an earlier
planner is left alone by the later ones: the order is the preference.

``Plan.enforced`` renders those as the strings ``doctor()``, the docs and
``Popen.enforced`` use: ``<mechanism>[+<mechanism>...][ (<caveat>; ...)]``,
or ``unenforced: <reason>``, each an ``Enforcement`` (``_enforcement``)
that carries the same as fields.  Every downgrade is listed so that
``strict=True`` can refuse before anything starts.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import sys
import warnings
from typing import TYPE_CHECKING

from . import _platform
from ._enforcement import UNENFORCED, Enforcement
from ._limits import Limits
from ._policy import Policy

if sys.platform != "win32":  # no rlimits there: a job holds the limits (_winjob)
    import resource

if TYPE_CHECKING:
    from ._cgroup import Site

__all__ = [
    "UNENFORCED",
    "Held",
    "Holder",
    "Plan",
    "Request",
    "Unenforced",
    "plan",
    "warn_downgrades",
]


class Holder(enum.Enum):
    """What holds a limit, where a verdict depends on it (``_termination``)."""

    NONE = "none"
    CGROUP = "cgroup"  # the kernel counts (memory.events, pids.events) and refuses
    RLIMIT = "rlimit"  # per process; the kernel refuses silently
    WATCHDOG = "watchdog"  # the supervisor's samples


@dataclasses.dataclass(frozen=True, slots=True)
class Held:
    """A field held by `mechanism` (``"cgroup2:memory.max"``,
    ``"rlimit:RLIMIT_DATA+watchdog:memory"``), with its caveats."""

    mechanism: str
    caveats: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.mechanism} ({'; '.join(self.caveats)})" if self.caveats else self.mechanism

    def noting(self, *caveats: str) -> Held:
        return Held(self.mechanism, (*self.caveats, *caveats))

    @property
    def enforcement(self) -> Enforcement:
        """The ``enforced`` value: built from the parts, not parsed back
        from the string (a caveat may hold "; ")."""
        return Enforcement._held_by(str(self), self.mechanism, self.caveats)


@dataclasses.dataclass(frozen=True, slots=True)
class Unenforced:
    """A field nothing here holds, and why.  `asked`: a downgrade of what
    was asked for (warned about, refused by strict=True); else only said
    (nobody asked, or no sandbox here could run otherwise)."""

    reason: str
    asked: bool = True

    def __str__(self) -> str:
        return UNENFORCED + self.reason

    @property
    def enforcement(self) -> Enforcement:
        return Enforcement._unenforced(str(self), self.reason)


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """What one sandbox asks for, and the facts the planners decide on."""

    limits: Limits | None
    policy: Policy | None
    uid: int  # the user the program runs as (RLIMIT_NPROC counts that user's)
    privileged: bool  # may raise hard limits
    site: Site  # where its cgroup can go (``_cgroup.discover()``)
    # Why the program cannot run under a PID namespace's reaper, if it
    # cannot (a forked callable; a process group outside the namespace).
    no_reaper: str


@dataclasses.dataclass(slots=True)
class Plan:
    """What the spawn path and the supervisor do for one sandbox; each
    mechanism's module fills its part."""

    active: bool = False  # limits or policy given: a sandbox, not a plain Popen
    # field -> how it is held (insertion order is Popen.enforced's order).
    held: dict[str, Held | Unenforced] = dataclasses.field(default_factory=dict)
    # Held by a weaker mechanism than the field promises (no cgroup, no
    # mount namespace): refused by strict=True, with the reason.
    fallbacks: dict[str, str] = dataclasses.field(default_factory=dict)
    memory_by: Holder = Holder.NONE
    pids_by: Holder = Holder.NONE

    # rlimits (_rlimits): (resource, soft, hard), set in the child.
    rlimits: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    # The inherited hard limits the planners decided on ((resource, hard)):
    # a cached plan is reused only while they still hold (plan()).
    hard_seen: list[tuple[int, int]] = dataclasses.field(default_factory=list)

    # A cgroup per sandbox (_cgroup): where, the files written at creation
    # ((controller, file, value)), and the limits its counters decide
    # ((field, limit, mechanism): an OOM kill, a refused fork, the CPU used
    # ends the whole sandbox, unless the limit is tolerated).
    site: Site | None = None
    cgroup_settings: tuple[tuple[str, str, str], ...] = ()
    cg_ends: tuple[tuple[str, float, str], ...] = ()

    # The supervisor (_watchdog): what it samples and times.
    watch_memory: int | None = None
    watch_pids: int | None = None
    watch_cpu_time: float | None = None  # the tree's CPU (no cgroup)
    wall_time: float | None = None
    output: int | None = None
    truncate_output: bool = False
    kill_grace: float = 5.0
    tolerate: frozenset[str] = frozenset()
    disk: int | None = None  # bytes the workspace may hold

    # The workspace (_workspace).
    workspace: bool = False  # make a private workspace (cwd, TMPDIR) for the sandbox
    keep_workspace: bool = False

    # Namespaces (_namespaces, csrc/linux/namespaces.c): CLONE_NEW* flags
    # for the child; user_ns: through an unprivileged user namespace.
    ns_flags: int = 0
    user_ns: bool = False
    ro_view: bool = False  # the host read-only in a mount namespace of its own
    disk_tmpfs: bool = False  # disk held by a size-capped tmpfs on the workspace
    # The tmpfs's size: past the limit by a margin, so that a write past the
    # limit is seen (and ends the sandbox) rather than refused unseen;
    # exactly the limit when disk is tolerated (refusal semantics).
    tmpfs_size: int = 0
    # Its entries at most (nr_inodes): a page of it each, and 4096 more.
    # Empty files take no page; without a bound they take kernel memory,
    # and each is an inode of the host's when keep_workdir copies them out.
    tmpfs_inodes: int = 0

    # Landlock (_landlock): the ABI used for the file rules (0: none), and
    # its TCP rules (ABI 4+) and scopes (ABI 6+): (handled, allowed on
    # ports, ports, scoped).
    landlock: int = 0
    landlock_net: tuple[int, int, tuple[int, ...], int] = (0, 0, (), 0)

    # The process (_seccomp, _caps, the session).
    no_new_privs: bool = False
    seccomp: bool = False  # the hardening filter (csrc/linux/seccomp.c)
    seccomp_net: int = 0  # SECCOMP_NET_DENY / SECCOMP_NET_PROXY / SECCOMP_FAMILIES bits
    seccomp_signals: bool = False  # the filter alone keeps signals in (SECCOMP_SIGNALS)
    drop_caps: int = 0  # _core.CAPS_* bits
    caps_keep: int = 0
    new_session: bool = False  # setsid: no controlling terminal

    seatbelt: bool = False  # macOS (_seatbelt): the policy's profile applies
    # The filtering proxy (_proxy): the port its listener has on the
    # sandbox's own loopback (0: none).
    proxy_port: int = 0

    _enforced: dict[str, Enforcement] | None = None
    _downgrades: dict[str, str] | None = None

    # -- what planners call --------------------------------------------------

    def hold(self, field: str, mechanism: str, *caveats: str) -> None:
        self.held[field] = Held(mechanism, caveats)
        self._changed()

    def note(self, field: str, *caveats: str) -> None:
        """More caveats for a held field."""
        held = self.held[field]
        assert isinstance(held, Held), field
        self.held[field] = held.noting(*caveats)
        self._changed()

    def downgrade(self, field: str, reason: str) -> None:
        """Not enforced here: warned about, refused by strict=True."""
        self.held[field] = Unenforced(reason)
        self._changed()

    def say(self, field: str, reason: str) -> None:
        """Not enforced here, said but neither warned about nor refused:
        nobody asked for it, or no sandbox here could run otherwise."""
        self.held[field] = Unenforced(reason, asked=False)
        self._changed()

    def _changed(self) -> None:
        self._enforced = self._downgrades = None

    def takes(self, field: str) -> bool:
        """The field is not decided yet (an earlier planner may have)."""
        return field not in self.held

    # -- what the rest reads ---------------------------------------------------

    @property
    def enforced(self) -> dict[str, Enforcement]:
        """field -> mechanism string, or ``"unenforced: <why>"``."""
        if self._enforced is None:
            self._enforced = {f: h.enforcement for f, h in self.held.items()}
        return self._enforced

    @property
    def downgrades(self) -> dict[str, str]:
        """Fields nothing holds that were asked for (warned, refused by
        strict=True), with the reason."""
        if self._downgrades is None:
            self._downgrades = {
                f: h.reason for f, h in self.held.items() if isinstance(h, Unenforced) and h.asked
            }
        return self._downgrades

    @property
    def needs_monitor(self) -> bool:
        return (
            self.watch_memory is not None
            or self.watch_pids is not None
            or self.watch_cpu_time is not None
            or self.wall_time is not None
            or bool(self.cg_ends)
            or self.disk is not None
        )

    @property
    def seccomp_what(self) -> int:
        """The SECCOMP_* bits of the child's filter (0: none)."""
        if not (self.seccomp or self.seccomp_net or self.seccomp_signals):
            return 0
        from . import _core

        what = (_core.SECCOMP_HARDEN if self.seccomp else 0) | self.seccomp_net
        return what | _core.SECCOMP_SIGNALS if self.seccomp_signals else what


# request -> (the hard limits its plans depend on, {their values: plan}).
_cache: dict[tuple[object, ...], tuple[tuple[int, ...], dict[tuple[int, ...], Plan]]] = {}


def plan(
    limits: Limits | None,
    policy: Policy | None,
    *,
    uid: int,
    site: Site | None = None,
    no_reaper: str = "",
) -> Plan:
    """Decide mechanisms for `limits` and `policy`; `uid` is the user the
    program will run as (RLIMIT_NPROC counts that user's processes); `site`
    is where its cgroup can go (``_cgroup.discover()``); `no_reaper`: why
    the program cannot run under a PID namespace's reaper, if it cannot (a
    forked callable; a process group to join outside the namespace).

    Plans are cached: the same request on the same machine state gets the
    same (read-only) Plan.  An unprivileged process's plan depends on the
    inherited hard limits of the rlimits it sets (clamping): those, and
    only those, are read again at each call (none for a sandbox whose only
    rlimit is RLIMIT_CORE=0, as a cgroup or a Policy alone)."""
    if site is None:
        from ._cgroup import NO_SITE

        site = NO_SITE
    privileged = _platform.can_raise_hard_limits()
    key = (limits, policy, uid, privileged, site, no_reaper)
    entry = _cache.get(key)
    if entry is not None:
        depends, plans = entry
        p = plans.get(tuple([resource.getrlimit(r)[1] for r in depends]))
        if p is not None:
            return p
    p = _plan(Request(limits, policy, uid, privileged, site, no_reaper))
    if entry is None or entry[0] != tuple(r for r, _h in p.hard_seen):
        if len(_cache) > 256:
            _cache.clear()
        entry = _cache[key] = (tuple(r for r, _h in p.hard_seen), {})
    if len(entry[1]) > 16:
        entry[1].clear()
    # Keyed by what the planners saw, not by a later read: a hard limit
    # lowered meanwhile gets a plan of its own at the next call.
    entry[1][tuple(h for _r, h in p.hard_seen)] = p
    return p


def _plan(r: Request) -> Plan:
    p = Plan(active=r.limits is not None or r.policy is not None)
    if not p.active:
        return p
    if r.site.version:
        # Every sandbox gets a cgroup when one can be made: a tree kill that
        # nothing escapes, and usage that counts every process.
        p.site = r.site
    if r.limits is not None:
        p.kill_grace = r.limits.kill_grace
        p.tolerate = r.limits.tolerate
    for planner in _platform.planners():
        planner(p, r)
    return p


_warned: set[tuple[str, str]] = set()


def _caller_stacklevel() -> int:
    """The stacklevel that points at the first frame outside sbxlimit."""
    here = os.path.dirname(os.path.abspath(__file__))
    frame = sys._getframe(1)
    level = 1
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == here:
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


def warn_downgrades(p: Plan) -> None:
    """One RuntimeWarning per (field, reason) per process, attributed to the
    caller's line."""
    stacklevel = _caller_stacklevel()
    for field, reason in p.downgrades.items():
        key = (field, reason)
        if key in _warned:
            continue
        _warned.add(key)
        warnings.warn(
            f"sbxlimit: {field} is not enforced here: {reason}. "
            "Pass Policy(strict=True) to refuse instead; see `python -m sbxlimit doctor`.",
            RuntimeWarning,
            stacklevel=stacklevel,
        )
