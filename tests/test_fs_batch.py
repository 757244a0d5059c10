"""_core.fs_batch: the supervisor's directory work and the cgroup figures in
one call (the GIL released once)."""

from __future__ import annotations

import errno
import os
import resource

import pytest

from sbxlimit import _core

from .conftest import why_not

pytestmark = pytest.mark.skipif(not hasattr(_core, "fs_batch"), reason="the POSIX core's")
MK, RM, W, WO, R = (
    _core.FS_MKDIR,
    _core.FS_RMDIR,
    _core.FS_WRITE,
    _core.FS_WRITE_OPTIONAL,
    _core.FS_READ,
)


def test_steps_run_in_order_and_report_each_errno(tmp_path):
    d = tmp_path / "d"
    out = _core.fs_batch(
        [
            (MK, d, None),
            (MK, d, None),  # EEXIST: the next steps still run
            (W, d / "nothing", b"x"),  # ENOENT: O_WRONLY makes no file
            (WO, d / "nothing", b"x"),  # optional: ENOENT counts as done
            (RM, d, None),
        ],
        False,
    )
    assert out == [0, errno.EEXIST, errno.ENOENT, 0, 0] and not d.exists()


def test_stop_at_error_runs_nothing_after_the_failure(tmp_path):
    out = _core.fs_batch(
        [(MK, tmp_path / "a", None), (RM, tmp_path / "gone", None), (MK, tmp_path / "b", None)],
        True,
    )
    assert out == [0, errno.ENOENT, -1]
    assert (tmp_path / "a").is_dir() and not (tmp_path / "b").exists()


def test_writes_are_whole_and_reads_return_bytes(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"")
    assert _core.fs_batch([(W, f, b"1073741824")], True) == [0]
    assert _core.fs_batch([(R, f, None), (R, tmp_path / "no", None)], False) == [
        b"1073741824",
        errno.ENOENT,
    ]


def test_stat_gives_what_the_path_names_now_links_followed(tmp_path):
    # What the reuse of a Landlock ruleset compares (_landlock.ruleset).
    f, link, gone = tmp_path / "f", tmp_path / "link", tmp_path / "gone"
    f.write_bytes(b"")
    link.symlink_to(f)
    st = os.stat(f)
    out = _core.fs_batch([(_core.FS_STAT, f, None), (_core.FS_STAT, link, None)], False)
    assert out == [(st.st_dev, st.st_ino)] * 2
    assert _core.fs_batch([(_core.FS_STAT, gone, None)], False) == [errno.ENOENT]
    f.unlink()
    f.write_bytes(b"")  # a new file under the old name
    (again,) = _core.fs_batch([(_core.FS_STAT, link, None)], False)
    assert again == (os.stat(f).st_dev, os.stat(f).st_ino)


def test_a_file_larger_than_the_buffer_is_never_read_in_part(tmp_path):
    # A truncated read taken for the whole file would be a wrong figure.
    f = tmp_path / "big"
    f.write_bytes(b"x" * _core.FS_READ_MAX)
    assert _core.fs_batch([(R, f, None)], False) == [errno.EFBIG]
    f.write_bytes(b"x" * (_core.FS_READ_MAX - 1))
    assert _core.fs_batch([(R, f, None)], False) == [b"x" * (_core.FS_READ_MAX - 1)]


def test_a_procfs_file_reads_whole_across_reads():
    # /proc files come a page or a record at a time: the core reads to EOF.
    with open("/proc/self/status", "rb") as fobj:
        expected_lines = len(fobj.read().splitlines())
    (got,) = _core.fs_batch([(R, "/proc/self/status", None)], False)
    assert isinstance(got, bytes) and len(got.splitlines()) == expected_lines


def test_bad_steps_are_refused_before_anything_runs(tmp_path):
    with pytest.raises(TypeError):
        _core.fs_batch([(MK, tmp_path / "x", None), (W, tmp_path / "f", None)], False)
    with pytest.raises(ValueError):
        _core.fs_batch([(MK, os.fsencode(tmp_path) + b"/a\0b", None)], False)
    assert not (tmp_path / "x").exists()


