"""Linux namespaces for one sandbox: whether they can be made here (the
probes), the planners of what they hold (``disk`` as a size-capped tmpfs,
the read-only view that holds ``files``, ``network="deny"``, a PID
namespace), the ``ns`` argument of ``_core.spawn``, the view's entries, and
the size-capped workspace's hand-back.

The child makes the namespaces (csrc/linux/namespaces.c); this module only
prepares what it needs in the parent.  A tmpfs mounted in the child's own
mount namespace is invisible from the caller's, and it would vanish with
the namespace: the child sends an fd of its root over a datagram socket,
and the parent keeps it, so the workspace stays readable (through
``/proc/<pid>/fd/<n>``) until the sandbox is closed.
"""

from __future__ import annotations

import array
import contextlib
import dataclasses
import errno
import functools
import os
import queue
import socket
import stat
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Mapping

from . import _core, _devtree, _landlock, _platform, _seccomp, _viewns, _watchdog, _workspace
from ._cgroup import fd_budget
from ._cgroupfs import mount_table
from ._errors import ConfigError
from ._landlock import writable_rights
from ._place import Place, here
from ._plan import Plan, Request
from ._platform import CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER
from ._policy import Policy
from ._protected import MAX_DEPTH, TTL, within

__all__ = [
    "CLONE_NEWNET",
    "CLONE_NEWNS",
    "CLONE_NEWPID",
    "CLONE_NEWUSER",
    "REAPER",
    "Namespaces",
    "Spawn",
    "copy_out",
    "fd_path",
    "flush_mounts",
    "hold_mounts",
    "let_go_of_mounts",
    "namespaces",
    "plan_disk",
    "plan_files",
    "plan_network",
    "plan_pid_namespace",
    "release_mounts",
    "userns_blockers",
    "view",
]


# -- can they be made here? ---------------------------------------------------


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
    if _platform.capability(_platform.CAP_SYS_ADMIN):
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


def _take(p: Plan, flags: int, ns: Namespaces) -> None:
    p.ns_flags |= flags
    p.user_ns = p.user_ns or ns.user


# -- planning: what namespaces hold (_platform lists these) --------------------


