"""Cgroup placement against real cgroups: v1 natively (root on a v1 or
hybrid host), v2 inside a User-Mode-Linux kernel (tests/test_cgroup2_vm.py
runs this file there).  Every test here needs a usable cgroup site and
skips with discover()'s reason otherwise; the unprivileged fallback has its
own tests at the end."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

import pytest

import sbxlimit
from sbxlimit import Limits, Policy, _core
from sbxlimit._cgroup import _V1, SUPERVISOR_LEAF, Cgroup, Site, _ensure_group_dir, discover
from sbxlimit._cgroupfs import mounts
from sbxlimit._monitor import get_monitor
from sbxlimit._owner import owner_path

from .conftest import (
    _fds,
    alive,
    can_choose_the_next_pid,
    in_a_fork,
    kept_in_a_fork,
    privileges,
    wait_gone,
)

PY = sys.executable
SITE = discover()
needs_cgroup = pytest.mark.skipif(
    not SITE.version, reason=f"no cgroup here: {SITE.reason} (see `sbxlimit doctor`)"
)
pytestmark = pytest.mark.cgroup
# In the UML guest the harness asks for v2 and these must not skip.
EXPECT = os.environ.get("SBXLIMIT_EXPECT_CGROUP")


def mine() -> list[str]:
    """This process's sandbox cgroups that still exist."""
    prefix = f"sbx-{os.getpid():x}-"
    return [
        os.path.join(parent, n)
        for _c, parent in SITE.parents
        if os.path.isdir(parent)  # an unused grouping cgroup may be gone (gc)
        for n in os.listdir(parent)
        if n.startswith(prefix)
    ]


def v2_parent() -> str:
    """The v2 site's parent, made again if it is our grouping cgroup and
    another process removed it, empty, at its exit."""
    parent = SITE.parents[0][1]
    if os.path.basename(parent) == "sbxlimit":
        _ensure_group_dir(os.path.dirname(parent), SITE.controllers)
    return parent


def py(code: str, **kw) -> sbxlimit.SandboxResult:
    return sbxlimit.run([PY, "-c", textwrap.dedent(code)], **kw)


def test_expected_cgroup_version():
    if EXPECT is None:
        pytest.skip("set SBXLIMIT_EXPECT_CGROUP=1|2 to insist on a cgroup version")
    assert SITE.version == int(EXPECT), SITE


@needs_cgroup
def test_memory_hog_ends_with_reason_memory():
    code = """
        b = bytearray(1 << 30)
        b[::4096] = b"x" * (len(b) // 4096)
    """
    r = py(code, limits=Limits(memory="32Mi"))
    t = r.termination
    assert t.reason == "memory", t
    assert t.limit == 32 << 20 and t.observed >= t.limit
    assert (
        t.mechanism
        == r.enforced["memory"]
        == f"{SITE.label}:memory." + ("max" if SITE.version == 2 else "limit_in_bytes")
    )
    assert "memory" in t.hits and "32.0 MiB" in t.message
    assert r.usage.memory_peak >= 32 << 20


# A helper that sleeps and a hog: the OOM kill takes the hog; the sandbox
# (helper and leader included) must end with it.  Prints the helper's pid.
TREE_HOG = """
    import os, time
    helper = os.fork()
    if helper == 0:
        time.sleep(60)
        os._exit(0)
    hog = os.fork()
    if hog == 0:
        b = bytearray(1 << 30)
        b[::4096] = b"x" * (len(b) // 4096)
        os._exit(0)
    print(helper, flush=True)
    os.waitpid(hog, 0)
    time.sleep(60)
"""


@needs_cgroup
def test_memory_tree_dies_as_a_whole():
    code = TREE_HOG
    t0 = time.monotonic()
    r = py(code, limits=Limits(memory="32Mi", wall_time="50s"), capture_output=True, text=True)
    assert r.termination.reason == "memory", r.termination
    assert time.monotonic() - t0 < 30
    assert not wait_gone([int(r.stdout.split()[0])])


@needs_cgroup
def test_memory_within_limit_runs():
    code = """
        b = bytearray(8 << 20)
        b[::4096] = b"x" * (len(b) // 4096)
    """
    r = py(code, limits=Limits(memory="64Mi"))
    assert r.returncode == 0 and r.termination.reason == "exited"
    assert r.termination.hits == ()
    assert 8 << 20 <= r.usage.memory_peak < 64 << 20


FORKS = """
    import os, sys, time
    kids = []
    try:
        for _ in range(100):
            pid = os.fork()
            if pid == 0:
                time.sleep(30)
                os._exit(0)
            kids.append(pid)
    except OSError as e:
        print(len(kids), e.errno, flush=True)
    for k in kids:
        os.kill(k, 9)
        os.waitpid(k, 0)
    sys.exit(3 if len(kids) < 100 else 0)
"""


@needs_cgroup
def test_fork_loop_stops_at_pids_max():
    # Tolerated, so that the program lives to report the refusal (by
    # default the supervisor ends it at the refusal: tests/test_verdicts.py).
    r = py(FORKS, limits=Limits(pids=16, tolerate="pids"), capture_output=True, text=True)
    n, err = map(int, r.stdout.split())
    assert n == 15 and err == 11  # the leader + 15 children = 16; EAGAIN
    t = r.termination
    assert t.reason == "pids" and t.limit == 16, t
    assert t.mechanism == r.enforced["pids"] == f"{SITE.label}:pids.max"
    assert "pids.max" in t.message and "refused" in t.message
    assert r.usage.pids_peak == 16


@needs_cgroup
def test_refused_fork_is_a_hit_even_when_the_program_survives():
    code = FORKS.replace("sys.exit(3 if len(kids) < 100 else 0)", "sys.exit(0)")
    # Tolerated: a refusal the program handles, then exits 0.
    r = py(code, limits=Limits(pids=8, tolerate="pids"), capture_output=True, text=True)
    assert r.returncode == 0
    assert r.termination.reason == "exited" and r.termination.hits == ("pids",)
    # By default the refusal is the verdict, even if the program exited 0
    # before the supervisor's next sample ended it.
    r = py(code, limits=Limits(pids=8), capture_output=True, text=True)
    assert r.termination.reason == "pids", r.termination


@needs_cgroup
def test_cpu_rate_is_throttled_not_killed():
    code = """
        import time
        end = time.monotonic() + 2
        while time.monotonic() < end:
            pass
    """
    r = py(code, limits=Limits(cpu="200m"))
    assert r.returncode == 0 and r.termination.reason == "exited"
    assert r.enforced["cpu"].startswith(SITE.label)
    u = r.usage
    assert 0.1 <= u.cpu_total / u.wall <= 0.3, u  # 0.2 CPU s per s, +-50%
    assert u.throttled_periods > 0 and u.throttled_seconds > 0.5


ESCAPEE = """
    import os, sys, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            print(os.getpid(), flush=True)
            time.sleep(60)
        os._exit(0)
    time.sleep(60)
"""


def _escapee(**kw) -> tuple[sbxlimit.Popen, int]:
    p = sbxlimit.Popen(
        [PY, "-c", textwrap.dedent(ESCAPEE)], stdout=subprocess.PIPE, text=True, **kw
    )
    pid = int(p.stdout.readline())
    assert alive(pid)
    return p, pid


@needs_cgroup
def test_kill_tree_reaches_a_setsid_double_forked_grandchild():
    p, esc = _escapee(limits=Limits(wall_time="60s"))
    with p:
        p.kill_tree(grace=0)
    assert not wait_gone([esc], 2)
    assert p.termination.reason == "signaled" and "kill_tree()" in p.termination.message


@needs_cgroup
def test_kill_tree_with_grace_terminates_everyone():
    p, esc = _escapee(limits=Limits(wall_time="60s"))
    with p:
        p.kill_tree(grace=5)  # SIGTERM to every process of the cgroup
    assert p.returncode == -signal.SIGTERM
    assert not wait_gone([esc], 2)


@needs_cgroup
def test_wall_time_reaches_the_escapee():
    p, esc = _escapee(limits=Limits(wall_time="1s", kill_grace=0.2))
    with p:
        p.wait(timeout=20)
    assert p.termination.reason == "wall_time"
    assert not wait_gone([esc], 2)


@needs_cgroup
def test_leaving_the_with_block_by_an_exception_kills_the_escapee():
    with pytest.raises(KeyboardInterrupt):
        p, esc = _escapee(limits=Limits(wall_time="60s"))
        with p:
            raise KeyboardInterrupt
    assert not wait_gone([esc], 2)
    assert get_monitor().drain(5) and not mine()


@needs_cgroup
def test_leftovers_die_when_the_leader_exits():
    # The leader exits (after its grandchild has printed); the grandchild,
    # in a session of its own, is still in the cgroup and dies then.
    code = textwrap.dedent(ESCAPEE).rsplit("time.sleep(60)", 1)[0] + "time.sleep(0.5)\n"
    r = py(code, limits=Limits(wall_time="60s"), capture_output=True, text=True)
    assert r.returncode == 0
    assert not wait_gone([int(r.stdout)], 2)


@needs_cgroup
def test_a_leftover_nobody_reads_from_dies_at_the_leaders_exit(tmp_path):
    # No pipe: the supervisor does not watch the exit, and the caller's
    # reap alone ends the leftover, before the with-block is left.  A
    # cgroup made ahead (the pool's, after a first sandbox of the kind)
    # answers "anything left?" from its task count.
    pidfile = tmp_path / "pid"
    code = f"""
        import os, subprocess, sys
        p = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"],
            start_new_session=True,
        )
        open({str(pidfile)!r}, "w").write(str(p.pid))
    """
    lim = Limits(memory="200Mi", pids=20)
    for _ in range(20):
        with sbxlimit.Popen([PY, "-c", textwrap.dedent(code)], limits=lim) as p:
            cg = p._sbx.cgroup
            pooled = cg is not None and cg.count_fd >= 0
            assert p.wait() == 0
            # The supervisor would end it too, but only at its next pass.
            assert not wait_gone([int(pidfile.read_text())], 0.005)
        if pooled or SITE.version == 2:
            break
        time.sleep(0.1)  # the pool makes the next one meanwhile
    else:
        pytest.fail("no cgroup of the kind came from the pool")


# Forks as fast as it can, retrying refused forks; says "refused" once,
# at the first.  Prints its pid first.
FORK_LOOP = """
    import os
    print(os.getpid(), flush=True)
    said = False
    while True:
        try:
            pid = os.fork()
        except OSError:
            if not said:
                print("refused", flush=True)
                said = True
            continue
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
"""

