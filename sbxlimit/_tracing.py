"""The hook ``sbxlimit.run()`` and ``sbxlimit.asyncio.run()`` call for a
span around each run: None unless :func:`sbxlimit.otel.instrument` set it,
so an uninstrumented run pays one attribute lookup.  No dependency here:
the OpenTelemetry side lives in ``sbxlimit.otel``."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

__all__ = ["RunSpan", "hook"]


class RunSpan(Protocol):
    """One run's span, open while the run lasts."""

    def spawned(self, process: Any) -> None:
        """The run's Popen exists: the span reads its verdict at the end."""


# A new RunSpan context per run; set and cleared by sbxlimit.otel only.
hook: Callable[[], AbstractContextManager[RunSpan]] | None = None
