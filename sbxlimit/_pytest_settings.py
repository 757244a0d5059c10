"""The pytest plugin's settings: the defaults (ini, env, option) and markers, merged per test.

Each source is read by the shared parser (:mod:`sbxlimit._settings`) and
checked on its own when the session starts (a bad default is a usage
error) or when a test is set up (a bad marker fails it); the merged values
make the test's Limits and Policy.  sbxlimit's own modules are imported
inside the functions that need them.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ._limits import Limits
    from ._policy import Policy

MARKER = "sbxlimit"
INI = "sbxlimit_defaults"
ENV = "SBXLIMIT_DEFAULTS"
CLI = "--sbxlimit-defaults"


class _State:
    """Per session: the parsed default sources (lowest precedence first)."""

    def __init__(self, sources: list[tuple[str, dict[str, Any]]]) -> None:
        self.sources = sources


_STATE = pytest.StashKey[_State]()


def configure(config: pytest.Config) -> None:
    """Read the default sources (lowest precedence first) into the session;
    a bad one is a UsageError naming it."""
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


def _parse_text(text: str, source: str) -> dict[str, Any]:
    """FIELD=VALUE words from the ini, env or CLI; a UsageError naming
    `source` for anything wrong."""
    from ._settings import SettingsError, parse_words

    try:
        return parse_words(text, source)
    except SettingsError as e:
        raise pytest.UsageError(str(e)) from None


class Settings:
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


_SETTINGS = pytest.StashKey[Settings]()


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


def settings(item: pytest.Item) -> Settings:
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
    made = item.stash[_SETTINGS] = Settings(values, sources, limits, policy)
    return made
