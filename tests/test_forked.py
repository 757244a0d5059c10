"""ForkedSandbox: Python code, not a program, under a sandbox's limits."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time

import pytest

import sbxlimit
from sbxlimit._forked import ForkedSandbox
from sbxlimit._testing import fail_child_at

from .conftest import holds


def hog() -> None:
    b = bytearray(512 << 20)
    b[::4096] = b"x" * (len(b) // 4096)


def test_memory_limit_ends_the_child_not_us():
    p = ForkedSandbox(hog, name="test_hog", limits={"memory": "64Mi"}, stderr=subprocess.PIPE)
    _, err = p.communicate()
    t = p.termination
    if p.enforced["memory"].startswith("cgroup"):
        assert t.reason == "memory", t
        # Killed by the OOM killer, or ended by the supervisor on its oom_kill
        # (a peak read below the limit: "on reaching its memory limit").
        assert t.message.startswith(("`test_hog` was killed", "`test_hog` was ended"))
        assert "64.0 MiB" in t.message and t.mechanism in holds("memory")
    else:  # RLIMIT_DATA refuses the allocation: the child fails with MemoryError
        assert p.returncode == 1 and b"MemoryError" in err, (t, err)


def test_buffered_output_is_not_written_twice(capfd):
    sys.stdout.write("before the fork")  # still in the buffer
    ForkedSandbox(lambda: 0, limits={"wall_time": 5}).wait()
    sys.stdout.flush()
    assert capfd.readouterr().out.count("before the fork") == 1


def test_exit_status_from_return_value_systemexit_and_exceptions():
    assert ForkedSandbox(lambda: 3, limits={"wall_time": 5}).wait() == 3
    assert ForkedSandbox(lambda: None, limits={"wall_time": 5}).wait() == 0

    def leave() -> None:
        sys.exit(7)

    assert ForkedSandbox(leave, limits={"wall_time": 5}).wait() == 7

    def boom() -> None:
        raise RuntimeError("boom in the child")

    p = ForkedSandbox(boom, limits={"wall_time": 5}, stderr=subprocess.PIPE)
    _, err = p.communicate()
    assert p.returncode == 1 and b"RuntimeError: boom in the child" in err


def test_output_and_results_travel_back():
    r, w = os.pipe()

    def work() -> None:
        print("from the child", flush=True)
        os.write(w, str(os.getpid()).encode())

    p = ForkedSandbox(work, limits={"wall_time": 5}, stdout=subprocess.PIPE, pass_fds=(w,))
    os.close(w)
    out, _ = p.communicate()
    with os.fdopen(r, "rb") as f:
        assert int(f.read()) == p.pid != os.getpid()
    assert out == b"from the child\n" and p.termination.reason == "exited"


def test_wall_time_kills_a_stuck_body():
    p = ForkedSandbox(lambda: time.sleep(30), limits={"wall_time": "0.3s", "kill_grace": 0.1})
    t0 = time.monotonic()
    p.wait(timeout=10)
    assert p.termination.reason == "wall_time" and time.monotonic() - t0 < 5


def test_rlimits_hold_in_the_child():
    def check() -> int:
        import resource

        return 0 if resource.getrlimit(resource.RLIMIT_NOFILE) == (64, 64) else 1

    assert ForkedSandbox(check, limits={"open_files": 64}).wait() == 0


def test_setup_failure_is_raised_in_the_parent_and_no_child_runs():
    ran = []
    with (
        fail_child_at("rlimit:RLIMIT_NOFILE", errno.EPERM),
        pytest.raises(sbxlimit.SandboxSetupError) as ei,
    ):
        ForkedSandbox(lambda: ran.append(1), limits={"open_files": 64})
    assert ei.value.step == "rlimit:RLIMIT_NOFILE" and ei.value.errno == errno.EPERM


def test_bad_arguments_are_refused_before_forking():
    with pytest.raises(sbxlimit.ConfigError, match="target"):
        ForkedSandbox("not callable")  # type: ignore[arg-type]
    with pytest.raises(sbxlimit.ConfigError, match="preexec_fn"):
        ForkedSandbox(lambda: 0, preexec_fn=lambda: None)


def test_sandboxes_a_body_starts_leave_no_cgroup_behind():
    # The body's own supervisor keeps cgroups ready for its next sandbox;
    # os._exit runs no atexit, so the body removes them before it.
    from sbxlimit._cgroup import discover

    site = discover()
    if not site.version:
        pytest.skip(f"no cgroup here: {site.reason}")

    def body() -> int:
        for _ in range(3):
            sbxlimit.run(["true"], limits={"pids": 8})
        return 0

    p = ForkedSandbox(body, limits={"wall_time": 30}, cgroup_parent="none")
    assert p.wait() == 0
    prefix = f"sbx-{p.pid:x}-"
    left = []
    for _c, d in site.parents:
        try:
            left += [n for n in os.listdir(d) if n.startswith(prefix)]
        except FileNotFoundError:
            pass  # the grouping cgroup went, empty, with the body's exit
    assert left == []
