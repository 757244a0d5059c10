"""The seccomp hardening filter: real denials from the kernel."""

from __future__ import annotations

import errno
import os
import struct
import sys
import textwrap

import pytest

import sbxlimit
from sbxlimit import _core
from sbxlimit._seccomp import seccomp_works

from .conftest import why_not

pytestmark = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and _core.HAS_SECCOMP and seccomp_works()),
    reason=f"no seccomp filter here ({why_not('seccomp')})",
)
POLICY = sbxlimit.Policy(workdir="/", protect_dotfiles=False)

PROBE = textwrap.dedent(
    r"""
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    SYS = {"x86_64": {"io_uring_setup": 425, "bpf": 321, "perf_event_open": 298,
                      "userfaultfd": 323, "kexec_load": 246, "fsopen": 430},
           "aarch64": {"io_uring_setup": 425, "bpf": 280, "perf_event_open": 241,
                       "userfaultfd": 282, "kexec_load": 104, "fsopen": 430}}[os.uname().machine]
    def err(r):
        return "ok" if r >= 0 else os.strerror(ctypes.get_errno())
    out = {"ptrace": err(libc.ptrace(0, 0, 0, 0)),
           "mount": err(libc.mount(b"none", b"/mnt", b"tmpfs", 0, None))}
    buf = ctypes.create_string_buffer(256)
    out["io_uring_setup"] = err(libc.syscall(SYS["io_uring_setup"], 8, buf))
    out["bpf"] = err(libc.syscall(SYS["bpf"], 0, buf, 64))
    out["perf_event_open"] = err(libc.syscall(SYS["perf_event_open"], buf, 0, -1, -1, 0))
    out["userfaultfd"] = err(libc.syscall(SYS["userfaultfd"], 0))
    out["fsopen"] = err(libc.syscall(SYS["fsopen"], b"tmpfs", 0))
    out["getpid"] = err(os.getpid())
    print(out)
    """
)


def probe(**kw) -> dict[str, str]:
    r = sbxlimit.run([sys.executable, "-c", PROBE], capture_output=True, text=True, **kw)
    assert r.returncode == 0, r.stderr
    return eval(r.stdout)  # our own dict literal


def test_dangerous_calls_get_eperm():
    out = probe(policy=POLICY)
    assert out.pop("getpid") == "ok"
    assert set(out.values()) == {"Operation not permitted"}, out


def test_without_harden_no_filter_is_loaded():
    r = sbxlimit.run(
        ["grep", "^Seccomp:", "/proc/self/status"],
        policy=sbxlimit.Policy(workdir="/", protect_dotfiles=False, harden=False),
        capture_output=True,
        text=True,
    )
    assert r.stdout.split() == ["Seccomp:", "0"] and "seccomp" not in r.enforced


