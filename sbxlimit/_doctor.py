"""``doctor()``: what this machine can enforce, checked by trying it.

Every check really uses the mechanism (in a short-lived child where trying
has side effects, each with a timeout) instead of reading a flag.  The
report's summary says, for each Limits field and Policy protection, which
mechanism would hold it here: the very strings ``Popen.enforced`` uses,
because both come from ``_plan.plan``.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from . import _core, _platform
from ._enforcement import Enforcement
from ._limits import Limits
from ._plan import plan
from ._platform import (
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    can_raise_hard_limits,
)
from ._policy import Policy

if sys.platform != "win32":  # the POSIX mechanisms; Windows's checks are _windoctor's
    from ._cgroup import discover
    from ._cgroupfs import mounts, own_cgroups, v2_mount
    from ._namespaces import namespaces, userns_blockers
    from ._workspace import slow_directories

__all__ = ["Check", "Report", "doctor"]

OK, DEGRADED, UNAVAILABLE, INFO = "ok", "degraded", "unavailable", "info"
_MARKS = {OK: "✓", DEGRADED: "!", UNAVAILABLE: "✗", INFO: "·"}
_COLORS = {OK: "\033[32m", DEGRADED: "\033[33m", UNAVAILABLE: "\033[31m", INFO: "\033[2m"}
_TIMEOUT_MS = 1000
_LINUX = _platform.LINUX

# The request the summary is computed for: every limit and the default
# Policy, i.e. "the default protections".
_REFERENCE_LIMITS = Limits(
    memory="256Mi",
    cpu_time="60s",
    cpu="500m",
    pids=64,
    open_files=256,
    file_size="100Mi",
    disk="100Mi",
    wall_time="60s",
    output="10Mi",
)

_CAPS = {
    "CAP_KILL": 5,
    "CAP_SETGID": 6,
    "CAP_SETUID": 7,
    "CAP_NET_ADMIN": 12,
    "CAP_SYS_PTRACE": 19,
    "CAP_SYS_ADMIN": 21,
    "CAP_SYS_RESOURCE": 24,
}


@dataclasses.dataclass(frozen=True, slots=True)
class Check:
    """One mechanism: ``status`` is ok / degraded / unavailable (or info for
    facts), ``reason`` one line, ``fix`` what to do about it."""

    name: str
    status: str
    reason: str
    fix: str = ""
    details: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, slots=True)
class Report:
    """The doctor's findings.  ``str(report)`` is the checklist people read;
    ``to_dict()`` the JSON form (stable keys: system, checks, summary, ok)."""

    system: dict[str, Any]
    checks: tuple[Check, ...]
    summary: dict[str, Enforcement]  # the same values as Popen.enforced

    @property
    def ok(self) -> bool:
        """True when every default protection is held here."""
        return all(v.held for v in self.summary.values())

    def check(self, name: str) -> Check:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "system": dict(self.system),
            "checks": [c.to_dict() for c in self.checks],
            "summary": dict(self.summary),
            "ok": self.ok,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    def render(self, color: bool = False) -> str:
        def paint(status: str, text: str) -> str:
            return f"{_COLORS[status]}{text}\033[0m" if color else text

        s = self.system
        lines = [
            f"sbxlimit doctor — {s['os']} {s['kernel']} {s['arch']}, Python {s['python']}, "
            f"uid {s['uid']}{' (root)' if s['uid'] == 0 else ''}",
            "",
            "Mechanisms:",
        ]
        width = max(len(c.name) for c in self.checks)
        for c in self.checks:
            mark = paint(c.status, _MARKS[c.status])
            lines.append(f"  {mark} {c.name:<{width}}  {c.reason}")
            if c.fix and c.status in (DEGRADED, UNAVAILABLE):
                lines.append(f"    {'':<{width}}  fix: {c.fix}")
        lines += ["", "What would hold each limit and protection here:"]
        width = max(len(k) for k in self.summary)
        for k, v in self.summary.items():
            status = OK if v.held else UNAVAILABLE
            lines.append(f"  {paint(status, _MARKS[status])} {k:<{width}}  {v}")
        verdict = (
            "every default protection is available"
            if self.ok
            else "some default protections are not available (see ✗ above)"
        )
        lines += ["", paint(OK if self.ok else UNAVAILABLE, f"Result: {verdict}.")]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render(color=False)


def doctor() -> Report:
    """Probe this machine and report what sbxlimit can enforce here."""
    system = _system()
    probes: list[Callable[[], Check]]
    if _LINUX:
        probes = [
            _check_spawn,
            _check_rlimits,
            _check_proc_tree,
            _check_cgroups,
            _check_clone3_cgroup,
            _check_pidfd,
            _check_close_range,
            _check_no_new_privs,
            _check_seccomp,
            _check_landlock,
            _check_userns,
            lambda: _check_ns("mount_namespace", CLONE_NEWNS),
            lambda: _check_ns("network_namespace", CLONE_NEWNET),
            lambda: _check_ns("pid_namespace", CLONE_NEWPID),
            _check_ro_view,
            _check_capabilities,
            _check_container,
            _check_tmpdir,
        ]
    elif _platform.DARWIN:
        probes = [
            _check_spawn,
            _check_rlimits,
            _check_seatbelt,
            _check_process_tree,
            _check_darwin_limits,
        ]
    elif _platform.WINDOWS:
        from ._windoctor import PROBES

        probes = list(PROBES)
    else:
        probes = [_check_unsupported_os]
    checks = []
    for probe in probes:
        try:
            checks.append(probe())
        except Exception as e:  # a broken probe must not break the report
            name = getattr(probe, "__name__", "probe").removeprefix("_check_")
            checks.append(Check(name, UNAVAILABLE, f"probe failed: {e!r}"))
    if _platform.WINDOWS:
        from ._winjob import plan as plan_job

        summary = plan_job(_REFERENCE_LIMITS, Policy()).enforced
    else:
        summary = plan(_REFERENCE_LIMITS, Policy(), uid=os.geteuid(), site=discover()).enforced
    return Report(system, tuple(checks), dict(summary))


# -- facts ------------------------------------------------------------------


def _capabilities() -> list[str]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    eff = int(line.split()[1], 16)
                    return [name for name, bit in _CAPS.items() if eff >> bit & 1]
    except OSError:
        pass
    return []


def _system() -> dict[str, Any]:
    return {
        "os": platform.system(),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "python": platform.python_version(),
        # Windows has no uid: the user's name stands there.
        "uid": os.geteuid() if hasattr(os, "geteuid") else os.environ.get("USERNAME", "?"),
        "capabilities": _capabilities() if _LINUX else [],
    }


def _errname(err: int) -> str:
    return f"{errno.errorcode.get(err, str(err))} ({os.strerror(err)})"


# -- checks -----------------------------------------------------------------


def _check_spawn() -> Check:
    from ._run import run

    t0 = time.monotonic()
    r = run([sys.executable, "-c", "pass"], limits=Limits(wall_time=10))
    took = (time.monotonic() - t0) * 1000
    how = "vfork-style (CLONE_VM|CLONE_VFORK)" if _core.HAS_VFORK else "fork()"
    if r.returncode != 0:
        return Check("spawn", UNAVAILABLE, f"a sandboxed `python -c pass` exited {r.returncode}")
    return Check("spawn", OK, f"{how}; a sandboxed no-op ran in {took:.0f} ms")


def _check_rlimits() -> Check:
    import resource

    from ._run import run

    names = ("CPU", "FSIZE", "DATA", "AS", "NOFILE", "NPROC", "CORE")
    hard = {n: resource.getrlimit(getattr(resource, f"RLIMIT_{n}"))[1] for n in names}
    finite = {n: h for n, h in hard.items() if h != resource.RLIM_INFINITY}
    # A real use: every rlimit the core sets, read back by the program.
    checked = ["CPU", "FSIZE", "NOFILE", "DATA", "AS", "CORE"]
    limits = Limits(cpu_time=30, file_size="1Gi", open_files=64, memory="1Gi", address_space="8Gi")
    want = [30, 1 << 30, 64, 1 << 30, 8 << 30, 0]
    if not _LINUX:
        # macOS holds memory and pids with the tree watchdog (RLIMIT_DATA and
        # RLIMIT_AS cannot go below the address map's size there).
        checked = ["CPU", "FSIZE", "NOFILE", "CORE"]
        limits = Limits(cpu_time=30, file_size="1Gi", open_files=64)
        want = [30, 1 << 30, 64, 0]
    elif os.geteuid() != 0:  # RLIMIT_NPROC does not bind root: not set then
        checked.append("NPROC")
        limits = Limits(**{**limits.to_dict(), "pids": 4096})
        want.append(4096)
    code = (
        "import resource as r\n"
        f"print(*(r.getrlimit(getattr(r, 'RLIMIT_' + n))[0] for n in {checked!r}))"
    )
    # No cgroup: where one holds memory, RLIMIT_DATA is not set at all.
    res = run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        limits=limits,
        cgroup_parent="none",
    )
    got = res.stdout.split()
    if got != [str(w) for w in want]:
        if finite:
            return Check(
                "rlimits",
                DEGRADED,
                f"set {', '.join(checked)} in the child, read back {' '.join(got)!r} "
                f"(clamped by hard limits: {finite})",
                "raise the hard limits (ulimit -H, /etc/security/limits.conf)",
                {"hard": hard},
            )
        return Check("rlimits", UNAVAILABLE, f"set in the child, read back {' '.join(got)!r}")
    reason = f"{', '.join(checked)} set in the child and read back"
    if finite and not can_raise_hard_limits():
        caps = ", ".join(f"{n}={v}" for n, v in finite.items())
        return Check(
            "rlimits",
            OK,
            f"{reason}; requests above the inherited hard limits are clamped ({caps})",
            "raise the hard limits (ulimit -H, /etc/security/limits.conf) if they are too low",
            {"hard": hard},
        )
    return Check("rlimits", OK, reason, details={"hard": hard})


def _check_proc_tree() -> Check:
    tid = os.getpid()
    try:
        with open(f"/proc/{tid}/task/{tid}/children"):
            pass
        _core.tree_sample(os.getpid())
    except OSError as e:
        return Check(
            "proc_tree",
            DEGRADED,
            f"/proc/PID/task/TID/children unreadable ({e.strerror}): the memory/pids watchdog "
            "and tree kills see only the process group",
            "a kernel with CONFIG_PROC_CHILDREN=y",
        )
    return Check("proc_tree", OK, "process trees sampled and signalled through /proc")


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _cgroup_trial() -> str | None:
    """A real sandbox in a cgroup of the chosen site: limited, joined,
    killed as a whole and removed.  None when all of that worked."""
    from ._monitor import get_monitor
    from ._popen import Popen

    limits = Limits(memory="64Mi", pids=64, cpu="500m", wall_time="10s")
    try:
        p = Popen(["sleep", "5"], stdin=subprocess.DEVNULL, limits=limits)
    except OSError as e:
        return f"cannot start a sandbox in a cgroup: {e}"
    with p:
        cg = p._sbx.cgroup
        try:
            if cg is None or p.pid not in cg.pids():
                return "the sandbox did not land in its cgroup"
        finally:
            p.kill_tree(grace=0)
    if not get_monitor().drain(5) or (cg is not None and not cg.removed):
        return "the sandbox's cgroup could not be removed"
    return None


def _layout() -> str:
    mnts = mounts()
    v1 = {c for _p, kind, opts in mnts if kind == "cgroup" for c in opts}
    v2 = v2_mount()
    if v2 and not v1 & {"memory", "pids", "cpu"}:
        return "unified (v2)"
    if v2 and v1:
        return "hybrid (v1 + v2)"
    return "legacy (v1)" if v1 else "none"


def _check_cgroups() -> Check:
    layout = _layout()
    site = discover()
    details: dict[str, Any] = {
        "layout": layout,
        "own": own_cgroups(),
        "version": site.version,
        "parents": dict(site.parents),
        "controllers": sorted(site.controllers),
    }
    fix_v2 = (
        "run under a delegated cgroup: `systemd-run --user --scope -p Delegate=yes -- "
        "python ...` with SBXLIMIT_CGROUP_MOVE_SELF=1, or set SBXLIMIT_CGROUP_PARENT to a "
        "cgroup you may write whose cgroup.subtree_control lists memory, pids and cpu "
        "(docs/cgroups.md)"
    )
    if layout == "none":
        return Check("cgroups", UNAVAILABLE, "no cgroup filesystem is mounted", fix_v2, details)
    if not site.version:
        return Check(
            "cgroups",
            UNAVAILABLE,
            f"{layout}: {site.reason}; limits fall back to rlimits and the watchdog",
            fix_v2,
            details,
        )
    failed = _cgroup_trial()
    where = ", ".join(p for _c, p in site.parents)
    if failed is not None:
        return Check("cgroups", DEGRADED, f"{layout}: {failed}", fix_v2, details)
    held = ", ".join(sorted(site.controllers))
    what = (
        f"{layout}: a sandbox was limited ({held}), killed as a whole and removed "
        f"in {site.label} under {where}"
    )
    if site.reason:
        return Check("cgroups", DEGRADED, f"{what}; {site.reason}", fix_v2, details)
    if site.version == 1:
        return Check(
            "cgroups",
            DEGRADED,
            f"{what}; cgroup v1 is the fallback: no cgroup.kill, no CLONE_INTO_CGROUP",
            "boot with systemd.unified_cgroup_hierarchy=1 for cgroup v2",
            details,
        )
    return Check("cgroups", OK, what, details=details)


def _rmdir_retry(path: str | None) -> None:
    """Remove a probe cgroup once the probe's child has left it."""
    if path is None:
        return
    for _ in range(100):
        try:
            os.rmdir(path)
            return
        except OSError:
            time.sleep(0.01)


