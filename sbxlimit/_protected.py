"""What ``protect_dotfiles`` protects: files a shell or git runs code from
later, outside the sandbox.

The dotfiles of HOME, and of every git repository under a writable root
(the workspace included): ``.git/hooks`` and ``.git/config`` (which can
name other hooks, filters and an fsmonitor), following a ``gitdir:`` file
(worktrees, submodules) to the directory git really uses.  Repositories are
found by a bounded search: at most ``MAX_DEPTH`` directories below each
root, ``MAX_DIRS`` directories listed in all, not descending into a
repository's own ``.git``, into directories that hold packages rather
than projects (``node_modules``, virtualenvs, caches), nor into /proc,
/sys, /dev and /run.  Past the bound the search stops: the repositories it
did not reach are not protected, and ``enforced`` says so
(``Found.complete``).

Paths are returned whether or not they exist; the mechanisms decide what
they can hold (docs/SECURITY.md): a bind mount needs the path to exist,
Landlock carving needs it too.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable

from . import _core, _platform
from ._place import Place, here
from ._policy import DOTFILES, DOTFILES_DARWIN

__all__ = [
    "MAX_DEPTH",
    "MAX_DIRS",
    "TTL",
    "Found",
    "dotfiles",
    "drop_listings",
    "missing_dotfiles",
    "protected",
    "replaceable_links",
    "within",
]

DARWIN = _platform.DARWIN

MAX_DEPTH = 4
MAX_DIRS = 2000
# Directories that hold installed packages or caches, not repositories the
# user commits in.
_SKIP = frozenset(
    {
        ".git",
        "node_modules",
        "__pycache__",
        ".venv",
        "venv",
        "site-packages",
        ".tox",
        ".nox",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".cache",
    }
)


_PSEUDO = frozenset({"/proc", "/sys", "/dev", "/run"})  # never a repository


def _ours() -> str:
    """The names _workspace gives this process's workspaces (made ahead,
    taken, being removed), never searched: each is a sandbox's for a while,
    then removed, and no one runs git there after (a kept one is named
    ``sbxlimit-kept-*`` and searched).  Made and removed at every spawn of
    a sandbox of theirs, they would end every listing of their parent."""
    return f"sbxlimit-{os.getpid():x}-"


_OURS = _ours()  # made again in a forked child (_forget_after_fork)


@dataclasses.dataclass(frozen=True, slots=True)
class Found:
    # Protected paths (absolute, resolved), and each symbolic link on the
    # way to one of HOME's dotfiles as itself (its directory resolved):
    # the link is protected from being replaced, its target from writes.
    paths: tuple[str, ...]
    complete: bool = True  # False: the search stopped at its bound


def _git_dirs(git: str, watch: _Watching | None = None) -> list[str]:
    """The directories git uses for the repository whose ``.git`` is `git`:
    itself, or what a ``gitdir:`` file names and that one's common dir
    (`watch`: each file watched before it is read)."""
    if os.path.isdir(git):
        return [git]
    if watch is not None:
        watch.files([git])
    line = _first_line(git)
    if line is None or not line.startswith("gitdir:"):
        return []
    target = os.path.join(os.path.dirname(git), line[len("gitdir:") :].strip())
    out = [os.path.realpath(target)]
    commondir = os.path.join(out[0], "commondir")
    if watch is not None:
        watch.dirs([out[0]], top=True)  # a commondir made later
        watch.files([commondir])
    common = _first_line(commondir)
    if common is not None:
        out.append(os.path.realpath(os.path.join(out[0], common)))
    return out


_O_PATH = getattr(os, "O_PATH", 0)


def _first_line(path: str) -> str | None:
    """The first line of `path` if it is a regular file (a link followed),
    else None.  A sandbox may have put a FIFO, or a link to a device, where
    a ``.git`` file is looked for: opening a FIFO blocks the caller for
    good, opening a device (as root) runs its driver."""
    try:
        fd = _open_regular(path)
        if fd < 0:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
        return data.split(b"\n", 1)[0].decode().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _open_regular(path: str) -> int:
    """`path` opened for reading if it is a regular file, else -1.  Pinned
    first without being opened (O_PATH), then opened through the pin: the
    inode checked is the inode read.  Without O_PATH or /proc, checked by
    name first: a swap in between opens a device's driver, but never waits
    (O_NONBLOCK), and is not read."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
    if _O_PATH:
        pin = os.open(path, _O_PATH | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(pin).st_mode):
                return -1
            try:
                return os.open(f"/proc/self/fd/{pin}", flags)
            except FileNotFoundError:
                pass  # no /proc here
        finally:
            os.close(pin)
    if not stat.S_ISREG(os.stat(path).st_mode):
        return -1
    return os.open(path, flags)


