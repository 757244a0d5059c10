"""``sbxlimit run --progress``: the live status line on a real terminal (a
pseudo-terminal), silence anywhere else, and the summary table; real
sandboxes throughout (a cgroup's figures as root, the process-tree
sampler's without one)."""

from __future__ import annotations

import fcntl
import io
import os
import re
import struct
import subprocess
import sys
import termios
import threading
import time
import tty
from collections.abc import Iterator

import pytest

import sbxlimit
from sbxlimit import Limits
from sbxlimit._progress import CLEAR_LINE, Progress, summary

PY = sys.executable
# Holds ~48 MiB, says so, and runs until its stdin closes: the test, not a
# clock, decides when it ends.
HOLDER = (
    "import sys\n"
    "b = bytearray(48 << 20)\n"
    "b[::4096] = b'x' * (len(b) // 4096)\n"
    "print('ready', flush=True)\n"
    "sys.stdin.read()\n"
)
CLEAR = CLEAR_LINE.encode()
# Seconds to wait for something that takes milliseconds: only a broken
# feature (or a stalled machine) reaches it.
PATIENCE = 30.0


class Terminal:
    """A pseudo-terminal: `stream` writes to its terminal side, and what
    arrives is collected from the other side as a terminal would show it."""

    def __init__(self, columns: int = 0) -> None:
        self.master, self.slave = os.openpty()
        tty.setraw(self.slave)  # bytes as written: no \n -> \r\n
        if columns:
            fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
        self.stream = open(self.slave, "w", closefd=False)  # noqa: SIM115 (closed in close())
        self._data = bytearray()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: the terminal side is closed
                return
            if not chunk:
                return
            with self._lock:
                self._data.extend(chunk)

    def seen(self) -> bytes:
        with self._lock:
            return bytes(self._data)

    def wait_for(self, pattern: bytes) -> re.Match[bytes]:
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            m = re.search(pattern, self.seen())
            if m is not None:
                return m
            time.sleep(0.01)
        raise AssertionError(f"{pattern!r} never appeared in {self.seen()[-400:]!r}")

    def close(self) -> bytes:
        """Everything written, once the writer's side is closed; twice is fine."""
        if self.stream.closed:
            return self.seen()
        self.stream.close()
        os.close(self.slave)
        self._reader.join(PATIENCE)
        os.close(self.master)
        return self.seen()


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> Iterator[Terminal]:
    monkeypatch.setenv("TERM", "xterm")
    t = Terminal()
    try:
        yield t
    finally:
        t.close()


