"""What a finished sandbox leaves its caller: SandboxResult's sandbox_id and
workspace, the workspace after close(), asyncio's Process as a context
manager, run()'s timeout as RunTimeout, a cancelled wait that returns
with the verdict set, and audit events in cause-before-effect order.
Real processes throughout; nothing here asserts a timing."""

from __future__ import annotations

import asyncio
import os
import pickle
import shutil
import signal
import subprocess
import sys

import pytest

import sbxlimit
import sbxlimit.asyncio as sa
from sbxlimit import Limits, Policy

PY = sys.executable
WRITE = "open('made.txt', 'w').write('x')"  # into its cwd: the private workspace


def arun(coro):
    return asyncio.run(coro)


def run_sync(args, **kw):
    return sbxlimit.run(args, **kw)


def run_async(args, **kw):
    return arun(sa.run(args, **kw))


RUNS = [pytest.param(run_sync, id="run"), pytest.param(run_async, id="asyncio.run")]


# -- SandboxResult: sandbox_id and workspace -----------------------------------


@pytest.mark.parametrize("run", RUNS)
def test_result_names_its_sandbox_and_workspace(run, events):
    r = run([PY, "-c", WRITE], policy=Policy())
    assert r.returncode == 0
    spawn = [e for e in events if e.name == "spawn"]
    assert [e.sandbox_id for e in spawn] == [r.sandbox_id]
    # The path stays on the result; run() removed the directory.
    assert os.path.basename(r.workspace).startswith(f"sbxlimit-{r.sandbox_id}-")
    assert not os.path.exists(r.workspace)


@pytest.mark.parametrize("run", RUNS)
def test_result_workspace_is_there_with_keep_workdir(run):
    r = run([PY, "-c", WRITE], policy=Policy(keep_workdir=True))
    try:
        with open(os.path.join(r.workspace, "made.txt")) as f:
            assert f.read() == "x"
    finally:
        shutil.rmtree(r.workspace)


@pytest.mark.parametrize("run", RUNS)
def test_result_without_a_private_workspace(run, tmp_path):
    r = run(["true"], policy=Policy(workdir=str(tmp_path)))
    assert r.workspace is None and r.sandbox_id


# -- Popen.workspace after close ---------------------------------------------------


def test_popen_workspace_after_close_keeps_its_path_and_says_removed():
    with sbxlimit.Popen([PY, "-c", WRITE], policy=Policy()) as p:
        p.wait()
        ws = p.workspace
        assert os.path.exists(os.path.join(ws, "made.txt")) and not p.workspace_removed
    assert p.workspace == ws and p.workspace_removed and not os.path.exists(ws)


def test_popen_workspace_kept_is_not_removed():
    with sbxlimit.Popen([PY, "-c", WRITE], policy=Policy(keep_workdir=True)) as p:
        p.wait()
    try:
        assert not p.workspace_removed
        assert os.path.exists(os.path.join(p.workspace, "made.txt"))
    finally:
        shutil.rmtree(p.workspace)


# -- asyncio: Process.workspace and async with -------------------------------------


def test_async_with_waits_then_removes_the_workspace():
    async def main():
        # Nothing awaits it inside the block: the block's end waits, as
        # Popen's with block does (the program is not killed).
        async with await sa.create_subprocess_exec(
            PY, "-c", f"import time; time.sleep(0.2); {WRITE}", policy=Policy()
        ) as p:
            ws = p.workspace
            assert os.path.isdir(ws) and not p.workspace_removed
        return p, ws

    p, ws = arun(main())
    assert p.returncode == 0 and p.termination.reason == "exited"
    assert p.workspace == ws and p.workspace_removed and not os.path.exists(ws)


def test_async_with_closes_the_pipes_before_waiting():
    async def main():
        # A writer nobody reads: once the block closes its pipe it dies of
        # SIGPIPE, as with Popen's with block (wall_time: a bound, not the
        # expected end).
        async with await sa.create_subprocess_exec(
            "yes", stdout=subprocess.PIPE, limits=Limits(wall_time=30)
        ) as p:
            pass
        return p

    p = arun(main())
    assert p.returncode == -signal.SIGPIPE, p.termination


def test_async_with_left_by_a_cancellation_kills_and_reaps():
    async def main():
        p = await sa.create_subprocess_exec("sleep", "60", policy=Policy())
        entered = asyncio.Event()

        async def body():
            async with p:
                entered.set()
                await asyncio.sleep(60)

        task = asyncio.ensure_future(body())
        await entered.wait()
        ws = p.workspace
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return p, ws

    p, ws = arun(main())
    assert p.returncode == -signal.SIGKILL and p.termination.reason == "signaled"
    assert p.workspace == ws and p.workspace_removed and not os.path.exists(ws)


