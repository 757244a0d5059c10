"""The sentinel: what ends this process's sandboxes if this process is killed.

A sandbox with a cgroup and no PID namespace outlived a caller killed with
SIGKILL: its leader died of the parent-death signal, but what it had
started stayed in the cgroup, past ``wall_time``, and nothing ended it.
(With a PID namespace the kernel ends them with PID 1.)

So a process starts a small program of the package (``_sentinel``, see
csrc/linux/sentinel.c) at its first sandbox cgroup, once: in a session of
its own, not its child (it forks once: this process's ``waitpid(-1)``
never finds it), with a pidfd of this process and a pipe that this
process alone writes to:

* ``made <name> <json>``: a sandbox cgroup made (its version and parents);
* ``gone <name>``: removed;
* ``keep <name>``: meant to outlive this process (``die_with_parent=False``);
* ``reset``: what came before is void, the whole state follows (sent
  when the lines outnumber what is live: the program keeps what follows
  the last one, so it holds no more than this process's live cgroups);
* ``done``: it ends with nothing of its own left (written at exit).

The program waits in ``poll()`` for this process to be gone (a pidfd).
Without ``done`` by then, it runs :func:`ended` in a new interpreter, with
those lines as its input: every cgroup made and not gone, but those kept,
is killed (``cgroup.kill``, or the v1 kill loop that stops forks first)
and removed.  Only what this process said it made: a process with its pid
in another PID namespace may make sandboxes with the same names beside
them, and those are never touched.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import TYPE_CHECKING

from ._exit import WORKSPACES, at_exit

if TYPE_CHECKING:
    from ._cgroup import Cgroup, Site

__all__ = ["announce", "ended", "gone", "keep", "made"]

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sentinel")
# What the sentinel runs once this process is gone: this package, wherever
# it was imported from, and nothing of the environment's Python settings.
_CODE = "import sys; sys.path.insert(0, sys.argv[1]); from sbxlimit._sentinel import ended; ended()"

_lock = threading.Lock()
_owner = 0  # the pid the sentinel watches: a fork's child has none
_fd = -1  # our end of its pipe
_pid = 0  # the sentinel's
# This process's cgroups made and not gone (their "made" lines), and those
# kept: told to the sentinel, again after a reset, and all to a new one.
_live: dict[str, str] = {}
_kept: set[str] = set()
_said = 0  # lines since the last reset
_where: dict[tuple[int, tuple[str, ...]], str] = {}  # made()'s
_RESET_SLACK = 256
_refused = False  # no sentinel can run here (the program, the kernel)


def announce(site: Site) -> None:
    """A sandbox cgroup is about to be made at `site`: the sentinel runs from
    now on (started once).  One comparison once it runs."""
    if _owner != os.getpid():
        with _lock:
            if _owner != os.getpid():
                _start()


def made(cg: Cgroup) -> None:
    """`cg` was made, and is ours: the sentinel ends it should this process
    be killed."""
    key = (id(cg.site), tuple(cg.dirs))
    where = _where.get(key)
    if where is None:  # the site's parents, as JSON: once per kind
        parents = [[c, os.path.dirname(p)] for c, p in cg.dirs.items()]
        where = _where[key] = json.dumps([cg.site.version, parents])
    line = f"made {cg.name} {where}"
    with _lock:
        _live[cg.name] = line
        if _owner == os.getpid():
            _say(line)


def gone(name: str) -> None:
    """The cgroup `name` was removed."""
    with _lock:
        if _live.pop(name, None) is not None and _owner == os.getpid():
            _kept.discard(name)
            _say(f"gone {name}")
            if _said > 2 * (len(_live) + len(_kept)) + _RESET_SLACK:
                _say(_state(reset=True))


def keep(name: str) -> None:
    """The sandbox cgroup `name` is to outlive this process."""
    with _lock:
        _kept.add(name)
        if _owner == os.getpid():
            _say(f"keep {name}")


def _state(*, reset: bool) -> str:
    """(_lock held.)  All the sentinel needs to know, as lines."""
    lines = ["reset"] if reset else []
    lines += [f"owner {os.getpid():x}", *_live.values(), *(f"keep {n}" for n in sorted(_kept))]
    return "\n".join(lines)


def _start() -> None:
    """(_lock held.)  Start the sentinel and tell it all it needs to know."""
    global _owner, _fd, _pid, _refused
    if _refused:
        return
    if not os.access(PROGRAM, os.X_OK) or not hasattr(os, "pidfd_open"):
        _refused = True
        return
    r, w = os.pipe()
    said, say = os.pipe()
    pidfd = -1
    try:
        pidfd = os.pidfd_open(os.getpid())
        # posix_spawn: a vfork, whatever this process's size.  The program
        # forks once and says its pid: not our child, so that a waitpid(-1)
        # of this process never finds it.
        pid = os.posix_spawn(
            PROGRAM,
            [PROGRAM, sys.executable, _CODE, _package_parent()],
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, r, 0),
                (os.POSIX_SPAWN_DUP2, say, 1),
                (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_DUP2, pidfd, 3),
            ],
            setsid=True,  # a kill of our process group leaves it
        )
        os.close(say)
        say = -1
        try:
            os.waitpid(pid, 0)  # it exits once it forked
        except ChildProcessError:
            pass  # another thread's waitpid(-1) took it
        sentinel = os.read(said, 32)
    except OSError:
        sentinel = b""  # Linux < 5.3 (no pidfd), or no process to spare
    finally:
        for fd in (r, said, say, pidfd):
            if fd >= 0:
                os.close(fd)
    if not sentinel.isdigit():
        os.close(w)
        _refused = True
        return
    # Never blocks a spawn: a sentinel someone stopped loses what does not
    # fit in the pipe, not our time.
    os.set_blocking(w, False)
    _fd, _pid, _owner = w, int(sentinel), os.getpid()
    _say(_state(reset=False))


def _package_parent() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _say(text: str) -> None:
    """(_lock held.)  A line or more to the sentinel.  Should it be gone
    (killed), a new one is started at the next announce, told it all."""
    global _owner, _pid, _fd, _said
    data = (text + "\n").encode()
    try:
        while data:
            data = data[os.write(_fd, data) :]
    except BlockingIOError:
        pass
    except OSError:
        os.close(_fd)
        _owner, _pid, _fd = 0, 0, -1
    _said = 0 if text.startswith("reset") else _said + 1


def sentinel_pid() -> int | None:
    """The sentinel's pid in this process, if one runs (for tests)."""
    return _pid if _owner == os.getpid() else None


