"""sbxlimit.Popen against CPython's own test of subprocess.Popen.

``test.test_subprocess`` (the interpreter's standard ``test`` package;
Debian: ``libpython3.11-testsuite``) runs twice, at once: with
``subprocess.Popen``, and with ``sbxlimit.Popen`` put in its place before
the test module is imported (tests/conformance/cpython_subprocess.py).
Every test that passes with the stdlib's class must pass with ours, but
those that test CPython's internals, listed with the reason in
tests/conformance/cpython_subprocess_internal.txt.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(HERE, "conformance", "cpython_subprocess.py")
INTERNAL = os.path.join(HERE, "conformance", "cpython_subprocess_internal.txt")

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("test.test_subprocess") is None,
        reason="CPython's test package is not installed here "
        f"(Debian: apt-get install libpython{sys.version_info[0]}.{sys.version_info[1]}-testsuite)",
    ),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="run where CI runs: Linux"),
]


def _internal() -> dict[str, str]:
    out = {}
    with open(INTERNAL) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                test, why = line.rstrip("\n").split("\t", 1)
                out[test] = why
    return out


def _own_dir(path):
    path.mkdir()
    return path


def test_cpython_test_subprocess_passes_with_sbxlimit_popen(tmp_path):
    runs = {
        mode: subprocess.Popen(
            [sys.executable, RUNNER, mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=_own_dir(tmp_path / mode),  # the test module makes files (tempcwd) in its cwd
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        for mode in ("stdlib", "sbxlimit")
    }
    got = {}
    for mode, p in runs.items():
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err.decode(errors="replace")[-3000:]
        got[mode] = json.loads(out)
    stdlib, ours = got["stdlib"]["outcomes"], got["sbxlimit"]["outcomes"]
    internal = _internal()
    print(
        "\nCPython test_subprocess: stdlib",
        dict(collections.Counter(stdlib.values())),
        "sbxlimit",
        dict(collections.Counter(ours.values())),
        f"allowed (internal) {sum(1 for t in internal if ours.get(t) not in (None, 'passed'))}",
    )
    broken = {
        t: got["sbxlimit"]["details"].get(t, ours.get(t))
        for t, o in stdlib.items()
        if o == "passed" and ours.get(t) != "passed" and t not in internal
    }
    assert broken == {}, "\n\n".join(f"{t}:\n{d}" for t, d in broken.items())
    # The list stays true: a listed test that passes needs no excuse.
    stale = [t for t in internal if ours.get(t) == "passed"]
    assert stale == [], f"these pass with sbxlimit.Popen now: take them off {INTERNAL}"
