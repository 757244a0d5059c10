"""Every child step's failure reaches Python with its step and errno.

sbxlimit._testing.fail_child_at makes the child fail at a named step, before
the real call; each case sets up a spawn in which that step runs.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import warnings

import pytest

import sbxlimit
from sbxlimit._cgroup import discover
from sbxlimit._namespaces import CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID, namespaces
from sbxlimit._testing import fail_child_at

from .conftest import holds, own_fds, settled_fds, why_not

PY = sys.executable
ROOT = os.geteuid() == 0


def _kwargs(step: str, tmp_path) -> dict:
    """Popen arguments under which `step` runs."""
    L = sbxlimit.Limits
    return {
        "cgroup:procs": {"limits": L(wall_time=10)},
        "signals:reset": {},
        "stdio:dup2": {"stdout": subprocess.PIPE},
        "session:setsid": {"start_new_session": True},
        "session:setpgid": {"process_group": 0},
        "pdeathsig": {"limits": L(wall_time=10), "die_with_parent": True},
        "ns:unshare": {"policy": sbxlimit.Policy(network="deny", workdir="/")},
        "ns:idmap": {"policy": sbxlimit.Policy(network="deny", workdir="/")},
        "ns:loopback": {"policy": sbxlimit.Policy(network="deny", workdir="/")},
        "ns:mount": {"limits": L(disk="1Mi")},
        "ns:view": {"policy": sbxlimit.Policy(protect_dotfiles=False)},
        "ns:pid": {"policy": sbxlimit.Policy(isolate_pids=True, workdir="/")},
        "rlimit:RLIMIT_CORE": {"limits": L(wall_time=10)},
        "rlimit:RLIMIT_CPU": {"limits": L(cpu_time=10)},
        "rlimit:RLIMIT_FSIZE": {"limits": L(file_size="1Mi")},
        "rlimit:RLIMIT_DATA": {"limits": L(memory="1Gi"), "cgroup_parent": "none"},
        "rlimit:RLIMIT_AS": {"limits": L(address_space="4Gi")},
        "rlimit:RLIMIT_NOFILE": {"limits": L(open_files=512)},
        "rlimit:RLIMIT_NPROC": {"limits": L(pids=4096), "cgroup_parent": "none"},
        "chdir": {"cwd": str(tmp_path)},
        "umask": {"umask": 0o022},
        "setgroups": {"extra_groups": [os.getgid()]},
        "setgid": {"group": os.getgid()},
        "setuid": {"user": os.getuid()},
        "caps:drop": {"policy": sbxlimit.Policy(protect_dotfiles=False, workdir="/")},
        "harden:no_new_privs": {"policy": sbxlimit.Policy(protect_dotfiles=False, workdir="/")},
        "harden:seccomp": {"policy": sbxlimit.Policy(protect_dotfiles=False, workdir="/")},
        "landlock:restrict": {"policy": sbxlimit.Policy(workdir="/")},
        "preexec_fn": {"preexec_fn": lambda: None},
        "pass_fds": {"pass_fds": [2]},  # fd 2 exists under any capture mode
        "close_fds": {},
        "signals:mask": {},
        "exec": {},
        "ns:setns": {"policy": sbxlimit.Policy(network="deny", workdir="/")},
        "ns:proxy": {
            "policy": sbxlimit.Policy(network="proxy", allow_domains=["example.com"], workdir="/")
        },
    }[step]


STEPS = [s for s in sbxlimit.STEPS if s != "none"]


def _netns_pool_for(step: str) -> None:
    """ns:setns runs only with a network namespace made ahead (root), and
    ns:loopback only without one."""
    import time

    from sbxlimit._monitor import get_monitor

    pool = get_monitor()._netpool
    if step == "ns:loopback":
        pool.drain()  # the next spawn makes its own
        return
    if namespaces(CLONE_NEWNET).user or not namespaces(CLONE_NEWNET).ok:
        pytest.skip("network namespaces are made ahead only without a user namespace (root)")
    sbxlimit.run(["true"], policy=sbxlimit.Policy(network="deny", workdir="/"))
    deadline = time.monotonic() + 10
    while not pool.has_ready():
        assert time.monotonic() < deadline, "no network namespace was made ahead"
        time.sleep(0.01)


def test_every_step_is_covered():
    for step in STEPS:
        _kwargs(step, "/tmp")  # KeyError if a new step has no case here


@pytest.mark.parametrize("step", STEPS)
def test_step_failure_reaches_python(step, tmp_path):
    if step == "rlimit:RLIMIT_NPROC" and ROOT:
        pytest.skip(f"no RLIMIT_NPROC step to fail: {holds('pids')}")
    if step == "cgroup:procs" and not discover().version:
        pytest.skip(f"no cgroup to join: {discover().reason}")
    if step == "landlock:restrict" and sbxlimit._core.landlock_abi() < 1:
        pytest.skip(f"no Landlock here ({why_not('landlock')})")
    if step.startswith("ns:"):
        flag = {
            "ns:mount": CLONE_NEWNS,
            "ns:view": CLONE_NEWNS,
            "ns:pid": CLONE_NEWPID | CLONE_NEWNS,
        }.get(step, CLONE_NEWNET)
        ns = namespaces(flag, view=True) if step == "ns:view" else namespaces(flag)
        if not ns.ok:
            pytest.skip(f"no namespace here: {ns.reason}")
        if step == "ns:idmap" and not ns.user:
            pytest.skip("no uid map to write: this process makes namespaces without a user one")
    if step == "signals:reset" and not sbxlimit._core.HAS_VFORK:
        pytest.skip("handlers are reset only in a CLONE_VM child; this build forks")
    if step == "signals:mask" and not sbxlimit._core.HAS_VFORK:
        pytest.skip("the mask is restored only in a CLONE_VM child; this build forks")
    if step in ("ns:setns", "ns:loopback"):
        _netns_pool_for(step)
    kw = _kwargs(step, tmp_path)
    err = errno.EPERM if step != "exec" else errno.EACCES
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with fail_child_at(step, err), pytest.raises(BaseException) as ei:
            sbxlimit.Popen([PY, "-c", "pass"], **kw)
    exc = ei.value
    if step == "preexec_fn":
        assert isinstance(exc, subprocess.SubprocessError)
        assert "preexec_fn" in str(exc)
        return
    assert isinstance(exc, OSError), repr(exc)
    assert exc.errno == err
    if step == "exec":
        assert isinstance(exc, PermissionError) and exc.filename == PY
    elif step == "chdir":
        assert exc.filename == str(tmp_path)
    else:
        assert isinstance(exc, sbxlimit.SandboxSetupError)
        assert isinstance(exc, PermissionError)  # errno's own OSError subclass too
        assert exc.step == step
        assert step in str(exc) and "Hint:" in str(exc)


def test_failure_leaves_no_child_and_closes_pipes():
    before = settled_fds()  # earlier tests' pidfds closed by the supervisor
    with fail_child_at("close_fds", errno.EMFILE), pytest.raises(OSError):
        sbxlimit.Popen(
            [PY, "-c", "pass"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            limits=sbxlimit.Limits(output="1Ki"),
        )
    assert own_fds() == before
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)


def test_real_setup_failure_bad_process_group():
    # setpgid to a group that does not exist fails with EPERM, in the child.
    for cls in (subprocess.Popen, sbxlimit.Popen):
        with pytest.raises(PermissionError):
            cls(["true"], process_group=2**22 - 3)


def test_unknown_step_rejected():
    with pytest.raises(ValueError, match="unknown child step"), fail_child_at("nope"):
        pass
