"""The macOS path: Seatbelt applied by sbxlimit's own helper, memory and the
other limits held by the tree watchdog.

Off macOS, the real helper (csrc/darwin/seatbelt_exec.c) and the real
wrapper of sandbox_init (csrc/darwin/seatbelt_apply.c) are built against a
double of libsandbox (tests/c/darwin/fake_sandbox.c) that behaves as the
real call is documented to (0; -1 with a message; EPERM when the caller is
already sandboxed) and logs each profile it would apply.  Everything the
parent does around them runs for real.  The tests that need the real
sandbox run on macOS only (the GitHub Actions macOS jobs) and skip here.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest

import sbxlimit
from sbxlimit import Limits, Policy, _core, _plan, _platform, _seatbelt
from sbxlimit._forked import ForkedSandbox

MACOS = sys.platform == "darwin"
pytestmark = pytest.mark.filterwarnings("ignore:sbxlimit.*not enforced here:RuntimeWarning")
on_macos = pytest.mark.skipif(not MACOS, reason="needs macOS's Seatbelt (sandbox_init)")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CC = shutil.which("cc") or shutil.which("gcc")
DARWIN_C = [os.path.join(ROOT, "csrc", "darwin", f) for f in ("seatbelt_apply.c",)]
FAKE = os.path.join(ROOT, "tests", "c", "darwin", "fake_sandbox.c")
FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Wshadow", "-Werror", "-D_GNU_SOURCE"]


@pytest.fixture(scope="session")
def fake_libsandbox(tmp_path_factory):
    """The helper program and the apply wrapper, built against the double."""
    if MACOS:
        pytest.skip("macOS has the real sandbox_init")
    if CC is None:
        pytest.skip("no C compiler to build the helper against the libsandbox double")
    out = tmp_path_factory.mktemp("seatbelt")
    helper, lib = str(out / "_seatbelt_exec"), str(out / "libapply.so")
    inc = ["-I", os.path.join(ROOT, "csrc", "darwin")]
    src = os.path.join(ROOT, "csrc", "darwin", "seatbelt_exec.c")
    subprocess.run([CC, *FLAGS, *inc, src, *DARWIN_C, FAKE, "-o", helper], check=True)
    subprocess.run([CC, *FLAGS, *inc, "-shared", "-fPIC", *DARWIN_C, FAKE, "-o", lib], check=True)
    return helper, lib


@pytest.fixture
def fake_macos(fake_libsandbox, tmp_path, monkeypatch):
    """Plan and spawn as on macOS; returns the log of applied profiles."""
    helper, lib = fake_libsandbox
    log = tmp_path / "applied"
    monkeypatch.setenv("SBX_FAKE_SANDBOX_LOG", str(log))
    monkeypatch.setattr(_platform, "DARWIN", True)
    monkeypatch.setattr(_platform, "LINUX", False)
    monkeypatch.setattr(_seatbelt, "HELPER", helper)
    apply = ctypes.CDLL(lib).sbx_seatbelt_apply
    apply.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]

    def seatbelt_apply(profile: str) -> None:  # what the binding does with it
        msg = ctypes.create_string_buffer(512)
        err = apply(profile.encode(), msg, len(msg))
        if err:
            raise OSError(err, msg.value.decode())

    monkeypatch.setattr(_core, "seatbelt_apply", seatbelt_apply, raising=False)
    _plan._cache.clear()
    yield log
    _plan._cache.clear()


def applied(log) -> list[str]:
    return log.read_text().split("\n--- applied\n")[:-1] if log.exists() else []


POLICY = Policy(writable_roots=["/opt/data"], network="proxy", proxy_ports=[3128], workdir="/")


def test_a_program_runs_under_its_profile_through_the_helper(fake_macos):
    r = sbxlimit.run(
        ["sh", "-c", 'echo "$0|$HTTPS_PROXY|$1"', "argv0", "arg one"],
        policy=POLICY,
        capture_output=True,
        text=True,
    )
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == "argv0|http://127.0.0.1:3128|arg one\n"  # argv[0] kept, as subprocess
    assert applied(fake_macos) == [POLICY.seatbelt_profile()]
    assert r.enforced["files"].startswith("seatbelt:sandbox_init")
    assert r.enforced["network"] == "seatbelt:sandbox_init"
    # workdir="/": the search for repositories stops at its bound, and says so.
    assert r.enforced["protect_dotfiles"].startswith("seatbelt:sandbox_init (this search stopped")


def test_the_profile_names_the_private_workspace(fake_macos):
    r = sbxlimit.run(["sh", "-c", "pwd"], policy=Policy(), capture_output=True, text=True)
    ws = r.stdout.strip()
    (profile,) = applied(fake_macos)
    assert ws and _core.seatbelt_canonical(ws) in profile
    assert "/private/var/folders" not in profile  # not every temp dir: only its own


def test_no_profile_file_and_no_fd_reach_the_program(fake_macos):
    roots = [f"/data/{'x' * 200}/{i}" for i in range(1000)]  # a profile past 128 KiB
    before = set(os.listdir(tempfile.gettempdir()))
    r = sbxlimit.run(
        ["ls", "/proc/self/fd"],
        policy=Policy(writable_roots=roots, workdir="/"),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert sorted(int(fd) for fd in r.stdout.split()) == [0, 1, 2, 3]  # 3: ls's own listing
    (profile,) = applied(fake_macos)
    assert len(profile) > 128 * 1024 and "/data/" in profile
    assert not [n for n in set(os.listdir(tempfile.gettempdir())) - before if "profile" in n]


def test_a_refused_profile_is_a_setup_error_not_an_exit_status(fake_macos, tmp_path):
    # A caller already under a sandbox: macOS refuses a second profile.
    env = dict(os.environ, SBX_FAKE_SANDBOXED="1")
    marker = tmp_path / "ran"
    with pytest.raises(sbxlimit.SandboxSetupError) as e:
        sbxlimit.Popen(["touch", str(marker)], policy=Policy(workdir=str(tmp_path)), env=env)
    assert e.value.step == "seatbelt:apply" and e.value.errno == errno.EPERM
    assert isinstance(e.value, PermissionError)
    assert "Operation not permitted" in str(e.value) and "already" in str(e.value)
    assert not marker.exists() and applied(fake_macos) == []


def test_exec_failure_behind_the_helper_is_the_same_oserror(fake_macos, tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        sbxlimit.Popen([str(tmp_path / "missing")], policy=Policy(workdir=str(tmp_path)))
    assert e.value.filename == str(tmp_path / "missing")
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(PermissionError):
        sbxlimit.Popen([str(script)], policy=Policy(workdir=str(tmp_path)))


def _touch(path: str) -> int:
    with open(path, "w"):
        return 7


def test_a_forked_body_runs_under_the_profile(fake_macos, tmp_path):
    out = str(tmp_path / "out")
    p = ForkedSandbox(lambda: _touch(out), policy=Policy(workdir=str(tmp_path)))
    assert p.wait() == 7 and os.path.exists(out)
    (profile,) = applied(fake_macos)
    assert profile.startswith("(version 1)") and _core.seatbelt_canonical(str(tmp_path)) in profile


def test_a_forked_body_never_runs_unsandboxed(fake_macos, tmp_path, monkeypatch):
    monkeypatch.setenv("SBX_FAKE_SANDBOXED", "1")
    out = str(tmp_path / "out")
    with pytest.raises(sbxlimit.SandboxSetupError) as e:
        ForkedSandbox(lambda: _touch(out), policy=Policy(workdir=str(tmp_path)))
    assert e.value.step == "seatbelt:apply" and e.value.errno == errno.EPERM
    assert not os.path.exists(out)


def test_missing_helper_degrades_or_refuses(monkeypatch):
    monkeypatch.setattr(_platform, "DARWIN", True)
    monkeypatch.setattr(_platform, "LINUX", False)
    monkeypatch.setattr(_seatbelt, "HELPER", "/nonexistent/_seatbelt_exec")
    _plan._cache.clear()
    try:
        p = _plan.plan(None, Policy(network="deny"), uid=os.geteuid())
        assert p.enforced["network"].startswith("unenforced:") and not p.seatbelt
        assert "_seatbelt_exec is missing" in p.enforced["network"]
        with pytest.raises(sbxlimit.UnsupportedError, match="_seatbelt_exec is missing"):
            sbxlimit.Popen(["true"], policy=Policy(network="deny", strict=True, workdir="/"))
    finally:
        _plan._cache.clear()


def test_the_terminal_on_its_stdio_is_named_and_no_other(fake_macos, tmp_path):
    # The profile allows the terminal the sandbox was started on, and no
    # other of the user's; the enforced entry says TIOCSTI is refused.
    master, slave = os.openpty()
    other_m, other_s = os.openpty()
    try:
        r = sbxlimit.run(["true"], policy=Policy(workdir=str(tmp_path)), stdin=slave)
        (profile,) = applied(fake_macos)
        mine, theirs = os.ttyname(slave), os.ttyname(other_s)
        assert f'(literal "{_core.seatbelt_canonical(mine)}")' in profile
        assert theirs not in profile
        assert "TIOCSTI refused by the Seatbelt profile" in r.enforced["terminal"]
    finally:
        for fd in (master, slave, other_m, other_s):
            os.close(fd)


def test_a_symlinked_dotfile_reaches_the_profile_as_link_and_target(
    fake_macos, tmp_path, monkeypatch
):
    home, dots = tmp_path / "home", tmp_path / "dotfiles"
    home.mkdir()
    dots.mkdir()
    (dots / "zshrc").write_text("# rc\n")
    (home / ".zshrc").symlink_to(dots / "zshrc")
    monkeypatch.setenv("HOME", str(home))
    sbxlimit.run(["true"], policy=Policy(workdir=str(tmp_path / "home")))
    (profile,) = applied(fake_macos)
    canon = _core.seatbelt_canonical
    assert f'(subpath "{canon(str(home))}/.zshrc")' in profile
    assert f'(subpath "{canon(str(dots / "zshrc"))}")' in profile
    assert f'(subpath "{canon(str(home))}/Library/LaunchAgents")' in profile


def test_unix_sockets_reach_the_profile(fake_macos, tmp_path):
    r = sbxlimit.run(
        ["true"], policy=Policy(workdir=str(tmp_path), unix_sockets=["/var/run/app.sock"])
    )
    (profile,) = applied(fake_macos)
    assert "(deny network-outbound (remote unix-socket))" in profile
    assert "app.sock" in profile and "app.sock" in r.enforced["unix_sockets"]


@pytest.fixture
def darwin_plan(monkeypatch):
    monkeypatch.setattr(_platform, "DARWIN", True)
    monkeypatch.setattr(_platform, "LINUX", False)
    _plan._cache.clear()
    yield lambda limits: _plan.plan(limits, None, uid=501)
    _plan._cache.clear()


def test_memory_is_the_tree_watchdog_not_an_rlimit(darwin_plan):
    # macOS 12+ refuses RLIMIT_DATA below the map's size: every start failed.
    import resource

    p = darwin_plan(Limits(memory="1Gi"))
    assert p.watch_memory == 1 << 30
    assert all(r[0] != resource.RLIMIT_DATA for r in p.rlimits)
    assert p.enforced["memory"].startswith("watchdog:memory (phys_footprint")
    assert "memory" in p.fallbacks  # no cgroup: strict=True still refuses it


def test_address_space_is_unenforced_on_macos(darwin_plan):
    import resource

    p = darwin_plan(Limits(address_space="4Gi"))
    assert all(r[0] != resource.RLIMIT_AS for r in p.rlimits)
    assert p.enforced["address_space"].startswith("unenforced: macOS 12+ refuses an RLIMIT_AS")


def test_cpu_time_and_pids_end_the_tree_on_macos(darwin_plan):
    p = darwin_plan(Limits(cpu_time=2, pids=16))
    assert p.watch_cpu_time == 2 and p.watch_pids == 16
    assert p.enforced["cpu_time"].startswith("watchdog:cpu_time+rlimit:RLIMIT_CPU")
    assert "only sends SIGXCPU on macOS" in p.enforced["cpu_time"]
    assert p.enforced["pids"].startswith("watchdog:pids")


def test_die_with_parent_is_said_unenforced_on_macos(darwin_plan):
    p = darwin_plan(Limits(wall_time=5))
    assert p.enforced["die_with_parent"].startswith("unenforced: macOS has no parent-death")
    assert "die_with_parent" not in p.downgrades  # nobody asked: strict does not refuse it


def test_die_with_parent_true_is_refused_where_there_is_no_such_signal(monkeypatch):
    monkeypatch.setattr(_platform, "LINUX", False)
    with pytest.raises(sbxlimit.ConfigError, match="parent-death signal"):
        sbxlimit.Popen(["true"], die_with_parent=True)


def test_proxy_env():
    assert _seatbelt.proxy_env(Policy()) == {}
    env = _seatbelt.proxy_env(Policy(network="proxy", proxy_ports=[8080, 3128]))
    assert env["HTTP_PROXY"] == env["https_proxy"] == "http://127.0.0.1:3128"


# -- on macOS, for real -----------------------------------------------------


@on_macos
def test_writes_outside_the_allowed_places_are_denied(tmp_path):
    # The default policy: its private workspace (cwd and TMPDIR) and nothing
    # else; not the caller's temp dir, not /tmp.
    home_file = os.path.expanduser("~/.sbxlimit-test-should-not-exist")
    outside = tmp_path / "outside"
    script = (
        f"touch {home_file}; echo $?; touch $TMPDIR/ok; echo $?; touch ./here; echo $?; "
        f"touch {outside}; echo $?; touch /tmp/sbxlimit-test-$$; echo $?"
    )
    r = sbxlimit.run(["/bin/sh", "-c", script], policy=Policy(), capture_output=True, text=True)
    assert r.stdout.split() == ["1", "0", "0", "1", "1"], r.stderr
    assert not os.path.exists(home_file) and not outside.exists()


@on_macos
def test_dotfiles_are_protected():
    r = sbxlimit.run(
        ["/bin/sh", "-c", "echo x >> ~/.zshrc; echo $?"],
        policy=Policy(writable_roots=[os.path.expanduser("~")]),
        capture_output=True,
        text=True,
    )
    assert r.stdout.strip() == "1"


@on_macos
def test_network_deny():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"
    try:
        r = sbxlimit.run([sys.executable, "-c", code], policy=Policy(network="deny"))
        assert r.returncode != 0
        ok = sbxlimit.run(
            [sys.executable, "-c", code], policy=Policy(network="proxy", proxy_ports=[port])
        )
        assert ok.returncode == 0
    finally:
        srv.close()


@on_macos
def test_kill_tree_reaches_descendants():
    p = sbxlimit.Popen(
        ["/bin/sh", "-c", "sleep 60 & sleep 60 & wait"], limits=sbxlimit.Limits(wall_time=30)
    )
    p.kill_tree(grace=0)
    assert p.returncode is not None
    out = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True)
    assert out.stdout == ""


def _py(code: str, **kw) -> subprocess.CompletedProcess[str]:
    return sbxlimit.run([sys.executable, "-c", code], capture_output=True, text=True, **kw)


@on_macos
def test_memory_limits_let_a_sandbox_start_and_end_the_tree():
    # macOS 12+ refused RLIMIT_DATA below the map's size: every start failed.
    ok = sbxlimit.run(["/usr/bin/true"], limits=Limits(memory="1Gi"))
    assert ok.returncode == 0 and ok.termination.reason == "exited"
    hog = (
        "import os, time\n"
        "os.fork()\n"
        "b = bytearray(150 << 20)\n"
        "b[::4096] = b'x' * (len(b) // 4096)\n"
        "time.sleep(30)\n"
    )
    r = _py(hog, limits=Limits(memory="200Mi", wall_time=20))
    assert r.termination.reason == "memory", r.termination.message


@on_macos
def test_cpu_time_ends_a_program_that_ignores_sigxcpu():
    code = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass\n"
    r = _py(code, limits=Limits(cpu_time=1, wall_time=20))
    assert r.termination.reason == "cpu_time", r.termination.message


@on_macos
def test_the_tree_walk_sees_and_ends_a_setsid_grandchild():
    from sbxlimit import _doctor

    c = _doctor._check_process_tree()
    assert c.status == "ok", c.reason


@on_macos
def test_tiocsti_is_refused_even_on_its_own_terminal():
    # A pty of its own, made its controlling terminal: TIOCSTI works there
    # without the profile (the control run), not under it.
    code = (
        "import fcntl, os, termios\n"
        "m, s = os.openpty()\n"
        "if os.getsid(0) != os.getpid(): os.setsid()\n"
        "fcntl.ioctl(s, termios.TIOCSCTTY, 0)\n"
        "try:\n"
        "    fcntl.ioctl(s, termios.TIOCSTI, b'x')\n"
        "    print('typed')\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n"
    )
    control = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, start_new_session=True
    )
    assert control.stdout.strip() == "typed", control.stderr
    r = _py(code, policy=Policy())
    assert r.stdout.split()[:1] == ["refused"], r.stdout + r.stderr


@on_macos
def test_another_terminal_of_the_user_is_out_of_reach():
    master, slave = os.openpty()
    try:
        name = os.ttyname(slave)
        code = f"import os\nos.close(os.open({name!r}, os.O_RDWR | os.O_NOCTTY))\nprint('opened')"
        assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
        r = _py(code, policy=Policy())
        assert "opened" not in r.stdout and "Operation not permitted" in r.stderr
        # A pty of its own works (pexpect, script).
        own = _py(
            "import os\nm, s = os.openpty()\nos.write(m, b'hi\\n')\nprint(os.read(s, 3))",
            policy=Policy(),
        )
        assert own.stdout.strip() == "b'hi\\n'", own.stderr
    finally:
        os.close(master)
        os.close(slave)


@on_macos
def test_unix_sockets_outside_are_refused_unless_given(tmp_path):
    path = str(tmp_path / "host.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen()
    code = f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({path!r})\nprint('in')"
    try:
        denied = _py(code, policy=Policy())
        assert "in" not in denied.stdout and "Operation not permitted" in denied.stderr
        given = _py(code, policy=Policy(unix_sockets=[path]))
        assert given.stdout.strip() == "in", given.stderr
        # Its own sockets, in its workspace, work in every network mode.
        own = (
            "import socket\n"
            "s = socket.socket(socket.AF_UNIX); s.bind('own.sock'); s.listen()\n"
            "c = socket.socket(socket.AF_UNIX); c.connect('own.sock'); print('own')\n"
        )
        assert _py(own, policy=Policy(network="deny")).stdout.strip() == "own"
    finally:
        srv.close()


@on_macos
def test_a_hard_link_cannot_reach_a_protected_file(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".zshrc").write_text("# rc\n")
    monkeypatch.setenv("HOME", str(home))
    script = (
        "ln a b; echo $?; "  # inside the workspace: allowed
        f"ln {home}/.zshrc ./z; echo $?; echo evil >> ./z; echo $?"
    )
    r = sbxlimit.run(
        ["/bin/sh", "-c", f"echo x > a; {script}"], policy=Policy(), capture_output=True, text=True
    )
    inside, link, write = r.stdout.split()
    assert inside == "0", r.stderr  # hard links work in the workspace
    # The protected file is neither linked nor written through a link
    # (which one macOS refuses is its business).
    assert (home / ".zshrc").read_text() == "# rc\n"
    assert link != "0" or write != "0"


@on_macos
def test_other_processes_environments_are_not_readable(monkeypatch):
    # kern.procargs2 returns the environment of the user's other processes.
    monkeypatch.setenv("SBXLIMIT_TEST_SECRET", "hunter2-canary")
    probe = subprocess.Popen(["/bin/sleep", "30"])
    try:
        argv = ["/bin/ps", "-E", "-ww", "-o", "command=", "-p", str(probe.pid)]
        control = subprocess.run(argv, capture_output=True, text=True)
        assert "hunter2-canary" in control.stdout
        r = sbxlimit.run(argv, policy=Policy(), capture_output=True, text=True)
        assert "hunter2-canary" not in r.stdout
    finally:
        probe.kill()
        probe.wait()


@on_macos
def test_a_sandbox_inside_a_sandbox_is_a_setup_error():
    code = (
        "import sbxlimit\n"
        "try:\n"
        "    sbxlimit.run(['/usr/bin/true'], policy=sbxlimit.Policy())\n"
        "except sbxlimit.SandboxSetupError as e:\n"
        "    print(e.step, e.errno)\n"
    )
    r = _py(code, policy=Policy())
    assert r.stdout.split() == ["seatbelt:apply", str(errno.EPERM)], r.stdout + r.stderr


@on_macos
def test_a_forked_body_runs_under_the_profile_for_real(tmp_path):
    target = os.path.expanduser("~/.sbxlimit-forked-should-not-exist")
    p = ForkedSandbox(lambda: _touch(target), policy=Policy())
    assert p.wait() != 0 and not os.path.exists(target)
