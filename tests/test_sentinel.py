"""A caller killed with SIGKILL: what its sandboxes started is ended all the
same (_sentinel), unless a sandbox was meant to outlive it."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable

import pytest

import sbxlimit
from sbxlimit import Limits, Policy, _sentinel
from sbxlimit._cgroup import discover

from .conftest import alive, privileges, report, wait_gone, why_not

PY = sys.executable
SITE = discover()
needs_cgroup = pytest.mark.skipif(
    not SITE.version, reason=f"no cgroup here: {SITE.reason} (see `sbxlimit doctor`)"
)
pytestmark = [
    pytest.mark.cgroup,
    pytest.mark.skipif(
        not os.access(_sentinel.PROGRAM, os.X_OK),
        reason="the sentinel was not built (setup.py builds sbxlimit/_sentinel on Linux)",
    ),
]


@pytest.fixture(autouse=True)
def _needs_pidfd() -> None:
    if report().check("pidfd").status != "ok":
        pytest.skip(why_not("pidfd"))


# The caller: a sandbox (a cgroup, no PID namespace) whose program starts a
# grandchild that leaves its session and its parent; the caller prints the
# grandchild's pid, its sandbox's cgroup name and its sentinel's pid, then
# waits to be killed.
CALLER = """
import os, subprocess, sys, time
import sbxlimit
from sbxlimit import _sentinel

prog = '''
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        print(os.getpid(), flush=True)
        time.sleep(120)
    os._exit(0)
time.sleep(120)
'''
for _ in range(int(os.environ.get("BEFORE", "0"))):  # made and gone, before
    sbxlimit.run(["true"], limits=sbxlimit.Limits(pids=16))
kw = {"die_with_parent": False} if os.environ.get("KEEP") else {}
p = sbxlimit.Popen([sys.executable, "-c", prog], limits=sbxlimit.Limits(pids=16, wall_time=60),
                   stdout=subprocess.PIPE, **kw)
grandchild = p.stdout.readline().decode().strip()
print(grandchild, p._sbx.cgroup.name, _sentinel.sentinel_pid(), flush=True)
time.sleep(120)
"""


def start_caller(**env: str) -> tuple[subprocess.Popen[str], int, str, int]:
    caller = subprocess.Popen(
        [PY, "-c", CALLER],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
        start_new_session=True,  # a group of its own, which a test may kill whole
    )
    assert caller.stdout is not None
    grandchild, name, sentinel = caller.stdout.readline().split()
    return caller, int(grandchild), name, 0 if sentinel == "None" else int(sentinel)


def cgroup_dirs(name: str) -> list[str]:
    return [d for _c, p in SITE.parents if os.path.exists(d := os.path.join(p, name))]


def owner_dirs(caller_pid: int) -> list[str]:
    lock = f"sbx-{caller_pid:x}.owner"
    return [d for _c, p in SITE.parents if os.path.exists(d := os.path.join(p, lock))]


def settle(pids: list[int], dirs: Callable[[], list[str]], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while (any(alive(p) for p in pids) or dirs()) and time.monotonic() < deadline:
        time.sleep(0.02)


@needs_cgroup
@pytest.mark.parametrize(
    "how,before",
    [
        ("the caller", 0),
        ("the caller's process group", 0),
        # Many made and gone before: the sentinel holds what follows the
        # caller's last reset, which must still name the live one.
        ("the caller", 700),
    ],
)
def test_what_a_killed_caller_s_sandbox_started_is_ended(how: str, before: int) -> None:
    caller, grandchild, name, sentinel = start_caller(BEFORE=str(before))
    try:
        assert alive(grandchild) and cgroup_dirs(name)
        if how == "the caller":
            caller.kill()
        else:  # the sentinel has a session of its own: a group kill leaves it
            os.killpg(caller.pid, signal.SIGKILL)
        caller.wait()
        # The leader dies of its parent-death signal; the grandchild only
        # of the sentinel's kill.
        settle([grandchild, sentinel], lambda: cgroup_dirs(name) + owner_dirs(caller.pid))
        assert not alive(grandchild), "the grandchild outlived its killed caller"
        assert cgroup_dirs(name) == [] and owner_dirs(caller.pid) == []
        assert not alive(sentinel)
    finally:
        caller.kill()
        caller.wait()
        caller.stdout.close()  # type: ignore[union-attr]
        if alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


@needs_cgroup
def test_a_sandbox_meant_to_outlive_its_caller_is_not_ended() -> None:
    caller, grandchild, name, sentinel = start_caller(KEEP="1")
    try:
        caller.kill()
        caller.wait()
        # Once the sentinel is done, what it kept still runs.
        assert wait_gone([sentinel], timeout=10.0) == []
        assert alive(grandchild) and cgroup_dirs(name)
    finally:
        caller.kill()
        caller.wait()
        caller.stdout.close()  # type: ignore[union-attr]
        for pid in _procs(name):
            os.kill(pid, signal.SIGKILL)
        settle([grandchild], lambda: [])
        subprocess.run([PY, "-m", "sbxlimit", "gc"], check=True, capture_output=True)
    assert cgroup_dirs(name) == []


def _procs(name: str) -> list[int]:
    pids: set[int] = set()
    for d in cgroup_dirs(name):
        with open(os.path.join(d, "cgroup.procs")) as f:
            pids |= {int(x) for x in f.read().split()}
    return sorted(pids)


@needs_cgroup
def test_the_sentinel_ends_with_its_caller_s_ordinary_exit() -> None:
    code = textwrap.dedent(
        """
        import sbxlimit
        from sbxlimit import _sentinel
        sbxlimit.run(["true"], limits=sbxlimit.Limits(pids=8))
        print(_sentinel.sentinel_pid(), flush=True)
        """
    )
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() != "None", "no sentinel was started"
    sentinel = int(out)
    assert wait_gone([sentinel], timeout=5.0) == []


FORKED = """
import os, subprocess, sys, time
import sbxlimit
from sbxlimit import _sentinel

