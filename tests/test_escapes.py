"""Attacks on the sandbox (SPEC 3, security model).

Each test is a real program that tries to get out of a ``Policy`` sandbox
the way an attacker would, and each checks two things: the attempt fails,
*and* the target outside is untouched (the listener accepted nothing, the
victim runs with its limits, the file is byte- and mode-identical, the
terminal's input is empty).  They run as root (the common case for agent
frameworks in containers) and as the unprivileged CI user; a test that
needs what this machine lacks skips with doctor's reason.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest

import sbxlimit
from sbxlimit import Limits, Policy
from sbxlimit._forked import ForkedSandbox
from sbxlimit._namespaces import CLONE_NEWNET, CLONE_NEWNS, namespaces
from sbxlimit._seccomp import seccomp_works

from .conftest import alive, privileges, wait_gone, why_not

LINUX = sys.platform.startswith("linux")
pytestmark = pytest.mark.skipif(not LINUX, reason="these attacks use Linux's interfaces")

PY = sys.executable
ROOT = LINUX and os.geteuid() == 0
ABI = sbxlimit._core.landlock_abi() if LINUX else -1
FILTER = LINUX and sbxlimit._core.HAS_SECCOMP and seccomp_works()
MNT = namespaces(CLONE_NEWNS) if LINUX else None
NET = namespaces(CLONE_NEWNET) if LINUX else None
POLICY = Policy(protect_dotfiles=False)
# "/" writable: the whole host, but not the kernel's filesystems nor /dev.
WHOLE_HOST = Policy(protect_dotfiles=False, workdir="/")

needs_root = pytest.mark.skipif(not ROOT, reason=f"the attack needs root ({privileges()})")
needs_filter = pytest.mark.skipif(not FILTER, reason=why_not("seccomp") if LINUX else "")
needs_netns = pytest.mark.skipif(
    not (NET and NET.ok), reason=f"doctor: network_namespace unavailable: {NET and NET.reason}"
)
needs_ro_view = pytest.mark.skipif(
    not (MNT and MNT.ok), reason=f"doctor: mount_namespace unavailable: {MNT and MNT.reason}"
)

# The attacks' programs print one JSON object: what each attempt returned
# ("ok", or the errno it failed with).
PRELUDE = textwrap.dedent(
    """
    import ctypes, errno, fcntl, json, os, signal, socket, stat, sys
    libc = ctypes.CDLL(None, use_errno=True)
    out = {}
    def attempt(name, fn, *args):
        try:
            r = fn(*args)
        except OSError as e:
            out[name] = errno.errorcode.get(e.errno, e.errno)
            return None
        out[name] = "ok"
        return r
    def sys_(name, nr, *args):
        r = libc.syscall(nr, *args)
        out[name] = "ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]
        return r
    """
)
NR = {
    "x86_64": {"setns": 308, "unshare": 272, "clone": 56, "clone3": 435, "pidfd_open": 434},
    "aarch64": {"setns": 268, "unshare": 97, "clone": 220, "clone3": 435, "pidfd_open": 434},
}.get(os.uname().machine if LINUX else "", {})


def attack_run(
    code: str, *argv: str, policy: Policy = POLICY, **kw: object
) -> tuple[dict[str, object], sbxlimit.SandboxResult]:
    """Run `code` (after PRELUDE; it ends by printing ``out``) in a sandbox;
    return what it printed, and the run."""
    kw.setdefault("stdout", subprocess.PIPE)
    r = sbxlimit.run(
        [PY, "-c", PRELUDE + textwrap.dedent(code) + "\nprint(json.dumps(out))", *argv],
        policy=policy,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )
    assert r.returncode == 0, (r.returncode, r.stderr)
    return (json.loads(r.stdout.splitlines()[-1]) if r.stdout else {}), r


def attack(code: str, *argv: str, policy: Policy = POLICY, **kw: object) -> dict[str, object]:
    return attack_run(code, *argv, policy=policy, **kw)[0]


def caller(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter that plays the sandbox's caller (for
    attacks on the caller itself)."""
    return subprocess.run(
        [PY, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# -- 1. namespaces ------------------------------------------------------------

SETNS = f"""
nr = {NR!r}
# The network namespace of the socket on fd 1 (made by the caller, outside).
fd = attempt("SIOCGSKNS", fcntl.ioctl, 1, 0x894C)
if fd is not None:
    sys_("setns skns", nr["setns"], fd, 0x40000000)
fd = attempt("open /proc/1/ns/net", os.open, "/proc/1/ns/net", os.O_RDONLY)
if fd is not None:
    sys_("setns pid1", nr["setns"], fd, 0x40000000)
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3).close()
    out["connect"] = "ok"
except OSError as e:
    out["connect"] = errno.errorcode.get(e.errno, str(e))
"""


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    s.settimeout(0.5)
    yield s
    s.close()


def nothing_accepted(s: socket.socket) -> bool:
    try:
        s.accept()[0].close()
    except TimeoutError:
        return True
    return False


@needs_netns
def test_the_network_namespace_cannot_be_left(listener):
    port = str(listener.getsockname()[1])
    here, there = socket.socketpair()  # made in the caller's namespace
    with here, there:
        attack(SETNS, port, policy=Policy(network="deny", protect_dotfiles=False), stdout=there)
        there.close()
        got = json.loads(here.makefile().read().splitlines()[-1])
    assert got["connect"] != "ok", got
    assert got.get("setns skns", "EPERM") == "EPERM" and got.get("setns pid1", "EPERM") == "EPERM"
    assert nothing_accepted(listener)


NEW_NS = f"""
nr = {NR!r}
sys_("unshare user+net", nr["unshare"], 0x10000000 | 0x40000000)
sys_("unshare mount", nr["unshare"], 0x20000)
sys_("unshare files", nr["unshare"], 0x400)  # CLONE_FILES: not a namespace
# clone() with a namespace flag; the child (if any) leaves at once.
r = sys_("clone newuser", nr["clone"], 0x10000000 | signal.SIGCHLD, 0, 0, 0, 0)
if r == 0:
    os._exit(0)
if r > 0:
    os.waitpid(r, 0)
# clone3: its flags are in memory, out of seccomp's sight: it must go.
args = (ctypes.c_uint64 * 11)(0x10000000, 0, 0, 0, signal.SIGCHLD, 0, 0, 0, 0, 0, 0)
r = sys_("clone3", nr["clone3"], ctypes.byref(args), ctypes.sizeof(args))
if r == 0:
    os._exit(0)
if r > 0:
    os.waitpid(r, 0)
# Ordinary forks and threads still work (glibc falls back from clone3).
import threading
t = threading.Thread(target=lambda: None); t.start(); t.join()
pid = os.fork()
if pid == 0:
    os._exit(0)
out["fork"] = "ok" if os.waitpid(pid, 0)[1] == 0 else "failed"
"""


@needs_filter
def test_no_namespace_can_be_made():
    got = attack(NEW_NS)
    assert got == {
        "unshare user+net": "EPERM",
        "unshare mount": "EPERM",
        "unshare files": "ok",
        "clone newuser": "EPERM",
        "clone3": "ENOSYS",
        "fork": "ok",
    }


# -- 2. devices and files outside the writable roots ------------------------------


@pytest.fixture
def loop_file() -> Iterator[tuple[str, int]]:
    """A file behind a loop device: (its path, the device's minor)."""
    if not ROOT or shutil.which("losetup") is None:
        pytest.skip(f"a loop device needs root and losetup ({privileges()})")
    d = tempfile.mkdtemp(prefix="escape-loop-")
    path = os.path.join(d, "backing")
    with open(path, "wb") as f:
        f.write(b"\0" * (1 << 20))
    r = subprocess.run(["losetup", "--find", "--show", path], capture_output=True, text=True)
    if r.returncode != 0:
        shutil.rmtree(d)
        pytest.skip(f"no loop device here: {r.stderr.strip()}")
    dev = r.stdout.strip()
    try:
        yield path, os.minor(os.stat(dev).st_rdev)
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)
        shutil.rmtree(d)


def test_no_device_node_can_be_made_and_used(loop_file):
    path, minor = loop_file
    with open(path, "rb") as f:
        before = f.read()
    got = attack(
        f"""
        attempt("mknod blk", os.mknod, "blk", stat.S_IFBLK | 0o600, os.makedev(7, {minor}))
        attempt("mknod chr", os.mknod, "chr", stat.S_IFCHR | 0o600, os.makedev(1, 3))
        attempt("mknod fifo", os.mknod, "fifo", stat.S_IFIFO | 0o600)
        if out["mknod blk"] == "ok":
            fd = os.open("blk", os.O_WRONLY)
            os.write(fd, b"PWNED" * 100)
            os.fsync(fd)
            os.close(fd)
        """
    )
    assert got["mknod blk"] != "ok" and got["mknod chr"] != "ok", got
    assert got["mknod fifo"] == "ok"  # FIFOs are not devices
    with open(path, "rb") as f:
        assert f.read() == before


def snapshot(path: str) -> tuple[object, ...]:
    st = os.lstat(path)
    with open(path, "rb") as f:
        data = f.read()
    xattrs = {n: os.getxattr(path, n) for n in os.listxattr(path)}
    return (data, st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, xattrs)


@pytest.fixture
def victim_file() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="escape-victim-")
    path = os.path.join(d, "victim")
    with open(path, "w") as f:
        f.write("precious\n")
    os.chmod(path, 0o644)
    os.utime(path, ns=(10**18, 10**18))
    yield path
    shutil.rmtree(d)


