"""``sbxlimit run --progress``: one live status line while a sandbox runs,
and a table of the final figures beside the limits when it ends.

Both are for people at a terminal: ``Progress`` draws only on a stream that
is a TTY (and not ``TERM=dumb``), and does nothing at all otherwise (no
thread, no byte written), so that logs and pipes stay clean.  The figures
are ``Popen.usage()``'s; nothing here reaches into the sandbox.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, TextIO

from ._units import format_bytes, format_seconds

if TYPE_CHECKING:
    from ._evidence import Usage
    from ._limits import Limits
    from ._popen import Popen
    from ._termination import Termination

__all__ = ["CLEAR_LINE", "Progress", "drawable", "status_line", "summary"]

# Back to column 0, then erase to the end of the line: each frame replaces
# the last one in place, and the last erase leaves the line empty.
CLEAR_LINE = "\r\x1b[K"
# usage() walks the workspace when no tmpfs holds it: however long that
# takes, the line's sampling stays under ~1/_MAX_SHARE of the CLI's time.
_MAX_SHARE = 10
# How long leaving the context waits for a frame still being measured; the
# line is erased before that, and nothing is drawn after it either way.
_JOIN_TIMEOUT = 1.0
_SIGNALS = frozenset(int(s) for s in signal.Signals)


def drawable(stream: TextIO) -> bool:
    """True when `stream` is a terminal that can redraw a line in place."""
    if os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):  # closed, or no isatty at all
        return False


def _of(used: str, limit: str | None) -> str:
    return f"{used} / {limit}" if limit is not None else used


def status_line(usage: Usage, limits: Limits | None) -> str:
    """One frame: elapsed time, memory, CPU, tasks (and disk if measured),
    each against its limit when one is set."""
    lim = limits
    wall_limit = lim.wall_time if lim is not None else None
    parts = [
        "sbxlimit: "
        + _of(
            format_seconds(usage.wall),
            format_seconds(wall_limit) if wall_limit is not None else None,
        )
    ]
    if usage.memory_now is not None:
        mem = f"mem {format_bytes(usage.memory_now)}"
        peak = []
        if usage.memory_peak is not None:
            peak.append(f"peak {format_bytes(usage.memory_peak)}")
        if lim is not None and lim.memory is not None:
            peak.append(format_bytes(lim.memory))
        parts.append(f"{mem} ({' / '.join(peak)})" if peak else mem)
    cpu = usage.cpu_total
    if cpu is not None:
        text = f"cpu {format_seconds(cpu)}"
        if lim is not None and lim.cpu_time is not None:
            text += f" ({100 * cpu / lim.cpu_time:.0f}% of {format_seconds(lim.cpu_time)})"
        parts.append(text)
    if usage.pids_now is not None:
        pids = lim.pids if lim is not None else None
        parts.append("tasks " + _of(str(usage.pids_now), str(pids) if pids is not None else None))
    if usage.disk is not None:
        disk = lim.disk if lim is not None else None
        parts.append(
            "disk "
            + _of(format_bytes(usage.disk), format_bytes(disk) if disk is not None else None)
        )
    return "  ".join(parts)


class Progress:
    """A status line on `stream` (stderr) while `proc` runs, redrawn every
    `interval` seconds; a context manager.

    On anything but a terminal it does nothing.  On a terminal, a daemon
    thread redraws one line in place (no scrolling, clipped to the width)
    and leaving the context erases it, so that what follows (the program's
    last words, the CLI's messages, the summary) starts on a clean line.
    A sandbox that ends between two frames, or a usage() that fails, only
    skips a frame: the line never stops the CLI, nor holds its exit.
    """

    def __init__(
        self,
        proc: Popen,
        stream: TextIO,
        *,
        limits: Limits | None,
        interval: float = 0.5,
    ) -> None:
        self.proc = proc
        self.stream = stream
        self.limits = limits if limits is not None else proc.limits
        self.interval = interval
        self.active = drawable(stream)
        self.thread: threading.Thread | None = None
        self._stop = threading.Event()
        # Held around every write, so that the erase at exit is the last.
        self._lock = threading.Lock()
        self._closed = False
        self._drawn = False
        # Whose turn the terminal may be: ours, or the sandbox's group's
        # (the CLI hands the terminal to it while it runs).
        self._groups = {os.getpgrp()}
        try:
            self._groups.add(os.getpgid(proc.pid))
        except (OSError, TypeError):
            pass

    def __enter__(self) -> Progress:
        if self.active:
            self.thread = threading.Thread(target=self._loop, name="sbxlimit-progress", daemon=True)
            self.thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop drawing and erase the line; safe to call twice."""
        self._stop.set()
        # A write blocked on a stopped terminal (Ctrl-S) holds the lock: do
        # not wait for it forever, only skip the erase.
        if self._lock.acquire(timeout=_JOIN_TIMEOUT):
            try:
                if self._drawn and not self._closed:
                    self._write(CLEAR_LINE)
                self._closed = True
            finally:
                self._lock.release()
        else:
            self._closed = True
        t = self.thread
        if t is not None:
            # A frame still inside usage() writes nothing once closed: a
            # slow one is left to finish on its own (the thread is a daemon).
            t.join(_JOIN_TIMEOUT)

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            line = self._frame()
            if line is not None:
                self._draw(line)
            # Pace by what a frame costs, and wake at once on close().
            delay = max(self.interval, (time.monotonic() - t0) * _MAX_SHARE)
            if self._stop.wait(delay):
                return

    def _frame(self) -> str | None:
        if self.proc.returncode is not None:
            return None  # over: the final figures are the summary's
        try:
            return status_line(self.proc.usage(), self.limits)
        except Exception:
            # Normal when the sandbox ends mid-read (its cgroup or /proc
            # entries go); the next frame, if any, tries again.
            return None

    def _draw(self, line: str) -> None:
        try:
            fd = self.stream.fileno()
            width = os.get_terminal_size(fd).columns
        except (OSError, ValueError, AttributeError):
            fd, width = -1, 80
        if fd >= 0 and _background(fd, self._groups):
            return
        # A line longer than the terminal wraps, and the carriage return
        # would then redraw only its last row: clip, leaving the last column.
        if width > 1:
            line = line[: width - 1]
        with self._lock:
            if self._closed:
                return
            self._drawn = True
            self._write(CLEAR_LINE + line)

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            # The terminal went (EIO after a hang-up) or was closed: stop
            # drawing, quietly.
            self._stop.set()
            self._closed = True


def _background(fd: int, groups: set[int]) -> bool:
    """True when `fd` is our controlling terminal and another job has it
    (``sbxlimit run --progress ... &``): a line drawn now would land on the
    shell's prompt."""
    try:
        return os.tcgetpgrp(fd) not in groups
    except OSError:  # not our controlling terminal: no job of ours to spoil
        return False


def _row_bytes(used: int | None, limit: int | None) -> tuple[str, str]:
    return (
        format_bytes(used) if used is not None else "-",
        format_bytes(limit) if limit is not None else "-",
    )


def _row_seconds(used: float | None, limit: float | None) -> tuple[str, str]:
    return (
        format_seconds(used) if used is not None else "-",
        format_seconds(limit) if limit is not None else "-",
    )


def _ending(t: Termination | None) -> str:
    if t is None:
        return "still running"
    if t.is_limit:
        # Its full message is on stderr already (the CLI prints it).
        how = f", {signal.Signals(t.signal).name}" if t.signal in _SIGNALS else ""
        return f"{t.reason} limit ({t.mechanism or 'unknown mechanism'}{how})"
    return t.message


def summary(proc: Popen, limits: Limits | None) -> str:
    """The final figures beside the limits, as aligned text, and how the
    sandbox ended: whole lines, the last one ended too (for
    ``stream.write``, or ``print(..., end="")``)."""
    lim = limits if limits is not None else proc.limits
    u = proc.usage()
    t = proc.termination
    rows: list[tuple[str, str, str]] = [
        ("wall", *_row_seconds(u.wall, lim.wall_time if lim else None)),
        ("cpu", *_row_seconds(u.cpu_total, lim.cpu_time if lim else None)),
        ("memory peak", *_row_bytes(u.memory_peak, lim.memory if lim else None)),
        (
            "tasks peak",
            str(u.pids_peak) if u.pids_peak is not None else "-",
            str(lim.pids) if lim is not None and lim.pids is not None else "-",
        ),
    ]
    if u.disk is not None or (lim is not None and lim.disk is not None):
        rows.append(("disk", *_row_bytes(u.disk, lim.disk if lim else None)))
    if lim is not None and lim.output is not None:
        # Usage does not count output: only an output kill says how much.
        seen = t.observed if t is not None and t.reason == "output" else None
        rows.append(("output", *_row_bytes(int(seen) if seen is not None else None, lim.output)))
    if u.throttled_seconds:
        rows.append(("cpu throttled", format_seconds(u.throttled_seconds), "-"))
    head = ("", "used", "limit")
    w0 = max(len(r[0]) for r in [head, *rows])
    w1 = max(len(r[1]) for r in [head, *rows])
    lines = [f"  {a:<{w0}}  {b:>{w1}}  {c}".rstrip() for a, b, c in [head, *rows]]
    marked = {t.reason} if t is not None and t.is_limit else set()
    names = {"memory peak": "memory", "tasks peak": "pids", "cpu": "cpu_time", "wall": "wall_time"}
    for i, (name, _u, _l) in enumerate(rows, start=1):
        if names.get(name, name) in marked:
            lines[i] += "  <- ended it"
    name = proc.program
    program = f"`{name}`" if name and name != "the program" else "the program"
    lines = [f"sbxlimit: summary of {program}", *lines, f"  ended: {_ending(t)}"]
    return "".join(line + "\n" for line in lines)