def test_ordinary_programs_are_unaffected():
    r = sbxlimit.run(
        ["sh", "-c", "ls / >/dev/null && cat /proc/self/status | grep ^Seccomp: && echo done"],
        policy=POLICY,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and r.stdout.split()[-3:] == ["Seccomp:", "2", "done"]


def test_enforced_names_it():
    r = sbxlimit.run(["true"], policy=POLICY)
    assert r.enforced["seccomp"].startswith(f"seccomp:allow-list v{_core.SECCOMP_VERSION} (")
    assert r.enforced["not_dumpable"].startswith("seccomp:")


# -- the filter, rule by rule ---------------------------------------------------
#
# The program the core loads, run by a small classic-BPF interpreter on
# synthetic seccomp_data: one row per rule, both sides of each comparison.
# (tests/test_escapes.py attacks the loaded filter through the real kernel.)

ALLOW, ERRNO = 0x7FFF0000, 0x00050000
EPERM, ENOSYS, EAFNOSUPPORT, EPROTONOSUPPORT = (
    ERRNO | errno.EPERM,
    ERRNO | errno.ENOSYS,
    ERRNO | errno.EAFNOSUPPORT,
    ERRNO | errno.EPROTONOSUPPORT,
)
MACHINE = os.uname().machine
ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}.get(MACHINE, 0)
NR = {
    "x86_64": {
        "read": 0, "getpid": 39, "socket": 41, "clone": 56, "kill": 62, "ioctl": 16,
        "mknod": 133, "mknodat": 259, "unshare": 272, "setns": 308, "prlimit64": 302,
        "tgkill": 234, "tkill": 200, "pidfd_open": 434, "clone3": 435, "ptrace": 101,
        "mount": 165, "reboot": 169, "kcmp": 312, "pidfd_getfd": 438, "bpf": 321,
        "io_uring_setup": 425, "open_tree": 428, "chroot": 161, "swapon": 167,
        "rt_sigqueueinfo": 129, "pidfd_send_signal": 424,
    },
    "aarch64": {
        "read": 63, "getpid": 172, "socket": 198, "clone": 220, "kill": 129, "ioctl": 29,
        "mknodat": 33, "unshare": 97, "setns": 268, "prlimit64": 261, "tgkill": 131,
        "tkill": 130, "pidfd_open": 434, "clone3": 435, "ptrace": 117, "mount": 40,
        "reboot": 142, "kcmp": 272, "pidfd_getfd": 438, "bpf": 280, "io_uring_setup": 425,
        "open_tree": 428, "chroot": 51, "swapon": 224, "rt_sigqueueinfo": 138,
        "pidfd_send_signal": 424,
    },
}.get(MACHINE, {})  # fmt: skip
CALLER, PGID, GUARD = 4242, 4200, 4300  # GUARD: the caller's sentinel
H, DENY, PROXY, FAM, SIG = (
    _core.SECCOMP_HARDEN,
    _core.SECCOMP_NET_DENY,
    _core.SECCOMP_NET_PROXY,
    _core.SECCOMP_FAMILIES,
    _core.SECCOMP_SIGNALS,
)


def bpf_run(prog: bytes, nr: int, args: tuple[int, ...] = (), arch: int = ARCH) -> int:
    """What the filter returns for this call (struct seccomp_data: nr, arch,
    instruction pointer, args[6])."""
    return bpf_trace(prog, nr, args, arch)[0]


def bpf_trace(
    prog: bytes, nr: int, args: tuple[int, ...] = (), arch: int = ARCH
) -> tuple[int, int]:
    """What the filter returns for this call, and how many instructions it
    ran to decide."""
    args = tuple(a & (2**64 - 1) for a in args) + (0,) * (6 - len(args))
    data = struct.pack("<iIQ6Q", nr, arch, 0, *args)
    insns = [struct.unpack_from("<HBBI", prog, i) for i in range(0, len(prog), 8)]
    acc, pc = 0, 0
    for step in range(len(insns)):  # forward jumps only: at most one pass
        code, jt, jf, k = insns[pc]
        cls, op = code & 0x07, code & 0xF0
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            (acc,) = struct.unpack_from("<I", data, k)
        elif cls == 0x04 and op == 0x50:  # BPF_ALU | BPF_AND | BPF_K
            acc &= k
        elif cls == 0x06:  # BPF_RET | BPF_K
            return k, step + 1
        elif cls == 0x05:  # BPF_JMP
            if op == 0x00:  # JA
                pc += k
            else:
                taken = {0x10: acc == k, 0x30: acc >= k, 0x40: bool(acc & k)}[op]
                pc += jt if taken else jf
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")
        pc += 1
    raise AssertionError("fell off the program")


