"""Private workspaces: a 0700 directory per sandbox, its cwd and TMPDIR,
and the planners of ``workspace``.

Named ``sbxlimit-<sandbox id>-*`` in the temp directory, and made under
the owner lock this process holds there (``_owner``), so that the next
process's supervisor (and ``sbxlimit gc``) finds and removes what a
crashed or killed one left, whatever PID namespace it ran in.  What the
program writes there stays readable by the caller until the sandbox is
closed (the end of its ``with`` block, or ``Popen.close()``); then it is
removed (``_fstree``: however deep the program made it), unless
``Policy(keep_workdir=True)``.  ``disk`` is held by a size-capped tmpfs
over it in the sandbox's own mount namespace where one can be made
(``_namespaces``), else by sampling its size.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Iterable

from . import _fstree, _owner
from ._exit import WORKSPACES, at_exit
from ._once import Once
from ._place import Place, here
from ._plan import Plan, Request
from ._protected import TTL

__all__ = [
    "FinalSize",
    "Pool",
    "adopt",
    "bare",
    "create",
    "discard",
    "forget",
    "plan_workdir",
    "plan_workspace",
    "remove",
    "size",
    "slow_directories",
    "tmpfs_usage",
]

_live: set[str] = set()
_lock = threading.Lock()


def plan_workspace(p: Plan, r: Request) -> None:
    """Policy(workdir=None): a private workspace, removed at close unless
    kept."""
    if r.policy is None or r.policy.workdir is not None:
        return
    p.workspace = True
    p.keep_workspace = r.policy.keep_workdir
    p.hold(
        "workspace", "supervisor:workspace", "private 0700 directory: TMPDIR, and cwd unless given"
    )


def plan_workdir(p: Plan, r: Request) -> None:
    """Policy(workdir=path): used as given."""
    if r.policy is None or r.policy.workdir is None:
        return
    p.hold("workspace", "supervisor:workdir", "used as given, not removed")


# The directories workspaces are made in, resolved (as the protected
# paths' resolution, for _protected.TTL, per place: _place): a workspace's
# own name needs none.
_real_dirs: dict[tuple[str, Place], tuple[float, str]] = {}


def real_path(workspace: str, place: Place = None) -> str:
    """A workspace made for a sandbox, resolved: a directory of ours, new,
    so only the directory it was made in may be reached through a link.
    `place`: where the caller resolves paths (_place.here(), asked if
    None)."""
    parent, name = os.path.split(workspace)
    key = (parent, place if place is not None else here())
    now = time.monotonic()
    hit = _real_dirs.get(key)
    if hit is None or now - hit[0] >= TTL:
        hit = (now, os.path.realpath(parent))
        if len(_real_dirs) > 16:
            _real_dirs.clear()
        _real_dirs[key] = hit
    return os.path.join(hit[1], name)


def create(sandbox_id: str, *, keep: bool = False, dir: str | None = None) -> str:
    """Make the workspace and its tmp/; returns its path.  One to `keep` is
    not removed at interpreter exit, closed or not, and its name is not one
    ``sbxlimit gc`` takes for a crashed supervisor's leftover."""
    kind = "kept-" if keep else ""
    if dir is None:
        dir = tempfile.gettempdir()
    if not keep:
        _owner.hold(dir, _owner.WORKSPACE_PREFIX)  # before its name is ours (once)
    path = tempfile.mkdtemp(prefix=f"sbxlimit-{kind}{sandbox_id}-", dir=dir)  # mode 0700
    os.mkdir(os.path.join(path, "tmp"), 0o700)
    if not keep:
        with _lock:
            _live.add(path)
    return path


