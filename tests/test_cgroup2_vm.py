"""Runs tests/test_cgroups.py and tests/test_sentinel.py (and, in one guest,
tests/test_verdicts.py and tests/test_scale.py: v2's kernfs events)
under a real cgroup v2 kernel, and
tests/test_escapes.py and tests/test_file_rules.py under a kernel without
Landlock.

This machine's kind (a cgroup v1 hybrid) cannot give cgroup v2 its
controllers, so the v2 tests run inside a User-Mode-Linux guest that mounts
the host's files and a cgroup2 hierarchy with memory, pids and cpu
(tests/vm/run-in-uml.sh; docs/development.md).  The guest runs the same
interpreter and the same build; SBXLIMIT_EXPECT_CGROUP=2 makes the run fail
rather than skip if v2 were not found there.  Its kernel (6.1) has no
Landlock: the attacks meet the read-only view and the seccomp filter alone
there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(HERE, "vm", "run-in-uml.sh")
UML = shutil.which("linux.uml") or (
    "/usr/bin/linux.uml" if os.path.exists("/usr/bin/linux.uml") else None
)


def _guest_cannot_boot() -> str:
    """Why a UML guest cannot boot on this host, or "".  UML 6.1 (Debian
    bookworm's) saves the guest's FPU state with PTRACE_SETREGSET of a
    fixed-size XSTATE buffer; a host CPU with a larger one (AMX) refuses it
    (EFAULT) and the guest's init dies before anything runs."""
    if UML is None or os.environ.get("SBXLIMIT_IN_UML") == "1" or os.geteuid() != 0:
        return ""
    r = subprocess.run(
        [RUNNER, "-v", "--timeout", "60", "--", "/bin/true"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if r.returncode == 0:
        return ""
    if "ptrace set fp regs failed" in r.stderr + r.stdout:
        return (
            "User-Mode Linux 6.1 cannot run on this host's CPU: its FPU state is larger "
            "(AMX) than the guest kernel saves through ptrace, and the guest dies at boot; "
            "the cgroup v2 and no-Landlock runs need a host without AMX"
        )
    return ""  # another failure: the test itself reports it


@pytest.mark.skipif(
    UML is None, reason="no User-Mode Linux kernel: apt-get install user-mode-linux"
)
@pytest.mark.skipif(os.environ.get("SBXLIMIT_IN_UML") == "1", reason="already inside the guest")
@pytest.mark.skipif(
    os.geteuid() != 0,
    reason="the cgroup v2 guest runs in the root pass (its hostfs writes land as this user)",
)
def test_cgroup_suite_under_cgroup2():
    """Three guests at once (each has one CPU): the supervisor in the root
    cgroup, and in a leaf that holds it, as under systemd with
    Delegate=yes (where cgroup v2's no-internal-process rule applies); and
    the attacks on a kernel without Landlock."""
    why = _guest_cannot_boot()
    if why:
        pytest.skip(why)
    pytest_cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    pytest_cmd += ["-p", "no:randomly"]
    cgroups = [os.path.join(HERE, f) for f in ("test_cgroups.py", "test_sentinel.py")]
    verdicts = [os.path.join(HERE, f) for f in ("test_verdicts.py", "test_scale.py")]
    escapes = [
        os.path.join(HERE, f)
        for f in ("test_escapes.py", "test_file_rules.py", "test_network_proxy.py")
    ]
    # The guests share the host's files: each gets a temp dir of its own, or
    # one's leak check would see the other's workspaces.
    names = ("root cgroup", "delegated leaf", "no Landlock: escapes")
    tmps = [tempfile.mkdtemp(prefix="cg2vm-tmp-") for _ in names]
    guests = dict(zip(names, tmps, strict=True))
    extra = {  # guest options, test files
        "root cgroup": ([], cgroups + verdicts),
        "delegated leaf": (["--cgroup", "deleg/leaf"], cgroups),
        "no Landlock: escapes": ([], escapes),
    }

    def boot(where: str) -> subprocess.Popen[str]:
        opts, tests = extra[where]
        return subprocess.Popen(
            [RUNNER, "--timeout", "600", *opts, *pytest_cmd, *tests],
            # Two guests writing the same __pycache__ over hostfs can race.
            env=dict(
                os.environ,
                SBXLIMIT_EXPECT_CGROUP="2",
                SBXLIMIT_IN_UML="1",
                TMPDIR=guests[where],
                PYTHONDONTWRITEBYTECODE="1",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=os.path.dirname(HERE),
        )

    runs = {where: boot(where) for where in guests}
    failures = []
    try:
        for where, p in runs.items():
            out, err = p.communicate()
            if p.returncode == 125:  # the VM itself failed (not a test): once more
                p = boot(where)
                out, err = p.communicate()
            if p.returncode != 0 or " passed" not in out or " failed" in out:
                # The assertion lines first: a long traceback would push them out.
                key = [ln for ln in out.splitlines() if ln.startswith("E ") and "Error" in ln]
                failures.append(
                    f"--- {where} (exit {p.returncode}):\n" + "\n".join(key[-10:]) + "\n"
                    f"{out[-3000:]}{err[-1500:]}"
                )
    finally:
        for tmp in tmps:
            shutil.rmtree(tmp, ignore_errors=True)
    assert not failures, "\n".join(failures)
