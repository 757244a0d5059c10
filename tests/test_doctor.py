"""doctor() tells the truth: each check that says ok is followed here by a
real use of the mechanism through independent means (util-linux, ctypes),
and the summary is exactly what Popen.enforced reports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import warnings

import pytest

import sbxlimit
from sbxlimit import _core
from sbxlimit._doctor import _REFERENCE_LIMITS, _isatty_color

from .conftest import report

PY = sys.executable


def test_report_shape_and_json_schema():
    r = report()
    d = json.loads(r.to_json())
    assert set(d) == {"system", "checks", "summary", "ok"}
    assert set(d["system"]) == {"os", "kernel", "arch", "python", "uid", "capabilities"}
    for c in d["checks"]:
        assert set(c) == {"name", "status", "reason", "fix", "details"}
        assert c["status"] in ("ok", "degraded", "unavailable", "info")
        assert c["reason"] and "\n" not in c["reason"]
    names = [c["name"] for c in d["checks"]]
    assert len(names) == len(set(names))
    for needed in (
        "spawn",
        "rlimits",
        "cgroups",
        "landlock",
        "seccomp",
        "user_namespace",
        "pidfd",
        "clone3_cgroup",
        "read_only_view",
        "capabilities",
        "container",
        "tmpdir",
    ):
        assert needed in names
    assert d["ok"] == r.ok == (not any(v.startswith("unenforced") for v in d["summary"].values()))


def test_summary_is_what_popen_enforces():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        p = sbxlimit.Popen([PY, "-c", "pass"], limits=_REFERENCE_LIMITS, policy=sbxlimit.Policy())
    p.wait()
    assert p.enforced == report().summary


def test_checklist_rendering():
    text = str(report())
    assert "\033[" not in text  # no colour unless asked
    assert "What would hold each limit" in text and "Result:" in text
    for c in report().checks:
        assert c.name in text
    colored = report().render(color=True)
    assert "\033[32m" in colored or "\033[31m" in colored


def test_colour_only_on_a_tty_and_never_with_no_color(monkeypatch):
    class Tty:
        def isatty(self):
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert _isatty_color(Tty())
    assert not _isatty_color(object())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not _isatty_color(Tty())


def test_a_hanging_probe_cannot_hang_doctor():
    t0 = time.monotonic()
    assert _core.probe(_core.PROBE_HANG, 0, 200) == 110  # ETIMEDOUT
    assert time.monotonic() - t0 < 5
    time.sleep(0.05)
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)  # the hung child was killed and reaped


def test_rlimits_ok_means_rlimits_hold():
    c = report().check("rlimits")
    if c.status != "ok":
        pytest.skip(f"doctor: rlimits {c.status}: {c.reason}")
    r = sbxlimit.run([PY, "-c", "while True: pass"], limits=sbxlimit.Limits(cpu_time=1))
    assert r.termination.reason == "cpu_time"


def test_pidfd_ok_means_pidfd_works():
    c = report().check("pidfd")
    if c.status != "ok":
        pytest.skip(f"doctor: pidfd {c.status}: {c.reason}")
    fd = os.pidfd_open(os.getpid())
    os.close(fd)


def _unshare(*flags: str) -> int:
    return subprocess.run(["unshare", *flags, "true"], capture_output=True).returncode


@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux unshare not installed")
@pytest.mark.parametrize(
    "check,flags",
    [
        ("user_namespace", ["-U"]),
        ("mount_namespace", ["-m"]),
        ("network_namespace", ["-n"]),
        ("pid_namespace", ["-p", "-f"]),
    ],
)
def test_namespace_checks_match_unshare(check, flags):
    c = report().check(check)
    if check != "user_namespace" and os.geteuid() != 0:
        flags = ["-r", *flags]  # as the doctor does: inside a user namespace
    ok = _unshare(*flags) == 0
    assert (c.status == "ok") == ok, c.reason


NNP_AND_SECCOMP = r"""
import ctypes, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
    sys.exit(2)
# one instruction: RET ERRNO(EPERM) for everything but exit_group/write/...:
# keep it simple: allow all, then check the mode reads back as filter.
filt = (ctypes.c_ubyte * 8).from_buffer_copy(struct.pack("HBBI", 0x06, 0, 0, 0x7FFF0000))
prog = struct.pack("HxxxxxxQ", 1, ctypes.addressof(filt))
buf = ctypes.create_string_buffer(prog)
if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, buf, 0, 0) != 0:
    sys.exit(3)
