"""The command line, end to end, with real limited programs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile

import pytest

from .conftest import report, sleeping, tagged_sleep, wait_no_sleepers, why_not

PY = sys.executable
CLI = [PY, "-m", "sbxlimit"]


def cli(*args: str, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 60)
    return subprocess.run([*CLI, *args], **kw)


HOG = (
    "import os, time; os.fork(); os.fork(); hog = bytearray(40 << 20); "
    "hog[::4096] = b'x' * (len(hog) // 4096); time.sleep(20)"
)


def test_memory_hog_is_killed_with_its_reason():
    r = cli("run", "--memory", "64Mi", "--", PY, "-c", HOG)
    assert r.returncode == 124
    held_by = report().summary["memory"].split(" (")[0]
    # A cgroup kills by itself; without one, the watchdog part of the pair does.
    killer = held_by if held_by.startswith("cgroup") else "watchdog:memory"
    # "... after using 64.0 MiB of memory; its limit is 64.0 MiB (<killer>)", or when the
    # kernel's OOM killer struck first "...; its limit is 64.0 MiB, and the OOM killer had
    # killed N of its processes (<killer>)"; with a peak read below the limit "... on
    # reaching its memory limit of 64.0 MiB ...".
    said = ("of memory; its limit is 64.0 MiB", "on reaching its memory limit of 64.0 MiB")
    assert any(s in r.stderr for s in said) and f"({killer})" in r.stderr


def test_timeout_with_json_on_stdout():
    r = cli("run", "--timeout", "500ms", "--kill-grace", "1s", "--json", "--", "sleep", "30")
    assert r.returncode == 124
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert doc["exit_status"] == 124 and doc["command"] == "sleep"
    t = doc["termination"]
    assert t["reason"] == "wall_time" and t["limit"] == 0.5 and t["observed"] >= 0.5
    assert doc["enforced"]["wall_time"] == "watchdog:wall_time"
    assert doc["usage"]["wall"] >= 0.5
    assert "30" not in json.dumps(doc["termination"])  # argv beyond the name stays out


def test_json_to_a_file(tmp_path):
    out = tmp_path / "r.json"
    r = cli("run", "--cpu-time", "10s", f"--json={out}", "--", PY, "-c", "print('hi')")
    assert r.returncode == 0 and r.stdout == "hi\n"
    doc = json.loads(out.read_text())
    assert doc["termination"]["reason"] == "exited"
    assert doc["enforced"]["cpu_time"].endswith("rlimit:RLIMIT_CPU")


def test_output_flood_is_capped_and_streamed():
    code = "import sys\nwhile True: sys.stdout.write('z' * 4096)"
    r = cli("run", "--output", "20Ki", "--", PY, "-c", code)
    assert r.returncode == 124
    assert r.stdout == "z" * (20 << 10)
    assert "(supervisor:output)" in r.stderr


def test_exit_status_passthrough():
    assert cli("run", "--", PY, "-c", "raise SystemExit(3)").returncode == 3
    r = cli("run", "--", "sh", "-c", "kill -USR1 $$")
    assert r.returncode == 128 + signal.SIGUSR1
    assert cli("run", "--", "sbx-no-such-cmd").returncode == 127
    assert cli("run", "--", tempfile.gettempdir()).returncode == 126


@pytest.mark.parametrize(
    "args,needle",
    [
        (["run", "--memory", "12Zi", "--", "true"], "--memory 12Zi: not a size"),
        (["run", "--timeout", "soon", "--", "true"], "--timeout soon: not a duration"),
        (["run", "--bogus", "--", "true"], "unrecognized arguments"),
        (["run"], "missing command"),
        (["run", "--"], "missing command"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_argument_errors_are_one_line_and_exit_2(args, needle):
    r = cli(*args)
    assert r.returncode == 2
    assert needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_help_shows_examples():
    r = cli("run", "--help")
    assert r.returncode == 0 and "examples:" in r.stdout and "exit status" in r.stdout


def test_manifest_and_flag_override(tmp_path):
    m = tmp_path / "m.json"
    m.write_text(
        json.dumps(
            {
                "resources": {"memory": {"limit": "128Mi"}},
                "execution_limits": {"max_tool_call_duration": "300ms"},
            }
        )
    )
    r = cli("run", "--manifest", str(m), "--json", "--", "sleep", "10")
    doc = json.loads(r.stdout.splitlines()[-1])
    assert doc["termination"]["reason"] == "wall_time"
    assert "memory" in doc["enforced"] and "wall_time" in doc["enforced"]
    r = cli("run", "--manifest", str(m), "--timeout", "20s", "--json", "--", "true")
    assert json.loads(r.stdout.splitlines()[-1])["termination"]["reason"] == "exited"
    m.write_text('{"resources": {"memory": {"limit": "lots"}}}')
    r = cli("run", "--manifest", str(m), "--", "true")
    assert r.returncode == 2 and "resources.memory.limit" in r.stderr


# With cgroups turned off, a CPU rate has no mechanism at all on any OS.
NO_CGROUP = {**os.environ, "SBXLIMIT_CGROUP_PARENT": "none"}


def test_strict_refuses_what_cannot_be_held():
    r = cli("run", "--cpu", "500m", "--strict", "--", "true", env=NO_CGROUP)
    assert r.returncode == 125 and "cpu" in r.stderr and "strict" in r.stderr


def test_downgrades_are_warned_once_on_stderr():
    r = cli("run", "--cpu", "500m", "--", "true", env=NO_CGROUP)
    assert r.returncode == 0
    assert r.stderr.count("sbxlimit: warning: cpu is not enforced here") == 1


SPAWNER = (
    "import subprocess, sys, time\n"
    "a = subprocess.Popen(['sleep', sys.argv[1]])\n"
    "b = subprocess.Popen(['sleep', sys.argv[2]], start_new_session=True)\n"
    "print(a.pid, b.pid, flush=True)\n"
    "time.sleep(60)"
)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_the_cli_kills_the_tree(sig):
    tags = [tagged_sleep(), tagged_sleep()]
    p = subprocess.Popen(
        [*CLI, "run", "--kill-grace", "1s", "--", PY, "-c", SPAWNER, *tags],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert len(p.stdout.readline().split()) == 2
    assert all(len(sleeping(t)) == 1 for t in tags)
    p.send_signal(sig)
    rc = p.wait(timeout=15)
    p.stdout.close()
    assert rc == 128 + signal.SIGTERM  # the sandbox was ended with SIGTERM
    assert wait_no_sleepers(tags) == []


def test_doctor_cli_text_and_json():
    r = cli("doctor")
    assert "Mechanisms:" in r.stdout and "\033[" not in r.stdout  # not a tty: no colour
    j = cli("doctor", "--json")
    doc = json.loads(j.stdout)
    assert r.returncode == j.returncode == (0 if doc["ok"] else 1)


def test_console_script_is_installed():
    import shutil

    exe = shutil.which("sbxlimit") or os.path.join(os.path.dirname(PY), "sbxlimit")
    if not os.path.exists(exe):
        pytest.skip("console script not on PATH (editable install without scripts dir)")
    r = subprocess.run([exe, "run", "--", "true"], capture_output=True)
    assert r.returncode == 0


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_gc_removes_leftovers_of_dead_owners_only():
    dead = _dead_pid()
    tmp = tempfile.gettempdir()
    stale = os.path.join(tmp, f"sbxlimit-{dead:x}-1-abc")
    # One its owner was removing (renamed away) when it died.
    trash = os.path.join(tmp, f"sbxlimit-{dead:x}-2-abc.removing")
    live = os.path.join(tmp, f"sbxlimit-{os.getpid():x}-1-abc")
    other = os.path.join(tmp, f"not-ours-{dead:x}")
    for d in (stale, trash, live, other):
        os.makedirs(os.path.join(d, "sub"), exist_ok=True)
    try:
        r = cli("gc", "--dry-run")
        assert f"would remove workspace {stale}" in r.stdout and os.path.exists(stale)
        r = cli("gc")
        assert r.returncode == 0 and f"removed workspace {stale}" in r.stdout
        assert not os.path.exists(stale) and not os.path.exists(trash)
        assert os.path.exists(live) and os.path.exists(other)
    finally:
        import shutil

        for d in (stale, trash, live, other):
            shutil.rmtree(d, ignore_errors=True)


def test_gc_removes_empty_leftover_cgroups():
    if os.geteuid() != 0:
        pytest.skip(f"creating cgroups at a hierarchy root needs root; {why_not('cgroups')}")
    roots = [p for p in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup") if os.access(p, os.W_OK)]
    if not roots:
        pytest.skip("no writable cgroup hierarchy")
    path = os.path.join(roots[0], f"sbx-{_dead_pid():x}-1")
    try:
        os.mkdir(path)
    except OSError as e:
        pytest.skip(f"cannot create a cgroup here: {e}")
    try:
        r = cli("gc")
        assert f"removed cgroup {path}" in r.stdout
        assert not os.path.exists(path)
    finally:
        if os.path.exists(path):
            os.rmdir(path)


def test_output_cap_keeps_stderr_apart_when_both_are_inherited():
    r = cli("run", "--output", "1Ki", "--", "sh", "-c", "echo out; echo err >&2")
    assert r.returncode == 0
    assert r.stdout == "out\n" and "err\n" in r.stderr


# The CLI in a terminal's foreground, as a user runs it: a helper makes the
# pty its controlling terminal, then becomes the CLI.
IN_TERMINAL = """
import os, sys
os.setsid()
fd = os.open(sys.argv[1], os.O_RDWR)  # the controlling terminal now
for n in (0, 1, 2):
    os.dup2(fd, n)
