"""Only what is ours is ended.

A sandbox's pid and process group are signalled only by the process that
started it, and only until its leader is reaped: after that the kernel may
give the same numbers to anyone.  Each scenario runs in a Python process of
its own (it forks, ignores SIGCHLD, or hands a freed pid to a bystander).
The freed pid is handed over at once by writing the kernel's next pid
(``/proc/sys/kernel/ns_last_pid``, root); in real use the reuse is a race.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from .conftest import can_choose_the_next_pid, privileges

PY = sys.executable

# Hands `pid` to a bystander: a session leader with a child, not ours to
# end.  The scenarios print what happened to it.
_TAKE_PID = """
import os, subprocess, time

def take_pid(pid):
    # A bystander at exactly `pid`: it leads a session of its own, has a
    # child, and is not ours (made by a middle process that exits at once,
    # which sets the next pid itself: a thread of ours may hold pid - 1).
    for _ in range(50):
        r, w = os.pipe()
        mid = os.fork()
        if mid == 0:
            try:
                os.close(r)
                with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                    f.write(str(pid - 1))
                final = os.fork()
                if final == 0:
                    os.setsid()
                    null = os.open(os.devnull, os.O_RDWR)
                    for fd in (0, 1, 2):
                        os.dup2(null, fd)
                    os.execvp("sh", ["sh", "-c", "sleep 30 & wait"])
                os.write(w, str(final).encode())
            finally:
                os._exit(0)
        os.close(w)
        got = int(os.read(r, 32) or b"0")
        os.close(r)
        os.waitpid(mid, 0)
        if got == pid:
            for _ in range(400):  # until it leads its session, with its child
                try:
                    with open(f"/proc/{got}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[2]) == got:
                            break
                except OSError:
                    pass
                time.sleep(0.005)
            time.sleep(0.05)
            return got
        if got:
            time.sleep(0.05)
            os.killpg(got, 9)
    raise SystemExit("could not take the pid")

def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

def bystander_alive(pid):
    there = alive(pid)
    if there:
        os.killpg(pid, 9)
    return there
"""


needs_next_pid = pytest.mark.skipif(
    not can_choose_the_next_pid(),
    reason=f"choosing the next pid needs CAP_SYS_ADMIN ({privileges()})",
)


def _run(code: str, *args: str) -> list[str]:
    r = subprocess.run(
        [PY, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


@needs_next_pid
def test_kill_tree_in_another_thread_during_the_reap_signals_nothing():
    # wait() in one thread reaps the leader, then spends a while on the rest
    # of the reap (its disk: a workdir of many files) holding the wait
    # lock; kill_tree() in another thread sees poll() say "running" (the
    # lock is busy).  It must not signal the freed pid and group.
    code = (
        _TAKE_PID
        + """
import sys, threading
import sbxlimit
wd = sys.argv[1]
for d in range(20):
    os.makedirs(f"{wd}/d{d}")
    for i in range(2000):
        open(f"{wd}/d{d}/f{i}", "w").close()
p = sbxlimit.Popen(["sleep", "0.3"], limits=sbxlimit.Limits(disk="10Gi", wall_time=30),
                   policy=sbxlimit.Policy(workdir=wd))
pid = p.pid
threading.Thread(target=p.wait).start()
while os.path.exists(f"/proc/{pid}"):  # reaped by the waiting thread
    time.sleep(0.001)
busy = p.returncode is None  # the reap is still going on
victim = take_pid(pid)
p.kill_tree(grace=0)
time.sleep(0.1)
print(busy, bystander_alive(victim), p._sbx.killed_by_caller)
"""
    )
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        # On a tmpfs of its own where one can be mounted: ext4 without a
        # journal makes each of these files slowly once many were freed
        # recently (doctor's tmpdir row).
        mounted = subprocess.run(["mount", "-t", "tmpfs", "tmpfs", tmp]).returncode == 0
        try:
            busy, alive, killed = _run(code, os.path.join(tmp, "wd"))
        finally:
            if mounted:
                subprocess.run(["umount", tmp], check=True)
    if busy != "True":
        pytest.skip("the reap ended before kill_tree() came: no window to test")
    assert alive == "True" and killed == "False"


@needs_next_pid
@pytest.mark.parametrize("how", ["ignored", "handler"])
def test_a_leader_reaped_elsewhere_leaves_its_group_id_alone(how):
    # SIGCHLD ignored, or a handler's waitpid(-1): the kernel or the handler
    # reaps the leader and frees its group id.  wait() then finds no child;
    # as subprocess, it says 0, and signals no group that now has the id.
    code = (
        _TAKE_PID
        + """
import signal, sys
import sbxlimit
if sys.argv[1] == "ignored":
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
else:
    def reap(*_):
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
    signal.signal(signal.SIGCHLD, reap)
p = sbxlimit.Popen(["true"], limits=sbxlimit.Limits(wall_time=30), cgroup_parent="none")
pgid = p._sbx.tree_pgid
while os.path.exists(f"/proc/{p.pid}"):
    time.sleep(0.01)
signal.signal(signal.SIGCHLD, signal.SIG_DFL)
victim = take_pid(pgid)  # leads a session, so a group, with the freed id
time.sleep(0.1)
rc = p.wait()
time.sleep(0.1)
print(pgid > 0, rc, bystander_alive(victim))
"""
    )
    led, rc, alive = _run(code, how)
    assert led == "True" and rc == "0"
    assert alive == "True"


@needs_next_pid
def test_the_supervisor_leaves_a_group_id_freed_by_a_reap_elsewhere_alone():
    # The same, seen first by the supervisor (the exit's pidfd: the program's
    # output is read).  It ends what the leader left in its group only
    # while the leader's zombie pins the id; here there is none.  Its lock
    # is held until the bystander has the id, so that it looks after.
    code = (
        _TAKE_PID
        + """
import signal, subprocess
import sbxlimit
from sbxlimit._monitor import get_monitor
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
p = sbxlimit.Popen(["sh", "-c", "read x"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                   limits=sbxlimit.Limits(wall_time=30), cgroup_parent="none")
pgid = p._sbx.tree_pgid
watched = p._sbx.watch is not None and p._sbx.watch.pidfd >= 0
with get_monitor()._lock:
    p.stdin.close()  # it exits now
    while os.path.exists(f"/proc/{p.pid}"):
        time.sleep(0.01)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    victim = take_pid(pgid)
time.sleep(0.3)  # the supervisor's pass
alive = bystander_alive(victim)
p.stdout.read()
p.wait()
print(watched, alive)
"""
    )
    watched, alive = _run(code)
    assert watched == "True"
    assert alive == "True"


@needs_next_pid
def test_asyncio_kill_tree_after_a_reap_elsewhere_signals_nothing():
    # terminate() reaps a program that already exited (through poll()); the
    # loop has not run since, so the Process does not know yet.  Its
    # kill_tree() must not signal the freed pid, its tree or its group.
    code = (
        _TAKE_PID
        + """
import asyncio
import sbxlimit, sbxlimit.asyncio as sa

async def main():
    proc = await sa.create_subprocess_exec("true", limits=sbxlimit.Limits(wall_time=30))
    pid = proc.pid
    time.sleep(0.3)  # it exits; the loop does not run meanwhile
    proc.terminate()
    reaped = proc._popen.returncode is not None
    victim = take_pid(pid)
    await proc.kill_tree(grace=0)
    time.sleep(0.1)
    print(reaped, bystander_alive(victim), proc._popen._sbx.killed_by_caller)

asyncio.run(main())
"""
    )
    reaped, alive, killed = _run(code)
    assert reaped == "True"
    assert alive == "True" and killed == "False"


# A fork's copy, while another thread of the parent waits for the program
# (the wait lock is held in the copy, by a thread the fork did not copy),
# or through the asyncio layer.  The parent's program lives on.
_FORK_COPY = """
import asyncio, os, signal, sys, threading, time
import sbxlimit, sbxlimit.asyncio as sa

action = sys.argv[1]
kw = dict(limits=sbxlimit.Limits(wall_time=60), policy=sbxlimit.Policy())

def report(p_or_proc, status):
    print(p_or_proc.returncode, os.waitstatus_to_exitcode(status))

if action == "asyncio":
    async def main():
        proc = await sa.create_subprocess_exec("sh", "-c", "sleep 30 & exec sleep 30", **kw)
        await asyncio.sleep(0.2)
        child = os.fork()
        if child == 0:
            signal.alarm(5)
            try:
                asyncio.run(proc.kill_tree(grace=0))  # in the child's own loop
            finally:
                os._exit(0)
        status = os.waitpid(child, 0)[1]
        await asyncio.sleep(0.3)
        report(proc, status)
        await proc.kill_tree(grace=0)
    asyncio.run(main())
else:
    p = sbxlimit.Popen(["sh", "-c", "sleep 30 & exec sleep 30"], **kw)
    threading.Thread(target=p.wait, daemon=True).start()
    time.sleep(0.3)  # the waiting thread holds the wait lock
    child = os.fork()
    if child == 0:
        signal.alarm(5)  # a wait on the copied lock would never end
        if action == "kill_tree":
            p.kill_tree(grace=0)
        else:
            p.close()
        os._exit(0)
    status = os.waitpid(child, 0)[1]
    time.sleep(0.3)
    report(p, status)
    p.kill_tree(grace=0)
    p.close()
"""


@pytest.mark.parametrize("action", ["kill_tree", "close", "asyncio"])
def test_a_fork_s_copy_never_ends_the_program_another_thread_waits_for(action):
    rc, status = _run(_FORK_COPY, action)
    assert rc == "None"  # the parent's program still runs
    assert status == "0"  # and the child neither hung nor failed


# A fork's child has what its parent made for itself copied, not running: its
# own sandboxes must not wait for the parent's proxy thread, nor for room in
# an in-memory Quota that the parent's sandboxes hold.
_FORK_CHILD_SPAWNS = """
import os, signal, sys, time
import sbxlimit

what = sys.argv[1]
if what == "proxy":
    pol = sbxlimit.Policy(network="proxy", allow_domains=["example.com"])
    sbxlimit.run(["true"], policy=pol)  # the parent's proxy thread starts
    run = lambda: sbxlimit.run(["true"], policy=pol)
else:
    q = sbxlimit.Quota(max_sandboxes=1, wait=0)
    p = sbxlimit.Popen(["sleep", "1"], limits=sbxlimit.Limits(wall_time=10), quota=q)
    run = lambda: sbxlimit.run(["true"], limits=sbxlimit.Limits(wall_time=5), quota=q)
child = os.fork()
if child == 0:
    signal.alarm(10)  # a spawn that never returns
    try:
        code = run().returncode
    except Exception:
        code = 3
    sys.exit(code)  # at exit, its supervisor removes what its sandbox left
status = os.waitpid(child, 0)[1]
if what == "quota":
    p.wait()
print(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.parametrize("what", ["proxy", "quota"])
def test_a_fork_s_child_spawns_without_what_its_parent_holds(what):
    if what == "proxy":
        from sbxlimit._namespaces import CLONE_NEWNET, namespaces

        if not namespaces(CLONE_NEWNET).ok:
            pytest.skip(f"no network namespace here: {namespaces(CLONE_NEWNET).reason}")
    (status,) = _run(_FORK_CHILD_SPAWNS, what)
    assert status == "0"  # not -14 (still waiting), not 3 (refused)


def test_a_reap_waits_for_the_signals_another_thread_sends():
    # kill_tree() in one thread while another waits: its first signal (the
    # cgroup's kill) ends the leader, and the waiting thread wakes to reap
    # it.  That reap waits until kill_tree() has sent its last signal (to
    # the leader's pid and group): the ids are still the sandbox's then.
    code = """
import os, threading, time
import sbxlimit
from sbxlimit import _monitor
real = _monitor._core.tree_signal
seen = []
def spy(pid, sig, pgid):
    seen.append((os.path.exists(f"/proc/{pid}"), p._sbx.gone))
    return real(pid, sig, pgid)
_monitor._core.tree_signal = spy
p = sbxlimit.Popen(["sleep", "30"], limits=sbxlimit.Limits(memory="64Mi", wall_time=60))
threading.Thread(target=p.wait).start()
time.sleep(0.3)  # the waiting thread holds the wait lock, blocked in waitid
p.kill_tree(grace=0)
p.wait()
print(len(seen), all(there and not gone for there, gone in seen))
"""
    calls, unreaped = _run(code)
    assert int(calls) >= 1
    assert unreaped == "True"


def test_a_fork_s_child_gives_back_none_of_its_parent_s_quota_room():
    # The child's copy of an admission is its parent's room: giving it back
    # there frees nothing, so the child never admits past the budget.
    from sbxlimit import Quota, QuotaExceeded

    from .conftest import in_a_fork

    q = Quota(max_sandboxes=1)
    held = q.admit(None)

    def child() -> str:
        held.release()  # a with-block or a finally around the fork
        got = []
        for _ in range(2):
            try:
                got.append(q.admit(None))
            except QuotaExceeded:
                pass
        return str(len(got))

    try:
        assert in_a_fork(child) == "1"
        assert q.in_use()["sandboxes"] == 1  # the parent's, untouched
    finally:
        held.release()


def test_usage_in_a_fork_s_child_never_reads_a_number_it_reused():
    # v1: usage() reads the task count through the fd the exit's check keeps.
    # In a fork's child that number may have been closed (by its directory)
    # and given to a file of the child's own: never read there.
    import time

    import sbxlimit

    from .conftest import in_a_fork

    limits = sbxlimit.Limits(memory="64Mi")
    sbxlimit.run(["true"], limits=limits)  # the kind's cgroups are then made ahead
    time.sleep(0.3)
    p = sbxlimit.Popen(["sleep", "30"], limits=limits)
    try:
        cg = p._sbx.cgroup
        if cg is None or cg.count_fd < 0:
            pytest.skip("no v1 task count kept open here (cgroup v2, or no cgroup)")
        fd = cg.count_fd

        def child() -> str:
            decoy = os.open("/proc/self/comm", os.O_RDONLY)  # not a number
            r, w = os.pipe()
            os.write(w, b"4242\n")
            os.close(w)
            os.dup2(r, fd)  # the number, given to another file
            os.close(decoy)
            return str(p.usage().pids_now)

        assert in_a_fork(child) == "1"
    finally:
        p.kill()
        p.wait()


def test_what_a_leader_reaped_elsewhere_left_in_its_group_is_ended():
    # SIGCHLD ignored, no cgroup and no PID namespace: the kernel reaps the
    # leader, and no zombie pins its group id.  The group is then not
    # signalled as a whole, but what the program left in it still is, one
    # process at a time (each started before the reap was seen).
    code = (
        _TAKE_PID
        + """
import signal
import sbxlimit
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
p = sbxlimit.Popen(["sh", "-c", "sleep 61.2345 & echo $!"], stdout=subprocess.PIPE,
                   limits=sbxlimit.Limits(wall_time=30), cgroup_parent="none",
                   policy=sbxlimit.Policy(isolate_pids=False, workdir="/tmp"))
left = int(p.stdout.readline())
p.stdout.close()
p.wait()
time.sleep(0.3)
there = alive(left)
if there:
    os.kill(left, signal.SIGKILL)
print(bool(p._sbx.plan.ns_flags & sbxlimit._platform.CLONE_NEWPID), there)
"""
    )
    pidns, there = _run(code)
    assert pidns == "False"
    assert there == "False"
