"""``enforced`` values are structured (``Enforcement``: held, mechanisms,
caveats, detail) and still the readable strings; every mechanism kind the
planners name is a ``Mechanism``; ``Termination.reason`` is a ``Reason``
(a Literal type checkers know); and a limit reached with a lower figure
read is said without contradicting itself."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import typing
import warnings
from collections.abc import Iterator

import pytest

import sbxlimit
from sbxlimit import (
    Enforcement,
    Limits,
    Mechanism,
    Policy,
    Termination,
    _core,
    _doctor,
    _namespaces,
    _plan,
    _platform,
    _seatbelt,
    _seccomp,
)
from sbxlimit._cgroup import NO_SITE, Site
from sbxlimit._enforcement import split_mechanism
from sbxlimit._evidence import KillRecord, Usage
from sbxlimit._namespaces import CLONE_NEWNET, Namespaces, namespaces
from sbxlimit._termination import classify

from .conftest import report

LINUX = sys.platform.startswith("linux")
PKG = os.path.dirname(os.path.abspath(sbxlimit.__file__))


# -- real sandboxes ---------------------------------------------------------


@pytest.fixture(params=["as is", "without CAP_SYS_ADMIN"])
def namespaces_here(request, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As this user, or as one without CAP_SYS_ADMIN (root made to take the
    unprivileged path: namespaces inside a user namespace of its own)."""
    if request.param != "as is":
        real = _platform.capability
        monkeypatch.setattr(
            _platform, "capability", lambda bit: bit != _platform.CAP_SYS_ADMIN and real(bit)
        )
    monkeypatch.setattr(_plan, "_cache", {})
    _namespaces.namespaces.cache_clear()
    yield
    _namespaces.namespaces.cache_clear()


@pytest.mark.skipif(not LINUX, reason="network namespaces are Linux's")
@pytest.mark.usefixtures("namespaces_here")
def test_network_deny_names_netns_as_root_and_unprivileged() -> None:
    ns = namespaces(CLONE_NEWNET)
    if not ns.ok:
        pytest.skip(f"no network namespace here: {ns.reason}")
    r = sbxlimit.run(["true"], policy=Policy(network="deny"))
    e = r.enforced["network"]
    assert isinstance(e, Enforcement)
    assert e.held
    # Matching the text ("netns ...") passed as root only: unprivileged,
    # the namespace comes with a user namespace ("userns+netns ...").
    assert e.startswith("userns+netns" if ns.user else "netns")
    assert Mechanism.NETNS in e.mechanisms
    assert (Mechanism.USERNS in e.mechanisms) == ns.user
    assert e.mechanism is (Mechanism.USERNS if ns.user else Mechanism.NETNS)
    assert "a network namespace of its own: loopback only" in e.caveats
    assert e.caveats[-1] in e.detail
    with sbxlimit.Popen(["true"], policy=Policy(network="deny")) as p:
        p.wait()
    assert p.enforced["network"] == e and p.enforced["network"].mechanisms == e.mechanisms


def test_an_unenforced_entry_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    # cpu (a rate) has nothing but a cgroup to hold it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        r = sbxlimit.run(["true"], limits=Limits(cpu="500m"), cgroup_parent="none")
    e = r.enforced["cpu"]
    assert isinstance(e, Enforcement)
    assert not e.held
    assert e.mechanisms == () and e.mechanism is None and e.parts == () and e.caveats == ()
    assert e.detail.startswith("no cgroup can be used")
    assert e == "unenforced: " + e.detail


def test_every_value_of_a_sandbox_is_an_enforcement_and_still_a_string(tmp_path) -> None:
    policy = Policy(network="deny", protect_dotfiles=True, writable_roots=[str(tmp_path)])
    limits = Limits(memory="64Mi", pids=32, cpu_time=10, wall_time=10, output="1Mi")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        r = sbxlimit.run(["true"], limits=limits, policy=policy)
    enforced = r.enforced
    assert enforced and all(isinstance(v, Enforcement) for v in enforced.values())
    plain = {k: str(v) for k, v in enforced.items()}
    assert all(type(v) is str for v in plain.values())
    assert enforced == plain
    assert json.dumps(enforced) == json.dumps(plain)
    for k, v in enforced.items():
        assert v.held == (not v.startswith("unenforced: ")), k
        assert v.held == bool(v.mechanisms), k
        assert hash(v) == hash(plain[k]) and f"{v}" == plain[k] and repr(v) == repr(plain[k])
        assert not v.held or v.startswith(v.mechanisms[0].value), k
        # Read back from JSON, the text gives the same structure's kinds.
        back = Enforcement(json.loads(json.dumps(v)))
        assert (back.held, back.mechanisms) == (v.held, v.mechanisms), k
    # The doctor's summary is the same kind of value.
    assert all(isinstance(v, Enforcement) for v in report().summary.values())


