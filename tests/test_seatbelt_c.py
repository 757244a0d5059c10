"""The Seatbelt profile builder (csrc/darwin/seatbelt.c) as plain C, on every OS.

Builds tests/c/test_seatbelt.c (golden profiles, escaping, rejection of
control characters, buffer sizes, sorting, canonical paths) with the host C
compiler, warnings as errors, and runs it; once more under ASan + UBSan where
the toolchain has them.  Then, when the ``ziglang`` package is installed,
cross-compiles the builder for macOS (arm64 and x86_64), warnings as errors.
Everything is built in ``tmp_path``; zig's caches go there too.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from .cbuild import MACOS_TARGETS, SANITIZE, WARNINGS, host_cc, require_sanitizers, sanitizer_env

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"
BUILDER = CSRC / "darwin" / "seatbelt.c"
UNIT_TEST = ROOT / "tests" / "c" / "test_seatbelt.c"

MACHO_64_MAGIC = b"\xcf\xfa\xed\xfe"  # MH_MAGIC_64, little-endian (both targets)


def build(cc: list[str], out: Path, *flags: str) -> None:
    cmd = [*cc, *WARNINGS, *flags, "-I", str(CSRC), str(UNIT_TEST), str(BUILDER), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{shlex.join(cmd)} failed:\n{proc.stdout}{proc.stderr}"


def run_unit_tests(exe: Path, cwd: Path, env: dict[str, str] | None = None) -> None:
    proc = subprocess.run([str(exe)], cwd=cwd, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, f"{exe.name} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
    assert "0 cases failed" in proc.stdout
    # The scratch directory of the canonicalisation cases is gone again.
    assert sorted(p.name for p in cwd.iterdir()) == [], list(cwd.iterdir())


def test_unit_tests_pass(tmp_path: Path) -> None:
    exe = tmp_path / "test_seatbelt"
    build(host_cc(), exe, "-O2")
    (tmp_path / "run").mkdir()
    run_unit_tests(exe, tmp_path / "run")


def test_unit_tests_pass_under_sanitizers(tmp_path: Path) -> None:
    cc = host_cc()
    require_sanitizers(tmp_path, cc)
    exe = tmp_path / "test_seatbelt_asan"
    build(cc, exe, *SANITIZE)
    (tmp_path / "run").mkdir()
    # Nothing allocates: no leak check (LSan needs a ptrace-free host).
    run_unit_tests(exe, tmp_path / "run", env=sanitizer_env(leaks=False))


@pytest.mark.parametrize("target", MACOS_TARGETS)
def test_cross_compiles_for_macos(tmp_path: Path, target: str) -> None:
    if importlib.util.find_spec("ziglang") is None:
        pytest.skip("the macOS cross-compile needs zig: pip install ziglang")
    env = dict(os.environ)
    env["ZIG_GLOBAL_CACHE_DIR"] = env["ZIG_LOCAL_CACHE_DIR"] = str(tmp_path / "zig-cache")
    for src in (BUILDER, UNIT_TEST):
        obj = tmp_path / f"{src.stem}-{target}.o"
        cmd = [sys.executable, "-m", "ziglang", "cc", "-target", target, *WARNINGS]
        cmd += ["-I", str(CSRC), "-c", str(src), "-o", str(obj)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 0, f"{shlex.join(cmd)} failed:\n{proc.stdout}{proc.stderr}"
        assert obj.read_bytes()[:4] == MACHO_64_MAGIC, f"{obj.name} is not a 64-bit Mach-O object"