def _check_clone3_cgroup() -> Check:
    v2 = v2_mount()
    if v2 is None:
        return Check("clone3_cgroup", UNAVAILABLE, "no cgroup v2 mount to be born into")
    site = discover()
    probe_dir = None
    if site.version == 2:
        # A leaf of our own: the site's parent enables controllers for its
        # children, so (no internal processes) nothing may be born in it.
        probe_dir = path = os.path.join(site.parents[0][1], f"sbxlimit-probe-{os.getpid()}")
        try:
            os.mkdir(path)
        except OSError as e:
            return Check("clone3_cgroup", UNAVAILABLE, f"cannot create {path}: {e.strerror}")
    else:
        path = os.path.join(v2, own_cgroups().get("", "/").lstrip("/"))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        _rmdir_retry(probe_dir)
        return Check("clone3_cgroup", UNAVAILABLE, f"cannot open {path}: {e.strerror}")
    try:
        err = _core.probe(_core.PROBE_CLONE3_CGROUP, fd, _TIMEOUT_MS)
    finally:
        os.close(fd)
        _rmdir_retry(probe_dir)
    if err:
        fix = (
            "a cgroup this user may write (see the cgroups fix)"
            if err in (errno.EACCES, errno.EPERM)
            else "Linux 5.7 or newer"
        )
        return Check(
            "clone3_cgroup",
            UNAVAILABLE,
            f"clone3(CLONE_INTO_CGROUP) into {path} failed: {_errname(err)}",
            fix,
        )
    if site.version != 2:
        where = "cgroup v1" if site.version == 1 else "no cgroup"
        return Check(
            "clone3_cgroup",
            DEGRADED,
            "a child can be born directly in a cgroup v2 (Linux 5.7+), but sandboxes use "
            f"{where} here"
            + (", so each child joins its cgroups itself (v1: tasks)" if site.version else ""),
        )
    if platform.machine() != "x86_64" or not _core.HAS_VFORK:
        return Check(
            "clone3_cgroup",
            DEGRADED,
            "the kernel can place a child at birth, but sbxlimit's clone3 path exists for "
            f"x86-64 only ({platform.machine()}): each child writes cgroup.procs itself",
        )
    return Check(
        "clone3_cgroup", OK, "sandboxes are born directly in their cgroup (CLONE_INTO_CGROUP)"
    )


