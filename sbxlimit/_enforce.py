"""Choose, per limit and protection, the mechanism that will hold it.

``plan()`` is the single place where a request meets the platform: it
returns the rlimits the child sets, what the supervisor watches, and the
``enforced`` map (field → mechanism, or ``"unenforced: <why>"``).  Every
downgrade is listed so that ``strict=True`` can refuse before anything
starts.  The mechanism strings are the ones ``doctor()`` and the docs use.

Mechanism strings: ``<mechanism>[+<mechanism>...][ (<caveat>)]``, or
``unenforced: <reason>``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import resource
import sys
import warnings

from . import _core
from ._cgroup import Site
from ._errors import ConfigError
from ._limits import Limits
from ._policy import CAPABILITIES, Policy
from ._protected import MAX_DEPTH
from ._seatbelt import HELPER as SEATBELT_HELPER

__all__ = ["UNENFORCED", "Plan", "can_raise_hard_limits", "plan", "warn_downgrades"]

UNENFORCED = "unenforced: "
_NOT_DUMPABLE = "execve resets PR_SET_DUMPABLE, and there is no seccomp on this platform"
LINUX = sys.platform.startswith("linux")
DARWIN = sys.platform == "darwin"
_INF = resource.RLIM_INFINITY


@dataclasses.dataclass(slots=True)
class Plan:
    """What the spawn path does for one sandbox."""

    active: bool = False  # limits or policy given: a sandbox, not a plain Popen
    rlimits: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    enforced: dict[str, str] = dataclasses.field(default_factory=dict)
    downgrades: dict[str, str] = dataclasses.field(default_factory=dict)
    watch_memory: int | None = None
    watch_pids: int | None = None
    watch_cpu_time: float | None = None  # the tree's CPU (no cgroup)
    # Limits the cgroup's counters decide, (field, limit, mechanism): an
    # OOM kill (memory), a refused fork (pids), the CPU used (cpu_time)
    # ends the whole sandbox, unless the limit is tolerated.
    cg_ends: tuple[tuple[str, float, str], ...] = ()
    tolerate: frozenset[str] = frozenset()
    wall_time: float | None = None
    output: int | None = None
    truncate_output: bool = False
    kill_grace: float = 5.0
    no_new_privs: bool = False
    # A cgroup per sandbox: (controller, file, value) written at creation.
    site: Site | None = None
    cgroup_settings: tuple[tuple[str, str, str], ...] = ()
    # Held by a weaker mechanism because no cgroup is available: refused by
    # strict=True, with the reason.
    fallbacks: dict[str, str] = dataclasses.field(default_factory=dict)
    seatbelt: bool = False  # macOS: exec through sandbox-exec with the policy's profile
    seccomp: bool = False  # Linux: the hardening filter (csrc/linux/seccomp.c)
    workspace: bool = False  # make a private workspace (cwd, TMPDIR) for the sandbox
    landlock: int = 0  # Landlock ABI used for the file rules; 0: none
    keep_workspace: bool = False
    disk: int | None = None  # bytes the workspace may hold (watchdog)
    # The tmpfs's size: past the limit by a margin, so that a write past the
    # limit is seen (and ends the sandbox) rather than refused unseen;
    # exactly the limit when disk is tolerated (refusal semantics).
    tmpfs_size: int = 0
    # Namespaces (csrc/linux/namespaces.c): CLONE_NEW* flags for the child;
    # user_ns: through an unprivileged user namespace (uid/gid map to self).
    ns_flags: int = 0
    user_ns: bool = False
    disk_tmpfs: bool = False  # disk held by a size-capped tmpfs on the workspace
    seccomp_net: int = 0  # SECCOMP_NET_DENY / SECCOMP_NET_PROXY / SECCOMP_FAMILIES bits
    # Landlock TCP rules (ABI 4+) and scopes (ABI 6+): (handled, allowed on
    # ports, ports, scoped)
    landlock_net: tuple[int, int, tuple[int, ...], int] = (0, 0, (), 0)
    # Capabilities (csrc/linux/caps.c): _core.CAPS_* bits, and the kept set.
    drop_caps: int = 0
    caps_keep: int = 0
    new_session: bool = False  # setsid: no controlling terminal
    ro_view: bool = False  # the host read-only in a mount namespace of its own

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
        return (_core.SECCOMP_HARDEN if self.seccomp else 0) | self.seccomp_net


def _rlimit(
    p: Plan, field: str, res: int, soft: int, hard: int, mechanism: str, privileged: bool
) -> None:
    """Add one rlimit, clamped to the inherited hard limit when we cannot
    raise it (setrlimit would fail with EPERM in the child)."""
    note = ""
    if not privileged:
        _cur_soft, cur_hard = resource.getrlimit(res)
        if cur_hard != _INF:
            if soft > cur_hard:
                soft = cur_hard
                note = f" (clamped to the inherited hard limit {cur_hard})"
            hard = min(hard, cur_hard)
    p.rlimits.append((res, soft, hard))
    if field:
        p.enforced[field] = mechanism + note


def _downgrade(p: Plan, field: str, reason: str) -> None:
    p.enforced[field] = UNENFORCED + reason
    p.downgrades[field] = reason


_HARD = (
    resource.RLIMIT_CPU,
    resource.RLIMIT_FSIZE,
    resource.RLIMIT_NOFILE,
    resource.RLIMIT_DATA,
    resource.RLIMIT_AS,
    resource.RLIMIT_NPROC,
)
_cache: dict[tuple[object, ...], Plan] = {}


_NO_SITE = Site(0, reason="cgroups not considered")


def plan(
    limits: Limits | None,
    policy: Policy | None,
    *,
    uid: int,
    site: Site = _NO_SITE,
    no_reaper: str = "",
) -> Plan:
    """Decide mechanisms for `limits` and `policy`; `uid` is the user the
    program will run as (RLIMIT_NPROC counts that user's processes); `site`
    is where its cgroup can go (``_cgroup.discover()``); `no_reaper`: why
    the program cannot run under a PID namespace's reaper, if it cannot (a
    forked callable; a process group to join outside the namespace).

    Plans are cached: the same request on the same machine state gets the
    same (read-only) Plan.  The key includes the inherited hard limits,
    which decide clamping for an unprivileged process."""
    privileged = can_raise_hard_limits()
    hard = () if privileged else tuple(resource.getrlimit(r)[1] for r in _HARD)
    key = (limits, policy, uid, privileged, hard, site, no_reaper)
    p = _cache.get(key)
    if p is None:
        if len(_cache) > 256:
            _cache.clear()
        p = _cache[key] = _plan(
            limits, policy, uid=uid, privileged=privileged, site=site, no_reaper=no_reaper
        )
    return p


def _plan(
    limits: Limits | None,
    policy: Policy | None,
    *,
    uid: int,
    privileged: bool,
    site: Site,
    no_reaper: str,
) -> Plan:
    p = Plan(active=limits is not None or policy is not None)
    if not p.active:
        return p
    tree = bool(_core.HAS_PROCTREE)
    settings: list[tuple[str, str, str]] = []
    if site.version:
        # Every sandbox gets a cgroup when one can be made: a tree kill that
        # nothing escapes, and usage that counts every process.
        p.site = site

    # Core dumps off for every sandbox: they can leak memory contents and
    # fill the disk.
    _rlimit(p, "", resource.RLIMIT_CORE, 0, 0, "", privileged)
    p.enforced["core_dumps"] = "rlimit:RLIMIT_CORE"

    ends: list[tuple[str, float, str]] = []
    if limits is not None:
        p.kill_grace = limits.kill_grace
        p.tolerate = limits.tolerate
        if limits.cpu_time is not None:
            # The whole sandbox's CPU, sampled (the cgroup's counter, else the
            # tree's with the children it reaped); RLIMIT_CPU stays as a
            # per-process backstop: SIGXCPU at the soft limit, SIGKILL one
            # second later.
            soft = math.ceil(limits.cpu_time)
            whole = ""
            if site.version == 2 or any(c == "cpuacct" for c, _d in site.parents):
                whole = f"{site.label}:" + ("cpu.stat" if site.version == 2 else "cpuacct.usage")
                ends.append(("cpu_time", limits.cpu_time, whole))
            elif tree:
                whole = "watchdog:cpu_time"
                p.watch_cpu_time = limits.cpu_time
            mech = f"{whole}+rlimit:RLIMIT_CPU" if whole else "rlimit:RLIMIT_CPU"
            _rlimit(p, "cpu_time", resource.RLIMIT_CPU, soft, soft + 1, mech, privileged)
            if not whole:
                p.enforced["cpu_time"] += " (per process: no cgroup and no tree watchdog here)"
            elif DARWIN:
                # XNU sends one SIGXCPU at the soft limit and never acts on
                # the hard one: only the watchdog stops a program that
                # ignores it.
                p.enforced["cpu_time"] += (
                    " (the watchdog ends the tree; RLIMIT_CPU only sends SIGXCPU on macOS)"
                )
        if limits.file_size is not None:
            n = limits.file_size
            _rlimit(p, "file_size", resource.RLIMIT_FSIZE, n, n, "rlimit:RLIMIT_FSIZE", privileged)
        if limits.open_files is not None:
            n = limits.open_files
            _rlimit(
                p, "open_files", resource.RLIMIT_NOFILE, n, n, "rlimit:RLIMIT_NOFILE", privileged
            )
        if limits.memory is not None and site.has("memory"):
            n = limits.memory
            if site.version == 2:
                settings += [("", "memory.max", str(n)), ("", "memory.swap.max", "0")]
                if "memory" not in limits.tolerate:
                    # The sandbox dies as a whole, not one process of it.
                    settings.append(("", "memory.oom.group", "1"))
                p.enforced["memory"] = "cgroup2:memory.max"
            else:
                settings.append(("memory", "memory.limit_in_bytes", str(n)))
                if site.swap:
                    settings.append(("memory", "memory.memsw.limit_in_bytes", str(n)))
                p.enforced["memory"] = "cgroup1:memory.limit_in_bytes"
            if "memory" not in limits.tolerate:
                ends.append(("memory", n, p.enforced["memory"]))
        elif limits.memory is not None and DARWIN:
            # No rlimit: since macOS 12 setrlimit(RLIMIT_DATA) fails below
            # the address map's size (hundreds of GiB on arm64), which a
            # child copied from the caller already has.  The watchdog sums
            # phys_footprint, what macOS itself charges a process.
            p.fallbacks["memory"] = "no cgroups on macOS"
            p.watch_memory = limits.memory
            p.enforced["memory"] = (
                "watchdog:memory (phys_footprint of every process of the tree, sampled: "
                "a fast allocator can overshoot between samples; the whole tree is ended)"
            )
        elif limits.memory is not None:
            # RLIMIT_DATA, not RLIMIT_AS: runtimes that reserve large
            # PROT_NONE ranges (V8, the JVM, Go) break under an AS cap.
            p.fallbacks["memory"] = _no_cgroup(site, "memory")
            n = limits.memory
            mech = "rlimit:RLIMIT_DATA+watchdog:memory" if tree else "rlimit:RLIMIT_DATA"
            _rlimit(p, "memory", resource.RLIMIT_DATA, n, n, mech, privileged)
            if tree:
                p.watch_memory = n
            else:
                p.enforced["memory"] += " (per process; no tree watchdog on this platform)"
        if limits.address_space is not None and DARWIN:
            _downgrade(
                p,
                "address_space",
                "macOS 12+ refuses an RLIMIT_AS below the size of the address map, which "
                "starts at hundreds of GiB on arm64: it cannot cap a program; use memory",
            )
        elif limits.address_space is not None:
            n = limits.address_space
            _rlimit(p, "address_space", resource.RLIMIT_AS, n, n, "rlimit:RLIMIT_AS", privileged)
        if limits.pids is not None and site.has("pids"):
            settings.append(("" if site.version == 2 else "pids", "pids.max", str(limits.pids)))
            p.enforced["pids"] = f"{site.label}:pids.max"
            if "pids" not in limits.tolerate:
                ends.append(("pids", limits.pids, p.enforced["pids"]))
        elif limits.pids is not None:
            p.fallbacks["pids"] = _no_cgroup(site, "pids")
            _plan_pids(p, limits.pids, uid=uid, tree=tree, privileged=privileged)
        if limits.wall_time is not None:
            p.wall_time = limits.wall_time
            p.enforced["wall_time"] = "watchdog:wall_time"
        if limits.output is not None:
            p.output = limits.output
            p.truncate_output = limits.truncate_output
            p.enforced["output"] = "supervisor:output" + (
                " (truncated, not killed)" if limits.truncate_output else ""
            )
        if limits.cpu is not None and site.has("cpu"):
            # Quota per 100 ms period; the kernel's minimum quota is 1 ms.
            quota = max(1000, limits.cpu * 100)
            if site.version == 2:
                settings.append(("", "cpu.max", f"{quota} 100000"))
                p.enforced["cpu"] = "cgroup2:cpu.max"
            else:
                settings.append(("cpu", "cpu.cfs_period_us", "100000"))
                settings.append(("cpu", "cpu.cfs_quota_us", str(quota)))
                p.enforced["cpu"] = "cgroup1:cpu.cfs_quota_us"
        elif limits.cpu is not None:
            _downgrade(p, "cpu", _no_cgroup(site, "cpu"))
        if limits.disk is not None:
            # A workspace to hold the cap: the private one, or workdir.
            p.disk = limits.disk
            private = policy is None or policy.workdir is None
            ns = namespaces(CLONE_NEWNS) if private and LINUX else None
            if ns is not None and ns.ok:
                # A tmpfs of that size over the private workspace, in a
                # mount namespace of the child's: writes past it fail.
                p.disk_tmpfs = True
                n = limits.disk
                p.tmpfs_size = n if "disk" in limits.tolerate else n + max(1 << 20, n // 16)
                p.ns_flags |= CLONE_NEWNS
                p.user_ns = p.user_ns or ns.user
                p.enforced["disk"] = (
                    f"{ns.label('mountns')}+tmpfs:size (writes past it fail with ENOSPC; "
                    "memory-backed: its pages count toward the memory limit)"
                    if "disk" in limits.tolerate
                    else f"{ns.label('mountns')}+tmpfs:size+watchdog:disk (the tmpfs holds "
                    "the limit + 1/16, at least 1 MiB; past the limit the sandbox is ended; "
                    "memory-backed: its pages count toward the memory limit)"
                )
            else:
                why = f"; no tmpfs: {ns.reason}" if ns is not None else ""
                p.enforced["disk"] = (
                    "watchdog:disk (the workspace's size, sampled; a burst between samples "
                    f"can pass the cap before the kill{why})"
                )
            if private:
                p.workspace = True

    if policy is not None:
        _plan_policy(p, policy, uid, no_reaper)
    elif LINUX:
        _plan_containment(p, no_reaper, uid, auto=True)
    if DARWIN:
        # Said, not refused by strict: nobody asked for it, and no macOS
        # sandbox could run under strict=True otherwise.
        p.enforced["die_with_parent"] = (
            UNENFORCED + "macOS has no parent-death signal: a sandbox outlives a caller that "
            "is killed; end it with kill_tree(), a with block or wall_time"
        )
    if (
        limits is not None
        and limits.pids is not None
        and "pids" not in limits.tolerate
        and p.enforced["pids"].startswith("rlimit")
        and p.user_ns
    ):
        _nproc_room(p, limits.pids)
    p.cgroup_settings = tuple(settings)
    p.cg_ends = tuple(ends)
    return p


def _nproc_room(p: Plan, pids: int) -> None:
    """In a user namespace of its own the kernel counts RLIMIT_NPROC for
    the sandbox alone (PID 1 included): a margin past the limit (1/8, at
    least 4), so that the watchdog's samples see a tree past it and end the
    sandbox.  At the limit, a program that retries refused forks would spin
    until wall_time; one past it, a fork loop that reaps quickly is seen
    there only now and then."""
    room = pids + max(4, pids // 8) + (1 if p.ns_flags & CLONE_NEWPID else 0)
    if not can_raise_hard_limits():
        cur_hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        room = room if cur_hard == _INF else min(room, cur_hard)
    p.rlimits = [
        (res, room, room) if res == resource.RLIMIT_NPROC and soft >= pids else (res, soft, hard)
        for res, soft, hard in p.rlimits
    ]
    mech = p.enforced["pids"].split(" (", 1)[0]
    p.enforced["pids"] = (
        f"{mech} (counted in the sandbox's own user namespace; a fork past the limit ends "
        f"the sandbox; the kernel refuses forks beyond {room} tasks)"
    )


def _plan_containment(p: Plan, no_reaper: str, uid: int, auto: bool) -> None:
    """Without a cgroup, a PID namespace by default (``isolate_pids=None``):
    a process that double-forks and changes session leaves the tree the
    watchdog walks, but not the namespace, which the kernel empties when
    the program ends.  Where the program cannot run under a reaper
    (`no_reaper` says why), it keeps the walk."""
    if p.site is not None or not LINUX:
        return
    walk = "tree walk (process group and descendants; a double fork that changes session escapes)"
    ns = namespaces(CLONE_NEWPID | CLONE_NEWNS) if auto and not no_reaper else None
    why = ""
    if not auto:
        why = "isolate_pids=False"
    elif ns is None:
        why = no_reaper
    elif not ns.ok:
        why = f"no PID namespace: {ns.reason}"
        p.fallbacks["kill_tree"] = why  # weaker than SPEC's promise: strict refuses
    elif ns.user and uid != os.geteuid():
        # Only our own uid maps into an unprivileged user namespace: the
        # change of user fails as it would without one (EPERM), not there.
        why = f"a user namespace maps only uid {os.geteuid()}, and user= asks for {uid}"
    if why:
        p.enforced["kill_tree"] = f"{walk}; {why}"
        return
    assert ns is not None
    p.ns_flags |= CLONE_NEWPID | CLONE_NEWNS
    p.user_ns = p.user_ns or ns.user
    p.enforced["kill_tree"] = (
        f"{ns.label('pidns')} (no cgroup: the program is PID 2 under a reaper as PID 1, "
        "and everything left in the namespace dies with it)"
    )


def _no_cgroup(site: Site, controller: str) -> str:
    if site.version:
        return f"the {controller} controller is not available here ({site.reason})"
    return f"no cgroup can be used: {site.reason}"


def _plan_pids(p: Plan, pids: int, *, uid: int, tree: bool, privileged: bool) -> None:
    if not LINUX:
        # RLIMIT_NPROC is per user on macOS and known to misbehave: not used.
        if tree:
            p.watch_pids = pids
            p.enforced["pids"] = (
                "watchdog:pids (RLIMIT_NPROC is per user here; a fast fork loop can overshoot "
                "between samples; the whole tree is ended)"
            )
        else:
            _downgrade(
                p, "pids", "RLIMIT_NPROC is per user on this platform and there is no cgroup"
            )
        return
    if uid == 0:
        # The kernel does not apply RLIMIT_NPROC to root (or CAP_SYS_RESOURCE).
        if tree:
            p.watch_pids = pids
            p.enforced["pids"] = (
                "watchdog:pids (RLIMIT_NPROC does not bind root; a fast fork loop can "
                "overshoot between samples)"
            )
        else:
            _downgrade(p, "pids", "RLIMIT_NPROC does not bind root and there is no cgroup")
        return
    _rlimit(
        p,
        "pids",
        resource.RLIMIT_NPROC,
        pids,
        pids,
        "rlimit:RLIMIT_NPROC" + ("+watchdog:pids" if tree else ""),
        privileged,
    )
    caveat = f"RLIMIT_NPROC counts every process of uid {uid}, not only this sandbox's"
    mech = p.enforced["pids"]
    if mech.endswith(")"):  # already clamped: one parenthesis, two notes
        p.enforced["pids"] = f"{mech[:-1]}; {caveat})"
    else:
        p.enforced["pids"] = f"{mech} ({caveat})"
    if tree:
        p.watch_pids = pids


def _plan_policy(p: Plan, policy: Policy, uid: int, no_reaper: str) -> None:
    if policy.workdir is None:
        p.workspace = True
        p.keep_workspace = policy.keep_workdir
        p.enforced["workspace"] = "supervisor:workspace (private 0700 directory, cwd and TMPDIR)"
    if DARWIN:
        _plan_seatbelt(p, policy)
    else:
        abi = _core.landlock_abi() if LINUX else -1
        if abi >= 1:
            p.landlock = abi
            # landlock_restrict_self needs no_new_privs (or CAP_SYS_ADMIN),
            # whatever `harden` says.
            p.no_new_privs = True
        _plan_files(p, policy, abi)
        if policy.network != "allow":
            _plan_network(p, policy, abi)
        if policy.isolate_pids:
            ns = namespaces(CLONE_NEWPID | CLONE_NEWNS) if LINUX else None
            if ns is not None and ns.ok:
                p.ns_flags |= CLONE_NEWPID | CLONE_NEWNS
                p.user_ns = p.user_ns or ns.user
                p.enforced["isolate_pids"] = (
                    f"{ns.label('pidns')} (the program is PID 2 under a reaper as PID 1; "
                    "everything left in it dies with it)"
                )
            else:
                why = ns.reason if ns is not None else "PID namespaces exist only on Linux"
                _downgrade(p, "isolate_pids", why)
        else:
            _plan_containment(p, no_reaper, uid, auto=policy.isolate_pids is None)
    if DARWIN and policy.isolate_pids:
        _downgrade(p, "isolate_pids", "PID namespaces exist only on Linux")
    env = "LD_*, DYLD_* dropped" if policy.env == "sanitize" else "allow-list"
    if policy.drop_secrets:
        env += "; names with KEY, SECRET, TOKEN or PASSWORD dropped"
    p.enforced["env"] = f"supervisor:env ({env})"
    if policy.workdir is not None:
        p.enforced["workspace"] = "supervisor:workdir (used as given, not removed)"
    if policy.harden:
        if LINUX:
            p.no_new_privs = True
            p.enforced["no_new_privs"] = "prctl:PR_SET_NO_NEW_PRIVS"
        else:
            _downgrade(p, "no_new_privs", "no_new_privs exists only on Linux")
        if LINUX and _core.HAS_SECCOMP and seccomp_works():
            p.seccomp = True
            p.enforced["seccomp"] = (
                f"seccomp:allow-list v{_core.SECCOMP_VERSION} (socket families: unix, inet, "
                "netlink route; no new namespaces, setns, device nodes, TIOCSTI, signals or "
                "prlimit to the caller; EPERM for ptrace, process_vm_*, bpf, perf_event_open, "
                "keys, userfaultfd, io_uring, mount, modules, open_by_handle_at, reboot, clocks)"
            )
            # PR_SET_DUMPABLE does not survive execve; what it would protect
            # against (another process reading this one) is refused instead.
            p.enforced["not_dumpable"] = "seccomp:ptrace+process_vm_readv refused"
        elif LINUX:
            why = (
                "no seccomp filter for this architecture"
                if not _core.HAS_SECCOMP
                else "seccomp filters cannot be loaded here (see doctor)"
            )
            _downgrade(p, "seccomp", why)
            _downgrade(p, "not_dumpable", f"execve resets PR_SET_DUMPABLE, and {why}")
        else:
            _downgrade(p, "not_dumpable", _NOT_DUMPABLE)
    if LINUX:
        _plan_caps(p, policy, uid)
        _plan_processes(p, policy)
        # Said, not refused by strict (no Linux sandbox could run under
        # strict=True otherwise): Landlock ABI 9 (Linux 7.1) is the first
        # rule for a connect by path.
        p.enforced["unix_sockets"] = UNENFORCED + (
            "Linux has no rule for connecting to a Unix socket by its path before Landlock "
            "ABI 9 (Linux 7.1): a socket the program's user may open (the Docker socket, "
            "ssh-agent) is reachable; deny_read removes one from the sandbox's view"
        )
    _plan_terminal(p, policy)


def _plan_files(p: Plan, policy: Policy, abi: int) -> None:
    """Linux: the read-only view where a mount namespace can be made,
    Landlock on top (or alone)."""
    view = namespaces(CLONE_NEWNS, view=True) if LINUX else None
    held = []
    if view is not None and view.ok:
        if len(policy.writable_roots) >= _core.VIEW_MAX_RW:
            raise ConfigError(
                "Policy.writable_roots",
                f"{len(policy.writable_roots)} paths",
                f"at most {_core.VIEW_MAX_RW - 1} on Linux (name a common parent instead)",
            )
        p.ro_view = True
        p.ns_flags |= CLONE_NEWNS
        p.user_ns = p.user_ns or view.user
        held.append(view.label("mountns") + ":ro-view")
    if abi >= 1:
        held.append(f"landlock:abi{abi}")
    what = (
        "reads everywhere but deny_read; writes: workspace, writable_roots, terminal and "
        "null devices, a private /dev/shm"
    )
    if not held:
        why = "no mount namespace and no Landlock here (Linux 5.13+, see doctor)"
        if view is not None:
            why = f"Landlock is not available (Linux 5.13+) and no mount namespace: {view.reason}"
        _downgrade(p, "files", why)
        if policy.protect_dotfiles:
            _downgrade(p, "protect_dotfiles", why)
        return
    if not p.ro_view:
        # Landlock alone: it has no right for metadata, nor for connecting
        # to a unix socket (deny_read hides its contents, not the socket).
        gap = (
            "chmod, chown, utime and xattrs outside the writable roots, and connects to unix "
            f"sockets under deny_read, are not refused: no mount namespace ({view and view.reason})"
        )
        p.fallbacks["files"] = gap
        what += f"; {gap}"
    p.enforced["files"] = f"{'+'.join(held)} ({what})"
    if policy.protect_dotfiles:
        which = (
            "HOME's dotfiles; .git/hooks and .git/config of the repositories up to "
            f"{MAX_DEPTH} levels below each writable root"
        )
        if p.ro_view:
            p.enforced["protect_dotfiles"] = f"{held[0]} (bound read-only: {which})"
        else:
            p.enforced["protect_dotfiles"] = (
                f"{held[0]} (carved: {which}; no new entry can be made in a directory on "
                "the way to one, so git cannot write in those .git directories)"
            )


def _plan_caps(p: Plan, policy: Policy, uid: int) -> None:
    """Every capability but those the caller grants leaves the program."""
    keep = 0
    for name in policy.capabilities:
        keep |= 1 << CAPABILITIES.index(name)
    bounding = _capability(_CAP_SETPCAP) or p.user_ns
    p.drop_caps = _core.CAPS_DROP | (_core.CAPS_BOUNDING if bounding else 0)
    p.caps_keep = keep
    kept = f" but {', '.join(policy.capabilities)}" if keep else ""
    if bounding:
        p.enforced["capabilities"] = (
            f"prctl:dropped{kept} (bounding set, ambient, securebits: root gets none back at "
            "execve)"
        )
    elif p.no_new_privs or uid != 0:
        p.enforced["capabilities"] = (
            f"prctl:dropped{kept} (no CAP_SETPCAP to empty the bounding set; no_new_privs keeps "
            "execve from granting any)"
        )
    else:
        _downgrade(
            p,
            "capabilities",
            "root regains the bounding set at execve: no CAP_SETPCAP to empty it, and "
            "harden=False leaves no_new_privs off",
        )


def _plan_processes(p: Plan, policy: Policy) -> None:
    """Signals and abstract unix sockets: Landlock's scopes (ABI 6) hold
    them to the sandbox's own processes; a PID or network namespace hides
    the rest, the filter at least keeps the caller out of reach."""
    scoped = p.landlock >= 6
    if scoped:
        h, a, ports, _ = p.landlock_net
        p.landlock_net = (h, a, ports, _LL_SCOPE_ABSTRACT_UNIX | _LL_SCOPE_SIGNAL)
    own = "its own processes only"
    if scoped:
        p.enforced["signals"] = f"landlock:abi{p.landlock} scope ({own})"
    elif p.ns_flags & CLONE_NEWPID:
        p.enforced["signals"] = "pidns (it sees only its own processes)"
    elif p.seccomp:
        gap = (
            "the caller and kill(-1) are refused, other processes of the same user are not "
            f"(Landlock ABI 6 scopes signals; ABI {max(p.landlock, 0)} here)"
        )
        p.enforced["signals"] = f"seccomp:caller ({gap})"
        p.fallbacks["signals"] = gap
    else:
        _downgrade(p, "signals", "neither Landlock ABI 6 nor a seccomp filter here")
    if scoped:
        p.enforced["abstract_sockets"] = f"landlock:abi{p.landlock} scope ({own})"
    elif p.ns_flags & CLONE_NEWNET:
        p.enforced["abstract_sockets"] = "netns (a namespace of its own)"
    else:
        _downgrade(
            p,
            "abstract_sockets",
            f"host abstract unix sockets are reachable: Landlock ABI 6 scopes them "
            f"(ABI {max(p.landlock, 0)} here)",
        )


def _plan_terminal(p: Plan, policy: Policy) -> None:
    filt = ""
    if p.seccomp:
        filt = " (TIOCSTI and TIOCLINUX refused by seccomp)"
    elif p.seatbelt:
        filt = (
            " (TIOCSTI refused by the Seatbelt profile; no terminal of the user's but those on "
            "its stdio)"
        )
    if policy.terminal:
        p.enforced["terminal"] = f"shared: Policy(terminal=True){filt}"
        return
    p.new_session = True
    p.enforced["terminal"] = f"session:setsid (no controlling terminal){filt}"


def _plan_network(p: Plan, policy: Policy, abi: int) -> None:
    """Linux: "deny" is a network namespace of the child's own (only its
    loopback) where one can be made, else Landlock TCP rules plus seccomp
    socket rules; "proxy" keeps the host's loopback (where the proxies
    listen) and allows TCP connects to proxy_ports only."""
    filt = _core.HAS_SECCOMP and seccomp_works()
    tcp = abi >= 4
    if policy.network == "deny":
        ns = namespaces(CLONE_NEWNET)
        if ns.ok:
            p.ns_flags |= CLONE_NEWNET
            p.user_ns = p.user_ns or ns.user
            mech = ns.label("netns")
            if filt:
                # A namespace does not cut vsock off (it reaches the
                # hypervisor), nor packet or netlink sockets of the host's
                # other families: only unix, inet and netlink routes.
                p.seccomp_net = _core.SECCOMP_FAMILIES
                p.no_new_privs = True
                mech += "+seccomp:socket families"
            p.enforced["network"] = f"{mech} (a network namespace of its own: loopback only)"
            return
        if not filt and not tcp:
            _downgrade(
                p,
                "network",
                f"no network namespace ({ns.reason}), no seccomp filter and no Landlock TCP "
                "rules (ABI 4, Linux 6.7)",
            )
            return
        held = []
        if tcp:
            # Handled with no port allowed: every TCP bind and connect,
            # inherited sockets included.  Abstract unix sockets reach the
            # host's services too: scoped from ABI 6.
            p.landlock_net = (_LL_TCP, 0, (), 0)
            held.append(f"landlock:abi{abi} tcp")
        if filt:
            p.seccomp_net = _core.SECCOMP_NET_DENY
            p.no_new_privs = True
            held.append("seccomp:socket")
        notes = [f"no network namespace: {ns.reason}"]
        if not filt:
            # Landlock holds TCP only: UDP would still get out.
            gap = "no seccomp filter here, so UDP and other non-TCP sockets are not refused"
            notes.append(gap)
            p.fallbacks["network"] = gap
        if not tcp:
            notes.append("sockets it inherited keep working (no Landlock TCP rules before ABI 4)")
        p.enforced["network"] = "+".join(held) + f" ({'; '.join(notes)})"
        return
    # proxy
    if not (filt and tcp):
        missing = "Landlock TCP rules (ABI 4, Linux 6.7)" if not tcp else "a seccomp filter"
        _downgrade(p, "network", f"network='proxy' needs {missing}, not available here")
        return
    p.landlock_net = (_LL_TCP, _LL_CONNECT_TCP, policy.proxy_ports, 0)
    p.seccomp_net = _core.SECCOMP_NET_PROXY
    p.no_new_privs = True
    ports = ",".join(str(x) for x in policy.proxy_ports)
    p.enforced["network"] = (
        f"landlock:abi{abi} tcp connect to {ports}+seccomp:socket (TCP only) "
        "(ports are matched, not addresses: keep proxy ports off the outside network)"
    )


CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
_LL_BIND_TCP, _LL_CONNECT_TCP = 1, 2
_LL_TCP = _LL_BIND_TCP | _LL_CONNECT_TCP
_LL_SCOPE_ABSTRACT_UNIX, _LL_SCOPE_SIGNAL = 1, 2
_CAP_SETPCAP, _CAP_SYS_ADMIN = 8, 21


@dataclasses.dataclass(frozen=True, slots=True)
class Namespaces:
    """Whether namespaces can be made here, and how."""

    ok: bool
    user: bool = False  # through an unprivileged user namespace
    reason: str = ""

    def label(self, kind: str) -> str:
        return f"userns+{kind}" if self.user else kind


@functools.cache
def namespaces(flags: int, view: bool = False) -> Namespaces:
    """Try `flags` (CLONE_NEW*) for real, in a child: directly where we hold
    CAP_SYS_ADMIN, else inside an unprivileged user namespace (uid/gid
    mapped to our own); with `view`, also the read-only view's mount calls
    (csrc/linux/namespaces.c).  ``SBXLIMIT_NAMESPACES=0`` turns them off (a
    container whose seccomp profile kills on unshare, or to use the
    fallbacks on purpose)."""
    if os.environ.get("SBXLIMIT_NAMESPACES") == "0":
        return Namespaces(False, reason="namespaces turned off (SBXLIMIT_NAMESPACES=0)")
    kind = _core.PROBE_RO_VIEW if view else _core.PROBE_NAMESPACES
    if _capability(_CAP_SYS_ADMIN):
        err = _core.probe(kind, flags, 2000)
        if err == 0:
            return Namespaces(True)
        if view and namespaces(flags).ok:
            return _no_view(err)
    err = _core.probe(kind, flags | CLONE_NEWUSER, 2000)
    if err == 0:
        return Namespaces(True, user=True)
    if view and namespaces(flags).ok:
        return _no_view(err)
    why = (
        _userns_blocked() or f"setting up an unprivileged user namespace failed: {os.strerror(err)}"
    )
    return Namespaces(False, reason=why)


def _no_view(err: int) -> Namespaces:
    """The namespace works, the read-only view's mount calls do not."""
    return Namespaces(
        False,
        reason="the read-only view needs open_tree, move_mount and mount_setattr "
        f"(Linux 5.12): {os.strerror(err)}",
    )


