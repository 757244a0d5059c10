"""sbxlimit.asyncio: sandboxes from asyncio code, real processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import sbxlimit
import sbxlimit.asyncio as sa

from .conftest import sleeping, tagged_sleep, wait_gone, wait_no_sleepers

PY = sys.executable
# Two processes of 40 MiB each against 64 MiB: past the limit together, each
# under it alone, so the cgroup (or, without one, the tree watchdog) ends it
# with reason memory rather than RLIMIT_DATA refusing one allocation.
HOG = (
    "import os, time\n"
    "os.fork()\n"
    "b = bytearray(40 << 20); b[::4096] = b'x' * (len(b) // 4096)\n"
    "time.sleep(10)\n"
)


def arun(coro):
    return asyncio.run(coro)


def test_200_concurrent_sandboxes_with_a_memory_hog_among_them():
    async def one(i: int):
        if i == 100:
            return await sa.run([PY, "-c", HOG], limits={"memory": "64Mi", "wall_time": 30})
        return await sa.run(
            ["sh", "-c", f"echo {i}"], capture_output=True, limits={"pids": 16, "wall_time": 30}
        )

    async def main():
        return await asyncio.gather(*(one(i) for i in range(200)))

    results = arun(main())
    hog = results.pop(100)
    assert hog.termination.reason == "memory", hog.termination
    for i, r in enumerate(i for i in range(200) if i != 100):
        res = results[i]
        assert res.returncode == 0 and res.stdout == f"{r}\n".encode()
        assert res.termination.reason == "exited"


ESCAPEE = textwrap.dedent(
    """
    import os, sys, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            print(os.getpid(), flush=True)
            os.execvp("sleep", ["sleep", sys.argv[1]])
        os._exit(0)
    time.sleep(60)
    """
)


def test_cancelling_the_awaiting_task_kills_the_tree():
    tag = tagged_sleep()

    async def main():
        p = await sa.create_subprocess_exec(
            PY, "-c", ESCAPEE, tag, stdout=subprocess.PIPE, limits={"wall_time": 60}
        )
        assert int(await p.stdout.readline()) > 0
        task = asyncio.ensure_future(p.communicate())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        rc = await asyncio.wait_for(asyncio.shield(p._exited), 10)
        # A cgroup or a PID namespace holds the escapee too.
        exact = sbxlimit._cgroup.discover().version or "pidns" in p.enforced.get("kill_tree", "")
        if exact:
            assert wait_no_sleepers([tag], 3) == []
        else:
            for pid in sleeping(tag):  # no cgroup: it left the tree
                os.kill(pid, signal.SIGKILL)
        await p.stdout.read()  # EOF once nobody holds the pipe: the transport closes
        return p, rc

    p, rc = arun(main())
    assert rc < 0 and p.termination.reason == "signaled"


def test_streams_and_communicate_with_input():
    async def main():
        p = await sa.create_subprocess_exec(
            PY,
            "-c",
            "import sys; d = sys.stdin.read(); print(d.upper()); print('err', file=sys.stderr)",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            limits={"wall_time": 10},
        )
        out, err = await p.communicate(b"hello")
        return p, out, err

    p, out, err = arun(main())
    assert (out, err, p.returncode) == (b"HELLO\n", b"err\n", 0)
    assert p.termination.reason == "exited" and p.usage().wall > 0


def test_shell_and_wait():
    async def main():
        p = await sa.create_subprocess_shell("exit 3", limits={"wall_time": 10})
        return await p.wait(), p

    rc, p = arun(main())
    assert rc == 3 and p.returncode == 3 and p.enforced["wall_time"] == "watchdog:wall_time"


def test_kill_tree_with_grace():
    async def main():
        p = await sa.create_subprocess_exec("sleep", "60", limits={"wall_time": 60})
        rc = await p.kill_tree(grace=2)
        return p, rc

    p, rc = arun(main())
    assert rc == -15 and "kill_tree() was called" in p.termination.message


def test_run_timeout_kills_and_raises():
    async def main():
        return await sa.run(["sleep", "30"], timeout="200ms", limits={"wall_time": 60})

    with pytest.raises(subprocess.TimeoutExpired):
        arun(main())


def test_limits_hold_and_check_raises_limit_exceeded():
    async def main():
        return await sa.run([PY, "-c", "while True: pass"], limits={"cpu_time": 1}, check=True)

    with pytest.raises(sbxlimit.LimitExceeded) as ei:
        arun(main())
    assert ei.value.termination.reason == "cpu_time"


def test_bad_input_raises_before_any_process():
    async def main():
        return await sa.create_subprocess_exec("true", limits={"memory": "lots"})

    with pytest.raises(sbxlimit.ConfigError, match="memory"):
        arun(main())
    with pytest.raises(ValueError, match="bytes"):
        arun(sa.create_subprocess_exec("true", text=True))


def _pidfds() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[pidfd]"
        except OSError:
            pass
    return n


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfds on this platform")
def test_a_loop_closed_before_its_processes_leaves_no_pidfd():
    import gc

    async def start_and_leave() -> list[int]:
        # Still running when the loop closes: nobody sees them exit.
        procs = [
            await sa.create_subprocess_exec("sleep", "0.3", limits={"wall_time": 10})
            for _ in range(10)
        ]
        return [p.pid for p in procs]

    before = _pidfds()
    pids = []
    for _ in range(3):
        pids += arun(start_and_leave())
        gc.collect()
    assert wait_gone(pids) == []
    assert _pidfds() <= before
    _reap_dropped(pids)


def test_quota_room_comes_back_when_the_program_exits_without_the_loop():
    q = sbxlimit.Quota(max_sandboxes=1)

    async def start() -> int:
        p = await sa.create_subprocess_exec("sleep", "0.3", limits={"wall_time": 10}, quota=q)
        return p.pid

    pid = arun(start())  # the loop closes; nobody awaits the program
    assert wait_gone([pid]) == []
    deadline = time.monotonic() + 5
    while q.in_use().get("sandboxes") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not q.in_use().get("sandboxes"), q.in_use()
    _reap_dropped([pid])


def _reap_dropped(pids: list[int]) -> None:
    """Popens dropped unreaped are reaped by the next one made (as
    subprocess does), once the supervisor lets go of them too: make one
    until the zombies are gone, so that nothing is left to the session."""
    import gc

    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{p}") for p in pids) and time.monotonic() < deadline:
        gc.collect()
        sbxlimit.run(["true"])
        time.sleep(0.02)