HERE = SITE.label if SITE.version else SITE.reason  # doctor's words for this site
needs_v1_pids = pytest.mark.skipif(
    SITE.version != 1 or not SITE.has("pids"),
    reason=f"cgroup v1 with the pids controller (here: {HERE}; see `sbxlimit doctor`); "
    "v2 kills through cgroup.kill",
)


def _fork_loop(**limits: Any) -> sbxlimit.Popen:
    """FORK_LOOP in a sandbox of `limits`, once it runs."""
    p = sbxlimit.Popen(
        [PY, "-c", textwrap.dedent(FORK_LOOP)],
        stdout=subprocess.PIPE,
        text=True,
        limits=Limits(**limits),
    )
    int(p.stdout.readline())
    return p


@needs_v1_pids
def test_a_v1_kill_stops_a_fork_loop_without_the_freezer():
    # The pids controller stops every fork for the kill (pids.max = 0), so
    # a sandbox needs no freezer directory: one mkdir, join and rmdir less.
    p = _fork_loop(wall_time="10s")
    with p:
        cg = p._sbx.cgroup
        assert "freezer" not in cg.dirs and "pids" in cg.dirs, cg.dirs
        time.sleep(0.2)  # forking at full speed
        left = cg.pids()
        assert left
        p.kill_tree(grace=0)
    assert p.termination.reason == "signaled", p.termination
    assert not wait_gone(left, 2)
    assert get_monitor().drain(5) and not mine()


@pytest.mark.skipif(
    SITE.version != 1 or not any(c == "freezer" for c, _p in SITE.parents),
    reason=f"cgroup v1 with the freezer (here: {HERE}; see `sbxlimit doctor`)",
)
def test_a_v1_site_without_pids_kills_a_fork_loop_through_the_freezer():
    # Where the pids controller is missing, the freezer holds the cgroup
    # still for the kill (freeze, kill, thaw), as before.
    site = dataclasses.replace(
        SITE,
        parents=tuple((c, p) for c, p in SITE.parents if c != "pids"),
        controllers=SITE.controllers - {"pids"},
    )
    cg = Cgroup.create(site, f"sbx-{os.getpid():x}-9000010", ())
    try:
        assert "freezer" in cg.dirs and "pids" not in cg.dirs, cg.dirs
        r, w = os.pipe()
        leader = os.fork()
        if leader == 0:  # joins, then forks as fast as it can
            os.close(r)
            for path in cg.dirs.values():
                with open(os.path.join(path, "tasks"), "w") as f:
                    f.write("0")
            os.close(w)
            os.execv(PY, [PY, "-c", textwrap.dedent(FORK_LOOP)])
        os.close(w)
        os.read(r, 1)  # EOF: it joined
        os.close(r)
        time.sleep(0.2)
        left = cg.pids()
        assert len(left) >= 1
        cg.kill()
        assert cg.pids() == []
        assert os.waitpid(leader, 0)[1] == signal.SIGKILL
        assert not wait_gone(left, 2)
        assert cg.counters(("pids",))[1] == 0  # no pids directory: nothing counted
    finally:
        cg.kill()
        cg.remove()


@needs_v1_pids
def test_forks_the_kill_refuses_are_not_the_program_s():
    # The kill's pids.max = 0 refuses the loop's next fork, which pids.events
    # counts as one past the sandbox's own limit would be: the verdict must
    # not read it as the program's.
    p = _fork_loop(pids=64, wall_time="10s")
    with p:
        cg = p._sbx.cgroup
        cg._block_forks()  # the kill's first step, alone
        assert p.stdout.readline().strip() == "refused"
        assert cg.counters(("pids",))[1] == 0
        p.kill_tree(grace=0)
    t = p.termination
    assert t.reason == "signaled" and "pids" not in t.hits, t


@needs_v1_pids
def test_a_kill_that_cannot_read_the_refusal_count_blocks_no_fork(monkeypatch):
    # Without the count from before, a refusal of the block's would read as
    # the program's (or, taken as 0, every later one would be hidden): the
    # kill then goes without the block, as where no pids controller is.
    p = _fork_loop(pids=64, wall_time="10s")
    with p:
        cg = p._sbx.cgroup
        real = Cgroup._read

        def unreadable(self: Cgroup, path: str) -> str:
            return "" if path.endswith("pids.events") else real(self, path)

        monkeypatch.setattr(Cgroup, "_read", unreadable)
        cg._block_forks()
        monkeypatch.setattr(Cgroup, "_read", real)
        assert cg.forks_blocked_at is None and not cg.forks_blocked
        with open(os.path.join(cg.dirs["pids"], "pids.max")) as f:
            assert f.read().strip() == "64"
        p.kill_tree(grace=0)
    assert p.termination.reason == "signaled", p.termination


@needs_v1_pids
def test_the_supervisor_reads_no_fork_the_kill_refused_as_a_hit():
    # v1's pids.events is read in the supervisor's batch: a refusal of the
    # kill's block must not end the sandbox as a pids hit (here the block
    # alone, a refusal seen, then wall_time ends it).
    p = _fork_loop(pids=64, wall_time="1s", kill_grace=0)
    with p:
        p._sbx.cgroup._block_forks()
        assert p.stdout.readline().strip() == "refused"
        p.wait(timeout=20)
    t = p.termination
    assert t.reason == "wall_time" and "pids" not in t.hits, t


@pytest.mark.skipif(SITE.version != 1, reason="v1's task count (v2 writes cgroup.kill)")
def test_the_task_count_tells_a_zombie_leader_alone_from_a_leftover():
    cg = Cgroup.create(SITE, f"sbx-{os.getpid():x}-count", ())
    try:
        cg.arm(())
        assert cg.count_fd >= 0
        r, w = os.pipe()
        leader = os.fork()
        if leader == 0:  # joins, leaves a sleeper, exits
            for path in cg.dirs.values():
                with open(os.path.join(path, "tasks"), "w") as f:
                    f.write("0")
            if os.fork() == 0:
                os.close(r)
                time.sleep(60)
                os._exit(0)
            os._exit(0)
        os.close(w)
        os.waitid(os.P_PID, leader, os.WEXITED | os.WNOWAIT)
        assert not cg._only_the_leader()  # the zombie and the sleeper
        left = cg.pids()
        assert len(left) == 1
        os.kill(left[0], signal.SIGKILL)
        os.read(r, 1)  # EOF: the sleeper is gone
        os.close(r)
        deadline = time.monotonic() + 5
        while not cg._only_the_leader() and time.monotonic() < deadline:
            time.sleep(0.005)
        assert cg._only_the_leader()  # the zombie alone
        os.waitpid(leader, 0)
        assert cg._only_the_leader()
    finally:
        cg.kill()
        cg.remove()