def _repo_paths(git: str, watch: _Watching | None = None) -> list[str]:
    out = []
    for d in _git_dirs(git, watch):
        out += [os.path.join(d, "hooks"), os.path.join(d, "config")]
        out.append(os.path.join(d, "config.worktree"))
    return out


def _search(root: str, budget: list[int], watch: _Watching | None = None) -> tuple[list[str], bool]:
    """Repositories' protected paths under root (breadth first); `watch`:
    each directory watched before it is listed."""
    out: list[str] = []
    level = [root]
    ours = _OURS
    for depth in range(MAX_DEPTH + 1):
        if watch is not None:
            watch.dirs(level[: max(budget[0], 0)], top=depth == 0)
        nxt = []
        for d in level:
            if budget[0] <= 0:
                return out, False
            budget[0] -= 1
            try:
                with os.scandir(d) as it:
                    entries = list(it)
            except OSError:
                continue
            for e in entries:
                if e.name == ".git":
                    out += _repo_paths(e.path, watch)
                elif (
                    depth < MAX_DEPTH
                    and e.name not in _SKIP
                    and e.path not in _PSEUDO
                    and not e.name.startswith(ours)
                ):
                    try:
                        if e.is_dir(follow_symlinks=False):
                            nxt.append(e.path)
                    except OSError:
                        continue
        level = nxt
    return out, True