prog = (
    "import os, time\\nif os.fork() == 0:\\n"
    "    os.setsid(); print(os.getpid(), flush=True); time.sleep(120)\\n"
    "time.sleep(120)"
)

def sandbox():
    p = sbxlimit.Popen([sys.executable, "-c", prog], limits=sbxlimit.Limits(pids=16),
                       stdout=subprocess.PIPE)
    return p, int(p.stdout.readline())

mine, my_grandchild = sandbox()
r, w = os.pipe()
child = os.fork()
if child == 0:
    os.close(r)
    _p, grandchild = sandbox()
    os.write(w, f"{grandchild} {_sentinel.sentinel_pid()}".encode())
    time.sleep(120)
    os._exit(0)
os.close(w)
grandchild, its_sentinel = os.read(r, 100).decode().split()
grandchild = int(grandchild)
os.kill(child, 9)
os.waitpid(child, 0)
deadline = time.monotonic() + 10
while os.path.exists(f"/proc/{grandchild}") and time.monotonic() < deadline:
    time.sleep(0.02)
mine_alive = mine.poll() is None and os.path.exists(f"/proc/{my_grandchild}")
ours = str(_sentinel.sentinel_pid())
print(os.path.exists(f"/proc/{grandchild}"), its_sentinel != ours, mine_alive)
mine.kill_tree()
if os.path.exists(f"/proc/{grandchild}"):
    os.kill(grandchild, 9)
