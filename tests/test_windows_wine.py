"""The Windows job layer (csrc/windows/job.c, spawn.c) run for real under Wine.

tests/c/windows/job_test.c and the real sources are cross-compiled with zig
(x86_64-windows-gnu) under -Werror and run under Wine; each check prints
one JSON line (check, status pass|fail|unsupported, detail).  Wine is not
Windows: what it implements of Job Objects is asserted to pass; what it
does not implement is listed in WINE_LACKS with the reason, measured on
Wine 8.0 (Debian's wine64), and reported as an expected failure -- never
faked.  Should Wine start holding one of those, its test fails until it
moves to WINE_HOLDS.  The real Windows run is the GitHub workflow's
(.github/workflows/tests.yml, job windows).  docs/windows.md has the table.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .cbuild import WARNINGS

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"
SOURCES = [
    ROOT / "tests" / "c" / "windows" / "job_test.c",
    CSRC / "windows" / "job.c",
    CSRC / "windows" / "spawn.c",
]

# What Wine 8 implements of a Job Object, each checked for real.
WINE_HOLDS = {
    "create": "SetInformationJobObject(JobObjectExtendedLimitInformation) accepts every limit",
    "cpu_rate_value": "pure: millicores to CpuRate",
    "msg_reason": "pure: completion message to termination reason",
    "job_list": "PROC_THREAD_ATTRIBUTE_JOB_LIST: the program is in the job from birth",
    "assign": "created suspended, assigned, resumed: in the job before it ran",
    "assign_failure": "a refused assignment: the suspended program never ran",
    "spawn_error": "CreateProcessW's error reaches the caller with its step",
    "handle_list": "PROC_THREAD_ATTRIBUTE_HANDLE_LIST: only the listed handles are inherited",
    "port_messages": "the completion port: new_process, exit_process, active_process_zero",
    "kill_on_job_close": "closing the job kills the child and the grandchild",
    "terminate_job": "TerminateJobObject (kill_tree) ends the whole tree with its exit code",
    "accounting_basic": "JobObjectBasicAccountingInformation: process counts",
    "no_breakaway": "CREATE_BREAKAWAY_FROM_JOB refused without BREAKAWAY_OK",
}

# What it does not, and why (the detail each check prints says what was seen).
WINE_LACKS = {
    "query_limits": "QueryInformationJobObject(JobObjectExtendedLimitInformation) succeeds "
    "but reads back zeros: Wine keeps only the flags it acts on",
    "cpu_rate": "JobObjectCpuRateControlInformation is refused (ERROR_INVALID_PARAMETER)",
    "active_process_limit": "ActiveProcessLimit is accepted and not held: every process starts",
    "job_memory_limit": "JobMemoryLimit is accepted and not held: the commit succeeds",
    "per_job_user_time": "PerJobUserTimeLimit is accepted and not held: the job runs on",
    "accounting_cpu_time": "TotalUserTime stays 0: Wine does not account a job's CPU time",
    "accounting_io": "JobObjectBasicAndIoAccountingInformation fails (ERROR_INVALID_FUNCTION)",
    "peak_memory": "PeakJobMemoryUsed stays 0: Wine does not account a job's memory",
    "die_on_unhandled_exception": "DIE_ON_UNHANDLED_EXCEPTION is ignored: a crash starts "
    "winedbg instead of ending the program",
}

ALL_CHECKS = [*WINE_HOLDS, *WINE_LACKS]
# The checks bound each of their waits (about 25 s in all); this bounds the
# program on a loaded machine.
RUN_TIMEOUT = 300


def _wine() -> tuple[str, str] | None:
    """wine (or wine64) and wineserver, on PATH or where Debian puts them."""
    for wine, server in (
        (shutil.which("wine"), shutil.which("wineserver")),
        (shutil.which("wine64"), shutil.which("wineserver")),
        ("/usr/lib/wine/wine64", "/usr/lib/wine/wineserver"),
    ):
        if wine and server and os.access(wine, os.X_OK) and os.access(server, os.X_OK):
            return wine, server
    return None


pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("ziglang") is None,
        reason="the Windows cross-compile needs zig: pip install ziglang",
    ),
    pytest.mark.skipif(
        _wine() is None, reason="no Wine to run the Windows job layer: apt-get install wine64"
    ),
]


def _zig_env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    # zig builds the MinGW C runtime once (about a minute) into its global
    # cache: the user's, kept between runs, where it can be written.
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "zig"
    try:
        cache.mkdir(parents=True, exist_ok=True)
        probe = cache / f".sbx-probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError:
        cache = tmp / "zig-cache"
    env["ZIG_GLOBAL_CACHE_DIR"] = str(cache)
    env["ZIG_LOCAL_CACHE_DIR"] = str(tmp / "zig-local")
    return env


def _wine_env(prefix: Path) -> dict[str, str]:
    env = dict(os.environ, WINEPREFIX=str(prefix), WINEDEBUG="-all")
    env.pop("DISPLAY", None)  # no window, ever (winedbg's included)
    # No Mono or Gecko install prompt for a fresh prefix.
    env["WINEDLLOVERRIDES"] = "mscoree,mshtml="
    return env


def _wine_run(wine: str, args: list[str], env: dict[str, str], out: Path) -> tuple[int, str, str]:
    """A program under Wine, its output into files: a process it leaves
    behind holding a pipe cannot keep the run from ending."""
    out_p, err_p = out.with_suffix(".out"), out.with_suffix(".err")
    with open(out_p, "wb") as o, open(err_p, "wb") as e:
        rc = subprocess.run(
            [wine, *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=o,
            stderr=e,
            timeout=RUN_TIMEOUT,
        ).returncode
    return rc, out_p.read_text(errors="replace"), err_p.read_text(errors="replace")


def _end_prefix(server: str, env: dict[str, str], prefix: Path) -> None:
    """wineserver -k; then any process of this prefix Wine failed to end
    (found by its WINEPREFIX: ours alone); then the prefix itself."""
    for arg in ("-k", "-w"):
        try:
            subprocess.run(
                [server, arg], env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=30
            )
        except subprocess.TimeoutExpired:
            pass
    mark = f"WINEPREFIX={prefix}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
    # wineserver's socket directory, named after the prefix's device and
    # inode (Debian's Wine makes it in a /tmp/wine-XXXXXX of its own).
    try:
        st = os.stat(prefix)
        server_dir = f"server-{st.st_dev:x}-{st.st_ino:x}"
        tmp = Path(tempfile.gettempdir())
        for d in tmp.glob("wine-*"):
            if (d / server_dir).is_dir():
                shutil.rmtree(d, ignore_errors=True)
    except OSError:
        pass
    # A prefix is hundreds of MiB: not left for pytest's retention.
    shutil.rmtree(prefix, ignore_errors=True)


@pytest.fixture(scope="module")
def job_test(tmp_path_factory: pytest.TempPathFactory):
    """job_test.exe built, and a Wine prefix of its own started; yields
    (wine, exe, env, tmp).  At the end nothing of the prefix is left
    running, and the prefix is removed."""
    tmp = tmp_path_factory.mktemp("wine")
    exe = tmp / "job_test.exe"
    cmd = [
        sys.executable,
        "-m",
        "ziglang",
        "cc",
        "-target",
        "x86_64-windows-gnu",
        *WARNINGS,
        *(str(s) for s in SOURCES),
        "-o",
        str(exe),
    ]
    made = subprocess.run(cmd, env=_zig_env(tmp), capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, f"{' '.join(cmd)}\n{made.stderr}"
    wine, server = _wine() or ("", "")
    env = _wine_env(tmp / "prefix")
    try:
        # The first start makes the prefix (a few seconds); a check timed
        # while it settles would measure Wine's start, not the job.
        _rc, out, err = _wine_run(wine, [str(exe), "pure"], env, tmp / "warm")
        if '"cpu_rate_value"' not in out:
            pytest.skip(f"Wine does not run a Windows program here: {err.strip()[-300:]}")
        yield wine, exe, env, tmp
    finally:
        _end_prefix(server, env, tmp / "prefix")


@pytest.fixture(scope="module")
def results(job_test) -> dict[str, dict[str, str]]:
    """Every check, run once in one program (one Wine start)."""
    wine, exe, env, tmp = job_test
    rc, out, err = _wine_run(wine, [str(exe)], env, tmp / "all")
    checks: dict[str, dict[str, str]] = {}
    for line in out.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            checks[rec["check"]] = rec
    assert rc == 0, err[-2000:]
    return checks


def test_every_check_ran_and_is_listed(results):
    # A check missing from the output (the program died on the way) or one
    # printed but in neither table is a failure, not a silent skip.
    assert sorted(results) == sorted(ALL_CHECKS)
    for rec in results.values():
        assert rec["status"] in ("pass", "fail", "unsupported"), rec


@pytest.mark.parametrize("check", list(WINE_HOLDS))
def test_what_wine_holds(results, check):
    rec = results[check]
    assert rec["status"] == "pass", f"{check}: {rec['detail']}"


@pytest.mark.parametrize("check", list(WINE_LACKS))
def test_what_wine_lacks(results, check):
    rec = results[check]
    if rec["status"] == "pass":
        pytest.fail(f"{check} passes under this Wine: move it to WINE_HOLDS ({rec['detail']})")
    pytest.xfail(f"Wine: {WINE_LACKS[check]} (seen: {rec['status']}: {rec['detail']})")


def test_an_unknown_check_is_an_error(job_test):
    # A misspelt check name must not run nothing and exit 0.
    wine, exe, env, tmp = job_test
    rc, _out, err = _wine_run(wine, [str(exe), "no-such-check"], env, tmp / "unknown")
    assert rc == 2 and "no such check" in err
