"""sbxlimit's pytest plugin (docs/pytest.md), registered as ``sbxlimit``
through the ``pytest11`` entry point.

- ``@pytest.mark.sbxlimit(memory=..., wall_time=..., network=...)``: the
  test's call phase runs in a :class:`~sbxlimit._forked.ForkedSandbox` under
  those limits and policy.  Setup and teardown stay in this process.  The
  child runs pytest's own call hooks (capture, logging, skipping, assertion
  rewriting) and makes the report; the report, the new captured sections and
  the warnings come back pickled through a pipe, and this process logs them.
  When no report comes back (a limit killed the child, a crash), the call
  fails here with the termination message.
- fixture ``sbx``: :class:`Sandboxes`, ``run()`` and ``popen()`` with the
  test's defaults; what a test leaves running fails it.
- ``--sbxlimit-defaults`` / ``$SBXLIMIT_DEFAULTS`` / ini ``sbxlimit_defaults``:
  default limits and policy; precedence marker > CLI > env > ini, per field.
- ``--sbxlimit-report``: the heaviest tests at the end of the session.
- ``--sbxlimit-doctor``: the doctor's report in the session header.

Nothing runs for a suite that uses none of these: the hooks look for the
marker or the fixture and return; sbxlimit's modules are imported inside the
functions that need them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Generator, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import warnings

    from ._limits import Limits
    from ._policy import Policy
    from ._popen import Popen
    from ._run import SandboxResult
    from ._termination import Termination, Usage

__all__ = ["Sandboxes"]

MARKER = "sbxlimit"
INI = "sbxlimit_defaults"
ENV = "SBXLIMIT_DEFAULTS"
CLI = "--sbxlimit-defaults"
REPORT_ROWS = 10
# Kept free in a forked body with a memory limit, and released when the body
# runs out of memory, so that the failure can still be reported.
_RESERVE = 4 << 20

_MARKER_HELP = (
    "sbxlimit(memory=..., cpu_time=..., wall_time=..., pids=..., open_files=..., "
    "file_size=..., network=..., ...): run the test body in a forked child under "
    "these sbxlimit limits and policy (docs/pytest.md)"
)


# -- configuration ------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sbxlimit", "resource limits for tests (sbxlimit)")
    group.addoption(
        CLI,
        dest="sbxlimit_defaults",
        metavar="FIELDS",
        default=None,
        help="Default sbxlimit limits and policy for the sbx fixture and "
        "@pytest.mark.sbxlimit, as FIELD=VALUE words: 'memory=256Mi wall_time=30s "
        "network=deny'.  Overrides $SBXLIMIT_DEFAULTS and the sbxlimit_defaults ini "
        "option field by field; the marker overrides all three.",
    )
    group.addoption(
        "--sbxlimit-report",
        action="store_true",
        default=False,
        help=f"At the end of the session, list the {REPORT_ROWS} heaviest sandboxes "
        "(test bodies under @pytest.mark.sbxlimit and sbx fixture runs) by peak "
        "memory, then CPU.",
    )
    group.addoption(
        "--sbxlimit-doctor",
        action="store_true",
        default=False,
        help="Print sbxlimit's doctor report (what this machine can enforce) in the "
        "session header.",
    )
    parser.addini(
        INI,
        help="Default sbxlimit limits and policy, as FIELD=VALUE words "
        "('memory=256Mi wall_time=30s'); $SBXLIMIT_DEFAULTS, --sbxlimit-defaults and "
        "@pytest.mark.sbxlimit override it field by field.",
        default="",
    )


class _State:
    """Per session: the parsed default sources (lowest precedence first)."""

    def __init__(self, sources: list[tuple[str, dict[str, Any]]]) -> None:
        self.sources = sources


_STATE = pytest.StashKey[_State]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", _MARKER_HELP)
    sources: list[tuple[str, dict[str, Any]]] = []
    ini = config.getini(INI)
    if isinstance(ini, str) and ini.strip():
        label = f"ini option {INI}" + (f" in {config.inipath}" if config.inipath else "")
        sources.append((label, _parse_text(ini, label)))
    env = os.environ.get(ENV, "")
    if env.strip():
        label = f"environment variable {ENV}"
        sources.append((label, _parse_text(env, label)))
    cli = config.getoption("sbxlimit_defaults")
    if cli:
        sources.append((CLI, _parse_text(cli, CLI)))
    config.stash[_STATE] = _State(sources)
    if config.getoption("sbxlimit_report") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_UsageReport(), "sbxlimit-report")


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    if not config.getoption("sbxlimit_doctor"):
        return None
    from ._doctor import doctor

    return str(doctor()).rstrip("\n").splitlines()


# -- fields and values ----------------------------------------------------------


def _parse_text(text: str, source: str) -> dict[str, Any]:
    """FIELD=VALUE words from the ini, env or CLI; a UsageError naming
    `source` for anything wrong."""
    from ._settings import SettingsError, parse_words

    try:
        return parse_words(text, source)
    except SettingsError as e:
        raise pytest.UsageError(str(e)) from None


class _Settings:
    """What applies to one test: merged field values, where they came
    from, and the Limits and Policy they make."""

    def __init__(
        self,
        values: dict[str, Any],
        sources: list[str],
        limits: Limits | None,
        policy: Policy | None,
    ) -> None:
        self.values = values
        self.sources = sources
        self.limits = limits
        self.policy = policy


_SETTINGS = pytest.StashKey[_Settings]()


def _marker_values(mark: pytest.Mark, where: str) -> dict[str, Any]:
    """The checked field values of one marker; a SettingsError naming `where`."""
    from ._errors import ConfigError
    from ._settings import FIELDS, SettingsError, checked, known_fields, object_fields

    try:
        if mark.args:
            raise ConfigError(
                "positional arguments", mark.args, "pass fields by name (memory='64Mi', ...)"
            )
        kwargs = dict(mark.kwargs)
        values = object_fields(kwargs.pop("limits", None), "limits")
        values.update(object_fields(kwargs.pop("policy", None), "policy"))
        unknown = sorted(k for k in kwargs if k not in FIELDS)
        if unknown:
            raise ConfigError("fields", unknown, f"unknown; known: {known_fields()}")
    except ConfigError as e:
        raise SettingsError(where, str(e), mark) from None
    values.update(kwargs)
    return checked(values, where)


def _settings(item: pytest.Item) -> _Settings:
    """The test's merged defaults and marker (cached on the item); a bad
    marker value fails the calling phase with a message naming the marker."""
    cached = item.stash.get(_SETTINGS, None)
    if cached is not None:
        return cached
    from ._errors import ConfigError
    from ._settings import build

    state = item.config.stash.get(_STATE, None)
    values: dict[str, Any] = {}
    sources: list[str] = []
    for label, vals in state.sources if state is not None else ():
        values.update(vals)
        sources.append(label)
    where = f"@pytest.mark.{MARKER} on {item.nodeid}"
    for mark in reversed(list(item.iter_markers(MARKER))):
        try:
            vals, problem = _marker_values(mark, where), ""
        except ConfigError as e:
            vals, problem = {}, str(e)
        if problem:
            pytest.fail(f"sbxlimit: {problem}", pytrace=False)
        values.update(vals)
        if where not in sources:
            sources.append(where)
    try:
        limits, policy = build(values)
    except (ConfigError, TypeError) as e:
        pytest.fail(f"sbxlimit: the settings from {' + '.join(sources)}: {e}", pytrace=False)
    settings = item.stash[_SETTINGS] = _Settings(values, sources, limits, policy)
    return settings


# -- the marker: the call phase in a forked sandbox -----------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker(MARKER) is not None:
        _settings(item)  # a bad marker is a setup error, before any fixture runs
        if not hasattr(os, "fork"):
            pytest.fail(f"sbxlimit: @pytest.mark.{MARKER} needs os.fork()", pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    if item.get_closest_marker(MARKER) is None:
        return None
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
    return True


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

    def __init__(self, settings: _Settings) -> None:
        from ._cgroup import discover

        self.limits = settings.limits
        self.policy = settings.policy
        self.asked = settings.limits.memory if settings.limits is not None else None
        # A forked child inherits this process's memory.  A cgroup charges it
        # only with the pages it touches; RLIMIT_DATA and the RSS watchdog
        # count every inherited mapping, so there the limit is raised by
        # what this process holds, to mean the same thing: what the body adds.
        self.baseline = 0
        self.rss_baseline = 0
        self.cgroup_memory = discover().has("memory")
        if self.asked is not None and not self.cgroup_memory and sys.platform == "linux":
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
    body = _Body(_settings(item))
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
        _record(item.nodeid, "test body", p.usage(), term, body.rss_baseline, end),
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
    fx = item.stash.get(_FIXTURE, None)
    if fx is not None:  # the child reported what this process ran before the fork
        fx._reported = len(fx._records)
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
        "If it legitimately needs more, raise the memory in the marker; otherwise look "
        "for a leak or an unbounded buffer."
    )


def _child_call(
    item: pytest.Item, reraise: tuple[type[BaseException], ...], *, reserve: bool
) -> dict[str, Any]:
    """In the forked child: the call phase and its report, as data."""
    import faulthandler
    import warnings

    config = item.config
    before = len(getattr(item, "_report_sections", ()))
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
    }


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


def _send(fd: int, payload: dict[str, Any]) -> None:
    """One length-prefixed pickle; values that do not pickle are replaced
    by their repr (a plugin's extra report attribute, say)."""
    import pickle

    try:
        data = pickle.dumps(payload, pickle.HIGHEST_PROTOCOL)
    except Exception:
        report = dict(payload["report"])
        for key, value in report.items():
            try:
                pickle.dumps(value)
            except Exception:
                report[key] = repr(value)
        data = pickle.dumps({**payload, "report": report}, pickle.HIGHEST_PROTOCOL)
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


def _record(
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


# -- the sbx fixture ------------------------------------------------------------


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
        self.nodeid = nodeid
        self._values = dict(values)
        self._sources = list(sources)
        from ._settings import build

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
        self._records.append(_record(self.nodeid, what, result.usage, result.termination))
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
            self._records.append(_record(self.nodeid, f"`{p.program}`", p.usage(), p.termination))
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


@pytest.fixture
def sbx(request: pytest.FixtureRequest) -> Generator[Sandboxes]:
    """Sandboxes for this test (:class:`sbxlimit.pytest_plugin.Sandboxes`):
    ``sbx.run(args, memory="64Mi", ...)``, ``sbx.popen(...)``; defaults from
    sbxlimit_defaults / $SBXLIMIT_DEFAULTS / --sbxlimit-defaults /
    @pytest.mark.sbxlimit; whatever outlives the test fails it."""
    item = request.node
    settings = _settings(item)
    fx = Sandboxes(item.nodeid, settings.values, settings.sources)
    item.stash[_FIXTURE] = fx
    yield fx
    leaked = fx._end(None)
    if leaked:
        pytest.fail(leaked, pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None]:
    """What the test body started must be done when it returns."""
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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    fx = item.stash.get(_FIXTURE, None)
    if fx is not None and call.when in ("call", "teardown"):
        rows = fx._unreported()
        if rows:
            report.sbxlimit_usage = rows  # type: ignore[attr-defined]
    return report


# -- --sbxlimit-report ----------------------------------------------------------


class _UsageReport:
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