"""


@needs_cgroup
def test_a_fork_s_child_has_a_sentinel_of_its_own() -> None:
    # The child's sandboxes are ended when it is killed; its parent's, whose
    # sentinel it does not share, run on.
    r = subprocess.run([PY, "-c", FORKED], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True", "True"], r.stdout


def at_the_sentinel(code: str, *, isolate_pids: bool) -> subprocess.CompletedProcess[str]:
    """`code` ({pid}: this process's sentinel, started first) in a policy
    sandbox with a cgroup."""
    sbxlimit.run(["true"], limits=Limits(pids=8))  # this process's sentinel
    pid = _sentinel.sentinel_pid()
    assert pid
    return sbxlimit.run(
        [PY, "-c", code.format(pid=pid)],
        limits=Limits(pids=8),
        policy=Policy(workdir="/", isolate_pids=isolate_pids),
        capture_output=True,
        text=True,
    )


@needs_cgroup
def test_a_sandboxed_program_cannot_speak_for_its_caller() -> None:
    # The sentinel's pipe is its caller's alone: a program of the same user
    # that opened it through /proc could say "done" for it, or keep its own
    # cgroup.  The sentinel is not dumpable: its fds are root's with
    # CAP_SYS_PTRACE, which no sandbox with a policy has.
    r = at_the_sentinel("open('/proc/{pid}/fd/0', 'wb')", isolate_pids=False)  # the host's /proc
    assert r.returncode == 1 and "PermissionError" in r.stderr, r.stderr


# A policy sandbox where Landlock cannot scope signals (before ABI 6, Linux
# 6.12; none in the cgroup v2 guest): the filter alone keeps it from the
# caller and from the sentinel, which would otherwise outlive a kill of
# the caller.  Every way a signal reaches a process, as SIGKILL.
KILL_SENTINEL = """
import json, os, sys, time
import sbxlimit
from sbxlimit import _core, _sentinel
if _core.landlock_abi() >= 6:
    _core.landlock_abi = lambda: 5  # a ruleset of Linux 6.10: no signal scope
prog = '''
import ctypes, json, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
TGKILL = {"x86_64": 234, "aarch64": 131}[os.uname().machine]
sentinel, caller = int(sys.argv[1]), int(sys.argv[2])
def proc(pid):
    return os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY)
def tgkill(pid):
    if libc.syscall(TGKILL, pid, pid, 9) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")
tries = {
    "kill": lambda: os.kill(sentinel, 9),
    "kill its group": lambda: os.killpg(sentinel, 9),
    "tgkill": lambda: tgkill(sentinel),
    "pidfd_open": lambda: signal.pidfd_send_signal(os.pidfd_open(sentinel), 9),
    "its /proc directory": lambda: signal.pidfd_send_signal(proc(sentinel), 9),
    "the caller's /proc directory": lambda: signal.pidfd_send_signal(proc(caller), 0),
}
out = {}
for name, attack in tries.items():
    try:
        attack()
        out[name] = "reached"
    except OSError as e:
        out[name] = os.strerror(e.errno)
print(json.dumps(out))
'''
sbxlimit.run(["true"], limits=sbxlimit.Limits(pids=8))  # this process's sentinel
sentinel = _sentinel.sentinel_pid()
r = sbxlimit.run([sys.executable, "-c", prog, str(sentinel), str(os.getpid())],
                 limits=sbxlimit.Limits(pids=8, wall_time=30), capture_output=True, text=True,
                 policy=sbxlimit.Policy(workdir="/", isolate_pids=False))
assert r.returncode == 0, r.stderr
time.sleep(0.2)  # a SIGKILL's end
try:
    with open(f"/proc/{sentinel}/stat") as f:  # (a zombie until init reaps it)
        state = f.read().rsplit(")", 1)[1].split()[0]
except FileNotFoundError:
    state = "X"
print(json.dumps({"tries": json.loads(r.stdout), "signals": r.enforced.get("signals"),
                  "alive": state not in ("Z", "X"),
                  "own group": os.getpgid(sentinel) == sentinel}))
"""


@needs_cgroup
@pytest.mark.skipif(
    report().check("seccomp").status != "ok", reason=f"no seccomp filter ({why_not('seccomp')})"
)
def test_a_policy_sandbox_cannot_kill_the_sentinel_where_landlock_cannot_scope_signals() -> None:
    r = subprocess.run([PY, "-c", KILL_SENTINEL], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["signals"].startswith("seccomp:"), got  # the filter alone holds them
    assert got["alive"] and got["own group"], got
    assert "reached" not in got["tries"].values(), got


@needs_cgroup
@pytest.mark.skipif(report().check("pid_namespace").status != "ok", reason=why_not("pid_namespace"))
def test_in_a_pid_namespace_the_sentinel_s_number_is_not_refused() -> None:
    # There the filter has nothing to guard (the namespace hides the
    # sentinel), and the number may be one of the sandbox's own processes.
    code = "import os\ntry:\n    os.kill({pid}, 0)\nexcept OSError as e:\n    print(e.errno)"
    r = at_the_sentinel(code, isolate_pids=True)
    assert r.enforced["signals"].startswith(("pidns", "landlock")), r.enforced
    assert r.stdout.strip() == str(errno.ESRCH), (r.stdout, r.stderr)


def test_a_program_of_the_same_user_cannot_open_the_sentinel_s_pipe(tmp_path) -> None:
    # What a sandboxed program of the caller's user may do to the caller's
    # other processes: without CAP_SYS_PTRACE, not open their fds through
    # /proc once they are not dumpable.  (Root's own programs have it.)
    if os.geteuid() == 0:
        pytest.skip("root's processes hold CAP_SYS_PTRACE: " + privileges())
    import dataclasses

    site = dataclasses.replace(SITE, version=2, parents=(("", str(tmp_path)),))
    _sentinel.announce(site)  # a sentinel for this process, if none runs yet
    pid = _sentinel.sentinel_pid()
    assert pid
    code = f"import os; os.open('/proc/{pid}/fd/0', os.O_WRONLY)"
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True)
    assert r.returncode == 1 and "PermissionError" in r.stderr, r.stderr


@needs_cgroup
def test_another_s_cgroup_with_the_caller_s_name_is_not_touched() -> None:
    # A process with the caller's pid in another PID namespace makes
    # sandboxes with the same names beside the caller's: only what the
    # caller said it made is ended.
    caller, grandchild, _name, sentinel = start_caller()
    other = f"sbx-{caller.pid:x}-999999"
    dirs = [os.path.join(p, other) for _c, p in SITE.parents]
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        for d in dirs:
            os.mkdir(d)
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(bystander.pid))
        caller.kill()
        caller.wait()
        assert wait_gone([sentinel, grandchild], timeout=10.0) == []
        assert bystander.poll() is None and all(os.path.isdir(d) for d in dirs)
    finally:
        caller.kill()
        caller.wait()
        caller.stdout.close()  # type: ignore[union-attr]
        bystander.kill()
        bystander.wait()
        for d in dirs:
            deadline = time.monotonic() + 5
            while os.path.isdir(d) and time.monotonic() < deadline:
                with contextlib.suppress(OSError):
                    os.rmdir(d)
        # The caller's owner locks stayed beside the populated "other".
        subprocess.run([PY, "-m", "sbxlimit", "gc"], check=True, capture_output=True)


def test_a_reset_cut_short_leaves_the_state_before_it() -> None:
    # The caller's whole state comes between "reset" and "end"; a full pipe
    # may cut it short (then the caller says it again later).  A line that
    # cannot be read is skipped.
    said = "\n".join(
        [
            "reset",
            "owner 1a",
            'where 0 [1, [["pids", "/p"]]]',
            "made sbx-1a-1 0",
            "made sbx-1a-2 0",
            "end",
            "gone sbx-1a-1",
            "reset",
            "owner 1a",
            'where 0 [1, [["pids", "/p"]]]',
            "made sbx-1a-2",  # cut short here: no end
        ]
    )
    owner, where, live, kept = _sentinel._read_state(said)
    assert owner == "1a" and where == {"0": '[1, [["pids", "/p"]]]'} and kept == set()
    assert list(live) == ["sbx-1a-2"]
    owner, where, live, kept = _sentinel._read_state(said + " 0\nkeep sbx-1a-2\nend\n")
    assert list(live) == ["sbx-1a-2"] and kept == {"sbx-1a-2"}
    assert _sentinel._left(live, {"x"}, {"0": "not json"}) == []


# Many live cgroups at once (plain directories stand for them: the kill
# finds no process there, the removal is an rmdir): the state the caller
# says again after each reset is far larger than a pipe's default 64 KiB.
MANY = """
import os, sys, time
from sbxlimit import _sentinel
from sbxlimit._cgroup import Cgroup, Site
root, n = sys.argv[1], int(sys.argv[2])
site = Site(1, (("pids", root),))
_sentinel.announce(site)

def make(i):
    cg = Cgroup(site, f"sbx-{os.getpid():x}-{i}")
    cg.dirs["pids"] = os.path.join(root, cg.name)
    os.mkdir(cg.dirs["pids"])
    _sentinel.made(cg)
    return cg

for i in range(n):
    make(i)
i = n
while _sentinel._said:  # made and gone until the next reset
    i += 1
    cg = make(i)
    os.rmdir(cg.dirs["pids"])
    _sentinel.gone(cg.name)
print(_sentinel.sentinel_pid(), flush=True)
time.sleep(60)
"""


def test_a_caller_with_many_live_cgroups_has_them_all_ended(tmp_path) -> None:
    caller = subprocess.Popen(
        [PY, "-c", MANY, str(tmp_path), "3000"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert caller.stdout is not None
        sentinel = int(caller.stdout.readline())
        assert len(os.listdir(tmp_path)) == 3000
        caller.kill()
        caller.wait()
        assert wait_gone([sentinel], timeout=30.0) == []
        assert os.listdir(tmp_path) == []
    finally:
        caller.kill()
        caller.wait()
        caller.stdout.close()  # type: ignore[union-attr]


@needs_cgroup
def test_the_sentinel_outlasts_a_stop_that_signals_it_too() -> None:
    # A stop of the caller's service sends SIGTERM (and more) to each of
    # its processes: the sentinel stays, to end what the caller left.
    caller, grandchild, _name, sentinel = start_caller()
    try:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
            os.kill(sentinel, sig)
        time.sleep(0.2)
        assert alive(sentinel)
        caller.send_signal(signal.SIGTERM)
        caller.wait()
        assert wait_gone([grandchild, sentinel], timeout=10.0) == []
    finally:
        caller.kill()
        caller.wait()
        caller.stdout.close()  # type: ignore[union-attr]


# The sentinel stopped while the caller's lines fill its pipe: the line of
# the caller's next cgroup does not fit; the caller says its state again
# once the sentinel reads, though it says nothing more itself.  (Plain
# directories stand for the cgroups: no supervisor of a real sandbox, which
# might say something later, and so the state again.)
FLOODED = """
import os, signal, sys, time
from sbxlimit import _sentinel
from sbxlimit._cgroup import Cgroup, Site

site = Site(1, (("pids", sys.argv[1]),))
_sentinel.announce(site)
sentinel = _sentinel.sentinel_pid()
os.kill(sentinel, signal.SIGSTOP)

def cgroup(n):
    cg = Cgroup(site, f"sbx-{os.getpid():x}-{n}")
    cg.dirs["pids"] = os.path.join(sys.argv[1], cg.name)
    return cg

n = 1
while _sentinel._synced:
    n += 1
    _sentinel.made(cgroup(n))
    _sentinel.gone(cgroup(n).name)
live = cgroup(1)
os.mkdir(live.dirs["pids"])
_sentinel.made(live)  # does not fit
os.kill(sentinel, signal.SIGCONT)
time.sleep(2.5)  # it reads once a second; the caller says it all again
print(sentinel, flush=True)
time.sleep(120)
"""


def test_a_state_the_pipe_could_not_take_reaches_the_sentinel_later(tmp_path) -> None:
    caller = subprocess.Popen([PY, "-c", FLOODED, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert caller.stdout is not None
        sentinel = int(caller.stdout.readline())
        assert len(os.listdir(tmp_path)) == 1
        caller.kill()
        caller.wait()
        assert wait_gone([sentinel], timeout=10.0) == []
        assert os.listdir(tmp_path) == []
    finally:
        caller.kill()
        caller.wait()
        caller.stdout.close()  # type: ignore[union-attr]