def test_enforcement_and_termination_pickle() -> None:
    e = Enforcement._held_by("x:y (a; b)", "rlimit:RLIMIT_DATA+watchdog:memory", ("a; b",))
    back = pickle.loads(pickle.dumps(e, pickle.HIGHEST_PROTOCOL))
    assert type(back) is Enforcement and back == e
    # The structure travels as is: the text alone would split "a; b".
    assert back.caveats == ("a; b",)
    assert back.parts == ((Mechanism.RLIMIT, "RLIMIT_DATA"), (Mechanism.WATCHDOG, "memory"))
    with pytest.raises(AttributeError):  # shared by a cached plan: frozen
        back._held = False
    r = sbxlimit.run(["sleep", "5"], limits=Limits(wall_time=0.2), policy=Policy(network="deny"))
    t = r.termination
    assert t is not None and t.reason == "wall_time"
    assert pickle.loads(pickle.dumps(t)) == t
    assert Termination.from_dict(json.loads(json.dumps(t.to_dict()))) == t
    enforced = pickle.loads(pickle.dumps(r.enforced))
    assert enforced == r.enforced
    assert [v.mechanisms for v in enforced.values()] == [v.mechanisms for v in r.enforced.values()]


def test_from_dict_refuses_an_unknown_reason() -> None:
    d = Termination("exited", None, None, None, "ok.", 0).to_dict()
    assert Termination.from_dict({**d, "new_key": 1}).reason == "exited"
    with pytest.raises(ValueError, match="memroy"):
        Termination.from_dict({**d, "reason": "memroy"})


def test_the_text_parses_to_its_kinds() -> None:
    e = Enforcement("userns+netns+seccomp:socket families (a network namespace of its own)")
    assert e.mechanisms == (Mechanism.USERNS, Mechanism.NETNS, Mechanism.SECCOMP)
    assert e.parts[-1] == (Mechanism.SECCOMP, "socket families")
    assert e.caveats == ("a network namespace of its own",)
    # A "+" that starts no kind belongs to the name before it.
    assert Enforcement("seccomp:ptrace+process_vm_readv refused").parts == (
        (Mechanism.SECCOMP, "ptrace+process_vm_readv refused"),
    )
    assert Enforcement("tree walk (process group); isolate_pids=False").mechanism is (
        Mechanism.TREE_WALK
    )
    assert Enforcement(Enforcement("cgroup2:memory.max")).detail == "memory.max"


# -- every kind is a Mechanism ----------------------------------------------


def _hold_sites() -> set[tuple[str, int, int]]:
    """Every planner's ``p.hold(...)`` call: (file, first line, last line)."""
    sites = set()
    for name in sorted(os.listdir(PKG)):
        if not name.endswith(".py"):
            continue
        path = os.path.join(PKG, name)
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "hold"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "p"
            ):
                sites.add((path, node.lineno, node.end_lineno or node.lineno))
    return sites


# The doctor's reference request, with the one limit it leaves out.
_FULL = dataclasses.replace(_doctor._REFERENCE_LIMITS, address_space=8 << 30)
_LIMITS = (
    _FULL,
    Limits(disk="1Mi", output="1Ki", truncate_output=True, tolerate=["disk"], pids=8),
)
_POLICIES = (
    Policy(),
    Policy(network="deny", protect_dotfiles=True, isolate_pids=True),
    Policy(network="proxy", proxy_ports=[3128], harden=False, capabilities=["CAP_NET_RAW"]),
    Policy(isolate_pids=False, terminal=True, env=["PATH"], drop_secrets=True),
    Policy(workdir="/tmp", writable_roots=["/tmp"]),
    Policy(network="proxy", allow_domains=["pypi.org"]),
)
_SITES = (
    NO_SITE,
    Site(2, (("", "/sys/fs/cgroup/x"),), frozenset({"memory", "pids", "cpu"})),
    Site(
        1,
        (("memory", "/m"), ("pids", "/p"), ("cpu", "/c"), ("cpuacct", "/a")),
        frozenset({"memory", "pids", "cpu"}),
    ),
)