def slow_directories(path: str) -> str:
    """Why directories made under `path` cost more the more were removed
    there lately, or "" (none known).

    ext4 without a journal keeps an inode freed in the last minute (six,
    while its table's block is still dirty) from being given again, in
    case the freeing never reached the disk; each new inode's search skips
    every such one in its group.  Every sandbox with a workspace frees two,
    so at a high spawn rate each new workspace passes thousands of them."""
    try:
        dev = os.stat(path).st_dev
        link = os.readlink(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
        # ext4's own files for the device: journal_task is "<none>" without a journal.
        with open(f"/sys/fs/ext4/{os.path.basename(link)}/journal_task") as f:
            journal = f.read().strip()
    except (OSError, ValueError):
        return ""
    if journal != "<none>":
        return ""
    return (
        "ext4 without a journal: a directory made here skips every inode freed in the "
        "last minutes, so at a high spawn rate each private workspace takes some "
        "0.1-0.3 ms more to make"
    )


# -- made ahead of need ----------------------------------------------------

POOL_SIZE = 2  # ready workspaces
POOL_IDLE = 10.0  # seconds without a taker before they go
# Never a sandbox id (those count from 1): the name `sbxlimit gc` reads the
# owner from while a workspace waits for a sandbox.
_READY_ID = "0"


class Pool:
    """Private workspaces made ahead by the supervisor thread: a mkdtemp and
    a mkdir are two inode creations on the caller's file system (45 us warm,
    some 180 us after a pause here); taking a ready one is a rename to the
    sandbox's name.  Thread-safe; the supervisor calls :meth:`work`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Held while one is made: drain() waits for it, so that none it
        # leaves is made after (the lock above is not held across the mkdirs).
        self._busy = threading.Lock()
        self._ready: list[tuple[str, str]] = []  # (temp dir, path)
        self._used = -1.0  # last take (monotonic); < 0: none asked
        self._closed = False

    def take(self, sandbox_id: str) -> str | None:
        """A ready workspace renamed for `sandbox_id`, or None (then the
        caller makes its own); either way some are kept ready from now on."""
        tmp = tempfile.gettempdir()
        with self._lock:
            if self._closed:
                return None
            self._used = time.monotonic()
            i = next((i for i, (d, _p) in enumerate(self._ready) if d == tmp), -1)
            if i < 0:
                return None
            _d, ready = self._ready.pop(i)
        # sbxlimit-<pid>-0-XXXX -> sbxlimit-<id>-XXXX: the random part stays.
        suffix = os.path.basename(ready).split("-", 3)[3]
        path = os.path.join(tmp, f"sbxlimit-{sandbox_id}-{suffix}")
        try:
            os.rename(ready, path)  # never over an existing name: the suffix is mkdtemp's
        except OSError:
            remove(ready)
            return None
        with _lock:
            _live.discard(ready)
            _live.add(path)
        return path

    def has_ready(self) -> bool:
        with self._lock:
            return bool(self._ready)

    def wanted(self) -> bool:
        with self._lock:
            return self._used >= 0 and not self._closed and len(self._ready) < POOL_SIZE

    def next_expiry(self) -> float | None:
        with self._lock:
            return self._used + POOL_IDLE if self._used >= 0 else None

    def work(self, now: float) -> None:
        """Supervisor thread: remove what went unused, make one if missing."""
        with self._busy:
            self._work(now)

    def _work(self, now: float) -> None:
        with self._lock:
            gone: list[tuple[str, str]] = []
            if self._used >= 0 and now - self._used > POOL_IDLE:
                gone, self._ready, self._used = self._ready, [], -1.0
            make = self._used >= 0 and not self._closed and len(self._ready) < POOL_SIZE
        for _d, path in gone:
            remove(path)
        if not make:
            return
        tmp = tempfile.gettempdir()
        try:
            path = create(f"{os.getpid():x}-{_READY_ID}", dir=tmp)
        except OSError:
            return  # spawns make their own, and say what failed
        with self._lock:
            if not self._closed and self._used >= 0:
                self._ready.append((tmp, path))
                return
        remove(path)

    def drain(self, *, close: bool = False) -> None:
        """Remove every ready workspace; `close`: and make no more (exit)."""
        with self._busy:
            with self._lock:
                self._closed = self._closed or close
                gone, self._ready, self._used = self._ready, [], -1.0
            for _d, path in gone:
                remove(path)


def adopt(path: str) -> str | None:
    """A dead owner's workspace renamed as this process's trash: ours to
    remove, now or at our exit, and ours to leave to the next collector if
    we crash too.  None if it could not be renamed."""
    tmp, name = os.path.split(path)
    parts = name.split("-", 3)  # sbxlimit, owner pid, id, mkdtemp's suffix
    if len(parts) < 4:
        return None
    _owner.hold(tmp, _owner.WORKSPACE_PREFIX)
    suffix = parts[3].removesuffix(TRASH_SUFFIX)
    # Id 0 with the trash suffix: never a live workspace's name.
    trash = os.path.join(tmp, f"sbxlimit-{os.getpid():x}-{_READY_ID}-{suffix}{TRASH_SUFFIX}")
    try:
        os.rename(path, trash)
    except OSError:
        return None
    with _lock:
        _live.add(trash)
    return trash


def forget(path: str) -> None:
    """Kept on purpose (keep_workdir): not removed at exit either."""
    with _lock:
        _live.discard(path)


def remove(path: str) -> bool:
    """Remove a workspace and everything in it (never following links out):
    True if it is gone.  Until it is, it is tried again at exit (where a
    removal still under way on another thread could be cut short)."""
    if _fstree.usable:
        gone = _fstree.remove_tree(path)
    else:  # Windows: no *at calls (and no links a program can make unasked)

        def onerror(func: object, p: str, exc: object) -> None:
            # A read-only file or directory the program left: once more.
            try:
                os.chmod(p, stat.S_IRWXU)
                shutil.rmtree(p, ignore_errors=True)
            except OSError:
                pass

        shutil.rmtree(path, onerror=onerror)
        gone = not os.path.lexists(path)
    with _lock:
        if gone:
            _live.discard(path)
        else:
            _live.add(path)
    return gone


# A discarded workspace's name until it is gone: still one `sbxlimit gc`
# takes for its owner's (sbxlimit-<id>-...), never one create() makes.
TRASH_SUFFIX = ".removing"


def discard(path: str, final_size: FinalSize | None = None) -> str | None:
    """Take a workspace away from its path at once, for removal later
    (off the caller's path: a tree's rmdirs took 50-150 us each on the
    test machine, whose ext4 has no journal and discards each freed block
    before rmdir returns, the parent directory locked; a rename 3 us).
    Returns what to remove, or None when it was removed here (the rename
    failed).  `final_size` follows it (or is measured first)."""
    trash = path + TRASH_SUFFIX
    # A measure under way ends first; one after follows the rename.
    with final_size.lock if final_size is not None else contextlib.nullcontext():
        try:
            os.rename(path, trash)
        except OSError:
            if final_size is not None:
                final_size.get()
            remove(path)
            return None
        if final_size is not None:
            final_size.path = trash
    with _lock:
        _live.discard(path)
        _outliving.discard(path)  # closed: its program is done
        _live.add(trash)  # still removed at exit if the supervisor is not done
    return trash


class FinalSize(Once[int]):
    """A workspace's size when its program ended, measured once: when
    someone asks, or by the supervisor right before it removes the
    workspace (off the caller's path).  It follows the workspace to the
    trash (discard)."""

    __slots__ = ("path",)

    def __init__(self, path: str) -> None:
        super().__init__(self._measure)
        self.path = path

    def _measure(self) -> int:
        return size(self.path)


def bare(path: str) -> bool:
    """Nothing in it but its empty tmp/ (the usual workspace at the end)."""
    try:
        with os.scandir(path) as it:
            if [e.name for e in it] != ["tmp"]:
                return False
        with os.scandir(os.path.join(path, "tmp")) as it:
            return next(it, None) is None
    except OSError:
        return False


def size(path: str) -> int:
    """Bytes allocated under path (hard links once; links not followed;
    however deep the program made it: see _fstree)."""
    return _fstree.tree_size(path)


# size(path), measured a part at a time: run(deadline) until it gives the
# size (the sizer's; see _fstree.TreeSize).
Sizing = _fstree.TreeSize


def tmpfs_usage(fd: int) -> tuple[int, bool]:
    """(bytes used, full) of the size-capped tmpfs whose root is `fd`."""
    st = os.fstatvfs(fd)
    return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_bfree == 0


def _forget_after_fork() -> None:
    # A forked child (multiprocessing's workers, say) owns none of its
    # parent's workspaces: its exit must not remove them.
    global _lock
    _live.clear()
    _outliving.clear()
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


# Workspaces of sandboxes meant to outlive this process (die_with_parent=
# False): left at exit while a process works there.  The others' programs
# die with us (the parent-death signal) or were ended before.
_outliving: set[str] = set()


def outlives(path: str) -> None:
    """The workspace `path` is a sandbox's that may outlive this process."""
    with _lock:
        _outliving.add(path)


def in_use(paths: Iterable[str]) -> set[str]:
    """Those of `paths` (workspaces) where a process still works: its
    working directory there or below (a sandbox meant to outlive its
    caller, `die_with_parent=False`).  Linux (/proc); elsewhere none."""
    wanted = {p.rstrip("/") for p in paths}
    busy: set[str] = set()
    if not wanted:
        return busy
    try:
        pids = [n for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return busy
    for pid in pids:
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue  # gone, or not ours to look at
        for p in wanted:
            if cwd == p or cwd.startswith(p + "/"):
                busy.add(p)
    return busy


@at_exit(WORKSPACES)
def _remove_left() -> None:
    # Sandboxes never closed: their workspaces go with the interpreter, but
    # those a program still works in (one meant to outlive us: removing its
    # files under it, as long as it makes more, held our exit); then our
    # owner locks, where nothing of ours is left.
    left = list(_live)
    busy = in_use(p for p in left if p in _outliving)
    for path in left:
        if path.rstrip("/") not in busy:
            remove(path)
    _owner.release_all(_owner.WORKSPACE_PREFIX)
