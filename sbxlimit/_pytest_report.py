"""The pytest plugin's --sbxlimit-report: a usage row per sandbox, and the heaviest at the end.

Rows are plain data, made where a sandbox ends (:func:`record`) and carried
on the test's reports, so that pytest-xdist brings a worker's rows to the
controller, where :class:`UsageReport` collects them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ._evidence import Usage
    from ._termination import Termination

REPORT_ROWS = 10


def record(
    nodeid: str,
    what: str,
    usage: Usage,
    term: Termination | None,
    rss_baseline: int = 0,
    end: str | None = None,
) -> dict[str, Any]:
    """A row for --sbxlimit-report (plain data: xdist sends it over).
    `rss_baseline`: what a forked body shared with its parent (the rlimit
    path measures it as the body's); `end`: the reason, if not the
    termination's (a MemoryError under RLIMIT_DATA is a memory hit)."""
    peak = usage.memory_peak
    if peak is not None and rss_baseline:
        peak = max(0, peak - rss_baseline)
    return {
        "nodeid": nodeid,
        "what": what,
        "memory_peak": peak,
        "cpu": usage.cpu_total,
        "wall": usage.wall,
        "end": end or (term.reason if term is not None else "running"),
    }


class UsageReport:
    """Collects the rows reports carry (from xdist workers too) and prints
    the heaviest at the end."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.rows.extend(getattr(report, "sbxlimit_usage", ()))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        from ._termination import LIMIT_REASONS
        from ._units import format_bytes

        tr = terminalreporter
        tr.write_sep("=", "sbxlimit: heaviest sandboxes")
        if not self.rows:
            tr.write_line("no test ran under @pytest.mark.sbxlimit or the sbx fixture")
            return

        def weight(row: Mapping[str, Any]) -> tuple[float, float]:
            return (row["memory_peak"] or -1, row["cpu"] or -1)

        rows = sorted(self.rows, key=weight, reverse=True)[:REPORT_ROWS]
        tr.write_line(f"{'peak memory':>12} {'cpu':>8} {'wall':>8}  {'end':<10} test")
        for row in rows:
            mem = format_bytes(row["memory_peak"]) if row["memory_peak"] is not None else "-"
            cpu = f"{row['cpu']:.2f}s" if row["cpu"] is not None else "-"
            tr.write_line(
                f"{mem:>12} {cpu:>8} {row['wall']:>7.2f}s  {row['end']:<10} "
                f"{row['nodeid']} ({row['what']})"
            )
        tests = len({row["nodeid"] for row in self.rows})
        hits = sum(1 for row in self.rows if row["end"] in LIMIT_REASONS)
        tr.write_line(
            f"{len(self.rows)} sandboxes in {tests} tests; {hits} ended by a limit"
            + (f"; the {REPORT_ROWS} heaviest shown" if len(self.rows) > REPORT_ROWS else "")
        )