mode = [l for l in open("/proc/self/status") if l.startswith("Seccomp:")][0].split()[1]
sys.exit(0 if mode == "2" else 4)
"""


def test_seccomp_and_no_new_privs_checks_match_a_real_filter():
    rc = subprocess.run([PY, "-c", NNP_AND_SECCOMP]).returncode
    assert (report().check("no_new_privs").status == "ok") == (rc != 2)
    assert (report().check("seccomp").status == "ok") == (rc == 0)


LANDLOCK = r"""
import ctypes, os, struct, sys, tempfile
libc = ctypes.CDLL(None, use_errno=True)
SYS_create, SYS_add, SYS_restrict = 444, 445, 446
WRITE_FILE = 1 << 1
attr = struct.pack("Q", WRITE_FILE)
fd = libc.syscall(SYS_create, attr, len(attr), 0)
if fd < 0:
    sys.exit(2)
libc.prctl(38, 1, 0, 0, 0)
if libc.syscall(SYS_restrict, fd, 0) != 0:
    sys.exit(3)
try:
    open(sys.argv[1], "w")
except PermissionError:
    sys.exit(0)
sys.exit(4)
"""


def test_landlock_check_matches_a_real_ruleset(tmp_path):
    c = report().check("landlock")
    rc = subprocess.run([PY, "-c", LANDLOCK, str(tmp_path / "f")]).returncode
    assert (c.status in ("ok", "degraded")) == (rc == 0), (c.reason, rc)
    if rc == 0:
        abi = c.details["abi"]
        assert abi == _core.landlock_abi() >= 1


def test_cgroup_check_leaves_nothing_behind():
    report()
    for root, dirs, _files in os.walk("/sys/fs/cgroup"):
        assert not [d for d in dirs if d.startswith("sbxlimit-probe")], root
        dirs[:] = [] if root.count("/") > 5 else dirs


def test_container_check_is_informational():
    c = report().check("container")
    assert c.status == "info"
    assert ("/.dockerenv" in c.reason) == os.path.exists("/.dockerenv")


@pytest.fixture
def ext4(tmp_path):
    """A small ext4 mounted from an image, with or without a journal."""
    if os.geteuid() != 0 or not shutil.which("mkfs.ext4"):
        pytest.skip("mounting an ext4 image needs root and mkfs.ext4")
    mounted: list[str] = []

    def make(journal: bool) -> str:
        img = tmp_path / f"ext4-{journal}.img"
        with open(img, "wb") as f:
            f.truncate(32 << 20)
        feature = "has_journal" if journal else "^has_journal"
        subprocess.run(["mkfs.ext4", "-q", "-F", "-O", feature, str(img)], check=True)
        mnt = tmp_path / f"ext4-{journal}"
        mnt.mkdir()
        r = subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], capture_output=True)
        if r.returncode != 0:
            pytest.skip(f"no loop mount here: {r.stderr.decode().strip()}")
        mounted.append(str(mnt))
        dev = os.stat(mnt).st_dev
        name = os.path.basename(os.readlink(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"))
        if not os.path.exists(f"/sys/fs/ext4/{name}/journal_task"):
            pytest.skip("this kernel's ext4 does not say whether it has a journal")
        return str(mnt)

    yield make
    for mnt in mounted:
        subprocess.run(["umount", mnt], check=False)


def test_the_tmpdir_row_names_ext4_without_a_journal(ext4, monkeypatch):
    import tempfile

    from sbxlimit import _doctor

    bare, journaled = ext4(False), ext4(True)
    monkeypatch.setattr(tempfile, "tempdir", bare)
    c = _doctor._check_tmpdir()
    assert c.status == "info" and bare in c.reason
    assert "ext4 without a journal" in c.reason and "TMPDIR" in c.fix
    monkeypatch.setattr(tempfile, "tempdir", journaled)
    c = _doctor._check_tmpdir()
    assert c.reason == f"private workspaces are made in {journaled}" and not c.fix


def test_the_tmpdir_row_is_informational_and_quiet_on_tmpfs(monkeypatch):
    import tempfile

    from sbxlimit import _doctor

    assert report().check("tmpdir").status == "info"
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm tmpfs here")
    monkeypatch.setattr(tempfile, "tempdir", "/dev/shm")
    assert _doctor._check_tmpdir().reason == "private workspaces are made in /dev/shm"


def test_the_process_tree_probe_sees_and_ends_three_levels(no_namespaces):
    # doctor's macOS probe of the tree walk (a setsid() child included),
    # run here against the Linux walk: the same contract.
    from sbxlimit import _doctor

    c = _doctor._check_process_tree()
    assert c.status == "ok", c.reason
    assert "setsid() child included" in c.reason
