"""Every limit ends the sandbox with its own reason, whatever holds it.

Real bad actors (stress-ng where Debian has it, small Python programs that
retry what the kernel refuses) against cgroup v1 (this host as root), cgroup
v2 (tests/test_cgroup2_vm.py runs this file in the UML guest) and the
unprivileged fallbacks (the CI user: no cgroup, a PID namespace).  Each must
end within a few seconds with the right reason, and leave nothing running:
checked by pid and start time, not by name.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import sbxlimit
from sbxlimit._cgroup import discover
from sbxlimit._namespaces import CLONE_NEWNS, CLONE_NEWPID, namespaces
from sbxlimit._plan import plan

from .conftest import holds

PY = sys.executable
SITE = discover()
STRESS = shutil.which("stress-ng")
needs_stress = pytest.mark.skipif(STRESS is None, reason="stress-ng is not installed")
# Ended "within a few seconds": the wall_time behind each actor is far off.
WALL = 30.0
FAST = 8.0


def started(pid: int) -> int | None:
    """The start time (clock ticks since boot) of pid, None once gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def still_running(marks: dict[int, int]) -> list[int]:
    """Which of {pid: start time} still run (a reused pid does not count)."""
    deadline = time.monotonic() + 3
    while True:
        left = [p for p, t in marks.items() if started(p) == t]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def run(
    args: list[str], sample_interval: str = "100ms", **limits: object
) -> sbxlimit.CompletedProcess:
    t0 = time.monotonic()
    r = sbxlimit.run(
        args,
        limits=sbxlimit.Limits(wall_time=WALL, kill_grace=0.5, **limits),  # type: ignore[arg-type]
        sample_interval=sample_interval,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    took = time.monotonic() - t0
    assert took < FAST, (took, r.termination)
    return r


# -- pids --------------------------------------------------------------------

FORK_BOMB = """
import os, time
while True:
    try:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
    except OSError:
        time.sleep(0.001)  # refused: try again, as a bomb does
"""

THREAD_BOMB = """
import threading, time
while True:
    try:
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    except RuntimeError:
        time.sleep(0.001)  # "can't start new thread": try again
"""


def needs_pids_seen() -> None:
    """A refused fork is seen by a pids cgroup, or by the watchdog where
    RLIMIT_NPROC does not stop the tree at the limit first (root; a user
    namespace of the sandbox's own)."""
    if SITE.has("pids") or os.geteuid() == 0:
        return
    held = plan(sbxlimit.Limits(pids=24), None, uid=os.geteuid(), site=SITE).enforced["pids"]
    if "own user namespace" in held:  # no cgroup: the default PID namespace
        return
    pytest.skip(
        "no pids cgroup: RLIMIT_NPROC refuses forks at the limit (counting every process "
        f"of this uid) and nothing counts the refusals; {holds('pids')}"
    )


@pytest.mark.parametrize("program", [FORK_BOMB, THREAD_BOMB], ids=["fork", "thread"])
def test_a_bomb_that_retries_refused_forks_ends_with_pids(program: str) -> None:
    needs_pids_seen()
    r = run([PY, "-c", program], pids=24)
    t = r.termination
    assert t.reason == "pids", t
    assert t.limit == 24 and "pids" in t.hits
    # The mechanism that ended it, one of those that hold the limit.
    held = r.enforced["pids"].split(" (")[0].split("+")
    assert t.mechanism in held, (t.mechanism, r.enforced)


@needs_stress
@pytest.mark.parametrize(
    "stressor", [["--fork", "2", "--fork-max", "100"], ["--clone", "2", "--clone-max", "200"]]
)
def test_stress_ng_fork_and_clone_bombs_end_with_pids(stressor: list[str]) -> None:
    needs_pids_seen()
    assert STRESS is not None
    r = run([STRESS, *stressor, "-t", str(int(WALL))], pids=40)
    assert r.termination.reason == "pids", r.termination


def test_pids_refusals_can_be_tolerated_and_are_counted() -> None:
    if not SITE.has("pids"):
        pytest.skip(f"refusals are counted by a pids cgroup; {holds('pids')}")
    r = sbxlimit.run(
        [PY, "-c", FORK_BOMB],
        limits=sbxlimit.Limits(pids=16, wall_time=1.5, kill_grace=0.2, tolerate=["pids"]),
    )
    t = r.termination
    assert t.reason == "wall_time" and "pids" in t.hits, t
    assert "the kernel refused" in t.message and "(pids)" in t.message, t.message


# -- memory ------------------------------------------------------------------

# A MiB every half millisecond or so: without a cgroup the verdict is
# inferred from the samples (no counter records a refused allocation), so
# they must see the growth.
HOG = "import time\na = []\nwhile True:\n    a.append(bytearray(1 << 20))\n    time.sleep(0.0005)\n"


def test_a_memory_hog_ends_with_memory_on_every_mechanism() -> None:
    r = run([PY, "-c", HOG], sample_interval="5ms", memory="160Mi")
    t = r.termination
    assert t.reason == "memory", (t, r.enforced)
    assert t.limit == 160 << 20


def test_an_ordinary_failure_is_not_blamed_on_memory() -> None:
    r = sbxlimit.run(
        [PY, "-c", "raise ValueError('no')"],
        limits=sbxlimit.Limits(memory="256Mi", wall_time=WALL),
        stderr=subprocess.DEVNULL,
    )
    t = r.termination
    assert t.reason == "exited" and t.returncode == 1, t
    assert "RLIMIT_DATA" not in t.message and "memory" not in t.hits, t


@needs_stress
def test_stress_ng_vm_that_shields_itself_from_the_oom_killer_ends_with_memory() -> None:
    """stress-ng sets its own oom_score_adj to -1000 (root may), so an OOM
    kill takes only workers, which it respawns: the counter ends it."""
    if os.geteuid() != 0 or not SITE.has("memory"):
        pytest.skip(f"root with a memory cgroup only; {holds('memory')}")
    assert STRESS is not None
    r = run(
        [STRESS, "--vm", "2", "--vm-bytes", "200M", "-t", str(int(WALL))],
        memory="128Mi",
    )
    t = r.termination
    assert t.reason == "memory", (t, r.enforced)
    assert t.mechanism is not None and t.mechanism.startswith("cgroup")


# -- cpu_time ----------------------------------------------------------------

BURNERS = """
import os
for _ in range(3):
    if os.fork() == 0:
        while True:
            pass
while True:
    pass
"""


def test_cpu_time_counts_the_whole_sandbox() -> None:
    """Four processes burning CPU: each stays under RLIMIT_CPU's 2 s while
    the sandbox as a whole passes them."""
    t0 = time.monotonic()
    r = run([PY, "-c", BURNERS], cpu_time=2)  # on two cores: about one second
    t = r.termination
    assert t.reason == "cpu_time", (t, r.enforced)
    assert t.observed is not None and t.observed >= 2
    assert time.monotonic() - t0 < FAST
    assert r.usage.cpu_total is not None and r.usage.cpu_total >= 2


ZOMBIE_BURNERS = """
import os, time
for _ in range(6):
    pid = os.fork()
    if pid == 0:
        t = time.process_time()
        while time.process_time() - t < 0.7:
            pass
        os._exit(0)
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # waited for, never reaped
time.sleep(30)
"""


@pytest.mark.parametrize("site", [None, "none"], ids=["default", "no-cgroup"])
def test_cpu_time_counts_children_left_unreaped(site: str | None) -> None:
    """Children that burn CPU and stay zombies: their seconds are in no
    live process's figures and in no parent's yet."""
    r = sbxlimit.run(
        [PY, "-c", ZOMBIE_BURNERS],
        limits=sbxlimit.Limits(wall_time=WALL, cpu_time=1, kill_grace=0.5),
        sample_interval="100ms",
        cgroup_parent=site,
    )
    t = r.termination
    assert t.reason == "cpu_time", (t, r.enforced)
    assert t.observed is not None and t.observed >= 1


def test_a_signal_the_program_sends_itself_is_not_a_limit() -> None:
    """SIGXCPU raised by the program, with next to no CPU used, is its own
    doing: a verdict of cpu_time would send the user to raise a limit that
    was never reached."""
    r = run(["sh", "-c", "kill -XCPU $$"], cpu_time=60)
    t = r.termination
    assert t.reason == "signaled" and not t.is_limit, t


@needs_stress
def test_stress_ng_cpu_under_cpu_time() -> None:
    assert STRESS is not None
    r = run([STRESS, "--cpu", "2", "-t", str(int(WALL))], cpu_time=1)
    assert r.termination.reason == "cpu_time", r.termination


# -- disk --------------------------------------------------------------------

UNLINKED_FILL = """
import os
fd = os.open("fill", os.O_CREAT | os.O_WRONLY)
os.unlink("fill")  # invisible to a walk of the directory
block = b"x" * (1 << 20)
while True:
    try:
        os.write(fd, block)
    except OSError:
        pass  # ENOSPC: try again
"""

FALLOCATE_FILL = """
import os
fd = os.open("fill", os.O_CREAT | os.O_WRONLY)
off = 0
while True:
    try:
        os.posix_fallocate(fd, off, 1 << 20)
        off += 1 << 20
    except OSError:
        pass  # ENOSPC: try again
"""


def needs_tmpfs() -> None:
    ns = namespaces(CLONE_NEWNS)
    if not ns.ok:
        pytest.skip(f"the disk limit is a tmpfs in a mount namespace: {ns.reason}")


@pytest.mark.parametrize("program", [UNLINKED_FILL, FALLOCATE_FILL], ids=["unlinked", "fallocate"])
def test_filling_the_workspace_ends_with_disk(program: str) -> None:
    needs_tmpfs()
    t0 = time.monotonic()
    r = sbxlimit.run(
        [PY, "-c", program],
        limits=sbxlimit.Limits(disk="24Mi", wall_time=WALL, kill_grace=0.5),
        policy=sbxlimit.Policy(),
    )
    assert time.monotonic() - t0 < FAST
    t = r.termination
    assert t.reason == "disk", (t, r.enforced)
    assert t.observed is not None and t.observed > 24 << 20


# Past the limit, then an ordinary exit before the supervisor's next
# sample: into the tmpfs's room past the limit, or until it is full and the
# write fails with ENOSPC, which the program copes with.
PAST_AND_EXIT = """
import os, sys
with open("fill", "wb") as f:
    try:
        f.write(b"x" * int(sys.argv[1]))
    except OSError:
        pass
"""


@pytest.mark.parametrize("how", ["past the limit", "until full"])
def test_a_program_that_exceeds_the_workspace_and_exits_0_ends_with_disk(how: str) -> None:
    needs_tmpfs()
    size = (8 << 20) + (256 << 10) if how == "past the limit" else 64 << 20
    r = sbxlimit.run(
        [PY, "-c", PAST_AND_EXIT, str(size)],
        limits=sbxlimit.Limits(disk="8Mi", wall_time=WALL),
        policy=sbxlimit.Policy(),
        sample_interval=30,  # no sample sees it: the reap's figures do
    )
    t = r.termination
    assert r.returncode == 0 and t.reason == "disk" and t.limit == 8 << 20, t
    assert t.observed is not None and t.observed > 8 << 20, t


def test_a_program_that_exceeds_its_watched_workdir_and_exits_0_ends_with_disk(tmp_path) -> None:
    # The same verdict where a watchdog holds the limit (a workdir of its own).
    r = sbxlimit.run(
        [PY, "-c", PAST_AND_EXIT, str(9 << 20)],
        limits=sbxlimit.Limits(disk="8Mi", wall_time=WALL),
        policy=sbxlimit.Policy(workdir=str(tmp_path)),
        sample_interval=30,
    )
    t = r.termination
    assert r.enforced["disk"].startswith("watchdog"), r.enforced
    assert r.returncode == 0 and t.reason == "disk" and t.observed >= 9 << 20, t


def test_a_full_workspace_can_be_tolerated() -> None:
    needs_tmpfs()
    r = sbxlimit.run(
        [PY, "-c", UNLINKED_FILL],
        limits=sbxlimit.Limits(disk="8Mi", wall_time=1.5, kill_grace=0.2, tolerate="disk"),
        policy=sbxlimit.Policy(),
    )
    t = r.termination
    assert t.reason == "wall_time" and "disk" in t.hits, t
    assert "(disk)" in t.message


# -- the whole tree, without a cgroup too ------------------------------------

# The escapee writes its start time (the same in every /proc: clock ticks
# since boot); it is found in the host's /proc by that and the mark in its
# argv, which also holds when it runs in a PID namespace of its own.
ESCAPEE = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open("/proc/self/stat") as st:
            start = st.read().rsplit(")", 1)[1].split()[19]
        with open(sys.argv[1] + ".tmp", "w") as f:
            f.write(start)
        os.rename(sys.argv[1] + ".tmp", sys.argv[1])
        time.sleep(60)
    os._exit(0)
time.sleep(60)
"""


def escapee_marks(path: str) -> dict[int, int]:
    """{pid: start time} in the host's view of the escapee that wrote
    `path`, if it still runs (it may be gone already)."""
    deadline = time.monotonic() + 5
    while not os.path.exists(path):
        assert time.monotonic() < deadline, "the escapee did not start"
        time.sleep(0.02)
    with open(path) as f:
        start = int(f.read())
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if os.fsencode(path) not in f.read().split(b"\0"):
                    continue
        except OSError:
            continue
        if started(int(pid)) == start:
            found[int(pid)] = start
    return found


def exact_tree() -> None:
    """What holds the whole tree: the cgroup, else a PID namespace (by
    default, without a cgroup)."""
    if SITE.version:
        return
    ns = namespaces(CLONE_NEWPID | CLONE_NEWNS)
    if not ns.ok:
        pytest.skip(f"no cgroup and no PID namespace: {ns.reason}")


@pytest.mark.parametrize("how", ["wall_time", "kill_tree", "timeout", "with"])
def test_a_setsid_double_fork_does_not_outlive_its_sandbox(tmp_path, how: str) -> None:
    exact_tree()
    mark = str(tmp_path / "pid")
    args = [PY, "-c", ESCAPEE, mark]
    lim = sbxlimit.Limits(wall_time=1 if how == "wall_time" else WALL, kill_grace=0.5)
    if how == "wall_time":
        r = sbxlimit.run(args, limits=lim)
        assert r.termination.reason == "wall_time"
        marks = escapee_marks(mark)
    elif how == "timeout":
        with pytest.raises(subprocess.TimeoutExpired):
            sbxlimit.run(args, limits=lim, timeout=1.5)
        marks = escapee_marks(mark)
    else:
        expect = pytest.raises(KeyboardInterrupt) if how == "with" else _nothing()
        with expect, sbxlimit.Popen(args, limits=lim) as p:
            marks = escapee_marks(mark)
            if how == "kill_tree":
                p.kill_tree(grace=0.2)
            else:
                raise KeyboardInterrupt
    assert not still_running(marks), f"escaped {how}: {marks}"


def test_the_escapee_does_escape_the_tree_walk(tmp_path) -> None:
    # The control: no cgroup, no namespace, and the same program survives.
    mark = str(tmp_path / "pid")
    r = sbxlimit.run(
        [PY, "-c", ESCAPEE, mark],
        limits=sbxlimit.Limits(wall_time=1, kill_grace=0.5),
        policy=sbxlimit.Policy(isolate_pids=False, workdir="/"),
        cgroup_parent="none",
    )
    marks = escapee_marks(mark)
    try:
        assert r.termination.reason == "wall_time"
        assert "escapes" in r.enforced["kill_tree"]
        assert len(marks) == 1 and still_running(marks) == list(marks)
    finally:
        for pid in marks:
            os.kill(pid, signal.SIGKILL)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_pid_1_passes_the_program_s_own_status_on() -> None:
    ns = namespaces(CLONE_NEWPID | CLONE_NEWNS)
    if not ns.ok:
        pytest.skip(f"no PID namespace: {ns.reason}")
    pol = sbxlimit.Policy(isolate_pids=True, workdir="/")
    r = sbxlimit.run(
        [PY, "-c", "import os; print(os.getpid()); raise SystemExit(7)"],
        policy=pol,
        capture_output=True,
        text=True,
    )
    assert (r.stdout.strip(), r.returncode) == ("2", 7), r  # PID 2, under the reaper
    r = sbxlimit.run(
        [PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"], policy=pol
    )
    assert r.returncode == -15 and r.termination.reason == "signaled"


# -- the same verdicts through the CLI and asyncio ---------------------------


CLI = [PY, "-m", "sbxlimit", "run"]


def test_the_cli_reports_the_verdict() -> None:
    needs_pids_seen()
    p = subprocess.run(
        [*CLI, "--pids", "24", "--timeout", "30s", "--json", "--", PY, "-c", FORK_BOMB],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 124, p.stderr
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    assert doc["termination"]["reason"] == "pids", doc


def test_asyncio_reports_the_verdict() -> None:
    from sbxlimit import asyncio as sbx_asyncio

    async def main() -> sbxlimit.Termination:
        r = await sbx_asyncio.run(
            [PY, "-c", BURNERS], limits=sbxlimit.Limits(cpu_time=1, wall_time=WALL)
        )
        return r.termination

    assert asyncio.run(main()).reason == "cpu_time"
