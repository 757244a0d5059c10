"""The pytest plugin, through real inner sessions (pytester, subprocess).

Each inner session checks several things at once: a session costs about
half a second.  Memory tests ask for 64Mi and touch 256Mi, so that both
paths fail them: a cgroup (as root here) and RLIMIT_DATA + the watchdog
(unprivileged); their messages share "memory limit of 64.0 MiB".
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from .conftest import wait_gone

pytest_plugins = ["pytester"]

HOG = """
def hog():
    b = bytearray(256 << 20)
    b[::4096] = b"x" * (len(b) // 4096)
    return b
"""

MAIN = (
    """
import os, resource, sys, threading, warnings
import pytest
"""
    + HOG
    + """
def test_0_unused_plugin_is_inert():
    # registered, but nothing started for a test that uses none of it
    assert not any(t.name == "sbxlimit-monitor" for t in threading.enumerate())

@pytest.mark.sbxlimit(memory="64Mi", wall_time="20s")
def test_hog():
    print("about to allocate")
    hog()

@pytest.mark.sbxlimit(memory="64Mi", wall_time="20s")
def test_within_limits():
    b = bytearray(8 << 20)
    b[::4096] = b"x" * (len(b) // 4096)
    assert os.getpid() != int(os.environ["OUTER_PID"])

@pytest.mark.sbxlimit(wall_time="20s")
def test_skip_in_body():
    pytest.skip("skipped in the body")

@pytest.mark.xfail(reason="marked xfail", strict=True)
@pytest.mark.sbxlimit(wall_time="20s")
def test_xfail_in_body():
    assert 0

@pytest.mark.sbxlimit(wall_time="20s")
def test_imperative_xfail():
    pytest.xfail("xfailed in the body")

@pytest.mark.sbxlimit(wall_time="20s")
def test_assert_rewritten():
    x = 3
    print("captured from the body")
    assert x == 4

@pytest.mark.sbxlimit(wall_time="20s")
def test_warning_in_body():
    warnings.warn(UserWarning("warned in the body"))

@pytest.mark.sbxlimit(wall_time="0.5s")
def test_wall_time():
    import time
    time.sleep(30)

@pytest.mark.sbxlimit(wall_time="20s")
def test_crash():
    os._exit(3)

@pytest.mark.sbxlimit(memory="lots")
def test_bad_marker():
    pass

@pytest.mark.sbxlimit(open_files=100)
class TestClassMarker:
    def test_class_value(self):
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == 100

    @pytest.mark.sbxlimit(open_files=50)
    def test_function_overrides_class(self):
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == 50

def test_leak(sbx):
    p = sbx.popen(["sleep", "30"])
    with open("leaked.pid", "w") as f:
        f.write(str(p.pid))

@pytest.mark.sbxlimit(wall_time="20s")
def test_leak_from_body(sbx):
    sbx.popen(["sleep", "30"])

def test_run_and_popen(sbx):
    r = sbx.run([sys.executable, "-c", "print('hi')"], capture_output=True, memory="128Mi")
    assert r.stdout == b"hi\\n" and r.termination.reason == "exited"
    assert r.usage.wall > 0
    with sbx.popen([sys.executable, "-c", "pass"]) as p:
        p.wait()
    assert sbx.processes == [p]

def test_session_goes_on():
    pass
"""
)


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("OUTER_PID", str(os.getpid()))
    monkeypatch.delenv("SBXLIMIT_DEFAULTS", raising=False)
    monkeypatch.delenv("SBXLIMIT_ALL", raising=False)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    return pytester


def test_marker_fixture_and_report(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_main=MAIN)
    result = inner.runpytest_subprocess("-p", "no:cacheprovider", "-rA", "--sbxlimit-report")
    result.assert_outcomes(passed=7, failed=6, skipped=1, xfailed=2, errors=1, warnings=1)
    out = result.stdout
    # a limit hit: the right message, and the session went on
    out.fnmatch_lines(
        [
            "*_ test_hog _*",
            "*sbxlimit: the test body hit its memory limit of 64.0 MiB*",
            "*Captured stdout call*",
            "about to allocate",
        ]
    )
    out.fnmatch_lines(["PASSED test_main.py::test_session_goes_on"])
    # what the body did, as pytest shows it unforked
    out.fnmatch_lines(["SKIPPED [[]1[]] test_main.py:*: skipped in the body"])
    out.fnmatch_lines(["XFAIL test_main.py::test_xfail_in_body - marked xfail"])
    out.fnmatch_lines(["XFAIL test_main.py::test_imperative_xfail - *xfailed in the body"])
    out.fnmatch_lines(
        [
            "*_ test_assert_rewritten _*",
            ">       assert x == 4",
            "E       assert 3 == 4",
            "*Captured stdout call*",
            "captured from the body",
        ]
    )
    out.fnmatch_lines(["*warnings summary*", "*UserWarning: warned in the body"])
    out.fnmatch_lines(
        ["*sbxlimit: the test body hit its wall_time limit. `test_wall_time` was still running*"]
    )
    out.fnmatch_lines(
        ["*sbxlimit: the test body ended without reporting a result. `test_crash` exited*3.*"]
    )
    out.fnmatch_lines(
        [
            "*ERROR at setup of test_bad_marker*",
            "sbxlimit: @pytest.mark.sbxlimit on test_main.py::test_bad_marker: "
            "Limits.memory: *(got 'lots')",
        ]
    )
    out.fnmatch_lines(["PASSED test_main.py::TestClassMarker::test_function_overrides_class"])
    # leaks: from the test and from a forked body; killed either way
    for name in ("test_leak", "test_leak_from_body"):
        out.fnmatch_lines(
            [f"*_ {name} _*", "sbxlimit: pid * (`sleep`) outlived the test and was killed.*"]
        )
    assert wait_gone([int((inner.path / "leaked.pid").read_text())]) == []
    # --sbxlimit-report
    out.fnmatch_lines(
        [
            "*= sbxlimit: heaviest sandboxes =*",
            " peak memory      cpu     wall  end        test",
            # (no figure under RLIMIT_DATA: the refused allocation never became resident)
            "* *s *s  memory     test_main.py::test_hog (test body)",
        ]
    )
    out.fnmatch_lines(["*sandboxes in * tests; 2 ended by a limit*"])


PRECEDENCE = """
import resource, sys
import pytest

def test_defaults(sbx):
    assert sbx.limits.memory == 256 << 20          # ini
    assert sbx.limits.wall_time == 20               # env over ini
    assert sbx.limits.open_files == 300             # CLI over env and ini
    assert sbx.limits.cpu_time == 30                # CLI
    assert sbx.policy is None
    code = "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    r = sbx.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout == "300\\n"
    r = sbx.run([sys.executable, "-c", code], capture_output=True, text=True, open_files=64)
    assert r.stdout == "64\\n"                     # a call's own value wins

@pytest.mark.sbxlimit(cpu_time="20s", memory=None)
def test_marker_wins(sbx):
    assert sbx.limits.cpu_time == 20 and sbx.limits.memory is None
    assert sbx.limits.open_files == 300 and sbx.limits.wall_time == 20
    assert resource.getrlimit(resource.RLIMIT_CPU)[0] == 20
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == 300

@pytest.mark.sbxlimit(network="proxy")
def test_policy_rule_across_sources():
    pass
"""


def test_precedence_and_doctor_header(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    inner.makeini(
        "[pytest]\nsbxlimit_defaults = memory=256Mi wall_time=30s open_files=100 cpu_time=50s\n"
    )
    inner.makepyfile(test_prec=PRECEDENCE)
    monkeypatch.setenv("SBXLIMIT_DEFAULTS", "wall_time=20s open_files=200 cpu_time=40s")
    result = inner.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--sbxlimit-doctor",
        "--sbxlimit-defaults",
        "open_files=300 cpu_time=30s",
    )
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["sbxlimit doctor *", "Mechanisms:", "*rlimits*"])
    result.stdout.fnmatch_lines(
        [
            "sbxlimit: the settings from ini option sbxlimit_defaults in *tox.ini + "
            "environment variable SBXLIMIT_DEFAULTS + --sbxlimit-defaults + "
            "@pytest.mark.sbxlimit on test_prec.py::test_policy_rule_across_sources: "
            "Policy.proxy_ports: network='proxy' needs allow_domains*"
        ]
    )


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("ini", "ERROR: ini option sbxlimit_defaults in *tox.ini: Limits.memory: *(got 'lots')"),
        (
            "env",
            "ERROR: environment variable SBXLIMIT_DEFAULTS: unknown field 'memroy'; "
            "did you mean 'memory'? known: *",
        ),
        ("cli", "ERROR: --sbxlimit-defaults: Policy.network: expected 'allow', 'deny' or*"),
        ("cli-word", "ERROR: --sbxlimit-defaults: expected FIELD=VALUE words *(got 'memory')"),
    ],
    ids=["ini", "env", "cli", "cli-word"],
)
def test_bad_defaults_are_usage_errors(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, where: str, expected: str
) -> None:
    inner.makepyfile("def test_nothing(): pass")
    args = ["-p", "no:cacheprovider"]
    if where == "ini":
        inner.makeini("[pytest]\nsbxlimit_defaults = memory=lots\n")
    elif where == "env":
        monkeypatch.setenv("SBXLIMIT_DEFAULTS", "memroy=1Gi")
    elif where == "cli":
        args += ["--sbxlimit-defaults", "network=sometimes"]
    else:
        args += ["--sbxlimit-defaults", "memory"]
    result = inner.runpytest_subprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([expected])


XDIST = (
    """
import os
import pytest
"""
    + HOG
    + """
@pytest.mark.sbxlimit(memory="64Mi", wall_time="20s")
def test_hog():
    hog()

@pytest.mark.sbxlimit(memory="64Mi", wall_time="20s")
def test_in_a_worker():
    assert os.environ["PYTEST_XDIST_WORKER"].startswith("gw")

@pytest.mark.sbxlimit(wall_time="20s")
def test_skip():
    pytest.skip("skipped in a worker's body")

def test_fixture(sbx):
    sbx.run(["true"])
"""
)


@pytest.mark.skipif(
    importlib.util.find_spec("xdist") is None,
    reason="pytest-xdist is not installed (pip install -e '.[test]')",
)
def test_xdist_workers(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_x=XDIST)
    result = inner.runpytest_subprocess(
        "-p", "no:cacheprovider", "-n", "2", "-rA", "--sbxlimit-report"
    )
    result.assert_outcomes(passed=2, failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*sbxlimit: the test body hit its memory limit of 64.0 MiB*"])
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_x.py:*: skipped in a worker's body"])
    result.stdout.fnmatch_lines(
        ["*= sbxlimit: heaviest sandboxes =*", "*test_x.py::test_hog (test body)"]
    )
    result.stdout.fnmatch_lines(["4 sandboxes in 4 tests; 1 ended by a limit"])


def test_entry_point_is_registered() -> None:
    from importlib.metadata import entry_points

    found = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert found.get("sbxlimit") == "sbxlimit.pytest_plugin", (
        "run pip install -e '.[test]' to register the entry point"
    )
    assert "sbxlimit.pytest_plugin" in sys.modules


SECRET = "s3cr3t-t0ken-do-not-leak"
SECRETS = f"""
import subprocess

def test_shell_run(sbx):
    r = sbx.run("API_TOKEN={SECRET} sh -c 'exit 3'", shell=True, wall_time="20s")
    assert r.returncode == 3

def test_leaked_shell(sbx):
    sbx.popen("TOKEN={SECRET} sleep 30", shell=True, stdout=subprocess.DEVNULL)
"""


def test_no_secret_from_a_command_line_in_the_report(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_s=SECRETS)
    result = inner.runpytest_subprocess("-p", "no:cacheprovider", "-rA", "--sbxlimit-report")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*pid * (`sleep`) outlived the test and was killed*"])
    result.stdout.fnmatch_lines(["*test_s.py::test_shell_run (`sh`)"])
    assert SECRET not in result.stdout.str() and SECRET not in result.stderr.str()


def test_loading_the_plugin_imports_only_the_plugin() -> None:
    # A suite that does not use it pays for the plugin's own modules only,
    # and the exit steps' (a multiprocessing child hooks its end early).
    import subprocess

    code = (
        "import sys, sbxlimit.pytest_plugin as p\n"
        "assert p.__all__ == ['Sandboxes'] and p.Sandboxes.__name__ == 'Sandboxes'\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('sbxlimit'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert "sbxlimit.pytest_plugin" in out
    assert [m for m in out if not m.startswith(("sbxlimit._pytest_", "sbxlimit.pytest_"))] == [
        "sbxlimit",
        "sbxlimit._exit",
    ]


FORWARDED = """
import unittest
import warnings

class T(unittest.TestCase):
    def test_subtests(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertNotEqual(i, 1)

def test_pytest_subtests(subtests):
    for i in range(3):
        with subtests.test(i=i):
            assert i != 2

def test_property(record_property):
    record_property("answer", 42)

def test_xml_attribute(record_xml_attribute):
    record_xml_attribute("flavour", "sandboxed")

def test_suite_property(record_testsuite_property):
    record_testsuite_property("suite-answer", "yes")

def test_warns():
    warnings.warn("warned in the body", UserWarning)

def test_plugin_report():
    pass

def test_unpicklable_subtest_params(subtests):
    # Parameters that do not pickle (local classes) still reach the report.
    from typing import NamedTuple

    class Case(NamedTuple):
        size: int
        step: int

    class Local:
        def __repr__(self):
            return "Local()"

    for i, case in enumerate([Case(3, 1), Case(4, 2)]):
        with subtests.test(case=case, other=[Local()]):
            assert i != 1
"""

FORWARDED_CONFTEST = """
import os
import pytest

def pytest_collection_modifyitems(items):
    if os.environ.get("SBX_MARK_ALL"):
        for item in items:
            item.add_marker(pytest.mark.sbxlimit(wall_time="30s"))

@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    # Another plugin that reports during the call phase.
    result = yield
    if item.name == "test_plugin_report":
        report = pytest.TestReport(
            item.nodeid, item.location, {}, "failed", "reported by a plugin", "call"
        )
        item.ihook.pytest_runtest_logreport(report=report)
    return result
"""


def test_a_forked_body_reports_what_it_would_report_unforked(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every test marked, then none: the same outcomes, subtests (unittest's
    # and pytest's) and plugins' reports included, the same junit XML
    # properties and attributes, the same warnings.
    inner.makepyfile(test_fwd=FORWARDED)
    inner.makeconftest(FORWARDED_CONFTEST)
    runs = {}
    for marked in (False, True):
        if marked:
            monkeypatch.setenv("SBX_MARK_ALL", "1")
        xml = inner.path / f"{'marked' if marked else 'plain'}.xml"
        result = inner.runpytest_subprocess(
            "-p", "no:cacheprovider", "-rA", "-o", "junit_family=xunit1", f"--junitxml={xml}"
        )
        lines = sorted(
            ln.split(" - ")[0]
            for ln in result.outlines
            if ln.startswith(("PASSED", "FAILED", "SUBPASSED", "SUBFAILED"))
        )
        runs[marked] = (result.parseoutcomes(), lines, xml.read_text(), result.stdout.str())
    plain, marked_run = runs[False], runs[True]
    assert plain[0]["failed"] == 6 and plain[0]["passed"] == 6
    assert marked_run[0] == plain[0]
    assert marked_run[1] == plain[1]
    assert "SUBFAILED(i=1) test_fwd.py::T::test_subtests" in marked_run[1]
    assert "FAILED test_fwd.py::test_pytest_subtests" in marked_run[1]
    assert (
        "SUBFAILED(case=Case(size=4, step=2), other=[Local()])"
        " test_fwd.py::test_unpicklable_subtest_params" in marked_run[1]
    )
    for needle in (
        'name="answer" value="42"',
        'flavour="sandboxed"',
        'name="suite-answer" value="yes"',
    ):
        assert needle in plain[2] and needle in marked_run[2], needle
    assert "UserWarning: warned in the body" in marked_run[3]


ALL_CONFTEST = """
import os

def pytest_configure(config):
    # The pytest process's pid, for a body to tell whether it was forked.
    os.environ["SESSION_PID"] = str(os.getpid())
"""

ALL = (
    """
import os, resource
import pytest
"""
    + HOG
    + """
EVERY = os.environ["EXPECT_ALL"] == "1"

def forked():
    return os.getpid() != int(os.environ["SESSION_PID"])

def test_unmarked():
    assert forked() == EVERY

def test_unmarked_hog():
    hog()

@pytest.mark.no_sbxlimit
def test_opted_out():
    assert not forked()
    hog()

@pytest.mark.sbxlimit(memory="1Gi")
def test_marker_field_overrides_the_default():
    assert forked()
    hog()
    # the other defaults still apply
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == 100

@pytest.mark.no_sbxlimit
class TestOptedOut:
    def test_in_class(self):
        assert not forked()

    @pytest.mark.sbxlimit(wall_time="20s")
    def test_closer_marker_wins(self):
        assert forked()

@pytest.mark.sbxlimit(wall_time="20s")
class TestMarked:
    @pytest.mark.no_sbxlimit
    def test_opted_out_of_the_class_marker(self):
        assert not forked()
"""
)


@pytest.mark.parametrize("switch", ["cli", "env", "ini", "off", "env-0-over-ini"])
def test_every_test_under_the_defaults(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, switch: str
) -> None:
    # --sbxlimit-all (or $SBXLIMIT_ALL, or the ini option) forks every test
    # under the defaults, as an empty marker would; a marker's field wins,
    # no_sbxlimit opts out.  Off, an unmarked test runs in the pytest process.
    every = switch in ("cli", "env", "ini")
    defaults = "memory=64Mi wall_time=20s open_files=100"
    inner.makeconftest(ALL_CONFTEST)
    inner.makepyfile(test_all=ALL)
    ini = f"[pytest]\nsbxlimit_defaults = {defaults}\n"
    if switch in ("ini", "env-0-over-ini"):
        ini += "sbxlimit_all = true\n"
    inner.makeini(ini)
    args = ["-p", "no:cacheprovider", "-rA", "-W", "error::pytest.PytestUnknownMarkWarning"]
    if switch == "cli":
        args.append("--sbxlimit-all")
    elif switch == "env":
        monkeypatch.setenv("SBXLIMIT_ALL", "1")
    elif switch == "env-0-over-ini":
        monkeypatch.setenv("SBXLIMIT_ALL", "0")
    monkeypatch.setenv("EXPECT_ALL", "1" if every else "0")
    result = inner.runpytest_subprocess(*args)
    outcomes = {
        ln.split()[1]: ln.split()[0]
        for ln in result.outlines
        if ln.startswith(("PASSED ", "FAILED ", "ERROR "))
    }
    hog = "FAILED" if every else "PASSED"
    assert outcomes == {
        "test_all.py::test_unmarked": "PASSED",
        "test_all.py::test_unmarked_hog": hog,
        "test_all.py::test_opted_out": "PASSED",
        "test_all.py::test_marker_field_overrides_the_default": "PASSED",
        "test_all.py::TestOptedOut::test_in_class": "PASSED",
        "test_all.py::TestOptedOut::test_closer_marker_wins": "PASSED",
        "test_all.py::TestMarked::test_opted_out_of_the_class_marker": "PASSED",
    }, result.stdout.str()
    if every:
        result.stdout.fnmatch_lines(
            [
                "*_ test_unmarked_hog _*",
                "*sbxlimit: the test body hit its memory limit of 64.0 MiB*",
            ]
        )
        result.stdout.fnmatch_lines(
            ["sbxlimit: every test body forked (*); defaults: ini option sbxlimit_defaults*"]
        )
    else:
        assert "every test body forked" not in result.stdout.str()


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        (
            "bare",
            "ERROR: --sbxlimit-all: no default limits or policy to put every test under; "
            "set them with --sbxlimit-defaults 'memory=1Gi wall_time=60s', *",
        ),
        (
            "none",
            "ERROR: environment variable SBXLIMIT_ALL: no default limits or policy to put *",
        ),
        (
            "env",
            "ERROR: environment variable SBXLIMIT_ALL: expected true or false * (got 'maybe')",
        ),
        ("ini", "ERROR: ini option sbxlimit_all in *tox.ini: *'maybe'*"),
    ],
    ids=["bare", "none", "env", "ini"],
)
def test_every_test_needs_defaults(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, where: str, expected: str
) -> None:
    # A switch with nothing to apply is refused, as is a switch that is
    # neither on nor off.
    inner.makepyfile("def test_nothing(): pass")
    args = ["-p", "no:cacheprovider"]
    if where == "bare":
        args.append("--sbxlimit-all")
    elif where == "none":
        monkeypatch.setenv("SBXLIMIT_ALL", "yes")
        args += ["--sbxlimit-defaults", "memory=none"]
    elif where == "env":
        monkeypatch.setenv("SBXLIMIT_ALL", "maybe")
    else:
        inner.makeini("[pytest]\nsbxlimit_all = maybe\n")
    result = inner.runpytest_subprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([expected])