def _simple(name: str, kind: int, what: str, fix: str, status_if_missing: str) -> Check:
    err = _core.probe(kind, 0, _TIMEOUT_MS)
    if err:
        return Check(name, status_if_missing, f"{what} failed: {_errname(err)}", fix)
    return Check(name, OK, f"{what} works")


def _check_pidfd() -> Check:
    return _simple(
        "pidfd",
        _core.PROBE_PIDFD,
        "pidfd_open",
        "Linux 5.3 or newer; without it a sandbox's exit is noticed at reap time, and a"
        " killed caller's sandboxes are not ended by its sentinel",
        DEGRADED,
    )


def _check_close_range() -> Check:
    return _simple(
        "close_range",
        _core.PROBE_CLOSE_RANGE,
        "close_range",
        "Linux 5.9 or newer; older kernels close fds one by one via /proc/self/fd",
        DEGRADED,
    )


def _check_no_new_privs() -> Check:
    return _simple(
        "no_new_privs",
        _core.PROBE_NO_NEW_PRIVS,
        "prctl(PR_SET_NO_NEW_PRIVS) in a child",
        "Linux 3.5 or newer",
        UNAVAILABLE,
    )


def _check_seccomp() -> Check:
    mode = {"0": "none", "1": "strict", "2": "filter"}.get(_status_field("Seccomp"), "unknown")
    err = _core.probe(_core.PROBE_SECCOMP, 0, _TIMEOUT_MS)
    if err:
        return Check(
            "seccomp",
            UNAVAILABLE,
            f"loading a filter failed: {_errname(err)} (this process: {mode})",
            "a kernel with CONFIG_SECCOMP_FILTER=y; inside a container, allow seccomp",
        )
    return Check(
        "seccomp",
        OK,
        f"a filter loads in a child (this process: {mode}); holds harden (allow-list "
        f"v{_core.SECCOMP_VERSION}: socket families, no namespaces, devices, TIOCSTI) and the "
        "socket rules",
    )


