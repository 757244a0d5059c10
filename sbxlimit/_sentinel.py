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

* ``where <n> <json>``: the parents of a kind of cgroup (its site's version
  and directories), once per kind;
* ``made <name> <n>``: a sandbox cgroup made there;
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
import select
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
# it was imported from, after the standard library (a module of the same
# name in site-packages must not shadow it), and nothing of the
# environment's Python settings (-I).
_CODE = "import sys; sys.path.append(sys.argv[1]); from sbxlimit._sentinel import ended; ended()"

_lock = threading.Lock()
_owner = 0  # the pid the sentinel watches: a fork's child has none
_fd = -1  # our end of its pipe
_pid = 0  # the sentinel's
# This process's cgroups made and not gone (their "made" lines), and those
# kept: told to the sentinel, again after a reset, and all to a new one.
_live: dict[str, str] = {}
_kept: set[str] = set()
_said = 0  # lines since the last reset
_synced = True  # the sentinel has every line said since the last reset
_retry_at = 0.0  # when a resync that did not fit is tried again
_retry_timer: threading.Timer | None = None  # and, failing more lines, then
_grown = False  # the pipe made larger (at its first full write)
_pipe_id = (0, 0)  # our end's (st_dev, st_ino)
# Each kind's parents (site, controllers), numbered: "where <n> <json>".
_where: dict[tuple[int, tuple[str, ...]], tuple[int, str, Site]] = {}
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
    with _lock:
        where = _where.get(key)
        if where is None:  # the site's parents, said once per kind
            parents = [[c, os.path.dirname(p)] for c, p in cg.dirs.items()]
            # (The site is kept with it: its id() is never another's.)
            where = _where[key] = (len(_where), json.dumps([cg.site.version, parents]), cg.site)
            if _owner == os.getpid():
                _tell(f"where {where[0]} {where[1]}")
        line = f"made {cg.name} {where[0]}"
        _live[cg.name] = line
        if _owner == os.getpid():
            _tell(line)


def gone(name: str) -> None:
    """The cgroup `name` was removed."""
    with _lock:
        if _live.pop(name, None) is not None:
            _kept.discard(name)
            if _owner == os.getpid():
                _tell(f"gone {name}")


def keep(name: str) -> None:
    """The sandbox cgroup `name` is to outlive this process."""
    with _lock:
        _kept.add(name)
        if _owner == os.getpid():
            _tell(f"keep {name}")


def _tell(line: str) -> None:
    """(_lock held.)  One line to the sentinel; the whole state instead when
    it missed one (a full pipe), and when the lines outnumber what is live
    (so that it holds no more than that)."""
    global _said
    if _synced and _write([line]):
        _said += 1
        if _said > 2 * (len(_live) + len(_kept)) + _RESET_SLACK:
            _resync()
    elif time.monotonic() >= _retry_at:  # the sentinel reads once a second
        _resync()


def _resync() -> None:
    """(_lock held.)  The whole state, between "reset" and "end": the
    sentinel applies it once the end has come, so that one cut short by a
    full pipe leaves it the state it had (and this one says it again at
    the next line)."""
    global _synced, _said, _retry_at
    wheres = [f"where {n} {j}" for n, j, _s in _where.values()]
    lines = ["reset", f"owner {os.getpid():x}", *wheres, *_live.values()]
    _synced = _write([*lines, *(f"keep {n}" for n in sorted(_kept)), "end"])
    _said = 0
    _retry_at = 0.0 if _synced else time.monotonic() + 0.25
    if not _synced and _retry_timer is None and _owner == os.getpid():
        _retry_later()


def _retry_later() -> None:
    """(_lock held.)  Say the whole state again in a second, and so on until
    it fits: a caller that says nothing more (one long sandbox) must not
    leave the sentinel without its last lines."""
    global _retry_timer
    _retry_timer = threading.Timer(1.0, _retry)
    _retry_timer.daemon = True
    _retry_timer.start()


def _retry() -> None:
    global _retry_timer
    with _lock:
        _retry_timer = None
        if _owner == os.getpid() and not _synced:
            _resync()


def _write(lines: list[str]) -> bool:
    """(_lock held.)  Lines in chunks of at most PIPE_BUF bytes, which a
    pipe takes whole or not at all: never a line cut short.  False once
    one is not taken (the pipe is full: never waited for, a spawn must not
    wait on a sentinel someone stopped) or the sentinel is gone."""
    global _owner, _pid, _fd
    try:
        if _pipe_id != _ident(os.fstat(_fd)):
            # Closed behind our back (a closerange) and the number reused:
            # not ours to write to, nor to close.
            _owner, _pid, _fd = 0, 0, -1
            return False
        chunk = b""
        for line in lines:
            data = (line + "\n").encode()
            if chunk and len(chunk) + len(data) > select.PIPE_BUF:
                if _put(chunk) != len(chunk):
                    return False
                chunk = b""
            chunk += data
        return _put(chunk) == len(chunk)
    except BlockingIOError:
        return False
    except OSError:  # the sentinel is gone: a new one at the next announce
        os.close(_fd)
        _owner, _pid, _fd = 0, 0, -1
        return False