METADATA = """
path = sys.argv[1]
attempt("chmod", os.chmod, path, 0o777)
attempt("chown", os.chown, path, 12345 if os.geteuid() == 0 else os.geteuid(), -1)
attempt("utime", os.utime, path, (0, 0))
attempt("setxattr", os.setxattr, path, "user.pwned", b"1")
attempt("write", lambda: open(path, "a").write("pwned"))
attempt("truncate", os.truncate, path, 0)
attempt("rename", os.rename, path, path + ".moved")
attempt("link", os.link, path, path + ".linked")
attempt("mkfifo", os.mkfifo, path + ".fifo")
attempt("symlink", os.symlink, "/etc/passwd", path + ".sym")
attempt("unlink", os.unlink, path)
"""


@needs_ro_view
def test_files_outside_the_writable_roots_keep_contents_mode_owner_and_times(victim_file):
    before = snapshot(victim_file)
    got, r = attack_run(METADATA, victim_file)
    assert "ok" not in got.values(), got
    assert snapshot(victim_file) == before
    assert sorted(os.listdir(os.path.dirname(victim_file))) == ["victim"]
    assert r.enforced["files"].startswith(("mountns:ro-view", "userns+mountns:ro-view"))


OWN_DEV = {
    *("fd", "stdin", "stdout", "stderr", "ptmx", "pts", "shm"),
    *("null", "zero", "full", "random", "urandom", "tty"),
}


