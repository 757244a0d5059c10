"""_core.fs_batch: the supervisor's directory work and the cgroup figures in
one call (the GIL released once)."""

from __future__ import annotations

import errno
import os

import pytest

from sbxlimit import _core

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
