"""Private workspaces and the disk limit."""

from __future__ import annotations

import fcntl
import os
import pathlib
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time

import pytest

import sbxlimit
from sbxlimit import Limits, Policy, _fstree
from sbxlimit._namespaces import CLONE_NEWNS, namespaces

from .conftest import (
    alive,
    can_choose_the_next_pid,
    fs_type,
    in_a_fork,
    kept_in_a_fork,
    privileges,
    settled_temp,
    wait_gone,
)

pytestmark = pytest.mark.filterwarnings("ignore:sbxlimit.*not enforced here:RuntimeWarning")
PY = sys.executable
POLICY = Policy(protect_dotfiles=False)


def test_the_environment_inherited_follows_ours_between_spawns(monkeypatch):
    # A policy sandbox's environment is ours filtered; it is reused from
    # one spawn to the next only while os.environ stays as it was.
    code = "import os, json; print(json.dumps(dict(os.environ)))"

    def child_env() -> dict[str, str]:
        import json

        policy = Policy(protect_dotfiles=False, drop_secrets=True)
        r = sbxlimit.run([PY, "-c", code], policy=policy, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return dict(json.loads(r.stdout))

    monkeypatch.setenv("SBX_SEEN", "1")
    monkeypatch.setenv("TMPDIR", "/nowhere")
    monkeypatch.setenv("LD_PRELOAD", "/nowhere/evil.so")
    first = child_env()
    assert first["SBX_SEEN"] == "1" and "LD_PRELOAD" not in first
    assert first["TMPDIR"] != "/nowhere" and first["TMPDIR"].endswith("/tmp")
    monkeypatch.setenv("SBX_SEEN", "2")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hush")
    second = child_env()
    assert second["SBX_SEEN"] == "2" and "AWS_SECRET_ACCESS_KEY" not in second
    assert second["TMPDIR"] not in (first["TMPDIR"], "/nowhere")  # this sandbox's own
    monkeypatch.delenv("SBX_SEEN")
    assert "SBX_SEEN" not in child_env()
    # With a workdir: no workspace, so TMPDIR is ours again.
    r = sbxlimit.run(
        [PY, "-c", "import os; print(os.environ['TMPDIR'])"],
        policy=Policy(workdir="/", protect_dotfiles=False),
        capture_output=True,
        text=True,
    )
    assert r.stdout.strip() == "/nowhere", r.stderr


def test_private_workspace_is_cwd_and_tmpdir_readable_until_close():
    code = (
        "import os; print(os.getcwd()); print(os.environ['TMPDIR']); "
        "open('out.txt', 'w').write('hi')"
    )
    with sbxlimit.Popen([PY, "-c", code], policy=POLICY, stdout=subprocess.PIPE, text=True) as p:
        out = p.stdout.read().split()
        p.wait()
        ws = p.workspace
        assert ws is not None and out == [ws, os.path.join(ws, "tmp")]
        assert os.stat(ws).st_mode & 0o777 == 0o700
        assert os.path.basename(ws).startswith(f"sbxlimit-{p.sandbox_id}-")
        with open(os.path.join(ws, "out.txt")) as f:
            assert f.read() == "hi"  # still there after the exit
        assert p.enforced["workspace"].startswith("supervisor:workspace")
    # Removed, and still named: the path stays for the record.
    assert not os.path.exists(ws) and p.workspace == ws and p.workspace_removed


def test_keep_workdir_keeps_it(tmp_path):
    with sbxlimit.Popen(
        ["sh", "-c", "echo x > kept"], policy=Policy(protect_dotfiles=False, keep_workdir=True)
    ) as p:
        p.wait()
        ws = p.workspace
    try:
        assert os.path.exists(os.path.join(ws, "kept"))
    finally:
        import shutil

        shutil.rmtree(ws)


def test_keep_workdir_keeps_it_past_an_interpreter_that_never_closed_it(tmp_path):
    # keep_workdir was forgotten at interpreter exit when the Popen was
    # never closed: the exit removed it with the unclosed ones.
    code = (
        "import sbxlimit\n"
        "p = sbxlimit.Popen(['sh', '-c', 'echo x > kept'],\n"
        "                   policy=sbxlimit.Policy(keep_workdir=True))\n"
        "p.wait()\n"
        "print(p.workspace)\n"
    )
    r = subprocess.run(
        [PY, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    ws = r.stdout.strip()
    assert ws.startswith(str(tmp_path)) and os.path.exists(os.path.join(ws, "kept")), r.stderr
    # Its owner is gone, but it was kept on purpose: not a leftover for gc.
    env = {**os.environ, "TMPDIR": str(tmp_path), "SBXLIMIT_CGROUP_PARENT": "none"}
    r = subprocess.run(
        [PY, "-m", "sbxlimit", "gc"], capture_output=True, text=True, timeout=60, env=env
    )
    assert r.returncode == 0 and ws not in r.stdout and os.path.exists(ws), r.stdout


def test_the_programs_leftovers_do_not_stop_removal():
    code = "import os; os.makedirs('a/b'); open('a/b/f', 'w').write('x'); os.chmod('a', 0)"
    with sbxlimit.Popen([PY, "-c", code], policy=POLICY) as p:
        p.wait()
        ws = p.workspace
    assert not os.path.exists(ws)


def test_the_removal_changes_no_file_a_link_the_program_left_points_to():
    # The program leaves a read-only directory holding a link to a file of
    # the caller's user (`ln -s ~/notes ro/link; chmod 500 ro`).  A removal
    # that cannot unlink the link opens its directory up (chmod) and tries
    # again; it opened up the link itself, and chmod follows links: the
    # caller's file became 0700.  Root removes without opening anything up:
    # the removal runs as another user then (in a directory it can reach).
    nobody = 65534 if os.geteuid() == 0 else -1
    # (Where that user can reach it: /tmp, not a TMPDIR of root's own.)
    base = pathlib.Path(tempfile.mkdtemp(prefix="link-left-", dir="/tmp" if nobody >= 0 else None))
    try:
        ws, victim = base / "ws", base / "notes"
        (ws / "ro" / "sub").mkdir(parents=True)
        victim.write_text("the caller's")
        victim.chmod(0o644)
        (ws / "ro" / "link").symlink_to(victim)
        (ws / "ro" / "sub").chmod(0)
        (ws / "ro").chmod(0o500)
        if nobody >= 0:
            for path in (base, victim, ws, ws / "ro", ws / "ro" / "link", ws / "ro" / "sub"):
                os.chown(path, nobody, nobody, follow_symlinks=False)

        def remove() -> str:
            if nobody >= 0:
                os.setgid(nobody)
                os.setuid(nobody)
            from sbxlimit import _workspace

            _workspace.remove(str(ws))
            return "removed"

        assert in_a_fork(remove) == "removed"
        assert stat.S_IMODE(victim.stat().st_mode) == 0o644
        assert not os.path.lexists(ws)
    finally:
        shutil.rmtree(base, ignore_errors=True)


# User-Mode Linux's hostfs (the cgroup v2 guest's /) does each call by
# path on the host: nothing past PATH_MAX can be made or removed there, and
# a tree 1200 deep takes its program minutes to make.
_DEEP_TREES = pytest.mark.skipif(
    fs_type(tempfile.gettempdir()) == "hostfs" or fs_type("/tmp") == "hostfs",
    reason="hostfs (User-Mode Linux's) works by path on the host: no tree past PATH_MAX, "
    "and a deep one takes minutes",
)


_DEEP = "i=0; while [ $i -lt 1200 ]; do mkdir d && cd d || exit 1; i=$((i+1)); done"
_LEAVES_A_DEEP_TREE = f"""
import sbxlimit
r = sbxlimit.run(["sh", "-c", "{_DEEP}"], policy=sbxlimit.Policy(protect_dotfiles=False))
assert r.returncode == 0, r
"""


@_DEEP_TREES
def test_a_tree_of_any_depth_the_program_leaves_is_removed(tmp_path):
    # 1200 directories deep: a removal that recursed (shutil.rmtree)
    # raised RecursionError, on the janitor's thread and again at exit;
    # the workspace stayed, and each later collector failed the same way.
    env = {**os.environ, "TMPDIR": str(tmp_path), "SBXLIMIT_CGROUP_PARENT": "none"}
    r = subprocess.run(
        [PY, "-c", _LEAVES_A_DEEP_TREE], capture_output=True, text=True, timeout=120, env=env
    )
    assert r.returncode == 0 and "Error" not in r.stderr, r.stderr
    assert os.listdir(tmp_path) == []


@_DEEP_TREES
def test_a_tree_past_path_max_the_program_made_unreadable_is_removed():
    # 20 names of 250 characters, then a directory of mode 000: opening it
    # up by its path failed (ENAMETOOLONG), and nothing said so.  Root
    # needs no opening up: the removal runs as another user then.
    nobody = 65534 if os.geteuid() == 0 else -1
    base = pathlib.Path(tempfile.mkdtemp(prefix="path-max-", dir="/tmp" if nobody >= 0 else None))
    try:
        ws = base / "ws"
        ws.mkdir()
        if nobody >= 0:
            os.chown(base, nobody, nobody)
            os.chown(ws, nobody, nobody)

        def make_and_remove() -> str:
            if nobody >= 0:
                os.setgid(nobody)
                os.setuid(nobody)
            os.chdir(ws)
            for _ in range(20):
                os.mkdir("x" * 250)
                os.chdir("x" * 250)
            os.mkdir("locked")
            open("locked/f", "w").close()
            os.chmod("locked", 0)
            os.chdir("/")
            from sbxlimit import _workspace

            _workspace.remove(str(ws))
            return "done"

        assert in_a_fork(make_and_remove) == "done"
        assert not os.path.lexists(ws)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_tree_is_removed_by_the_janitor_not_the_caller(monkeypatch):
    # close() renames the workspace away (its path is gone at once) and the
    # janitor thread removes the tree: the caller never waits for rmdirs.
    from sbxlimit import _workspace

    real, threads = _workspace.remove, []

    def remove(path):
        real(path)
        threads.append((threading.current_thread().name, path))

    monkeypatch.setattr(_workspace, "remove", remove)
    code = "import os; os.makedirs('a/b'); open('a/b/f', 'w').write('x')"
    with sbxlimit.Popen([PY, "-c", code], policy=POLICY) as p:
        p.wait()
        ws = p.workspace
    assert not os.path.exists(ws) and p.workspace_removed
    trash = ws + _workspace.TRASH_SUFFIX
    deadline = time.monotonic() + 10
    while trash not in [path for _, path in threads] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (threading.current_thread().name, trash) not in threads
    assert ("sbxlimit-janitor", trash) in threads, threads
    assert not os.path.exists(trash)


def _sizes(monkeypatch) -> list[tuple[str, str]]:
    """(thread, path) of each workspace measured, as it is."""
    from sbxlimit import _workspace

    real, measured = _workspace.size, []

    def size(path):
        measured.append((threading.current_thread().name, path))
        return real(path)

    monkeypatch.setattr(_workspace, "size", size)
    return measured


def test_the_workspace_s_size_is_measured_by_the_janitor_before_it_removes_it(monkeypatch):
    # Nobody asked for the usage when run() returned: the janitor measured
    # the workspace (in the trash, before removing it), not the caller;
    # the figure is the program's 300 kB.
    from sbxlimit import _workspace

    measured = _sizes(monkeypatch)
    r = sbxlimit.run(["sh", "-c", "head -c 300000 /dev/zero > f"], policy=POLICY)
    trash = r.workspace + _workspace.TRASH_SUFFIX
    deadline = time.monotonic() + 10
    while not measured and time.monotonic() < deadline:
        time.sleep(0.005)
    assert measured == [("sbxlimit-janitor", trash)]
    assert r.usage.disk >= 300000
    assert measured == [("sbxlimit-janitor", trash)]  # once
    assert not os.path.exists(r.workspace)


def test_a_workspace_left_bare_is_measured_as_the_supervisor_removes_it(monkeypatch):
    # The usual workspace (its empty tmp/, here grown by files made and
    # removed): no walk, the size comes from the core call that removes it
    # (Monitor._remove_trash), and it is what a walk of it would give.
    import tempfile

    from sbxlimit._monitor import get_monitor

    grow = "cd tmp && for i in $(seq 300); do : > a-rather-long-name-$i; done && rm -f a-*"
    with tempfile.TemporaryDirectory(prefix="sbxlimit-test-") as fresh:
        os.mkdir(os.path.join(fresh, "tmp"))
        empty = os.lstat(os.path.join(fresh, "tmp")).st_blocks * 512
    measured = _sizes(monkeypatch)
    r = sbxlimit.run(["sh", "-c", grow], policy=POLICY)
    assert r.returncode == 0
    assert get_monitor().drain(5)
    assert measured == [] and r.workspace and not os.path.exists(r.workspace)
    if empty == 0:
        pytest.skip("directories take no blocks here (tmpfs): the size would prove nothing")
    assert r.usage.disk > empty
    assert measured == []


def test_a_caller_who_asks_before_close_measures_the_workspace_itself(monkeypatch):
    # Asked after the exit, before close: measured where it is, once; the
    # supervisor then removes it without measuring it again.
    from sbxlimit._monitor import get_monitor

    measured = _sizes(monkeypatch)
    with sbxlimit.Popen(["sh", "-c", "head -c 300000 /dev/zero > f"], policy=POLICY) as p:
        p.wait()
        ws = p.workspace
        assert p.usage().disk >= 300000
    assert get_monitor().drain(5)
    assert measured == [(threading.current_thread().name, ws)]
    assert p.usage().disk >= 300000 and not os.path.exists(ws)


def test_a_popen_s_caller_taking_the_output_out_before_close_does_not_change_its_size(
    tmp_path,
):
    # A Popen's workspace is measured at the reap, as the program left it:
    # what its caller does there before close() is not the program's.
    # (run() measures later: nobody can touch it between the reap and its
    # close.)
    with sbxlimit.Popen(["sh", "-c", "head -c 300000 /dev/zero > out"], policy=POLICY) as p:
        p.wait()
        os.rename(os.path.join(p.workspace, "out"), tmp_path / "out")
        with open(os.path.join(p.workspace, "mine"), "wb") as f:
            f.write(b"x" * 500_000)
    assert 300_000 <= p.usage().disk < 400_000


def test_a_result_pickles_with_its_figures():
    # Sent back from a worker process (ProcessPoolExecutor): the result
    # carries its figures, whether or not anyone asked for them.
    import pickle

    r = sbxlimit.run(["sh", "-c", "head -c 300000 /dev/zero > f"], policy=POLICY)
    back = pickle.loads(pickle.dumps(r))
    assert back.termination.reason == "exited" and back.usage.disk >= 300000
    assert back.usage == r.usage


def test_a_forked_child_s_close_leaves_the_parent_s_workspace():
    # A child forked inside the with block (a copy of the Popen) owns
    # nothing: its close() does not take the parent's workspace away.
    with sbxlimit.Popen(["true"], policy=POLICY) as p:
        p.wait()
        ws = p.workspace
        pid = os.fork()
        if pid == 0:
            p.close()
            os._exit(0)
        os.waitpid(pid, 0)
        assert os.path.isdir(ws)
    assert not os.path.exists(ws) and p.workspace_removed


def test_a_workspace_of_many_files_does_not_delay_other_sandboxes_kills(monkeypatch):
    # A program decides how many files it leaves: their removal (seconds
    # for a few hundred thousand; here held 2 s) is the janitor's.
    # Meanwhile the supervisor still ends another sandbox at its wall_time.
    from sbxlimit import _workspace

    real = _workspace.remove

    def slow(path):
        time.sleep(2)
        real(path)

    monkeypatch.setattr(_workspace, "remove", slow)
    code = "import os\nfor i in range(1000): open(f'f{i}', 'w').close()"
    r = sbxlimit.run([PY, "-c", code], policy=POLICY)
    trash = r.workspace + _workspace.TRASH_SUFFIX
    assert os.path.isdir(trash)  # being removed
    other = sbxlimit.run(["sleep", "30"], limits=Limits(wall_time="0.3s"), sample_interval="20ms")
    assert other.termination.reason == "wall_time"
    assert os.path.isdir(trash), "the other sandbox was ended only after the removal"


def test_a_long_walk_of_a_workdir_s_size_does_not_delay_other_sandboxes_kills(
    monkeypatch, tmp_path
):
    # Without a tmpfs, `disk` is held by walking the workdir: as long as
    # the program makes it (empty files cost no blocks; a million fit any
    # limit).  The sizer thread walks, not the supervisor: here a walk
    # held for 10 s, and another sandbox's wall_time is still enforced.
    from sbxlimit import _workspace

    entered, release, walked_out = threading.Event(), threading.Event(), threading.Event()

    class Slow(_workspace.Sizing):
        def run(self, deadline: float | None = None) -> int | None:
            if self.path == str(tmp_path) and not walked_out.is_set():
                entered.set()
                release.wait(10)
                walked_out.set()
            return super().run(deadline)

    monkeypatch.setattr(_workspace, "Sizing", Slow)
    policy = Policy(workdir=str(tmp_path), protect_dotfiles=False)
    with sbxlimit.Popen(
        ["sleep", "30"], limits=Limits(disk="1Gi"), policy=policy, sample_interval="20ms"
    ) as walked:
        try:
            assert entered.wait(10), "the workdir was never measured"
            other = sbxlimit.run(
                ["sleep", "30"], limits=Limits(wall_time="0.3s"), sample_interval="20ms"
            )
            assert other.termination.reason == "wall_time"
            assert not walked_out.is_set(), "the other sandbox was ended only after the walk"
        finally:
            release.set()
            walked.kill_tree(grace=0)


# Keeps its tree deeper than the size walk has gone (a directory in the
# last, at least 2048 below the deepest the walk has opened: some 30 ms of
# its way) until `cap` deep.
DEEPER_THAN_THE_WALK = """
import ctypes, os, struct, sys
top, cap = sys.argv[1], int(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)
ino = libc.inotify_init1(0)
os.chdir(top)
depth, levels = 0, {}

def deeper():
    global depth
    for _ in range(512):
        os.mkdir("d")
        os.chdir("d")
        depth += 1
        if not depth % 64:  # (a watch on each would be slower than the walk)
            levels[libc.inotify_add_watch(ino, b".", 0x20)] = depth  # IN_OPEN

deeper()
print(flush=True)
while depth < cap:
    buf, off, reached = os.read(ino, 65536), 0, 0
    while off < len(buf):
        wd, _mask, _cookie, size = struct.unpack_from("iIII", buf, off)
        off += 16 + size
        if wd in levels:
            reached = max(reached, levels.pop(wd))
            libc.inotify_rm_watch(ino, wd)
    while depth - reached < 2048:
        deeper()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the program watches with inotify")
@pytest.mark.skipif(
    os.geteuid() != 0, reason=f"a tmpfs workdir mounted for the test needs root ({privileges()})"
)
def test_a_tree_grown_ahead_of_its_size_walk_does_not_hold_other_sandboxes_samples(tmp_path):
    # One sizer thread walks every workdir's size, each walk to its end: a
    # program that kept its tree deeper than its walk had gone held every
    # other sandbox's `disk` samples as long as it went on (here, 400,000
    # directories deep: seconds), and their writes past the limit went on.
    # (On a tmpfs, where a directory is made faster than the walk goes:
    # this machine's ext4 took 240 us to make one, the walk 16 to pass it.)
    grows, writes = tmp_path / "grows", tmp_path / "writes"
    grows.mkdir()
    writes.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2g", "tmpfs", str(grows)], check=True)
    try:
        _grown_ahead_of_the_walk(grows, writes)
    finally:
        subprocess.run(["umount", "-l", str(grows)], check=True)


def _grown_ahead_of_the_walk(grows: pathlib.Path, writes: pathlib.Path) -> None:
    a = sbxlimit.Popen(
        ["sleep", "60"],
        limits=Limits(disk="1Gi", wall_time=60),
        policy=Policy(workdir=str(grows), protect_dotfiles=False),
        sample_interval="20ms",
    )
    grower = subprocess.Popen(
        [PY, "-c", DEEPER_THAN_THE_WALK, str(grows), "400000"], stdout=subprocess.PIPE
    )
    try:
        assert grower.stdout is not None and grower.stdout.readline()
        time.sleep(0.2)  # the walk under way
        b = sbxlimit.run(
            [PY, "-c", "open('big', 'wb').write(b'x' * 8_000_000); import time; time.sleep(60)"],
            limits=Limits(disk="1Mi", wall_time="4s"),
            policy=Policy(workdir=str(writes), protect_dotfiles=False),
            sample_interval="20ms",
        )
        assert grower.poll() is None  # still growing the tree
    finally:
        grower.kill()
        grower.wait()
        grower.stdout.close()  # type: ignore[union-attr]
        a.kill_tree(grace=0)
        a.wait()
    assert b.termination.reason == "disk", b.termination


def _wide_tree(top: pathlib.Path, dirs: int, files: int) -> pathlib.Path:
    """`top` holding `dirs` directories of `files` empty files each."""
    for d in range(dirs):
        (top / f"d{d}").mkdir(parents=True)
        for f in range(files):
            (top / f"d{d}" / f"f{f}").touch()
    return top


@pytest.mark.skipif(not _fstree.usable, reason="no *at calls here: the walk goes by path")
def test_a_walk_waiting_for_its_turn_is_not_left_open_in_a_fork(tmp_path):
    # A walk between two turns holds the directory it is in: a forked
    # child (a ForkedSandbox's program) must not keep it.
    (tmp_path / "d").mkdir()
    w = _fstree.Walk(str(tmp_path), lambda fd, name, is_dir: None)
    try:
        assert not w.run(deadline=0)  # one step: where it can go on
        assert w.fd >= 0
        assert kept_in_a_fork([w.fd]) == {}
        assert w.run() and w.whole  # the parent's goes on
    finally:
        w.close()


@pytest.mark.skipif(not _fstree.usable, reason="no *at calls here: the walk goes by path")
def test_no_directory_of_a_walk_under_way_is_left_open_in_a_fork(fast_tmp):
    # Forks while another thread walks a tree (as the sizer and the janitor
    # do): the walk's directory, or one a step had open for a moment (a
    # listing's), was left open in most children (a review, 2026-11-28:
    # 112 of 150).
    tree = _wide_tree(fast_tmp / "tree", 40, 1000)
    stop = threading.Event()

    def walking() -> None:
        while not stop.is_set():
            _fstree.tree_size(str(tree))

    def under_the_tree() -> str:
        held = []
        for name in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{name}").startswith(str(tree)):
                    held.append(name)
            except OSError:
                pass
        return " ".join(held)

    walker = threading.Thread(target=walking)
    walker.start()
    try:
        kept = [in_a_fork(under_the_tree) for _ in range(100)]
    finally:
        stop.set()
        walker.join()
    assert kept == [""] * 100, kept


@pytest.mark.skipif(not _fstree.usable, reason="no *at calls here: the walk goes by path")
def test_a_walk_in_another_before_fork_hook_does_not_wait_for_itself(tmp_path):
    # A fork waits for walks between two steps; a workspace's final size is
    # measured by another before-fork hook, on the forking thread (_once),
    # which hung when its hook came after the walks' (a cgroup v2 guest).
    # (In a process of its own: a walk that waits for itself holds the lock.)
    (tmp_path / "f").write_bytes(b"x" * 8192)
    code = (
        "import sys\n"
        "from sbxlimit import _fstree\n"
        "_fstree._before_fork()  # as os.fork() calls it\n"
        "print(_fstree.tree_size(sys.argv[1]))\n"
        "_fstree._after_fork_in_parent()\n"
    )
    r = subprocess.run([PY, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and int(r.stdout) >= 8192, r.stderr


FORK_WHILE_A_FINAL_SIZE_IS_MEASURED = """
import os, sys, threading
import sbxlimit._once  # first, as the cgroups' module has it
from sbxlimit import _workspace
walking, real = threading.Event(), _workspace.size

def size(path):
    walking.set()
    return real(path)

_workspace.size = size
final = _workspace.FinalSize(sys.argv[1])
t = threading.Thread(target=final.get)
t.start()
walking.wait()
pid = os.fork()  # its hooks wait for the final size, then for the walks' step
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
t.join()
print(final.get())
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")
def test_a_fork_while_another_thread_measures_a_final_size_does_not_hang(fast_tmp):
    # A fork first has the final sizes still pending measured (for the
    # child); when another thread was measuring one, the fork waited for it
    # while holding what that thread's walk waited for (the walks' step).
    tree = _wide_tree(fast_tmp / "tree", 20, 1000)
    r = subprocess.run(
        [PY, "-c", FORK_WHILE_A_FINAL_SIZE_IS_MEASURED, str(tree)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout.strip().isdigit(), r.stderr


def test_a_workspace_made_ahead_is_the_sandboxs_own():
    # After a first private workspace the supervisor keeps some ready (id
    # 0); the next sandbox takes one, renamed for it: 0700, empty but for
    # its tmp/, and the directory that was ready (same inode).
    from sbxlimit._monitor import get_monitor

    sbxlimit.run(["true"], policy=POLICY)
    pool = get_monitor()._wspool
    deadline = time.monotonic() + 10
    while not pool.has_ready():
        assert time.monotonic() < deadline, "no workspace was made ahead"
        time.sleep(0.01)
    with pool._lock:
        ready = {os.stat(path).st_ino for _d, path in pool._ready}
    cmd = ["sh", "-c", "ls -A; touch made"]
    with sbxlimit.Popen(cmd, policy=POLICY, stdout=subprocess.PIPE) as p:
        out = p.stdout.read()
        p.wait()
        ws = p.workspace
        st = os.stat(ws)
        assert os.path.basename(ws).startswith(f"sbxlimit-{p.sandbox_id}-")
        assert st.st_ino in ready and st.st_mode & 0o777 == 0o700
        assert out.split() == [b"tmp"] and os.path.exists(os.path.join(ws, "made"))
    assert not os.path.exists(ws)


def test_a_forked_childs_exit_leaves_the_parents_workspaces(tmp_path):
    # A forked child that exits normally runs atexit: it must not remove
    # the workspaces of its parent's sandboxes.
    code = (
        "import os, sys, sbxlimit\n"
        "p = sbxlimit.Popen(['true'], policy=sbxlimit.Policy(protect_dotfiles=False))\n"
        "p.wait()\n"
        "if os.fork() == 0:\n"
        "    sys.exit(0)\n"
        "os.wait()\n"
        "print(os.path.isdir(p.workspace))\n"
        "p.__exit__(None, None, None)\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path), "SBXLIMIT_CGROUP_PARENT": "none"}
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert r.stdout.split() == ["True"], r.stderr


def test_an_interpreter_that_exits_at_once_leaves_no_workspace(tmp_path):
    # The supervisor may not have removed the tree yet: exit does.
    code = (
        "import sbxlimit\n"
        "for _ in range(5):\n"
        "    sbxlimit.run(['sh', '-c', 'mkdir -p x/y; echo z > x/y/f'],\n"
        "                 policy=sbxlimit.Policy(protect_dotfiles=False))\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path), "SBXLIMIT_CGROUP_PARENT": "none"}
    subprocess.run([PY, "-c", code], check=True, timeout=60, env=env)
    assert os.listdir(tmp_path) == []


_CRASHES_WITH_A_WORKSPACE = """
import os, sys, sbxlimit
p = sbxlimit.Popen(["sleep", "60"], policy=sbxlimit.Policy(protect_dotfiles=False))
with open(os.path.join(p.workspace, "result"), "w") as f:
    f.write("the program's files")
print(p.workspace, flush=True)
sys.stdin.read()  # until the test kills it
"""

_NEXT_PROCESS = """
import os, sys, time, sbxlimit
sbxlimit.run(["true"], policy=sbxlimit.Policy(protect_dotfiles=False))
deadline = time.monotonic() + float(sys.argv[2])
while os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.02)  # the janitor's, off the spawn's path
print(os.path.exists(sys.argv[1]))
"""


def test_a_killed_owner_s_workspace_goes_with_the_next_process_s_first(tmp_path):
    # Killed (Pool.terminate(), the OOM killer, kill -9): no exit step ran,
    # its workspace stayed until an operator ran `sbxlimit gc`.  Its owner
    # lock, free once it is gone, lets the next process take it.
    env = {**os.environ, "TMPDIR": str(tmp_path), "SBXLIMIT_CGROUP_PARENT": "none"}
    with subprocess.Popen(
        [PY, "-c", _CRASHES_WITH_A_WORKSPACE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as crashed:
        assert crashed.stdout is not None
        ws = crashed.stdout.readline().strip()
        crashed.kill()
    assert os.path.exists(os.path.join(ws, "result"))
    assert f"sbxlimit-{crashed.pid:x}.owner" in os.listdir(tmp_path)
    r = subprocess.run(
        [PY, "-c", _NEXT_PROCESS, ws, "10"], capture_output=True, text=True, timeout=60, env=env
    )
    assert r.stdout.split() == ["False"], r.stderr
    assert os.listdir(tmp_path) == []  # its lock too, and the next one's at its exit


_LIVE_IN_ANOTHER_PID_NS = """
import os, sys, sbxlimit
p = sbxlimit.Popen(["sleep", "60"], policy=sbxlimit.Policy(protect_dotfiles=False))
print(os.getpid(), p.workspace, flush=True)
sys.stdin.read()  # until the test has collected
print(os.path.isdir(p.workspace), flush=True)
p.kill_tree()
p.close()
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare") or not can_choose_the_next_pid(),
    reason=f"a PID namespace whose next pid is chosen needs root ({privileges()})",
)
def test_a_live_sandbox_s_workspace_in_another_pid_namespace_is_not_collected(tmp_path):
    # Its owner's pid is free here: asked by pid it is gone, and `sbxlimit
    # gc` removed the files of a program still running.  Its lock says it
    # runs.
    with open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    free = next(n for n in range(pid_max - 1000, 300, -7) if not os.path.exists(f"/proc/{n}"))
    inside = f"echo {free - 1} > /proc/sys/kernel/ns_last_pid; {PY} -c '{_LIVE_IN_ANOTHER_PID_NS}'"
    env = {**os.environ, "TMPDIR": str(tmp_path), "SBXLIMIT_CGROUP_PARENT": "none"}
    with subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", inside],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as p:
        try:
            assert p.stdout is not None and p.stdin is not None
            pid, ws = p.stdout.readline().split()
            assert int(pid) == free and not alive(free)  # gone, asked here
            subprocess.run([PY, "-m", "sbxlimit", "gc"], capture_output=True, env=env, check=True)
            # (Its janitor looks within milliseconds of its first workspace.)
            r = subprocess.run(
                [PY, "-c", _NEXT_PROCESS, ws, "2"], capture_output=True, text=True, env=env
            )
            assert r.stdout.split() == ["True"], r.stderr
            p.stdin.close()
            assert p.stdout.readline().split() == ["True"]
            assert p.wait(timeout=30) == 0
        finally:
            if p.poll() is None:
                p.kill()
    assert os.listdir(tmp_path) == []


_PLANTED_LOCK = """
import os, sys, tempfile, sbxlimit
from sbxlimit import _owner
print(os.getpid(), flush=True)
sys.stdin.readline()  # the test plants a lock of another user's under our pid
with sbxlimit.Popen(["true"], policy=sbxlimit.Policy(protect_dotfiles=False)) as p:
    p.wait()
print(_owner._held.get(tempfile.gettempdir()), flush=True)
"""


def _collect(tmp: str, *, locked_only: bool) -> list[str]:
    """collect_workspaces in a process of its own: what it takes becomes
    its own, under a lock of its own there, let go at its exit."""
    code = "import sys; from sbxlimit._gc import collect_workspaces as c\n"
    code += "print(*c(sys.argv[1], locked_only=sys.argv[2] == '1'), sep='\\n')"
    r = subprocess.run(
        [PY, "-c", code, tmp, "1" if locked_only else "0"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    return [line for line in r.stdout.splitlines() if line]


@pytest.mark.skipif(
    os.geteuid() != 0, reason=f"making a directory another user's needs root ({privileges()})"
)
@pytest.mark.parametrize("planted", ["a directory", "a link to a directory of ours"])
def test_an_owner_lock_another_user_planted_is_not_trusted(tmp_path, planted):
    # Another user who can write the temp directory (/tmp is everyone's)
    # makes `sbxlimit-<pid hex>.owner` before the process with that pid
    # does.  A directory of theirs they can remove (sticky: it is theirs)
    # and make again, unlocked, whenever they like; a link they can point
    # at another directory of ours, that nobody holds.  Either way a
    # collector would then take that process's workspaces for a dead
    # owner's.
    nobody = 65534
    ours = tmp_path / "a-directory-of-ours"
    ours.mkdir()

    def plant(path: pathlib.Path) -> None:
        if planted == "a directory":
            path.mkdir(mode=0o755)
        else:
            path.symlink_to(ours)
        os.chown(path, nobody, nobody, follow_symlinks=False)

    def unplant(path: pathlib.Path) -> None:
        path.rmdir() if planted == "a directory" else path.unlink()

    env = {**os.environ, "TMPDIR": str(tmp_path), "SBXLIMIT_CGROUP_PARENT": "none"}
    with subprocess.Popen(
        [PY, "-c", _PLANTED_LOCK], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    ) as p:
        assert p.stdout is not None and p.stdin is not None
        pid = int(p.stdout.readline())
        plant(tmp_path / f"sbxlimit-{pid:x}.owner")
        p.stdin.write("go\n")
        p.stdin.close()
        held = p.stdout.readline().strip()
    assert held == "-1"  # no lock: its leftovers are judged by pid and age
    unplant(tmp_path / f"sbxlimit-{pid:x}.owner")

    # A collector, for its part, takes no such lock as proof that an owner
    # is gone ...
    dead = _dead_pid()
    left = tmp_path / f"sbxlimit-{dead:x}-1-abcdefgh"
    (left / "tmp").mkdir(parents=True)
    lock = tmp_path / f"sbxlimit-{dead:x}.owner"
    plant(lock)
    assert _collect(str(tmp_path), locked_only=True) == []
    assert left.exists()
    # ... nor as proof that it runs (its owner held it against the
    # collector): `sbxlimit gc` asks the pid.
    fd = os.open(ours if planted != "a directory" else lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert _collect(str(tmp_path), locked_only=False) == [f"workspace {left}"]
    finally:
        os.close(fd)
    assert os.path.lexists(lock)  # not ours to remove
    unplant(lock)
    (left / "tmp").mkdir(parents=True)
    lock.mkdir()  # ours
    assert _collect(str(tmp_path), locked_only=True) == [
        f"workspace {left}",
        f"workspace lock {lock}",
    ]
    assert os.listdir(tmp_path) == [ours.name]


@pytest.mark.skipif(
    os.geteuid() != 0, reason=f"a mount inside a leftover needs root ({privileges()})"
)
def test_gc_says_removed_only_what_is_gone(tmp_path):
    # What cannot be removed (here a mount point inside it) was reported
    # removed by `sbxlimit gc` all the same.
    dead = _dead_pid()
    left = tmp_path / f"sbxlimit-{dead:x}-1-abcdefgh"
    (left / "busy").mkdir(parents=True)
    (tmp_path / f"sbxlimit-{dead:x}.owner").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "none", str(left / "busy")], check=True)
    try:
        got = _collect(str(tmp_path), locked_only=True)
        assert not [line for line in got if line.startswith("workspace /")], got
    finally:
        busy = [str(p) for p in tmp_path.glob("*/busy")]
        for path in busy:
            subprocess.run(["umount", path], check=False)
    assert busy  # (renamed as the collector's, and left)
    assert _collect(str(tmp_path), locked_only=True)  # gone now
    assert os.listdir(tmp_path) == []


def test_a_dead_owner_s_workspaces_wait_while_its_pid_is_another_s(tmp_path):
    # Its lock is free, but a process runs with its pid here: the owner
    # lost its lock (a collector held it as it started), or the pid went to
    # another process since.  The workspaces could be a live program's
    # files, however old: they wait for that pid to be gone.
    with subprocess.Popen(["sleep", "60"]) as live:
        try:
            left = tmp_path / f"sbxlimit-{live.pid:x}-1-abcdefgh"
            (left / "tmp").mkdir(parents=True)
            (tmp_path / f"sbxlimit-{live.pid:x}.owner").mkdir()
            old = time.time() - 3600
            os.utime(left, (old, old))
            assert _collect(str(tmp_path), locked_only=True) == []
            assert left.exists()
        finally:
            live.kill()
    assert _collect(str(tmp_path), locked_only=True) == [
        f"workspace {left}",
        f"workspace lock {tmp_path / f'sbxlimit-{live.pid:x}.owner'}",
    ]


_TEMP_DIR_PER_JOB = """
import os, shutil, tempfile, sbxlimit
from sbxlimit import _owner

base = tempfile.gettempdir()
def owner_fds():
    fds = []
    for n in os.listdir("/proc/self/fd"):
        try:
            fds.append(os.readlink(f"/proc/self/fd/{n}"))
        except OSError:
            pass  # the listing's own
    return [t for t in fds if t.endswith(".owner") or t.endswith(".owner (deleted)")]
for job in range(40):  # a temp directory of its own each, removed after
    tempfile.tempdir = os.path.join(base, f"job{job % 3}")
    os.mkdir(tempfile.tempdir)
    sbxlimit.run(["true"], policy=sbxlimit.Policy(protect_dotfiles=False))
    made = f"sbxlimit-{os.getpid():x}.owner" in os.listdir(tempfile.tempdir)
    while os.path.exists(tempfile.tempdir):  # (the supervisor may make one ahead meanwhile)
        shutil.rmtree(tempfile.tempdir, ignore_errors=True)
    if not made:
        raise SystemExit(f"job {job}: no lock in its temp directory (made again)")
print(len(owner_fds()))
"""


def test_temp_directories_removed_and_made_again_hold_no_fd_and_get_their_lock(tmp_path):
    # A caller that gives each job a temp directory of its own and removes
    # it after: an fd stayed open on each removed directory's lock (the
    # process ran out of fds), and a directory made again at the same path
    # never got its lock again.
    env = {**os.environ, "TMPDIR": str(tmp_path), "SBXLIMIT_CGROUP_PARENT": "none"}
    r = subprocess.run(
        [PY, "-c", _TEMP_DIR_PER_JOB], capture_output=True, text=True, timeout=120, env=env
    )
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) <= 1  # the last job's, if its removal is not seen yet


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_disk_limit_ends_with_reason_disk():
    code = (
        "import os\n"
        "with open('big', 'wb') as f:\n"
        "    for _ in range(400):\n"
        "        f.write(b'x' * (1 << 20)); f.flush(); os.fsync(f.fileno())\n"
    )
    with sbxlimit.Popen(
        [PY, "-c", code],
        policy=POLICY,
        limits=Limits(disk="16Mi"),
        sample_interval="20ms",
        stderr=subprocess.PIPE,
        text=True,
    ) as p:
        p.communicate(timeout=60)
        t = p.termination
        assert t.reason == "disk", t
        assert t.limit == 16 << 20 and "workspace" in t.message
        if namespaces(CLONE_NEWNS).ok:
            # A tmpfs a margin larger: past the limit the sandbox was ended
            # (or, between two samples, the kernel refused at the margin).
            assert t.limit < t.observed <= (16 << 20) + (1 << 20)
            assert "tmpfs:size" in t.mechanism
        else:
            assert t.observed > t.limit and p.usage().disk > 16 << 20
            assert t.mechanism == "watchdog:disk"
        assert t.mechanism in p.enforced["disk"]


def test_disk_within_limit_and_usage():
    r = sbxlimit.run(["sh", "-c", "head -c 300000 /dev/zero > f"], limits=Limits(disk="10Mi"))
    assert r.returncode == 0 and r.termination.reason == "exited"
    assert r.usage.disk >= 300000


def test_disk_on_a_given_workdir(tmp_path):
    r = sbxlimit.run(
        ["sh", "-c", "head -c 2000000 /dev/zero > f; sleep 5"],
        limits=Limits(disk="1Mi"),
        policy=Policy(workdir=str(tmp_path), protect_dotfiles=False),
        sample_interval="20ms",
    )
    assert r.termination.reason == "disk" and (tmp_path / "f").exists()


@_DEEP_TREES
def test_disk_counts_what_the_program_writes_past_path_max(tmp_path):
    # The watchdog measured by path: below 20 names of 250 characters
    # (past PATH_MAX) it saw nothing, and 2 MB there went unnoticed.
    code = (
        "import os, time\n"
        "for _ in range(20):\n"
        "    os.mkdir('x' * 250); os.chdir('x' * 250)\n"
        "with open('f', 'wb') as f:\n"
        "    f.write(bytes(2_000_000))\n"
        "time.sleep(5)\n"
    )
    r = sbxlimit.run(
        [PY, "-c", code],
        limits=Limits(disk="1Mi"),
        policy=Policy(workdir=str(tmp_path), protect_dotfiles=False),
        sample_interval="20ms",
    )
    assert r.termination.reason == "disk", r.termination


# The program hides what it writes from the watchdog's walk: it watches a
# decoy directory (inotify) and moves it to another parent each time the
# walk opens it; the walk's ".." is then not where it came from, and a walk
# that stopped there counted nothing past the decoy (an attack review,
# 2026-11-28).  The decoy gets the name the walk takes first, the big file
# the one it takes last.
HIDE_FROM_THE_WALK = """
import ctypes, os, select, sys, time
libc = ctypes.CDLL(None, use_errno=True)
names = [f"c{i}" for i in range(400)]
for n in names:
    open(n, "w").close()
order = [n for n in os.listdir(".") if n in names]
big, decoy = order[0], order[-1]
os.unlink(decoy)
os.mkdir(decoy)
for j in range(2000):  # a longer stay in it
    open(f"{decoy}/f{j}", "w").close()
os.mkdir("alt")
ino = libc.inotify_init1(os.O_NONBLOCK)
assert libc.inotify_add_watch(ino, decoy.encode(), 0x20) >= 0  # IN_OPEN
if os.fork() == 0:
    where = ""
    while True:
        select.select([ino], [], [])
        try:
            os.read(ino, 4096)
        except BlockingIOError:
            continue
        other = "" if where else "alt/"
        try:
            os.rename(where + decoy, other + decoy)
            where = other
        except OSError:
            pass
with open(big, "wb") as f:
    for _ in range(64):  # 64 MiB against 16
        f.write(b"x" * (1 << 20))
        time.sleep(0.02)
time.sleep(2)
print("unseen", flush=True)
os.truncate(big, 0)  # nothing left for the measure at the reap
"""


@pytest.mark.skipif(not _fstree.usable, reason="no *at calls here: the walk goes by path")
def test_a_program_that_moves_what_the_walk_is_in_is_still_measured(tmp_path):
    r = sbxlimit.run(
        [PY, "-c", HIDE_FROM_THE_WALK],
        limits=Limits(disk="16Mi", wall_time=60),
        policy=Policy(workdir=str(tmp_path), protect_dotfiles=False),
        capture_output=True,
        text=True,
    )
    assert r.termination.reason == "disk", (r.termination, r.stdout, r.stderr[-300:])
    assert "unseen" not in r.stdout


OUTLIVES = """
import subprocess, sys
import sbxlimit
# A program that works in its workspace, making files, after we are gone.
prog = ("import time\\nwhile True:\\n"
        "    open(f'f{time.monotonic_ns()}', 'w').close(); time.sleep(0.001)")
p = sbxlimit.Popen([sys.executable, "-c", prog], policy=sbxlimit.Policy(protect_dotfiles=False),
                   die_with_parent=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(p.pid, p.workspace, flush=True)
"""


def test_a_sandbox_that_outlives_its_caller_keeps_its_workspace_until_it_is_done(tmp_path):
    # Its caller's exit removed its files under it, and was held as long as
    # it made more; `sbxlimit gc` did the same once the caller was gone (an
    # attack review, 2026-11-28).
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    t0 = time.monotonic()
    out = subprocess.run([PY, "-c", OUTLIVES], capture_output=True, text=True, env=env, timeout=60)
    exit_took = time.monotonic() - t0
    assert out.returncode == 0, out.stderr
    pid, ws = out.stdout.split()
    pid = int(pid)
    try:
        assert exit_took < 10, exit_took
        time.sleep(0.3)
        assert alive(pid) and os.path.isdir(ws) and len(os.listdir(ws)) > 10
        gc = subprocess.run(
            [PY, "-m", "sbxlimit", "gc"], capture_output=True, text=True, env=env, timeout=60
        )
        assert gc.returncode == 0, gc.stderr
        assert ws not in gc.stdout and os.path.isdir(ws), gc.stdout
    finally:
        os.kill(pid, signal.SIGKILL)
        wait_gone([pid])
    # Done there: now it is a dead owner's leftover like any other.
    gc = subprocess.run(
        [PY, "-m", "sbxlimit", "gc"], capture_output=True, text=True, env=env, timeout=60
    )
    assert not os.path.exists(ws), gc.stdout


# For each entry the removal takes from `top`, makes an empty directory
# there (some 4 us; each costs the removal some 15), until `top` is gone or
# it has made 100,000.
MAKES_DIRS = """
import ctypes, os, struct, sys
top, me = sys.argv[1:]
libc = ctypes.CDLL(None, use_errno=True)
ino = libc.inotify_init1(0)
libc.inotify_add_watch(ino, top.encode(), 0x200)  # IN_DELETE
print(flush=True)
made = 0
while made < 100_000:
    buf, off = os.read(ino, 65536), 0
    while off < len(buf):
        off += 16 + struct.unpack_from("iIII", buf, off)[3]
        try:
            os.mkdir(os.path.join(top, f"{me}-{made}"))
        except FileNotFoundError:
            sys.exit()  # removed
        made += 1
"""


def _remove_tree_bounded(path: pathlib.Path, **bounds: float) -> bool:
    """_fstree.remove_tree(path) with its bounds made shorter, in a process
    of its own (the janitor's removals here keep theirs)."""
    code = "import sys; from sbxlimit import _fstree\n"
    code += "".join(f"_fstree.{k} = {v!r}\n" for k, v in bounds.items())
    code += "print(_fstree.remove_tree(sys.argv[1]))"
    r = subprocess.run([PY, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip() == "True"


@pytest.fixture
def fast_tmp():
    """A directory where entries are made faster than they are removed (a
    tmpfs): this machine's ext4 took 700 us to make a file, 7 to remove it."""
    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        pytest.skip("no tmpfs at /dev/shm to make entries in faster than they go")
    path = pathlib.Path(tempfile.mkdtemp(dir="/dev/shm", prefix="test-tree-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(not _fstree.usable, reason="no *at calls here: the walk goes by path")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the programs watch with inotify")
def test_a_removal_is_not_held_by_a_program_that_keeps_making_files(fast_tmp):
    # Each pass got further, so it went on as long as files came: the
    # caller's exit was held for as long as a program chose to make them.
    # (The bound made short, so that the programs are still making
    # directories when the removal gives up: two for each it removes.)
    tree = fast_tmp / "ws"
    for d in range(5000):  # a first pass the programs are sure to see
        (tree / f"d{d}").mkdir(parents=True)
    makers = [
        subprocess.Popen([PY, "-c", MAKES_DIRS, str(tree), str(n)], stdout=subprocess.PIPE)
        for n in range(2)
    ]
    try:
        for m in makers:
            assert m.stdout is not None and m.stdout.readline()
        gone = _remove_tree_bounded(tree, _FURTHER=0.3)
        making = [m.poll() is None for m in makers]
    finally:
        for m in makers:
            m.kill()
            m.wait()
            m.stdout.close()  # type: ignore[union-attr]
        shutil.rmtree(tree, ignore_errors=True)
    assert not gone and all(making), making


@pytest.mark.skipif(not _fstree.usable, reason="no *at calls here: the walk goes by path")
def test_one_pass_of_a_removal_ends_where_the_removal_would_stop(tmp_path):
    # The bounds were checked between passes only, and each directory is
    # listed when the pass reaches it: a program that filled directories
    # ahead of the pass, faster than they went, held one pass as long as
    # it went on (the sanitizers' CI: 11 s for a bound of 2).  Here the
    # first pass's bound is made shorter than this tree takes.
    tree = tmp_path / "ws"
    for d in range(10):
        for f in range(20):
            (tree / f"d{d}" / f"f{f}").mkdir(parents=True)
    assert not _remove_tree_bounded(tree, _FIRST=0.0)
    assert any(tree.iterdir())  # left, to be tried again
    assert _fstree.remove_tree(str(tree)) and not tree.exists()


def test_a_failed_spawn_removes_the_workspace():
    import tempfile

    def workspaces() -> set[str]:
        # Not the ones the supervisor keeps ready or is removing.
        return {n for n in settled_temp(tempfile.gettempdir()) if n.startswith("sbxlimit-")}

    before = workspaces()
    with pytest.raises(FileNotFoundError):
        sbxlimit.Popen(["/nonexistent/prog"], policy=POLICY)
    assert workspaces() == before


def test_a_relative_program_is_found_from_the_callers_directory(tmp_path, monkeypatch):
    # subprocess finds "./prog" from the caller's cwd; the private workspace
    # sbxlimit picks as cwd must not change that.
    prog = tmp_path / "prog"
    prog.write_text("#!/bin/sh\npwd\n")
    prog.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    with sbxlimit.Popen(["./prog"], policy=POLICY, stdout=subprocess.PIPE, text=True) as p:
        out, _ = p.communicate()
        assert p.returncode == 0 and out.strip() == p.workspace
    # An explicit cwd keeps subprocess's rule: relative to that cwd.
    (tmp_path / "sub").mkdir()
    with pytest.raises(FileNotFoundError):
        sbxlimit.Popen(["./prog"], policy=POLICY, cwd=str(tmp_path / "sub"))


def test_the_supervisor_never_waits_for_a_caller_measuring_a_workspace(tmp_path):
    # A caller asking for a tree's size walks it holding the figure's lock
    # (seconds for a program's million files): the supervisor's pass over
    # the trash leaves that workspace to the janitor rather than wait, so
    # every other sandbox's timers go on.
    from sbxlimit import _workspace
    from sbxlimit._monitor import get_monitor

    trash = tmp_path / "sbxlimit-1-x.removing"
    (trash / "tmp").mkdir(parents=True)
    size = _workspace.FinalSize(str(trash))
    held, release = threading.Event(), threading.Event()

    def caller() -> None:
        with size.lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=caller)
    t.start()
    try:
        assert held.wait(5)
        out: list[object] = []
        sup = threading.Thread(
            target=lambda: out.append(
                get_monitor()._remove_trash([(str(trash), -1, size)], bare_only=True)
            )
        )
        sup.start()
        sup.join(5)
        assert not sup.is_alive(), "the supervisor's pass waited for the caller's measure"
        assert out == [[(str(trash), -1, size)]] and trash.is_dir()
    finally:
        release.set()
        t.join()
    # The janitor's pass may wait: it measures, then removes.
    assert get_monitor()._remove_trash([(str(trash), -1, size)], bare_only=False) == []
    assert not trash.exists() and size.done