@needs_cgroup
def test_usage_is_live_from_the_cgroup():
    code = """
        import os, time
        b = bytearray(8 << 20)
        b[::4096] = b"x" * (len(b) // 4096)
        if os.fork() == 0:
            time.sleep(30)
        print("ready", flush=True)
        time.sleep(30)
    """
    with sbxlimit.Popen(
        [PY, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, limits=Limits(pids=32)
    ) as p:
        p.stdout.readline()
        u = p.usage()
        assert u.memory_now >= 8 << 20 and u.pids_now == 2
        assert u.cpu_total > 0
        p.kill_tree(grace=0)
    final = p.usage()
    assert final.pids_now == 0 and final.memory_peak >= 8 << 20
    assert final.pids_peak == 2


def _usage_in_a_fork_over_decoys(p: sbxlimit.Popen, tmp_path, n: int) -> int:
    """usage()'s memory_now in a forked child that first opened `n` files
    reading 999999999: the numbers the parent's kept files had."""
    decoy = tmp_path / "decoy"
    decoy.write_text("999999999\n")

    def usage_over_decoys() -> str:
        for _ in range(n):
            os.open(decoy, os.O_RDONLY)
        return str(p.usage().memory_now)

    return int(in_a_fork(usage_over_decoys))


@needs_cgroup
def test_usage_keeps_its_files_open_reads_them_afresh_and_closes_them_with_the_cgroup(tmp_path):
    # A dashboard polls usage(): its files are opened once and read again
    # from their start at each call (a pread), never a stale figure; a
    # forked child does not inherit them, and the cgroup's removal closes
    # them.  No limit the supervisor watches, no output read: nothing
    # else has the supervisor look into this cgroup.
    grown = tmp_path / "grown"
    code = f"""
        import subprocess, sys, time
        sys.stdin.readline()
        b = bytearray(16 << 20)
        b[::4096] = b"x" * (len(b) // 4096)
        sleeper = subprocess.Popen(["sleep", "30"])
        open({str(grown)!r}, "w").close()
        time.sleep(30)
    """
    with sbxlimit.Popen(
        [PY, "-c", textwrap.dedent(code)], stdin=subprocess.PIPE, limits=Limits(cpu="1")
    ) as p:
        cg = p._sbx.cgroup
        assert p._sbx.watch is None
        dirs = set(cg.dirs.values())
        before = p.usage()
        kept = dict(cg.readers)
        assert kept and all(os.path.dirname(_fds()[fd]) in cg.dirs.values() for fd in kept.values())
        if cg.count_fd >= 0:  # v1's task count, open for the exit: read through it
            assert ("pids", "pids.current") not in kept
        assert kept_in_a_fork(list(kept.values())) == {}
        assert _usage_in_a_fork_over_decoys(p, tmp_path, len(kept)) < 999_999_999
        p.stdin.write(b"go\n")
        p.stdin.flush()
        deadline = time.monotonic() + 10
        while not grown.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        after = p.usage()
        assert cg.readers == kept  # the same files, read again
        assert after.memory_now >= before.memory_now + (16 << 20)
        assert after.cpu_total > before.cpu_total
        assert after.pids_now == before.pids_now + 1  # the sleep it started
        p.kill_tree(grace=0)
    assert get_monitor().drain(5)  # the supervisor removed the cgroup
    assert cg.removed and not cg.readers
    assert not [t for t in _fds().values() if os.path.dirname(t) in dirs]


@needs_cgroup
def test_a_hundred_sandboxes_leave_no_cgroup_behind():
    lim = Limits(memory="64Mi", pids=16, cpu="1")
    procs = [sbxlimit.Popen(["true"], limits=lim) for _ in range(100)]
    assert mine()  # made, one per sandbox
    for p in procs:
        assert p.wait() == 0
    assert get_monitor().drain(5)
    assert mine() == []


@needs_cgroup
def test_cgroups_made_ahead_hold_each_sandbox_s_own_limits(monkeypatch):
    # Two kinds of sandbox alternate.  After the first of each kind the
    # supervisor makes their cgroups ahead of need: each sandbox still gets
    # a cgroup named after it, holding its own limits, never the other's.
    import threading

    from sbxlimit._cgroup import Cgroup

    makers: list[str] = []
    real = Cgroup.create.__func__

    def create(cls, site, name, settings):
        makers.append(threading.current_thread().name)
        return real(cls, site, name, settings)

    monkeypatch.setattr(Cgroup, "create", classmethod(create))
    get_monitor().drain(5)
    kinds = [Limits(pids=7), Limits(pids=9)]
    for i in range(12):
        lim = kinds[i % 2]
        with sbxlimit.Popen(["sleep", "5"], limits=lim) as p:
            cg = p._sbx.cgroup
            assert cg.name == f"sbx-{p.sandbox_id}"
            pids_dir = cg.dirs["" if SITE.version == 2 else "pids"]
            with open(os.path.join(pids_dir, "pids.max")) as f:
                assert f.read().strip() == str(lim.pids)
            p.kill_tree(grace=0)
        time.sleep(0.05)  # the supervisor makes the next ones meanwhile
    assert makers.count("sbxlimit-monitor") >= 10, makers
    assert mine()  # the ready ones
    assert get_monitor().drain(5)
    assert mine() == []


@needs_cgroup
def test_spawn_failure_removes_the_cgroup():
    with pytest.raises(FileNotFoundError):
        sbxlimit.Popen(["/nonexistent/prog"], limits=Limits(pids=8))
    with pytest.raises(NotADirectoryError):
        sbxlimit.Popen(["true"], limits=Limits(pids=8), cwd="/etc/passwd")
    assert get_monitor().drain(5) and mine() == []


@needs_cgroup
def test_clone3_places_the_child_at_birth_on_v2():
    p = sbxlimit.Popen(["true"], limits=Limits(pids=8))
    p.wait()
    if SITE.version != 2:
        assert not p._sbx.how & _core.HOW_INTO_CGROUP
        pytest.skip("CLONE_INTO_CGROUP needs cgroup v2; v1 children write cgroup.procs")
    if not _core.HAS_VFORK or os.uname().machine != "x86_64":
        pytest.skip("the clone3 trampoline exists for x86-64 only; others use clone()")
    assert p._sbx.how & _core.HOW_INTO_CGROUP


@needs_cgroup
def test_a_live_sandbox_holds_no_fd_of_its_cgroup_s_directory():
    # v2's directory fd is the clone's (CLONE_INTO_CGROUP), done with once
    # the child is made: 45 live sandboxes under 64 fds held 45 of them.
    if SITE.version != 2:
        pytest.skip("cgroup v1 opens no directory: its children join through tasks")
    with sbxlimit.Popen(["sleep", "30"], limits=Limits(memory="64Mi")) as p:
        dirs = set(p._sbx.cgroup.dirs.values())
        held = set(_fds().values())
        p.kill()
    assert not dirs & held, dirs & held


_FROM_THE_ANCHORS = """
import os, subprocess, sys
from sbxlimit._cgroup import Cgroup, discover

cg = Cgroup.create(discover(), f"sbx-{os.getpid():x}-9000001", [])  # a name gc knows
dirs = list(cg.dirs.values())
print(len(cg.anchors), *dirs, flush=True)
# The path from "/" leads nowhere now; our owner cgroups' fds still do.
subprocess.run(["mount", "-t", "tmpfs", "none", "/sys/fs/cgroup"], check=True)
hidden = not any(os.path.exists(d) for d in dirs)
cg.arm(["memory", "pids"])
armed = (sorted(cg.armed), len(cg.ready_procs), sorted(bool(b) for b in cg.baselines.values()))
s = cg.stats()
removed = cg.remove()
subprocess.run(["umount", "/sys/fs/cgroup"], check=True)
print(hidden, removed, s.memory_peak, s.pids_peak, armed, sep="|", flush=True)
print(*[d for d in dirs if os.path.exists(d)], flush=True)
"""


@needs_cgroup
def test_a_cgroup_s_files_are_reached_from_the_owner_cgroup_beside_it():
    # Each name of a cgroup path is a slow lookup on kernfs, so a sandbox
    # cgroup's files are reached as "../<name>/<file>" from our owner
    # cgroup's fd (held for the process's life): with the path from "/"
    # hidden (a tmpfs over the tree, in a mount namespace of its own), it
    # is still armed, read and removed.
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    probe = ["unshare", "-m", "mount", "-t", "tmpfs", "none", "/sys/fs/cgroup"]
    if subprocess.run(probe, capture_output=True).returncode != 0:
        pytest.skip(f"cannot mount in a mount namespace of its own ({privileges()})")
    r = subprocess.run(
        ["unshare", "-m", PY, "-c", _FROM_THE_ANCHORS], capture_output=True, text=True, timeout=60
    )
    made, got, left = [*r.stdout.split("\n"), "", ""][:3]
    n_anchors, *dirs = made.split() or ["0"]
    for d in dirs:  # left by a failure
        with contextlib.suppress(OSError):
            os.rmdir(d)
    assert r.returncode == 0, r.stderr
    assert int(n_anchors) == len(dirs) > 0, made
    n_dirs = len(dirs)
    # Armed (the events, the join files, the counters no event covers:
    # v1's pids.events), read, and removed.
    events, counters = (["memory"], [True]) if SITE.version == 1 else (["memory", "pids"], [])
    assert got == f"True|True|0|0|{(events, n_dirs, counters)}", got
    assert left == "", left  # removed from the anchors, not "gone" for an ENOENT


@needs_cgroup
def test_a_removed_owner_cgroup_costs_one_step_by_step_create():
    # Our owner cgroup removed from outside (rmdir ignores flock) and its
    # parent made again: the fd held names a removed parent.  The create
    # that finds no parent there lets it go; the next takes a lock anew.
    from sbxlimit import _owner

    ctrl, hierarchy = SITE.parents[0]
    parent = os.path.join(hierarchy, f"sbxlimit-test-{os.getpid()}")
    site = Site(SITE.version, ((ctrl, parent),), frozenset(), False, "", explicit=False)
    fast: list[bool] = []
    real = Cgroup._create_in_one_call

    def spy(self, skip, settings):
        done = real(self, skip, settings)
        if self.site is site:  # not the supervisor's, made meanwhile
            fast.append(done)
        return done

    os.mkdir(parent)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Cgroup, "_create_in_one_call", spy)
            Cgroup.create(site, f"sbx-{os.getpid():x}-9000003", ()).remove()
            os.rmdir(owner_path(parent, os.getpid()))  # from outside
            os.rmdir(parent)
            os.mkdir(parent)
            made = []
            for n in (4, 5, 6):
                cg = Cgroup.create(site, f"sbx-{os.getpid():x}-900000{n}", ())
                made.append((os.path.isdir(cg.dirs[ctrl]), len(cg.anchors)))
                assert cg.remove()
        assert fast == [True, False, True, True], fast
        assert made == [(True, 0), (True, 1), (True, 1)], made
        assert os.path.isdir(owner_path(parent, os.getpid()))
    finally:
        fd = _owner.anchor(parent)
        if fd >= 0:
            _owner.forget(parent, fd)
        for d in [owner_path(parent, os.getpid()), parent]:
            with contextlib.suppress(OSError):
                os.rmdir(d)


_OUTLIVES_THE_EXIT = """
import os, subprocess, threading, tempfile
from sbxlimit import _owner, _core
from sbxlimit._cgroup import Cgroup, discover

cg = Cgroup.create(discover(), f"sbx-{os.getpid():x}-9000007", [])
dirs = list(cg.dirs.values())
numbers = {fd for _d, fd, _r in cg.anchors}
sleeper = subprocess.Popen(["sleep", "60"])
for d in dirs:  # populated, as a cgroup the supervisor still retires
    with open(os.path.join(d, "cgroup.procs"), "w") as f:
        f.write(str(sleeper.pid))
decoy = tempfile.mkdtemp()
paused, resume, out = threading.Event(), threading.Event(), {}
real = _core.fs_batch

def fs_batch(steps, stop, anchors=()):
    if anchors and threading.current_thread().name == "supervisor":
        paused.set()  # descheduled between its anchors and the core call
        resume.wait()
    return real(steps, stop, anchors)

_core.fs_batch = fs_batch
t = threading.Thread(target=lambda: out.update(r=cg.remove(), pids=cg.pids()), name="supervisor")
t.start()
paused.wait()
_owner.release_all()  # the exit's CGROUPS phase, the supervisor still at work
taken = []  # the numbers given again (the WORKSPACES phase opens directories)
while not numbers <= set(taken) and len(taken) < 512:
    taken.append(os.open(decoy, os.O_RDONLY | os.O_DIRECTORY))
_core.fs_batch = real
resume.set()
t.join()
held = sum(map(os.path.isdir, dirs)) == len(dirs)
print(bool(numbers), out["r"], out["pids"] == [sleeper.pid], held)
sleeper.kill()
sleeper.wait()
cg.kill()
print(cg.remove(), any(map(os.path.isdir, dirs)))
"""