def plan_disk(p: Plan, r: Request) -> None:
    """A tmpfs of that size over the private workspace, in a mount namespace
    of the child's: writes past it fail.  Else the disk watchdog."""
    lim = r.limits
    if lim is None or lim.disk is None or not p.takes("disk"):
        return
    private = r.policy is None or r.policy.workdir is None
    if not private:
        _watchdog.plan_disk(p, r)
        return
    ns = namespaces(CLONE_NEWNS)
    if not ns.ok:
        _watchdog.plan_disk(p, r, no_tmpfs=ns.reason)
        return
    n = p.disk = lim.disk
    p.workspace = True
    p.disk_tmpfs = True
    p.tmpfs_size = n if "disk" in lim.tolerate else n + max(1 << 20, n // 16)
    p.tmpfs_inodes = p.tmpfs_size // 4096 + 4096
    _take(p, CLONE_NEWNS, ns)
    if "disk" in lim.tolerate:
        p.hold(
            "disk",
            f"{ns.label('mountns')}+tmpfs:size",
            "writes past it fail with ENOSPC (so do entries past one per 4 KiB of it and 4096 "
            "more); memory-backed: its pages count toward the memory limit",
        )
    else:
        p.hold(
            "disk",
            f"{ns.label('mountns')}+tmpfs:size+watchdog:disk",
            "the tmpfs holds the limit + 1/16, at least 1 MiB; past the limit the sandbox is "
            "ended; entries: one per 4 KiB of it and 4096 more; memory-backed: its pages count "
            "toward the memory limit",
        )


def plan_files(p: Plan, r: Request) -> None:
    """The read-only view where a mount namespace can be made, Landlock on
    top (or alone)."""
    policy = r.policy
    if policy is None:
        return
    view = namespaces(CLONE_NEWNS, view=True)
    held = []
    if view.ok:
        if len(policy.writable_roots) >= _core.VIEW_MAX_RW:
            raise ConfigError(
                "Policy.writable_roots",
                f"{len(policy.writable_roots)} paths",
                f"at most {_core.VIEW_MAX_RW - 1} on Linux (name a common parent instead)",
            )
        p.ro_view = True
        _take(p, CLONE_NEWNS, view)
        held.append(view.label("mountns") + ":ro-view")
        # System V shared memory, semaphores and message queues belong to
        # the IPC namespace, not to a file: the host's are reachable by key
        # or id from anywhere in it.  Where one can be made, so can this.
        if namespaces(CLONE_NEWNS | CLONE_NEWIPC).ok:
            _take(p, CLONE_NEWIPC, view)
            held.append("ipcns")
    if p.landlock >= 1:
        held.append(f"landlock:abi{p.landlock}")
    what = [
        "reads everywhere but deny_read; writes: workspace, writable_roots, terminal and "
        "null devices, a private /dev/shm"
    ]
    if not held:
        why = f"Landlock is not available (Linux 5.13+) and no mount namespace: {view.reason}"
        p.downgrade("files", why)
        if policy.protect_dotfiles:
            p.downgrade("protect_dotfiles", why)
        return
    if not p.ro_view:
        # Landlock alone: it has no right for metadata, nor for connecting
        # to a unix socket (deny_read hides its contents, not the socket).
        gap = (
            "chmod, chown, utime and xattrs outside the writable roots, and connects to unix "
            f"sockets under deny_read, are not refused: no mount namespace ({view.reason})"
        )
        p.fallbacks["files"] = gap
        what.append(gap)
    p.hold("files", "+".join(held), *what)
    if policy.protect_dotfiles:
        which = (
            "HOME's dotfiles; .git/hooks and .git/config of the repositories up to "
            f"{MAX_DEPTH} levels below each writable root"
        )
        if p.ro_view:
            p.hold("protect_dotfiles", held[0], f"bound read-only: {which}")
        else:
            p.hold(
                "protect_dotfiles",
                held[0],
                f"carved: {which}",
                "no new entry can be made in a directory on the way to one, so git cannot "
                "write in those .git directories",
            )


def plan_network(p: Plan, r: Request) -> None:
    """ "deny" is a network namespace of the child's own (only its loopback)
    where one can be made, else Landlock TCP rules plus seccomp socket
    rules; "proxy" keeps the host's loopback (where the proxies listen) and
    allows TCP connects to proxy_ports only."""
    policy = r.policy
    if policy is None or policy.network == "allow":
        return
    filt = bool(_core.HAS_SECCOMP and _seccomp.seccomp_works())
    abi = p.landlock
    tcp = abi >= 4
    if policy.network == "deny":
        ns = namespaces(CLONE_NEWNET)
        if ns.ok:
            _take(p, CLONE_NEWNET, ns)
            mech = ns.label("netns")
            if filt:
                # A namespace does not cut vsock off (it reaches the
                # hypervisor), nor packet or netlink sockets of the host's
                # other families: only unix, inet and netlink routes.
                p.seccomp_net = _core.SECCOMP_FAMILIES
                p.no_new_privs = True
                mech += "+seccomp:socket families"
            p.hold("network", mech, "a network namespace of its own: loopback only")
            return
        if not filt and not tcp:
            p.downgrade(
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
            p.landlock_net = (_landlock.TCP, 0, (), 0)
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
        p.hold("network", "+".join(held), *notes)
        return
    # proxy
    if policy.allow_domains:
        _plan_own_proxy(p, policy, filt)
        return
    if not (filt and tcp):
        missing = "Landlock TCP rules (ABI 4, Linux 6.7)" if not tcp else "a seccomp filter"
        p.downgrade("network", f"network='proxy' needs {missing}, not available here")
        return
    p.landlock_net = (_landlock.TCP, _landlock.CONNECT_TCP, policy.proxy_ports, 0)
    p.seccomp_net = _core.SECCOMP_NET_PROXY
    p.no_new_privs = True
    ports = ",".join(str(x) for x in policy.proxy_ports)
    p.hold(
        "network",
        f"landlock:abi{abi} tcp connect to {ports}+seccomp:socket (TCP only)",
        "ports are matched, not addresses: keep proxy ports off the outside network",
    )


# Where the filtering proxy listens on the sandbox's own loopback: the
# namespace is the sandbox's alone, so one port serves every sandbox.
PROXY_PORT = 3128


def _plan_own_proxy(p: Plan, policy: Policy, filt: bool) -> None:
    """allow_domains: a network namespace with only its loopback, where the
    child listens for sbxlimit's proxy (_proxy), which the parent serves
    from its own network: the sandbox's one way out.  Without a namespace
    nothing here can make the proxy the only way (Landlock matches ports,
    not addresses, so a program could reach any host on the proxy's port)."""
    ns = namespaces(CLONE_NEWNET)
    if not ns.ok:
        p.downgrade(
            "network",
            f"allow_domains needs a network namespace to make the proxy the only way out, and "
            f"none can be made here ({ns.reason})",
        )
        return
    _take(p, CLONE_NEWNET, ns)
    p.proxy_port = PROXY_PORT
    mech = ns.label("netns") + "+supervisor:proxy"
    if filt:
        p.seccomp_net = _core.SECCOMP_FAMILIES
        p.no_new_privs = True
        mech += "+seccomp:socket families"
    allowed = ", ".join(policy.allow_domains)
    p.hold(
        "network",
        mech,
        f"a network namespace of its own: loopback, and sbxlimit's proxy on "
        f"127.0.0.1:{PROXY_PORT} to {allowed}",
    )


def plan_pid_namespace(p: Plan, r: Request) -> None:
    """isolate_pids=True: a PID namespace, or unenforced.  Else, without a
    cgroup, a PID namespace by default (``isolate_pids=None``): a process
    that double-forks and changes session leaves the tree the watchdog
    walks, but not the namespace, which the kernel empties when the program
    ends.  Where the program cannot run under a reaper (``no_reaper`` says
    why), it keeps the walk."""
    policy = r.policy
    if policy is not None and policy.isolate_pids:
        pidns = namespaces(CLONE_NEWPID | CLONE_NEWNS)
        if pidns.ok:
            _take(p, CLONE_NEWPID | CLONE_NEWNS, pidns)
            p.hold(
                "isolate_pids",
                pidns.label("pidns"),
                "the program is PID 2 under a reaper as PID 1; everything left in it dies with it",
            )
        else:
            p.downgrade("isolate_pids", pidns.reason)
        return
    if p.site is not None:
        return
    auto = policy is None or policy.isolate_pids is None
    walk = "tree walk"
    caveat = "process group and descendants; a double fork that changes session escapes"
    ns = namespaces(CLONE_NEWPID | CLONE_NEWNS) if auto and not r.no_reaper else None
    why = ""
    if not auto:
        why = "isolate_pids=False"
    elif ns is None:
        why = r.no_reaper
    elif not ns.ok:
        why = f"no PID namespace: {ns.reason}"
        p.fallbacks["kill_tree"] = why  # weaker than SPEC's promise: strict refuses
    elif ns.user and r.uid != os.geteuid():
        # Only our own uid maps into an unprivileged user namespace: the
        # change of user fails as it would without one (EPERM), not there.
        why = f"a user namespace maps only uid {os.geteuid()}, and user= asks for {r.uid}"
    if why:
        p.hold("kill_tree", f"{walk} ({caveat}); {why}")
        return
    assert ns is not None
    _take(p, CLONE_NEWPID | CLONE_NEWNS, ns)
    p.hold(
        "kill_tree",
        ns.label("pidns"),
        "no cgroup: the program is PID 2 under a reaper as PID 1, and everything left in the "
        "namespace dies with it",
    )


View = list[tuple[int, bytes, bytes]]


def _reaper() -> bytes:
    """The reaper program PID 1 execs (csrc/linux/pid1.c, built beside the
    core), if it can be run; else b"": PID 1 is fork()ed instead, which
    costs a copy of this process's page tables."""
    path = os.path.join(os.path.dirname(os.path.abspath(_core.__file__)), "_pid1")
    return os.fsencode(path) if os.access(path, os.X_OK) else b""


# Read by tests, which turn it off to try the fork()ed PID 1.
REAPER = _reaper()


def view(
    policy: Policy,
    workspace: str | None,
    shm_size: int | None,
    protected: Iterable[str] = (),
    *,
    fresh: bool = False,
    place: Place = None,
) -> tuple[View, bool, bool]:
    """The read-only view's entries for `policy` (csrc/sbx.h, struct
    sbx_view); whether "/" becomes read-only (not when it is a writable root
    itself); whether /dev is one of the sandbox's own (not when a writable
    root holds it).  Paths are resolved here: the child follows no link.
    `fresh`: `workspace` was made for this sandbox (never seen again).
    `place`: where the caller resolves paths (_place.here(), asked if None)."""
    protected = tuple(protected)
    place = place if place is not None else here()
    if fresh and workspace is not None:
        base = _fresh_view(policy, workspace, shm_size, protected, place)
    else:
        # The same workdir comes back at every spawn: what depends only on
        # the policy and the protected paths' resolution is reused for as
        # long as that resolution (_read_only_cached), where it was made.
        base = _kept_view(policy, workspace, shm_size, protected, place)
    out, ro_root, own_dev, rw, held = base
    if not policy.deny_write and not policy.deny_read:
        return out, ro_root, own_dev
    # What the policy names itself is resolved at every spawn: a promise,
    # where the protected paths are a best effort (docs/SECURITY.md).
    # deny_write's entries after the protected paths' (as in Landlock).
    out = list(out)
    deny_write = _read_only(policy.deny_write)
    deny_read = list(dict.fromkeys(os.path.realpath(x) for x in policy.deny_read))
    pinned = {path for kind, path, _d in out if kind == _core.VIEW_PIN}
    for d in _pins([*deny_write, *deny_read], rw):
        if os.fsencode(d) not in pinned:
            out.append((_core.VIEW_PIN, os.fsencode(d), b""))
    for path, source in deny_write.items():
        if path not in held and any(within(path, r) for r in rw):
            data = b"" if source == path else os.fsencode(source)
            out.append((_core.VIEW_RO, os.fsencode(path), data))
    for path in deny_read:
        if os.path.isdir(path):
            out.append((_core.VIEW_HIDE_DIR, os.fsencode(path), b""))
        elif os.path.lexists(path):
            out.append((_core.VIEW_HIDE, os.fsencode(path), b""))
    return out, ro_root, own_dev


_Base = tuple[View, bool, bool, list[str], "ReadOnly"]
_FRESH = "\0a workspace"  # _views' key for what every fresh workspace shares


def _kept_view(
    policy: Policy,
    workspace: str | None,
    shm_size: int | None,
    protected: tuple[str, ...],
    place: Place,
) -> _Base:
    key = (policy, workspace, shm_size, protected, place)
    now = time.monotonic()
    with _resolved_lock:
        hit = _views.get(key)
    if hit is not None and now - hit[0] < TTL:
        return hit[1]
    base = _view(policy, None if workspace == _FRESH else workspace, shm_size, protected, place)
    with _resolved_lock:
        if len(_views) > 16:
            _views.clear()
        _views[key] = (now, base)
    return base


def _fresh_view(
    policy: Policy, workspace: str, shm_size: int | None, protected: tuple[str, ...], place: Place
) -> _Base:
    """_view for a workspace made for this sandbox: what does not depend on
    it is the same for every one, and reused as a workdir's is.  Being new
    and empty, no protected path lies in it; being a directory of ours,
    only its parent needs resolving."""
    real = _workspace.real_path(workspace, place)
    if within("/dev", real):  # a TMPDIR in /dev: /dev is then not the sandbox's own
        return _view(policy, workspace, shm_size, protected, place)
    out, ro_root, own_dev, rw, held = _kept_view(policy, _FRESH, shm_size, protected, place)
    # _view's first entries are its writable roots', in this order.
    kept = sum(1 for r in rw if r != "/")
    roots = sorted([*rw, real], key=_depth_first)
    first: View = [(_rw_kind(r), os.fsencode(r), b"") for r in roots if r != "/"]
    return first + out[kept:], ro_root, own_dev, roots, held


def _depth_first(root: str) -> tuple[int, str]:
    return (root.count("/"), root)


def _rw_kind(root: str) -> int:
    return _core.VIEW_RW_DEV if within("/dev", root) else _core.VIEW_RW


def _view(
    policy: Policy,
    workspace: str | None,
    shm_size: int | None,
    protected: tuple[str, ...],
    place: Place = None,
) -> _Base:
    """view() without what deny_write and deny_read add; with the
    writable roots and the protected paths' resolution (`place`: as in
    view())."""
    place = place if place is not None else here()
    real = os.path.realpath
    roots = [workspace] if workspace else []
    roots += policy.writable_roots
    rw = sorted({real(r) for r in roots}, key=_depth_first)
    ro_root = "/" not in rw
    # Only /dev itself, named as writable, keeps the host's: "/" does not
    # (its raw disks, every terminal; docs/SECURITY.md).
    own_dev = "/dev" not in rw
    out: View = [(_rw_kind(r), os.fsencode(r), b"") for r in rw if r != "/"]
    # The kernel's own filesystems stay read-only under a writable root
    # ("/" above all): uid 0 needs no capability to write most of
    # /proc/sys (core_pattern runs a program as root on the host), its own
    # cgroup's limits, or another process's oom_score_adj.
    for point in _kernel_mounts():
        under = any(within(point, r) and point != r for r in rw)
        if under and not (own_dev and within(point, "/dev")):
            out.append((_core.VIEW_RO_MOUNT, os.fsencode(point), b""))
    if own_dev or os.path.isdir("/dev/shm"):
        # A private one: the host's is read-only in the view, and shared
        # memory of other processes is none of the sandbox's business.
        size = f",size={shm_size}" if shm_size else ""
        out.append((_core.VIEW_TMPFS, b"/dev/shm", f"mode=1777{size}".encode()))
    read_only = _read_only_cached(protected, place)
    covered = [path for path in read_only if any(within(path, r) for r in rw)]
    out += [(_core.VIEW_PIN, os.fsencode(d), b"") for d in _pins([*covered, *rw], rw)]
    for path, source in read_only.items():
        # Outside the writable trees the view is read-only already.  One
        # that does not exist is skipped by the child (ENOENT), not asked
        # about here: a stat per path costs the caller more than the child's
        # failed lookup, as each gives the GIL away.
        if any(within(path, r) for r in rw):
            data = b"" if source == path else os.fsencode(source)
            out.append((_core.VIEW_RO, os.fsencode(path), data))
    return out, ro_root, own_dev, rw, read_only


def _pins(paths: Iterable[str], rw: list[str]) -> list[str]:
    """The directories between each path and the innermost writable root
    it lies in, outermost first.  Each becomes a mount point of its own: the
    program could otherwise rename one away with what the view covers
    beneath it (a bound .git/config, a hidden secret, a nested writable
    root), and put a directory, a file or a link of its own in its place for
    git, or for the next spawn's resolution, to follow."""
    out: dict[str, None] = {}
    for path in paths:
        holders = [r for r in rw if within(path, r) and path != r]
        if not holders:
            continue
        root = max(holders, key=len)
        d = os.path.dirname(path)
        while d != root and within(d, root):
            out[d] = None
            d = os.path.dirname(d)
    return sorted(out, key=_depth_first)


# Filesystems whose files are the kernel's settings and other processes'.
_KERNEL_FS = frozenset(
    [
        "proc",
        "sysfs",
        "cgroup",
        "cgroup2",
        "securityfs",
        "debugfs",
        "tracefs",
        "bpf",
        "configfs",
        "efivarfs",
        "pstore",
        "fusectl",
        "mqueue",
        "binfmt_misc",
        "devtmpfs",
        "devpts",
        "selinuxfs",
        "nsfs",
        "rpc_pipefs",
        "nfsd",
        "hugetlbfs",
    ]
)


def _kernel_mounts() -> list[str]:
    """Mount points of the kernel's filesystems, outermost only (a
    recursive bind covers what is mounted beneath)."""
    points = sorted((p for p, kind, _o in mount_table() if kind in _KERNEL_FS), key=_depth_first)
    outer: list[str] = []
    for p in points:
        if not any(within(p, o) for o in outer):
            outer.append(p)
    return outer


ReadOnly = dict[str, str]


def _read_only(paths: Iterable[str]) -> ReadOnly:
    """path -> what is bound over it, each path resolved: the child follows
    no link."""
    out: ReadOnly = {}
    for x in paths:
        target = os.path.realpath(x)
        if os.path.islink(x) and os.path.isfile(target):
            # The program could replace the link with a file of its own:
            # the target is bound over the link itself (a mount point cannot
            # be unlinked or renamed over).  A directory cannot be mounted
            # over a link: _protected.replaceable_links says so.
            out.setdefault(_link_path(x), target)
        out.setdefault(target, target)
    return out


# The protected paths' resolution (some 30 paths, each a realpath: a third
# of a policy spawn's Python time) is reused as long as the search that
# found them (_protected.TTL): spawns come in bursts.  Whether each exists
# is the child's to find out, at every spawn.
_resolved: dict[tuple[tuple[str, ...], Place], tuple[float, ReadOnly]] = {}
_resolved_lock = threading.Lock()
# view()'s entries but deny_read's, for a workdir (not a fresh workspace).
_views: dict[
    tuple[Policy, str | None, int | None, tuple[str, ...], Place], tuple[float, _Base]
] = {}


def _read_only_cached(paths: tuple[str, ...], place: Place) -> ReadOnly:
    now = time.monotonic()
    with _resolved_lock:
        hit = _resolved.get((paths, place))
    if hit is not None and now - hit[0] < TTL:
        return hit[1]
    found = _read_only(paths)
    with _resolved_lock:
        if len(_resolved) > 16:
            _resolved.clear()
        _resolved[paths, place] = (now, found)
    return found


def _link_path(path: str) -> str:
    """A link as itself: its directory resolved, its own name kept."""
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


# A sandbox's mount namespace, held from the spawn to the reap.  The last
# process of a namespace tears it down in its exit, before its parent
# learns of the exit: the unmounts wait for an RCU grace period (0.1-0.5 ms
# here, more when the other CPUs sleep), and the caller's wait() with them.
# Held, the namespace goes when the hold is released, in a thread of its
# own, off the caller's path.
_held: set[int] = set()
_held_lock = threading.Lock()
_dropping: queue.SimpleQueue[int | threading.Event] | None = None
_dropping_pid = 0


_ASK = getattr(_core, "MNT_NS_ASK", -2)


def hold_mounts(pid: int, fd: int = _ASK) -> int:
    """An fd that keeps `pid`'s mount namespace, or -1 (gone already: its
    exit tore the namespace down; the fd table three quarters full).  `fd`:
    the one the core got through the child's pidfd (_core.spawn), else
    /proc is asked (older kernels, a child made without clone3)."""
    if fd == _ASK:
        try:
            fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return -1
    if fd < 0:
        return -1
    if fd >= fd_budget():
        os.close(fd)
        return -1
    with _held_lock:
        _held.add(fd)
        _dropper()  # started here: never at a release during the interpreter's exit
    return fd


def release_mounts(fd: int) -> None:
    """Let the namespace `fd` holds go, off the caller's path."""
    if fd < 0:
        return
    with _held_lock:
        if fd not in _held:
            return  # a forked child's copy: closed at the fork
        _held.discard(fd)
        q = _dropping if _dropping_pid == os.getpid() else None
    if q is None or sys.is_finalizing():
        os.close(fd)  # no thread to hand it to (at exit)
    else:
        q.put(fd)


def let_go_of_mounts(fd: int) -> None:
    """release_mounts, here and now (the supervisor, before it removes the
    workspace the namespace has mounted: the removal is then cheap)."""
    if fd < 0:
        return
    with _held_lock:
        if fd not in _held:
            return
        _held.discard(fd)
    os.close(fd)


def flush_mounts(timeout: float) -> bool:
    """Wait until every namespace released so far is gone (Monitor.drain)."""
    with _held_lock:
        q = _dropping if _dropping_pid == os.getpid() else None
    if q is None:
        return True
    done = threading.Event()
    q.put(done)
    return done.wait(timeout)


def _dropper() -> queue.SimpleQueue[int | threading.Event]:
    global _dropping, _dropping_pid
    if _dropping is None or _dropping_pid != os.getpid():
        _dropping, _dropping_pid = queue.SimpleQueue(), os.getpid()
        threading.Thread(
            target=_drop, args=(_dropping,), name="sbxlimit-ns-release", daemon=True
        ).start()
    return _dropping


def _drop(q: queue.SimpleQueue[int | threading.Event]) -> None:
    while True:
        item = q.get()
        if isinstance(item, threading.Event):
            item.set()
            continue
        try:
            os.close(item)
        except OSError:
            pass


def _forget_held_after_fork() -> None:
    # The child's copies would keep the parent's sandboxes' namespaces as
    # long as it lives; its thread is not there.
    global _held_lock, _dropping
    _held_lock = threading.Lock()
    _dropping = None
    for fd in _held:
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_held_after_fork)


_NONE_MADE: Mapping[int, int] = {}


class _Share:
    """What of a view a kept namespace may hold (_viewns), and what each
    sandbox then adds itself.  Kept per view list: a view reused from its
    cache is the same list, and the same kept namespace answers the same
    `missing`, so a spawn after the first walks neither."""

    __slots__ = ("_own", "entries", "indexes", "mine", "view")

    def __init__(self, view: View, mine: bytes | None) -> None:
        self.view, self.mine = view, mine
        # Each sandbox's own: its workspace, its private tmpfs, a link's
        # target bound over the link (resolved at every spawn).
        self.indexes = [
            i
            for i, (kind, path, data) in enumerate(view)
            if kind != _core.VIEW_TMPFS
            and not (kind == _core.VIEW_RO and data)
            and not (kind in (_core.VIEW_RW, _core.VIEW_RW_DEV) and path == mine)
        ]
        self.entries = [view[i] for i in self.indexes]
        self._own: tuple[frozenset[int], View] | None = None

    def own(self, missing: frozenset[int]) -> View:
        """The entries the child adds to the copy: those not shared, and
        the shared ones the namespace lacked when it was made (`missing`)."""
        got = self._own
        if got is not None and got[0] is missing:
            return got[1]
        made = {self.indexes[j] for j in range(len(self.indexes)) if j not in missing}
        out = [e for i, e in enumerate(self.view) if i not in made]
        self._own = (missing, out)
        return out


_shares: dict[int, _Share] = {}


def _share(view: View, mine: bytes | None) -> _Share:
    """`view`'s _Share, kept while the same list comes back."""
    share = _shares.get(id(view))
    if share is None or share.view is not view or share.mine != mine:
        share = _Share(view, mine)
        if len(_shares) > 32:
            _shares.clear()
        _shares[id(view)] = share
    return share


class Spawn:
    """The ``ns`` tuple for ``_core.spawn``, and the socket the workspace's
    fd comes back on.  ``close()`` releases what the parent holds."""

    __slots__ = (
        "_recv",
        "args",
        "child_end",
        "child_rules",
        "dev_fd",
        "status_r",
        "status_w",
        "view_ns",
    )

    def __init__(
        self,
        plan: Plan,
        policy: Policy | None,
        workspace: str | None,
        uid: int | None,
        gid: int | None,
        shm_size: int | None = None,
        protected: Iterable[str] = (),
        made: Mapping[int, int] = _NONE_MADE,
        cwd: str | bytes | None = None,
        place: Place = None,
    ) -> None:
        flags = plan.ns_flags | (CLONE_NEWUSER if plan.user_ns else 0)
        netns, ipcns = made.get(CLONE_NEWNET, -1), made.get(CLONE_NEWIPC, -1)
        # Made ahead (_nspool): the child joins them instead.
        if netns >= 0:
            flags &= ~CLONE_NEWNET
        if ipcns >= 0:
            flags &= ~CLONE_NEWIPC
        uid_map = gid_map = b""
        if plan.user_ns:
            # An unprivileged user namespace may map only our own ids: the
            # program keeps its uid and gid, and gets no privilege outside.
            euid, egid = os.geteuid(), os.getegid()
            uid_map, gid_map = f"{euid} {euid} 1\n".encode(), f"{egid} {egid} 1\n".encode()
        tmpfs = opts = mkdir = b""
        self._recv: socket.socket | None = None
        self.child_end = -1
        if plan.disk_tmpfs and workspace is not None:
            owner_uid = os.geteuid() if uid is None else uid
            owner_gid = os.getegid() if gid is None else gid
            tmpfs = os.fsencode(workspace)
            opts = (
                f"size={plan.tmpfs_size},nr_inodes={plan.tmpfs_inodes},mode=0700,"
                f"uid={owner_uid},gid={owner_gid}"
            ).encode()
            mkdir = os.fsencode(os.path.join(workspace, "tmp"))
        if tmpfs or plan.proxy_port:
            # The child sends the proxy's listener first, then the tmpfs root.
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._recv = parent
            self.child_end = child.detach()
        # PID 1 of a PID namespace writes the target's wait status here.
        self.status_r = self.status_w = -1
        if flags & CLONE_NEWPID:
            self.status_r, self.status_w = os.pipe2(os.O_CLOEXEC)
        loopback = bool(flags & CLONE_NEWNET)
        entries: View = []
        ro_root = own_dev = False
        if plan.ro_view and policy is not None:
            where = workspace or policy.workdir
            place = place if place is not None else here()
            entries, ro_root, own_dev = view(
                policy, where, shm_size, protected, fresh=workspace is not None, place=place
            )
        # A /dev made once, cloned by the child (root: _devtree); released
        # by close().
        self.dev_fd = _devtree.take() if own_dev and not plan.user_ns else -1
        # The whole view made once, joined and copied by the child (root:
        # _viewns); `entries` then holds only what is this sandbox's own.
        # A joined namespace starts the child at its root: only with a cwd
        # it then goes to by its full path.
        self.view_ns = -1
        if (
            (entries or ro_root)
            and not plan.user_ns
            and (self.dev_fd >= 0 or not own_dev)
            and cwd is not None
            and os.path.isabs(cwd)
        ):
            entries = self._copy_view(entries, ro_root, own_dev, workspace, place)
        # Landlock skips the directory a mount hides: each tmpfs gets a rule
        # of its own in the child, with the rights the workspace has.  Under
        # a writable "/" the rule for "/" holds beneath them already (the
        # walk up goes on from the mount point's parent), so the child adds
        # none and the ruleset can be shared.  Never on an ancestor shared
        # by every sandbox (the template's root): one could then write in
        # another's /dev/shm, given a way to it.
        in_child = tmpfs or (entries and ro_root)
        ll = writable_rights(plan.landlock) if plan.landlock and in_child else 0
        # The child adds those rules to the ruleset it is given: it must be
        # this sandbox's own (see _landlock.ruleset).
        self.child_rules = bool(ll)
        self.args = (
            flags,
            uid_map,
            gid_map,
            loopback,
            tmpfs,
            opts,
            mkdir,
            self.child_end,
            ll,
            entries,
            ro_root,
            own_dev,
            self.status_w,
            REAPER if flags & CLONE_NEWPID else b"",
            netns,
            ipcns,
            plan.proxy_port,
            self.dev_fd,
            self.view_ns,
        )

    def _copy_view(
        self, entries: View, ro_root: bool, own_dev: bool, workspace: str | None, place: Place
    ) -> View:
        mine = os.fsencode(_workspace.real_path(workspace, place)) if workspace else None
        # A fresh workspace's view is a new list at each spawn: nothing to keep.
        share = _Share(entries, mine) if mine is not None else _share(entries, None)
        if not share.indexes:
            # Only "/" read-only and /dev to copy: the child makes those as
            # fast as it joins and copies them (measured: docs/performance.md).
            return entries

        def watched() -> list[bool]:
            # The kernel's mounts: the mount table's poll covers them.
            return [entries[i][0] != _core.VIEW_RO_MOUNT for i in share.indexes]

        got = _viewns.take(share.entries, ro_root, self.dev_fd if own_dev else -1, watched)
        if got is None:
            return entries
        self.view_ns, missing = got
        return share.own(missing)

    def take_child_end(self) -> int:
        """The child's end, for the core to close after the spawn."""
        fd, self.child_end = self.child_end, -1
        return fd

    def take_status_ends(self) -> tuple[int, int]:
        """(read end, for the caller to read at reap; write end, for the
        core to close after the spawn)."""
        ends = (self.status_r, self.status_w)
        self.status_r = self.status_w = -1
        return ends

    def receive_listener(self) -> int | None:
        """The proxy's listener the child sent first (plan.proxy_port)."""
        if self._recv is None:
            return None
        return _receive(self._recv)

    def receive_fd(self) -> int | None:
        """The workspace's root fd the child sent (it did before execve)."""
        sock, self._recv = self._recv, None
        if sock is None:
            return None
        with sock:
            return _receive(sock)

    def close(self) -> None:
        for fd in (self.status_r, self.status_w):
            if fd >= 0:
                os.close(fd)
        self.status_r = self.status_w = -1
        if self._recv is not None:
            self._recv.close()
            self._recv = None
        if self.child_end >= 0:
            os.close(self.child_end)
            self.child_end = -1
        if self.dev_fd >= 0:
            self.dev_fd = -1
            _devtree.release()
        if self.view_ns >= 0:
            fd, self.view_ns = self.view_ns, -1
            _viewns.release(fd)


def _receive(sock: socket.socket) -> int | None:
    """One fd sent on `sock` (SCM_RIGHTS), close-on-exec; None if none is
    waiting."""
    try:
        _msg, anc, _flags, _addr = sock.recvmsg(
            1, socket.CMSG_SPACE(array.array("i").itemsize), socket.MSG_DONTWAIT
        )
    except BlockingIOError:
        return None
    fds = array.array("i")
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    for extra in fds[1:]:
        os.close(extra)
    if not fds:
        return None
    os.set_inheritable(fds[0], False)
    return fds[0]


def fd_path(fd: int) -> str:
    """A path to what `fd` refers to, usable by this process (and its
    children) for as long as the fd is open."""
    return f"/proc/{os.getpid()}/fd/{fd}"


def copy_out(fd: int, dest: str) -> None:
    """Copy the tmpfs's contents into `dest` (keep_workdir: the directory
    outlives the sandbox, the tmpfs cannot).  What cannot be copied (a file
    the program made unreadable, a FIFO) is named in a RuntimeWarning; the
    rest is copied.

    The copy, made as the caller (root, often) on the host's filesystem,
    holds no more than the tmpfs did: holes stay holes, hard links stay
    links, and it stops at the bytes the tmpfs used.  A sparse file or a
    file of many names would otherwise have written far past `disk` (an
    attack review, 2026-11-28).  The walk is a loop: a deep tree is not a
    recursion."""
    src = fd_path(fd)
    try:
        vfs = os.fstatvfs(fd)
        # (A tmpfs without a size says 0 blocks: nothing to hold it to.)
        room = [(vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize if vfs.f_blocks else 1 << 62]
    except OSError:
        room = [0]
    failed: list[str] = []
    links: dict[tuple[int, int], str] = {}
    dirs: list[tuple[str, os.stat_result]] = []  # their modes set last
    todo = [""]
    while todo:
        rel = todo.pop()
        try:
            with os.scandir(os.path.join(src, rel)) as it:
                entries = list(it)
        except OSError:
            failed.append(rel or "/")
            continue
        for e in entries:
            name = os.path.join(rel, e.name)
            to = os.path.join(dest, name)
            try:
                st = e.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    if not stat.S_ISDIR(_lstat_mode(to)):
                        os.mkdir(to, 0o700)
                    dirs.append((to, st))
                    todo.append(name)
                elif stat.S_ISLNK(st.st_mode):
                    os.symlink(os.readlink(e.path), to)
                elif not stat.S_ISREG(st.st_mode):
                    failed.append(name)  # a FIFO, a socket, a device
                elif st.st_nlink > 1 and (st.st_dev, st.st_ino) in links:
                    os.link(links[(st.st_dev, st.st_ino)], to, follow_symlinks=False)
                else:
                    _copy_file(e.path, to, st, room)
                    if st.st_nlink > 1:
                        links[(st.st_dev, st.st_ino)] = to
            except OSError:
                failed.append(name)
    for to, st in reversed(dirs):  # the deepest first: a mode may close a way in
        with contextlib.suppress(OSError):
            os.chmod(to, stat.S_IMODE(st.st_mode))  # a directory of ours (made, or lstat'ed)
            os.utime(to, ns=(st.st_atime_ns, st.st_mtime_ns))
    if failed:
        warnings.warn(
            f"sbxlimit: keep_workdir: {len(failed)} entries of the tmpfs workspace could not be "
            f"copied to {dest}: {', '.join('/' + f.lstrip('/') for f in failed[:5])}"
            f"{' ...' if len(failed) > 5 else ''}",
            RuntimeWarning,
            stacklevel=3,
        )


def _lstat_mode(path: str) -> int:
    try:
        return os.lstat(path).st_mode
    except FileNotFoundError:
        return 0


_CHUNK = 1 << 20


def _copy_file(src: str, dest: str, st: os.stat_result, room: list[int]) -> None:
    """Copy the regular file `src` to `dest`, its data only (holes stay
    holes), out of `room` (bytes left; OSError(ENOSPC) past it, and no
    partial file left)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    sfd = os.open(src, flags)
    try:
        if not stat.S_ISREG(os.fstat(sfd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        dfd = os.open(
            dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        try:
            size = os.fstat(sfd).st_size
            at = 0
            while at < size:
                try:
                    data = os.lseek(sfd, at, os.SEEK_DATA)
                except OSError as e:
                    if e.errno == errno.ENXIO:
                        break  # only a hole is left
                    raise
                end = min(os.lseek(sfd, data, os.SEEK_HOLE), size)
                if end - data > room[0]:
                    raise OSError(errno.ENOSPC, "past what the tmpfs held")
                room[0] -= end - data
                while data < end:
                    chunk = os.pread(sfd, min(_CHUNK, end - data), data)
                    if not chunk:
                        break
                    os.pwrite(dfd, chunk, data)
                    data += len(chunk)
                at = end
            os.ftruncate(dfd, size)
            os.fchmod(dfd, stat.S_IMODE(st.st_mode))
            os.utime(dfd, ns=(st.st_atime_ns, st.st_mtime_ns))
        except BaseException:
            os.close(dfd)
            with contextlib.suppress(OSError):
                os.unlink(dest)
            raise
        os.close(dfd)
    finally:
        os.close(sfd)