def _put(chunk: bytes) -> int:
    """(_lock held.)  One write; the first one that does not fit makes the
    pipe larger, once (1 MiB: some 50,000 lines, more than a second of
    them; not at the start, where each process's would count against its
    user's pipe budget) and is tried again."""
    global _grown
    try:
        return os.write(_fd, chunk)
    except BlockingIOError:
        if _grown:
            raise
        _grown = True
        import fcntl  # Linux only, as announce's callers

        try:
            fcntl.fcntl(_fd, fcntl.F_SETPIPE_SZ, 1 << 20)
        except OSError:
            raise BlockingIOError from None
        return os.write(_fd, chunk)


def _ident(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


def _start() -> None:
    """(_lock held.)  Start the sentinel and tell it all it needs to know."""
    global _owner, _fd, _pid, _refused, _pipe_id, _grown
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
    _fd, _pid, _owner, _grown = w, int(sentinel), os.getpid(), False
    _pipe_id = _ident(os.fstat(w))
    _resync()


def _package_parent() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
        if not _left(_live, _kept, {str(n): j for n, j, _s in _where.values()}):
            _write(["done"])
        if _owner == os.getpid():
            os.close(_fd)
        _owner, _fd = 0, -1


def _left(
    live: dict[str, str], kept: set[str], where: dict[str, str]
) -> list[tuple[int, list[tuple[str, str]]]]:
    """(version, directories) of the cgroups in `live` ("made" lines) that
    are not `kept` and still exist; `where`: each kind's parents (JSON)."""
    found = []
    for name, line in live.items():
        if name in kept:
            continue
        try:
            v, parents = json.loads(where[line.split(" ", 2)[2]])
            version = int(v)
            dirs = [(str(c), os.path.join(str(p), name)) for c, p in parents]
        except Exception:
            continue  # not a line the owner wrote whole
        dirs = [(c, d) for c, d in dirs if os.path.isdir(d)]
        if dirs:
            found.append((version, dirs))
    return found


def _forget_after_fork() -> None:
    """A fork's child is not the process the sentinel watches: it starts one
    of its own at its first sandbox cgroup.  (Its copy of the lock may be
    held: a new one.)"""
    global _owner, _fd, _pid, _lock, _retry_timer, _grown, _synced
    _lock = threading.Lock()
    _retry_timer, _grown, _synced = None, False, True
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

    owner, where, live, kept = _read_state(sys.stdin.read())
    if owner is None:
        return
    for version, dirs in _left(live, kept, where):
        try:
            cg = Cgroup(Site(version, tuple((c, os.path.dirname(p)) for c, p in dirs)), "")
            cg.dirs.update(dirs)
            cg.kill()
            # Its processes are gone once the kill returns; their parents
            # (or init) reap them: the directories go once the kernel lets
            # them.
            deadline = time.monotonic() + 5.0
            while not cg.remove() and time.monotonic() < deadline:
                time.sleep(0.01)
        except Exception:  # one that cannot be ended: the rest still are
            continue
    # The owner's locks, and its empty cgroups, where now free.
    parents: set[str] = set()
    for j in where.values():
        try:
            parents.update(str(p) for _c, p in json.loads(j)[1])
        except Exception:
            pass
    collect_cgroups(parents, locked_only=True)


def _read_state(text: str) -> tuple[str | None, dict[str, str], dict[str, str], set[str]]:
    """(owner, each kind's parents by number, its "made" lines by name, kept
    names) from what it said.  A "reset" block counts once its "end" came:
    one cut short (a full pipe) leaves the state before it.  A line that
    cannot be read is skipped."""
    owner: str | None = None
    State = tuple[dict[str, str], dict[str, str], set[str]]
    state: State = ({}, {}, set())
    before: State | None = None  # inside a block: the state before it
    for line in text.split("\n"):  # as the program splits them
        word, _, rest = line.partition(" ")
        where, live, kept = state
        if word == "reset":
            before = state if before is None else before
            state = ({}, {}, set())
        elif word == "end" and before is not None:
            before = None
        elif word == "owner" and owner is None:  # the first one
            owner = rest
        elif word == "where":
            n, _, j = rest.partition(" ")
            where[n] = j
        elif word == "made" and rest:
            live[rest.partition(" ")[0]] = line
        elif word == "gone":
            live.pop(rest, None)
            kept.discard(rest)
        elif word == "keep":
            kept.add(rest)
    if before is not None:  # a block cut short: it never was
        state = before
    return owner, *state