def _machines() -> list[dict[str, typing.Any]]:
    """Stand-ins for the machines the planners tell apart."""
    linux = [
        {"ns": Namespaces(False, reason="off"), "abi": 0, "seccomp": False, "tree": 0},
        {"ns": Namespaces(False, reason="off"), "abi": 4, "seccomp": False, "tree": 1},
        {"ns": Namespaces(False, reason="off"), "abi": 3, "seccomp": True, "tree": 1},
        {"ns": Namespaces(False, reason="off"), "abi": 6, "seccomp": True, "tree": 1},
        {"ns": Namespaces(True), "abi": 0, "seccomp": True, "tree": 1},
        {"ns": Namespaces(True), "abi": 5, "seccomp": False, "tree": 1},
        {"ns": Namespaces(True, user=True), "abi": 7, "seccomp": True, "tree": 1},
        {"ns": Namespaces(True, user=True), "abi": 0, "seccomp": False, "tree": 0},
    ]
    return [
        *({"os": "linux", "cap": cap, **m} for m in linux for cap in (True, False)),
        {"os": "darwin", "cap": False, "ns": None, "abi": 0, "seccomp": False, "tree": 1},
        {"os": "darwin", "cap": True, "ns": None, "abi": 0, "seccomp": False, "tree": 0},
        {"os": "other", "cap": False, "ns": None, "abi": 0, "seccomp": False, "tree": 0},
        {"os": "windows", "cap": False, "ns": None, "abi": 0, "seccomp": False, "tree": 0},
    ]


