"""Audit events (SPEC section 8): what sbxlimit did, for logs and monitors.

Every spawn, exit, limit hit, forced kill, resource warning, degradation,
Gate denial and Quota denial is an :class:`Event`, delivered to

* the ``sbxlimit.audit`` logger, at INFO, with the event's fields in
  ``extra={"sbx_event": {...}}`` (enable it with
  ``logging.getLogger("sbxlimit.audit").setLevel(logging.INFO)`` and a
  handler), and
* every callback registered with :func:`subscribe` (called in the thread
  that produced the event: the caller's, or the supervisor's for watchdog
  kills; a callback that raises is logged and skipped).

Events never carry argv beyond the program's name, environment values or
program output: they are built from fixed fields only, and the program is
named by its basename.  Nothing is built when nobody listens.

    import sbxlimit.audit
    sbxlimit.audit.subscribe(lambda e: print(e.name, e.sandbox_id, e.limit))
    with open("audit.jsonl", "a") as f:
        unsubscribe = sbxlimit.audit.subscribe(sbxlimit.audit.JsonLinesSink(f))
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import IO, Any

__all__ = ["EVENT_NAMES", "Event", "JsonLinesSink", "active", "emit", "subscribe"]

EVENT_NAMES = (
    "spawn",
    "exit",
    "limit_exceeded",
    "killed",
    "resource_warning",
    "degraded",
    "gate_denied",
    "quota_denied",
    "net_allowed",
    "net_denied",
)
logger = logging.getLogger("sbxlimit.audit")
# A library's logger: silent unless the application configures logging.
logger.addHandler(logging.NullHandler())


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    """One audit event.

    name: one of EVENT_NAMES.  time: seconds since the epoch.
    sandbox_id: the sandbox's id (None for Gate events).  key: the Gate or
    Quota key, or the sandbox's ``audit_key``.  limit / observed: the
    field's limit and the amount seen (bytes, seconds, count, or the rate
    text).  mechanism: what held or enforced it.  program: the program's
    name only.  field: which limit or protection (``"memory"``).  detail: a
    short fixed text (a reason code, never program data).  host / port:
    the destination a ``net_allowed`` / ``net_denied`` connection named
    (never a URL, path, query or header); observed is then its bytes.
    memory_peak / cpu_time / wall_time: on ``exit``, what the sandbox used
    (bytes; CPU seconds, user + system; seconds), None when not measured.
    """

    name: str
    time: float
    sandbox_id: str | None = None
    key: str | None = None
    field: str | None = None
    limit: Any = None
    observed: Any = None
    mechanism: str | None = None
    program: str | None = None
    detail: str | None = None
    host: str | None = None
    port: int | None = None
    memory_peak: int | None = None
    cpu_time: float | None = None
    wall_time: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


_subscribers: list[Callable[[Event], None]] = []
_lock = threading.Lock()


def subscribe(callback: Callable[[Event], None]) -> Callable[[], None]:
    """Call `callback(event)` for every event; returns the unsubscribe
    function."""
    if not callable(callback):
        raise TypeError("callback must be callable")
    with _lock:
        _subscribers.append(callback)

    def unsubscribe() -> None:
        with _lock:
            try:
                _subscribers.remove(callback)
            except ValueError:
                pass

    return unsubscribe


def active() -> bool:
    """True when an event would reach anyone: producers check this first."""
    return bool(_subscribers) or logger.isEnabledFor(logging.INFO)


def emit(name: str, **fields: Any) -> None:
    """Build and deliver one event (only when someone listens)."""
    if not active():
        return
    if name not in EVENT_NAMES:
        raise ValueError(f"unknown audit event {name!r}")
    event = Event(name, time.time(), **fields)
    if logger.isEnabledFor(logging.INFO):
        what = " ".join(
            f"{k}={v}" for k, v in event.to_dict().items() if v is not None and k != "name"
        )
        logger.info("%s %s", name, what, extra={"sbx_event": event.to_dict()})
    for cb in list(_subscribers):
        try:
            cb(event)
        except Exception:
            logger.exception("sbxlimit.audit: a subscriber failed")


class JsonLinesSink:
    """A subscriber that writes each event as one JSON line to a file (a
    path, opened for appending, or an open text file), flushed per event."""

    def __init__(self, target: str | IO[str]) -> None:
        self._own = isinstance(target, str)
        self._file: IO[str] = open(target, "a") if isinstance(target, str) else target  # noqa: SIM115
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        line = json.dumps(event.to_dict(), default=str, sort_keys=True)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._own:
            self._file.close()
