"""Limits held by the supervisor (wall time, memory and pids watchdogs,
output capture) and tree control: real programs, real kills."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import threading
import time
import warnings

import pytest

import sbxlimit
from sbxlimit import Limits

from .conftest import alive, sleeping, tagged_sleep, wait_gone, wait_no_sleepers

PY = sys.executable


def run_py(code: str, **kw) -> sbxlimit.SandboxResult:
    return sbxlimit.run([PY, "-c", code], **kw)


# -- wall_time ------------------------------------------------------------


def test_wall_time_terminates():
    t0 = time.monotonic()
    r = run_py("import time; time.sleep(30)", limits=Limits(wall_time="300ms", kill_grace=2))
    elapsed = time.monotonic() - t0
    t = r.termination
    assert t.reason == "wall_time" and t.signal == signal.SIGTERM
    assert t.limit == 0.3 and 0.3 <= t.observed < 1.0
    assert t.mechanism == "watchdog:wall_time"
    assert elapsed < 2  # SIGTERM was enough
    assert r.enforced["wall_time"] == "watchdog:wall_time"


def test_wall_time_sigkill_after_grace_for_a_program_ignoring_sigterm():
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)"
    )
    t0 = time.monotonic()
    r = run_py(code, limits=Limits(wall_time="300ms", kill_grace="300ms"), capture_output=True)
    elapsed = time.monotonic() - t0
    assert r.stdout == b"ready\n"
    assert r.termination.reason == "wall_time" and r.termination.signal == signal.SIGKILL
    assert 0.55 <= elapsed < 3


def test_wall_time_kills_the_whole_tree():
    # The child starts a grandchild in its group, and one in a new session
    # (still its descendant): both must die with it.
    tags = [tagged_sleep(), tagged_sleep()]
    code = (
        "import subprocess, sys, time\n"
        f"a = subprocess.Popen(['sleep', {tags[0]!r}])\n"
        f"b = subprocess.Popen(['sleep', {tags[1]!r}], start_new_session=True)\n"
        "print(a.pid, b.pid, flush=True)\n"
        "time.sleep(60)"
    )
    r = run_py(code, limits=Limits(wall_time="500ms", kill_grace=1), capture_output=True)
    assert len(r.stdout.split()) == 2  # both started
    assert r.termination.reason == "wall_time"
    assert wait_no_sleepers(tags) == []


def test_wall_time_under_limit():
    r = run_py("print('ok')", limits=Limits(wall_time=30), capture_output=True)
    assert r.stdout == b"ok\n" and r.termination.reason == "exited" and r.usage.wall < 30


# -- memory watchdog --------------------------------------------------------

TREE_HOG = """
import os, time
kids = []
for i in range(3):
    pid = os.fork()
    if pid == 0:
        chunks = []
        for j in range(40):
            chunks.append(bytearray(1 << 20))
            time.sleep(0.01)
        time.sleep(30)
        os._exit(0)
    kids.append(pid)
for k in kids:
    os.waitpid(k, 0)
