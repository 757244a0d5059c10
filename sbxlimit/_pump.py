"""Output pumps: a capped stream's bytes go child -> pump -> destination,
so the cap holds however the caller reads (``communicate``,
``proc.stdout``, a pipeline, the terminal).  A pump lives in the
supervisor's selector (``_monitor``); past the cap it truncates, or asks
the supervisor to end the sandbox with reason ``output``.
"""

from __future__ import annotations

import os
import select
import selectors
import threading
from typing import TYPE_CHECKING

from . import audit
from ._evidence import KillRecord

if TYPE_CHECKING:
    from ._monitor import Monitor, Watch

__all__ = ["Pump", "fd_ident"]

_PIPE_BUF = 4096
_MARK = b"\n[sbxlimit: output truncated at %d bytes]\n"


def fd_ident(fd: int) -> tuple[int, int]:
    """(device, inode): what an fd number means now."""
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino)


def _writable(fd: int) -> bool:
    p = select.poll()
    p.register(fd, select.POLLOUT)
    return bool(p.poll(0))


def _utf8_cut(data: bytes) -> bytes:
    """Drop a UTF-8 sequence left incomplete at the end of `data`, so that a
    text-mode reader does not fail to decode the cut."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b < 0x80:
            return data
        if b >= 0xC0:
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return data[:-back] if back < need else data
    return data


class Pump:
    """Passes one output stream of a sandbox on, counting, up to its cap.

    `src` is the read end of the pipe the child writes to; `dst` is ours
    (a dup): non-blocking when we own the pipe behind it, otherwise written
    a PIPE_BUF at a time when the selector says it is writable, or with
    plain blocking writes for files.
    """

    def __init__(
        self,
        monitor: Monitor,
        watch: Watch | None,
        src: int,
        dst: int,
        *,
        owned_dst: bool,
        cap: int,
        truncate: bool,
        stream: str,
        warn_at: float | None = None,
    ) -> None:
        self.monitor = monitor
        self.watch = watch
        self.src = src
        self.dst = dst
        self.cap = cap
        # Bytes past which one resource_warning audit event is emitted.
        self.warn = int(cap * warn_at) if warn_at is not None else None
        self.truncate = truncate
        self.stream = stream
        self.count = 0  # bytes the program wrote
        self.passed = 0  # bytes passed on
        self.pending = bytearray()
        # An incomplete UTF-8 sequence at the end of what was passed on: held
        # until the next read completes it (or the stream ends), so that a
        # cut between two writes cannot leave half a character behind.
        self.held = b""
        self.discarding = False
        self.close_after_flush = False
        self.src_eof = False
        self.mode = "nonblock" if owned_dst else "poll"
        self.sel: selectors.BaseSelector | None = None
        self.src_on = False
        self.dst_on = False
        self.done = threading.Event()  # set once both ends are closed
        # Identities, so that a forked child closes these fds only if the
        # numbers still mean them (see Monitor.close_in_child).
        self.idents = {src: fd_ident(src), dst: fd_ident(dst)}
        os.set_blocking(src, False)
        if owned_dst:
            os.set_blocking(dst, False)

    def discard(self) -> None:
        """Before attach: the spawn failed; release the fds."""
        for fd in (self.src, self.dst):
            if fd >= 0:
                os.close(fd)
        self.src = self.dst = -1
        self.done.set()

    # -- monitor thread only ---------------------------------------------

    def attach(self, sel: selectors.BaseSelector) -> None:
        self.sel = sel
        self._watch_src(True)

    def on_event(self, fd: int) -> None:
        if fd == self.src:
            self._read()
        elif fd == self.dst:
            self._flush()

    def _watch_src(self, on: bool) -> None:
        if self.sel is None or self.src < 0 or on == self.src_on:
            return
        if on:
            self.sel.register(self.src, selectors.EVENT_READ, self)
        else:
            self.sel.unregister(self.src)
        self.src_on = on

    def _watch_dst(self, on: bool) -> bool:
        if self.sel is None or self.dst < 0 or on == self.dst_on:
            return True
        if on:
            try:
                self.sel.register(self.dst, selectors.EVENT_WRITE, self)
            except (OSError, ValueError):
                return False  # a file or /dev/null: cannot be polled
        else:
            self.sel.unregister(self.dst)
        self.dst_on = on
        return True

    def _close_src(self) -> None:
        self._watch_src(False)
        if self.src >= 0:
            os.close(self.src)
            self.src = -1

    def _close_dst(self) -> None:
        self._watch_dst(False)
        if self.dst >= 0:
            os.close(self.dst)
            self.dst = -1

    def close(self) -> None:
        self._close_src()
        self._close_dst()
        self.monitor._pump_done(self)
        self.done.set()

    def _read(self) -> None:
        try:
            data = os.read(self.src, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.src_eof = True
            self._close_src()
            self.pending += self.held  # the stream ends as the program wrote it
            self.held = b""
            self._flush()
            return
        self.count += len(data)
        if self.warn is not None and self.count >= self.warn and self.watch is not None:
            self.warn = None  # once
            audit.emit(
                "resource_warning",
                field="output",
                limit=self.cap,
                observed=self.count,
                mechanism="supervisor:output",
                detail=self.stream,
                **(self.watch.audit or {}),
            )
        if self.discarding:
            return
        room = self.cap - self.passed
        if len(data) <= room:
            whole = self.held + data
            done = _utf8_cut(whole)
            self.pending += done
            self.held = whole[len(done) :]
            self.passed += len(data)
        else:
            keep = _utf8_cut(self.held + data[:room])
            self.pending += keep
            self.passed += len(keep) - len(self.held)
            self.held = b""
            self.discarding = True
            self.close_after_flush = True
            assert self.watch is not None
            self.watch.hits.add("output")
            if self.truncate:
                self.pending += _MARK % self.cap
            else:
                self.monitor.limit_kill(
                    self.watch,
                    KillRecord("output", self.cap, self.count, "supervisor:output", self.stream),
                )
        self._flush()

    def _flush(self) -> None:
        while self.pending and self.dst >= 0:
            if self.mode == "poll" and not _writable(self.dst):
                if self._watch_dst(True):
                    break
                self.mode = "file"  # cannot be polled: write blocking
            chunk = self.pending if self.mode != "poll" else self.pending[:_PIPE_BUF]
            try:
                n = os.write(self.dst, chunk)
            except BlockingIOError:
                break
            except OSError:
                # Nobody reads any more: behave like a pipe without a reader
                # (the program's next write fails with EPIPE).
                self.pending.clear()
                self.close()
                return
            del self.pending[:n]
        if self.pending:
            self._watch_dst(True)
            self._watch_src(False)  # back-pressure, as a full pipe would
            return
        self._watch_dst(False)
        if self.src_eof or self.close_after_flush:
            self._close_dst()
        if self.src_eof:
            self.close()
        elif self.src >= 0:
            self._watch_src(True)