@pytest.mark.skipif(not LINUX, reason="the Linux planners probe Linux's core")
def test_every_mechanism_kind_is_a_mechanism(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every planner's hold() call is reached on some stand-in machine, and
    each mechanism it names splits into known kinds only: a new kind
    without its ``Mechanism`` fails here."""
    held: list[tuple[str, str, tuple[str, int]]] = []
    real_hold = _plan.Plan.hold

    def hold(self: _plan.Plan, field: str, mechanism: str, *caveats: str) -> None:
        caller = sys._getframe(1)
        held.append((field, mechanism, (caller.f_code.co_filename, caller.f_lineno)))
        real_hold(self, field, mechanism, *caveats)

    monkeypatch.setattr(_plan.Plan, "hold", hold)
    monkeypatch.setattr(_seatbelt, "HELPER", sys.executable)
    rendered: list[Enforcement] = []
    for m in _machines():
        monkeypatch.setattr(_plan, "_cache", {})  # its key does not tell these machines apart
        monkeypatch.setattr(_platform, "LINUX", m["os"] == "linux")
        monkeypatch.setattr(_platform, "DARWIN", m["os"] == "darwin")
        monkeypatch.setattr(_platform, "WINDOWS", m["os"] == "windows")
        monkeypatch.setattr(_platform, "capability", lambda bit, cap=m["cap"]: cap)
        monkeypatch.setattr(_namespaces, "namespaces", lambda *a, ns=m["ns"], **k: ns)
        monkeypatch.setattr(_core, "landlock_abi", lambda abi=m["abi"]: abi)
        monkeypatch.setattr(_seccomp, "seccomp_works", lambda ok=m["seccomp"]: ok)
        monkeypatch.setattr(_core, "HAS_PROCTREE", m["tree"])
        for limits in _LIMITS:
            for policy in _POLICIES:
                for site in _SITES:
                    for uid, no_reaper in ((0, ""), (os.geteuid() or 1000, ""), (65534, "forked")):
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore", RuntimeWarning)
                            p = _plan.plan(limits, policy, uid=uid, site=site, no_reaper=no_reaper)
                        rendered += p.enforced.values()
    unknown = {}
    for field, mechanism, _where in held:
        parts, odd = split_mechanism(mechanism)
        if odd or not parts:
            unknown[field] = mechanism
    assert not unknown, f"kinds no Mechanism names: {unknown}"
    reached = {where for _f, _m, where in held}
    missed = [
        f"{os.path.basename(path)}:{first}"
        for path, first, last in _hold_sites()
        if not any(p == path and first <= line <= last for p, line in reached)
    ]
    assert not missed, f"hold() calls no stand-in machine reaches (add one): {missed}"
    # The text alone gives the same kinds (a value read back from JSON).
    for e in rendered:
        assert Enforcement(str(e)).mechanisms == e.mechanisms, e
        assert e.held == (e.mechanism is not None), e
    produced = {k for e in rendered for k in e.mechanisms}
    assert produced == set(Mechanism)


# -- Termination.reason -----------------------------------------------------


def test_reason_is_a_literal_of_the_reasons() -> None:
    assert typing.get_args(sbxlimit.Reason) == sbxlimit.REASONS
    assert typing.get_type_hints(Termination)["reason"] == sbxlimit.Reason
    assert set(sbxlimit.REASONS) > sbxlimit.LIMIT_REASONS


USER_CODE = """\
import sbxlimit
from sbxlimit import Mechanism

r = sbxlimit.run(["true"], policy=sbxlimit.Policy(network="deny"))
e = r.enforced["network"]
held: bool = e.held
netns: bool = Mechanism.NETNS in e.mechanisms
first: Mechanism | None = e.mechanism
why: str = e.detail
reason: sbxlimit.Reason = r.termination.reason
typo = r.termination.reason == "memroy"  # error: no such reason
wrong: sbxlimit.Reason = "memroy"  # error: no such reason
"""


@pytest.mark.skipif(shutil.which("mypy") is None, reason="mypy is not installed")
def test_type_checkers_know_the_structure_and_the_reasons(tmp_path) -> None:
    f = tmp_path / "user.py"
    f.write_text(USER_CODE)
    # MYPYPATH: an editable install's import hook is opaque to mypy.
    env = {**os.environ, "MYPYPATH": os.path.dirname(PKG)}
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", str(f)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    lines = {
        int(line.split(":")[1])
        for line in r.stdout.splitlines()
        if line.split(":")[0].endswith("user.py") and ": error:" in line
    }
    errors = [i for i, line in enumerate(USER_CODE.splitlines(), 1) if "# error" in line]
    assert lines == set(errors), r.stdout


# -- messages: a limit reached, a lower figure read -------------------------


def _classify(**kw: typing.Any) -> Termination:
    base: dict[str, typing.Any] = {
        "program": "`x`",
        "returncode": 0,
        "cpu_time_limit": None,
        "file_size_limit": None,
        "memory_limit": None,
        "enforced": {},
        "usage": Usage(),
        "kill": None,
    }
    return classify(**{**base, **kw})


def test_sigxcpu_below_the_limit_reads_without_contradiction() -> None:
    t = _classify(
        returncode=-signal.SIGXCPU,
        cpu_time_limit=1.0,
        usage=Usage(cpu_user=0.9, cpu_system=0.086),
        enforced={"cpu_time": Enforcement("rlimit:RLIMIT_CPU")},
    )
    assert t.reason == "cpu_time" and t.observed is not None and t.observed < 1
    # Not "was stopped after 986 ms of CPU time; its limit is 1 s".
    assert "its limit is" not in t.message
    assert t.message.startswith(
        "`x` was stopped on reaching its CPU-time limit of 1 s (rlimit:RLIMIT_CPU). "
        "The CPU time read is 986 ms: "
    )
    assert "Raise Limits.cpu_time" in t.message
    assert type(t.mechanism) is str
    # At or past the limit, the figure is said as before.
    t = _classify(
        returncode=-signal.SIGXCPU,
        cpu_time_limit=1.0,
        usage=Usage(cpu_user=1.0, cpu_system=0.02),
    )
    assert "was stopped after 1.0 s of CPU time; its limit is 1 s" in t.message


def test_an_oom_kill_below_the_limit_reads_without_contradiction() -> None:
    limit = 64 << 20
    kill = KillRecord("memory", limit, limit - 300_000, "cgroup2:memory.max", "1")
    t = _classify(returncode=-signal.SIGKILL, memory_limit=limit, kill=kill)
    assert "its limit is" not in t.message
    assert t.message.startswith(
        "`x` was killed on reaching its memory limit of 64.0 MiB, where the OOM killer had "
        "killed 1 of its processes (cgroup2:memory.max). The peak read is 63.7 MiB: "
    )
    assert "If it legitimately needs more" in t.message
    t = _classify(
        returncode=-signal.SIGKILL,
        memory_limit=limit,
        oom_kills=1,
        usage=Usage(memory_peak=None),
        enforced={"memory": Enforcement("cgroup1:memory.limit_in_bytes")},
    )
    assert t.message.startswith(
        "`x` was killed on reaching its memory limit of 64.0 MiB "
        "(cgroup1:memory.limit_in_bytes). If it legitimately needs more"
    )


def test_a_full_disk_below_the_limit_reads_without_contradiction() -> None:
    t = _classify(returncode=1, disk_limit=1 << 20, disk_full=True, usage=Usage(disk=1000 * 1024))
    assert t.reason == "disk" and "its limit is" not in t.message
    assert t.message.startswith(
        "`x` filled its workspace to its limit of 1.0 MiB (tmpfs:size). "
        "The workspace held 1000 KiB at the end. Raise Limits.disk"
    )