"""


def test_memory_watchdog_kills_a_tree_over_the_limit():
    # Each process stays under RLIMIT_DATA; together they pass the limit.
    # (The fallback when no cgroup holds memory.)
    t0 = time.monotonic()
    r = run_py(TREE_HOG, limits=Limits(memory="64Mi"), cgroup_parent="none")
    t = r.termination
    assert t.reason == "memory" and t.signal == signal.SIGKILL
    assert t.limit == 64 << 20 and t.observed > 64 << 20
    assert t.mechanism == "watchdog:memory"
    assert "Limits.memory" in t.message and "64.0 MiB" in t.message
    assert r.usage.memory_peak >= t.observed
    assert r.usage.pids_peak >= 2
    assert time.monotonic() - t0 < 10
    assert r.enforced["memory"] == "rlimit:RLIMIT_DATA+watchdog:memory"


def test_memory_tree_under_limit():
    r = run_py(TREE_HOG.replace("time.sleep(30)", "pass"), limits=Limits(memory="512Mi"))
    assert r.returncode == 0 and r.termination.reason == "exited"
    assert r.usage.memory_peak > 30 << 20


def test_sample_interval_is_configurable():
    with pytest.raises(ValueError, match="sample_interval"):
        sbxlimit.Popen(["true"], limits=Limits(memory="1Gi"), sample_interval="-1s")
    r = sbxlimit.run([PY, "-c", TREE_HOG], limits=Limits(memory="64Mi"), sample_interval="20ms")
    assert r.termination.reason == "memory"


# -- output ---------------------------------------------------------------

FLOOD = "import sys\nwhile True:\n    sys.stdout.write('x' * 8192)"


def test_output_cap_kills():
    r = run_py(FLOOD, limits=Limits(output="100Ki"), capture_output=True)
    t = r.termination
    assert t.reason == "output" and t.limit == 100 << 10 and t.observed > 100 << 10
    assert t.mechanism == "supervisor:output" and "stdout" in t.message
    assert r.stdout == b"x" * (100 << 10)


def test_output_cap_truncates_on_request():
    code = (
        "import sys\n"
        "for i in range(50):\n"
        "    sys.stdout.write('y' * 8192)\n"
        "print('done', file=sys.stderr)"
    )
    r = run_py(code, limits=Limits(output="64Ki", truncate_output=True), capture_output=True)
    assert r.returncode == 0 and r.termination.reason == "exited"
    assert r.termination.hits == ("output",)
    assert r.stdout.startswith(b"y" * (64 << 10))
    assert r.stdout[64 << 10 :] == b"\n[sbxlimit: output truncated at 65536 bytes]\n"
    assert r.stderr == b"done\n"


def test_output_cap_per_stream_and_merged():
    code = "import sys\nsys.stdout.write('o' * 5000)\nsys.stderr.write('e' * 5000)"
    r = run_py(code, limits=Limits(output=6000), capture_output=True)
    assert r.termination.reason == "exited" and len(r.stdout) == len(r.stderr) == 5000
    r = run_py(code, limits=Limits(output=6000), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert r.termination.reason == "output" and len(r.stdout) == 6000


def test_output_cap_text_mode_does_not_break_utf8():
    code = "import sys\nfor i in range(100): sys.stdout.write('é' * 5000)"
    r = run_py(
        code,
        limits=Limits(output=10001, truncate_output=True),
        capture_output=True,
        encoding="utf-8",
    )
    assert r.stdout.startswith("é" * 5000) and "truncated" in r.stdout


# 'é' is two bytes; the cap falls between them, and so does the pause
# between the program's two writes.
SPLIT_CHAR = (
    "import os, time\nos.write(1, b'abcd\\xc3')\ntime.sleep(0.3)\n"
    "os.write(1, b'\\xa9' + 'é'.encode() * 10)\ntime.sleep(0.3)"
)


@pytest.mark.parametrize("truncate", [True, False])
def test_output_cap_between_two_writes_of_one_character(truncate):
    r = run_py(
        SPLIT_CHAR,
        limits=Limits(output=5, truncate_output=truncate),
        capture_output=True,
        text=True,
    )
    assert r.termination.reason == ("exited" if truncate else "output")
    mark = "\n[sbxlimit: output truncated at 5 bytes]\n" if truncate else ""
    assert r.stdout == "abcd" + mark


def test_a_character_split_across_writes_passes_whole():
    r = run_py(SPLIT_CHAR, limits=Limits(output=100), capture_output=True, text=True)
    assert r.stdout == "abcdé" + "é" * 10


def test_output_cap_to_a_file_and_to_a_foreign_pipe(tmp_path):
    with open(tmp_path / "out", "wb") as f:
        r = run_py(FLOOD, limits=Limits(output="32Ki"), stdout=f)
    assert r.termination.reason == "output"
    assert (tmp_path / "out").stat().st_size == 32 << 10

    rd, wr = os.pipe()
    got = bytearray()
    reader = threading.Thread(target=lambda: got.extend(iter_read(rd)))
    reader.start()
    try:
        r = run_py(FLOOD, limits=Limits(output="32Ki"), stdout=wr)
    finally:
        os.close(wr)
        reader.join(10)
        os.close(rd)
    assert r.termination.reason == "output" and len(got) == 32 << 10


def iter_read(fd):
    while chunk := os.read(fd, 65536):
        yield from chunk


def test_output_back_pressure_loses_nothing():
    code = "import sys\nsys.stdout.buffer.write(bytes(range(256)) * 20000)"
    with sbxlimit.Popen(
        [PY, "-c", code], stdout=subprocess.PIPE, limits=Limits(output="10Mi")
    ) as p:
        time.sleep(0.3)  # the pipe and the pump fill up; nothing may be dropped
        data = p.stdout.read()
    assert data == bytes(range(256)) * 20000
    assert p.termination.reason == "exited"


def test_output_reader_closing_early_gives_sigpipe():
    with sbxlimit.Popen(["yes"], stdout=subprocess.PIPE, limits=Limits(output="1Gi")) as p:
        assert p.stdout.read(10) == b"y\ny\ny\ny\ny\n"
        p.stdout.close()
        assert p.wait(timeout=10) == -signal.SIGPIPE


def test_output_to_devnull_is_not_pumped():
    r = run_py(
        FLOOD.replace("while True", "for i in range(100)"),
        limits=Limits(output=1000),
        stdout=subprocess.DEVNULL,
    )
    assert r.termination.reason == "exited"


# -- tree control -----------------------------------------------------------

SPAWNER = (
    "import os, subprocess, sys, time\n"
    "a = subprocess.Popen(['sleep', sys.argv[1]])\n"
    "b = subprocess.Popen(['sleep', sys.argv[2]], start_new_session=True)\n"
    "if os.fork() == 0:\n"  # double fork, staying in the group
    "    c = subprocess.Popen(['sleep', sys.argv[3]])\n"
    "    print(c.pid, flush=True)\n"
    "    os._exit(0)\n"
    "time.sleep(0.2)\n"
    "print(a.pid, b.pid, flush=True)\n"
    "time.sleep(60)"
)


def _spawner(**kw) -> tuple[sbxlimit.Popen, list[str]]:
    """The spawner, once its three sleepers run; and their tags."""
    tags = [tagged_sleep() for _ in range(3)]
    p = sbxlimit.Popen([PY, "-c", SPAWNER, *tags], stdout=subprocess.PIPE, **kw)
    printed: list[bytes] = []
    while len(printed) < 3:
        line = p.stdout.readline()
        assert line, "spawner died early"
        printed += line.split()
    assert all(len(sleeping(t)) == 1 for t in tags)
    return p, tags


def test_kill_tree_ends_every_descendant():
    p, tags = _spawner(limits=Limits(wall_time=60))
    p.kill_tree(grace=1)
    assert p.returncode == -signal.SIGTERM
    assert wait_no_sleepers(tags) == []
    p.stdout.close()


def test_kill_tree_on_plain_popen_and_grace_zero():
    p, tags = _spawner(start_new_session=True)
    p.kill_tree(grace=0)
    assert p.returncode == -signal.SIGKILL
    assert wait_no_sleepers(tags) == []
    p.stdout.close()


def test_leftovers_die_when_the_sandbox_exits():
    # The leftover holds the stdout pipe: communicate() returns only because
    # the supervisor ends it the moment the leader exits.
    tag = tagged_sleep()
    code = f"import subprocess; print(subprocess.Popen(['sleep', {tag!r}]).pid)"
    t0 = time.monotonic()
    r = run_py(code, limits=Limits(cpu_time=30), capture_output=True)
    assert time.monotonic() - t0 < 5
    assert int(r.stdout) > 0
    assert wait_no_sleepers([tag]) == []


def test_plain_popen_keeps_subprocess_semantics_for_leftovers():
    code = (
        "import subprocess as s\n"
        "print(s.Popen(['sleep', '60'], stdout=s.DEVNULL, stderr=s.DEVNULL).pid)"
    )
    r = run_py(code, capture_output=True)  # the grandchild holds no pipe of ours
    pid = int(r.stdout)
    try:
        assert alive(pid)  # no limits, no policy: like subprocess, nothing is killed
    finally:
        os.kill(pid, signal.SIGKILL)
        wait_gone([pid])


def test_keyboard_interrupt_in_with_block_kills_the_sandbox():
    p, tags = _spawner(limits=Limits(wall_time=60))
    with pytest.raises(KeyboardInterrupt), p:
        raise KeyboardInterrupt
    assert p.returncode is not None
    assert wait_no_sleepers(tags) == []


def test_run_timeout_kills_the_tree():
    tag = tagged_sleep()
    code = (
        "import subprocess, time\n"
        f"print(subprocess.Popen(['sleep', {tag!r}]).pid, flush=True)\n"
        "time.sleep(60)"
    )
    with pytest.raises(subprocess.TimeoutExpired) as ei:
        run_py(code, timeout=1, capture_output=True, limits=Limits(wall_time=60))
    assert int(ei.value.stdout) > 0
    assert wait_no_sleepers([tag]) == []


# -- usage and termination --------------------------------------------------


def test_live_usage():
    code = (
        "import threading, time\n"
        "b = bytearray(48 << 20)\n"
        "b[::4096] = b'x' * (len(b) // 4096)\n"
        "ev = threading.Event()\n"
        "ts = [threading.Thread(target=ev.wait) for _ in range(3)]\n"
        "[t.start() for t in ts]\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)"
    )
    with sbxlimit.Popen(
        [PY, "-c", code], stdout=subprocess.PIPE, limits=Limits(memory="512Mi")
    ) as p:
        assert p.stdout.readline() == b"ready\n"
        assert p.termination is None
        u = p.usage()
        assert u.memory_now >= 48 << 20 and u.memory_peak >= u.memory_now
        assert u.pids_now == 4  # main + 3 threads
        assert u.cpu_user is not None and u.wall > 0
        p.kill_tree(grace=0)
    final = p.usage()
    assert final.memory_now == 0 and final.memory_peak >= 48 << 20
    assert p.termination.reason == "signaled"


def test_signaled_and_exited_terminations():
    p = sbxlimit.Popen([PY, "-c", "import time; time.sleep(30)"])
    p.send_signal(signal.SIGUSR1)
    p.wait()
    t = p.termination
    assert (t.reason, t.signal, t.limit, t.mechanism) == ("signaled", signal.SIGUSR1, None, None)
    assert "SIGUSR1" in t.message and not t.is_limit
    r = run_py("raise SystemExit(3)")
    assert r.termination.reason == "exited" and "status 3" in r.termination.message


def test_no_secrets_in_termination():
    secret = "hunter2-s3cr3t"
    r = sbxlimit.run(
        [PY, "-c", f"import time; x = '{secret}'; time.sleep(30)"],
        env={**os.environ, "API_TOKEN": secret},
        limits=Limits(wall_time="200ms", kill_grace=0),
    )
    assert r.termination.reason == "wall_time"
    blob = repr(r.termination.to_dict()) + repr(r.usage.to_dict()) + repr(r.enforced)
    assert secret not in blob
    assert "`python" in r.termination.message


def test_json_ready_results():
    import json

    r = run_py("pass", limits=Limits(memory="64Mi", wall_time=5))
    json.dumps(
        {"usage": r.usage.to_dict(), "termination": r.termination.to_dict(), "enforced": r.enforced}
    )


def test_popen_from_a_thread_does_not_die_with_the_thread():
    # PR_SET_PDEATHSIG follows the spawning thread: off by default there.
    box = {}

    def spawn():
        box["p"] = sbxlimit.Popen(
            [PY, "-c", "import time; time.sleep(0.5)"], limits=Limits(wall_time=30)
        )

    t = threading.Thread(target=spawn)
    t.start()
    t.join()
    p = box["p"]
    assert p.wait(timeout=10) == 0


def test_die_with_parent_from_a_thread_when_asked():
    box = {}

    def spawn():
        box["p"] = sbxlimit.Popen(
            [PY, "-c", "import time; time.sleep(30)"],
            limits=Limits(wall_time=30),
            die_with_parent=True,
        )

    t = threading.Thread(target=spawn)
    t.start()
    t.join()
    assert box["p"].wait(timeout=10) == -signal.SIGKILL


# -- regressions found in review ---------------------------------------------


def test_policy_workdir_is_the_childs_cwd(tmp_path):
    pol = sbxlimit.Policy(workdir=str(tmp_path), protect_dotfiles=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        r = run_py("import os; print(os.getcwd())", policy=pol, capture_output=True, text=True)
    assert r.stdout.strip() == str(tmp_path)
    assert r.enforced["workspace"].startswith("supervisor:workdir")


def test_downgrade_warning_points_at_the_callers_line():
    import sbxlimit._plan as enforce

    enforce._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sbxlimit.Popen(["true"], limits=Limits(cpu="1"), cgroup_parent="none").wait()
        enforce._warned.clear()
        sbxlimit.run(["true"], limits=Limits(cpu="1"), cgroup_parent="none")
    files = {w.filename for w in caught if issubclass(w.category, RuntimeWarning)}
    assert files == {__file__}


def test_kill_tree_says_who_killed():
    p = sbxlimit.Popen([PY, "-c", "import time; time.sleep(30)"], limits=Limits(wall_time=30))
    p.kill_tree(grace=0)
    assert "kill_tree() was called" in p.termination.message


def test_die_with_parent_explicit_on_a_plain_popen():
    box = {}

    def spawn():
        box["p"] = sbxlimit.Popen([PY, "-c", "import time; time.sleep(30)"], die_with_parent=True)

    t = threading.Thread(target=spawn)
    t.start()
    t.join()
    assert box["p"].wait(timeout=10) == -signal.SIGKILL


def test_unwaited_sandbox_at_interpreter_exit_is_quiet():
    code = (
        "import sbxlimit, threading\n"
        "threading.Thread(target=lambda: None).start()\n"
        "p = sbxlimit.Popen(['sleep', '0.3'], limits=sbxlimit.Limits(wall_time=5))\n"
    )
    code += "print(f'{__import__(\"os\").getpid():x}')\n"
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=30)
    assert "Exception ignored" not in r.stderr, r.stderr
    # It dies with the interpreter (parent-death signal); its cgroup must not
    # outlive it.
    owner = r.stdout.strip()
    assert not glob.glob(f"/sys/fs/cgroup/**/sbx-{owner}-*", recursive=True)
    time.sleep(0.5)


@pytest.mark.parametrize("die_with_parent", [None, False])
def test_a_sandbox_started_from_a_thread_ends_at_interpreter_exit(die_with_parent):
    # From another thread there is no parent-death signal by default (it
    # would come when that thread ends): the exit ends the sandbox all the
    # same, as it ends the main thread's, since it takes its supervisor
    # (wall_time) and its workspace.  An explicit False lets it outlive us.
    code = f"""
