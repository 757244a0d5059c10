"""Proof that the C core builds for macOS, and for Linux on aarch64, here.

Every C file setup.py compiles on macOS is cross-compiled for arm64 and
x86-64 with zig (`pip install ziglang`) under the project's warning flags
and -Werror, and the objects are linked into a macOS extension module
(Python's symbols resolved at load time, as macOS extensions are).  The
binding includes this interpreter's Python.h: close enough to macOS's for a
compile check (same C API, LP64 on both).  The Linux core (without the
binding) is compiled for aarch64 too: its seccomp filter, clone3 trampoline
and namespaces are per-architecture code.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Wshadow", "-Wformat=2", "-Werror", "-D_GNU_SOURCE"]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ziglang") is None,
    reason="the cross-compiles need zig: pip install ziglang",
)


def _setup_py():
    spec = importlib.util.spec_from_file_location("_sbx_setup", os.path.join(ROOT, "setup.py"))
    assert spec is not None and spec.loader is not None
    setup_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup_py)  # not __main__: defines, does not build
    return setup_py


def _sources(platform: str = "darwin") -> list[str]:
    return list(_setup_py().sources(platform))


def _zig(target: str, *args: str, cwd: str) -> None:
    cmd = [sys.executable, "-m", "ziglang", "cc", "-target", target, *args]
    env = dict(os.environ, ZIG_GLOBAL_CACHE_DIR=os.path.join(cwd, "zig-cache"))
    env["ZIG_LOCAL_CACHE_DIR"] = env["ZIG_GLOBAL_CACHE_DIR"]
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"


def test_darwin_sources_are_the_ones_setup_py_builds():
    srcs = _sources()
    assert "csrc/darwin/proctree.c" in srcs and "csrc/darwin/seatbelt.c" in srcs
    assert not [s for s in srcs if s.startswith("csrc/linux/")]


@pytest.mark.parametrize("target", ["aarch64-macos", "x86_64-macos"])
def test_core_compiles_and_links_for_macos(target, tmp_path):
    objs = []
    for src in _sources():
        obj = str(tmp_path / (src.replace("/", "_") + ".o"))  # platform folders share names
        inc = ["-I", os.path.join(ROOT, "csrc")]
        if src.endswith("_coremodule.c"):
            inc += ["-I", sysconfig.get_paths()["include"]]
        _zig(target, *FLAGS, *inc, "-c", os.path.join(ROOT, src), "-o", obj, cwd=str(tmp_path))
        objs.append(obj)
    so = str(tmp_path / "_core.so")
    _zig(target, "-shared", "-Wl,-undefined,dynamic_lookup", *objs, "-o", so, cwd=str(tmp_path))
    with open(so, "rb") as f:
        magic = f.read(4)
    assert magic == b"\xcf\xfa\xed\xfe"  # Mach-O, 64-bit


def test_linux_core_compiles_for_aarch64(tmp_path):
    # The seccomp filter, the clone3 trampoline and the namespaces are
    # per-architecture code: the other architecture the filter is built for
    # must at least compile under -Werror.
    for src in (s for s in _sources("linux") if not s.endswith("_coremodule.c")):
        obj = str(tmp_path / (src.replace("/", "_") + ".o"))  # platform folders share names
        inc = ["-I", os.path.join(ROOT, "csrc")]
        _zig(
            "aarch64-linux-gnu",
            *FLAGS,
            *inc,
            "-c",
            os.path.join(ROOT, src),
            "-o",
            obj,
            cwd=str(tmp_path),
        )


@pytest.mark.parametrize("target,machine", [("aarch64-linux-gnu", 183), ("x86_64-linux-gnu", 62)])
def test_the_reaper_links_without_libc_for_linux(target, machine, tmp_path):
    # sbxlimit/_pid1 as setup.py builds it first: its own _start and raw
    # system calls, for each architecture that has them.
    name, srcs, ways = _linux_helper("_pid1")
    out = str(tmp_path / name)
    inc = ["-I", os.path.join(ROOT, "csrc")]
    src = [os.path.join(ROOT, s) for s in srcs]
    # -Os as setup.py's (zig otherwise builds for debugging: UBSan's runtime).
    _zig(target, *FLAGS, "-Os", *inc, *ways[0], *src, "-o", out, cwd=str(tmp_path))
    with open(out, "rb") as f:
        elf = f.read()
    assert elf[:4] == b"\x7fELF" and int.from_bytes(elf[18:20], "little") == machine
    assert b"GLIBC" not in elf and b"/ld-linux" not in elf  # no libc, no loader


def _linux_helper(name: str) -> tuple[str, list[str], list[list[str]]]:
    return next(h for h in _setup_py().helpers("linux") if h[0] == name)


def test_the_sentinel_links_for_aarch64(tmp_path):
    # sbxlimit/_sentinel (libc's): its system calls by number where a libc's
    # headers lack them.
    name, srcs, ways = _linux_helper("_sentinel")
    out = str(tmp_path / name)
    inc = ["-I", os.path.join(ROOT, "csrc")]
    src = [os.path.join(ROOT, s) for s in srcs]
    _zig("aarch64-linux-gnu", *FLAGS, "-Os", *inc, *ways[0], *src, "-o", out, cwd=str(tmp_path))
    with open(out, "rb") as f:
        elf = f.read()
    assert elf[:4] == b"\x7fELF" and int.from_bytes(elf[18:20], "little") == 183


@pytest.mark.parametrize("target", ["aarch64-macos", "x86_64-macos"])
def test_the_seatbelt_helper_links_for_macos(target, tmp_path):
    # sbxlimit/_seatbelt_exec, as setup.py builds it on a Mac: sandbox_init
    # resolved against macOS's libSystem.
    ((name, srcs, _link),) = _setup_py().helpers("darwin")
    out = str(tmp_path / name)
    inc = ["-I", os.path.join(ROOT, "csrc")]
    _zig(target, *FLAGS, *inc, *(os.path.join(ROOT, s) for s in srcs), "-o", out, cwd=str(tmp_path))
    with open(out, "rb") as f:
        assert f.read(4) == b"\xcf\xfa\xed\xfe"  # Mach-O, 64-bit


WINDOWS_TARGETS = ["x86_64-windows-gnu", "aarch64-windows-gnu"]


def test_windows_sources_are_the_job_layer_and_its_binding():
    srcs = _sources("win32")
    assert srcs[0] == "csrc/windows/_corewin.c"
    assert {"csrc/windows/job.c", "csrc/windows/spawn.c"} <= set(srcs)
    # Every Windows C file is built there (none is left to rot untested).
    on_disk = {f"csrc/windows/{f}" for f in os.listdir(os.path.join(ROOT, "csrc", "windows"))}
    assert {f for f in on_disk if f.endswith(".c")} == set(srcs)
    assert not [s for s in srcs if not s.startswith("csrc/windows/")]


def _windows_python_include(tmp_path) -> str:
    """This interpreter's headers with Windows's pyconfig.h (a stand-in:
    tests/c/windows/pyconfig.h); Python.h includes it by quotes, from its
    own directory, so the directory is copied."""
    inc = tmp_path / "python-include"
    shutil.copytree(sysconfig.get_paths()["include"], inc)
    shutil.copy(os.path.join(ROOT, "tests", "c", "windows", "pyconfig.h"), inc / "pyconfig.h")
    return str(inc)


@pytest.mark.parametrize("target", WINDOWS_TARGETS)
def test_windows_core_compiles(target, tmp_path):
    # setup.py's Windows sources, MinGW-style, on both of Windows's
    # architectures, and the job layer's test program (x86-64 is also
    # linked and run under Wine: tests/test_windows_wine.py).  MSVC builds
    # them in the GitHub workflow's windows job.
    inc = ["-I", os.path.join(ROOT, "csrc", "windows")]
    pyinc = ["-I", _windows_python_include(tmp_path)]
    for src in [*_sources("win32"), "tests/c/windows/job_test.c"]:
        obj = str(tmp_path / (src.replace("/", "_") + ".o"))
        extra = pyinc if src.endswith("_corewin.c") else []
        path = os.path.join(ROOT, src)
        _zig(target, *FLAGS, *inc, *extra, "-c", path, "-o", obj, cwd=str(tmp_path))
