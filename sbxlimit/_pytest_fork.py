"""The pytest plugin's marker: a test's call phase in a forked sandbox, and its report over a pipe.

The protocol is pytest's runtestprotocol with the call phase in a
:class:`~sbxlimit._forked.ForkedSandbox`: setup and teardown stay in this
process.  The child runs pytest's own call hooks (capture, logging,
skipping, assertion rewriting) and makes the report; the report, the new
captured sections and the warnings come back pickled through a pipe, and
this process logs them.  When no report comes back (a limit killed the
child, a crash), the call fails here with the termination message.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

import pytest

from ._pytest_fixture import reported_in_child
from ._pytest_report import record
from ._pytest_settings import MARKER, Settings, settings

if TYPE_CHECKING:
    import warnings

    from ._popen import Popen
    from ._termination import Termination

# Kept free in a forked body with a memory limit, and released when the body
# runs out of memory, so that the failure can still be reported.
_RESERVE = 4 << 20


def check(item: pytest.Item) -> None:
    """At a marked test's setup, before any fixture runs: a bad marker, or
    no os.fork(), is a setup error."""
    settings(item)
    if not hasattr(os, "fork"):
        pytest.fail(f"sbxlimit: @pytest.mark.{MARKER} needs os.fork()", pytrace=False)


def run_test(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """A marked test's whole protocol: setup, the call in a sandbox,
    teardown, each phase reported as pytest does."""
    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    # As pytest's runtestprotocol, with the call phase in a sandbox.
    if hasattr(item, "_request") and not item._request:
        # Only when re-run by a plugin such as pytest-rerunfailures.
        item._initrequest()  # type: ignore[attr-defined]
    setup = _phase(item, "setup")
    if setup.passed:
        if item.config.getoption("setupshow", False):
            _show_item(item)
        if not item.config.getoption("setuponly", False):
            _call_in_sandbox(item)
    if item.session.shouldfail or item.session.shouldstop:
        nextitem = None
    _phase(item, "teardown", nextitem=nextitem)
    if hasattr(item, "_request"):
        item._request = False
        item.funcargs = None  # type: ignore[attr-defined]
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


def _reraise(config: pytest.Config) -> tuple[type[BaseException], ...]:
    if config.getoption("usepdb", False):
        return (pytest.exit.Exception,)
    return (pytest.exit.Exception, KeyboardInterrupt)


def _phase(item: pytest.Item, when: str, **kwargs: Any) -> pytest.TestReport:
    """Run one phase here, make and log its report (pytest's call_and_report)."""
    hook = getattr(item.ihook, f"pytest_runtest_{when}")
    call = pytest.CallInfo.from_call(
        lambda: hook(item=item, **kwargs),
        when=when,  # type: ignore[arg-type]
        reraise=_reraise(item.config),
    )
    return _log(item, call)


def _log(item: pytest.Item, call: pytest.CallInfo[Any]) -> pytest.TestReport:
    report: pytest.TestReport = item.ihook.pytest_runtest_makereport(item=item, call=call)
    item.ihook.pytest_runtest_logreport(report=report)
    if _interactive(call, report):
        item.ihook.pytest_exception_interact(node=item, call=call, report=report)
    return report


def _interactive(call: pytest.CallInfo[Any], report: pytest.TestReport) -> bool:
    import bdb

    if call.excinfo is None or hasattr(report, "wasxfail"):
        return False
    return not isinstance(call.excinfo.value, (pytest.skip.Exception, bdb.BdbQuit))


def _show_item(item: pytest.Item) -> None:
    """The --setup-show line for the test itself."""
    tw = item.config.get_terminal_writer()
    tw.line()
    tw.write(" " * 8 + item.nodeid)
    names = sorted(getattr(item, "fixturenames", []))
    if names:
        tw.write(" (fixtures used: {})".format(", ".join(names)))
    tw.flush()


def _status_bytes(*keys: str) -> int:
    """Sum of /proc/self/status fields (kB) in bytes; 0 where there is none."""
    total = 0
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in keys:
                    total += int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return 0
    return total


class _Body:
    """One forked test body: the limits it runs under and how they were
    adjusted for what it inherits."""

    def __init__(self, test: Settings) -> None:
        from ._cgroup import discover

        self.limits = test.limits
        self.policy = test.policy
        self.asked = test.limits.memory if test.limits is not None else None
        # A forked child inherits this process's memory.  A cgroup charges it
        # only with the pages it touches; RLIMIT_DATA and the RSS watchdog
        # count every inherited mapping, so there the limit is raised by
        # what this process holds, to mean the same thing: what the body adds.
        self.baseline = 0
        self.rss_baseline = 0
        self.cgroup_memory = discover().has("memory")
        if self.asked is not None and not self.cgroup_memory and _linux():
            from ._limits import Limits

            assert self.limits is not None
            self.baseline = _status_bytes("VmData") + _RESERVE
            self.rss_baseline = _status_bytes("VmRSS")
            self.limits = Limits(**{**self.limits.to_dict(), "memory": self.asked + self.baseline})

    def note(self, mechanism: str | None) -> str:
        """What the adjusted limit means, for messages."""
        from ._units import format_bytes

        if not self.baseline or self.asked is None:
            return ""
        return (
            f" Here memory is held per process by {mechanism or 'rlimit:RLIMIT_DATA'}, which "
            f"counts what the body inherits too, so the {format_bytes(self.baseline)} this "
            "test process held when it forked was added to the limit "
            f"({format_bytes(self.asked + self.baseline)} in all)."
        )


def _call_in_sandbox(item: pytest.Item) -> None:
    """The call phase in a ForkedSandbox; its report logged here."""
    import pickle

    from ._forked import ForkedSandbox

    config = item.config
    body = _Body(settings(item))
    reraise = _reraise(config)
    r, w = os.pipe()

    def child() -> int:
        os.set_inheritable(w, False)  # not for programs the body runs
        _send(w, _child_call(item, reraise, reserve=body.asked is not None))
        return 0

    # Pending output would be written twice: here and when the child flushes.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    try:
        spawn = pytest.CallInfo.from_call(
            lambda: ForkedSandbox(
                child,
                name=item.name.replace("/", "_"),
                limits=body.limits,
                policy=body.policy,
                pass_fds=(w,),
            ),
            when="call",
            reraise=reraise,
        )
    finally:
        os.close(w)
    if spawn.excinfo is not None:  # refused before the fork (strict, setup step)
        os.close(r)
        _log(item, spawn)
        return
    p: ForkedSandbox = spawn.result
    try:
        data = _receive(r, p)
        p.wait()
    except BaseException:
        p.kill_tree(grace=0)
        raise
    finally:
        os.close(r)
    payload: dict[str, Any] | None = None
    problem = ""
    if data is not None:
        try:
            payload = pickle.loads(data)
        except Exception as e:
            problem = f" Its report could not be read: {e!r}."
    if payload is not None and "exit" in payload:
        reason, code = payload["exit"]
        pytest.exit(reason, code)
    if payload is not None and "interrupt" in payload:
        raise KeyboardInterrupt
    term = p.termination
    assert term is not None
    mechanism = p.enforced.get("memory", "")
    end = term.reason
    if payload is not None and payload.get("memory_error") and body.asked is not None:
        end = "memory"
    report = _child_report(item, body, payload, term, mechanism) if payload is not None else None
    if report is None:
        report = _failed_here(item, body, term, problem, p.usage().wall)
    report.sbxlimit_usage = [  # type: ignore[attr-defined]
        *getattr(report, "sbxlimit_usage", ()),
        record(item.nodeid, "test body", p.usage(), term, body.rss_baseline, end),
    ]
    item.ihook.pytest_runtest_logreport(report=report)


def _child_report(
    item: pytest.Item, body: _Body, payload: dict[str, Any], term: Termination, mechanism: str
) -> pytest.TestReport:
    """The child's report, with its sections, properties and warnings
    brought back into this process."""
    import warnings

    config = item.config
    report: pytest.TestReport = config.hook.pytest_report_from_serializable(
        config=config, data=payload["report"]
    )
    for when, key, content in payload["sections"]:
        item.add_report_section(when, key, content)
    item.user_properties[:] = list(report.user_properties)
    for message, category, filename, lineno in payload["warnings"]:
        warnings.showwarning(message, category, filename, lineno)
    _junitxml_apply(config, item, payload.get("junitxml"))
    counts = _failed_subtests_counts(config)
    if counts is not None and payload.get("failed_subtests"):
        counts[_subtests_key(item)] += payload["failed_subtests"]
    # What the body logged during the call (subtests, other plugins'
    # reports), before the call's own report, as it came.
    for data in payload.get("logged", ()):
        logged = config.hook.pytest_report_from_serializable(config=config, data=data)
        if logged is not None:
            _keep_subtest_params(logged, data)
            item.ihook.pytest_runtest_logreport(report=logged)
    reported_in_child(item)
    if term.is_limit:  # the body reported, then a limit ended the child
        report.outcome = "failed"
        report.longrepr = _limit_message(body, term)
    elif payload["memory_error"] and body.asked is not None:
        text = _memory_error_message(body, mechanism)
        longrepr: Any = report.longrepr
        if hasattr(longrepr, "addsection"):
            longrepr.addsection("sbxlimit", text)
        else:
            report.longrepr = f"{longrepr}\n\n{text}"
    return report


def _failed_here(
    item: pytest.Item, body: _Body, term: Termination, problem: str, wall: float
) -> pytest.TestReport:
    """The call report of a body that ended without one: made here, with
    what the child wrote to the captured streams."""
    if term.is_limit:
        text = _limit_message(body, term)
    else:
        text = f"sbxlimit: the test body ended without reporting a result. {term.message}"
    text += problem

    def fail() -> None:
        pytest.fail(text, pytrace=False)

    capman: Any = item.config.pluginmanager.getplugin("capturemanager")
    if capman is not None and hasattr(capman, "read_global_capture"):
        capman.resume_global_capture()
        try:
            call = pytest.CallInfo.from_call(fail, when="call")
        finally:
            capman.suspend_global_capture(in_=False)
            out, err = capman.read_global_capture()
            item.add_report_section("call", "stdout", out)
            item.add_report_section("call", "stderr", err)
    else:
        call = pytest.CallInfo.from_call(fail, when="call")
    report: pytest.TestReport = item.ihook.pytest_runtest_makereport(item=item, call=call)
    report.duration = wall
    return report


def _limit_message(body: _Body, term: Termination) -> str:
    from ._units import format_bytes

    what = f"{term.reason} limit"
    if term.reason == "memory" and body.asked is not None:
        what += f" of {format_bytes(body.asked)}"
    text = f"sbxlimit: the test body hit its {what}. {term.message}"
    if term.reason == "memory":
        text += body.note(term.mechanism)
    return text


def _memory_error_message(body: _Body, mechanism: str) -> str:
    from ._units import format_bytes

    assert body.asked is not None
    return (
        f"sbxlimit: the test body hit its memory limit of {format_bytes(body.asked)}: "
        f"an allocation failed with MemoryError ({mechanism}).{body.note(mechanism)} "
        "If it legitimately needs more, give the test more "
        f"(@pytest.mark.{MARKER}(memory=...)); otherwise look for a leak or an unbounded "
        "buffer."
    )


def _child_call(
    item: pytest.Item, reraise: tuple[type[BaseException], ...], *, reserve: bool
) -> dict[str, Any]:
    """In the forked child: the call phase and its report, as data."""
    import faulthandler
    import warnings

    config = item.config
    before = len(getattr(item, "_report_sections", ()))
    logged = _collect_logreports(config)
    xml_before = _junitxml_state(config, item)
    spare = bytearray(_RESERVE) if reserve else None
    if faulthandler.is_enabled():
        # To fd 2, which is the captured stderr while the body runs: a
        # crash's traceback then comes back with the test's output.
        faulthandler.enable(file=2, all_threads=True)
    with warnings.catch_warnings(record=True) as caught:
        try:
            call = pytest.CallInfo.from_call(
                lambda: item.ihook.pytest_runtest_call(item=item), when="call", reraise=reraise
            )
        except pytest.exit.Exception as e:
            return {"exit": (str(e.msg), e.returncode)}
        except KeyboardInterrupt:
            return {"interrupt": True}
        memory_error = call.excinfo is not None and call.excinfo.errisinstance(MemoryError)
        del spare  # room to make the report in, after a MemoryError
        report = item.ihook.pytest_runtest_makereport(item=item, call=call)
    data = config.hook.pytest_report_to_serializable(config=config, report=report)
    return {
        "report": data,
        "sections": list(getattr(item, "_report_sections", ())[before:]),
        "warnings": [_warning_data(w) for w in caught],
        "memory_error": memory_error,
        "logged": logged,
        "junitxml": _junitxml_changes(config, item, xml_before),
        "failed_subtests": _failed_subtests(config, item),
    }


def _failed_subtests_counts(config: pytest.Config) -> Any:
    """pytest's count of failed subtests per test (pytest 9's ``subtests``
    and unittest's ``subTest``), from which it fails a test that passed
    but holds failed subtests; None where this pytest has none."""
    try:
        from _pytest.subtests import failed_subtests_key
    except ImportError:  # pragma: no cover - before pytest 9
        return None
    return config.stash.get(failed_subtests_key, None)


def _subtests_key(item: pytest.Item) -> Any:
    """The key of `item` in that count: its structured ``id`` from pytest
    9.2 on, its ``nodeid`` string before."""
    node: Any = item
    return node.id if isinstance(getattr(type(item), "id", None), property) else item.nodeid


def _failed_subtests(config: pytest.Config, item: pytest.Item) -> int:
    counts = _failed_subtests_counts(config)
    return int(counts[_subtests_key(item)]) if counts is not None else 0


def _keep_subtest_params(report: Any, data: Any) -> None:
    """A subtest report's parameters as they were sent.  From pytest 9.2 a
    subtest's context replaces its parameters by their repr when it is
    made, so the one rebuilt here would show the repr of a repr
    (``i='1'``)."""
    import dataclasses

    context = getattr(report, "context", None)
    sent = data.get("_subtest.context") if isinstance(data, dict) else None
    kwargs = sent.get("kwargs") if isinstance(sent, dict) else None
    if dataclasses.is_dataclass(context) and isinstance(kwargs, dict):
        object.__setattr__(context, "kwargs", kwargs)


def _collect_logreports(config: pytest.Config) -> list[dict[str, Any]]:
    """In the forked child: from now on, a report logged during the call
    (``pytest_runtest_logreport``: a subtest's, another plugin's) is kept,
    as data, for this process to log; none of the child's own reporting
    plugins see it (it would be shown and counted twice).  The child ends
    with the call."""
    pm = config.pluginmanager
    kept: list[dict[str, Any]] = []

    class _Keep:
        def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
            kept.append(config.hook.pytest_report_to_serializable(config=config, report=report))

    keep = _Keep()
    pm.register(keep, "sbxlimit-forward-logreport")
    others = [
        impl.plugin
        for impl in pm.hook.pytest_runtest_logreport.get_hookimpls()
        if impl.plugin is not keep
    ]
    # Every caller of the hook (item.ihook, a fixture's saved ihook, a
    # conftest's subset) reaches it through this attribute.
    subset = pm.subset_hook_caller("pytest_runtest_logreport", remove_plugins=others)
    setattr(pm.hook, "pytest_runtest_logreport", subset)  # noqa: B010  (HookRelay's attribute)
    return kept


def _junitxml(config: pytest.Config) -> Any:
    try:
        from _pytest.junitxml import xml_key
    except ImportError:  # pragma: no cover - another pytest layout
        return None
    return config.stash.get(xml_key, None)


def _junitxml_state(config: pytest.Config, item: pytest.Item) -> tuple[Any, ...] | None:
    """What junitxml holds for this test and the suite, before the call."""
    xml = _junitxml(config)
    if xml is None:
        return None
    node = xml.node_reporter(item.nodeid)
    return (dict(node.attrs), len(xml.global_properties))


def _junitxml_changes(
    config: pytest.Config, item: pytest.Item, before: tuple[Any, ...] | None
) -> dict[str, Any] | None:
    """What the body recorded for junitxml (record_xml_attribute,
    record_testsuite_property), as data."""
    xml = _junitxml(config)
    if xml is None or before is None:
        return None
    attrs_before, n_props = before
    attrs = xml.node_reporter(item.nodeid).attrs
    return {
        "attrs": {k: v for k, v in attrs.items() if attrs_before.get(k) != v},
        "global_properties": list(xml.global_properties[n_props:]),
    }


def _junitxml_apply(config: pytest.Config, item: pytest.Item, changes: Any) -> None:
    xml = _junitxml(config)
    if xml is None or not changes:
        return
    node = xml.node_reporter(item.nodeid)
    for name, value in changes["attrs"].items():
        node.add_attribute(name, value)
    xml.global_properties.extend(changes["global_properties"])


def _warning_data(w: warnings.WarningMessage) -> tuple[Any, ...]:
    """A recorded warning as picklable data (a local class or an odd
    argument falls back to its text)."""
    import pickle

    message: Any = w.message
    category: type[Warning] = w.category
    try:
        pickle.dumps((message, category))
    except Exception:
        message = f"{category.__name__}: {message}"
        category = UserWarning
    return (message, category, w.filename, w.lineno)


class _Repr(str):
    """What stands for a value that does not pickle (a subtest's keyword
    argument that is a local class, a plugin's odd report attribute): its
    repr, shown as the value itself would be."""

    __slots__ = ()

    def __repr__(self) -> str:
        return str(self)


def _picklable(value: Any) -> Any:
    """`value`, with every part that does not pickle replaced by its repr."""
    import pickle

    try:
        pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
        return value
    except Exception:
        pass
    # Only the plain containers are opened: a subclass (a NamedTuple, an
    # OrderedDict) is rebuilt differently, so it travels as its repr.
    if type(value) is dict:
        return {k: _picklable(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_picklable(v) for v in value)
    try:
        return _Repr(repr(value))
    except Exception:
        return _Repr(f"<{type(value).__name__} object>")


def _send(fd: int, payload: dict[str, Any]) -> None:
    """One length-prefixed pickle; parts that do not pickle travel as their
    repr."""
    import pickle

    try:
        data = pickle.dumps(payload, pickle.HIGHEST_PROTOCOL)
    except Exception:
        data = pickle.dumps(_picklable(payload), pickle.HIGHEST_PROTOCOL)
    view = memoryview(len(data).to_bytes(8, "big") + data)
    while view:
        view = view[os.write(fd, view) :]


def _receive(fd: int, p: Popen) -> bytes | None:
    """The child's payload, read while it runs (it may exceed a pipe's
    buffer); None if it ended without sending all of it.  EOF normally
    says so; if something the body started still holds the pipe, the
    child's exit does (what is in the pipe by then is read first)."""
    import select

    os.set_blocking(fd, False)
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    buf = bytearray()
    done = False
    while True:
        if len(buf) >= 8:
            size = int.from_bytes(buf[:8], "big")
            if len(buf) >= 8 + size:
                return bytes(buf[8 : 8 + size])
        if done:
            return None
        if not poller.poll(100):
            if p.poll() is None:
                continue
            done = True  # exited: take what is there, then stop
        while True:
            try:
                chunk = os.read(fd, 1 << 20)
            except BlockingIOError:
                break
            if not chunk:
                done = True
                break
            buf += chunk


def _linux() -> bool:
    from . import _platform  # not at import: loading the plugin loads none of the core

    return _platform.LINUX