S_IFCHR, S_IFBLK, S_IFIFO, S_IFREG = 0o020000, 0o060000, 0o010000, 0o100000
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET, AF_VSOCK = 1, 2, 10, 16, 17, 40
STREAM, DGRAM, CLOEXEC = 1, 2, 0o2000000
RULES = [
    # (what, call, args, expected)
    (H, "getpid", (), ALLOW),
    (H, "read", (0, 0, 0), ALLOW),
    (H, "ptrace", (16, 1), EPERM),
    (H, "mount", (), EPERM),
    (H, "open_tree", (), EPERM),
    (H, "setns", (3, 0x40000000), EPERM),
    (H, "reboot", (), EPERM),
    (H, "kcmp", (), EPERM),
    (H, "pidfd_getfd", (), EPERM),
    (H, "bpf", (), EPERM),
    (H, "chroot", (), EPERM),
    (H, "swapon", (), EPERM),
    (H, "io_uring_setup", (8, 0), EPERM),
    (H, "clone3", (0, 88), ENOSYS),
    (H, "unshare", (0x10000000,), EPERM),  # CLONE_NEWUSER
    (H, "unshare", (0x20000,), EPERM),  # CLONE_NEWNS
    (H, "unshare", (0x80,), EPERM),  # CLONE_NEWTIME
    (H, "unshare", (0x400,), ALLOW),  # CLONE_FILES
    (H, "unshare", (0x400 | 1 << 32,), ALLOW),  # high bits: not flags the kernel reads
    (H, "clone", (0x40000000 | 17, 0), EPERM),  # CLONE_NEWNET | SIGCHLD
    (H, "clone", (0x3D0F00, 0), ALLOW),  # a thread
    (H, "clone", (0x80 | 17, 0), ALLOW),  # the low byte is the exit signal
    (H, "mknodat", (-100, 0, S_IFCHR | 0o600, 0x103), EPERM),
    (H, "mknodat", (-100, 0, S_IFBLK | 0o600, 0x700), EPERM),
    (H, "mknodat", (-100, 0, S_IFIFO | 0o600, 0), ALLOW),
    (H, "mknodat", (-100, 0, S_IFREG | 0o600, 0), ALLOW),
    (H, "ioctl", (0, 0x5412, 0), EPERM),  # TIOCSTI
    (H, "ioctl", (0, 0x5412 | 1 << 32, 0), EPERM),  # the kernel ignores the high bits
    (H, "ioctl", (0, 0x541C, 0), EPERM),  # TIOCLINUX
    (H, "ioctl", (1, 0x894C, 0), EPERM),  # SIOCGSKNS
    (H, "ioctl", (0, 0x5401, 0), ALLOW),  # TCGETS
    (H, "prlimit64", (0, 7, 0x1000, 0), ALLOW),  # setrlimit
    (H, "prlimit64", (77, 7, 0, 0x1000), ALLOW),  # reading another's
    (H, "prlimit64", (77, 7, 0x1000, 0), EPERM),
    (H, "prlimit64", (77, 7, 1 << 40, 0), EPERM),  # a pointer above 4 GiB
    (H, "kill", (-1, 9), EPERM),
    (H, "kill", (CALLER, 19), EPERM),
    (H, "kill", (-PGID, 15), EPERM),
    (H, "kill", (0, 15), ALLOW),  # its own group
    (H, "kill", (77, 15), ALLOW),  # its own child (Landlock scopes the rest)
    (H, "tgkill", (CALLER, CALLER, 9), EPERM),
    (H, "tgkill", (77, 77, 9), ALLOW),
    (H, "tkill", (CALLER, 9), EPERM),
    (H, "pidfd_open", (CALLER, 0), EPERM),
    (H, "pidfd_open", (77, 0), ALLOW),
    (H, "kill", (GUARD, 9), EPERM),
    (H, "kill", (-GUARD, 9), EPERM),  # its group of its own
    (H, "tgkill", (GUARD, GUARD, 9), EPERM),
    (H, "tkill", (GUARD, 9), EPERM),
    (H, "rt_sigqueueinfo", (GUARD, 9, 0), EPERM),
    (H, "rt_sigqueueinfo", (77, 9, 0), ALLOW),
    (H, "pidfd_open", (GUARD, 0), EPERM),
    (H, "kill", (-77, 9), ALLOW),  # a group of its own
    # A pidfd may be a /proc/PID directory's fd, whose process the filter
    # cannot see: refused whole where nothing else keeps signals in.
    (H, "pidfd_send_signal", (3, 9, 0, 0), ALLOW),
    (H | SIG, "pidfd_send_signal", (3, 9, 0, 0), ENOSYS),
    (H | SIG, "kill", (77, 9), ALLOW),
    (H, "socket", (AF_UNIX, STREAM, 0), ALLOW),
    (H, "socket", (AF_INET, DGRAM, 0), ALLOW),
    (H, "socket", (AF_INET6, STREAM, 0), ALLOW),
    (H, "socket", (AF_NETLINK, 3, 0), ALLOW),  # NETLINK_ROUTE
    (H, "socket", (AF_NETLINK, 3, 4), EPROTONOSUPPORT),  # NETLINK_SOCK_DIAG
    (H, "socket", (AF_NETLINK, 3, 15), EPROTONOSUPPORT),  # NETLINK_KOBJECT_UEVENT
    (H, "socket", (AF_VSOCK, STREAM, 0), EAFNOSUPPORT),
    (H, "socket", (AF_PACKET, 3, 0), EAFNOSUPPORT),
    (H, "socket", (44, 3, 0), EAFNOSUPPORT),  # AF_XDP
    (H, "socket", (AF_VSOCK | 1 << 32, STREAM, 0), EAFNOSUPPORT),
    (DENY, "socket", (AF_INET, STREAM, 0), EPERM),
    (DENY, "socket", (AF_INET6, DGRAM, 0), EPERM),
    (DENY, "socket", (AF_UNIX, STREAM, 0), ALLOW),
    (DENY, "socket", (AF_VSOCK, STREAM, 0), EAFNOSUPPORT),
    (DENY, "io_uring_setup", (8, 0), EPERM),
    (DENY, "ptrace", (16, 1), ALLOW),  # not asked: harden=False
    (PROXY, "socket", (AF_INET, STREAM, 0), ALLOW),
    (PROXY, "socket", (AF_INET, STREAM | CLOEXEC, 6), ALLOW),
    (PROXY, "socket", (AF_INET6, STREAM, 6), ALLOW),
    (PROXY, "socket", (AF_INET, DGRAM, 0), EPERM),
    (PROXY, "socket", (AF_INET, STREAM, 132), EPERM),  # SCTP
    (PROXY, "socket", (AF_INET, STREAM, 262), EPERM),  # MPTCP
    (PROXY, "socket", (AF_NETLINK, 3, 4), EPROTONOSUPPORT),
    (FAM, "socket", (AF_INET, DGRAM, 0), ALLOW),  # a network namespace holds inet
    (FAM, "socket", (AF_VSOCK, STREAM, 0), EAFNOSUPPORT),
    (FAM, "unshare", (0x10000000,), ALLOW),  # not asked: harden=False
    (H | DENY, "socket", (AF_INET, STREAM, 0), EPERM),
    (H | DENY, "kill", (CALLER, 9), EPERM),
]