os.execv(sys.executable, [sys.executable, "-m", "sbxlimit", *sys.argv[2:]])
"""
SESSION = "import os; print('own-session' if os.getsid(0) == os.getpid() else 'shared')"


@pytest.mark.parametrize(("flags", "expected"), [([], "own-session"), (["--terminal"], "shared")])
def test_a_policy_run_in_a_terminal(flags, expected):
    import select

    master, slave = os.openpty()
    out = b""
    try:
        cmd = ["run", "--deny-network", *flags, "--", PY, "-c", SESSION]
        p = subprocess.Popen([PY, "-c", IN_TERMINAL, os.ttyname(slave), *cmd])
        while True:
            done = p.poll() is not None
            if select.select([master], [], [], 0.05)[0]:
                out += os.read(master, 4096)
            elif done:
                break
        assert p.wait(timeout=60) == 0, out
    finally:
        os.close(master)
        os.close(slave)
    assert expected in out.decode(), out


def test_json_to_a_reader_that_left_keeps_the_status():
    # `sbxlimit run --json -- seq 1 100000 | head -1`
    p = subprocess.Popen(
        [*CLI, "run", "--json", "--", "seq", "1", "100000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdout.readline() == "1\n"
    p.stdout.close()
    err = p.stderr.read()
    p.stderr.close()
    # seq died of SIGPIPE: 128 + 13, as without --json; no traceback.
    assert p.wait(timeout=60) == 141, err
    assert "Traceback" not in err and "Error" not in err, err
