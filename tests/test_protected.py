"""The protected paths' search (protect_dotfiles) is reused while nothing
it depends on changed: inotify on every directory it listed.  Real
directories, real changes; the repository made between two spawns is
protected in the second, however far apart they come."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time

import pytest

import sbxlimit
from sbxlimit import Policy, _core, _namespaces, _protected
from sbxlimit._cgroupfs import mount_table

from .conftest import kept_in_a_fork

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="no inotify on this platform: the TTL alone"
)


@pytest.fixture
def short_ttl(monkeypatch):
    """Spawns a TTL apart: every cache but the watched listing has expired."""
    monkeypatch.setattr(_protected, "TTL", 0.0)
    monkeypatch.setattr(_namespaces, "TTL", 0.0)


def tree(root, dirs: int = 30) -> None:
    for i in range(dirs):
        os.makedirs(root / f"d{i}" / "sub")


def test_files_written_keep_the_listing_and_a_repository_made_ends_it(tmp_path):
    tree(tmp_path)
    roots = (str(tmp_path),)
    listings = _protected._listings
    found, complete = listings.search(roots)
    assert found == [] and complete
    (tmp_path / "d3" / "sub" / "notes.txt").write_text("an agent's work")
    (tmp_path / "d4" / "build.log").write_text("more")
    (tmp_path / "d5" / "__pycache__").mkdir()  # never searched
    (tmp_path / "node_modules").mkdir()
    assert listings.get(roots) == ([], True)  # nothing the search finds
    (tmp_path / "d7" / "sub" / ".git").mkdir()
    assert listings.get(roots) is None  # a repository: searched anew
    found, _ = listings.search(roots)
    assert str(tmp_path / "d7" / "sub" / ".git" / "hooks") in found


@pytest.mark.parametrize(
    "change",
    [
        "mkdir d1/sub/new",
        "rmdir d2/sub",
        "mv d3 d3.moved",
        "echo 'gitdir: /elsewhere' > d5/.git",
        "ln -s /somewhere d6/sub/.git",
    ],
)
def test_every_change_the_search_would_see_ends_the_listing(tmp_path, change):
    tree(tmp_path)
    roots = (str(tmp_path),)
    _protected._listings.search(roots)
    assert _protected._listings.get(roots) is not None
    subprocess.run(["sh", "-c", change], cwd=tmp_path, check=True)
    assert _protected._listings.get(roots) is None


def _settled(where) -> bool:
    from sbxlimit._workspace import POOL_SIZE

    names = os.listdir(where)
    ready = [n for n in names if n.startswith(f"sbxlimit-{os.getpid():x}-0-")]
    return len(ready) == POOL_SIZE and not any(n.endswith(".removing") for n in names)


def test_sandboxes_workspaces_made_and_removed_keep_the_listing_of_their_parent(
    tmp_path, monkeypatch
):
    # Workspaces in a directory a workdir covers: each spawn of a sandbox
    # with one makes, renames and removes a directory there.  They are
    # this process's, never searched, and keep its listing (each new search
    # of "/" cost 35 ms here); any other directory made there ends it.
    import tempfile

    from sbxlimit._monitor import get_monitor

    tree(tmp_path, 3)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    roots = (str(tmp_path),)
    sbxlimit.run(["true"], policy=Policy())  # the pool's are made here from now on
    get_monitor().drain(10)
    _protected._listings.search(roots)
    for _ in range(3):
        assert sbxlimit.run(["true"], policy=Policy()).returncode == 0
    deadline = time.monotonic() + 10
    while not _settled(tmp_path):  # the trash removed, the pool made again
        assert time.monotonic() < deadline, os.listdir(tmp_path)
        time.sleep(0.01)
    assert _protected._listings.get(roots) == ([], True)
    for other in ("sbxlimit-kept-1-x", f"sbxlimit-{os.getpid() + 1:x}-1-x", "sbxlimit-dev"):
        (tmp_path / other).mkdir()
        assert _protected._listings.get(roots) is None, other
        (tmp_path / other / ".git" / "hooks").mkdir(parents=True)
        found, _ = _protected._listings.search(roots)
        assert str(tmp_path / other / ".git" / "hooks") in found


def test_a_gitdir_file_rewritten_ends_the_listing(tmp_path):
    tree(tmp_path, 3)
    real = tmp_path / "real.git"
    (real / "hooks").mkdir(parents=True)
    other = tmp_path / "other.git"
    other.mkdir()
    link = tmp_path / "d1" / ".git"
    link.write_text(f"gitdir: {real}\n")
    roots = (str(tmp_path / "d1"),)
    found, _ = _protected._listings.search(roots)
    assert str(real / "hooks") in found
    link.write_text(f"gitdir: {other}\n")  # the same name: only its content
    assert _protected._listings.get(roots) is None


def test_a_repository_made_between_two_spawns_is_protected_in_the_second(tmp_path, short_ttl):
    # A workdir of a thousand directories: the second spawn does not list
    # them again (its listing is watched), yet sees the repository made
    # deep inside it since the first.
    tree(tmp_path, 300)
    policy = Policy(workdir=str(tmp_path))
    listed = []
    real = _protected._search

    def counting(*args, **kw):
        listed.append(args[0])
        return real(*args, **kw)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(_protected, "_search", counting)
        assert sbxlimit.run(["true"], policy=policy).returncode == 0
        assert sbxlimit.run(["true"], policy=policy).returncode == 0
        assert len(listed) == 1  # the second reused the listing
        hooks = tmp_path / "d250" / "sub" / ".git" / "hooks"
        hooks.mkdir(parents=True)
        r = sbxlimit.run(["sh", "-c", f"echo evil > {hooks}/pre-commit"], policy=policy)
    assert r.returncode != 0
    assert not (hooks / "pre-commit").exists()
    assert len(listed) == 2


def test_a_network_filesystem_is_not_trusted_to_report_its_changes():
    # /proc stands in for one: a filesystem outside the list of those
    # whose every change passes through this kernel.
    fd = _core.watch_open()
    try:
        watch = _protected._Watching(fd)
        watch.dirs(["/proc"], top=True)
        assert not watch.exact
        ok = _protected._Watching(fd)
        ok.dirs([os.path.dirname(os.path.abspath(__file__))], top=True)
        assert ok.exact
    finally:
        os.close(fd)


@pytest.fixture
def remote_dir():
    """A directory on a filesystem this kernel does not count as local
    (cgroupfs: outside watch.c's list, like a network filesystem), where
    this machine can make subdirectories."""
    if os.geteuid() != 0:
        pytest.skip("making a directory on a cgroup filesystem needs root")
    mounts = [m for m, kind, _o in mount_table() if kind in ("cgroup", "cgroup2")]
    d = None
    for base in mounts:
        try:
            d = os.path.join(base, f"sbxlimit-watch-test-{os.getpid()}")
            os.mkdir(d)
            break
        except OSError:
            d = None
    if d is None:
        pytest.skip("no cgroup filesystem here where a directory can be made")
    fd = _core.watch_open()
    try:
        remote = _core.watch_add(fd, [d], True)[0]
    finally:
        os.close(fd)
    if remote < 0 or not remote & _core.WATCH_REMOTE:
        os.rmdir(d)
        pytest.skip(f"{d} is not on a filesystem watch.c counts as not local")
    try:
        yield d
    finally:
        if os.path.isdir(os.path.join(d, "sub")):
            os.rmdir(os.path.join(d, "sub"))
        os.rmdir(d)


def test_a_listing_on_a_network_filesystem_still_sees_this_machine_s_changes(
    remote_dir, monkeypatch
):
    # Another client's change is not seen there (the TTL bounds it), but
    # the caller's own, made through this kernel, ends the listing at once:
    # a `git init` just before a spawn on an NFS home is protected in it.
    monkeypatch.setattr(_protected, "TTL", 60.0)  # the watch ends it, not the TTL
    roots = (remote_dir,)
    _protected._listings.search(roots)
    made, _found, _complete, wds, stamps = _protected._listings.kept[roots]
    assert made > 0 and wds and stamps  # the TTL, the watches and the stamps
    assert _protected._listings.current(roots)
    os.mkdir(os.path.join(remote_dir, "sub"))
    assert not _protected._listings.current(roots)


def test_a_listing_on_a_network_filesystem_that_reports_nothing_sees_this_machine_s_changes(
    remote_dir, monkeypatch
):
    # Some (User-Mode Linux's hostfs) queue no event even for this
    # machine's own changes: the directories' modification times tell.
    monkeypatch.setattr(_protected, "TTL", 60.0)  # the stamp ends it, not the TTL
    roots = (remote_dir,)
    _protected._listings.search(roots)
    assert _protected._listings.current(roots)
    os.mkdir(os.path.join(remote_dir, "sub"))
    _core.watch_changed(_protected._listings.fd, [])  # as if no event had come
    assert not _protected._listings.current(roots)


def test_a_root_not_there_is_kept_for_the_ttl_only(tmp_path):
    roots = (str(tmp_path / "later"),)
    _protected._listings.search(roots)
    made, _found, _complete, _wds, _stamps = _protected._listings.kept[roots]
    assert made > 0  # kept for the TTL, not until a change


def test_a_fork_does_not_drain_the_parents_watches(tmp_path):
    tree(tmp_path, 2)
    roots = (str(tmp_path),)
    _protected._listings.search(roots)
    fd = _protected._listings.fd
    assert fd >= 0
    assert kept_in_a_fork([fd]) == {}


def test_watching_does_not_change_what_is_found(tmp_path):
    for d in ("a/.git/hooks", "b/c/.git", "node_modules/x/.git", "e/f/g/h/i/.git"):
        (tmp_path / d).mkdir(parents=True)
    budget = [_protected.MAX_DIRS]
    plain = _protected._search(str(tmp_path), budget)
    watched = _protected._listings.search((str(tmp_path),))
    assert sorted(plain[0]) == sorted(watched[0]) and plain[1] == watched[1]


def test_a_change_ends_only_the_listings_that_watch_where_it_happened(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    tree(a, 3)
    tree(b, 3)
    listings = _protected._listings
    listings.search((str(a),))
    listings.search((str(b),))
    (a / "d1" / "new").mkdir()
    assert listings.get((str(a),)) is None
    assert listings.get((str(b),)) is not None


@pytest.mark.parametrize("how", ["a FIFO", "a link to a FIFO", "a link to a FIFO's gitdir"])
def test_a_fifo_where_a_git_file_is_looked_for_never_blocks_a_spawn(tmp_path, how):
    # A sandbox with a writable workdir plants it; the caller's search before
    # the next spawn with that workdir opened it and waited for a writer for
    # good (an attack review, 2026-11-28).  Devices are not opened either.
    work, fifo = tmp_path / "work", tmp_path / "fifo"
    work.mkdir()
    os.mkfifo(fifo)
    if how == "a FIFO":
        os.mkfifo(work / ".git")
    elif how == "a link to a FIFO":
        (work / ".git").symlink_to(fifo)
    else:  # a real worktree file whose gitdir holds a FIFO as its commondir
        (tmp_path / "wt").mkdir()
        os.mkfifo(tmp_path / "wt" / "commondir")
        (work / ".git").write_text(f"gitdir: {tmp_path / 'wt'}\n")
    done = threading.Event()

    def spawn() -> None:
        sbxlimit.run(["true"], policy=Policy(workdir=str(work)))
        done.set()

    threading.Thread(target=spawn, daemon=True).start()
    try:
        assert done.wait(30), "the spawn waits on the FIFO"
    finally:
        for f in (work / ".git", fifo, tmp_path / "wt" / "commondir"):
            with contextlib.suppress(OSError):  # let a blocked open go
                os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
        done.wait(10)