@needs_cgroup
def test_a_supervisor_that_outlives_the_exit_s_release_still_reaches_its_cgroups():
    # At exit the owner locks are let go while a supervisor that outlived
    # the drain may be between its anchors and a core call: their fds stay
    # open (another directory given the number would take an rmdir's
    # ENOENT for "gone", and a process list for empty).
    r = subprocess.run([PY, "-c", _OUTLIVES_THE_EXIT], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # Anchored; not taken for gone while populated, its process listed, its
    # directories there; then removed once empty.
    assert r.stdout.split() == ["True", "False", "True", "True", "True", "False"], r.stdout


@needs_cgroup
def test_a_fork_s_child_never_reaches_a_cgroup_through_its_parent_s_anchors(tmp_path):
    # A forked child closes the owner cgroups' fds it inherited: their
    # numbers, given again to directories of its own laid out like the
    # parent's, must not be taken for anchors (it would read decoys).
    cg = Cgroup.create(SITE, f"sbx-{os.getpid():x}-9000002", ())  # a name gc knows
    try:
        if not cg.anchors:
            pytest.skip(f"no owner cgroup here to reach cgroups from ({privileges()})")
        for d in cg.dirs.values():
            (tmp_path / cg.name).mkdir(exist_ok=True)
            for fname in os.listdir(d):
                (tmp_path / cg.name / fname).write_text("999999999\n")
        beside = tmp_path / "beside"
        beside.mkdir()
        numbers = {fd for _d, fd, _rel in cg.anchors}

        def stats_over_decoys() -> str:
            taken = set()
            for _ in range(256):
                taken.add(os.open(beside, os.O_RDONLY | os.O_DIRECTORY))
                if numbers <= taken:
                    break
            s = cg.stats(evidence=False)
            return f"{numbers <= taken} {s.memory_peak} {s.pids_peak}"

        given_again, memory, pids = in_a_fork(stats_over_decoys).split()
        assert given_again == "True"
        assert int(memory) < 999_999_999 and int(pids) < 999_999_999
        assert cg._anchors() == cg.anchors  # the parent's still hold
    finally:
        cg.remove()


@needs_cgroup
def test_crashed_supervisors_leftovers_are_collected(tmp_path):
    # A supervisor that dies without cleaning up: its sandbox dies with it
    # (die_with_parent), its cgroup stays behind, empty.  Its sentinel is
    # killed first (a kill of everything the user runs): gc is what is left.
    code = """
        import os, signal, sbxlimit
        from sbxlimit import _sentinel
        p = sbxlimit.Popen(["sleep", "30"], limits=sbxlimit.Limits(pids=8))
        print(p._sbx.cgroup.name, flush=True)
        if _sentinel.sentinel_pid():
            os.kill(_sentinel.sentinel_pid(), signal.SIGKILL)
        os._exit(0)
    """

    def crash() -> str:
        out = subprocess.run(
            [PY, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True
        )
        return out.stdout.strip()

    def leftovers(name: str) -> list[str]:
        paths = [os.path.join(parent, name) for _c, parent in SITE.parents]
        return [p for p in paths if os.path.exists(p)]

    name = crash()
    deadline = time.monotonic() + 5
    while leftovers(name) and time.monotonic() < deadline:
        out = subprocess.run(
            [PY, "-m", "sbxlimit", "gc"], capture_output=True, text=True, check=True
        ).stdout
        time.sleep(0.05)
    assert leftovers(name) == [] and f"{name}" in out

    # ... and by the next process that starts a sandbox, however recent:
    # its owner's lock (_owner) says it is gone, in every PID namespace.
    def owner_locks(name: str) -> list[str]:
        pid = int(name.split("-")[1], 16)
        paths = [owner_path(parent, pid) for _c, parent in SITE.parents]
        return [p for p in paths if os.path.exists(p)]

    def next_process() -> None:
        code = "import sbxlimit; sbxlimit.run(['true'], limits={'pids': 8})"
        subprocess.run([PY, "-c", code], check=True)

    gone = crash()
    time.sleep(0.2)  # the pdeathsig kill empties it
    assert leftovers(gone)
    locks = owner_locks(gone)  # os._exit ran no exit step
    next_process()
    assert leftovers(gone) == []
    assert locks and not any(os.path.exists(p) for p in locks)

    # Without an owner lock (where none could be made; an older sbxlimit's)
    # the pid is asked here, and its owner may run in another PID
    # namespace: a recent one stays, an old one goes.
    from sbxlimit._gc import AUTO_MIN_AGE

    def crash_unlocked() -> str:
        name = crash()
        for path in owner_locks(name):
            os.rmdir(path)
        return name

    recent, name = crash_unlocked(), crash_unlocked()
    time.sleep(0.2)
    old = time.time() - AUTO_MIN_AGE - 60
    for path in leftovers(name):
        os.utime(path, (old, old))
    next_process()
    assert leftovers(name) == []
    assert leftovers(recent) != []
    subprocess.run([PY, "-m", "sbxlimit", "gc"], capture_output=True, check=True)
    assert leftovers(recent) == []


_IN_ANOTHER_CGROUP = """
import os, sys, time, sbxlimit

# Into the cgroup the test made (v1: the memory hierarchy's; v2: the
# unified one's, whose controllers this process then delegates to itself).
with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as f:
    f.write(str(os.getpid()))
p = sbxlimit.Popen(["sleep", "60"], limits=sbxlimit.Limits(memory="64Mi", pids=8))
print(*p._sbx.cgroup.dirs.values(), flush=True)
time.sleep(60)  # until the test kills it: a crash
"""


@needs_cgroup
@pytest.mark.skipif(
    os.geteuid() != 0, reason=f"moving a process to another cgroup needs root ({privileges()})"
)
def test_gc_finds_a_dead_owner_s_cgroups_made_in_another_cgroup():
    # A process makes its sandbox cgroups under its own cgroup (v1; v2 when
    # delegated).  One that ran in another cgroup than gc's and crashed
    # left them where gc's usual places (its own cgroup, each root) are not.
    if SITE.version == 2:
        root = next(p for p, k, _o in mounts() if k == "cgroup2")
    else:
        root = next(p for p, k, o in mounts() if k == "cgroup" and "memory" in o)
    elsewhere = os.path.join(root, f"gc-elsewhere-{os.getpid()}")
    os.mkdir(elsewhere)
    env = {**os.environ, "SBXLIMIT_CGROUP_MOVE_SELF": "1"}
    try:
        with subprocess.Popen(
            [PY, "-c", _IN_ANOTHER_CGROUP, elsewhere], stdout=subprocess.PIPE, text=True, env=env
        ) as p:
            assert p.stdout is not None
            dirs = p.stdout.readline().split()
            p.kill()  # its sandbox dies with it (the parent-death signal)
        left = [d for d in dirs if d.startswith(elsewhere + "/")]
        assert left, (dirs, elsewhere)
        for d in dirs:
            deadline = time.monotonic() + 5
            while _procs_of(d) and time.monotonic() < deadline:
                time.sleep(0.01)
        out = subprocess.run(
            [PY, "-m", "sbxlimit", "gc"], capture_output=True, text=True, check=True
        ).stdout
        assert not [d for d in dirs if os.path.exists(d)], out
        # Its owner lock and the cgroups it made ahead went too (v2: not
        # its own leaf, which is no sandbox's).
        ours = [n for n in os.listdir(elsewhere) if n.startswith("sbx-")]
        assert set(ours) <= {SUPERVISOR_LEAF}, (ours, out)
    finally:
        # The killed owner's sentinel was started in its cgroup: it is there
        # until it has ended what the owner left (some 50 ms here, more in a
        # UML guest).
        deadline = time.monotonic() + 10
        while os.path.exists(elsewhere) and time.monotonic() < deadline:
            for d, _dirs, _files in os.walk(elsewhere, topdown=False):
                with contextlib.suppress(OSError):
                    os.rmdir(d)
            if os.path.exists(elsewhere):
                time.sleep(0.05)
    assert not os.path.exists(elsewhere)


def _procs_of(d: str) -> str:
    with open(os.path.join(d, "cgroup.procs")) as f:
        return f.read()


@needs_cgroup
@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"),
    reason=f"a PID namespace of the second process's own needs root ({privileges()})",
)
def test_another_pid_namespace_s_sbxlimit_leaves_our_cgroups_alone():
    # A second sbxlimit process in a PID namespace of its own (a container
    # sharing the cgroup tree, `unshare --pid`) sees none of our processes
    # alive: its first sandbox's automatic collection must not take the
    # cgroups our supervisor made ahead, and our next sandbox still gets
    # its limits.
    # A kind of our own: a sandbox another test left running in a thread
    # takes no ready cgroup of it.
    lim = Limits(memory="67Mi", wall_time=10)
    assert sbxlimit.run(["true"], limits=lim).returncode == 0
    pool = get_monitor()._pool

    def made() -> list[str]:  # this kind's ready cgroups (others' may expire meanwhile)
        limit = str(67 << 20)
        return [
            d
            for kind, cgs in list(pool._ready.items())
            if any(v == limit for _c, _f, v in kind[1])
            for cg in cgs
            for d in cg.dirs.values()
        ]

    deadline = time.monotonic() + 5
    while len({os.path.basename(d) for d in made()}) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)  # two made ahead
    ready = sorted(made())
    assert ready and set(ready) <= set(mine())
    other = "import sbxlimit; sbxlimit.run(['true'], limits=sbxlimit.Limits(memory='64Mi'))"
    out = subprocess.run(
        ["unshare", "--pid", "--fork", PY, "-c", other], check=True, timeout=60, capture_output=True
    )
    from sbxlimit import _owner

    assert set(ready) <= set(mine()), (ready, mine(), _owner._held, out)
    r = sbxlimit.run(["true"], limits=lim)
    assert r.returncode == 0 and r.enforced["memory"].startswith("cgroup")


_IN_ANOTHER_PID_NS = """
import os, sys, time, sbxlimit
from sbxlimit._monitor import get_monitor

lim = sbxlimit.Limits(memory="64Mi", wall_time=10)
assert sbxlimit.run(["true"], limits=lim).returncode == 0
pool = get_monitor()._pool
deadline = time.monotonic() + 5
made = lambda: sorted(d for d in pool.dirs() if os.path.isdir(d))
while len({os.path.basename(d) for d in made()}) < 2 and time.monotonic() < deadline:
    time.sleep(0.01)  # two made ahead
print(os.getpid(), *made(), flush=True)
sys.stdin.read()  # until the test has run its gc
r = sbxlimit.run(["true"], limits=lim)
print(r.returncode, r.enforced["memory"], flush=True)
"""


@needs_cgroup
@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare") or not can_choose_the_next_pid(),
    reason=f"a PID namespace whose next pid is chosen needs root ({privileges()})",
)
def test_gc_leaves_a_live_sbxlimit_of_another_pid_namespace_alone():
    # An sbxlimit process in a PID namespace of its own, whose pid is free
    # here: asked by pid, it is gone, and `sbxlimit gc` took the cgroups
    # its supervisor made ahead (its next sandbox then failed).  Its owner
    # lock says it runs.
    with open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    free = next(n for n in range(pid_max - 1000, 300, -7) if not os.path.exists(f"/proc/{n}"))
    inside = f"echo {free - 1} > /proc/sys/kernel/ns_last_pid; {PY} -c '{_IN_ANOTHER_PID_NS}'"
    with subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", inside],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as p:
        try:
            assert p.stdout is not None and p.stdin is not None
            first = p.stdout.readline().split()
            assert first and int(first[0]) == free, first
            ready = first[1:]
            assert ready and not alive(free)  # gone, asked here
            subprocess.run([PY, "-m", "sbxlimit", "gc"], capture_output=True, check=True)
            assert all(os.path.isdir(d) for d in ready)
            p.stdin.close()
            rc, memory = p.stdout.readline().split()
            assert rc == "0" and memory.startswith("cgroup"), memory
            assert p.wait(timeout=30) == 0
        finally:
            if p.poll() is None:
                p.kill()
    assert not [d for d in ready if os.path.exists(d)]  # its exit removed them


