"""The pytest plugin against a real third-party test suite.

more-itertools' own tests (its sdist; `.ci/run` downloads it and names it
in ``$SBXLIMIT_THIRD_PARTY_SDIST``) run twice, at once: as they are, and
with every test marked ``@pytest.mark.sbxlimit``, so that every body runs
forked in a sandbox.  The two runs must say the same: the same tests, the
same outcomes, the same subtests (unittest's ``subTest`` with parameters
that do not pickle, among them).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

SDIST = os.environ.get("SBXLIMIT_THIRD_PARTY_SDIST", "")

pytestmark = [
    pytest.mark.skipif(
        not os.path.isfile(SDIST),
        reason="no third-party sdist here: set SBXLIMIT_THIRD_PARTY_SDIST to "
        "more-itertools' sdist (pip download --no-binary :all: --no-deps more-itertools)",
    ),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="run where CI runs: Linux"),
]

MARK_ALL = """
import pytest

def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.sbxlimit)
"""

SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?|subtests \w+)")
SANDBOXES = re.compile(r"^(\d+) sandboxes in (\d+) tests; (\d+) ended by a limit", re.M)


def _extract(sdist: str, into: Path) -> Path:
    with tarfile.open(sdist) as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4 and later
            tar.extractall(into, filter="data")
        else:  # the sdist pip downloaded from the index: trusted as pip trusts it
            tar.extractall(into)
    (root,) = [p for p in into.iterdir() if p.is_dir()]
    return root


def _outcomes(out: str) -> tuple[dict[str, int], list[str]]:
    last = out.rstrip().splitlines()[-1]
    counts = {what: int(n) for n, what in SUMMARY.findall(last)}
    failures = sorted(
        ln.split(" - ")[0] for ln in out.splitlines() if ln.startswith(("FAILED", "ERROR"))
    )
    return counts, failures


def test_a_third_party_suite_says_the_same_with_every_test_sandboxed(tmp_path: Path) -> None:
    root = _extract(SDIST, tmp_path)
    (tmp_path / "plug").mkdir()
    (tmp_path / "plug" / "sbx_mark_all.py").write_text(MARK_ALL)
    common = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", "tests"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("PYTEST_ADDOPTS", None)
    started = time.monotonic()
    runs = {
        "plain": subprocess.Popen(
            common, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        ),
        "marked": subprocess.Popen(
            [*common, "-p", "sbx_mark_all", "--sbxlimit-report"],
            cwd=root,
            env={**env, "PYTHONPATH": f"{tmp_path / 'plug'}{os.pathsep}{env['PYTHONPATH']}"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        ),
    }
    outs = {}
    for name, p in runs.items():
        out, _ = p.communicate(timeout=900)
        outs[name] = out.decode(errors="replace")
    plain, marked = _outcomes(outs["plain"]), _outcomes(outs["marked"])
    print(
        f"\n{root.name}: plain {plain[0]}, marked {marked[0]} "
        f"({time.monotonic() - started:.1f}s for both, run at once)"
    )
    assert plain[0].get("passed", 0) > 500 and plain[0].get("subtests passed", 0) > 1000, outs[
        "plain"
    ][-3000:]
    assert marked == plain, outs["marked"][-5000:]
    # Every test's body did run in a sandbox, and none was ended by a limit.
    (sandboxes,) = SANDBOXES.findall(outs["marked"])
    tests = sum(plain[0].get(k, 0) for k in ("passed", "failed", "xfailed", "xpassed"))
    assert sandboxes == (str(tests), str(tests), "0"), outs["marked"][-3000:]