_LANDLOCK_FEATURES = [
    (2, "file renames/links across directories (refer)"),
    (3, "truncate"),
    (4, "TCP bind/connect rules"),
    (5, "ioctl on devices"),
    (6, "signal and abstract-socket scoping (other processes of the same user reachable)"),
]


def _check_landlock() -> Check:
    abi = _core.landlock_abi()
    if abi < 0:
        err = -abi
        fix = (
            "add landlock to the lsm= kernel parameter"
            if err == errno.EOPNOTSUPP
            else "a kernel with CONFIG_SECURITY_LANDLOCK=y (Linux 5.13+)"
        )
        return Check("landlock", UNAVAILABLE, f"not available: {_errname(err)}", fix)
    missing = [what for need, what in _LANDLOCK_FEATURES if abi < need]
    if missing:
        return Check(
            "landlock",
            DEGRADED,
            f"ABI {abi}; missing: {', '.join(missing)}",
            "a newer kernel",
            {"abi": abi},
        )
    return Check(
        "landlock",
        OK,
        f"ABI {abi}: every feature sbxlimit uses",
        details={"abi": abi},
    )


def _check_userns() -> Check:
    err = _core.probe(_core.PROBE_UNSHARE, CLONE_NEWUSER, _TIMEOUT_MS)
    if not err:
        return Check("user_namespace", OK, "user namespaces can be created")
    blockers = [(name, good) for name, _bad, good in userns_blockers()]
    why = f" (blocked by {', '.join(n for n, _g in blockers)})" if blockers else ""
    fix = " ".join(f"sysctl -w {n}={g};" for n, g in blockers).rstrip(";")
    return Check(
        "user_namespace",
        UNAVAILABLE,
        f"unshare(CLONE_NEWUSER) failed: {_errname(err)}{why}",
        fix or "a kernel with CONFIG_USER_NS=y; inside a container, allow unshare",
    )