_OWNER_LOCK_HELD_AGAINST_US = """
import fcntl, os, subprocess, sys, time, sbxlimit
from sbxlimit._cgroup import discover
from sbxlimit._owner import owner_path
from sbxlimit._monitor import get_monitor

# Another process of ours holds our owner cgroups' lock as we start: we go
# on without it (and the cgroups stay made).
hold = "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY)\\n"
hold += "fcntl.flock(fd, fcntl.LOCK_EX); print(flush=True); time.sleep(1)"
blockers = []
for _c, parent in discover().parents:
    os.mkdir(owner_path(parent, os.getpid()), 0o700)
    blockers.append(subprocess.Popen([sys.executable, "-c", hold, owner_path(parent, os.getpid())],
                                     stdout=subprocess.PIPE))
for b in blockers:
    b.stdout.readline()
lim = sbxlimit.Limits(memory="64Mi", wall_time=10)
assert sbxlimit.run(["true"], limits=lim).returncode == 0
for b in blockers:
    b.wait()
    b.stdout.close()
pool = get_monitor()._pool
deadline = time.monotonic() + 5
while not [d for d in pool.dirs() if os.path.isdir(d)] and time.monotonic() < deadline:
    time.sleep(0.01)
ready = sorted(d for d in pool.dirs() if os.path.isdir(d))
subprocess.run([sys.executable, "-m", "sbxlimit", "gc"], check=True, capture_output=True)
print(*ready, flush=True)
print(*[d for d in ready if not os.path.isdir(d)], flush=True)
r = sbxlimit.run(["true"], limits=lim)
print(r.returncode, r.enforced["memory"], flush=True)
"""