import os, subprocess, threading, sbxlimit
def start():
    global p
    p = sbxlimit.Popen(["sleep", "30"], limits=sbxlimit.Limits(wall_time=1),
                       policy=sbxlimit.Policy(), die_with_parent={die_with_parent},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
t = threading.Thread(target=start)
t.start()
t.join()
print(p.pid, p.workspace, flush=True)
"""
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    pid_text, workspace = r.stdout.split()
    pid = int(pid_text)
    try:
        if die_with_parent is None:
            assert not alive(pid)  # reaped by the exit: gone at once
            assert not os.path.exists(workspace)
        else:
            assert alive(pid)
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
            wait_gone([pid])
            # It outlived its owner, as asked: what it held is a leftover.
            subprocess.run([PY, "-m", "sbxlimit", "gc"], capture_output=True, check=True)


_MP_WORKER = """
import multiprocessing as mp, os, sys, threading, time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
import sbxlimit

def work():
    # a cgroup (where this machine has one) and a private workspace
    a = sbxlimit.run(["true"], limits=sbxlimit.Limits(memory="64M", wall_time=10))
    b = sbxlimit.run(["true"], policy=sbxlimit.Policy())
    return os.getpid(), a.returncode or b.returncode

def in_process(q):
    global left
    # never waited for: it ends with this process, and its workspace goes
    left = sbxlimit.Popen(["sleep", "30"], limits=sbxlimit.Limits(memory="64M"),
                          policy=sbxlimit.Policy())
    q.put(work())

def in_a_grandchild(q):
    # a fork child's own fork child: its registry is emptied once more
    ctx = mp.get_context("fork")
    p = ctx.Process(target=in_process, args=(q,))
    p.start()
    p.join()

def with_an_idle_executor(q):
    # left running, never shut down: multiprocessing's end wakes its worker
    global executor
    executor = ThreadPoolExecutor(1)
    q.put(executor.submit(work).result())

def in_thread(q):
    def later():
        time.sleep(0.3)  # the target has returned: multiprocessing is ending
        r = sbxlimit.run(["sleep", "0.3"], limits=sbxlimit.Limits(memory="64M", wall_time=10))
        q.put((os.getpid(), r.returncode))
    threading.Thread(target=later).start()  # not a daemon: joined before the end

if __name__ == "__main__":
    ctx = mp.get_context(sys.argv[1])
    if sys.argv[2] == "executor":
        with ProcessPoolExecutor(2, mp_context=ctx) as ex:
            done = sorted({f.result() for f in [ex.submit(work) for _ in range(4)]})
    else:
        q = ctx.SimpleQueue()
        targets = {"process": in_process, "thread": in_thread, "grandchild": in_a_grandchild,
                   "idle executor": with_an_idle_executor}
        p = ctx.Process(target=targets[sys.argv[2]], args=(q,))
        p.start()
        done = [q.get()]
        p.join(30)
        if p.exitcode is None:  # it hangs: end it, and say so
            p.kill()
            p.join()
            sys.exit("the child did not end")
        assert p.exitcode == 0, p.exitcode
    print(" ".join(f"{pid:x}:{rc}" for pid, rc in done))
"""


@pytest.mark.parametrize("how", ["process", "executor", "thread", "grandchild", "idle executor"])
@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_a_multiprocessing_child_s_sandboxes_leave_nothing_behind(tmp_path, method, how):
    # Fork and forkserver children end with os._exit after multiprocessing's
    # finalizers, never atexit: their cgroups (made ahead of need, or of
    # sandboxes that ended) and their workspaces were left behind.  The
    # finalizers run before the child's threads are joined: one still using
    # sandboxes then must not see them killed (thread), and an idle
    # executor's worker, woken by the child's end, must not hang it (idle
    # executor).  A fork child's own fork child starts with an empty
    # registry once more (grandchild).
    script = tmp_path / "worker.py"
    script.write_text(_MP_WORKER)
    temp = tmp_path / "tmp"
    temp.mkdir()
    r = subprocess.run(
        [PY, str(script), method, how],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, TMPDIR=str(temp)),
    )
    assert r.returncode == 0, r.stderr
    done = [t.split(":") for t in r.stdout.split()]
    assert done and all(rc == "0" for _owner, rc in done), done
    for owner, _rc in done:
        assert not glob.glob(f"/sys/fs/cgroup/**/sbx-{owner}-*", recursive=True), (owner, r.stderr)
    assert not os.listdir(temp)


def test_setup_errors_pickle_with_their_errno_class():
    import pickle

    from sbxlimit._spawn import child_error

    e = child_error("setuid", 1, 1000, executable="x", cwd=None)
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is type(e) and isinstance(e2, PermissionError)
    assert (e2.step, e2.errno, e2.detail) == ("setuid", 1, 1000)


def _drain_slowly(fd: int, pause: float) -> None:
    while os.read(fd, 16 << 10):
        time.sleep(pause)


def test_wait_timeout_is_one_deadline_for_every_stream():
    # The program's capped streams go to pipes of ours whose readers drain
    # slowly: the program is done after about 0.5 s, stdout's pump after
    # about 0.6 s, stderr's after about 1.4 s.  wait(timeout=1.0) must give
    # up after 1 s, not give each stream the whole timeout again (and then
    # return late without raising).
    outs = [os.pipe() for _ in range(2)]
    code = "import os\nfor fd in (1, 2): os.write(fd, b'x' * (240 << 10))"
    readers = [
        threading.Thread(target=_drain_slowly, args=(outs[0][0], 0.05)),
        threading.Thread(target=_drain_slowly, args=(outs[1][0], 0.13)),
    ]
    try:
        p = sbxlimit.Popen(
            [PY, "-c", code],
            limits=Limits(output="4Mi", wall_time=30),
            stdout=outs[0][1],
            stderr=outs[1][1],
        )
        for _r, w in outs:
            os.close(w)
        t0 = time.monotonic()
        for t in readers:
            t.start()
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(timeout=1.0)
        took = time.monotonic() - t0
        p.wait()
    finally:
        for t in readers:
            t.join()
        for r, _w in outs:
            os.close(r)
    assert took < 1.3, f"wait(timeout=1.0) raised after {took:.1f} s"


def test_output_past_the_cap_is_the_verdict_even_when_the_exit_is_seen_first(monkeypatch):
    # The pump counts late (a loaded machine): the program has exited and
    # been seen to before the excess is counted.  The verdict is the
    # limit's all the same.
    import time

    from sbxlimit import _pump

    real = _pump.Pump._read

    def late(self):
        time.sleep(0.3)
        return real(self)

    monkeypatch.setattr(_pump.Pump, "_read", late)
    code = "import sys\nsys.stdout.write('o' * 5000)\nsys.stderr.write('e' * 5000)"
    r = run_py(code, limits=Limits(output=6000), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert r.termination.reason == "output" and len(r.stdout) == 6000


def test_a_fork_computes_the_final_figures_still_pending_first():
    # A figure not computed yet (the supervisor reads it before it removes
    # its source) is computed before a fork: the child, where the parent's
    # supervisor does not run and the source may be gone, has the parent's.
    # One being computed by the supervisor at the fork is waited for.
    from sbxlimit._once import Once

    pending: Once[int] = Once(os.getpid)
    computing: Once[int] = Once(lambda: (held.set(), time.sleep(0.3), os.getpid())[2])
    held = threading.Event()
    t = threading.Thread(target=computing.get)
    t.start()
    assert held.wait(10)
    pid = os.fork()
    if pid == 0:
        signal.alarm(5)  # a hang ends the child, not the test run
        ours = pending.get() == computing.get() == os.getppid()
        os._exit(0 if ours else 1)
    _, status = os.waitpid(pid, 0)
    t.join()
    assert os.waitstatus_to_exitcode(status) == 0
    assert pending.done and computing.get() == os.getpid()


def test_a_figure_s_lock_held_at_a_fork_does_not_hang_the_child():
    # A thread that does not run in the child (the supervisor; a caller
    # closing the sandbox, which moves the workspace under the lock) held
    # the lock at the fork: in the child the lock is a new one.
    from sbxlimit._once import Once

    once: Once[int] = Once(lambda: 42)
    assert once.get() == 42
    held, done = threading.Event(), threading.Event()

    def holder() -> None:
        with once.lock:
            held.set()
            done.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert held.wait(10)
        pid = os.fork()
        if pid == 0:
            signal.alarm(5)  # a hang ends the child, not the test run
            with once.lock:
                os._exit(0 if once.get() == 42 else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        done.set()
        t.join()
    assert os.waitstatus_to_exitcode(status) == 0