@needs_ro_view
@pytest.mark.parametrize("policy", [POLICY, WHOLE_HOST], ids=["workspace", "workdir=/"])
# No view is copied without the /dev template: three ways, not four.
@pytest.mark.parametrize(
    ("built", "view_made"),
    [("once", "copied"), ("once", "built"), ("in-the-child", "built")],
    indirect=["view_made"],
)
def test_the_hosts_device_nodes_are_not_there(policy, built, view_made, monkeypatch):
    from sbxlimit import _devtree

    if built == "in-the-child":  # as where the template cannot be made (_devtree)
        monkeypatch.setattr(_devtree, "take", lambda: -1)
    host = set(os.listdir("/dev")) - OWN_DEV  # disks, loop devices, kmsg, kvm ...
    got = attack(
        policy=policy,
        code=f"""
        out["dev"] = sorted(os.listdir("/dev"))
        for name in {sorted(host)!r}:
            path = "/dev/" + name
            attempt("open " + name, lambda: open(path, "rb").close())
        attempt("make", lambda: open("/dev/new", "w"))
        with open("/dev/null", "w") as f:
            f.write("fine")
        out["urandom"] = len(open("/dev/urandom", "rb").read(8))
        # Its own: shared memory, and terminals (a devpts instance).
        open("/dev/shm/mine", "w").write("x")
        out["pty"] = os.ttyname(os.openpty()[1])
        """,
    )
    assert set(got.pop("dev")) == OWN_DEV  # type: ignore[arg-type]
    assert got.pop("urandom") == 8
    assert got.pop("pty") == "/dev/pts/0"
    assert "ok" not in got.values(), got