@needs_cgroup
def test_an_owner_lock_nobody_holds_does_not_give_away_a_live_owner_s_cgroups():
    # The owner could not take its lock (another process held it as it
    # started): the lock, free afterwards, says "gone", but its pid runs
    # here.  gc must keep its recent cgroups, or its next sandbox fails.
    r = subprocess.run(
        [PY, "-c", _OWNER_LOCK_HELD_AGAINST_US], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    ready, taken, last = [*r.stdout.split("\n"), "", "", ""][:3]
    assert ready.split() and taken.split() == []
    assert last.split()[0] == "0" and last.split()[1].startswith("cgroup"), last


@contextlib.contextmanager
def parent_of_our_own(memory: int | None = None):
    """A cgroup parent of our own, as an operator would delegate one (v1:
    the same relative path in every hierarchy); yields the path to pass as
    cgroup_parent, then the directories made.  `memory`: its own limit."""
    name = f"test-parent-{os.getpid()}"
    if SITE.version == 2:
        made = [os.path.join(v2_parent(), name)]
    else:
        made = [os.path.join(p, name) for p, k, o in mounts() if k == "cgroup" and "pids" in o]
        made += [os.path.join(p, name) for p, k, o in mounts() if k == "cgroup" and o & set(_V1)]
        made = list(dict.fromkeys(made))  # the pids hierarchy's first: it is the one passed
    for d in made:
        os.mkdir(d)
    try:
        if SITE.version == 2:
            with open(os.path.join(made[0], "cgroup.subtree_control"), "w") as f:
                f.write("+pids +memory")
        if memory is not None:
            v2 = SITE.version == 2
            mem = made[0] if v2 else next(d for d in made if os.path.exists(f"{d}/memory.stat"))
            with open(os.path.join(mem, "memory.max" if v2 else "memory.limit_in_bytes"), "w") as f:
                f.write(str(memory))
        yield made[0], made
    finally:
        get_monitor().drain(5)
        for d in made:
            os.rmdir(d)


@needs_cgroup
def test_explicit_parent():
    with parent_of_our_own() as (parent, made):
        p = sbxlimit.Popen(["sleep", "10"], limits=Limits(pids=8), cgroup_parent=parent)
        with p:
            try:
                dirs = set(p._sbx.cgroup.dirs.values())
                assert dirs and {os.path.dirname(d) for d in dirs} <= set(made)
                assert os.path.join(parent, f"sbx-{p.sandbox_id}") in dirs
                assert p.enforced["pids"] == f"{SITE.label}:pids.max"
            finally:
                p.kill_tree(grace=0)
        assert get_monitor().drain(5)
        assert not [n for d in made for n in os.listdir(d) if n.startswith("sbx-")]


# 160 MiB, touched page by page: past a 64 MiB parent, below the sandbox's 512.
_BIG = "x = bytearray(160 << 20); x[::4096] = b'a' * len(x[::4096])"
_CHILD_BIG = f"""
import subprocess, sys
r = subprocess.run([sys.executable, "-c", {_BIG!r}])
print("survived", r.returncode, flush=True)
"""


@needs_cgroup
@pytest.mark.parametrize("victim", ["the leader", "a child"])
def test_an_oom_kill_a_limit_above_the_sandbox_caused_is_not_its_memory_verdict(victim):
    # The kernel counts an OOM kill where its victim lived, whichever
    # limit ran out: here the parent's.  The sandbox stayed under its own
    # limit, so `memory` is no verdict of its; the message says who ran out.
    code = _BIG if victim == "the leader" else _CHILD_BIG
    with parent_of_our_own(memory=64 << 20) as (parent, _made):
        r = py(
            code,
            limits=Limits(memory="512Mi", wall_time=60),
            cgroup_parent=parent,
            capture_output=True,
            text=True,
        )
    t = r.termination
    assert "memory" not in t.hits and t.reason != "memory", t
    assert "ran out above the sandbox" in t.message and "512 MiB" in t.message, t
    if victim == "a child" and SITE.version == 1:
        # v1 kills the one process: the sandbox goes on, as its program chose.
        assert r.stdout == "survived -9\n" and t.reason == "exited" and r.returncode == 0, (t, r)
    else:  # v2 ends the whole sandbox (memory.oom.group), as the kernel chose
        assert t.reason == "signaled" and t.signal == signal.SIGKILL, t


@needs_cgroup
def test_the_sandbox_s_own_limit_under_a_limited_parent_is_its_memory_verdict():
    with parent_of_our_own(memory=64 << 20) as (parent, _made):
        r = py(_BIG, limits=Limits(memory="32Mi", wall_time=60), cgroup_parent=parent)
    t = r.termination
    assert t.reason == "memory" and t.limit == 32 << 20, t
    assert "above the sandbox" not in t.message, t


MOVE_SELF = """
    import os, sys, sbxlimit
    with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as f:
        f.write("0")  # start alone in a delegated cgroup, as under systemd
    p = sbxlimit.Popen(["true"], limits=sbxlimit.Limits(pids=8, memory="64Mi"))
    p.wait()
    print(p.enforced["pids"], p.enforced["memory"])
    print(open("/proc/self/cgroup").read().strip())
"""


@pytest.mark.skipif(SITE.version != 2, reason=f"cgroup v2 only (here: {SITE.label})")
def test_move_self_into_a_leaf_of_a_delegated_cgroup():
    # cgroup v2 allows no process in a cgroup whose controllers are enabled
    # for children: asked to (SBXLIMIT_CGROUP_MOVE_SELF=1), the supervisor
    # moves itself into a leaf and uses the cgroup it was given.
    deleg = os.path.join(v2_parent(), f"test-deleg-{os.getpid()}")
    os.mkdir(deleg)
    try:
        env = dict(os.environ, SBXLIMIT_CGROUP_MOVE_SELF="1")
        r = subprocess.run(
            [PY, "-c", textwrap.dedent(MOVE_SELF), deleg],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        enforced, own = r.stdout.splitlines()
        assert enforced == "cgroup2:pids.max cgroup2:memory.max"
        assert own.endswith(f"/test-deleg-{os.getpid()}/sbx-supervisor")
        with open(os.path.join(deleg, "cgroup.subtree_control")) as f:
            assert {"memory", "pids"} <= set(f.read().split())
    finally:
        leaf = os.path.join(deleg, "sbx-supervisor")
        for d in (leaf, deleg):
            if os.path.isdir(d):
                for _ in range(100):  # the helper's exit empties it
                    try:
                        os.rmdir(d)
                        break
                    except OSError:
                        time.sleep(0.01)


# -- without a usable cgroup ----------------------------------------------


def test_no_cgroup_degrades_and_says_why():
    with pytest.warns(RuntimeWarning, match="cpu is not enforced here"):
        r = py("pass", limits=Limits(memory="64Mi", pids=64, cpu="500m"), cgroup_parent="none")
    assert r.returncode == 0
    assert r.enforced["memory"].startswith("rlimit:RLIMIT_DATA")
    assert "cgroup" not in r.enforced["pids"]
    assert r.enforced["cpu"].startswith("unenforced: no cgroup can be used: cgroups turned off")


def test_strict_refuses_without_a_cgroup_and_names_the_fix():
    with pytest.raises(sbxlimit.UnsupportedError) as ei:
        sbxlimit.Popen(
            ["true"],
            limits=Limits(memory="64Mi"),
            policy=sbxlimit.Policy(strict=True, protect_dotfiles=False, workdir="/"),
            cgroup_parent="none",
        )
    assert "memory" in ei.value.items
    assert "cgroups turned off" in ei.value.items["memory"]


@pytest.mark.parametrize("bad", ["/nonexistent", "relative/path", "/proc"])
def test_a_cgroup_parent_that_cannot_be_used_is_an_error(bad):
    with pytest.raises(sbxlimit.ConfigError, match="cgroup_parent"):
        sbxlimit.Popen(["true"], limits=Limits(pids=8), cgroup_parent=bad)


def test_an_unusable_environment_parent_warns(monkeypatch):
    monkeypatch.setenv("SBXLIMIT_CGROUP_PARENT", "/nonexistent/cgroup")
    with pytest.warns(RuntimeWarning, match="SBXLIMIT_CGROUP_PARENT cannot be used"):
        r = py("pass", limits=Limits(pids=64))
    assert r.returncode == 0 and "cgroup" not in r.enforced["pids"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write the cgroup roots")
def test_unprivileged_without_delegation_degrades():
    if SITE.version:
        pytest.skip(f"this user has a delegated cgroup: {SITE.parents}")
    assert "memory" not in SITE.controllers
    assert SITE.reason  # says why, with the fix
    r = py("pass", limits=Limits(memory="64Mi", pids=64))
    assert r.enforced["memory"].startswith("rlimit:")
    with pytest.raises(sbxlimit.UnsupportedError) as ei:
        sbxlimit.Popen(
            ["true"],
            limits=Limits(memory="64Mi"),
            policy=sbxlimit.Policy(strict=True, protect_dotfiles=False, workdir="/"),
        )
    assert "no cgroup can be used" in ei.value.items["memory"]


@needs_cgroup
def test_grouping_cgroups_go_at_exit_and_come_back():
    groups = [p for _c, p in SITE.parents if os.path.basename(p) == "sbxlimit"]
    if not groups:
        pytest.skip(f"this site has no sbxlimit grouping cgroup: {SITE.parents}")
    assert get_monitor().drain(5)
    from sbxlimit import _owner

    _owner.release_all()  # as at our own exit: we hold nothing there now
    # The other process removes them at its exit if they are empty; another
    # test worker's sandbox (or the cgroups its supervisor keeps ready, for
    # up to _cgpool.IDLE) may hold them at that moment: try again.
    from sbxlimit._cgpool import IDLE

    deadline = time.monotonic() + IDLE + 5
    while True:
        subprocess.run(
            [PY, "-c", "import sbxlimit; sbxlimit.run(['true'], limits={'pids': 8})"],
            check=True,
            timeout=60,
        )
        if not any(os.path.exists(g) for g in groups) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    # The other process removed them, empty, at its exit ...
    assert [g for g in groups if os.path.exists(g)] == []
    # ... and the next sandbox here makes them again.
    r = py("pass", limits=Limits(pids=8))
    assert r.returncode == 0 and r.enforced["pids"] == f"{SITE.label}:pids.max"


@needs_cgroup
def test_create_falls_back_step_by_step_and_leaves_nothing():
    # The one-call way (_core.fs_batch) stops at a directory left with our
    # name (an earlier process that had our pid): nothing it made stays,
    # and the step-by-step way replaces the stale one.
    from sbxlimit._cgroup import Cgroup

    if SITE.version == 2:
        settings = (("", "memory.max", "67108864"),)
    else:
        settings = (("memory", "memory.limit_in_bytes", "67108864"),)
    from sbxlimit._gc import AUTO_MIN_AGE

    name = f"sbx-{os.getpid():x}-stale-{time.monotonic_ns()}"
    left = os.path.join(dict(SITE.parents)[settings[0][0]], name)
    os.mkdir(left)
    # A recent one may be a live process's with our pid in another PID
    # namespace: left alone, the name refused (the caller takes another).
    with pytest.raises(FileExistsError):
        Cgroup.create(SITE, name, settings)
    assert os.path.isdir(left)
    made = [p for _c, p in SITE.parents if os.path.exists(os.path.join(p, name))]
    assert made == [os.path.dirname(left)]
    old = time.time() - AUTO_MIN_AGE - 60
    os.utime(left, (old, old))  # an old one is stale
    cg = Cgroup.create(SITE, name, settings)
    try:
        assert cg.dirs and all(os.path.isdir(d) for d in cg.dirs.values())
        ctrl, fname, _v = settings[0]
        with open(os.path.join(cg.dirs[ctrl], fname)) as f:
            assert int(f.read()) == 64 << 20
    finally:
        assert cg.remove()
    assert not any(os.path.exists(os.path.join(p, name)) for _c, p in SITE.parents)


@needs_cgroup
def test_a_spawn_whose_cgroup_name_is_taken_recently_takes_another(monkeypatch):
    # The name's owner may be a live process with our pid in another PID
    # namespace: its cgroup stays, the sandbox gets another id.
    from sbxlimit import _sandbox

    stamp = time.monotonic_ns()
    taken = [f"{os.getpid():x}-taken{stamp}{i}" for i in range(3)]  # a few in a row
    ids = iter(taken)
    real = _sandbox._new_id
    monkeypatch.setattr(_sandbox, "_new_id", lambda: next(ids, None) or real())
    monkeypatch.setattr(get_monitor(), "take_cgroup", lambda *a: None)  # made in the spawn
    others = [os.path.join(SITE.parents[0][1], f"sbx-{t}") for t in taken]
    for other in others:
        os.mkdir(other)
    try:
        with sbxlimit.Popen(["true"], limits=Limits(memory="64Mi")) as p:
            assert p.wait() == 0
            assert p.sandbox_id not in taken and p.enforced["memory"].startswith("cgroup")
        assert all(os.path.isdir(other) for other in others)
    finally:
        for other in others:
            os.rmdir(other)


@needs_cgroup
def test_a_refused_setting_leaves_no_directory():
    from sbxlimit._cgroup import Cgroup

    key = "" if SITE.version == 2 else "memory"
    fname = "memory.max" if SITE.version == 2 else "memory.limit_in_bytes"
    name = f"sbx-{os.getpid():x}-refused-{time.monotonic_ns()}"
    with pytest.raises(OSError, match=f"cannot set {fname}=lots"):
        Cgroup.create(SITE, name, ((key, fname, "lots"),))
    assert not any(os.path.exists(os.path.join(p, name)) for _c, p in SITE.parents)


def _armed_pool_for(limits: Limits) -> None:
    """Spawn once with `limits` (the supervisor then makes cgroups of that
    kind ahead) and wait until one is ready and armed."""
    from sbxlimit import _plan

    sbxlimit.run(["true"], limits=limits)
    settings = _plan.plan(limits, None, uid=os.geteuid(), site=SITE).cgroup_settings
    pool = get_monitor()._pool
    deadline = time.monotonic() + 10
    while not pool.has_ready(SITE, settings):
        assert time.monotonic() < deadline, "no cgroup was made ahead"
        time.sleep(0.01)
    with pool._lock:
        (ready, *_rest) = pool._ready[(SITE, settings)]
    assert ready.ready_procs and len(ready.ready_procs) == len(ready.dirs)
    assert "memory" in ready.armed


@needs_cgroup
def test_the_pool_is_refilled_while_the_sandbox_that_took_from_it_runs(monkeypatch):
    # The take does not wake the supervisor (the refill would compete with
    # the spawn); the spawn's end does, so the refill is under way while
    # the child runs, even when the supervisor had nothing else to do.
    from sbxlimit import _cgpool, _monitor, _plan

    limits = Limits(cpu="0.7")  # nothing for the supervisor to watch
    sbxlimit.run(["true"], limits=limits)  # the supervisor makes this kind ahead from now on
    settings = _plan.plan(limits, None, uid=os.geteuid(), site=SITE).cgroup_settings
    pool = get_monitor()._pool
    deadline = time.monotonic() + 10
    while len(pool._ready.get((SITE, settings), ())) < _cgpool.SIZE:
        assert time.monotonic() < deadline, "the pool never filled"
        time.sleep(0.01)
    monkeypatch.setattr(_monitor, "_LINGER", 0.2)
    time.sleep(0.5)  # the supervisor goes to sleep: nothing is due
    with sbxlimit.Popen(["sleep", "5"], limits=limits) as p:
        deadline = time.monotonic() + 2
        while len(pool._ready.get((SITE, settings), ())) < _cgpool.SIZE:
            assert time.monotonic() < deadline, "not refilled while the sandbox ran"
            time.sleep(0.01)
        assert p._sbx.watch is None and p.poll() is None
        p.kill_tree(grace=0)


@needs_cgroup
def test_a_kind_whose_spawns_outran_the_pool_is_kept_deeper():
    # Back to back, spawns took a kind's two ready cgroups faster than the
    # supervisor made them (a quarter of the spawns made their own): a kind
    # that found none ready is kept one deeper, up to MOST.  Its first
    # spawn, which finds none because none was asked for yet, is no sign.
    import itertools

    from sbxlimit import _cgpool, _plan

    settings = _plan.plan(Limits(pids=23), None, uid=os.geteuid(), site=SITE).cgroup_settings
    seq = itertools.count()

    def name() -> str:
        return f"{os.getpid():x}-deeper-{next(seq)}"

    pool = _cgpool.Pool()
    taken = []

    def filled() -> int:
        while pool.wanted():
            pool.work(time.monotonic())
        return len(pool._ready.get((SITE, settings), ()))

    def burst() -> None:  # takes all that is ready, and finds none once more
        while True:
            cg, _left = pool.take(SITE, settings, name)
            if cg is None:
                return
            taken.append(cg)

    try:
        assert pool.take(SITE, settings, name) == (None, 0)  # the kind's first spawn
        depths = [filled()]
        for _ in range(3):
            burst()
            depths.append(filled())
        assert depths == [_cgpool.SIZE, 3, 4, _cgpool.MOST]
    finally:
        pool.drain(close=True)
        for cg in taken:
            cg.remove()
    assert not [cg for cg in taken if any(os.path.exists(d) for d in cg.dirs.values())]


@needs_cgroup
def test_a_cgroup_armed_ahead_reports_an_oom_kill():
    # A cgroup the supervisor made ahead comes with its join files and its
    # OOM event already open: the sandbox that takes it is still ended by
    # the first OOM kill (a helper that survives it included), at once.
    limits = Limits(memory="32Mi", wall_time="50s")
    _armed_pool_for(limits)
    code = TREE_HOG
    t0 = time.monotonic()
    with sbxlimit.Popen(
        [PY, "-c", textwrap.dedent(code)], limits=limits, stdout=subprocess.PIPE, text=True
    ) as p:
        assert p._sbx.cgroup is not None and p._sbx.cgroup.armed  # the one made ahead
        out = p.stdout.read()
        p.wait()
    assert p.termination.reason == "memory", p.termination
    assert time.monotonic() - t0 < 30
    assert not wait_gone([int(out.split()[0])])


@needs_cgroup
def test_a_cgroup_armed_ahead_comes_with_its_counters_read(monkeypatch):
    # The counter files no event covers (v1's pids.events) are read by the
    # supervisor while the cgroup it made ahead is still empty: the
    # registration reads none on the caller's path, and a fork refused
    # before the supervisor's first sample is still the verdict.
    import threading

    from sbxlimit import _monitor

    limits = Limits(memory="256Mi", pids=8, wall_time="50s")
    _armed_pool_for(limits)
    read = _monitor.read_quiet
    by_caller: list[str] = []

    def watched(path: str) -> bytes:
        if threading.current_thread() is threading.main_thread():
            by_caller.append(path)
        return read(path)

    monkeypatch.setattr(_monitor, "read_quiet", watched)
    code = FORKS.replace("sys.exit(3 if len(kids) < 100 else 0)", "sys.exit(0)")
    with sbxlimit.Popen([PY, "-c", textwrap.dedent(code)], limits=limits) as p:
        cg = p._sbx.cgroup
        assert cg is not None and cg.ready_procs == []
        assert by_caller == []
        p.wait()
    assert p.termination.reason == "pids", p.termination


def _final_reads(monkeypatch) -> dict[str, list[str]]:
    """The threads that read each cgroup's final figures, as they do."""
    import collections
    import threading

    from sbxlimit._cgroup import Cgroup

    readers: dict[str, list[str]] = collections.defaultdict(list)
    real = Cgroup.stats

    def stats(self, *, final=False, **kw):
        if final:
            readers[self.name].append(threading.current_thread().name)
        return real(self, final=final, **kw)

    monkeypatch.setattr(Cgroup, "stats", stats)
    return readers


@needs_cgroup
def test_the_final_figures_are_read_by_the_supervisor_off_the_caller_s_path(monkeypatch):
    # At the exit the caller reads the process list (is anything left?)
    # and nothing else: the final figures are read by the supervisor
    # before it removes the cgroup, and the verdict, asked for later, is
    # made from them.
    reads = _final_reads(monkeypatch)
    limits = Limits(pids=8, wall_time="50s")
    r = sbxlimit.run([PY, "-c", textwrap.dedent(FORKS)], limits=limits)
    readers = reads[f"sbx-{r.sandbox_id}"]
    assert "MainThread" not in readers
    deadline = time.monotonic() + 5
    while not readers and time.monotonic() < deadline:
        time.sleep(0.005)  # the supervisor, woken by the retirement
    assert readers == ["sbxlimit-monitor"]
    assert r.termination.reason == "pids", r.termination
    assert r.usage.pids_peak == 8 and r.usage.cpu_total is not None
    assert readers == ["sbxlimit-monitor"]  # read once
    assert get_monitor().drain(5) and mine() == []


@needs_cgroup
def test_a_caller_who_asks_first_reads_the_final_figures_itself(monkeypatch):
    # The supervisor is held before it gets to the cgroup: the caller who
    # asks reads the figures (once) and the supervisor, let go, removes
    # the cgroup without reading them again.
    import threading

    from sbxlimit import _monitor

    reads = _final_reads(monkeypatch)
    go = threading.Event()
    real = _monitor.Monitor._retire_tick

    def held(self, now):
        go.wait(10)
        return real(self, now)

    monkeypatch.setattr(_monitor.Monitor, "_retire_tick", held)
    limits = Limits(pids=8, wall_time="50s")
    r = sbxlimit.run([PY, "-c", textwrap.dedent(FORKS)], limits=limits)
    readers = reads[f"sbx-{r.sandbox_id}"]
    assert r.termination.reason == "pids", r.termination
    assert r.usage.pids_peak == 8
    assert readers == ["MainThread"]
    go.set()
    assert get_monitor().drain(5)
    assert readers == ["MainThread"]
    assert mine() == []


@needs_cgroup
def test_the_final_figures_reach_a_child_forked_before_anyone_asked():
    # A fork right after run(), before the supervisor read the figures:
    # the child (a multiprocessing worker, say) gets the verdict and the
    # figures of the sandbox, not those of what its parent already removed.
    code = "open('f', 'wb').write(b'x' * 300000)\n" + textwrap.dedent(FORKS)
    r = sbxlimit.run(
        [PY, "-c", code],
        policy=Policy(protect_dotfiles=False),
        limits=Limits(pids=8, wall_time="20s"),
    )
    pid = os.fork()
    if pid == 0:
        time.sleep(0.3)  # the parent's supervisor removes the cgroup and workspace meanwhile
        ok = r.termination.reason == "pids" and r.usage.pids_peak == 8
        os._exit(0 if ok and r.usage.disk >= 300000 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert r.termination.reason == "pids" and r.usage.disk >= 300000


@needs_cgroup
def test_a_spawn_does_not_wait_for_the_supervisor_removing_a_cgroup(monkeypatch):
    # The supervisor reads an ended sandbox's figures and removes its
    # cgroup (rmdirs: a few hundred µs, more on a busy machine) without the
    # lock a spawn takes: held there, it keeps no other sandbox waiting.
    import threading

    from sbxlimit._cgroup import Cgroup

    entered, release = threading.Event(), threading.Event()
    real = Cgroup.remove

    def remove(self):
        if threading.current_thread().name == "sbxlimit-monitor" and not release.is_set():
            entered.set()
            release.wait(20)
        return real(self)

    monkeypatch.setattr(Cgroup, "remove", remove)
    limits = Limits(memory="256Mi", pids=16, wall_time="30s")
    try:
        sbxlimit.run(["true"], limits=limits)
        assert entered.wait(10), "the supervisor never removed the cgroup"
        results: list[object] = []
        other = threading.Thread(
            target=lambda: results.append(sbxlimit.run(["true"], limits=limits))
        )
        other.start()
        other.join(10)
        assert results, "a spawn waited for the supervisor's removal"
        assert not release.is_set()
    finally:
        release.set()
    assert get_monitor().drain(5) and mine() == []


@needs_cgroup
def test_final_figures_that_fail_to_read_do_not_keep_the_cgroup(monkeypatch, caplog):
    # A bug in reading the final figures (here: the parse raises) must not
    # keep the supervisor from removing the cgroup: the figures are
    # missing (logged), the verdict is still made, nothing is left.
    from sbxlimit._cgroup import Cgroup

    real = Cgroup.stats

    def stats(self, *, final=False, **kw):
        if final:
            raise RuntimeError("a parse that went wrong")
        return real(self, final=final, **kw)

    monkeypatch.setattr(Cgroup, "stats", stats)
    r = sbxlimit.run(["true"], limits=Limits(pids=8))
    assert get_monitor().drain(5) and mine() == []
    assert r.termination.reason == "exited" and r.usage.pids_peak is None
    assert "final figure could not be read" in caplog.text


def _open_in_a_fork() -> list[str]:
    """What a child made by os.fork() has open (the at-fork handlers ran)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            names = []
            for fd in os.listdir("/proc/self/fd"):
                try:
                    names.append(os.readlink(f"/proc/self/fd/{fd}"))
                except OSError:
                    pass
            os.write(w, "\n".join(names).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        names = f.read().split("\n")
    os.waitpid(pid, 0)
    return names


def _forked_while_held(monkeypatch, method: str, limits: Limits, inside=None) -> list[str]:
    """What a child made by os.fork() has open when the supervisor, after
    a sandbox of `limits`' kind, is held in Cgroup.`method` (having called
    `inside(cgroup)` there first: it returns what undoes it)."""
    import threading

    from sbxlimit._cgroup import Cgroup

    entered, forked = threading.Event(), threading.Event()
    real = getattr(Cgroup, method)

    def held(self, *args, **kw):
        if threading.current_thread().name == "sbxlimit-monitor" and not entered.is_set():
            undo = inside(self) if inside is not None else None
            entered.set()
            forked.wait(10)
            if undo is not None:
                undo()
        return real(self, *args, **kw)

    get_monitor().drain(5)  # before: an earlier test's kind is no longer made
    monkeypatch.setattr(Cgroup, method, held)
    try:
        sbxlimit.run(["true"], limits=limits)  # this kind is made ahead from now on
        assert entered.wait(10), "no cgroup was made ahead"
        return _open_in_a_fork()
    finally:
        forked.set()


@needs_cgroup
def test_a_fork_while_a_cgroup_is_made_ahead_closes_its_files_too(monkeypatch):
    # Forked while the supervisor arms a cgroup, right after the core call
    # that opened its join files and counters, before any is recorded: the
    # child closes what is open of it all the same.
    names = _forked_while_held(monkeypatch, "_events_opened", Limits(pids=21))
    assert [n for n in names if n.startswith("/sys/fs/cgroup/") and "/sbx-" in n] == []


@needs_cgroup
def test_a_fork_while_the_supervisor_reads_a_cgroup_file_closes_it(monkeypatch):
    # Forked while the supervisor has a file of a cgroup open for a moment
    # (a read in a core call, its fd known to nobody: here the final
    # figures of the sandbox that ended, read before its removal): the
    # child closes it all the same.
    seen: list[str] = []

    def open_one(cg) -> Callable[[], None]:
        path = os.path.join(next(iter(cg.dirs.values())), "cgroup.procs")
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        seen.append(path)
        return lambda: os.close(fd)

    names = _forked_while_held(monkeypatch, "_read_all", Limits(pids=23), open_one)
    assert seen[0] not in names


@needs_cgroup
def test_a_fork_closes_the_cgroups_made_ahead():
    # A forked child (a ForkedSandbox's body, the pytest marker's test) has
    # a supervisor of its own: the parent's ready cgroups' files are closed.
    _armed_pool_for(Limits(memory="64Mi", pids=32))
    names = _open_in_a_fork()
    leaked = [n for n in names if n.startswith("/sys/fs/cgroup/") or "eventfd" in n]
    assert leaked == []


@needs_cgroup
@pytest.mark.skipif(SITE.version != 1, reason="cgroup v1's OOM eventfd (v2 polls memory.events)")
def test_a_fork_waits_for_the_oom_eventfd_to_be_recorded(monkeypatch):
    # An eventfd is no file of a cgroup directory: a fork between its
    # creation and its record would leave the child a copy nobody closes.
    # The fork waits for that moment to pass (here made to last 0.5 s).
    import threading

    from sbxlimit import _cgroup

    made, forked = threading.Event(), threading.Event()
    real = os.eventfd

    def slow(*args):
        fd = real(*args)
        if threading.current_thread().name == "sbxlimit-monitor" and not made.is_set():
            made.set()
            forked.wait(0.5)  # past it, the record goes on: the fork waited
        return fd

    get_monitor().drain(5)  # before: an earlier test's kind is no longer made
    monkeypatch.setattr(_cgroup.os, "eventfd", slow)
    try:
        sbxlimit.run(["true"], limits=Limits(memory="96Mi"))  # made ahead from now on
        assert made.wait(10), "no cgroup was made ahead"
        names = _open_in_a_fork()
    finally:
        forked.set()
    assert "anon_inode:[eventfd]" not in names


@needs_cgroup
@pytest.mark.skipif(SITE.version != 1, reason="cgroup v1's OOM eventfd (v2 polls memory.events)")
def test_a_fork_waits_for_a_forgotten_eventfd_to_be_closed(monkeypatch):
    # A cgroup forgets its fds, then closes them in a core call that lets
    # the caller's thread run; a fork in between would leave its child an
    # eventfd nobody lists.  The fork waits (here 0.5 s) for the close.
    import threading

    from sbxlimit import _cgroup

    closing, forked = threading.Event(), threading.Event()
    real = _cgroup._close_all

    def slow(fds: list[int]) -> None:
        if threading.current_thread().name == "sbxlimit-monitor" and not closing.is_set():
            what = []
            for fd in fds:
                try:
                    what.append(os.readlink(f"/proc/self/fd/{fd}"))
                except OSError:
                    pass
            if "anon_inode:[eventfd]" in what:
                closing.set()
                forked.wait(0.5)
        real(fds)

    get_monitor().drain(5)
    monkeypatch.setattr(_cgroup, "_close_all", slow)
    try:
        sbxlimit.run(["true"], limits=Limits(memory="96Mi"))  # its cgroup retires
        assert closing.wait(10), "no eventfd was closed"
        names = _open_in_a_fork()
    finally:
        forked.set()
        monkeypatch.undo()
    assert "anon_inode:[eventfd]" not in names


@needs_cgroup
def test_a_fork_while_the_supervisor_holds_the_pool_s_lock_does_not_hang(monkeypatch):
    # The child closes what the pool holds without taking its lock: the
    # parent's thread may have held it at the fork, and it is not there.
    import select
    import signal
    import threading

    from sbxlimit import _cgpool

    inside, forked = threading.Event(), threading.Event()
    real = _cgpool.Pool._recent

    def held(self):
        if threading.current_thread().name == "sbxlimit-monitor" and not inside.is_set():
            inside.set()
            forked.wait(10)
        return real(self)

    sbxlimit.run(["true"], limits=Limits(pids=27))  # the supervisor now keeps this kind
    monkeypatch.setattr(_cgpool.Pool, "_recent", held)
    try:
        get_monitor()._wake()
        assert inside.wait(10), "the supervisor never looked at its pool"
        assert get_monitor()._pool._lock.locked()
        pid = os.fork()
        if pid == 0:
            os._exit(0)  # the at-fork handlers have run
        deadline = time.monotonic() + 5
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail("the forked child hung in its at-fork handlers")
            select.select([], [], [], 0.01)
    finally:
        forked.set()


def _freezes_slowly_for_the_supervisor(monkeypatch) -> tuple[Any, Any]:
    """v1 only: the supervisor's first read of a freezer's state says
    FREEZING for 3 s (a freeze that does not complete: a process asleep in
    the kernel, uninterruptibly).  Returns (held_out: set if that wait ran
    its 3 s, release: ends it)."""
    import threading

    from sbxlimit import _cgroup

    if SITE.version != 1 or not SITE.has("pids"):
        pytest.skip("cgroup v1 only (v2 kills through cgroup.kill, without the freezer)")
    real_read = _cgroup._read
    held_out, release = threading.Event(), threading.Event()

    def read(path):
        on_thread = threading.current_thread().name == "sbxlimit-monitor"
        ours = on_thread and path.endswith("freezer.state") and not held_out.is_set()
        if ours and not release.wait(3):
            held_out.set()  # then it freezes (the test ends sooner)
            return "FREEZING\n"
        return real_read(path)

    monkeypatch.setattr(_cgroup, "_read", read)
    return held_out, release


@needs_cgroup
def test_a_cgroup_that_will_not_freeze_does_not_keep_the_supervisor(monkeypatch):
    # v1: an ended sandbox's cgroup that will not empty (a process asleep
    # in the kernel, uninterruptibly: it neither freezes nor dies) is killed
    # again at each of the supervisor's ticks until it empties.  Waiting
    # there for a freeze that never completes kept the supervisor, and with
    # it every other sandbox's timers, for seconds at each tick: another
    # sandbox's wall_time must still end it meanwhile.
    from sbxlimit import _cgroup
    from sbxlimit._monitor import Monitor

    held_out, release = _freezes_slowly_for_the_supervisor(monkeypatch)
    stuck: list[_cgroup.Cgroup] = []
    real_retire = Monitor.retire
    real_remove, real_pids = _cgroup.Cgroup.remove, _cgroup.Cgroup.pids

    def is_stuck(cg):
        return bool(stuck) and cg is stuck[0] and not release.is_set()

    def retire(self, cg):
        if not stuck:  # the first sandbox's
            stuck.append(cg)
        return real_retire(self, cg)

    def remove(self):
        return False if is_stuck(self) else real_remove(self)

    def pids(self):
        # Above pid_max: never a process, and listed all the same.
        return [(1 << 22) + 1] if is_stuck(self) else real_pids(self)

    monkeypatch.setattr(Monitor, "retire", retire)
    monkeypatch.setattr(_cgroup.Cgroup, "remove", remove)
    monkeypatch.setattr(_cgroup.Cgroup, "pids", pids)
    try:
        sbxlimit.run(["true"], limits=Limits(pids=8))
        assert stuck
        time.sleep(0.1)  # a few of the supervisor's ticks at it
        other = sbxlimit.run(["sleep", "30"], limits=Limits(wall_time="0.3s"), cgroup_parent="none")
        assert other.termination.reason == "wall_time"
        assert not held_out.is_set(), "the other sandbox was ended only after a freeze wait"
    finally:
        release.set()  # it is empty: removed at the next tick
    assert get_monitor().drain(5) and mine() == []


@needs_cgroup
def test_a_limit_kill_does_not_wait_on_a_freeze_in_the_supervisor(monkeypatch):
    # The supervisor's own kill at a limit (here a wall_time, no grace)
    # must not wait for a v1 freeze either: another sandbox's wall_time
    # must still end it meanwhile.
    held_out, release = _freezes_slowly_for_the_supervisor(monkeypatch)
    killed = sbxlimit.Popen(["sleep", "30"], limits=Limits(pids=8, wall_time=0.2, kill_grace=0))
    try:
        other = sbxlimit.run(["sleep", "30"], limits=Limits(wall_time="0.6s"), cgroup_parent="none")
        assert other.termination.reason == "wall_time"
        assert not held_out.is_set(), "the other sandbox was ended only after a freeze wait"
        killed.wait(timeout=20)
        assert killed.termination.reason == "wall_time"
    finally:
        release.set()
        killed.kill_tree(grace=0)
    assert get_monitor().drain(5) and mine() == []


@needs_cgroup
def test_a_pids_limit_past_the_kernels_bound_runs():
    # Limits accepts counts up to 2**62; pids.max refuses one past
    # PID_MAX_LIMIT, which no sandbox can reach anyway.
    r = py("pass", limits=Limits(pids=2**23))
    assert r.returncode == 0 and r.termination.reason == "exited"


@pytest.mark.skipif(SITE.version != 1, reason="v1's task count (v2 writes cgroup.kill)")
def test_a_number_closed_and_given_again_is_not_claimed_by_the_cgroup(monkeypatch):
    # A close lets another thread run (the core call releases the GIL): one
    # that opens a file gets the number just closed, and a fork then would
    # close that file in its child if the cgroup still listed the number
    # as its own.
    cg = Cgroup.create(SITE, f"sbx-{os.getpid():x}-reuse", ())
    cg.arm(())
    assert cg.count_fd >= 0
    import sbxlimit._cgroup as cgmod

    real_close_all = cgmod._close_all
    claimed: list[int] = []
    closed: list[int] = []

    def close_then_reuse(fds: list[int]) -> None:
        real_close_all(fds)
        for fd in fds:
            other = os.open(os.devnull, os.O_RDONLY)  # the same number, most likely
            try:
                closed.append(fd)
                if other == fd and fd in cg.owned_fds():
                    claimed.append(fd)
            finally:
                os.close(other)

    monkeypatch.setattr(cgmod, "_close_all", close_then_reuse)
    try:
        cg.remove()
    finally:
        monkeypatch.setattr(cgmod, "_close_all", real_close_all)
        cg.kill()
        cg.remove()
    assert closed and claimed == []


# Run in a process of its own: the suite's background threads (the
# supervisor, the janitor) open and close fds, and one closed under the
# budget after the filling would be a legitimate place to arm.  The
# script lists fds with conftest's _fds, whose source goes before it.
_ARM_PAST_THE_BUDGET = """
import os, resource
from sbxlimit._cgroup import Cgroup, discover

def eventfds():
    return {fd for fd, t in _fds().items() if t == "anon_inode:[eventfd]"}

cg = Cgroup.create(discover(), f"sbx-{os.getpid():x}-budget", ())
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
fillers = []
try:
    while True:  # the next fd numbers are all past the budget
        low = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        if low >= (low + 16) * 3 // 4:
            os.close(low)
            break
        fillers.append(low)
    before = eventfds()
    resource.setrlimit(resource.RLIMIT_NOFILE, (low + 16, hard))
    try:
        cg.arm(["memory", "pids"])
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    dirs = set(cg.dirs.values())
    print(repr((cg.ready_procs, cg.count_fd, cg.events,
                [t for t in _fds().values() if os.path.dirname(t) in dirs],
                sorted(eventfds() - before))))
finally:
    for fd in fillers:
        os.close(fd)
    cg.remove()
"""


@needs_cgroup
def test_a_cgroup_armed_past_the_fd_budget_keeps_nothing_and_leaks_nothing():
    # The last quarter of the fd table is the caller's: arming there opens
    # (in one core call) and closes again everything, events included.
    script = inspect.getsource(_fds) + _ARM_PAST_THE_BUDGET
    r = subprocess.run([PY, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == repr(([], -1, [], [], []))


@needs_cgroup
def test_a_join_file_that_cannot_be_opened_is_named_and_the_others_closed():
    # The spawn's own join files (no cgroup armed ahead) are opened in one
    # core call: a failure names the file (the spawn's "cgroup:create"
    # error) and leaves none of the others open.
    cg = Cgroup.create(SITE, f"sbx-{os.getpid():x}-join", ())
    try:
        last = list(cg.dirs.values())[-1]
        os.rmdir(last)
        with pytest.raises(FileNotFoundError) as err:
            cg.procs_fds()
        assert err.value.filename == cg._join_files()[-1]
        dirs = set(cg.dirs.values())
        assert [t for t in _fds().values() if os.path.dirname(t) in dirs] == []
    finally:
        cg.remove()


def _open_eventfds() -> set[int]:
    return {fd for fd, t in _fds().items() if t == "anon_inode:[eventfd]"}


# Figures as the kernel printed them at a cpu_time verdict (cgroup v2 in the
# UML guest): user_usec + system_usec fell a microsecond short of
# usage_usec, the figure the verdict read.
_CPU_STAT_V2 = "usage_usec 2000000\nuser_usec 1988461\nsystem_usec 11538\n"


@pytest.mark.parametrize("version", [2, 1])
def test_usage_cpu_total_is_the_precise_total_the_verdict_reads(version: int) -> None:
    """A sandbox ended for cpu_time=2 must not report 1.999999 s used: the
    user/system split is coarser than the total (v2 rounds each part, v1
    counts ticks), so the parts are scaled to the total."""
    files = {
        ("cpu", "cpu.stat"): _CPU_STAT_V2,
        # v1: 199 + 0 ticks at USER_HZ against a nanosecond total
        ("cpuacct", "cpuacct.stat"): f"user {2 * os.sysconf('SC_CLK_TCK') - 1}\nsystem 1\n",
        ("cpuacct", "cpuacct.usage"): "2000000000\n",
    }
    cg = Cgroup(Site(version=version), "parsed")
    s = cg.stats(final=True, evidence=False, get=lambda c, f: files.get((c, f), ""))
    assert s.cpu_user is not None and s.cpu_system is not None
    assert s.cpu_user + s.cpu_system >= 2
    assert s.cpu_user + s.cpu_system == pytest.approx(2)
    assert s.cpu_system < s.cpu_user  # the split is kept