def _target(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def test_opens_are_kept_close_on_exec_and_closed_by_number(tmp_path):
    # What Cgroup.arm opens ahead (join files, counters) and remove() closes.
    f = tmp_path / "f"
    f.write_bytes(b"5\n")
    got = _core.fs_batch(
        [
            (_core.FS_OPEN_WRITE, f, None),
            (_core.FS_OPEN_READ, f, None),
            (_core.FS_OPEN_READ, tmp_path / "no", None),
            # Its read fails (a directory): not kept, closed.
            (_core.FS_OPEN_READ, tmp_path, None),
        ],
        False,
    )
    assert got[2:] == [errno.ENOENT, errno.EISDIR]
    (wfd,), (rfd,) = got[0], got[1]
    try:
        assert _target(wfd) == _target(rfd) == str(f)
        assert os.get_inheritable(wfd) is False and os.get_inheritable(rfd) is False
        assert os.pread(rfd, 10, 0) == b"5\n"
    finally:
        out = _core.fs_batch(
            [(_core.FS_CLOSE, "", None, wfd), (_core.FS_CLOSE, "", None, rfd)], False
        )
    assert out == [0, 0]
    # A number no fd can have: EBADF, as os.close would raise.
    never = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert _core.fs_batch([(_core.FS_CLOSE, "", None, never)], False) == [errno.EBADF]


def test_a_kept_file_is_read_whole_from_its_start_each_time(tmp_path):
    # usage()'s kept files: read again at each call, whatever was read before
    # (a read() at the fd's offset would find nothing the second time), and
    # never in part.
    f = tmp_path / "f"
    f.write_bytes(b"123\n")
    fd = os.open(f, os.O_RDONLY)
    try:
        os.read(fd, 100)  # the fd's own offset is at the end
        step = (_core.FS_PREAD, "", None, fd)
        assert _core.fs_batch([step, step], False) == [b"123\n", b"123\n"]
        f.write_bytes(b"4567\n")  # same inode, rewritten
        assert _core.fs_batch([step], False) == [b"4567\n"]
        f.write_bytes(b"x" * _core.FS_READ_MAX)
        assert _core.fs_batch([step], False) == [errno.EFBIG]
        # A procfs file, longer than one read gives: whole.
        with open("/proc/self/status", "rb") as fobj:
            lines = len(fobj.read().splitlines())
        status = os.open("/proc/self/status", os.O_RDONLY)
        try:
            (got,) = _core.fs_batch([(_core.FS_PREAD, "", None, status)], False)
            assert isinstance(got, bytes) and len(got.splitlines()) == lines
        finally:
            os.close(status)
    finally:
        os.close(fd)
    assert _core.fs_batch([(_core.FS_PREAD, "", None, fd)], False) == [errno.EBADF]


def test_a_v1_event_line_names_the_eventfd_and_the_watched_file(tmp_path):
    # cgroup v1's cgroup.event_control takes "<eventfd> <fd of the watched
    # file>[ <arg>]" in one write; here a plain file shows the line.
    control, watched = tmp_path / "control", tmp_path / "watched"
    control.write_bytes(b"")
    watched.write_bytes(b"")
    efd = os.eventfd(0, os.EFD_CLOEXEC)
    try:
        data = os.fsencode(watched) + b"\0 4096"
        assert _core.fs_batch([(_core.FS_V1_EVENT, control, data, efd)], False) == [0]
        line = control.read_bytes().split()
        assert line[0] == str(efd).encode() and len(line) == 3 and line[2] == b"4096"
        # The watched file's fd is closed once the line is written.
        try:
            assert _target(int(line[1])) != str(watched)
        except OSError:
            pass
        gone = os.fsencode(tmp_path / "no") + b"\0"
        assert _core.fs_batch([(_core.FS_V1_EVENT, control, gone, efd)], False) == [errno.ENOENT]
        # No NUL after the path: refused, nothing written.
        bad = _core.fs_batch([(_core.FS_V1_EVENT, control, os.fsencode(watched), efd)], False)
        assert bad == [errno.EINVAL]
    finally:
        os.close(efd)


def _workspace(tmp_path, name="ws"):
    ws = tmp_path / name
    (ws / "tmp").mkdir(parents=True)
    return ws


def test_a_bare_workspace_is_measured_and_removed_in_one_step(tmp_path):
    ws = _workspace(tmp_path)
    _grow(ws / "tmp")
    blocks = os.lstat(ws / "tmp").st_blocks * 512
    if blocks <= os.lstat(ws).st_blocks * 512:
        pytest.skip("directories here do not grow (tmpfs): the size would prove nothing")
    assert _core.fs_batch([(_core.FS_RM_WORKSPACE, ws, None)], False) == [(blocks,)]
    assert not ws.exists()


def _grow(d) -> None:
    """Make a directory larger than an empty one (ext4's never shrink)."""
    for i in range(300):
        (d / f"a-rather-long-name-for-a-file-{i:04}").write_bytes(b"")
    for f in list(d.iterdir()):
        f.unlink()


@pytest.mark.parametrize(
    ("left", "err"),
    [
        ("a file in tmp", errno.ENOTEMPTY),
        ("a file beside tmp", errno.ENOTEMPTY),
        ("tmp is a file", errno.ENOTEMPTY),
        ("tmp is a link", errno.ENOTEMPTY),
        ("no tmp", errno.ENOENT),
    ],
)
def test_a_workspace_holding_anything_else_is_left_whole(tmp_path, left, err):
    # The program's files go the long way (Monitor._remove_trash), never
    # through a link to somewhere else.
    ws = _workspace(tmp_path)
    elsewhere = _workspace(tmp_path, "elsewhere")
    if left == "a file in tmp":
        (ws / "tmp" / "x").write_bytes(b"x")
    elif left == "a file beside tmp":
        (ws / "x").write_bytes(b"x")
    elif left == "tmp is a file":
        (ws / "tmp").rmdir()
        (ws / "tmp").write_bytes(b"")
    elif left == "tmp is a link":
        (ws / "tmp").rmdir()
        (ws / "tmp").symlink_to(elsewhere / "tmp")
    else:
        (ws / "tmp").rmdir()
    before = sorted(p.name for p in ws.iterdir())
    assert _core.fs_batch([(_core.FS_RM_WORKSPACE, ws, None)], False) == [err]
    assert sorted(p.name for p in ws.iterdir()) == before
    assert (elsewhere / "tmp").is_dir()


def test_a_workspace_path_that_is_a_link_is_not_followed(tmp_path):
    real = _workspace(tmp_path, "real")
    link = tmp_path / "link"
    link.symlink_to(real)
    assert _core.fs_batch([(_core.FS_RM_WORKSPACE, link, None)], False) == [errno.ENOTDIR]
    assert (real / "tmp").is_dir() and link.is_symlink()


def test_an_events_file_opened_for_reading_wakes_a_poller_only_on_change():
    # v2's memory.events and pids.events (Cgroup.arm): kernfs reports a
    # change since the last read, so the open's read is what arms it.  Here
    # cgroup.events, which every v2 cgroup has, changes when one joins.
    import select
    import time

    from sbxlimit._cgroupfs import v2_mount

    mount = v2_mount()
    if mount is None or not os.access(mount, os.W_OK):
        pytest.skip(f"no cgroup2 mount this process may write; {why_not('cgroups')}")
    d = os.path.join(mount, f"sbx-{os.getpid():x}-events")
    os.mkdir(d)
    try:
        ((fd,),) = _core.fs_batch(
            [(_core.FS_OPEN_READ, os.path.join(d, "cgroup.events"), None)], False
        )
        try:
            poller = select.poll()
            poller.register(fd, select.POLLPRI)
            assert poller.poll(50) == []
            pid = os.fork()
            if pid == 0:
                try:
                    with open(os.path.join(d, "cgroup.procs"), "w") as f:
                        f.write("0")
                    time.sleep(0.2)
                finally:
                    os._exit(0)
            try:
                assert poller.poll(5000) != []
            finally:
                os.waitpid(pid, 0)
        finally:
            os.close(fd)
    finally:
        deadline = time.monotonic() + 5
        while True:
            try:
                os.rmdir(d)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)


