"""The pytest plugin's ``sbx`` fixture: :class:`Sandboxes`, and the end of what a test started.

A sandbox started with ``sbx.popen()`` that is still running when the test
body returns fails the test; at teardown every tree is killed.  The usage of
each sandbox becomes a row of --sbxlimit-report, carried on the call or
teardown report.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pytest

from ._pytest_report import record
from ._pytest_settings import settings

if TYPE_CHECKING:
    from ._limits import Limits
    from ._policy import Policy
    from ._popen import Popen
    from ._run import SandboxResult

__all__ = ["Sandboxes"]


class Sandboxes:
    """The ``sbx`` fixture: sandboxes for one test, with its defaults.

    ``run()`` and ``popen()`` take the arguments of :func:`sbxlimit.run` and
    :class:`sbxlimit.Popen`; any :class:`~sbxlimit.Limits` or
    :class:`~sbxlimit.Policy` field may also be given as a keyword
    (``memory="64Mi"``, ``network="deny"``) and overrides the test's
    defaults (``sbxlimit_defaults``, ``$SBXLIMIT_DEFAULTS``,
    ``--sbxlimit-defaults``, ``@pytest.mark.sbxlimit``) for that call;
    ``limits=`` and ``policy=`` (objects or dicts) set several at once.
    ``env`` is subprocess's environment; Policy's ``env`` goes in ``policy=``.

    When the test body returns, a sandbox it started that is still running
    fails the test (pid and program name) and is killed; at teardown every
    tree is killed and what a fixture left running is reported the same way.
    """

    def __init__(self, nodeid: str, values: Mapping[str, Any], sources: Iterable[str]) -> None:
        from ._settings import build

        self.nodeid = nodeid
        self._values = dict(values)
        self._sources = list(sources)
        self._limits, self._policy = build(self._values)
        # (process, phase that started it, pid of the process that started it)
        self._started: list[tuple[Popen, str, int]] = []
        self._records: list[dict[str, Any]] = []
        self._reported = 0
        self._phase = "setup"

    def __repr__(self) -> str:
        return (
            f"<Sandboxes {self.nodeid}: limits={self._limits!r}, policy={self._policy!r}, "
            f"{len(self.processes)} started>"
        )

    @property
    def limits(self) -> Limits | None:
        """The test's default limits (None: no field set)."""
        return self._limits

    @property
    def policy(self) -> Policy | None:
        """The test's default policy (None: no field set)."""
        return self._policy

    @property
    def processes(self) -> list[Popen]:
        """The sandboxes ``popen()`` started in this process, oldest first."""
        me = os.getpid()
        return [p for p, _phase, pid in self._started if pid == me]

    def _split(self, kwargs: dict[str, Any]) -> tuple[Limits | None, Policy | None]:
        """Take the limit and policy keywords out of `kwargs`; what is left
        is for run() or Popen."""
        from ._settings import LIMIT_FIELDS, POLICY_FIELDS, build, object_fields

        values = dict(self._values)
        values.update(object_fields(kwargs.pop("limits", None), "limits"))
        values.update(object_fields(kwargs.pop("policy", None), "policy"))
        for key in list(kwargs):
            if key in LIMIT_FIELDS or (key in POLICY_FIELDS and key != "env"):
                values[key] = kwargs.pop(key)
        return build(values)

    def run(self, args: Any, **kwargs: Any) -> SandboxResult:
        """:func:`sbxlimit.run` with this test's defaults."""
        from ._run import run
        from ._termination import program_name

        limits, policy = self._split(kwargs)
        result = run(args, limits=limits, policy=policy, **kwargs)
        shell, exe = kwargs.get("shell", False), kwargs.get("executable")
        what = program_name(result.args, shell=shell, executable=exe)
        self._records.append(record(self.nodeid, what, result.usage, result.termination))
        return result

    def popen(self, args: Any, **kwargs: Any) -> Popen:
        """:class:`sbxlimit.Popen` with this test's defaults; wait for it (or
        use it in a with-block) before the test returns."""
        from ._popen import Popen

        limits, policy = self._split(kwargs)
        p = Popen(args, limits=limits, policy=policy, **kwargs)
        self._started.append((p, self._phase, os.getpid()))
        return p

    def _end(self, phase: str | None) -> str:
        """Kill and close the sandboxes started here (in `phase`, or all);
        a message naming those that were still running, or ''."""
        me = os.getpid()
        keep: list[tuple[Popen, str, int]] = []
        leaked: list[str] = []
        for entry in self._started:
            p, started_in, pid = entry
            if pid != me or (phase is not None and started_in != phase):
                keep.append(entry)
                continue
            if p.poll() is None:
                leaked.append(f"pid {p.pid} (`{p.program}`)")
            try:
                p.kill_tree(grace=0)
            finally:
                for stream in (p.stdin, p.stdout, p.stderr):
                    if stream is not None:
                        stream.close()
            self._records.append(record(self.nodeid, f"`{p.program}`", p.usage(), p.termination))
        self._started = keep
        if not leaked:
            return ""
        verb = "was" if len(leaked) == 1 else "were"
        return (
            f"sbxlimit: {', '.join(leaked)} outlived the test and {verb} killed. Hint: wait "
            "for what you start (wait(), communicate(), a with-block) or end it with "
            "kill_tree() before the test returns."
        )

    def _unreported(self) -> list[dict[str, Any]]:
        rows = self._records[self._reported :]
        self._reported = len(self._records)
        return rows


_FIXTURE = pytest.StashKey[Sandboxes]()


def sandboxes(item: pytest.Item) -> Generator[Sandboxes]:
    """The ``sbx`` fixture's body: the test's Sandboxes, and at teardown the
    end of every sandbox they started (one still running fails the test)."""
    found = settings(item)
    fx = Sandboxes(item.nodeid, found.values, found.sources)
    item.stash[_FIXTURE] = fx
    yield fx
    leaked = fx._end(None)
    if leaked:
        pytest.fail(leaked, pytrace=False)


def around_call(item: pytest.Item) -> Generator[None]:
    """Around the call phase (a hook wrapper's body): what the test body
    started must be done when it returns."""
    fx = item.stash.get(_FIXTURE, None)
    if fx is None:
        return (yield)
    fx._phase = "call"
    try:
        result = yield
    except BaseException as e:
        leaked = fx._end("call")
        if leaked:
            e.add_note(leaked)
        raise
    finally:
        fx._phase = "teardown"
    leaked = fx._end("call")
    if leaked:
        pytest.fail(leaked, pytrace=False)
    return result


def add_usage(item: pytest.Item, when: str, report: pytest.TestReport) -> None:
    """Put the rows of the sandboxes that ended since the last report on the
    call or teardown report, for --sbxlimit-report."""
    fx = item.stash.get(_FIXTURE, None)
    if fx is not None and when in ("call", "teardown"):
        rows = fx._unreported()
        if rows:
            report.sbxlimit_usage = rows  # type: ignore[attr-defined]


def reported_in_child(item: pytest.Item) -> None:
    """A forked body's report carried the rows of what this process ran
    before the fork: they are not reported again."""
    fx = item.stash.get(_FIXTURE, None)
    if fx is not None:
        fx._reported = len(fx._records)