_NS_USES = {
    CLONE_NEWNS: "disk as a size-capped tmpfs workspace",
    CLONE_NEWNET: "network='deny' (loopback only)",
    CLONE_NEWPID: "isolate_pids (a reaper as PID 1)",
}


def _check_ns(name: str, flag: int) -> Check:
    # The spawn path's own probe (cached): unshare, the uid/gid maps, lo up,
    # a tmpfs mount, a fork into the PID namespace, in a throw-away child.
    flags = flag | (CLONE_NEWNS if flag == CLONE_NEWPID else 0)
    ns = namespaces(flags)
    if not ns.ok:
        return Check(
            name,
            UNAVAILABLE,
            ns.reason,
            "root, or unprivileged user namespaces (see user_namespace)",
        )
    via = (
        " inside an unprivileged user namespace (uid and gid mapped to their own)"
        if ns.user
        else ""
    )
    return Check(
        name, OK, f"set up for real{via}; holds {_NS_USES[flag]}", details={"userns": ns.user}
    )


def _check_ro_view() -> Check:
    # The spawn path's probe: the mount namespace, then the view's calls.
    ns = namespaces(CLONE_NEWNS, view=True)
    if not ns.ok:
        return Check(
            "read_only_view",
            UNAVAILABLE,
            f"{ns.reason}; files rest on Landlock alone (no metadata rules)",
            "Linux 5.12+, and root or unprivileged user namespaces (see user_namespace)",
        )
    via = " inside an unprivileged user namespace" if ns.user else ""
    return Check(
        "read_only_view",
        OK,
        f"the host mounted read-only for a sandbox{via}, writable roots bound back; holds "
        "files with Landlock on top",
        details={"userns": ns.user},
    )