def test_another_terminal_of_the_user_cannot_be_read():
    # A terminal of the caller's: what the user types there is for it alone.
    master, slave = os.openpty()
    try:
        os.write(master, b"my password\n")
        got = attack(
            f"""
            fd = attempt("open", os.open, {os.ttyname(slave)!r}, os.O_RDWR | os.O_NONBLOCK)
            if fd is not None:
                attempt("read", os.read, fd, 100)
            """
        )
        assert got["open"] != "ok" or got.get("read") != "ok", got
        os.set_blocking(slave, False)
        assert os.read(slave, 100) == b"my password\n"  # still there, unread
    finally:
        os.close(master)
        os.close(slave)


def test_other_processes_roots_lead_nowhere(victim_file):
    before = snapshot(victim_file)
    got = attack(
        f"""
        for who in (os.getppid(), 1):
            path = "/proc/%d/root{victim_file}" % who
            attempt("write via %d" % (who == 1), lambda: open(path, "a").write("pwned"))
            attempt("environ %d" % (who == 1), lambda: open("/proc/%d/environ" % who).read())
        """
    )
    assert "ok" not in got.values(), got
    assert snapshot(victim_file) == before


@pytest.mark.skipif(not LINUX or not MNT.ok, reason=why_not("mount_namespace") if LINUX else "")
def test_the_hosts_system_v_ipc_is_out_of_reach():
    # The caller's shared memory segment and message queue, by key and by
    # id: the sandbox's own IPC namespace has neither.
    libc = ctypes.CDLL(None, use_errno=True)
    key = 0x5B0000 + os.getpid() % 0xFFFF
    shm = libc.shmget(key, 4096, 0o1600)  # IPC_CREAT | 0600
    msq = libc.msgget(key, 0o1600)
    assert shm >= 0 and msq >= 0, ctypes.get_errno()
    try:
        got = attack(
            f"""
            for name, call in (
                ("shmget", lambda: libc.shmget({key}, 0, 0)),
                ("shmat", lambda: libc.shmat({shm}, None, 0)),
                ("msgget", lambda: libc.msgget({key}, 0)),
                ("msgctl IPC_RMID", lambda: libc.msgctl({msq}, 0, None)),
            ):
                out[name] = "ok" if call() != -1 else errno.errorcode[ctypes.get_errno()]
            """
        )
        assert got == {
            "shmget": "ENOENT",
            "shmat": "EINVAL",
            "msgget": "ENOENT",
            "msgctl IPC_RMID": "EINVAL",
        }, got
        assert libc.msgget(key, 0) == msq  # still there
    finally:
        libc.shmctl(shm, 0, None)  # IPC_RMID
        libc.msgctl(msq, 0, None)


def test_shared_memory_and_semaphores_work_inside():
    got = attack(
        """
        import multiprocessing, multiprocessing.shared_memory
        attempt("lock", multiprocessing.Lock)
        shm = attempt(
            "shm", lambda: multiprocessing.shared_memory.SharedMemory(create=True, size=4096)
        )
        if shm is not None:
            shm.close(); shm.unlink()
        """
    )
    assert got == {"lock": "ok", "shm": "ok"}


KERNEL_KNOBS = """
# Opening for writing is enough to show the way is open; nothing is written.
paths = ["/proc/sys/kernel/core_pattern", "/proc/sysrq-trigger", "/proc/sys/vm/drop_caches",
         "/sys/kernel/mm/transparent_hugepage/enabled", "/proc/1/oom_score_adj"]
for line in open("/proc/self/cgroup"):
    hier, _, rel = line.strip().split(":", 2)
    for base in ("/sys/fs/cgroup", "/sys/fs/cgroup/" + hier.replace("name=", "")):
        for name in ("cgroup.procs", "memory.max", "memory.limit_in_bytes", "pids.max"):
            for where in (rel, os.path.dirname(rel)):
                p = os.path.normpath(base + where + "/" + name)
                if os.path.exists(p) and p not in paths:
                    paths.append(p)
for p in paths:
    if os.path.exists(p):
        fd = attempt(p, os.open, p, os.O_WRONLY)
        if fd is not None:
            os.close(fd)
"""


