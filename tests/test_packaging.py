"""What ships: the stub matches the extension, the package is typed for its
users, and the C core builds warning-free."""

from __future__ import annotations

import ast
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import pytest

import sbxlimit
from sbxlimit import _core

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.dirname(sbxlimit.__file__)


def test_stub_matches_the_extension():
    with open(os.path.join(PKG, "_core.pyi")) as f:
        tree = ast.parse(f.read())
    stubbed = set()
    body = list(tree.body)
    windows: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "sys.platform == 'darwin'":
            # What the extension has on macOS only.
            body += node.body if sys.platform == "darwin" else node.orelse
        if isinstance(node, ast.If) and ast.unparse(node.test) == "sys.platform == 'win32'":
            # The Windows binding (csrc/windows/_corewin.c): that and nothing else.
            windows = node.body
        if isinstance(node, ast.FunctionDef):
            stubbed.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            stubbed.add(node.target.id)
    if sys.platform == "win32":
        # STEPS is every binding's: its own steps.
        stubbed = {"STEPS"} | {n.name for n in windows if isinstance(n, ast.FunctionDef)}
        stubbed |= {
            n.target.id
            for n in windows
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        }
    assert windows, "the stub has the Windows binding's names"
    public = {n for n in dir(_core) if not n.startswith("_")}
    assert stubbed == public


def test_py_typed_ships():
    assert os.path.exists(os.path.join(PKG, "py.typed"))


def test_public_api_is_exported():
    for name in sbxlimit.__all__:
        assert hasattr(sbxlimit, name), name


USER_CODE = """
import sbxlimit
from sbxlimit import Limits, Policy

limits = Limits(memory="256Mi", cpu_time="10s", cpu="500m", pids=64, wall_time=30)
policy = Policy(writable_roots=["/tmp"], network="deny", strict=False)
r = sbxlimit.run(["true"], limits=limits, policy=policy, capture_output=True, check=False)
reason: str = r.termination.reason
peak: int | None = r.usage.memory_peak
mech: str = r.enforced["memory"]
with sbxlimit.Popen(["true"], limits={"memory": "1Gi"}) as p:
    p.kill_tree(grace=0)
report: sbxlimit.Report = sbxlimit.doctor()
ok: bool = report.ok
"""


def test_user_code_type_checks(tmp_path):
    if sys.platform == "win32":
        # The package is typed for POSIX here (tests/test_windows.py checks
        # the Windows modules with mypy --platform win32).
        pytest.skip("the user code's calls are typed against the POSIX Popen")
    if shutil.which("mypy") is None:
        pytest.skip("mypy is not installed (pip install -e '.[dev]')")
    f = tmp_path / "user.py"
    f.write_text(textwrap.dedent(USER_CODE))
    # MYPYPATH: an editable install is found through an import hook that
    # mypy cannot follow; point it at the package itself.
    env = {**os.environ, "MYPYPATH": os.path.dirname(PKG)}
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", str(f)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert r.returncode == 0, r.stdout


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
@pytest.mark.skipif(sys.platform == "win32", reason="the POSIX core; MSVC builds Windows's")
def test_c_core_builds_without_warnings():
    srcs = [
        src
        for folder in ("", "linux", "none")
        for src in glob.glob(os.path.join(HERE, "csrc", folder, "*.c"))
    ]
    if not srcs:
        pytest.skip("C sources are not next to the tests (installed package)")
    inc = sysconfig.get_paths()["include"]
    for src in srcs:
        r = subprocess.run(
            [
                "gcc",
                "-std=c11",
                "-D_GNU_SOURCE",
                "-Wall",
                "-Wextra",
                "-Wshadow",
                "-Wformat=2",
                "-Werror",
                "-fsyntax-only",
                f"-I{os.path.join(HERE, 'csrc')}",
                f"-I{inc}",
                src,
            ],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr


def test_c_top_level_is_what_every_platform_builds():
    # csrc/ holds the core every platform shares and the binding; a
    # platform's own files live in its folder (linux/, darwin/), and the
    # stand-ins for a mechanism a platform lacks in none/.
    setup_path = os.path.join(HERE, "setup.py")
    if not os.path.exists(setup_path):
        pytest.skip("setup.py is not next to the tests (installed package)")
    spec = importlib.util.spec_from_file_location("_sbx_setup", setup_path)
    assert spec is not None and spec.loader is not None
    setup_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup_py)  # not __main__: defines, does not build
    top = {os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, "csrc", "*.c"))}
    assert "csrc/_coremodule.c" in top
    for platform in ("linux", "darwin", "freebsd14"):
        assert top <= set(setup_py.sources(platform)), platform


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_sdist_holds_every_c_source_and_no_built_program(tmp_path):
    # pip builds a wheel from the sdist where no wheel fits: every C file and
    # header must be in it (the helpers' sources too), and nothing built here.
    if not os.path.exists(os.path.join(HERE, "setup.py")):
        pytest.skip("setup.py is not next to the tests (installed package)")
    tracked = subprocess.run(
        ["git", "ls-files", "csrc"], cwd=HERE, capture_output=True, text=True
    ).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    r = subprocess.run(
        [sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path)],
        cwd=HERE,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    import tarfile

    (sdist,) = tmp_path.glob("*.tar.gz")
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert set(tracked) <= names, sorted(set(tracked) - names)
    built = {"sbxlimit/_pid1", "sbxlimit/_sentinel", "sbxlimit/_seatbelt_exec"}
    assert not names & built and not [n for n in names if n.endswith((".so", ".o"))]