def _check_capabilities() -> Check:
    held = _status_field("CapPrm")
    bounding = int(_status_field("CapEff") or "0", 16) >> _CAP_SETPCAP & 1
    if not int(held or "0", 16):
        return Check(
            "capabilities", OK, "this process holds none; a sandbox cannot gain any (no_new_privs)"
        )
    if bounding:
        return Check(
            "capabilities",
            OK,
            "a sandbox drops every capability: bounding set, ambient, securebits (uid 0 gets "
            "none back at execve); Policy(capabilities=[...]) keeps the ones named",
        )
    return Check(
        "capabilities",
        DEGRADED,
        "no CAP_SETPCAP: a sandbox drops its capabilities but not the bounding set; "
        "no_new_privs keeps execve from granting any (harden=False would let root regain them)",
        "keep CAP_SETPCAP in the container's capability set",
    )


_CAP_SETPCAP = 8


def _status_field(key: str) -> str:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _check_container() -> Check:
    signs = []
    if os.path.exists("/.dockerenv"):
        signs.append("/.dockerenv")
    if os.path.exists("/run/.containerenv"):
        signs.append("/run/.containerenv")
    if _status_field("Seccomp") == "2":
        signs.append("this process runs under a seccomp filter")
    if _status_field("NoNewPrivs") == "1":
        signs.append("no_new_privs is already set")
    try:
        if os.readlink("/proc/self/ns/cgroup") != os.readlink("/proc/1/ns/cgroup"):
            signs.append("own cgroup namespace")
    except OSError:
        pass
    if signs:
        return Check(
            "container",
            INFO,
            "inside a container or sandbox: " + "; ".join(signs),
            "what works here may differ from the host",
        )
    return Check("container", INFO, "no sign of a container or outer sandbox")


def _check_tmpdir() -> Check:
    """Where private workspaces are made, and whether that filesystem
    makes them slow at a high spawn rate (_workspace.slow_directories)."""
    tmp = tempfile.gettempdir()
    slow = slow_directories(tmp)
    if slow:
        return Check(
            "tmpdir",
            INFO,
            f"private workspaces are made in {tmp}: {slow}; a TMPDIR on tmpfs or a "
            "journaled filesystem avoids it",
            "set TMPDIR to a tmpfs or a journaled filesystem",
        )
    return Check("tmpdir", INFO, f"private workspaces are made in {tmp}")


