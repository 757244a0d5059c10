"""The macOS C code (csrc/darwin/proctree.c, close_fds in csrc/fds.c) on Linux.

There is no Mac here: the real sources are compiled unchanged with the host C
compiler against a model of libproc (tests/c/darwin/: fake <libproc.h>,
<sys/proc_info.h> and <mach/mach_time.h> first on the include path, and
fake_libproc.c), which behaves as XNU documents and implements it:
proc_listchildpids returns a count of pids, never more than fit;
PROC_PIDTASKINFO answers 0 for zombies and gone pids; proc_pid_rusage answers
for zombies with the record kept at exit; times are Mach absolute time units
(Apple Silicon's 125/3 ns); kill() is recorded and applied to the table
(-Dkill=fake_kill), never sent.  abi_check.c proves the fake headers declare
what the macOS SDK declares (compiled with zig against the SDK's headers).

test_fds.c runs csrc/spawn.c + csrc/fds.c the way macOS does (no close_range,
no /proc walk: -DSBX_TEST_PORTABLE_FDS), with Limits.open_files lowering
RLIMIT_NOFILE in the child before the fds are closed.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from .cbuild import MACOS_TARGETS, SANITIZE, host_cc, require_sanitizers, sanitizer_env
from .cbuild import WARNINGS as C_WARNINGS

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"
DARWIN = ROOT / "tests" / "c" / "darwin"

WARNINGS = [*C_WARNINGS, "-D_GNU_SOURCE"]

PROCTREE_SOURCES = [
    DARWIN / "test_proctree.c",
    DARWIN / "fake_libproc.c",
    CSRC / "darwin" / "proctree.c",
]
PROCTREE_FLAGS = ["-Dkill=fake_kill"]
PROCTREE_CASES = [
    "children_1",
    "children_2",
    "children_3",
    "children_many",
    "children_1024",
    "three_levels_setsid",
    "memory_is_footprint",
    "zombies",
    "cpu",
    "skip_root",
    "kill_tree",
    "kill_fork_loop",
    "signal_term",
]

FDS_SOURCES = [
    DARWIN / "test_fds.c",
    DARWIN / "fake_libproc.c",
    CSRC / "spawn.c",
    CSRC / "child_fail.c",
    CSRC / "fds.c",
    CSRC / "rlimit.c",
    CSRC / "none" / "cgroup.c",
    CSRC / "none" / "seccomp.c",
    CSRC / "none" / "landlock.c",
    CSRC / "none" / "namespaces.c",
]
FDS_FLAGS = ["-DSBX_TEST_PORTABLE_FDS", "-DSBX_NO_VFORK"]
FDS_CASES = ["above_child_limit", "above_parent_limit", "keep_above_limit"]

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"),
    reason="the libproc model stands in for macOS on Linux (it reads /proc/self/fd); "
    "on macOS the real libproc is exercised by test_macos.py",
)


def build(out: Path, sources: list[Path], *flags: str) -> Path:
    cmd = [*host_cc(), *WARNINGS, *flags, "-I", str(DARWIN), "-I", str(CSRC)]
    cmd += [*map(str, sources), "-o", str(out), "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{shlex.join(cmd)} failed:\n{proc.stdout}{proc.stderr}"
    return out


def run(
    exe: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120, env=env)


def assert_passed(proc: subprocess.CompletedProcess[str], *cases: str) -> None:
    report = f"exit {proc.returncode}\n{proc.stdout}{proc.stderr}"
    assert proc.returncode == 0, report
    for case in cases:
        assert f"{case}: ok" in proc.stdout, report


@pytest.fixture(scope="module")
def proctree_exe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("darwin") / "test_proctree"
    return build(out, PROCTREE_SOURCES, *PROCTREE_FLAGS, "-O1")


@pytest.fixture(scope="module")
def fds_exe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("darwin") / "test_fds"
    return build(out, FDS_SOURCES, *FDS_FLAGS, "-O1")


def test_every_case_is_run(proctree_exe: Path, fds_exe: Path) -> None:
    assert run(proctree_exe, "--list").stdout.split() == PROCTREE_CASES
    assert run(fds_exe, "--list").stdout.split() == FDS_CASES


@pytest.mark.parametrize("case", PROCTREE_CASES)
def test_proctree(proctree_exe: Path, case: str) -> None:
    assert_passed(run(proctree_exe, case), case)


@pytest.mark.parametrize("case", FDS_CASES)
def test_close_fds_portable(fds_exe: Path, case: str) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(f"the cases open fds up to 1000; RLIMIT_NOFILE's hard limit is {hard}")
    assert_passed(run(fds_exe, case), case)


@pytest.mark.parametrize("what", ["proctree", "fds"])
def test_under_sanitizers(tmp_path: Path, what: str) -> None:
    require_sanitizers(tmp_path, host_cc())
    env = sanitizer_env(leaks=True)
    if what == "proctree":
        exe = build(tmp_path / what, PROCTREE_SOURCES, *PROCTREE_FLAGS, *SANITIZE)
        assert_passed(run(exe, "all", env=env), *PROCTREE_CASES)
    else:
        # Leak checking runs under ptrace, which a forked child cannot share.
        env["ASAN_OPTIONS"] = "detect_leaks=0"
        exe = build(tmp_path / what, FDS_SOURCES, *FDS_FLAGS, *SANITIZE)
        assert_passed(run(exe, "all", env=env), *FDS_CASES)


@pytest.mark.parametrize("target", ["host", *MACOS_TARGETS])
def test_fake_headers_declare_what_macos_declares(tmp_path: Path, target: str) -> None:
    src = str(DARWIN / "abi_check.c")
    obj = str(tmp_path / "abi_check.o")
    if target == "host":
        cmd = [*host_cc(), *WARNINGS, "-I", str(DARWIN), "-c", src, "-o", obj]
        env = None
    else:
        if importlib.util.find_spec("ziglang") is None:
            pytest.skip("the macOS SDK headers come with zig: pip install ziglang")
        cmd = [sys.executable, "-m", "ziglang", "cc", "-target", target, *WARNINGS]
        cmd += ["-c", src, "-o", obj]
        env = dict(os.environ)
        env["ZIG_GLOBAL_CACHE_DIR"] = env["ZIG_LOCAL_CACHE_DIR"] = str(tmp_path / "zig-cache")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, f"{shlex.join(cmd)} failed:\n{proc.stdout}{proc.stderr}"