# sysctl, the value that blocks unprivileged user namespaces, the fix
# (doctor's user_namespace row uses the same table).
USERNS_BLOCKERS = (
    ("kernel.unprivileged_userns_clone", "0", "1"),
    ("user.max_user_namespaces", "0", "10000"),
    ("kernel.apparmor_restrict_unprivileged_userns", "1", "0"),
)


def userns_blockers() -> list[tuple[str, str, str]]:
    """The (sysctl, its value, the fix) that forbid unprivileged user
    namespaces here."""
    found = []
    for name, bad, good in USERNS_BLOCKERS:
        try:
            with open("/proc/sys/" + name.replace(".", "/")) as f:
                if f.read().strip() == bad:
                    found.append((name, bad, good))
        except OSError:
            continue
    return found


def _userns_blocked() -> str:
    """Why unprivileged user namespaces are forbidden here, if a knob says."""
    found = userns_blockers()
    if not found:
        return ""
    knobs = ", ".join(f"{name}={bad}" for name, bad, _good in found)
    apparmor = any("apparmor" in name for name, _b, _g in found)
    extra = " (AppArmor: Ubuntu 24.04's default)" if apparmor else ""
    return f"unprivileged user namespaces are disabled: sysctl {knobs}{extra}"


_SEATBELT = "seatbelt:sandbox_init"


