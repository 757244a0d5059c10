"""sbxlimit's pytest plugin (docs/pytest.md): the hooks and their registration.

Registered as ``sbxlimit`` through the ``pytest11`` entry point.

- ``@pytest.mark.sbxlimit(memory=..., wall_time=..., network=...)``: the
  test's call phase runs in a forked sandbox under those limits and policy
  (:mod:`sbxlimit._pytest_fork`).
- fixture ``sbx``: :class:`Sandboxes`, ``run()`` and ``popen()`` with the
  test's defaults; what a test leaves running fails it
  (:mod:`sbxlimit._pytest_fixture`).
- ``--sbxlimit-defaults`` / ``$SBXLIMIT_DEFAULTS`` / ini ``sbxlimit_defaults``:
  default limits and policy; precedence marker > CLI > env > ini, per field
  (:mod:`sbxlimit._pytest_settings`).
- ``--sbxlimit-all`` / ``$SBXLIMIT_ALL`` / ini ``sbxlimit_all``: every test
  as if it carried the marker with no fields, under the defaults;
  ``@pytest.mark.no_sbxlimit`` opts a test out.
- ``--sbxlimit-report``: the heaviest tests at the end of the session
  (:mod:`sbxlimit._pytest_report`).
- ``--sbxlimit-doctor``: the doctor's report in the session header.

Nothing runs for a suite that uses none of these: the hooks look for the
marker or the fixture and return; sbxlimit's modules are imported inside the
functions that need them.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from . import _pytest_fixture, _pytest_fork, _pytest_settings
from ._pytest_fixture import Sandboxes
from ._pytest_report import REPORT_ROWS, UsageReport
from ._pytest_settings import ALL_CLI, ALL_ENV, ALL_INI, CLI, INI, OPT_OUT

__all__ = ["Sandboxes"]

_MARKER_HELP = (
    "sbxlimit(memory=..., cpu_time=..., wall_time=..., pids=..., open_files=..., "
    "file_size=..., network=..., ...): run the test body in a forked child under "
    "these sbxlimit limits and policy (docs/pytest.md)"
)
_OPT_OUT_HELP = (
    f"{OPT_OUT}: run the test body in the pytest process, as usual, despite "
    f"{ALL_CLI} or an @pytest.mark.sbxlimit further out (docs/pytest.md)"
)


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
        ALL_CLI,
        dest="sbxlimit_all",
        action="store_true",
        default=False,
        help="Run every test as if it carried @pytest.mark.sbxlimit: its body in a "
        "forked sandbox under the defaults (which must set something).  Also "
        f"${ALL_ENV}=1 or the {ALL_INI} ini option; @pytest.mark.{OPT_OUT} opts a test out.",
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
    parser.addini(
        ALL_INI,
        type="bool",
        help="Run every test as if it carried @pytest.mark.sbxlimit (as "
        f"{ALL_CLI}); ${ALL_ENV} overrides it.",
        default=False,
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", _MARKER_HELP)
    config.addinivalue_line("markers", _OPT_OUT_HELP)
    _pytest_settings.configure(config)
    if config.getoption("sbxlimit_report") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(UsageReport(), "sbxlimit-report")


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    every = _pytest_settings.header(config)
    lines = [every] if every is not None else []
    if config.getoption("sbxlimit_doctor"):
        from ._doctor import doctor

        lines += str(doctor()).rstrip("\n").splitlines()
    return lines or None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _pytest_settings.forked(item):
        _pytest_fork.check(item)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    if not _pytest_settings.forked(item):
        return None
    _pytest_fork.run_test(item, nextitem)
    return True


@pytest.fixture
def sbx(request: pytest.FixtureRequest) -> Generator[Sandboxes]:
    """Sandboxes for this test (:class:`sbxlimit.pytest_plugin.Sandboxes`):
    ``sbx.run(args, memory="64Mi", ...)``, ``sbx.popen(...)``; defaults from
    sbxlimit_defaults / $SBXLIMIT_DEFAULTS / --sbxlimit-defaults /
    @pytest.mark.sbxlimit; whatever outlives the test fails it."""
    yield from _pytest_fixture.sandboxes(request.node)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None]:
    """What the test body started must be done when it returns."""
    return (yield from _pytest_fixture.around_call(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    _pytest_fixture.add_usage(item, call.when, report)
    return report