def _check_seatbelt() -> Check:  # pragma: no cover - macOS only
    """The default profile, applied for real to what agents run most: a
    Python, a shell, git."""
    import shutil

    from ._errors import SandboxSetupError
    from ._run import run
    from ._seatbelt import HELPER

    if not os.access(HELPER, os.X_OK):
        return Check(
            "seatbelt", UNAVAILABLE, f"{HELPER} is missing", "reinstall sbxlimit from source"
        )
    programs = [
        [sys.executable, "-c", "import tempfile, subprocess; tempfile.TemporaryFile().close()"],
        ["/bin/sh", "-c", 'echo ok > "$TMPDIR/probe" && cat "$TMPDIR/probe" >/dev/null'],
    ]
    git = shutil.which("git")
    if git:
        programs.append([git, "init", "-q", "repo"])
    failed = []
    for argv in programs:
        # The default policy, as a sandbox gets it: a private workspace
        # (cwd and TMPDIR), nothing else writable.
        try:
            r = run(argv, policy=Policy(), capture_output=True, timeout=30)
        except SandboxSetupError as e:
            return Check("seatbelt", UNAVAILABLE, f"the profile was refused: {e}")
        if r.returncode != 0:
            err = r.stderr.decode(errors="replace").strip()[-200:]
            failed.append(f"{os.path.basename(argv[0])} exited {r.returncode}: {err}")
    if failed:
        return Check(
            "seatbelt",
            DEGRADED,
            "under the generated profile: " + "; ".join(failed),
            "report this with `sbxlimit seatbelt-profile` output (docs/seatbelt.md)",
        )
    names = ", ".join(os.path.basename(a[0]) for a in programs)
    return Check("seatbelt", OK, f"{names} ran under the generated Seatbelt profile")


def _check_process_tree() -> Check:
    """The tree the watchdog and kill_tree see: three levels, one of them a
    session of its own, all seen and all ended."""
    import tempfile

    from ._popen import Popen

    with tempfile.TemporaryDirectory(prefix="sbxlimit-doctor-") as where:
        pids = os.path.join(where, "pids")
        script = (
            'echo $$ >> "$1"\n'
            'sh -c \'echo $$ >> "$1"; sleep 60 & echo $! >> "$1"; wait\' sh "$1" &\n'
            '"$2" -c \'import os, sys, time; os.setsid(); '
            'open(sys.argv[1], "a").write("%d\\n" % os.getpid()); time.sleep(60)\' "$1" &\n'
            "wait\n"
        )
        p = Popen(
            ["/bin/sh", "-c", script, "sh", pids, sys.executable], limits=Limits(wall_time=60)
        )
        seen = procs = 0
        deadline = time.monotonic() + 5
        try:
            while time.monotonic() < deadline:
                try:
                    with open(pids) as f:
                        seen = len(f.read().split())
                except FileNotFoundError:
                    seen = 0
                procs = _core.tree_sample(p.pid)[2]
                if seen >= 4 and procs >= 4:
                    break
                time.sleep(0.02)
        finally:
            p.kill_tree(grace=0)
            p.wait(5)
        with open(pids) as f:
            members = [int(x) for x in f.read().split()]
    left = [pid for pid in members if _running(pid)]
    if procs < 4 or left:
        return Check(
            "process_tree",
            UNAVAILABLE,
            f"a tree of 4 processes (one in its own session): {procs} seen, "
            f"{len(left)} left running after kill_tree",
            "report this: the memory and pids watchdogs depend on the tree walk",
        )
    return Check("process_tree", OK, "3 levels seen, a setsid() child included; all ended")


def _running(pid: int) -> bool:
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        if _LINUX:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                        return False
            except FileNotFoundError:
                return False
        time.sleep(0.02)
    return True


def _check_darwin_limits() -> Check:  # pragma: no cover - macOS only
    return Check(
        "isolation",
        UNAVAILABLE,
        "macOS has no cgroups, network or PID namespaces: memory, pids and cpu_time are held "
        "by the tree watchdog (sampled), cpu rate cannot be held, and a sandbox outlives a "
        "caller that is killed",
        "use a Linux VM for strict isolation",
    )


def _check_unsupported_os() -> Check:
    return Check(
        "platform",
        UNAVAILABLE,
        f"{sys.platform} is not supported yet",
        "use Linux, macOS or Windows",
    )


def _isatty_color(stream: Any) -> bool:
    """Colour only on a terminal, and never with NO_COLOR set."""
    return bool(getattr(stream, "isatty", lambda: False)()) and "NO_COLOR" not in os.environ
