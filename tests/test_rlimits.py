"""Limits held by rlimits, hit by real programs: the right reason, limit and
observed value; and the same program under the limit runs fine."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time

import pytest

import sbxlimit
from sbxlimit import Limits
from sbxlimit._platform import can_raise_hard_limits

from .conftest import holds, in_a_fork, privileges

PY = sys.executable
ROOT = os.geteuid() == 0


def run_py(code: str, **kw) -> sbxlimit.SandboxResult:
    return sbxlimit.run([PY, "-c", code], **kw)


# -- cpu_time -------------------------------------------------------------


def test_cpu_time_sigxcpu():
    r = run_py("while True: pass", limits=Limits(cpu_time=1))
    t = r.termination
    # RLIMIT_CPU fires on the tick (SIGXCPU); the sandbox's own count, sampled,
    # may see it first on a busy machine (then it sends SIGKILL).
    assert t.reason == "cpu_time" and t.signal in (signal.SIGXCPU, signal.SIGKILL), t
    assert t.mechanism == "rlimit:RLIMIT_CPU" or t.mechanism in r.enforced["cpu_time"]
    # observed comes from rusage, sampled on ticks: it can read a little
    # under the scheduler's exact runtime that fired SIGXCPU.
    assert t.limit == 1.0 and t.observed >= 0.5
    assert "CPU time" in t.message and "Limits.cpu_time" in t.message
    assert r.usage.cpu_total == t.observed


def test_cpu_time_hard_limit_kills_a_program_ignoring_sigxcpu():
    code = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass"
    t0 = time.monotonic()
    r = run_py(code, limits=Limits(cpu_time=1))
    assert r.termination.reason == "cpu_time"
    # SIGKILL: the sandbox's count, else RLIMIT_CPU's hard limit (soft + 1 s).
    assert r.termination.signal == 9
    assert r.termination.observed >= 1.0
    assert time.monotonic() - t0 < 10


def test_kill_tree_is_not_a_cpu_time_hit():
    # Two children use 0.8 s of CPU between them, under the sandbox's 1 s;
    # the leader's rusage counts both once it has reaped them.
    spin = "while time.process_time() - t < 0.4: pass"
    busy = f"{PY} -c 'import time; t = time.process_time(); exec(\"{spin}\")'"
    with sbxlimit.Popen(
        ["sh", "-c", f"{busy}; {busy}; echo ready; exec sleep 100"],
        limits=Limits(cpu_time=1, wall_time=30),
        stdout=subprocess.PIPE,
        text=True,
    ) as p:
        assert p.stdout.readline() == "ready\n"
        p.kill_tree(grace=0)
    t = p.termination
    assert (t.reason, t.is_limit, t.signal) == ("signaled", False, 9), t
    assert "kill_tree() was called" in t.message


def test_cpu_time_under_limit_runs():
    r = run_py("sum(range(10**5))", limits=Limits(cpu_time=5))
    assert r.returncode == 0 and r.termination.reason == "exited"
    assert r.enforced["cpu_time"].endswith("rlimit:RLIMIT_CPU")


# -- open_files -----------------------------------------------------------

COUNT_FDS = """
import os
fds = []
try:
    while True:
        fds.append(os.open('/dev/null', os.O_RDONLY))
except OSError as e:
    print(len(fds), e.errno)