def _plan_seatbelt(p: Plan, policy: Policy) -> None:
    """macOS: one Seatbelt profile holds files, dotfiles and network; it
    always limits writes (workspace, temp dirs, writable_roots)."""
    asked = []
    if policy.writable_roots or policy.deny_read or policy.deny_write:
        asked.append("files")
    if policy.protect_dotfiles:
        asked.append("protect_dotfiles")
    if policy.network != "allow":
        asked.append("network")
    if not os.access(SEATBELT_HELPER, os.X_OK):
        for field in asked or ["files"]:
            _downgrade(
                p, field, f"{SEATBELT_HELPER} is missing (sbxlimit was installed without it)"
            )
        return
    p.seatbelt = True
    p.enforced["files"] = (
        f"{_SEATBELT} (writes: its workspace, writable_roots; other sandboxes' workspaces "
        "neither read nor written)"
    )
    for field in asked:
        if field != "files":
            p.enforced[field] = _SEATBELT
    sockets = ", ".join(policy.unix_sockets) if policy.unix_sockets else "none"
    p.enforced["unix_sockets"] = (
        f"{_SEATBELT} (connects only to its workspace's sockets, the system's logging and "
        f"name-resolution sockets and unix_sockets: {sockets})"
    )


_CAP_SYS_RESOURCE = 24


@functools.cache
def seccomp_works() -> bool:
    """A filter loads here (a container may forbid it): tried once, in a
    child."""
    return _core.probe(_core.PROBE_SECCOMP, 0, 2000) == 0


@functools.cache
def can_raise_hard_limits() -> bool:
    """Whether setrlimit may raise a hard limit here: CAP_SYS_RESOURCE on
    Linux (root in a container often lacks it), root elsewhere."""
    return _capability(_CAP_SYS_RESOURCE)


def _capability(bit: int) -> bool:
    """An effective capability of ours (Linux), else: are we root."""
    if LINUX:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("CapEff:"):
                        return bool(int(line.split()[1], 16) >> bit & 1)
        except OSError:
            pass
    return os.geteuid() == 0


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