# -- run(timeout=): RunTimeout with the killed sandbox's verdict ---------------------


@pytest.mark.parametrize("run", RUNS)
def test_run_timeout_raises_run_timeout_with_termination_and_usage(run):
    with pytest.raises(subprocess.TimeoutExpired) as ei:  # still caught as subprocess's
        run(["sleep", "60"], timeout=0.2, limits=Limits(wall_time=60))
    e = ei.value
    assert isinstance(e, sbxlimit.RunTimeout) and isinstance(e, sbxlimit.Error)
    assert e.timeout == 0.2 and "timed out" in str(e)
    # Not a limit of the sandbox: the caller's kill, by SIGKILL.
    t = e.termination
    assert t.reason == "signaled" and not t.is_limit
    assert t.signal == signal.SIGKILL and t.returncode == -signal.SIGKILL
    assert "kill_tree() was called" in t.message
    assert e.usage.wall is not None
    back = pickle.loads(pickle.dumps(e))
    assert (back.termination, back.usage, back.timeout, back.cmd) == (t, e.usage, 0.2, e.cmd)


def test_popen_wait_timeout_stays_subprocess_and_kills_nothing():
    with sbxlimit.Popen(["sleep", "60"], limits=Limits(wall_time=60)) as p:
        with pytest.raises(subprocess.TimeoutExpired) as ei:
            p.wait(timeout=0.05)
        assert not isinstance(ei.value, sbxlimit.RunTimeout) and p.poll() is None
        with pytest.raises(sbxlimit.RunTimeout):  # run() alone kills and says how
            sbxlimit.run(["sleep", "60"], timeout=0.05, limits=Limits(wall_time=60))
        p.kill_tree(grace=0)


# -- a cancelled wait returns with the verdict set -------------------------------------


@pytest.mark.parametrize("how", ["wait", "communicate"])
@pytest.mark.parametrize(
    "kw",
    [
        pytest.param({"limits": Limits(wall_time=60)}, id="limits"),
        pytest.param({"policy": Policy()}, id="policy"),
        pytest.param({"limits": Limits(memory="1Gi"), "cgroup_parent": "none"}, id="no-cgroup"),
    ],
)
def test_cancelled_wait_has_returncode_and_termination_when_it_returns(how, kw):
    async def main():
        p = await sa.create_subprocess_exec("sleep", "60", stdout=subprocess.PIPE, **kw)
        task = asyncio.ensure_future(getattr(p, how)())
        await asyncio.sleep(0)  # it waits
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Nothing awaited since: set by the time the cancellation arrived.
        got = (p.returncode, p.termination)
        # And through wait_for's timeout, which cancels the same way.
        q = await sa.create_subprocess_exec("sleep", "60", **kw)
        with pytest.raises((asyncio.TimeoutError, TimeoutError)):
            await asyncio.wait_for(q.wait(), 0.05)
        got_q = (q.returncode, q.termination)
        # The invariant for a wait that returns.
        r = await sa.create_subprocess_exec("true", **kw)
        await r.wait()
        got_r = (r.returncode, r.termination)
        return got, got_q, got_r

    (rc, t), (rc_q, t_q), (rc_r, t_r) = arun(main())
    assert rc == -signal.SIGKILL and t is not None and t.reason == "signaled"
    assert rc_q == -signal.SIGKILL and t_q is not None and t_q.reason == "signaled"
    assert rc_r == 0 and t_r is not None and t_r.reason == "exited"


# -- audit: cause before effect ---------------------------------------------------------


def _of(events, sandbox_id):
    return [e.name for e in events if e.sandbox_id == sandbox_id and e.name != "degraded"]


@pytest.mark.parametrize("run", RUNS)
def test_audit_events_arrive_limit_then_kill_then_exit(run, events):
    r = run(["sleep", "60"], limits=Limits(wall_time="200ms", kill_grace=0))
    assert r.termination.reason == "wall_time"
    assert _of(events, r.sandbox_id) == ["spawn", "limit_exceeded", "killed", "exit"]
    by = {e.name: e for e in events if e.sandbox_id == r.sandbox_id}
    assert by["killed"].detail == "supervisor" and by["exit"].detail == "wall_time"


def test_audit_limit_the_kernel_held_comes_before_exit(events):
    # dd dies of SIGXFSZ: a limit no kill of ours ended, so no `killed`.
    r = sbxlimit.run(
        ["dd", "if=/dev/zero", "of=big", "bs=64k", "count=64"],
        limits=Limits(file_size="64Ki"),
        policy=Policy(),
        capture_output=True,
    )
    assert r.termination.reason == "file_size", r.termination
    assert _of(events, r.sandbox_id) == ["spawn", "limit_exceeded", "exit"]