"""


def test_open_files():
    r = run_py(COUNT_FDS, limits=Limits(open_files=32), capture_output=True, text=True)
    opened, err = map(int, r.stdout.split())
    assert err == 24  # EMFILE
    assert 20 <= opened < 32  # 32 minus stdio and what Python keeps open
    assert r.enforced["open_files"] == "rlimit:RLIMIT_NOFILE"
    code = "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE))"
    r = run_py(code, limits=Limits(open_files=32), capture_output=True, text=True)
    assert r.stdout.strip() == "(32, 32)"  # hard too: the program cannot raise it


# -- file_size ------------------------------------------------------------


def test_file_size_sigxfsz(tmp_path):
    out = tmp_path / "big"
    with open(out, "wb") as f:
        # head, not Python: Python ignores SIGXFSZ and gets EFBIG instead.
        r = sbxlimit.run(
            ["head", "-c", "1000000", "/dev/zero"], stdout=f, limits=Limits(file_size="64Ki")
        )
    t = r.termination
    assert t.reason == "file_size" and t.signal == 25  # SIGXFSZ
    assert t.limit == 65536 and t.mechanism == "rlimit:RLIMIT_FSIZE"
    assert out.stat().st_size == 65536


def test_file_size_under_limit(tmp_path):
    out = tmp_path / "small"
    with open(out, "wb") as f:
        r = sbxlimit.run(
            ["head", "-c", "1000", "/dev/zero"], stdout=f, limits=Limits(file_size="64Ki")
        )
    assert r.termination.reason == "exited" and out.stat().st_size == 1000


# -- memory: RLIMIT_DATA per process ----------------------------------------


def test_memory_rlimit_data_refuses_one_big_allocation():
    # The fallback when no cgroup holds memory (cgroup_parent="none").
    r = run_py(
        "b = bytearray(512 << 20)",
        limits=Limits(memory="64Mi"),
        capture_output=True,
        cgroup_parent="none",
    )
    assert r.returncode == 1 and b"MemoryError" in r.stderr
    t = r.termination
    # The program survived ENOMEM and exited: one refused allocation leaves
    # no trace to judge by (no counter, its memory never grew), so no limit
    # is blamed, and no note about one is added to every failure.
    assert t.reason == "exited" and "memory" not in t.hits
    assert "RLIMIT_DATA" not in t.message
    assert r.enforced["memory"].startswith("rlimit:RLIMIT_DATA")


def test_memory_under_limit_runs():
    code = (
        "import time\nb = bytearray(16 << 20)\nb[::4096] = b'x' * (len(b) // 4096)\ntime.sleep(0.3)"
    )
    r = run_py(code, limits=Limits(memory="256Mi"), sample_interval="20ms")
    assert r.returncode == 0 and r.termination.reason == "exited"
    assert r.usage.memory_peak >= 16 << 20  # sampled by the watchdog


def test_memory_peak_ignores_the_parents_high_water_mark():
    # A child starts with its parent's RSS high-water mark (ru_maxrss), so a
    # tiny program spawned from this big interpreter must not report it.
    ballast = bytearray(128 << 20)
    ballast[::4096] = b"x" * (len(ballast) // 4096)
    r = sbxlimit.run(["true"], limits=Limits(wall_time=10))
    del ballast
    assert r.usage.memory_peak is None or r.usage.memory_peak < 64 << 20


def test_address_space_opt_in():
    r = run_py(
        "b = bytearray(512 << 20)", limits=Limits(address_space="256Mi"), capture_output=True
    )
    assert b"MemoryError" in r.stderr
    assert r.enforced["address_space"] == "rlimit:RLIMIT_AS"
    code = "import resource; print(resource.getrlimit(resource.RLIMIT_AS)[0])"
    r = run_py(code, limits=Limits(memory="256Mi"), capture_output=True, text=True)
    assert int(r.stdout) == resource.RLIM_INFINITY  # memory alone never caps AS


# -- pids -----------------------------------------------------------------

FORK_LOOP = """
import os, time
n = 0
try:
    while n < 500:
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        n += 1
except OSError as e:
    print("refused", n, e.errno, flush=True)