@pytest.mark.parametrize("policy", [POLICY, WHOLE_HOST], ids=["workspace", "workdir=/"])
def test_kernel_settings_and_cgroup_files_cannot_be_opened_for_writing(policy):
    # A root program needs no capability for most of /proc/sys (core_pattern
    # runs a program as root on the host) or for its own cgroup's limits.
    got = attack(KERNEL_KNOBS, limits=Limits(memory="1Gi", pids=512), policy=policy)
    assert got and "ok" not in got.values(), {k: v for k, v in got.items() if v == "ok"}


# -- 3. other processes: signals, limits ------------------------------------------


@pytest.fixture
def victim() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated process of the same user, outside every sandbox."""
    p = subprocess.Popen(["sleep", "60"])
    yield p
    p.kill()
    p.wait()


def nofile(pid: int) -> str:
    with open(f"/proc/{pid}/limits") as f:
        return next(line for line in f if line.startswith("Max open files"))


@pytest.mark.parametrize("isolate", [None, False], ids=["default", "no-pidns"])
def test_other_processes_cannot_be_signalled_or_relimited(victim, isolate):
    # By default, without a cgroup, a PID namespace hides the victim
    # (ESRCH); without one, Landlock's scope or the filter refuses (EPERM).
    limits_before = nofile(victim.pid)
    pol = Policy(protect_dotfiles=False, isolate_pids=isolate)
    got, r = attack_run(
        f"""
        import resource
        attempt("kill -1 (probe)", os.kill, -1, 0)
        attempt("prlimit victim", resource.prlimit, {victim.pid}, resource.RLIMIT_NOFILE, (0, 0))
        attempt("prlimit self", resource.setrlimit, resource.RLIMIT_NOFILE, (64, 64))
        attempt("kill self group (probe)", os.kill, 0, 0)
        attempt("kill victim", os.kill, {victim.pid}, signal.SIGKILL)
        """,
        policy=pol,
    )
    hidden = "pidns" in r.enforced.get("kill_tree", "")
    refused = "ESRCH" if hidden else "EPERM"
    assert got.pop("kill victim") == refused or r.enforced["signals"].startswith("seccomp:")
    assert got == {
        "kill -1 (probe)": "EPERM",
        "prlimit victim": "EPERM",
        "prlimit self": "ok",
        "kill self group (probe)": "ok",
    }
    assert nofile(victim.pid) == limits_before
    if r.enforced["signals"].startswith("seccomp:"):
        pytest.skip(f"enforced: signals: {r.enforced['signals']}")
    time.sleep(0.1)
    assert victim.poll() is None


STOP_CALLER = """
import json, resource, sys, sbxlimit
code = '''
import os, resource, signal
ppid = os.getppid()
for name, fn in (("prlimit", lambda: resource.prlimit(ppid, resource.RLIMIT_NOFILE, (0, 0))),
                 ("sigstop", lambda: os.kill(ppid, signal.SIGSTOP))):
    try:
        fn(); print(name, "ok")
    except OSError as e:
        print(name, e.errno)
'''
r = sbxlimit.run([sys.executable, "-c", code], capture_output=True, text=True,
                 policy=sbxlimit.Policy(protect_dotfiles=False), limits={"wall_time": 20})
