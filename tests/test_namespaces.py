"""Network rules, PID and mount namespaces, env hardening: real kernels, real
denials.  As root the namespaces are made directly; as an unprivileged user
(CI's second run) through a user namespace mapped to the user's own ids.
Where a mechanism is missing, the test skips with the reason doctor gives.
"""

from __future__ import annotations

import errno
import glob
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest

import sbxlimit
from sbxlimit import Limits, Policy, _core, _fstree, _namespaces
from sbxlimit._namespaces import CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID, namespaces
from sbxlimit._seccomp import seccomp_works

from .conftest import (
    kept_in_a_fork,
    privileges,
    settled_fds,
    settled_temp,
    tagged_sleep,
    view_copy_error,
    wait_no_sleepers,
)

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="namespaces, Landlock and seccomp are Linux's"
)
PY = sys.executable
LINUX = sys.platform.startswith("linux")
NET = namespaces(CLONE_NEWNET) if LINUX else None
MNT = namespaces(CLONE_NEWNS) if LINUX else None
PIDNS = namespaces(CLONE_NEWPID | CLONE_NEWNS) if LINUX else None
ABI = sbxlimit._core.landlock_abi() if LINUX else -1
FILTER = LINUX and sbxlimit._core.HAS_SECCOMP and seccomp_works()


def _needs(ns, row: str):
    ok = ns is not None and ns.ok
    why = ns.reason if ns is not None else "not Linux"
    return pytest.mark.skipif(not ok, reason=f"doctor: {row} unavailable: {why}")


needs_netns = _needs(NET, "network_namespace")
needs_mntns = _needs(MNT, "mount_namespace")
needs_pidns = _needs(PIDNS, "pid_namespace")
# A sanitizer build (SBXLIMIT_DEBUG=1) fork()s its children: its PID 1 is a
# copy of the caller that reaps in place, and never execs the reaper.
needs_vforked_pid1 = pytest.mark.skipif(
    not sbxlimit._core.HAS_VFORK,
    reason="PID 1 execs the reaper only when vforked; this build forks",
)
needs_tcp_rules = pytest.mark.skipif(
    not (ABI >= 4 and FILTER),
    reason=f"doctor: landlock ABI {ABI} (TCP rules need 4) and seccomp {FILTER}",
)
POLICY = Policy(protect_dotfiles=False)

CONNECT = textwrap.dedent(
    """
    import socket, sys
    for port in sys.argv[1:]:
        try:
            socket.create_connection(("127.0.0.1", int(port)), timeout=5).close()
            print("connected")
        except OSError as e:
            print(type(e).__name__, e.errno)
    try:
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()
        print("udp")
    except OSError as e:
        print("udp", type(e).__name__, e.errno)
    """
)


