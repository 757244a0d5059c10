"""Linux namespaces for one sandbox: the ``ns`` argument of ``_core.spawn``,
the read-only view's entries, and the size-capped workspace's hand-back.

The child makes the namespaces (csrc/linux/namespaces.c); this module only
prepares what it needs in the parent.  A tmpfs mounted in the child's own
mount namespace is invisible from the caller's, and it would vanish with
the namespace: the child sends an fd of its root over a datagram socket,
and the parent keeps it, so the workspace stays readable (through
``/proc/<pid>/fd/<n>``) until the sandbox is closed.
"""

from __future__ import annotations

import array
import os
import shutil
import socket
import warnings
from collections.abc import Iterable

from . import _core
from ._enforce import CLONE_NEWNET, CLONE_NEWPID, CLONE_NEWUSER, Plan
from ._landlock import writable_rights
from ._policy import Policy
from ._protected import within

__all__ = ["REAPER", "Spawn", "copy_out", "fd_path", "view"]

View = list[tuple[int, bytes, bytes]]


def _reaper() -> bytes:
    """The reaper program PID 1 execs (csrc/linux/pid1.c, built beside the
    core), if it can be run; else b"": PID 1 is fork()ed instead, which
    costs a copy of this process's page tables."""
    path = os.path.join(os.path.dirname(os.path.abspath(_core.__file__)), "_pid1")
    return os.fsencode(path) if os.access(path, os.X_OK) else b""


# Read by tests, which turn it off to try the fork()ed PID 1.
REAPER = _reaper()


def view(
    policy: Policy, workspace: str | None, shm_size: int | None, protected: Iterable[str] = ()
) -> tuple[View, bool, bool]:
    """The read-only view's entries for `policy` (csrc/sbx.h, struct
    sbx_view); whether "/" becomes read-only (not when it is a writable root
    itself); whether /dev is one of the sandbox's own (not when a writable
    root holds it).  Paths are resolved here: the child follows no link."""
    real = os.path.realpath
    roots = [workspace] if workspace else []
    roots += policy.writable_roots
    rw = sorted({real(r) for r in roots}, key=lambda r: (r.count("/"), r))
    ro_root = "/" not in rw
    own_dev = not any(within("/dev", r) for r in rw)
    out: View = []
    for r in rw:
        if r != "/":
            kind = _core.VIEW_RW_DEV if within("/dev", r) else _core.VIEW_RW
            out.append((kind, os.fsencode(r), b""))
    if own_dev or os.path.isdir("/dev/shm"):
        # A private one: the host's is read-only in the view, and shared
        # memory of other processes is none of the sandbox's business.
        size = f",size={shm_size}" if shm_size else ""
        out.append((_core.VIEW_TMPFS, b"/dev/shm", f"mode=1777{size}".encode()))
    read_only: dict[str, str] = {}  # path -> what is bound over it
    for x in [*policy.deny_write, *protected]:
        target = real(x)
        if os.path.islink(x) and os.path.isfile(target):
            # The program could replace the link with a file of its own:
            # the target is bound over the link itself (a mount point cannot
            # be unlinked or renamed over).  A directory cannot be mounted
            # over a link: _protected.replaceable_links says so.
            read_only.setdefault(_link_path(x), target)
        read_only.setdefault(target, target)
    for path, source in read_only.items():
        # Outside the writable trees the view is read-only already.
        if any(within(path, r) for r in rw) and os.path.lexists(path):
            data = b"" if source == path else os.fsencode(source)
            out.append((_core.VIEW_RO, os.fsencode(path), data))
    for path in dict.fromkeys(real(x) for x in policy.deny_read):
        if os.path.isdir(path):
            out.append((_core.VIEW_HIDE_DIR, os.fsencode(path), b""))
        elif os.path.lexists(path):
            out.append((_core.VIEW_HIDE, os.fsencode(path), b""))
    return out, ro_root, own_dev


def _link_path(path: str) -> str:
    """A link as itself: its directory resolved, its own name kept."""
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