def holder(limits: Limits) -> sbxlimit.Popen:
    p = sbxlimit.Popen(
        [PY, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, limits=limits
    )
    assert p.stdout is not None
    assert p.stdout.readline() == b"ready\n"
    return p


def finish(p: sbxlimit.Popen) -> None:
    """End it (it exits when its stdin closes); twice is fine."""
    assert p.stdin is not None and p.stdout is not None
    p.stdin.close()
    try:
        p.wait(PATIENCE)
    finally:
        p.stdout.close()
        p.close()  # kills it if it still runs


def frames(data: bytes) -> list[bytes]:
    """The lines drawn, in order (each one replaces the one before)."""
    assert data.startswith(CLEAR), data[:80]
    return [f for f in data.split(CLEAR) if f]


def test_status_line_on_a_terminal(terminal: Terminal) -> None:
    limits = Limits(memory="256Mi", cpu_time="60s", pids=64)
    p = holder(limits)
    try:
        with Progress(p, terminal.stream, limits=limits, interval=0.05) as progress:
            assert progress.thread is not None and progress.thread.is_alive()
            # A frame that shows the program's 48 MiB, its peak and the limit,
            # its CPU against cpu_time, and its tasks against pids.
            terminal.wait_for(
                rb"mem (4[89]|[5-9]\d|1\d\d)\.?\d* MiB \(peak [\d.]+ MiB / 256 MiB\)"
                rb"  cpu [\d.]+ m?s \(\d+% of 60 s\)  tasks [1-9]\d* / 64"
            )
            finish(p)  # it ends while the line is drawn, as under the CLI
    finally:
        finish(p)
    assert not progress.thread.is_alive()
    data = terminal.close()
    # Drawn in place: every frame starts with the erase, none scrolls, and
    # the last thing written is the erase that leaves the line empty.
    assert data.endswith(CLEAR)
    assert b"\n" not in data
    assert all(f.startswith(b"sbxlimit: ") for f in frames(data))


def test_the_line_fits_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    # A line wider than the terminal would wrap, and the carriage return
    # would then redraw only its last row: each frame is clipped.
    monkeypatch.setenv("TERM", "xterm")
    terminal = Terminal(columns=40)
    limits = Limits(memory="256Mi", cpu_time="60s", pids=64, wall_time="10m")
    try:
        p = holder(limits)
        try:
            with Progress(p, terminal.stream, limits=limits, interval=0.05):
                terminal.wait_for(rb"sbxlimit: ")
        finally:
            finish(p)
    finally:
        data = terminal.close()
    assert frames(data) and all(len(f) <= 39 for f in frames(data)), frames(data)


def test_leaving_the_context_does_not_wait_for_the_next_frame(terminal: Terminal) -> None:
    # An hour between frames: leaving must wake the thread, not sleep it out.
    p = holder(Limits(memory="256Mi"))
    try:
        with Progress(p, terminal.stream, limits=p.limits, interval=3600) as progress:
            terminal.wait_for(rb"mem ")
    finally:
        finish(p)
    assert progress.thread is not None and not progress.thread.is_alive()
    assert terminal.close().endswith(CLEAR)


# In a session of its own whose controlling terminal is argv[1], with the
# terminal handed to another job when argv[2] is "background" (as after
# `sbxlimit run --progress ... &`): draw frames while a sandbox runs.
JOB = """
import fcntl, os, signal, subprocess, sys, termios, threading
from sbxlimit import Limits, Popen
from sbxlimit._progress import Progress
fd = int(sys.argv[1])
fcntl.ioctl(fd, termios.TIOCSCTTY, 0)
signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # only the check may hold a write back
other = subprocess.Popen(["sleep", "60"], process_group=0)
if sys.argv[2] == "background":
    os.tcsetpgrp(fd, other.pid)
stream = open(fd, "w", closefd=False)
p = Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
          limits=Limits(memory="256Mi"))
frames, enough = [0], threading.Event()
usage = p.usage
def counted():
    frames[0] += 1
    if frames[0] >= 5:
        enough.set()
    return usage()
p.usage = counted
with Progress(p, stream, limits=p.limits, interval=0.01):
    enough.wait(30)
    p.stdin.close()
    p.wait()
p.close()
other.kill()
other.wait()
print(frames[0] >= 5)
"""


@pytest.mark.parametrize("job", ["foreground", "background"])
def test_a_background_job_draws_nothing(monkeypatch: pytest.MonkeyPatch, job: str) -> None:
    monkeypatch.setenv("TERM", "xterm")
    terminal = Terminal()
    root = os.path.dirname(os.path.dirname(os.path.abspath(sbxlimit.__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    try:
        r = subprocess.run(
            [PY, "-c", JOB, str(terminal.slave), job],
            pass_fds=[terminal.slave],
            start_new_session=True,
            capture_output=True,
            env=env,
            timeout=120,
        )
    finally:
        data = terminal.close()
    assert r.stdout == b"True\n", r.stderr.decode()
    if job == "background":
        assert data == b""
    else:
        assert b"mem " in data and data.endswith(CLEAR)


@pytest.mark.parametrize("kind", ["stringio", "pipe", "dumb terminal"])
def test_nothing_anywhere_but_a_terminal(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    monkeypatch.setenv("TERM", "dumb" if kind == "dumb terminal" else "xterm")
    r = -1
    terminal = None
    if kind == "stringio":
        stream: io.TextIOBase = io.StringIO()
    elif kind == "pipe":
        r, w = os.pipe()
        os.set_blocking(r, False)
        stream = open(w, "w")  # noqa: SIM115 (closed below)
    else:
        terminal = Terminal()
        stream = terminal.stream  # type: ignore[assignment]
    try:
        p = holder(Limits(memory="256Mi"))
        threads = threading.active_count()
        try:
            with Progress(p, stream, limits=p.limits, interval=0.01) as progress:  # type: ignore[arg-type]
                assert not progress.active and progress.thread is None
                assert threading.active_count() == threads
                time.sleep(0.3)  # room for many frames, had any been drawn
        finally:
            finish(p)
        if kind == "stringio":
            assert stream.getvalue() == ""  # type: ignore[attr-defined]
        elif kind == "pipe":
            stream.close()
            assert os.read(r, 4096) == b""
        else:
            assert terminal is not None and terminal.close() == b""
    finally:
        if terminal is not None:
            terminal.close()
        stream.close()
        if r >= 0:
            os.close(r)


def test_a_failing_usage_skips_frames_and_never_escapes(
    terminal: Terminal, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As when a sandbox ends between two frames: its counters go away.
    escaped: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda a: escaped.append(a.exc_value))
    p = holder(Limits(memory="256Mi"))
    calls = threading.Event()

    def gone() -> sbxlimit.Usage:
        calls.set()
        raise FileNotFoundError("memory.usage_in_bytes")

    p.usage = gone  # type: ignore[method-assign]
    try:
        with Progress(p, terminal.stream, limits=p.limits, interval=0.01) as progress:
            assert calls.wait(PATIENCE)
            assert progress.thread is not None and progress.thread.is_alive()
    finally:
        finish(p)
    assert not progress.thread.is_alive() and escaped == []
    assert terminal.close() == b""  # nothing drawn, so nothing to erase


def test_summary_of_a_memory_kill() -> None:
    limits = Limits(memory="64Mi", pids=64)
    # Four processes of 40 MiB: each fits its own RLIMIT_DATA, the tree does
    # not, so the verdict is "memory" with a cgroup (its OOM kill) and
    # without one (the watchdog), never a MemoryError's exit status.
    code = (
        "import os, time\n"
        "os.fork(); os.fork()\n"
        "hog = bytearray(40 << 20)\n"
        "hog[::4096] = b'x' * (len(hog) // 4096)\n"
        "time.sleep(30)\n"
    )
    p = sbxlimit.Popen([PY, "-c", code], stderr=subprocess.DEVNULL, limits=limits)
    p.wait()
    p.close()
    assert p.termination is not None and p.termination.reason == "memory"
    text = summary(p, limits)
    rows = {line.split("  ")[1].strip(): line for line in text.splitlines()[2:-1]}
    assert set(rows) >= {"wall", "cpu", "memory peak", "tasks peak"}, text
    # The memory row: the peak, the limit beside it, and that it ended it.
    assert re.search(r"MiB  64\.0 MiB  <- ended it$", rows["memory peak"]), text
    assert rows["tasks peak"].split()[-1] == "64"
    assert [r for r in rows.values() if "<- ended it" in r] == [rows["memory peak"]]
    assert text.splitlines()[0] == f"sbxlimit: summary of `{os.path.basename(PY)}`"
    assert text.splitlines()[-1].startswith("  ended: memory limit (")


def test_summary_of_a_clean_exit() -> None:
    p = sbxlimit.Popen([PY, "-c", "pass"], limits=Limits(disk="16Mi"))
    p.wait()
    p.close()
    text = summary(p, p.limits)
    assert text.endswith(".\n") and not text.endswith("\n\n")  # whole lines, ready to write
    assert "<- ended it" not in text
    assert re.search(r"^  disk +\S+ \S*B  16\.0 MiB$", text, re.M), text
    assert text.splitlines()[-1] == f"  ended: {p.termination.message}"  # type: ignore[union-attr]


def test_the_cli_draws_on_a_terminal_and_says_nothing_elsewhere(monkeypatch):
    # The real command line, its stderr a terminal: a live line, then the table.
    monkeypatch.setenv("TERM", "xterm")
    t = Terminal()
    try:
        cmd = [PY, "-m", "sbxlimit", "run", "--progress", "--memory", "256Mi", "--", PY, "-c"]
        p = subprocess.Popen(
            [*cmd, HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=t.slave
        )
        assert p.stdout is not None and p.stdin is not None
        assert p.stdout.readline() == b"ready\n"
        t.wait_for(rb"mem [0-9.]+ MiB \(peak [0-9.]+ MiB / 256 MiB\)")
        p.stdin.close()
        assert p.wait(PATIENCE) == 0
        p.stdout.close()
    finally:
        seen = t.close()
    assert b"summary of" in seen and b"ended:" in seen
    # Not a terminal: exactly as without the flag.
    r = subprocess.run(
        [*cmd, "print('hi')"], capture_output=True, timeout=PATIENCE, env={**os.environ}
    )
    assert r.returncode == 0 and r.stdout == b"hi\n" and r.stderr == b""
