"""Landlock (Linux 5.13+; ABI probed at run time): the file rules from a
Policy, its TCP rules and scopes, and the planners of what it holds.

Reads are allowed everywhere except ``deny_read``; writes only beneath the
workspace, ``writable_roots`` and the device nodes a shell needs, minus
``deny_write``, ``deny_read`` and (``protect_dotfiles``) the shell and git
start-up files.  Landlock can only *allow*, so a denied path inside an
allowed tree is carved out by allowing its siblings instead, level by level
down to it (:func:`subtract`).  That is exact for what exists when the
sandbox starts; a sibling created later inside a carved-out directory is not
covered by any rule and stays inaccessible, and a denied path that does
not exist yet is not protected from being created (docs/SECURITY.md).

The rights asked for are those the running kernel's ABI knows, as the
kernel's sample sandboxer does: REFER from ABI 2, TRUNCATE from 3,
IOCTL_DEV from 5.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Sequence

from . import _core, _workspace
from ._place import Place, here
from ._plan import Plan, Request
from ._platform import CLONE_NEWNET, CLONE_NEWPID
from ._policy import Policy
from ._protected import TTL, within

__all__ = [
    "CONNECT_TCP",
    "TCP",
    "drop_rulesets",
    "handled_rights",
    "plan_abi",
    "plan_scopes",
    "rules",
    "ruleset",
    "subtract",
    "writable_rights",
]

# Network rules (ABI 4) and scopes (ABI 6).
BIND_TCP, CONNECT_TCP = 1, 2
TCP = BIND_TCP | CONNECT_TCP
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1, 2

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
MAKE_CHAR, MAKE_BLOCK = 1 << 6, 1 << 11
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
READ = EXECUTE | READ_FILE | READ_DIR
DEVICE = READ_FILE | WRITE_FILE | READ_DIR | TRUNCATE | IOCTL_DEV
DEVICES = (
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
    "/dev/shm",
)


def handled_rights(abi: int) -> int:
    rights = (1 << 13) - 1  # ABI 1: execute .. make_sym
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


def writable_rights(abi: int) -> int:
    """What a writable place allows: everything handled but device nodes
    (a device node is a way around every file rule)."""
    return handled_rights(abi) & ~(MAKE_CHAR | MAKE_BLOCK)


def _real(path: str) -> str:
    return os.path.realpath(path)


def _as_is(path: str) -> str:
    """`path` with its directories resolved, its last name kept (a link
    stays a link)."""
    return os.path.join(_real(os.path.dirname(path)), os.path.basename(path))


def subtract(
    roots: Iterable[str], denied: Iterable[str], resolved: Iterable[str] = ()
) -> list[str]:
    """The paths that cover `roots` and `resolved` (roots resolved already)
    except everything beneath `denied`: a root above a denied path is
    replaced by its children other than the one leading there, level by
    level."""
    out = {_real(r) for r in roots} | set(resolved)
    # A denied path that does not exist has nothing to carve out: cutting
    # its parent into existing siblings would take away the right to create
    # anything new there (the limit of allow-only rules: docs/SECURITY.md).
    # A link is carved as itself (its directory then keeps no right to
    # replace it); callers list what they mean by its target.
    for d in sorted({_as_is(x) for x in denied if os.path.lexists(x)}):
        nxt: set[str] = set()
        for r in out:
            if within(r, d):
                continue  # wholly denied
            if not within(d, r):
                nxt.add(r)
                continue
            cur = r
            for part in os.path.relpath(d, r).split("/"):
                # Not symlinks: a rule follows one to its target, which may
                # be the very tree being carved out (pytest-current → ...).
                # What a link points to gets its rights where it lives.
                # (scandir: the entry's type comes with the listing.)
                try:
                    with os.scandir(cur) as it:
                        nxt.update(e.path for e in it if e.name != part and not e.is_symlink())
                except OSError:
                    pass
                cur = os.path.join(cur, part)
        out = nxt
    return sorted(out)


# The rules of a policy that names nothing to deny, where nothing is
# carved out (the view holds what is protected, or nothing is): kept
# for as long as the paths' resolution elsewhere (_protected.TTL), per
# place (_place: a path may lead elsewhere after an unshare or a chroot).  What a
# policy denies by name is resolved at every spawn (a promise,
# docs/SECURITY.md), and a carving walks directories whose entries may
# have changed since (a sibling replaced by a link), so those never are.
_Rules = tuple[int, list[tuple[str, int]]]
_kept_rules: dict[tuple[object, ...], tuple[float, list[tuple[str, int]]]] = {}


def rules(
    policy: Policy,
    workspace: str | None,
    abi: int,
    protected: Iterable[str] = (),
    *,
    view: bool = False,
    fresh: bool = False,
    place: Place = None,
) -> _Rules:
    """(handled rights, [(path, rights)]) for `policy`; `protected`: the
    paths protect_dotfiles names (``_protected.protected``).  With `view`
    the read-only view holds deny_write, deny_read and the protected paths
    inside the writable roots (bind mounts), and the roots are granted
    whole: carving would take from each directory on the way the right to
    get new entries (a new file in HOME, git's .git/index.lock).
    `fresh`: `workspace` was made for this sandbox (_workspace.real_path).
    `place`: where the caller resolves paths (_place.here(), asked if None)."""
    place = place if place is not None else here()
    protected = tuple(protected)
    writable = [workspace] if workspace and not fresh else []
    writable += policy.writable_roots
    made = [_workspace.real_path(workspace, place)] if workspace and fresh else []
    if policy.deny_read or policy.deny_write or (protected and not view):
        readable, granted = _paths(policy, writable, made, protected, view)
        return handled_rights(abi), _merged(readable, granted, abi)
    # Without a carving, a workspace made for this sandbox is one rule more
    # (its path is new: no other rule names it).
    key = (policy, tuple(writable), abi, place)
    now = time.monotonic()
    hit = _kept_rules.get(key)
    if hit is None or now - hit[0] >= TTL:
        hit = (now, _merged(*_paths(policy, writable, [], (), view), abi))
        if len(_kept_rules) > 64:
            _kept_rules.clear()
        _kept_rules[key] = hit
    kept = hit[1]
    if made:
        kept = [*kept, (made[0], writable_rights(abi))]
    return handled_rights(abi), kept


def _paths(
    policy: Policy, writable: list[str], made: list[str], protected: tuple[str, ...], view: bool
) -> tuple[list[str], list[str]]:
    """(what may be read, what may be written), resolved and carved."""
    denied_writes = []
    if not view:
        named = [*policy.deny_write, *policy.deny_read, *protected]
        # What a link leads to, and the link itself (the program could
        # replace it with a file of its own).
        denied_writes = [_real(x) for x in named] + [x for x in named if os.path.islink(x)]
    readable = subtract(["/"], [_real(x) for x in policy.deny_read])
    return readable, subtract(writable, denied_writes, made)


def _merged(readable: list[str], granted: list[str], abi: int) -> list[tuple[str, int]]:
    out = [(p, READ) for p in readable]
    out += [(p, writable_rights(abi)) for p in granted]
    out += [(d, DEVICE) for d in DEVICES]
    # One rule a path: the kernel would merge them, after a lookup each.
    merged: dict[str, int] = {}
    for path, rights in out:
        merged[path] = merged.get(path, 0) | rights
    return list(merged.items())


# A ruleset fd can be applied by any number of children (each
# landlock_restrict_self copies it into the child's own domain): one is
# kept per distinct set of rules and reused while every rule's path is
# still the file it was when the ruleset was made.  Each spawn gets a dup
# of it, so a ruleset dropped meanwhile never closes a spawn's fd.  A dup
# is the same ruleset: a child that adds a rule (a tmpfs it mounts) needs
# one of its own, or the rule would stay in every later sandbox's domain,
# and the ruleset would grow by one rule a spawn for the process's life.
STAT = getattr(_core, "FS_STAT", 0)  # the POSIX core's (Landlock is Linux's)
Net = tuple[int, int, Sequence[int], int]
_Key = tuple[int, tuple[tuple[str, int], ...], tuple[int, int, tuple[int, ...], int]]
# A rule's path now: (st_dev, st_ino), links followed as the core's
# open(O_PATH) follows them, or the errno its stat failed with.
_Ident = tuple[int, int] | tuple[int] | int | bytes
_Stats = list[tuple[int, bytes, None]]
_rulesets: dict[_Key, tuple[int, tuple[_Ident, ...], _Stats]] = {}
_rulesets_lock = threading.Lock()
_KEEP = 16


def _idents(stats: _Stats) -> tuple[_Ident, ...]:
    # One core call: a stat each releasing the GIL would hand it to the
    # supervisor's threads a dozen times per spawn, and wait to get it back.
    return tuple(_core.fs_batch(stats, False))


def ruleset(handled: int, file_rules: list[tuple[str, int]], net: Net, *, reuse: bool) -> int:
    """A Landlock ruleset fd for `file_rules` and `net`, the caller's to
    close; `reuse`: the rules may come back (a workdir, not a workspace
    made for this sandbox), so keep the ruleset for the next spawn."""
    h_net, a_net, ports, scoped = net
    if not reuse:
        return _core.landlock_ruleset(handled, file_rules, h_net, a_net, ports, scoped)[0]
    key: _Key = (handled, tuple(file_rules), (h_net, a_net, tuple(ports), scoped))
    with _rulesets_lock:
        hit = _rulesets.get(key)
    stats = hit[2] if hit is not None else [(STAT, os.fsencode(p), None) for p, _a in file_rules]
    # Before the ruleset is made: a path replaced meanwhile then differs
    # from what is kept, and the next spawn makes a new ruleset.
    idents = _idents(stats)
    with _rulesets_lock:
        hit = _rulesets.get(key)
        if hit is not None and hit[1] == idents:
            return os.dup(hit[0])
    fd = _core.landlock_ruleset(handled, file_rules, h_net, a_net, ports, scoped)[0]
    try:
        kept = os.dup(fd)
    except OSError:
        return fd
    with _rulesets_lock:
        old = _rulesets.pop(key, None)
        gone = [old[0]] if old is not None else []
        if len(_rulesets) >= _KEEP:
            gone += [k_fd for k_fd, _i, _s in _rulesets.values()]
            _rulesets.clear()
        _rulesets[key] = (kept, idents, stats)
    for k_fd in gone:
        os.close(k_fd)
    return fd


def drop_rulesets() -> None:
    """Close the rulesets kept and forget the rules (Monitor.drain:
    nothing kept is left)."""
    _kept_rules.clear()
    with _rulesets_lock:
        gone = [k_fd for k_fd, _i, _s in _rulesets.values()]
        _rulesets.clear()
    for k_fd in gone:
        os.close(k_fd)


def _forget_after_fork() -> None:
    # The child's copies: closed, as its own spawns start afresh.
    global _rulesets_lock
    _rulesets_lock = threading.Lock()
    for k_fd, _i, _s in _rulesets.values():
        try:
            os.close(k_fd)
        except OSError:
            pass
    _rulesets.clear()
    _kept_rules.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


# -- planning (_platform lists these) ------------------------------------------


def plan_abi(p: Plan, r: Request) -> None:
    """The ABI the file rules (and, from ABI 4, the TCP rules) use."""
    if r.policy is None:
        return
    abi = _core.landlock_abi()
    if abi >= 1:
        p.landlock = abi
        # landlock_restrict_self needs no_new_privs (or CAP_SYS_ADMIN),
        # whatever `harden` says.
        p.no_new_privs = True


def plan_scopes(p: Plan, r: Request) -> None:
    """Signals and abstract unix sockets: Landlock's scopes (ABI 6) hold
    them to the sandbox's own processes; a PID or network namespace hides
    the rest, the filter at least keeps the caller out of reach."""
    if r.policy is None:
        return
    scoped = p.landlock >= 6
    if scoped:
        h, a, ports, _ = p.landlock_net
        p.landlock_net = (h, a, ports, SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL)
    own = "its own processes only"
    if scoped:
        p.hold("signals", f"landlock:abi{p.landlock} scope", own)
    elif p.ns_flags & CLONE_NEWPID:
        p.hold("signals", "pidns", "it sees only its own processes")
    elif p.seccomp:
        # Its pid rules cannot see whom a pidfd_send_signal on a /proc/PID
        # directory fd reaches: refused whole.
        p.seccomp_signals = True
        gap = (
            "the caller, its sentinel and kill(-1) are refused, other processes of the same "
            f"user are not (Landlock ABI 6 scopes signals; ABI {max(p.landlock, 0)} here)"
        )
        p.hold("signals", "seccomp:caller", gap)
        p.fallbacks["signals"] = gap
    else:
        p.downgrade("signals", "neither Landlock ABI 6 nor a seccomp filter here")
    if scoped:
        p.hold("abstract_sockets", f"landlock:abi{p.landlock} scope", own)
    elif p.ns_flags & CLONE_NEWNET:
        p.hold("abstract_sockets", "netns", "a namespace of its own")
    else:
        p.downgrade(
            "abstract_sockets",
            f"host abstract unix sockets are reachable: Landlock ABI 6 scopes them "
            f"(ABI {max(p.landlock, 0)} here)",
        )