def test_relative_paths_start_at_the_step_s_directory(tmp_path):
    # Cgroup files are reached from a directory kept open (Cgroup's
    # anchors): every kind of path step resolves from it, "../" included,
    # and nothing resolves from the working directory instead.
    (tmp_path / "anchor").mkdir()
    (tmp_path / "watched").write_bytes(b"")
    (tmp_path / "control").write_bytes(b"")
    (tmp_path / "ws" / "tmp").mkdir(parents=True)
    at = os.open(tmp_path / "anchor", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    efd = os.eventfd(0, os.EFD_CLOEXEC)
    cwd = os.getcwd()
    os.chdir("/")  # a walk from here would find none of these
    try:
        out = _core.fs_batch(
            [
                (MK, "../d", None, -1, at),
                (W, "../control", b"1", -1, at),
                (WO, "../d/absent", b"1", -1, at),
                (R, "../control", None, -1, at),
                (_core.FS_STAT, "../d", None, -1, at),
                (_core.FS_OPEN_READ, "../watched", None, -1, at),
                (_core.FS_V1_EVENT, "../control", b"../watched\0", efd, at),
                (_core.FS_RM_WORKSPACE, "../ws", None, -1, at),
                (RM, "../d", None, -1, at),
                (R, "control", None, -1, at),  # from the anchor: not there
            ],
            False,
        )
        d = os.stat(tmp_path)
        assert out[:4] == [0, 0, 0, b"1"]
        assert type(out[4]) is tuple and out[4][0] == d.st_dev
        assert type(out[5]) is tuple and _target(out[5][0]) == str(tmp_path / "watched")
        os.close(out[5][0])
        assert out[6] == 0 and (tmp_path / "control").read_bytes().split()[0] == str(efd).encode()
        assert type(out[7]) is tuple and not (tmp_path / "ws").exists()
        assert out[8:] == [0, errno.ENOENT] and not (tmp_path / "d").exists()
        # An absolute path ignores the directory, as openat does.
        assert _core.fs_batch([(R, tmp_path / "watched", None, -1, at)], False) == [b""]
    finally:
        os.chdir(cwd)
        os.close(efd)
        os.close(at)


def test_a_path_in_an_anchored_directory_is_reached_from_its_fd(tmp_path):
    # anchors=(dir, fd, rel): a step path in dir is named rel + the rest,
    # from fd, whatever dir names from "/" (here: nothing at all).
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    (real / "sub" / "f").write_bytes(b"anchored")
    (real / "watched").write_bytes(b"")
    (real / "control").write_bytes(b"")
    (tmp_path / "real0").mkdir()
    (tmp_path / "real0" / "f").write_bytes(b"beside")
    (tmp_path / "anchor").mkdir()
    at = os.open(tmp_path / "anchor", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    own = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    efd = os.eventfd(0, os.EFD_CLOEXEC)
    gone = "/nonexistent/real"  # where the steps say the directory is
    anchors = [(gone, at, "../real")]
    try:
        out = _core.fs_batch(
            [
                (R, f"{gone}/sub/f", None),
                (MK, f"{gone}/new", None),
                (R, f"{gone}0/f", None),  # not in it: a name that merely starts alike
                # A step with a directory of its own is left as it is.
                (R, f"{gone}/sub/f", None, -1, own),
                (
                    _core.FS_V1_EVENT,
                    f"{gone}/control",
                    os.fsencode(f"{gone}/watched") + b"\0 7",
                    efd,
                ),
            ],
            False,
            anchors,
        )
        assert out[:4] == [b"anchored", 0, errno.ENOENT, errno.ENOENT]
        assert (real / "new").is_dir()
        assert out[4] == 0 and (real / "control").read_bytes().split()[2] == b"7"
        # A malformed anchor is refused before any step runs; -1 would be
        # the working directory.
        for bad, error in [
            ((gone, "at", "../real"), TypeError),
            ([gone, at, "../real"], TypeError),
            ((gone, -1, "../real"), ValueError),
        ]:
            with pytest.raises(error):
                _core.fs_batch([(MK, tmp_path / "x", None)], False, [bad])
        with pytest.raises(TypeError):
            _core.fs_batch([[MK, tmp_path / "x", None]], False)
        assert not (tmp_path / "x").exists()
    finally:
        os.close(efd)
        os.close(at)
        os.close(own)
