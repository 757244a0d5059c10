"""macOS: put a sandbox under its policy's Seatbelt profile.

The profile is built by the C builder (csrc/darwin/seatbelt.c, through
``Policy.seatbelt_profile``).  A program is exec'd through
``sbxlimit/_seatbelt_exec`` (csrc/darwin/seatbelt_exec.c), which reads the
profile from an unlinked file, applies it (sandbox_init) and execs the
target; a forked callable applies it itself (``_core.seatbelt_apply``).
Either way the parent learns of a refusal (a profile macOS rejects, a
caller already under a sandbox) through a report pipe, never from an exit
status it could take for the program's.  Nothing here is macOS-only code:
the tests run the helper on Linux against a double of libsandbox.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Sequence
from typing import Any, NoReturn

from . import _core
from ._plan import Plan, Request
from ._policy import Policy

__all__ = ["HELPER", "Belt", "close_others", "plan_seatbelt", "proxy_env", "terminal_devices"]

HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_seatbelt_exec")
_EXIT_SETUP = 126  # what a child that reported a failure exits with
# Report pipes' write ends open in this process: a forked callable closes
# the ones of other spawns, whose parents wait for their EOF.
_writers: set[int] = set()


class Belt:
    """One sandbox's profile on its way into the child: the text, the
    report pipe, and for a program the unlinked file the helper reads."""

    def __init__(self, profile: str) -> None:
        self.profile = profile
        self.report_r, self.report_w = os.pipe()  # close-on-exec in the parent
        _writers.add(self.report_w)
        self.profile_fd = -1

    def exec_through(
        self, helper: str, exec_paths: Sequence[bytes], args: Sequence[Any]
    ) -> tuple[tuple[bytes, ...], list[Any], tuple[int, int]]:
        """(exec_paths, argv, fds to pass) that run `args` through the helper."""
        # The target as the parent resolved it (PATH order): the first
        # executable candidate, else the name for the helper's own search.
        target: Any = next(
            (c for c in exec_paths if os.path.isabs(c) and os.access(c, os.X_OK)), exec_paths[0]
        )
        # Unlinked at once: no name another sandbox could open or swap.
        fd, path = tempfile.mkstemp(prefix="sbxlimit-profile-")
        self.profile_fd = fd
        os.unlink(path)
        data = self.profile.encode()
        while data:
            data = data[os.write(fd, data) :]
        os.lseek(fd, 0, os.SEEK_SET)
        argv = ["sbxlimit-seatbelt", str(fd), str(self.report_w), target, *args]
        return (os.fsencode(helper),), argv, (fd, self.report_w)

    def started(self) -> tuple[str, int, str] | None:
        """In the parent, once the child exists: wait until the profile is in
        force (EOF), or return the failure (step, errno, message)."""
        self._close("profile_fd")
        self._close("report_w")
        chunks = []
        while True:
            try:
                chunk = os.read(self.report_r, 4096)
            except InterruptedError:  # pragma: no cover - PEP 475 retries
                continue
            if not chunk:
                break
            chunks.append(chunk)
        self.close()
        if not chunks:
            return None
        step, _, rest = b"".join(chunks).partition(b"\0")
        num, _, msg = rest.partition(b"\0")
        try:
            err = int(num)
        except ValueError:
            err = errno.EIO
        return step.decode(errors="replace"), err, msg.decode(errors="replace")

    def apply_here(self) -> None:
        """In a forked child: apply the profile, or report and exit; the body
        never runs unsandboxed."""
        self._close("report_r")
        apply = getattr(_core, "seatbelt_apply", None)  # the extension has it on macOS
        try:
            if apply is None:
                raise OSError(errno.ENOSYS, "no sandbox_init on this platform")
            apply(self.profile)
        except Exception as e:
            err = e.errno if isinstance(e, OSError) and e.errno else errno.EINVAL
            said = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            _report_and_exit(
                self.report_w, f"seatbelt:apply\0{err}\0{said}".encode(errors="replace")
            )
        self._close("report_w")

    def close(self) -> None:
        for name in ("report_r", "report_w", "profile_fd"):
            self._close(name)

    def _close(self, name: str) -> None:
        fd = getattr(self, name)
        if fd >= 0:
            setattr(self, name, -1)
            _writers.discard(fd)
            os.close(fd)


def close_others(mine: Belt | None) -> None:
    """In a forked child: close the report pipes of other spawns."""
    own = mine.report_w if mine is not None else -1
    for fd in list(_writers):
        if fd != own:
            _writers.discard(fd)
            try:
                os.close(fd)
            except OSError:
                pass


def _report_and_exit(fd: int, record: bytes) -> NoReturn:
    try:
        os.write(fd, record[:1024])
    finally:
        os._exit(_EXIT_SETUP)


def terminal_devices(fds: Sequence[int]) -> list[str]:
    """The terminal devices among `fds` (the child's stdio): what a sandbox
    that shares the caller's terminal may use."""
    out = []
    for fd in fds:
        try:
            if os.isatty(fd):
                out.append(os.ttyname(fd))
        except OSError:
            pass
    return sorted(set(out))


def proxy_env(policy: Policy, own_port: int = 0) -> dict[str, str]:
    """The proxy variables for network="proxy" (your first port, or
    sbxlimit's own proxy on `own_port`, which also speaks SOCKS5 with names
    resolved on its side), in both cases since tools read either.  None for
    allow_domains where nothing serves it (unenforced): the port would be
    whatever listens on the host's loopback."""
    if policy.network != "proxy":
        return {}
    if policy.allow_domains:
        if not own_port:
            return {}
        http, every = f"http://127.0.0.1:{own_port}", f"socks5h://127.0.0.1:{own_port}"
        env = {"HTTP_PROXY": http, "HTTPS_PROXY": http, "ALL_PROXY": every}
        env["NO_PROXY"] = "localhost,127.0.0.1,::1"  # the sandbox's own loopback
    elif policy.proxy_ports:
        url = f"http://127.0.0.1:{policy.proxy_ports[0]}"
        env = dict.fromkeys(("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"), url)
    else:
        return {}
    return {**env, **{n.lower(): v for n, v in env.items()}}


_SEATBELT = "seatbelt:sandbox_init"


def plan_seatbelt(p: Plan, r: Request) -> None:
    """macOS: one Seatbelt profile holds files, dotfiles, network and Unix
    sockets; it always limits writes (its workspace, writable_roots)."""
    policy = r.policy
    if policy is None:
        return
    asked = []
    if policy.writable_roots or policy.deny_read or policy.deny_write:
        asked.append("files")
    if policy.protect_dotfiles:
        asked.append("protect_dotfiles")
    if policy.network != "allow":
        asked.append("network")
    if not os.access(HELPER, os.X_OK):
        for field in asked or ["files"]:
            p.downgrade(field, f"{HELPER} is missing (sbxlimit was installed without it)")
        return
    p.seatbelt = True
    p.hold(
        "files",
        _SEATBELT,
        "writes: its workspace, writable_roots; other sandboxes' workspaces neither read nor "
        "written",
    )
    for field in asked:
        if field == "network" and policy.allow_domains:
            # Fail closed: the profile refuses every connection out.
            p.hold(
                field,
                _SEATBELT,
                "allow_domains needs sbxlimit's filtering proxy, which runs on Linux only so "
                "far: every connection out is refused, none of the names is reachable",
            )
        elif field != "files":
            p.hold(field, _SEATBELT)
    sockets = ", ".join(policy.unix_sockets) if policy.unix_sockets else "none"
    p.hold(
        "unix_sockets",
        _SEATBELT,
        "connects only to its workspace's sockets, the system's logging and name-resolution "
        f"sockets and unix_sockets: {sockets}",
    )
