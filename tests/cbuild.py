"""Building the project's C unit tests with the host compiler: the flags,
the sanitizer run, the macOS cross targets (tests/test_seatbelt_c.py,
tests/test_darwin_c.py)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

WARNINGS = ["-std=c11", "-Wall", "-Wextra", "-Wshadow", "-Wformat=2", "-Werror"]
SANITIZE = [
    "-g",
    "-fsanitize=address,undefined",
    "-fno-omit-frame-pointer",
    "-fno-sanitize-recover=all",
]
MACOS_TARGETS = ["aarch64-macos", "x86_64-macos"]


def host_cc() -> list[str]:
    cc = shlex.split(os.environ.get("CC", "")) or ["cc"]
    if shutil.which(cc[0]) is None:
        pytest.skip(f"no C compiler: {cc[0]!r} not found (set CC)")
    return cc


def sanitizer_env(*, leaks: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)  # an ASan preload of the test run itself
    env["ASAN_OPTIONS"] = f"detect_leaks={int(leaks)}"
    env["UBSAN_OPTIONS"] = "print_stacktrace=1"
    return env


def require_sanitizers(tmp_path: Path, cc: list[str]) -> None:
    """Skip, saying why, unless `cc` builds ASan + UBSan programs that run."""
    probe_src = tmp_path / "probe.c"
    probe_src.write_text("int main(void) { return 0; }\n")
    probe = tmp_path / "probe"
    made = subprocess.run(
        [*cc, *SANITIZE, str(probe_src), "-o", str(probe)], capture_output=True, text=True
    )
    if made.returncode != 0:
        pytest.skip(f"{cc[0]} cannot build with {SANITIZE[1]}: {made.stderr.strip()[:200]}")
    ran = subprocess.run(
        [str(probe)], capture_output=True, text=True, env=sanitizer_env(leaks=False)
    )
    if ran.returncode != 0:
        pytest.skip(f"sanitized programs do not run here: {ran.stderr.strip()[:200]}")