class _Watching:
    """The watches of one search: exact while every one was had on a
    filesystem whose every change this kernel sees.  On a network
    filesystem the watches still see what this machine changes (the
    caller's own `git init`); what another client changes, only the TTL
    bounds."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.complete = True  # every watch was had
        self.remote = False  # one is on a network filesystem
        self.wds: set[int] = set()
        # What a network filesystem's paths looked like when watched: some
        # (User-Mode Linux's hostfs) report no change at all, even this
        # machine's.
        self.stamps: list[tuple[str, _Stamp]] = []
        self.added = 0

    @property
    def exact(self) -> bool:
        return self.complete and not self.remote

    def dirs(self, paths: list[str], *, top: bool = False) -> None:
        # Below the top, a directory gone (or not one) is no loss: its
        # parent's watch sees it come back.
        self._add(paths, True, () if top else (errno.ENOENT, errno.ENOTDIR))

    def files(self, paths: list[str]) -> None:
        # A file not there: its directory's watch sees it made.
        self._add(paths, False, (errno.ENOENT, errno.ENOTDIR))

    def _add(self, paths: list[str], dirs: bool, harmless: tuple[int, ...]) -> None:
        if not paths or not self.complete:
            return
        self.added += len(paths)
        for path, wd in zip(paths, _core.watch_add(self.fd, paths, dirs), strict=True):
            if wd >= 0:
                if wd & _core.WATCH_REMOTE:
                    self.remote = True  # another client's changes: the TTL too
                    self.stamps.append((path, _stamp(path)))
                self.wds.add(wd & ~_core.WATCH_REMOTE)
            elif -wd not in harmless:
                self.complete = False  # the watch limit: the TTL only


# A path's identity and last change: a directory that gains or loses an
# entry gets a new mtime (and, for a subdirectory, link count).
_Stamp = tuple[int, int, int, int] | None


def _stamp(path: str) -> _Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_nlink)


_Kept = tuple[float, list[str], bool, frozenset[int], tuple[tuple[str, _Stamp], ...]]


class _Listings:
    """The search's listing (what a walk of up to MAX_DIRS directories
    finds: 30-40 ms for a large tree, the bulk of a policy spawn after a
    pause), kept for as long as nothing it depends on changed: every
    directory it listed and every gitdir file it read is watched
    (inotify), and the queue is drained before a listing is reused (the
    kernel queues an event within the system call that made the change,
    so no change made before the spawn is missed).  Only a change that
    can alter the listing counts (a subdirectory, a .git or a commondir
    made, removed or renamed; a gitdir file written), and only for the
    listings that watch where it happened: files written in the tree do
    not.  Without inotify or past the watch limit, the listing is kept
    for TTL, as the rest.  On a network filesystem, for TTL and only while
    no watch reported a change and every directory it listed and file it
    read has the same modification time, which a change this machine
    makes updates at once (another client's is seen when the filesystem
    shows it)."""

    _RESET = 8 * MAX_DIRS  # watches added before the fd is made anew

    def __init__(self) -> None:
        self.fd = -1
        self.added = 0
        # roots -> (made: 0 while watched, else when; found; complete;
        # watches; stamps of what a network filesystem holds)
        self.kept: dict[tuple[str, ...], _Kept] = {}
        # What changed while a search was under way, for it to see at its end.
        self.log: list[frozenset[int]] = []
        self.searching = 0

    def get(self, roots: tuple[str, ...]) -> tuple[list[str], bool] | None:
        with _lock:
            hit = self._current(roots)
            return None if hit is None else (hit[1], hit[2])

    def current(self, roots: tuple[str, ...]) -> bool:
        """The listing of `roots` is kept: watched, nothing it depends on
        changed since it was made; or, not wholly watched, made less than
        TTL ago (and on a network filesystem, nothing it stamped changed)."""
        with _lock:
            return self._current(roots) is not None

    def _current(self, roots: tuple[str, ...]) -> _Kept | None:
        # (_lock held.)
        if roots not in self.kept:
            return None
        self._drain()
        hit = self.kept.get(roots)
        if hit is None or not hit[0]:
            return hit
        if time.monotonic() - hit[0] >= TTL or any(_stamp(p) != st for p, st in hit[4]):
            del self.kept[roots]
            return None
        return hit

    def _drain(self) -> None:
        if self.fd < 0:
            return
        try:
            changed = frozenset(_core.watch_changed(self.fd, _skip_list))
        except OSError:
            changed = frozenset({-1})
        if not changed:
            return
        for roots, (_made, _found, _complete, wds, _stamps) in list(self.kept.items()):
            if -1 in changed or wds & changed:
                del self.kept[roots]
        if self.searching:
            self.log.append(changed)

    def search(self, roots: tuple[str, ...]) -> tuple[list[str], bool]:
        with _lock:
            if self.fd < 0 and _WATCH:
                try:
                    self.fd = _core.watch_open()
                except OSError:
                    pass
            fd, start = self.fd, len(self.log)
            self.searching += 1
        watch = _Watching(fd) if fd >= 0 else None
        out: list[str] = []
        budget = [MAX_DIRS]
        complete = True
        try:
            for root in roots:
                found, done = _search(root, budget, watch)
                out += found
                complete = complete and done
        finally:
            with _lock:
                self.searching -= 1
                if fd == self.fd:  # else made anew meanwhile: keep nothing
                    self._keep(roots, watch, start, out, complete)
                if not self.searching:
                    self.log.clear()
        return out, complete

    def _keep(
        self,
        roots: tuple[str, ...],
        watch: _Watching | None,
        start: int,
        out: list[str],
        complete: bool,
    ) -> None:
        self._drain()
        wds = frozenset(watch.wds) if watch is not None else frozenset()
        stamps = tuple(watch.stamps) if watch is not None else ()
        if any(-1 in c or c & wds for c in self.log[start:]):
            return  # a change where it listed, while it listed: not kept
        exact = watch is not None and watch.exact
        if len(self.kept) >= 64:
            self.kept.clear()
        self.kept[roots] = (0.0 if exact else time.monotonic(), out, complete, wds, stamps)
        self.added += watch.added if watch is not None else 0
        if self.added > self._RESET:
            os.close(self.fd)
            self.fd, self.added = -1, 0
            self.kept.clear()

    def forget(self) -> None:
        """Drop every listing and the watches (Monitor.drain: nothing kept
        is left).  In a forked child: the fd's queue is shared with the
        parent, whose changes a drain here would take away."""
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
        self.fd, self.added = -1, 0
        self.kept.clear()


_WATCH = hasattr(_core, "watch_open")
# Directories the search never descends into: made or removed, they change
# nothing it finds (a program run in the tree makes __pycache__ often).
# And this process's workspaces (_ours), a prefix.
_skip_list = [*sorted(_SKIP - {".git"}), _OURS + "*"]


# Spawns come in bursts (an agent's tool calls): the search of the same
# roots is reused for this long, and no longer than its listing, which a
# change in the tree ends at once (_Listings).
TTL = 1.0
_cache: dict[tuple[str | None, tuple[str, ...], bool, Place], tuple[float, Found]] = {}
_lock = threading.Lock()
_listings = _Listings()


def drop_listings() -> None:
    """See _Listings.forget."""
    with _lock:
        _listings.forget()


def _forget_after_fork() -> None:
    global _lock, _OURS, _skip_list
    _lock = threading.Lock()
    _OURS = _ours()
    _skip_list = [*_skip_list[:-1], _OURS + "*"]
    _listings.forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def protected(
    home: str | None, roots: Iterable[str], *, darwin: bool = DARWIN, place: Place = None
) -> Found:
    """The protected paths for writable `roots` and `home` (`darwin`: with
    macOS's own, for a Seatbelt profile), resolved where the caller is
    (`place`: _place.here(), asked if None)."""
    key = (home, tuple(roots), darwin, place if place is not None else here())
    now = time.monotonic()
    with _lock:
        hit = _cache.get(key)
    # Reused while its listing is: a repository made since, even a moment
    # before this spawn, is found (the listing's watch saw it).
    if hit is not None and now - hit[0] < TTL and (not key[1] or _listings.current(key[1])):
        return hit[1]
    found = _protected(home, key[1], darwin)
    with _lock:
        if len(_cache) > 64:
            _cache.clear()
        _cache[key] = (now, found)
    return found


def dotfiles(home: str, *, darwin: bool = DARWIN) -> list[str]:
    """HOME's protected dotfiles (existing or not)."""
    return [os.path.join(home, n) for n in DOTFILES + (DOTFILES_DARWIN if darwin else ())]


def _links(home: str, path: str) -> list[str]:
    """The symbolic links on the way from `home` to `path` (`path`
    included), each as itself with its directory resolved."""
    out = []
    cur = home
    for part in os.path.relpath(path, home).split("/"):
        cur = os.path.join(cur, part)
        if os.path.islink(cur):
            out.append(os.path.join(os.path.realpath(os.path.dirname(cur)), part))
    return out


def _protected(home: str | None, roots: tuple[str, ...], darwin: bool) -> Found:
    out: list[str] = []
    links: list[str] = []
    if home:
        for path in dotfiles(home, darwin=darwin):
            out.append(path)
            links += _links(home, path)
    listed = _listings.get(roots)
    found, complete = listed if listed is not None else _listings.search(roots)
    out += found
    paths = [os.path.realpath(p) for p in out] + links
    return Found(tuple(dict.fromkeys(paths)), complete)


# The notes of `enforced` (what is missing, what is a link) are reused as
# long as the search: a dozen stats per spawn, for words.  The child itself
# finds what exists at every spawn.
_notes: dict[tuple[str, str, tuple[str, ...]], tuple[float, list[str]]] = {}


def _noted(kind: str, home: str, roots: Iterable[str], find: Callable[[], list[str]]) -> list[str]:
    key = (kind, home, tuple(roots))
    now = time.monotonic()
    with _lock:
        hit = _notes.get(key)
    if hit is not None and now - hit[0] < TTL:
        return list(hit[1])
    found = find()
    with _lock:
        if len(_notes) > 64:
            _notes.clear()
        _notes[key] = (now, found)
    return list(found)


def missing_dotfiles(home: str, roots: Iterable[str]) -> list[str]:
    """HOME's dotfiles that do not exist while HOME lies in a writable root:
    the program could make one (a new ~/.zshrc runs in the user's next
    shell), and no mechanism here can refuse a name that is not there yet."""
    roots = tuple(roots)
    return _noted("missing", home, roots, lambda: _missing_dotfiles(home, roots))


def _missing_dotfiles(home: str, roots: Iterable[str]) -> list[str]:
    home = os.path.realpath(home)
    if not any(within(home, os.path.realpath(r)) for r in roots):
        return []
    return ["~/" + os.path.relpath(p, home) for p in dotfiles(home) if not os.path.lexists(p)]


def replaceable_links(home: str, roots: Iterable[str]) -> list[str]:
    """HOME's protected dotfiles reached through a link to a directory (or
    to nothing) while HOME lies in a writable root: a bind mount can cover a
    link to a file, not these, so the program could replace the link."""
    roots = tuple(roots)
    return _noted("links", home, roots, lambda: _replaceable_links(home, roots))


def _replaceable_links(home: str, roots: Iterable[str]) -> list[str]:
    real = os.path.realpath(home)
    if not any(within(real, os.path.realpath(r)) for r in roots):
        return []
    out = []
    for path in dotfiles(home):
        for link in _links(home, path):
            if not os.path.isfile(link) and link not in out:
                out.append(link)
    return ["~/" + os.path.relpath(p, real) for p in out]


def within(path: str, root: str) -> bool:
    """`path` is `root` or lies beneath it (both resolved)."""
    return path == root or path.startswith(root.rstrip("/") + "/")
