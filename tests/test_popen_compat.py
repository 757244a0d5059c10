"""sbxlimit.Popen behaves like subprocess.Popen.

Every test runs against three classes: subprocess.Popen itself (so the test
is known to describe subprocess's behaviour), sbxlimit.Popen without limits,
and sbxlimit.Popen in sandbox mode (limits given, its own process group,
supervisor attached).
"""

from __future__ import annotations

import errno
import functools
import os
import signal
import subprocess
import sys
import threading

import pytest

import sbxlimit

from .conftest import privileges

PY = sys.executable

CLASSES = {
    "subprocess": subprocess.Popen,
    "sbxlimit": sbxlimit.Popen,
    "sandbox": functools.partial(
        sbxlimit.Popen, limits=sbxlimit.Limits(wall_time=60, open_files=1024, output="64Mi")
    ),
}


@pytest.fixture(params=list(CLASSES))
def Popen(request):
    return CLASSES[request.param]


def py(code: str) -> list[str]:
    return [PY, "-c", code]


def test_pipes_and_communicate(Popen):
    with Popen(
        py("import sys; d = sys.stdin.read(); sys.stdout.write(d.upper()); sys.stderr.write('e')"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as p:
        out, err = p.communicate(b"hello")
    assert (out, err, p.returncode) == (b"HELLO", b"e", 0)


def test_text_mode_and_encoding(Popen):
    code = "import sys; sys.stdout.buffer.write('a\\r\\nb é'.encode('latin-1'))"
    p = Popen(py(code), stdout=subprocess.PIPE, encoding="latin-1")
    out, _ = p.communicate()
    assert out == "a\nb é"
    p = Popen(py("print('x')"), stdout=subprocess.PIPE, text=True)
    assert p.communicate()[0] == "x\n"
    assert p.universal_newlines


def test_stderr_to_stdout(Popen):
    p = Popen(
        py("import sys; print('o', flush=True); print('e', file=sys.stderr)"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    out, err = p.communicate()
    assert err is None and sorted(out.split()) == [b"e", b"o"]


def test_direct_reads_of_stdout(Popen):
    with Popen(py("print('line1'); print('line2')"), stdout=subprocess.PIPE) as p:
        assert p.stdout.readline() == b"line1\n"
        assert p.stdout.read() == b"line2\n"
    assert p.returncode == 0


def test_communicate_timeout_then_resume(Popen):
    p = Popen(
        py("import time, sys; print('a', flush=True); time.sleep(0.6); print('b')"),
        stdout=subprocess.PIPE,
    )
    with pytest.raises(subprocess.TimeoutExpired) as ei:
        p.communicate(timeout=0.2)
    assert ei.value.timeout == 0.2
    out, _ = p.communicate()
    assert out == b"a\nb\n"


def test_wait_timeout_poll_and_kill(Popen):
    p = Popen(py("import time; time.sleep(30)"))
    assert p.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=0.1)
    p.kill()
    assert p.wait() == -signal.SIGKILL
    assert p.poll() == -signal.SIGKILL


def test_terminate_and_send_signal(Popen):
    p = Popen(py("import time; time.sleep(30)"))
    p.send_signal(signal.SIGUSR1)
    assert p.wait() == -signal.SIGUSR1
    p = Popen(py("import time; time.sleep(30)"))
    p.terminate()
    assert p.wait() == -signal.SIGTERM
    p.send_signal(signal.SIGTERM)  # after exit: a no-op, as in subprocess


def test_exit_status(Popen):
    assert Popen(py("raise SystemExit(7)")).wait() == 7


def test_shell_and_executable(Popen):
    p = Popen("echo $0 $((2+3))", shell=True, stdout=subprocess.PIPE)
    assert p.communicate()[0] == b"/bin/sh 5\n"
    p = Popen(
        ["alias-name", "-c", "import sys; print(sys.argv[0])"],
        executable=PY,
        stdout=subprocess.PIPE,
    )
    assert p.communicate()[0] == b"-c\n"


def test_bytes_and_pathlike_args(Popen, tmp_path):
    script = tmp_path / "s.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    script.chmod(0o755)
    assert Popen(script, stdout=subprocess.PIPE).communicate()[0] == b"ran\n"
    assert Popen([os.fsencode(script)], stdout=subprocess.PIPE).communicate()[0] == b"ran\n"


def test_env_and_path_lookup_in_env(Popen, tmp_path):
    tool = tmp_path / "mytool"
    tool.write_text("#!/bin/sh\necho tool:$FOO\n")
    tool.chmod(0o755)
    env = {"PATH": str(tmp_path), "FOO": "bar"}
    p = Popen(["mytool"], env=env, stdout=subprocess.PIPE)
    assert p.communicate()[0] == b"tool:bar\n"
    p = Popen(py("import os; print(sorted(os.environ))"), env={"ONLY": "1"}, stdout=subprocess.PIPE)
    assert p.communicate()[0].decode().strip() in ("['ONLY']", "['LC_CTYPE', 'ONLY']")


def test_cwd(Popen, tmp_path):
    p = Popen(py("import os; print(os.getcwd())"), cwd=tmp_path, stdout=subprocess.PIPE)
    assert p.communicate()[0].decode().strip() == str(tmp_path)


def test_missing_program_errors(Popen):
    with pytest.raises(FileNotFoundError) as ei:
        Popen(["sbx-no-such-program-xyz"])
    assert ei.value.errno == errno.ENOENT
    assert ei.value.filename == "sbx-no-such-program-xyz"
    with pytest.raises(FileNotFoundError) as ei:
        Popen(["/nonexistent/dir/prog"])
    assert ei.value.filename == "/nonexistent/dir/prog"


def test_permission_error(Popen, tmp_path):
    if os.geteuid() == 0:
        pytest.skip(f"root may execute any file with an x bit ({privileges()})")
    f = tmp_path / "noexec"
    f.write_text("#!/bin/sh\necho hi\n")
    f.chmod(0o644)
    with pytest.raises(PermissionError) as ei:
        Popen([str(f)])
    assert ei.value.errno == errno.EACCES and ei.value.filename == str(f)


def test_permission_error_any_user(Popen, tmp_path):
    # A directory is never executable, for root too.
    with pytest.raises(PermissionError) as ei:
        Popen([str(tmp_path)])
    assert ei.value.errno == errno.EACCES and ei.value.filename == str(tmp_path)


def test_exec_format_error(Popen, tmp_path):
    f = tmp_path / "notscript"
    f.write_bytes(b"\x00\x01\x02garbage")
    f.chmod(0o755)
    with pytest.raises(OSError) as ei:
        Popen([str(f)])
    assert ei.value.errno == errno.ENOEXEC and ei.value.filename == str(f)


def test_cwd_errors(Popen, tmp_path):
    with pytest.raises(FileNotFoundError) as ei:
        Popen(["true"], cwd=tmp_path / "missing")
    assert ei.value.filename == tmp_path / "missing"
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(NotADirectoryError) as ei:
        Popen(["true"], cwd=str(f))
    assert ei.value.filename == str(f)


def test_pass_fds_and_close_fds(Popen):
    r, w = os.pipe()
    r2, w2 = os.pipe()
    try:
        code = f"import os; os.write({w}, b'via-fd');print(os.path.exists('/proc/self/fd/{w2}'))"
        p = Popen(py(code), pass_fds=[w], stdout=subprocess.PIPE)
        out, _ = p.communicate()
        os.close(w)
        assert os.read(r, 100) == b"via-fd"
        assert out == b"False\n"  # not passed: closed
        # close_fds=False keeps inheritable fds
        os.set_inheritable(w2, True)
        p = Popen(
            py(f"import os; print(os.path.exists('/proc/self/fd/{w2}'))"),
            close_fds=False,
            stdout=subprocess.PIPE,
        )
        assert p.communicate()[0] == b"True\n"
    finally:
        for fd in (r, r2, w2):
            os.close(fd)


def test_stdio_from_low_fds(Popen):
    # A pipe whose fds are 0/1 must still land right (bpo-12607 shape).
    p = Popen(
        py("import sys; sys.stdout.write(sys.stdin.read())"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert p.communicate(b"x" * 100000)[0] == b"x" * 100000


def test_new_session_and_process_group(Popen):
    p = Popen(
        py("import os; print(os.getsid(0) == os.getpid(), os.getpgid(0) == os.getpid())"),
        start_new_session=True,
        stdout=subprocess.PIPE,
    )
    assert p.communicate()[0] == b"True True\n"
    p = Popen(
        py("import os; print(os.getsid(0) == os.getpid(), os.getpgid(0) == os.getpid())"),
        process_group=0,
        stdout=subprocess.PIPE,
    )
    assert p.communicate()[0] == b"False True\n"


def test_umask(Popen):
    p = Popen(py("import os; print(oct(os.umask(0)))"), umask=0o027, stdout=subprocess.PIPE)
    assert p.communicate()[0] == b"0o27\n"


def _sigign(Popen, **kw) -> int:
    # cat, not Python: Python ignores SIGPIPE itself at startup.
    out = Popen(["cat", "/proc/self/status"], stdout=subprocess.PIPE, **kw).communicate()[0]
    line = next(x for x in out.decode().splitlines() if x.startswith("SigIgn"))
    return int(line.split()[1], 16)


def test_restore_signals(Popen):
    pipe, xfsz = 1 << (signal.SIGPIPE - 1), 1 << (signal.SIGXFSZ - 1)
    assert not _sigign(Popen) & (pipe | xfsz)
    assert _sigign(Popen, restore_signals=False) & pipe


@pytest.mark.skipif(os.geteuid() != 0, reason=f"changing user needs CAP_SETUID ({privileges()})")
def test_user_group_extra_groups(Popen):
    # /bin/sh, not this Python: it may live where nobody cannot read.
    p = Popen(
        ["/bin/sh", "-c", "echo $(id -u) $(id -g) $(id -G)"],
        cwd="/",
        user=65534,
        group=65534,
        extra_groups=[65534, 100],
        stdout=subprocess.PIPE,
    )
    uid, gid, *groups = p.communicate()[0].split()
    assert (uid, gid, sorted(groups)) == (b"65534", b"65534", [b"100", b"65534"])


@pytest.mark.skipif(os.geteuid() != 0, reason=f"changing user needs CAP_SETUID ({privileges()})")
def test_ids_over_the_whole_uid_t_and_gid_t_range(Popen):
    # Above 2**31: a C long on the way would overflow; 2**32 - 1 is "unchanged".
    big = 2**31 + 5
    p = Popen(
        ["/bin/sh", "-c", "echo $(id -u) $(id -G)"],
        cwd="/",
        user=big,
        extra_groups=[big, 2**32 - 2],
        stdout=subprocess.PIPE,
    )
    uid, *groups = p.communicate()[0].split()
    assert (uid, sorted(groups)) == (str(big).encode(), [b"0", str(big).encode(), b"4294967294"])
    with Popen(["true"], user=2**32 - 1, group=2**32 - 1) as unchanged:
        assert unchanged.wait() == 0


def test_ids_out_of_range_are_refused_as_subprocess_refuses_them(Popen):
    for gid in (2**32, 2**64):
        with pytest.raises(ValueError, match="invalid group id"):
            Popen(["true"], extra_groups=[gid])
    with pytest.raises(OverflowError):
        Popen(["true"], user=2**32)
    with pytest.raises(OverflowError):
        Popen(["true"], group=2**32)
    with pytest.raises(ValueError):
        Popen(["true"], extra_groups=[-5])


@pytest.mark.skipif(os.geteuid() == 0, reason=f"root may change user ({privileges()})")
def test_user_change_refused_unprivileged(Popen):
    with pytest.raises(PermissionError):
        Popen(["true"], user=0 if os.geteuid() else 1)


def test_preexec_fn(Popen, tmp_path):
    marker = tmp_path / "m"

    def pre():
        with open(marker, "w") as f:
            f.write(str(os.getpid()))

    p = Popen(py("import os; print(os.getpid())"), preexec_fn=pre, stdout=subprocess.PIPE)
    pid = p.communicate()[0].decode().strip()
    assert marker.read_text() == pid

    def boom():
        raise RuntimeError("no")

    with pytest.raises(subprocess.SubprocessError, match="preexec_fn"):
        Popen(["true"], preexec_fn=boom)


def test_many_threads_spawn_at_once(Popen):
    results: dict[int, bytes] = {}
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            p = Popen(py(f"print({i})"), stdout=subprocess.PIPE)
            results[i] = p.communicate()[0]
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert results == {i: f"{i}\n".encode() for i in range(50)}


def test_invalid_arguments_fail_before_start(Popen):
    with pytest.raises(ValueError):
        Popen(["true"], env={"A=B": "1"})
    with pytest.raises((ValueError, TypeError)):
        Popen(["tr\0ue"])


def test_run_matches_subprocess_run():
    a = subprocess.run(
        py("import sys; print(sys.stdin.read()[::-1])"), input="abc", capture_output=True, text=True
    )
    b = sbxlimit.run(
        py("import sys; print(sys.stdin.read()[::-1])"), input="abc", capture_output=True, text=True
    )
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)
    assert isinstance(b, subprocess.CompletedProcess)
    with pytest.raises(subprocess.CalledProcessError) as ei:
        sbxlimit.run(py("raise SystemExit(3)"), check=True)
    assert ei.value.returncode == 3
    with pytest.raises(subprocess.TimeoutExpired):
        sbxlimit.run(py("import time; time.sleep(10)"), timeout=0.2)
    with pytest.raises(ValueError):
        sbxlimit.run(["true"], input=b"x", stdin=subprocess.PIPE)


# A fork's copy of a running Popen: its child polls it, drops it, or leaves
# the with-block it was made in (SystemExit, then the atexit handlers).  The
# parent's program and what it started must live on, as with subprocess.
_FORK_COPY = r"""
import contextlib, gc, os, subprocess, sys, time
import sbxlimit

kind, action = sys.argv[1:3]
ends = []  # what the audit hears of an end: none is the copy's to tell
sbxlimit.audit.subscribe(lambda e: e.name in ("exit", "killed") and ends.append(e))
make = {
    "subprocess": subprocess.Popen,
    "sandbox": lambda a: sbxlimit.Popen(a, limits=sbxlimit.Limits(wall_time=60)),
    "memory": lambda a: sbxlimit.Popen(a, limits=sbxlimit.Limits(memory="1Gi")),
    "no cgroup": lambda a: sbxlimit.Popen(
        a, limits=sbxlimit.Limits(wall_time=60), cgroup_parent="none"
    ),
    "policy": lambda a: sbxlimit.Popen(a, policy=sbxlimit.Policy(workdir="/")),
}[kind]


def tree(root):
    # root and its descendants, from every process's parent
    parent = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    parent[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, todo = set(), [root]
    while todo:
        p = todo.pop()
        found.add(p)
        todo += [c for c, pp in parent.items() if pp == p and c not in found]
    return found


p = make(["sh", "-c", "sleep 60 & exec sleep 60"])
with p if action == "exit" else contextlib.nullcontext():
    deadline = time.monotonic() + 10
    while len(tree(p.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    before = tree(p.pid)
    child = os.fork()
    if child == 0:
        if action == "poll":
            p.poll()
            p.wait()
            os._exit(len(ends))
        if action == "drop":
            del p
            gc.collect()
            os._exit(len(ends))
        sys.exit(0)  # "exit": through the with-block's __exit__, then atexit
    status = os.waitpid(child, 0)[1]
    time.sleep(0.2)
    print(len(before), p.poll(), sorted(before - tree(p.pid)), status, flush=True)
    for pid in tree(p.pid) - {p.pid}:  # subprocess's kill() ends the leader only
        os.kill(pid, 9)
    p.kill()
    p.wait()
"""


@pytest.mark.parametrize("action", ["poll", "drop", "exit"])
@pytest.mark.parametrize("kind", ["subprocess", "sandbox", "memory", "no cgroup", "policy"])
def test_a_fork_s_copy_never_ends_its_parent_s_program(kind, action):
    r = subprocess.run(
        [PY, "-c", _FORK_COPY, kind, action], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    found, rc, gone, status = _fields(r.stdout)
    assert int(found) >= 2  # the program and the sleep it started
    assert rc == "None" and gone == "[]" and status == "0", r.stdout


def _fields(out: str) -> tuple[str, str, str, str]:
    """found, returncode, gone (a list), the child's status."""
    found, rc, rest = out.split(maxsplit=2)
    gone, status = rest.rsplit(maxsplit=1)
    return found, rc, gone, status