@pytest.fixture
def listeners() -> Iterator[list[int]]:
    """Two TCP listeners on the host's loopback."""
    socks = []
    for _ in range(2):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        socks.append(s)
    yield [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()


def connect(ports: list[int], policy: Policy) -> tuple[list[str], dict[str, str]]:
    r = sbxlimit.run(
        [PY, "-c", CONNECT, *map(str, ports)], policy=policy, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.split("\n")[:-1], r.enforced


def in_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter (namespace probes are cached per process)."""
    return subprocess.run(
        [PY, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


# -- network ---------------------------------------------------------------


def test_allow_reaches_a_loopback_listener(listeners):
    out, enforced = connect(listeners[:1], POLICY)
    assert out == ["connected", "udp"] and "network" not in enforced


@needs_netns
def test_deny_is_a_network_namespace_of_its_own(listeners):
    out, enforced = connect(listeners[:1], Policy(network="deny", protect_dotfiles=False))
    # The host's listener is not there: its own loopback has nothing on that port.
    assert out == ["ConnectionRefusedError 111", "udp"]
    assert enforced["network"].startswith("userns+netns" if NET.user else "netns")
    # Its own loopback is up and usable: a server and client inside.
    code = (
        "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
        "c = socket.create_connection(s.getsockname()); print(open('/proc/net/dev').read())"
    )
    r = sbxlimit.run(
        [PY, "-c", code], policy=Policy(network="deny"), capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    ifaces = [line.split(":")[0].strip() for line in r.stdout.splitlines() if ":" in line]
    assert ifaces == ["lo"]


def _pooled_netns() -> pytest.MarkDecorator:
    ok = NET is not None and NET.ok and not NET.user
    return pytest.mark.skipif(
        not ok, reason="network namespaces are made ahead only where no user namespace is needed"
    )


def _warm_netns_pool() -> None:
    """Ask for a network namespace once, then wait until one is ready."""
    import time

    from sbxlimit._monitor import get_monitor

    sbxlimit.run(["true"], policy=Policy(network="deny", workdir="/"))
    pool = get_monitor()._netpool
    deadline = time.monotonic() + 10
    while not pool.has_ready():
        assert time.monotonic() < deadline, "no network namespace was made ahead"
        time.sleep(0.01)


LISTEN_THEN_WAIT = (
    "import os, socket, sys, time\n"
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
    "print(os.readlink('/proc/self/ns/net'), s.getsockname()[1], flush=True)\n"
    "time.sleep(30)\n"
)


@_pooled_netns()
def test_network_namespaces_made_ahead_are_never_shared():
    # Four live sandboxes from the pool: four namespaces, none the host's,
    # and one's loopback listener is not on another's loopback.
    _warm_netns_pool()
    policy = Policy(network="deny", workdir="/")
    procs = [
        sbxlimit.Popen([PY, "-c", LISTEN_THEN_WAIT], policy=policy, stdout=subprocess.PIPE)
        for _ in range(4)
    ]
    try:
        seen = [p.stdout.readline().decode().split() for p in procs]
        inodes = {ns for ns, _port in seen}
        assert len(inodes) == 4 and os.readlink("/proc/self/ns/net") not in inodes
        out, _enforced = connect([int(seen[0][1])], policy)
        assert out[0] == "ConnectionRefusedError 111"
    finally:
        for p in procs:
            p.kill()
            p.wait()
            p.stdout.close()


@_pooled_netns()
def test_a_pooled_network_namespace_has_lo_up_and_nothing_else():
    _warm_netns_pool()
    from sbxlimit._monitor import get_monitor

    taken = get_monitor()._netpool.taken
    code = "print(open('/proc/net/dev').read())"
    r = sbxlimit.run(
        [PY, "-c", code], policy=Policy(network="deny"), capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert get_monitor()._netpool.taken == taken + 1  # it joined one made ahead
    rows = {line.split(":")[0].strip(): line for line in r.stdout.splitlines() if ":" in line}
    assert list(rows) == ["lo"]


def _pooled_ipcns() -> pytest.MarkDecorator:
    ok = MNT is not None and MNT.ok and not MNT.user
    return pytest.mark.skipif(
        not ok, reason="IPC namespaces are made ahead only where no user namespace is needed"
    )


def _warm_ipcns_pool() -> None:
    """Ask for an IPC namespace once (a view makes one), then wait until
    both the pool's are ready."""
    from sbxlimit._monitor import get_monitor
    from sbxlimit._nspool import SIZE

    sbxlimit.run(["true"], policy=Policy(workdir="/"))
    pool = get_monitor()._ipcpool
    deadline = time.monotonic() + 10
    while len(pool.owned()) < SIZE:
        assert time.monotonic() < deadline, "no IPC namespace was made ahead"
        time.sleep(0.01)


SHM_THEN_WAIT = (
    "import ctypes, os, sys, time\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "key = int(sys.argv[1])\n"
    "made = libc.shmget(key, 4096, 0o3600) >= 0\n"  # IPC_CREAT | IPC_EXCL | 0600
    "print(os.readlink('/proc/self/ns/ipc'), made, flush=True)\n"
    "time.sleep(30)\n"
)


@_pooled_ipcns()
def test_ipc_namespaces_made_ahead_are_never_shared():
    # Four live sandboxes, the first from the pool: four IPC namespaces,
    # none the host's.  Each makes a segment of the same key, which fails
    # (EEXIST) where a neighbour made it first in a namespace they share.
    from sbxlimit._monitor import get_monitor

    _warm_ipcns_pool()
    taken = get_monitor()._ipcpool.taken
    key = 0x5C0000 + os.getpid() % 0xFFFF
    procs = [
        sbxlimit.Popen(
            [PY, "-c", SHM_THEN_WAIT, str(key)], policy=Policy(workdir="/"), stdout=subprocess.PIPE
        )
        for _ in range(4)
    ]
    try:
        seen = [p.stdout.readline().decode().split() for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
            p.stdout.close()
    assert get_monitor()._ipcpool.taken >= taken + 2, "the pool's were not joined"
    inodes = {ns for ns, _made in seen}
    assert len(inodes) == 4 and os.readlink("/proc/self/ns/ipc") not in inodes, seen
    assert all(made == "True" for _ns, made in seen), seen


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("net", marks=_pooled_netns()),
        pytest.param("ipc", marks=_pooled_ipcns()),
    ],
)
def test_a_forked_child_does_not_keep_the_ready_namespaces(kind):
    from sbxlimit._monitor import get_monitor

    (_warm_netns_pool if kind == "net" else _warm_ipcns_pool)()
    theirs = getattr(get_monitor(), f"_{kind}pool").owned()
    assert theirs
    kept = kept_in_a_fork(theirs)
    assert not any(t.startswith(f"{kind}:[") for t in kept.values()), kept


def _template_error() -> str | None:
    """Why the /dev template cannot be built here, or None."""
    if not (MNT is not None and MNT.ok and not MNT.user):
        why = MNT.reason if MNT is not None and not MNT.ok else "it takes a user namespace here"
        return f"the /dev template is root's (doctor: mount_namespace: {why})"
    try:
        os.close(_core.dev_template())
    except OSError as e:
        return f"no /dev template on this kernel ({e}; it needs Linux 6.15)"
    return None


needs_dev_template = pytest.mark.skipif(
    LINUX and _template_error() is not None, reason=str(LINUX and _template_error())
)


@pytest.mark.skipif(
    not (MNT is not None and MNT.ok and ABI >= 1),
    reason=f"needs a read-only view and Landlock (doctor: {MNT and MNT.reason}; abi {ABI})",
)
def test_a_writable_root_view_keeps_its_landlock_ruleset(monkeypatch):
    # Under a writable "/" the rule for "/" holds beneath the child's
    # /dev/pts and /dev/shm: it adds no rule of its own, so the same
    # ruleset serves every spawn of the policy, not one made each time.
    made = []
    real = _core.landlock_ruleset
    monkeypatch.setattr(_core, "landlock_ruleset", lambda *a: made.append(1) or real(*a))
    policy = Policy(workdir="/")
    for _ in range(5):
        r = sbxlimit.run(
            [PY, "-c", "open('/dev/shm/x', 'w').write('1'); import os; os.openpty()"],
            policy=policy,
            capture_output=True,
        )
        assert r.returncode == 0, r.stderr
    assert len(made) <= 1, made


@needs_dev_template
def test_sandboxes_cloning_the_dev_template_share_no_shm_nor_terminal():
    # One template, cloned by each: what one sandbox leaves in its /dev/shm
    # or opens as a terminal is not in the other's.
    code = textwrap.dedent(
        """
        import os, sys, time
        name = sys.argv[1]
        open(f"/dev/shm/{name}", "w").write(name)
        master, slave = os.openpty()
        print(name, sorted(os.listdir("/dev/shm")), sorted(os.listdir("/dev/pts")), flush=True)
        time.sleep(float(sys.argv[2]))
        print(name, sorted(os.listdir("/dev/shm")), sorted(os.listdir("/dev/pts")), flush=True)
        """
    )
    first = sbxlimit.Popen(
        [PY, "-c", code, "first", "3"], policy=Policy(), stdout=subprocess.PIPE, text=True
    )
    try:
        assert first.stdout is not None
        assert first.stdout.readline().split(" ", 1)[1] == "['first'] ['0', 'ptmx']\n"
        second = sbxlimit.run(
            [PY, "-c", code, "second", "0"], policy=Policy(), capture_output=True, text=True
        )
        assert second.returncode == 0, second.stderr
        assert second.stdout.splitlines() == ["second ['second'] ['0', 'ptmx']"] * 2
    finally:
        out, _ = first.communicate(timeout=30)
    assert out == "first ['first'] ['0', 'ptmx']\n"


@needs_dev_template
def test_a_forked_child_does_not_keep_the_dev_template():
    from sbxlimit import _devtree

    sbxlimit.run(["true"], policy=Policy(workdir="/"))
    fd = _devtree.take()
    assert fd >= 0
    _devtree.release()
    assert kept_in_a_fork([fd]) == {}


@needs_dev_template
def test_the_dev_template_outlives_a_drop_while_a_spawn_uses_it():
    # Monitor.drain drops it; a spawn between take() and release() must
    # still find its number meaning the template, not another file.
    from sbxlimit import _devtree

    fd = _devtree.take()
    assert fd >= 0
    ident = os.fstat(fd).st_dev, os.fstat(fd).st_ino
    _devtree.drop()
    assert (os.fstat(fd).st_dev, os.fstat(fd).st_ino) == ident
    assert _devtree.take() == -1  # none handed out while it goes
    _devtree.release()
    try:  # closed: its number may be another thread's file by now
        after: tuple[int, int] | None = os.fstat(fd).st_dev, os.fstat(fd).st_ino
    except OSError:
        after = None
    assert after != ident
    again = _devtree.take()  # a new one
    assert again >= 0 and "null" in os.listdir(f"/proc/self/fd/{again}")
    _devtree.release()


def _kept_views() -> list[int]:
    from sbxlimit import _viewns

    return [kept.fd for kept in _viewns._kept.values()]


needs_view_ns = pytest.mark.skipif(
    LINUX and view_copy_error() is not None, reason=str(LINUX and view_copy_error())
)


def _sandbox_home(tmp_path, monkeypatch):
    """A HOME in a writable root, with a ~/.bashrc and a repository."""
    home = tmp_path / "home"
    (home / "proj").mkdir(parents=True)
    (home / ".bashrc").write_text("old\n")
    subprocess.run(["git", "init", "-q", str(home / "proj")], check=True)
    monkeypatch.setenv("HOME", str(home))
    return home, Policy(workdir=str(home))


def _in(policy: Policy, script: str) -> str:
    r = sbxlimit.run(["sh", "-c", script], policy=policy, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


@needs_view_ns
def test_a_view_is_made_once_and_each_sandbox_runs_in_a_copy(tmp_path, monkeypatch):
    from sbxlimit import _viewns

    _home, policy = _sandbox_home(tmp_path, monkeypatch)
    made = []
    real = _core.view_ns
    monkeypatch.setattr(_core, "view_ns", lambda *a: made.append(1) or real(*a))
    _viewns.drop()
    script = "readlink /proc/self/ns/mnt; ls -l /proc/self/fd; sleep 1"
    live = [
        sbxlimit.Popen(["sh", "-c", script], policy=policy, stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    seen = [p.communicate(timeout=30)[0] for p in live]
    assert len(made) == 1, made
    kept = {os.readlink(f"/proc/self/fd/{fd}") for fd in _kept_views()}
    assert len(kept) == 1
    namespaces = {out.split("\n", 1)[0] for out in seen}
    # Three sandboxes at once, three copies; none runs in the namespace
    # kept, nor holds a namespace's fd.
    assert len(namespaces) == 3 and not namespaces & kept, (namespaces, kept)
    assert not any("mnt:[" in out.split("\n", 1)[1] for out in seen), seen


@needs_view_ns
@pytest.mark.parametrize(
    "policy",
    [Policy(workdir="/"), Policy(workdir="/", network="deny")],
    ids=["workdir=/", "network=deny"],
)
def test_a_sandbox_s_namespace_holds_no_mount_it_hides(policy):
    # Every mount of the view made once is copied, and torn down, with each
    # sandbox's namespace: the kernel's own under a writable root are made
    # read-only where they are (not a read-only copy over the writable
    # tree), and the host's /dev (with its shm and pts) goes before our
    # /dev covers it.
    out = _in(
        policy,
        "cat /proc/self/mountinfo; for d in /proc/sys /sys/fs; do"
        " touch $d/x 2>/dev/null && echo $d written; done; echo checked",
    )
    *table, last = out.splitlines()
    points = [line.split()[4] for line in table if " - " in line]
    assert last == "checked", out  # nothing written in /proc or /sys
    assert len(points) == len(set(points)), sorted(p for p in points if points.count(p) > 1)
    for point in ("/proc", "/sys", "/dev"):
        options = next(line.split()[5] for line in table if line.split()[4] == point)
        assert "ro" in options.split(","), (point, options)


@needs_view_ns
def test_a_writable_root_in_dev_does_not_stop_the_view_made_once(tmp_path):
    # The host's /dev goes from the view once the writable roots are back:
    # one that lies in it (its shm) must still find where to go.
    from sbxlimit import _viewns

    # A directory of the host's /dev alone (not in the one beneath it).
    inside = f"/dev/sbxlimit-test-{os.getpid()}"
    try:
        os.mkdir(inside)
    except OSError as e:
        pytest.skip(f"cannot make a directory in /dev: {e} ({privileges()})")
    try:
        _viewns.drop()
        _in(Policy(workdir=str(tmp_path), writable_roots=[inside]), "true")
        assert _kept_views() and not _viewns._broken
    finally:
        os.rmdir(inside)


def test_a_kernel_mount_entry_that_is_no_mount_is_bound_over_not_its_mount(tmp_path):
    # VIEW_RO_MOUNT on a path that is no mount's root (one unmounted
    # meanwhile): the flags must not land on the mount around it ("/",
    # writable here), the path is bound read-only over itself instead.
    if view_copy_error() is not None or shutil.which("nsenter") is None:
        pytest.skip(str(view_copy_error() or "no nsenter(1) here"))
    inner = tmp_path / "inner"
    inner.mkdir()
    entries = [(_core.VIEW_RO_MOUNT, os.fsencode(inner), b""), (_core.VIEW_RO_MOUNT, b"/proc", b"")]
    fd, missing, _root, _ns = _core.view_ns(entries, False, -1)
    try:
        script = (
            f"touch {inner}/x 2>/dev/null || echo refused; touch {tmp_path}/y && echo written;"
            " grep -c ' /proc ' /proc/self/mountinfo"
        )
        r = subprocess.run(
            ["nsenter", f"--mount=/proc/self/fd/{fd}", "sh", "-c", script],
            pass_fds=[fd],
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        os.close(fd)
    assert list(missing) == [] or not any(missing), missing
    assert r.stdout.split() == ["refused", "written", "1"], (r.stdout, r.stderr)


@needs_view_ns
def test_a_protected_file_replaced_between_spawns_is_the_new_one_and_read_only(
    tmp_path, monkeypatch
):
    # A bind holds the file it was made on: the kept view must go when an
    # editor replaces ~/.bashrc (a new file renamed over it), or the next
    # sandbox would read the old one, while the new one is unprotected.
    home, policy = _sandbox_home(tmp_path, monkeypatch)
    rc = home / ".bashrc"
    assert _in(policy, f"cat {rc}") == "old\n"
    (home / "new").write_text("new\n")
    os.replace(home / "new", rc)
    out = _in(policy, f"cat {rc}; (echo evil >> {rc}) 2>/dev/null && echo written || echo refused")
    assert out.splitlines() == ["new", "refused"], out
    assert rc.read_text() == "new\n"


@needs_view_ns
def test_a_repository_replaced_between_spawns_is_the_new_one_and_protected(tmp_path, monkeypatch):
    # The directories on the way to a protected path are pinned in the
    # kept view: a repository cloned anew (removed, made again) must not
    # leave the next sandbox looking at the removed one.
    import shutil

    home, policy = _sandbox_home(tmp_path, monkeypatch)
    proj = home / "proj"
    assert _in(policy, f"ls -A {proj}") == ".git\n"
    shutil.rmtree(proj)
    proj.mkdir()
    subprocess.run(["git", "init", "-q", str(proj)], check=True)
    (proj / "code.py").write_text("print(1)\n")
    hook = proj / ".git" / "hooks" / "pre-commit"
    out = _in(
        policy, f"ls -A {proj}; (echo evil > {hook}) 2>/dev/null && echo written || echo refused"
    )
    assert out.splitlines() == [".git", "code.py", "refused"], out
    assert not hook.exists()


def _view_alone(monkeypatch) -> None:
    """The read-only view without Landlock on top (as on a kernel that
    lacks it, the UML guest's): what the view holds, it holds alone."""
    import warnings

    monkeypatch.setattr(_core, "landlock_abi", lambda: -38)  # ENOSYS
    warnings.filterwarnings("ignore", "sbxlimit: .* is not enforced here")


@needs_view_ns
def test_a_hidden_secret_whose_directory_the_host_swaps_stays_hidden(tmp_path, monkeypatch):
    # deny_read's cover sits on the file it was made on: the kept view
    # must go when the host swaps a directory above it for a new one (the
    # secret itself sees no event), or the new secret is in the clear.
    _view_alone(monkeypatch)
    (tmp_path / "srv" / "secrets").mkdir(parents=True)
    key = tmp_path / "srv" / "secrets" / "key"
    key.write_text("first\n")
    policy = Policy(deny_read=[str(key)])
    assert _in(policy, f"cat {key} 2>/dev/null; true") == ""
    os.rename(tmp_path / "srv" / "secrets", tmp_path / "srv" / "old")
    (tmp_path / "srv" / "secrets").mkdir()
    key.write_text("second\n")
    assert _in(policy, f"cat {key} 2>/dev/null; true") == ""


@needs_view_ns
def test_a_writable_root_whose_parent_the_host_moves_is_the_new_one(tmp_path, monkeypatch):
    # The host moves the parent of a writable root away and makes a new
    # one: the next sandbox writes in the new one, not in the one moved.
    _view_alone(monkeypatch)
    home, _policy = _sandbox_home(tmp_path / "a", monkeypatch)
    policy = Policy(writable_roots=[str(home)])
    moved = tmp_path / "b" / "home"
    probe = (
        f"(echo x > {home}/g) 2>/dev/null && echo new; "
        f"(echo x > {moved}/g) 2>/dev/null && echo moved; true"
    )
    assert _in(policy, "true") == ""
    os.rename(tmp_path / "a", tmp_path / "b")
    (tmp_path / "a" / "home").mkdir(parents=True)
    assert _in(policy, probe) == "new\n"
    assert (home / "g").exists() and not (moved / "g").exists()


@needs_view_ns
def test_a_mount_made_between_spawns_is_seen_by_the_next(tmp_path, monkeypatch):
    # The kept view copies the mount table it was made from: a volume
    # mounted since must reach the next sandbox as it would without it.
    home, policy = _sandbox_home(tmp_path, monkeypatch)
    vol = home / "vol"
    vol.mkdir()
    assert _in(policy, f"ls -A {vol}") == ""
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(vol)], check=True)
    try:
        (vol / "data").write_text("x")
        assert _in(policy, f"ls -A {vol}") == "data\n"
    finally:
        subprocess.run(["umount", str(vol)], check=True)


# A caller that leaves, after a first sandbox, the mount namespace or the
# root its kept view was made from: its next sandbox must see what the
# caller sees now, not the view kept from before.  ctypes: os.unshare is
# Python 3.12's.
_CALLER = """
import ctypes, os, sys, sbxlimit
from sbxlimit import Policy
libc = ctypes.CDLL(None, use_errno=True)
def check(r):
    if r != 0:
        raise OSError(ctypes.get_errno(), "libc")
base, how = sys.argv[1], sys.argv[2]
def look():
    r = sbxlimit.run(["sh", "-c", "ls -A /tmp/sbx-caller-probe"], policy=Policy(workdir="/"),
                     capture_output=True, text=True)
    return r.stdout.split()
check(libc.unshare(0x00020000))  # CLONE_NEWNS: our own, private
check(libc.mount(None, b"/", None, 0x4000 | 0x40000, None))  # MS_REC | MS_PRIVATE
# A root that holds what the sandbox needs, and no /tmp/sbx-caller-probe; a
# mount point, as a container's is.  Made before the first sandbox: the
# mount table does not change after it.
new_root = os.path.join(base, "root")
os.makedirs(os.path.join(new_root, "tmp", "sbx-caller-probe"))
check(libc.mount(new_root.encode(), new_root.encode(), None, 0x1000, None))
here = os.path.dirname(os.path.dirname(sbxlimit.__file__))  # the package's tree
for d in ("usr", "bin", "lib", "lib64", "etc", "dev", "proc", "sys", sys.prefix, here):
    src, dst = "/" + d.strip("/"), os.path.join(new_root, d.strip("/"))
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
    elif os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
        check(libc.mount(src.encode(), dst.encode(), None, 0x1000 | 0x4000, None))
if how == "chroot-bind-of-root":
    # "/" itself bound (not its mounts): the same directory, another mount.
    # A tmpfs over the probe that only the caller's "/" has.
    check(libc.mount(b"tmpfs", b"/tmp/sbx-caller-probe", b"tmpfs", 0, None))
    open("/tmp/sbx-caller-probe/mounted", "w").close()
    new_root = os.path.join(base, "same")
    os.makedirs(new_root)
    check(libc.mount(b"/", new_root.encode(), None, 0x1000, None))
    for d in ("proc", "dev", "sys", sys.prefix, here):
        d = "/" + d.strip("/")
        target = new_root + d
        check(libc.mount(d.encode(), target.encode(), None, 0x1000 | 0x4000, None))
first = look()
if how == "unshare":
    check(libc.unshare(0x00020000))
    check(libc.mount(b"tmpfs", b"/tmp/sbx-caller-probe", b"tmpfs", 0, None))
    open("/tmp/sbx-caller-probe/mounted", "w").close()
elif how == "unshare-spawn-mount":  # a view made in the new namespace, then a mount
    check(libc.unshare(0x00020000))
    look()
    check(libc.mount(b"tmpfs", b"/tmp/sbx-caller-probe", b"tmpfs", 0, None))
    open("/tmp/sbx-caller-probe/mounted", "w").close()
elif how == "thread":  # a thread of its own namespace: its own mount table
    import threading
    got = []
    def own():
        check(libc.unshare(0x00020000 | 0x200))  # CLONE_NEWNS | CLONE_FS
        look()
        check(libc.mount(b"tmpfs", b"/tmp/sbx-caller-probe", b"tmpfs", 0, None))
        open("/tmp/sbx-caller-probe/mounted", "w").close()
        got.append(look())
    t = threading.Thread(target=own)
    t.start()
    t.join()
    print(first, got[0])
    sys.exit(0)
else:
    os.chroot(new_root)
    os.chdir("/")
    if how == "chroot-bind-of-root":
        # What the caller sees there now, in place of the fixed answer.
        print(first, look(), sorted(os.listdir("/tmp/sbx-caller-probe")))
        sys.exit(0)
print(first, look())
"""


@needs_view_ns
@pytest.mark.parametrize(
    "how", ["unshare", "unshare-spawn-mount", "thread", "chroot", "chroot-bind-of-root"]
)
def test_a_caller_that_left_the_view_s_namespace_or_root_is_not_given_it(tmp_path, how):
    probe = "/tmp/sbx-caller-probe"
    os.makedirs(probe, exist_ok=True)
    open(f"{probe}/outside", "w").close()
    try:
        r = subprocess.run(
            [PY, "-c", _CALLER, str(tmp_path), how],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        os.unlink(f"{probe}/outside")
        os.rmdir(probe)
    assert r.returncode == 0, r.stderr
    # Seen from inside the caller's new namespace or root: its own mount,
    # or an empty directory; never the view kept from before.
    if how == "chroot-bind-of-root":
        # First the tmpfs; then, chrooted, what the caller sees: the same.
        first, then, caller_sees = r.stdout.strip().split("] [")
        assert first == "['mounted'" and f"[{then}]" == f"[{caller_sees}", r.stdout
        return
    want = "[]" if how == "chroot" else "['mounted']"
    assert r.stdout.strip() == f"['outside'] {want}", r.stdout


_RE_POINTED = """
import ctypes, os, sys, threading
import sbxlimit
from sbxlimit import Policy
libc = ctypes.CDLL(None, use_errno=True)
def check(r):
    if r != 0:
        raise OSError(ctypes.get_errno(), "libc")
base = sys.argv[1]
os.makedirs(base + "/one")
os.symlink(base + "/one", base + "/root")
policy = Policy(writable_roots=[base + "/root"], protect_dotfiles=False)
def tries(tag):
    script = f"touch {base}/one/{tag} 2>/dev/null; echo $?"
    return sbxlimit.run(["sh", "-c", script], policy=policy, capture_output=True,
                        text=True).stdout.strip()
first = tries("first")
got = []
def own():  # within the second the first spawn's resolutions are kept for
    check(libc.unshare(0x00020000 | 0x200))  # CLONE_NEWNS | CLONE_FS
    check(libc.mount(None, b"/", None, 0x4000 | 0x40000, None))  # MS_REC | MS_PRIVATE
    check(libc.mount(b"tmpfs", base.encode(), b"tmpfs", 0, None))
    os.makedirs(base + "/one")
    os.makedirs(base + "/two")
    os.symlink(base + "/two", base + "/root")
    got.append(tries("then"))
t = threading.Thread(target=own)
t.start()
t.join()
print(first, got[0])
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts in a thread's own namespace need root")
@pytest.mark.parametrize("mechanism", ["landlock", "view"])
def test_a_writable_root_resolved_elsewhere_is_not_granted_here(tmp_path, mechanism):
    # Resolutions are kept per place (_place): a thread with a mount
    # namespace of its own, where the writable root's link leads elsewhere
    # and the first spawn's target is another directory, gets no right to
    # write that directory, even within the second they are kept for.
    if mechanism == "landlock" and ABI < 1:
        pytest.skip("no Landlock here")
    if mechanism == "view" and not (MNT is not None and MNT.ok):
        pytest.skip(MNT.reason if MNT is not None else "not Linux")
    env = dict(os.environ)
    if mechanism == "landlock":
        env["SBXLIMIT_NAMESPACES"] = "0"  # Landlock alone holds the files
    r = subprocess.run(
        [PY, "-c", _RE_POINTED, str(tmp_path / "base")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "1"], r.stdout


def test_what_a_child_adds_to_a_kept_view_follows_what_its_namespace_lacks():
    # What of a view is shared is worked out once per view (_Share); what
    # each child adds depends on the kept namespace it joins: one made
    # later may lack other entries (a path missing when it was made).
    ro, tmpfs = _core.VIEW_RO, _core.VIEW_TMPFS
    view = [(ro, b"/a", b""), (tmpfs, b"/tmp", b""), (ro, b"/b", b""), (ro, b"/c", b"")]
    share = _namespaces._share(view, None)
    assert share is _namespaces._share(view, None)
    assert share.entries == [view[0], view[2], view[3]]
    assert share.own(frozenset()) == [view[1]]
    assert share.own(frozenset({1})) == [view[1], view[2]]
    assert share.own(frozenset({0, 2})) == [view[0], view[1], view[3]]


@needs_view_ns
def test_kept_views_go_once_unused(tmp_path, monkeypatch):
    # A kept view holds a copy of every host mount: a filesystem the host
    # unmounts would stay busy for as long as the process lives.
    from sbxlimit import _viewns

    _home, policy = _sandbox_home(tmp_path, monkeypatch)
    monkeypatch.setattr(_viewns, "IDLE", 0.3)
    _in(policy, "true")
    assert _kept_views()

    def kept() -> list[int]:  # read while the supervisor thread lets them go
        with _viewns._lock:
            return [*_kept_views(), _viewns._mounts_fd, _viewns._watch_fd]

    deadline = time.monotonic() + 10
    while kept() != [-1, -1] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kept() == [-1, -1]


@needs_view_ns
def test_a_forked_child_does_not_keep_the_views_namespaces(tmp_path, monkeypatch):
    from sbxlimit import _viewns

    _home, policy = _sandbox_home(tmp_path, monkeypatch)
    _viewns.drop()
    _in(policy, "true")
    fds = [*_kept_views(), _viewns._watch_fd, _viewns._mounts_fd]
    assert len(fds) == 3 and min(fds) >= 0
    assert kept_in_a_fork(fds) == {}


@needs_view_ns
def test_a_kept_view_outlives_a_drop_while_a_spawn_uses_it(tmp_path, monkeypatch):
    from sbxlimit import _viewns

    _home, policy = _sandbox_home(tmp_path, monkeypatch)
    _viewns.drop()
    _in(policy, "true")
    ((key, kept),) = _viewns._kept.items()
    got = _viewns.take(key[0], key[1], -1, lambda: [])
    assert got is not None and got[0] == kept.fd
    ident = os.readlink(f"/proc/self/fd/{kept.fd}")
    _viewns.drop()
    assert os.readlink(f"/proc/self/fd/{kept.fd}") == ident  # not closed under a spawn
    _viewns.release(kept.fd)
    assert not os.path.exists(f"/proc/self/fd/{kept.fd}") or (
        os.readlink(f"/proc/self/fd/{kept.fd}") != ident
    )


@needs_tcp_rules
def test_deny_without_a_namespace_refuses_tcp_and_udp(listeners):
    r = in_python(
        f"""
        import sbxlimit, sys
        r = sbxlimit.run([sys.executable, "-c", {CONNECT!r}, "{listeners[0]}"],
                         policy=sbxlimit.Policy(network="deny"), capture_output=True, text=True)
        print(r.enforced["network"]); print(r.stdout, end="")
        """,
        SBXLIMIT_NAMESPACES="0",
    )
    assert r.returncode == 0, r.stderr
    mech, *out = r.stdout.splitlines()
    assert mech.startswith(f"landlock:abi{ABI} tcp+seccomp:socket (no network namespace")
    # No new IPv4 socket at all (seccomp), so neither TCP nor UDP.
    assert out == ["PermissionError 1", "udp PermissionError 1"]


@needs_tcp_rules
def test_proxy_reaches_only_its_ports(listeners):
    proxy, other = listeners
    policy = Policy(network="proxy", proxy_ports=[proxy], protect_dotfiles=False)
    out, enforced = connect([proxy, other], policy)
    # The other port: Landlock refuses the connect (EACCES); UDP: seccomp.
    assert out == ["connected", "PermissionError 13", "udp PermissionError 1"]
    assert enforced["network"].startswith(f"landlock:abi{ABI} tcp connect to {proxy}+seccomp")
    r = sbxlimit.run(["env"], policy=policy, capture_output=True, text=True)
    assert f"HTTP_PROXY=http://127.0.0.1:{proxy}" in r.stdout.splitlines()


def test_strict_refuses_a_network_rule_it_cannot_hold():
    # Namespaces off and (on this check) seccomp-only machines aside, deny is
    # held here; what strict must refuse is a request nothing can hold.
    r = in_python(
        """
        import sbxlimit
        try:
            sbxlimit.Popen(["true"], policy=sbxlimit.Policy(isolate_pids=True, strict=True))
        except sbxlimit.UnsupportedError as e:
            print("refused:", e)
        """,
        SBXLIMIT_NAMESPACES="0",
    )
    assert r.returncode == 0 and "refused:" in r.stdout, r.stderr
    assert "isolate_pids" in r.stdout and "SBXLIMIT_NAMESPACES=0" in r.stdout


def test_strict_refuses_the_tree_walk_where_nothing_holds_the_tree():
    # No cgroup and no namespace: a setsid() double fork would escape
    # kill_tree, which SPEC promises; strict says so before starting.
    r = in_python(
        """
        import sbxlimit
        lim = sbxlimit.Limits(wall_time=5)
        print(sbxlimit.run(["true"], limits=lim, cgroup_parent="none").enforced["kill_tree"])
        try:
            sbxlimit.Popen(["true"], limits=lim, cgroup_parent="none",
                           policy=sbxlimit.Policy(workdir="/", strict=True))
        except sbxlimit.UnsupportedError as e:
            print("refused:", e)
        """,
        SBXLIMIT_NAMESPACES="0",
    )
    assert r.returncode == 0, r.stderr
    walk, refused = r.stdout.splitlines()
    assert walk.startswith("tree walk") and "escapes" in walk
    assert refused.startswith("refused:") and "kill_tree" in refused, refused


def test_a_downgrade_warns_once_naming_the_reason():
    r = in_python(
        """
        import sbxlimit, warnings
        warnings.simplefilter("always")
        for _ in range(3):
            sbxlimit.run(["true"], policy=sbxlimit.Policy(isolate_pids=True))
        """,
        SBXLIMIT_NAMESPACES="0",
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("isolate_pids is not enforced here") == 1, r.stderr


# -- PID namespace ------------------------------------------------------------


@needs_pidns
def test_isolate_pids_the_program_is_pid_2_under_pid_1():
    code = "echo $$ $PPID; ls /proc | grep -c '^[0-9]'"
    r = sbxlimit.run(
        ["sh", "-c", code],
        policy=Policy(isolate_pids=True, protect_dotfiles=False),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    ids, procs = r.stdout.splitlines()
    assert ids == "2 1"
    # Its own /proc: PID 1, sh, ls, grep; none of the host's processes.
    assert int(procs) <= 5
    assert r.enforced["isolate_pids"].startswith("userns+pidns" if PIDNS.user else "pidns")


@needs_pidns
@pytest.mark.parametrize(
    ("script", "code"), [("exit 7", 7), ("kill -SEGV $$", -signal.SIGSEGV), ("true", 0)]
)
@pytest.mark.parametrize("pid1", ["exec", "fork"])
def test_isolate_pids_ends_as_the_program_did(script, code, pid1, monkeypatch):
    # PID 1 execs the reaper program (shares nothing with us after that), or
    # where it cannot, is a fork() of this process that reaps in place.
    if pid1 == "fork":
        monkeypatch.setattr(_namespaces, "REAPER", b"")
    elif not _namespaces.REAPER:
        pytest.skip("the reaper program was not built (setup.py builds sbxlimit/_pid1 on Linux)")
    r = sbxlimit.run(
        ["sh", "-c", f"{script}"],
        policy=Policy(isolate_pids=True, workdir="/"),
        stdout=subprocess.PIPE,
    )
    assert r.returncode == code


@needs_pidns
@needs_vforked_pid1
def test_pid_1_that_cannot_exec_the_reaper_fails_the_spawn_and_leaves_nothing(monkeypatch):
    monkeypatch.setattr(_namespaces, "REAPER", b"/nonexistent/_pid1")
    tag = tagged_sleep()
    with pytest.raises(sbxlimit.SandboxSetupError, match="ns:pid") as ei:
        sbxlimit.run(["sleep", tag], policy=Policy(isolate_pids=True, workdir="/"))
    assert isinstance(ei.value, FileNotFoundError)
    assert wait_no_sleepers([tag]) == []


@needs_pidns
@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "aarch64"), reason="a reaper without libc: x86-64, aarch64"
)
def test_the_reaper_starts_without_libc():
    # Its start-up runs while the target does, and a short target's exit
    # waits for it: glibc's asks the CPU its cache sizes with about a
    # hundred CPUID instructions, each trapped by a hypervisor.
    if not _namespaces.REAPER:
        pytest.skip("the reaper program was not built (setup.py builds sbxlimit/_pid1 on Linux)")
    with open(_namespaces.REAPER, "rb") as f:
        elf = f.read()
    assert b"GLIBC" not in elf and b"/ld-linux" not in elf
    assert len(elf) < 64 * 1024


@needs_vforked_pid1
def test_pid_1_is_the_reaper_program_not_a_copy_of_the_caller():
    if not _namespaces.REAPER:
        pytest.skip("the reaper program was not built (setup.py builds sbxlimit/_pid1 on Linux)")
    with sbxlimit.Popen(["sleep", "30"], policy=Policy(isolate_pids=True, workdir="/")) as p:
        deadline = time.monotonic() + 5
        while os.readlink(f"/proc/{p.pid}/exe") != os.fsdecode(_namespaces.REAPER):
            assert time.monotonic() < deadline, os.readlink(f"/proc/{p.pid}/exe")
            time.sleep(0.01)
        p.kill_tree(grace=0)


@needs_pidns
def test_isolate_pids_signals_reach_the_program():
    trap = "trap 'echo got-term; exit 3' TERM; echo ready; while :; do sleep 0.05; done"
    with sbxlimit.Popen(
        ["sh", "-c", trap],
        policy=Policy(isolate_pids=True, workdir="/"),
        stdout=subprocess.PIPE,
        text=True,
    ) as p:
        assert p.stdout.readline() == "ready\n"
        p.terminate()  # to the outer child; PID 1 passes it on
        assert p.stdout.readline() == "got-term\n"
        assert p.wait(timeout=10) == 3


@needs_pidns
@pytest.mark.parametrize("how", ["session", "group"])
def test_under_pid_1_the_program_leads_its_own_session_or_group(how):
    # Inside, the program leads what the caller asked for, as it would
    # without the namespace; outside, Popen.pid (PID 1) does, so that
    # os.killpg(os.getpgid(p.pid), sig) reaches the sandbox, never the caller.
    kw = {"start_new_session": True} if how == "session" else {"process_group": 0}
    code = "import os; print(os.getpid(), os.getpgid(0), os.getsid(0), flush=True); input()"
    with sbxlimit.Popen(
        [PY, "-c", code],
        policy=Policy(isolate_pids=True, workdir="/", terminal=True),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        **kw,
    ) as p:
        pid, pgid, sid = map(int, p.stdout.readline().split())
        assert (pid, pgid) == (2, 2)
        assert os.getpgid(p.pid) == p.pid != os.getpgid(0)
        if how == "session":
            assert sid == 2 and os.getsid(p.pid) == p.pid
        p.communicate("\n")
    assert p.returncode == 0


@needs_pidns
def test_a_group_outside_the_namespace_cannot_be_joined():
    # setpgid() in PID 1 resolves the group in the new namespace, where the
    # caller's group does not exist: refused before start, or (by default)
    # no namespace and the tree walk, which says why.
    group = os.getpgid(0)
    pol = Policy(isolate_pids=True, workdir="/", terminal=True)
    with pytest.raises(sbxlimit.ConfigError, match="process_group"):
        sbxlimit.Popen(["true"], policy=pol, process_group=group)
    r = sbxlimit.run(
        ["true"], limits=Limits(wall_time=5), process_group=group, cgroup_parent="none"
    )
    assert r.returncode == 0
    assert f"process_group={group}" in r.enforced["kill_tree"], r.enforced


def _running(marker: str) -> bool:
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:2] == [b"sleep", marker.encode()]:
                    return True
        except OSError:
            continue
    return False


# setsid(1) calls setsid() before it execs sleep: once `sleep <marker>`
# exists, it has left the session and the process group.
ESCAPE = (
    "setsid sleep {marker} > /dev/null 2>&1 < /dev/null & "
    "for i in $(seq 1000); do pgrep -fx 'sleep {marker}' > /dev/null && break; sleep 0.01; done"
)


@needs_pidns
@pytest.mark.parametrize("isolate", [True, False])
def test_isolate_pids_kills_what_escaped_the_session(isolate):
    # setsid + a background job: out of the process group.  Without a cgroup
    # (turned off here) only the PID namespace catches it.
    marker = f"{time.time() % 1000 + 1000:.3f}"
    r = sbxlimit.run(
        ["sh", "-c", ESCAPE.format(marker=marker)],
        policy=Policy(isolate_pids=isolate, workdir="/"),
        cgroup_parent="none",
    )
    assert r.returncode == 0
    # Give the escapee time to exec (the control) or to be reaped (isolated).
    deadline = time.monotonic() + 5
    while _running(marker) is isolate and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        # The control: without a namespace it really did escape.
        assert _running(marker) is not isolate
    finally:
        subprocess.run(["pkill", "-f", f"^sleep {marker}$"], check=False)


# -- hardening -------------------------------------------------------------

PTRACE = textwrap.dedent(
    """
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    r = libc.ptrace(16, int(sys.argv[1]), 0, 0)  # PTRACE_ATTACH
    print("attached" if r == 0 else os.strerror(ctypes.get_errno()))
    """
)


@pytest.mark.skipif(not FILTER, reason="no seccomp filter here (see doctor: seccomp)")
def test_ptrace_of_a_sibling_sandbox_is_refused():
    with sbxlimit.Popen(["sleep", "30"], policy=POLICY) as sibling:
        r = sbxlimit.run(
            [PY, "-c", PTRACE, str(sibling.pid)], policy=POLICY, capture_output=True, text=True
        )
        assert r.stdout.strip() == "Operation not permitted", r.stderr
        sibling.kill_tree(grace=0)


def test_the_sandbox_sets_tmpdir_and_proxies_once_over_the_callers(monkeypatch):
    # The caller's environment is filtered as bytes; what the sandbox sets
    # replaces the caller's value, never sits beside it.
    import warnings

    monkeypatch.setenv("TMPDIR", "/elsewhere")
    monkeypatch.setenv("HTTP_PROXY", "http://caller:1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # proxy without Landlock TCP rules
        r = sbxlimit.run(
            ["env"], policy=Policy(network="proxy", proxy_ports=[3128]), capture_output=True
        )
    lines = r.stdout.splitlines()
    tmp = [line for line in lines if line.startswith(b"TMPDIR=")]
    proxy = [line for line in lines if line.startswith(b"HTTP_PROXY=")]
    assert len(tmp) == 1 and tmp[0] != b"TMPDIR=/elsewhere", lines
    assert proxy == [b"HTTP_PROXY=http://127.0.0.1:3128"], lines


def test_ld_variables_never_reach_the_child(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/nonexistent/evil.so")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/nonexistent")
    monkeypatch.setenv("SBX_PLAIN", "kept")
    r = sbxlimit.run(["env"], policy=POLICY, capture_output=True, text=True)
    names = {line.split("=", 1)[0] for line in r.stdout.splitlines()}
    assert "SBX_PLAIN" in names and not {n for n in names if n.startswith("LD_")}
    # An explicit env= is sanitised too.
    r = sbxlimit.run(
        ["env"],
        policy=POLICY,
        env={"PATH": os.environ["PATH"], "LD_PRELOAD": "/evil.so"},
        capture_output=True,
        text=True,
    )
    assert "LD_PRELOAD" not in r.stdout


def test_drop_secrets(monkeypatch):
    secrets = {"OPENAI_API_KEY": "a", "GITHUB_TOKEN": "b", "PGPASSWORD": "c", "aws_secret": "d"}
    for k, v in secrets.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SBX_PLAIN", "kept")
    for drop in (False, True):
        policy = Policy(protect_dotfiles=False, drop_secrets=drop)
        r = sbxlimit.run(["env"], policy=policy, capture_output=True, text=True)
        names = {line.split("=", 1)[0] for line in r.stdout.splitlines()}
        assert "SBX_PLAIN" in names
        assert bool(names & secrets.keys()) is not drop, names & secrets.keys()
        assert ("KEY, SECRET, TOKEN" in r.enforced["env"]) is drop


# -- the size-capped workspace ----------------------------------------------

WRITE = textwrap.dedent(
    """
    import os
    open("small.txt", "w").write("kept")
    try:
        with open("big", "wb") as f:
            f.write(b"x" * (3 << 20))
    except OSError as e:
        print(e.strerror)
    print(os.getcwd() == os.environ["TMPDIR"].rsplit("/", 1)[0])
    """
)


def _mounted(path: str) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


@needs_mntns
def test_disk_tmpfs_enospc_and_outputs_readable_until_close():
    # The supervisor's own fds (epoll, wake-up pipe) are made once, at first use.
    sbxlimit.run(["true"], limits=Limits(disk="1Mi"), capture_output=True)
    fds = settled_fds()
    with sbxlimit.Popen(
        [PY, "-c", WRITE],
        limits=Limits(disk="1Mi", tolerate="disk"),  # ENOSPC exactly at the limit
        policy=Policy(),
        stdout=subprocess.PIPE,
    ) as p:
        out = p.stdout.read().decode().split("\n")
        p.wait()
        assert out[:2] == ["No space left on device", "True"]
        ws = p.workspace
        assert ws is not None and ws.startswith(f"/proc/{os.getpid()}/fd/")
        with open(os.path.join(ws, "small.txt")) as f:
            assert f.read() == "kept"  # after the exit, the namespace gone
        assert p.termination.reason == "disk" or "disk" in p.termination.hits
        assert p.usage().disk == 1 << 20
        host_dir = p._sbx.workspace
        assert not _mounted(host_dir)  # nothing mounted in the caller's namespace
        assert os.listdir(host_dir) == ["tmp"]  # made before the start, never written
    # After close: the directory's path (the fd's is gone), removed.
    assert p.workspace == host_dir and p.workspace_removed and not os.path.exists(host_dir)
    p.stdout.close()
    # The supervisor drops its pidfd on its next turn.
    left = {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in settled_fds(5) - fds}
    assert not left  # the tmpfs's fd too


@needs_mntns
def test_disk_tmpfs_keep_workdir_copies_it_out():
    pol = Policy(keep_workdir=True, protect_dotfiles=False)
    with sbxlimit.Popen(
        ["sh", "-c", "mkdir -p d && echo x > d/f"], limits={"disk": "1Mi"}, policy=pol
    ) as p:
        p.wait()
        host_dir = p._sbx.workspace
    try:
        with open(os.path.join(host_dir, "d", "f")) as f:
            assert f.read() == "x\n"
    finally:
        import shutil

        shutil.rmtree(host_dir)


@needs_mntns
def test_disk_tmpfs_keep_workdir_copies_no_more_than_the_tmpfs_held():
    # The copy is the caller's (root's, often) on the host's disk: a sparse
    # file stays sparse, a file of many names stays one file, and nothing
    # past what the tmpfs used is written (a 16 MiB sandbox made root write
    # 504 MiB this way: an attack review, 2026-11-28).
    host_dir = kept_in_16_mib(
        "import os\n"
        "with open('sparse', 'wb') as f: f.truncate(300 << 20)\n"
        "with open('real', 'wb') as f: f.write(b'y' * (4 << 20))\n"
        "for i in range(50): os.link('real', f'link{i}')\n"
    )
    try:
        used = _fstree.tree_size(host_dir)  # (hard links once)
        assert used <= 5 << 20, used  # 4 MiB of data, once
        sparse, real = os.stat(f"{host_dir}/sparse"), os.stat(f"{host_dir}/real")
        assert sparse.st_size == 300 << 20 and real.st_nlink == 51
        with open(f"{host_dir}/link7", "rb") as f:
            assert f.read() == b"y" * (4 << 20)
    finally:
        _fstree.remove_tree(host_dir)


@needs_mntns
def test_disk_tmpfs_keep_workdir_copies_a_deep_tree():
    # shutil.copytree recursed: a chain of 700 directories raised
    # RecursionError out of run(), the result lost.
    host_dir = kept_in_16_mib(
        "import os\n"
        "for _ in range(700): os.mkdir('d'); os.chdir('d')\n"
        "open('bottom', 'w').write('here')\n"
    )
    try:
        with open(os.path.join(host_dir, *["d"] * 700, "bottom")) as f:
            assert f.read() == "here"
    finally:
        _fstree.remove_tree(host_dir)


def kept_in_16_mib(code: str) -> str:
    """Run `code` in a 16 MiB tmpfs workspace kept at close: its copy."""
    pol = Policy(keep_workdir=True, protect_dotfiles=False)
    r = sbxlimit.run([PY, "-c", code], limits={"disk": "16Mi"}, policy=pol, capture_output=True)
    assert r.returncode == 0, r.stderr
    return r.workspace


@needs_mntns
def test_disk_tmpfs_bounds_its_entries_too():
    # Empty files take no page of the tmpfs: without nr_inodes a program made
    # as many as memory allowed, each an inode of the host's once kept.
    prog = (
        "n = 0\n"
        "try:\n"
        "    for i in range(20000):\n"
        "        open(f'f{i}', 'w').close(); n += 1\n"
        "except OSError as e:\n"
        "    print(n, e.errno)\n"
        "else:\n"
        "    print(n)\n"
    )
    r = sbxlimit.run([PY, "-c", prog], limits={"disk": "1Mi"}, capture_output=True, text=True)
    made, *err = r.stdout.split()
    # 2 MiB of tmpfs (1 MiB and its slack): 512 pages' worth, and 4096 more.
    assert err == [str(errno.ENOSPC)] and 4000 < int(made) <= 512 + 4096, r.stdout


@needs_mntns
def test_disk_tmpfs_is_owned_by_the_program():
    r = sbxlimit.run(
        ["sh", "-c", "stat -c '%u %a' .; touch tmp/t && echo ok"],
        limits={"disk": "1Mi"},
        capture_output=True,
        text=True,
    )
    assert r.stdout.split("\n")[:2] == [f"{os.geteuid()} 700", "ok"], r.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root makes namespaces without a user namespace")
@needs_netns
def test_unprivileged_user_namespace_keeps_the_users_ids():
    r = sbxlimit.run(
        ["sh", "-c", "id -u; id -g; cat /proc/self/uid_map"],
        policy=Policy(network="deny", workdir="/"),
        capture_output=True,
        text=True,
    )
    uid, gid, uid_map = r.stdout.splitlines()
    assert (int(uid), int(gid)) == (os.geteuid(), os.getegid())
    assert uid_map.split() == [str(os.geteuid()), str(os.geteuid()), "1"]
    assert r.enforced["network"].startswith("userns+netns")


@needs_mntns
def test_disk_tmpfs_keep_workdir_copies_what_it_can():
    # A named pipe cannot be copied (and must not hang close() either).
    pol = Policy(keep_workdir=True, protect_dotfiles=False)
    p = sbxlimit.Popen(["sh", "-c", "echo a > ok; mkfifo pipe"], limits={"disk": "1Mi"}, policy=pol)
    p.wait()
    host_dir = p._sbx.workspace
    try:
        with pytest.warns(RuntimeWarning, match="could not be copied.*pipe"):
            p.close()
        with open(os.path.join(host_dir, "ok")) as f:
            assert f.read() == "a\n"
    finally:
        import shutil

        shutil.rmtree(host_dir)


@needs_mntns
def test_a_failed_namespace_spawn_leaks_nothing():
    from sbxlimit._testing import fail_child_at

    sbxlimit.run(["true"], limits=Limits(disk="1Mi"), capture_output=True)  # the supervisor's fds
    fds = settled_fds()
    tmp = settled_temp(os.environ.get("TMPDIR", "/tmp"))
    for step in ("ns:mount", "exec"):
        with fail_child_at(step), pytest.raises(OSError):
            sbxlimit.Popen(["true"], limits=Limits(disk="1Mi"), stdout=subprocess.PIPE)
    assert settled_fds() == fds
    assert settled_temp(os.environ.get("TMPDIR", "/tmp")) == tmp


@needs_pidns
def test_a_caller_that_ignores_sigchld():
    # The probe's own children must not reap themselves, and the program
    # keeps the ignored SIGCHLD execve would have kept.
    r = in_python(
        """
        import signal, sbxlimit
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        for iso in (False, True):
            pol = sbxlimit.Policy(isolate_pids=iso, workdir="/", strict=True)
            r = sbxlimit.run(["grep", "^SigIgn", "/proc/self/status"], policy=pol,
                             capture_output=True, text=True)
            print(int(r.stdout.split()[1], 16) >> (signal.SIGCHLD - 1) & 1)
        print(f"{os.getpid():x}")
        """.replace("import signal", "import os, signal")
    )
    *ignored, owner = r.stdout.split()
    assert ignored == ["1", "1"], r.stderr
    # wait4 finds nothing to reap there (ECHILD): the sandboxes' cgroups
    # must go all the same.
    left = glob.glob(f"/sys/fs/cgroup/**/sbx-{owner}-*", recursive=True)
    assert not left


@needs_mntns
@pytest.mark.parametrize("made_by", ["clone3", "fork"])
def test_the_mount_namespace_is_held_until_the_reap_then_let_go(tmp_path, monkeypatch, made_by):
    # Held, its teardown leaves the caller's wait (the last process of a
    # namespace would tear it down before its parent learns of the exit);
    # let go at the reap, by a thread of its own.  A child made by clone3
    # comes with a pidfd, through which the core asks the kernel for the
    # namespace (no lookup of /proc/<pid>); a forked one (preexec_fn) is
    # looked up there.
    looked_up = []
    real_open = os.open

    def spy(path, *a, **k):
        if str(path).endswith("/ns/mnt"):
            looked_up.append(path)
        return real_open(path, *a, **k)

    monkeypatch.setattr(os, "open", spy)
    extra = {"preexec_fn": lambda: None} if made_by == "fork" else {}
    with sbxlimit.Popen(["sleep", "5"], policy=Policy(workdir=str(tmp_path)), **extra) as p:
        monkeypatch.setattr(os, "open", real_open)
        fd = p._sbx.mnt_hold
        assert fd >= 0
        held = os.readlink(f"/proc/self/fd/{fd}")
        assert held == os.readlink(f"/proc/{p.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
        assert os.get_inheritable(fd) is False
        if made_by == "fork":
            assert looked_up == [f"/proc/{p.pid}/ns/mnt"]
        elif p._sbx.how & _core.HOW_CLONE3:
            assert looked_up == []
        assert kept_in_a_fork([fd]) == {}  # a fork would keep it as long as it lives
        p.kill()
    assert p._sbx.mnt_hold == -1
    assert _namespaces.flush_mounts(5)
    try:
        now = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        now = None
    assert now != held


@needs_mntns
def test_with_a_workspace_the_namespace_goes_right_before_the_workspace():
    # Let go of by the supervisor right before it removes the workspace,
    # which is then mounted nowhere.
    from sbxlimit._monitor import get_monitor

    with sbxlimit.Popen(["sleep", "0.3"], policy=Policy()) as p:
        p.wait()
        fd = p._sbx.mnt_hold
        assert fd >= 0  # reaped, the workspace not yet removed
        held = os.readlink(f"/proc/self/fd/{fd}")
        ws = p.workspace
    assert p._sbx.mnt_hold == -1
    assert get_monitor().drain(5)
    assert not os.path.lexists(ws)
    try:
        now = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        now = None
    assert now != held


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"writable_roots": ["/var/tmp"]},
        {"writable_roots": ["/tmp", "/var/tmp"], "deny_write": ["/var/tmp"]},
        {"writable_roots": ["/dev/shm"]},
        {"writable_roots": ["/"]},
        {"writable_roots": ["/tmp"], "deep": True},  # a root below the workspaces' depth
    ],
)
def test_a_fresh_workspace_s_view_is_the_one_built_from_scratch(tmp_path, extra):
    # What every fresh workspace shares is reused (_fresh_view); the view
    # must still be, entry for entry and in order, the one _view builds.
    extra = dict(extra)
    if extra.pop("deep", False):
        (tmp_path / "a/b/c").mkdir(parents=True)
        extra["writable_roots"] = [*extra["writable_roots"], str(tmp_path / "a/b/c")]
    policy = Policy(**extra)
    protected = ("/root/.bashrc", str(tmp_path / "repo/.git/config"))
    for n in range(3):  # the first builds what is kept, the rest reuse it
        ws = tmp_path / f"ws{n}"
        ws.mkdir()
        got = _namespaces.view(policy, str(ws), 1 << 20, protected, fresh=True)
        _out, ro_root, own_dev, _rw, _held = _namespaces._view(policy, str(ws), 1 << 20, protected)
        # view() without fresh builds the whole view for this path.
        assert got == _namespaces.view(policy, str(ws), 1 << 20, protected)
        assert got[1:] == (ro_root, own_dev)
        assert (_core.VIEW_RW, os.fsencode(os.path.realpath(ws)), b"") in got[0]