@pytest.mark.skipif(not NR, reason=f"no filter for {MACHINE}")
@pytest.mark.parametrize(("what", "call", "args", "expected"), RULES)
def test_rule(what, call, args, expected):
    prog = _core.seccomp_program(what, CALLER, PGID, GUARD)
    assert bpf_run(prog, NR[call], args) == expected


@pytest.mark.skipif(not NR, reason=f"no filter for {MACHINE}")
@pytest.mark.parametrize("what", [H, DENY, PROXY, FAM, H | PROXY])
def test_other_abis_are_refused_whole(what):
    prog = _core.seccomp_program(what, CALLER, PGID, GUARD)
    assert bpf_run(prog, NR["getpid"], arch=0x40000003) == EPERM  # i386
    if MACHINE == "x86_64":
        assert bpf_run(prog, NR["getpid"] | 0x40000000) == EPERM  # x32


@pytest.mark.skipif(not NR, reason=f"no filter for {MACHINE}")
@pytest.mark.parametrize("what", [H, H | DENY, H | PROXY])
def test_a_call_is_decided_in_a_few_instructions(what):
    # The kernel emulates the filter for every system call number when it
    # is loaded (and each call the program makes runs it): a binary search
    # over the numbers, not a chain of ~70 comparisons (load 130 -> 64 us).
    prog = _core.seccomp_program(what, CALLER, PGID, GUARD)
    for nr in range(512):
        assert bpf_trace(prog, nr)[1] <= 20, nr


def test_every_program_fits_and_resolves():
    for what in range(1, 32):
        if what == SIG:  # asks for nothing of its own
            continue
        prog = _core.seccomp_program(what, CALLER, PGID, GUARD)
        assert 0 < len(prog) // 8 <= 256


@pytest.mark.skipif(not NR, reason=f"no filter for {MACHINE}")
def test_without_a_guard_only_the_caller_is_kept_out_of_reach():
    # No sentinel (no cgroup made yet): 0 must not refuse kill(0), the
    # program's own group.
    prog = _core.seccomp_program(H, CALLER, PGID)
    assert bpf_run(prog, NR["kill"], (0, 15)) == ALLOW
    assert bpf_run(prog, NR["kill"], (GUARD, 9)) == ALLOW
    assert bpf_run(prog, NR["kill"], (CALLER, 9)) == EPERM