time.sleep(3)
"""


@pytest.mark.skipif(ROOT, reason=f"RLIMIT_NPROC does not bind root: {holds('pids')}")
def test_pids_rlimit_nproc_unprivileged(no_namespaces):
    # Without a user namespace of its own, RLIMIT_NPROC counts every
    # process of the uid and refuses the fork at the limit.
    r = run_py(
        FORK_LOOP, limits=Limits(pids=16), capture_output=True, text=True, cgroup_parent="none"
    )
    assert r.stdout.startswith("refused")
    _, n, err = r.stdout.split()
    assert int(err) == 11 and int(n) < 16  # EAGAIN, before 16
    assert r.enforced["pids"].startswith("rlimit:RLIMIT_NPROC")
    assert "counts every process of uid" in r.enforced["pids"]


@pytest.mark.skipif(not ROOT, reason=f"RLIMIT_NPROC refuses the fork first: {holds('pids')}")
def test_pids_watchdog_root():
    r = run_py(
        FORK_LOOP, limits=Limits(pids=16), capture_output=True, text=True, cgroup_parent="none"
    )
    t = r.termination
    assert t.reason == "pids" and t.limit == 16 and t.observed > 16
    assert t.mechanism == "watchdog:pids"
    assert r.enforced["pids"].startswith("watchdog:pids")
    assert "RLIMIT_NPROC does not bind root" in r.enforced["pids"]


def test_pids_under_limit():
    code = "import os\nfor _ in range(3):\n    if os.fork() == 0: os._exit(0)\n    os.wait()"
    r = run_py(code, limits=Limits(pids=64))
    assert r.returncode == 0 and r.termination.reason == "exited"


# -- core dumps and clamping -----------------------------------------------


def test_core_dumps_off_in_every_sandbox():
    code = "import resource; print(resource.getrlimit(resource.RLIMIT_CORE))"
    r = run_py(code, limits=Limits(wall_time=10), capture_output=True, text=True)
    assert r.stdout.strip() == "(0, 0)"
    assert r.enforced["core_dumps"] == "rlimit:RLIMIT_CORE"
    r = run_py(code, capture_output=True, text=True)  # plain: untouched
    assert r.stdout.strip() == str(resource.getrlimit(resource.RLIMIT_CORE))


@pytest.mark.skipif(
    can_raise_hard_limits(),
    reason=f"CAP_SYS_RESOURCE raises hard limits, nothing is clamped ({privileges()})",
)
def test_request_above_hard_limit_is_clamped_and_said():
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    r = run_py("pass", limits=Limits(open_files=hard + 1000))
    assert r.returncode == 0
    assert f"clamped to the inherited hard limit {hard}" in r.enforced["open_files"]


@pytest.mark.skipif(
    can_raise_hard_limits(),
    reason=f"CAP_SYS_RESOURCE raises hard limits, nothing is clamped ({privileges()})",
)
def test_a_cached_plan_follows_a_hard_limit_lowered_after_it():
    """Plans are cached with the hard limits they were clamped to: one
    lowered later (setrlimit) gets a plan of its own, and its child starts
    (asking for more than the hard limit would fail in the child)."""
    limits = Limits(open_files=700, file_size="1Mi")
    code = "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE))"

    def lowered() -> str:
        first = run_py(code, limits=limits, capture_output=True, text=True)  # planned, cached
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 600), 600))
        again = run_py(code, limits=limits, capture_output=True, text=True)
        return repr((first.stdout, again.returncode, again.stdout, again.enforced["open_files"]))

    first, rc, out, how = eval(in_a_fork(lowered))
    assert first.strip() == "(700, 700)"
    assert rc == 0 and out.strip() == "(600, 600)"
    assert "clamped to the inherited hard limit 600" in how


def test_a_sandbox_whose_rlimits_cannot_be_clamped_reads_no_hard_limit():
    """Core dumps off (0/0) is never clamped: a plan with no other rlimit
    (a cgroup's limits, a Policy alone) depends on no hard limit, and its
    cached plan is found without reading any."""
    from sbxlimit import _plan

    site = sbxlimit._cgroup.discover(None)
    for limits, policy in ((Limits(memory="1Gi", pids=64), None), (None, sbxlimit.Policy())):
        p = _plan.plan(limits, policy, uid=os.geteuid(), site=site)
        if p.rlimits == [(resource.RLIMIT_CORE, 0, 0)]:
            assert p.hard_seen == []
    p = _plan.plan(Limits(open_files=100), None, uid=os.geteuid())
    read = [] if can_raise_hard_limits() else [resource.RLIMIT_NOFILE]
    assert [r for r, _h in p.hard_seen] == read


def test_check_true_raises_limit_exceeded():
    with pytest.raises(sbxlimit.LimitExceeded) as ei:
        run_py("while True: pass", limits=Limits(cpu_time=1), check=True)
    e = ei.value
    assert isinstance(e, subprocess.CalledProcessError) and isinstance(e, sbxlimit.Error)
    assert e.termination.reason == "cpu_time" and str(e) == e.termination.message
    assert e.returncode == -24