print(json.dumps({"out": r.stdout, "err": r.stderr[-500:],
                  "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)}))
"""


def test_the_caller_cannot_be_stopped_or_relimited():
    p = subprocess.Popen([PY, "-c", STOP_CALLER], stdout=subprocess.PIPE, text=True)
    stopped = False
    deadline = time.monotonic() + 30
    while p.poll() is None and time.monotonic() < deadline:
        with open(f"/proc/{p.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                stopped = True
                os.kill(p.pid, signal.SIGCONT)
        time.sleep(0.05)
    out, _ = p.communicate(timeout=30)
    assert not stopped, "the sandbox stopped its caller"
    got = json.loads(out)
    assert got["out"].split("\n")[:2] == [f"prlimit {errno.EPERM}", f"sigstop {errno.EPERM}"], got
    assert got["nofile"][0] > 0


# -- 4. the terminal ------------------------------------------------------------

TIOCSTI = """
import json, os, sys, sbxlimit
os.setsid()
tty = os.open(sys.argv[1], os.O_RDWR)  # our controlling terminal now
code = '''
import fcntl, termios
for c in b"echo pwned\\\\n":
    try:
        fcntl.ioctl(0, termios.TIOCSTI, bytes([c]))
    except OSError as e:
        print(e.errno); break
else:
    print("typed")
'''
r = sbxlimit.run([sys.executable, "-c", code], stdin=tty, capture_output=True, text=True,
                 policy=sbxlimit.Policy(protect_dotfiles=False))
os.set_blocking(tty, False)
try:
    typed = os.read(tty, 100).decode()
except BlockingIOError:
    typed = ""
print(json.dumps({"out": r.stdout.strip(), "err": r.stderr[-300:], "typed": typed}))
"""


def test_nothing_can_be_typed_into_the_callers_terminal():
    master, slave = os.openpty()
    try:
        r = caller(TIOCSTI, os.ttyname(slave))
    finally:
        os.close(master)
        os.close(slave)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["typed"] == "", got
    assert got["out"] == str(errno.EPERM), got


def test_a_policy_sandbox_has_no_controlling_terminal():
    r = sbxlimit.run(
        [PY, "-c", "import os; print(os.getsid(0) == os.getpid())"],
        policy=POLICY,
        capture_output=True,
        text=True,
    )
    assert r.stdout == "True\n"
    assert r.enforced["terminal"].startswith("session:setsid")


# -- 5. sockets ---------------------------------------------------------------------


@pytest.fixture
def unix_listener() -> Iterator[tuple[str, socket.socket]]:
    d = tempfile.mkdtemp(prefix="escape-sock-")
    s = socket.socket(socket.AF_UNIX)
    s.bind(os.path.join(d, "sock"))
    os.chmod(d, 0o755)
    s.listen(8)
    s.settimeout(0.5)
    yield d, s
    s.close()
    shutil.rmtree(d)


CONNECT_UNIX = """
s = socket.socket(socket.AF_UNIX)
attempt("connect", s.connect, sys.argv[1])
attempt("listdir", os.listdir, os.path.dirname(sys.argv[1]) or "/")
"""


@needs_ro_view
def test_deny_read_hides_a_unix_socket(unix_listener):
    d, s = unix_listener
    sock = os.path.join(d, "sock")
    got = attack(CONNECT_UNIX, sock, policy=Policy(protect_dotfiles=False, deny_read=[d]))
    assert got["connect"] != "ok" and got["listdir"] != ["sock"], got
    assert nothing_accepted(s)


@pytest.mark.skipif(ABI < 6, reason=f"doctor: landlock ABI {ABI} (abstract sockets: 6)")
@pytest.mark.parametrize("network", ["allow", "proxy"])
def test_host_abstract_sockets_are_out_of_reach(network, listener):
    name = f"\0sbxlimit-escape-{os.getpid()}-{network}"
    s = socket.socket(socket.AF_UNIX)
    s.bind(name)
    s.listen(8)
    s.settimeout(0.5)
    with s:
        kw = {"proxy_ports": [listener.getsockname()[1]]} if network == "proxy" else {}
        got = attack(
            f"""
            c = socket.socket(socket.AF_UNIX)
            attempt("connect", c.connect, {name!r})
            """,
            policy=Policy(protect_dotfiles=False, network=network, **kw),  # type: ignore[arg-type]
        )
        assert got["connect"] in ("EPERM", "ECONNREFUSED"), got
        assert nothing_accepted(s)


FAMILIES = """
for name, fam, kind, proto in (
    ("vsock", 40, socket.SOCK_STREAM, 0),
    ("netlink sock_diag", socket.AF_NETLINK, socket.SOCK_RAW, 4),
    ("netlink uevent", socket.AF_NETLINK, socket.SOCK_RAW, 15),
    ("packet", socket.AF_PACKET, socket.SOCK_RAW, 0),
    ("xdp", 44, socket.SOCK_RAW, 0),
    ("alg", 38, socket.SOCK_SEQPACKET, 0),
    ("netlink route", socket.AF_NETLINK, socket.SOCK_RAW, 0),
    ("unix", socket.AF_UNIX, socket.SOCK_STREAM, 0),
):
    s = attempt(name, socket.socket, fam, kind, proto)
    if s is not None:
        s.close()
"""


@needs_filter
@pytest.mark.parametrize("network", ["deny", "proxy"])
def test_only_the_socket_families_the_mode_allows(network, listener):
    kw = {"proxy_ports": [listener.getsockname()[1]]} if network == "proxy" else {}
    got = attack(FAMILIES, policy=Policy(protect_dotfiles=False, network=network, **kw))  # type: ignore[arg-type]
    assert got.pop("netlink route") == "ok" and got.pop("unix") == "ok"
    assert set(got.values()) <= {"EAFNOSUPPORT", "EPERM", "EPROTONOSUPPORT"}, got


# -- 6. credentials ---------------------------------------------------------------------

OUTLIVE = """
import os, sys, sbxlimit
p = sbxlimit.Popen(["sleep", "60"], user=65534, group=65534, limits={"wall_time": 60},
                   stdout=sbxlimit.DEVNULL, stderr=sbxlimit.DEVNULL)
print(p.pid, flush=True)
os._exit(0)  # the caller dies; its sandbox must go with it
"""


@needs_root
def test_a_sandbox_with_another_user_dies_with_its_caller():
    r = caller(OUTLIVE)
    assert r.returncode == 0, r.stderr
    pid = int(r.stdout)
    try:
        assert wait_gone([pid]) == []
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


DUMPABLE = """
import ctypes, sbxlimit
libc = ctypes.CDLL(None)
before = libc.prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
sbxlimit.run(["true"], user=65534, limits={"wall_time": 10})
print(before, libc.prctl(3, 0, 0, 0, 0))
"""


@needs_root
def test_changing_user_leaves_the_caller_dumpable():
    r = caller(DUMPABLE)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "1"]


# -- 7. the memory watchdog's reads ------------------------------------------------------

GROUPS_HOG = """
import mmap, os, time
os.setgroups(list(range(1000, 61000)))  # /proc/self/status grows past 300 KB
m = mmap.mmap(-1, 400 << 20, mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
for i in range(0, len(m), 4096):
    m[i] = 1
time.sleep(10)
"""


@needs_root
def test_a_long_proc_status_does_not_blind_the_memory_watchdog():
    r = sbxlimit.run(
        [PY, "-c", GROUPS_HOG],
        limits=Limits(memory="64Mi", wall_time=30),
        cgroup_parent="none",
        capture_output=True,
        text=True,
    )
    assert r.termination.reason == "memory", (r.termination, r.stderr)


# -- the capabilities a root sandbox keeps ---------------------------------------------------

CAPS = """
caps = {}
for line in open("/proc/self/status"):
    key = line.split(":")[0]
    if key.startswith("Cap") or key == "NoNewPrivs":
        caps[key] = line.split()[1]
out.update(caps)
attempt("chown in workspace", os.chown, ".", 4321, 4321)
"""


def test_a_root_sandbox_runs_without_capabilities():
    got = attack(CAPS)
    assert {k: v for k, v in got.items() if k.startswith("Cap")} == {
        "CapInh": "0000000000000000",
        "CapPrm": "0000000000000000",
        "CapEff": "0000000000000000",
        "CapBnd": "0000000000000000" if ROOT else got["CapBnd"],
        "CapAmb": "0000000000000000",
    }
    assert got["NoNewPrivs"] == "1"
    # In a user namespace, a uid that is not mapped is EINVAL.
    assert got["chown in workspace"] in (("EPERM",) if ROOT else ("EPERM", "EINVAL"))


@needs_root
def test_capabilities_the_caller_grants_are_kept():
    got = attack(CAPS, policy=Policy(protect_dotfiles=False, capabilities=["CAP_NET_BIND_SERVICE"]))
    bit = f"{1 << 10:016x}"
    assert (got["CapEff"], got["CapPrm"], got["CapBnd"]) == (bit, bit, bit)
    assert got["chown in workspace"] == "EPERM"


def test_enforced_names_the_protections():
    r = sbxlimit.run(["true"], policy=POLICY)
    assert r.enforced["capabilities"].startswith("prctl:")
    if FILTER:
        assert r.enforced["seccomp"].startswith("seccomp:allow-list")
    if ABI >= 6:
        assert "landlock:abi" in r.enforced["signals"]


# -- 8. the spawn path's own state ------------------------------------------------------


def test_a_forked_sandbox_does_not_hold_another_spawns_error_pipe():
    # One thread spawns programs back to back; meanwhile forked sandboxes
    # (which run Python, not a program, so close-on-exec never fires) are
    # made.  A forked child that inherited a spawn's error pipe would hold
    # that spawn until the child exits (3 s).
    stop = threading.Event()
    slowest = [0.0]

    def spawner() -> None:
        while not stop.is_set():
            t = time.monotonic()
            sbxlimit.run(["true"], limits=Limits(wall_time=30))
            slowest[0] = max(slowest[0], time.monotonic() - t)

    t = threading.Thread(target=spawner)
    t.start()
    forked = []
    try:
        for _ in range(8):
            forked.append(ForkedSandbox(lambda: time.sleep(3), limits=Limits(wall_time=30)))
            time.sleep(0.01)
    finally:
        for f in forked:
            f.wait()
        stop.set()
        t.join()
    assert slowest[0] < 2.0, f"a spawn waited {slowest[0]:.1f} s for a forked sandbox"


def test_a_bad_landlock_call_leaks_nothing():
    import tracemalloc

    from sbxlimit._monitor import get_monitor

    # The supervisor idle first (nothing made ahead, nothing to remove): a
    # core call on its thread while tracemalloc stops can leave one of
    # tracemalloc's own traceback records behind, which the sanitizer run
    # would charge to that call's frame.
    assert get_monitor().drain(10.0)
    tracemalloc.start()
    try:
        for _ in range(50):
            with pytest.raises(TypeError):
                sbxlimit._core.landlock_ruleset(1, 5, 0, 0, list(range(1000)))
        before = tracemalloc.take_snapshot()
        for _ in range(500):
            with pytest.raises(TypeError):
                sbxlimit._core.landlock_ruleset(1, 5, 0, 0, list(range(1000)))
        grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    finally:
        tracemalloc.stop()
    assert grown < 100_000, grown


DROPPED = """
import os, sbxlimit, sys
p = sbxlimit.Popen(["sleep", "0.2"], policy=sbxlimit.Policy(protect_dotfiles=False))
print(p.workspace, flush=True)
p.wait()
# Dropped without close(): the interpreter's exit must remove the workspace
# quietly.
"""


def test_a_sandbox_dropped_at_exit_leaves_no_workspace_and_no_error():
    r = caller(DROPPED)
    assert r.returncode == 0, r.stderr
    assert "Exception ignored" not in r.stderr and "Error" not in r.stderr, r.stderr
    assert not os.path.exists(r.stdout.strip())


QUOTA = """
import os, sbxlimit
q = sbxlimit.Quota(max_sandboxes=4)
p = sbxlimit.Popen(["sleep", "3"], quota=q, die_with_parent=False, sample_interval=0.5,
                   stdout=sbxlimit.DEVNULL, stderr=sbxlimit.DEVNULL)
print(p.pid, p._sbx.interval, flush=True)
os._exit(0)  # die_with_parent=False: the program outlives us
"""


def test_quota_does_not_drop_the_other_arguments():
    r = caller(QUOTA)
    assert r.returncode == 0, r.stderr
    pid, interval = r.stdout.split()
    assert interval == "0.5"
    try:
        assert alive(int(pid)), "die_with_parent=False was ignored"
    finally:
        if alive(int(pid)):
            os.kill(int(pid), signal.SIGKILL)