@at_exit(WORKSPACES)
def _done_at_exit() -> None:
    """(At exit, once the sandboxes and cgroups have been dealt with.)  Tell
    the sentinel it has nothing to do, unless something of ours is left:
    a sandbox that would not die in the exit's time goes with the
    sentinel's kill once we are gone."""
    global _fd, _owner
    with _lock:
        if _owner != os.getpid():
            return
        if not _left(_live, _kept):
            _say("done")
        if _owner == os.getpid():
            os.close(_fd)
        _owner, _fd = 0, -1


def _left(live: dict[str, str], kept: set[str]) -> list[tuple[int, list[tuple[str, str]]]]:
    """(version, directories) of the cgroups in `live` ("made" lines) that
    are not `kept` and still exist."""
    found = []
    for name, line in live.items():
        if name in kept:
            continue
        version, parents = json.loads(line.split(" ", 2)[2])
        dirs = [(str(c), os.path.join(str(p), name)) for c, p in parents]
        dirs = [(c, d) for c, d in dirs if os.path.isdir(d)]
        if dirs:
            found.append((int(version), dirs))
    return found


def _forget_after_fork() -> None:
    """A fork's child is not the process the sentinel watches: it starts one
    of its own at its first sandbox cgroup.  (Its copy of the lock may be
    held: a new one.)"""
    global _owner, _fd, _pid, _lock
    _lock = threading.Lock()
    if _fd >= 0:
        try:
            os.close(_fd)
        except OSError:
            pass
    _owner, _fd, _pid = 0, -1, 0
    _live.clear()
    _kept.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def ended() -> None:
    """(In the sentinel's interpreter, its owner gone.)  End and remove every
    sandbox cgroup the owner said it made and did not remove, but those it
    kept."""
    from ._cgroup import Cgroup, Site
    from ._gc import collect_cgroups

    owner = None
    live: dict[str, str] = {}
    kept: set[str] = set()
    for line in sys.stdin.read().splitlines():  # what follows the last reset
        word, _, rest = line.partition(" ")
        if word == "owner" and owner is None:  # its first line
            owner = rest
        elif word == "made":
            live[rest.partition(" ")[0]] = line
        elif word == "gone":
            live.pop(rest, None)
        elif word == "keep":
            kept.add(rest)
    if owner is None:
        return
    parents: set[str] = set()
    for version, dirs in _left(live, kept):
        cg = Cgroup(Site(version, tuple((c, os.path.dirname(p)) for c, p in dirs)), "")
        cg.dirs.update(dirs)
        parents.update(os.path.dirname(p) for _c, p in dirs)
        try:
            cg.kill()
        except OSError:
            pass
        # Its processes are gone once the kill returns; their parents (or
        # init) reap them: the directories go once the kernel lets them.
        deadline = time.monotonic() + 5.0
        while not cg.remove() and time.monotonic() < deadline:
            time.sleep(0.01)
    # The owner's locks there, and its empty cgroups, where now free.
    collect_cgroups(parents, locked_only=True)