class Spawn:
    """The ``ns`` tuple for ``_core.spawn``, and the socket the workspace's
    fd comes back on.  ``close()`` releases what the parent holds."""

    __slots__ = ("_recv", "args", "child_end", "status_r", "status_w")

    def __init__(
        self,
        plan: Plan,
        policy: Policy | None,
        workspace: str | None,
        uid: int | None,
        gid: int | None,
        shm_size: int | None = None,
        protected: Iterable[str] = (),
    ) -> None:
        flags = plan.ns_flags | (CLONE_NEWUSER if plan.user_ns else 0)
        uid_map = gid_map = b""
        if plan.user_ns:
            # An unprivileged user namespace may map only our own ids: the
            # program keeps its uid and gid, and gets no privilege outside.
            euid, egid = os.geteuid(), os.getegid()
            uid_map, gid_map = f"{euid} {euid} 1\n".encode(), f"{egid} {egid} 1\n".encode()
        tmpfs = opts = mkdir = b""
        self._recv: socket.socket | None = None
        self.child_end = -1
        if plan.disk_tmpfs and workspace is not None:
            owner_uid = os.geteuid() if uid is None else uid
            owner_gid = os.getegid() if gid is None else gid
            tmpfs = os.fsencode(workspace)
            opts = f"size={plan.tmpfs_size},mode=0700,uid={owner_uid},gid={owner_gid}".encode()
            mkdir = os.fsencode(os.path.join(workspace, "tmp"))
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._recv = parent
            self.child_end = child.detach()
        # PID 1 of a PID namespace writes the target's wait status here.
        self.status_r = self.status_w = -1
        if flags & CLONE_NEWPID:
            self.status_r, self.status_w = os.pipe2(os.O_CLOEXEC)
        loopback = bool(flags & CLONE_NEWNET)
        entries: View = []
        ro_root = own_dev = False
        if plan.ro_view and policy is not None:
            where = workspace or policy.workdir
            entries, ro_root, own_dev = view(policy, where, shm_size, protected)
        # Landlock skips the directory a mount hides: each tmpfs gets a rule
        # of its own in the child, with the rights the workspace has.
        ll = writable_rights(plan.landlock) if plan.landlock and (tmpfs or entries) else 0
        self.args = (
            flags,
            uid_map,
            gid_map,
            loopback,
            tmpfs,
            opts,
            mkdir,
            self.child_end,
            ll,
            entries,
            ro_root,
            own_dev,
            self.status_w,
            REAPER if flags & CLONE_NEWPID else b"",
        )

    def take_child_end(self) -> int:
        """The child's end, for the core to close after the spawn."""
        fd, self.child_end = self.child_end, -1
        return fd

    def take_status_ends(self) -> tuple[int, int]:
        """(read end, for the caller to read at reap; write end, for the
        core to close after the spawn)."""
        ends = (self.status_r, self.status_w)
        self.status_r = self.status_w = -1
        return ends

    def receive_fd(self) -> int | None:
        """The workspace's root fd the child sent (it did before execve)."""
        sock, self._recv = self._recv, None
        if sock is None:
            return None
        with sock:
            try:
                _msg, anc, _flags, _addr = sock.recvmsg(
                    1, socket.CMSG_SPACE(array.array("i").itemsize), socket.MSG_DONTWAIT
                )
            except BlockingIOError:
                return None
        fds = array.array("i")
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
        for extra in fds[1:]:
            os.close(extra)
        if not fds:
            return None
        os.set_inheritable(fds[0], False)
        return fds[0]

    def close(self) -> None:
        for fd in (self.status_r, self.status_w):
            if fd >= 0:
                os.close(fd)
        self.status_r = self.status_w = -1
        if self._recv is not None:
            self._recv.close()
            self._recv = None
        if self.child_end >= 0:
            os.close(self.child_end)
            self.child_end = -1


def fd_path(fd: int) -> str:
    """A path to what `fd` refers to, usable by this process (and its
    children) for as long as the fd is open."""
    return f"/proc/{os.getpid()}/fd/{fd}"


def copy_out(fd: int, dest: str) -> None:
    """Copy the tmpfs's contents into `dest` (keep_workdir: the directory
    outlives the sandbox, the tmpfs cannot).  What cannot be copied (a file
    the program made unreadable) is named in a RuntimeWarning; the rest is
    copied."""
    try:
        shutil.copytree(fd_path(fd), dest, symlinks=True, dirs_exist_ok=True)
    except shutil.Error as e:
        failed = [str(src).replace(fd_path(fd), "", 1) or "/" for src, _dst, _why in e.args[0]]
        warnings.warn(
            f"sbxlimit: keep_workdir: {len(failed)} entries of the tmpfs workspace could not be "
            f"copied to {dest}: {', '.join(failed[:5])}{' ...' if len(failed) > 5 else ''}",
            RuntimeWarning,
            stacklevel=3,
        )
