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
# Every test as if marked: the switch, and the marker that opts a test out.
OPT_OUT = "no_sbxlimit"
ALL_INI = "sbxlimit_all"
ALL_ENV = "SBXLIMIT_ALL"
ALL_CLI = "--sbxlimit-all"

_BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True}
_BOOL_WORDS.update({"0": False, "false": False, "no": False, "off": False})


class _State:
    """Per session: the parsed default sources (lowest precedence first),
    their text, and what turned --sbxlimit-all on (None: off)."""

    def __init__(
        self,
        sources: list[tuple[str, dict[str, Any]]],
        texts: list[str],
        every: str | None,
    ) -> None:
        self.sources = sources
        self.texts = texts
        self.every = every


_STATE = pytest.StashKey[_State]()


def configure(config: pytest.Config) -> None:
    """Read the default sources (lowest precedence first) and the
    --sbxlimit-all switch into the session; a bad one is a UsageError
    naming it, and so is the switch without a default to apply."""
    sources: list[tuple[str, dict[str, Any]]] = []
    texts: list[str] = []
    ini = config.getini(INI)
    if isinstance(ini, str) and ini.strip():
        label = _ini_label(config, INI)
        sources.append((label, _parse_text(ini, label)))
        texts.append(ini.strip())
    env = os.environ.get(ENV, "")
    if env.strip():
        label = f"environment variable {ENV}"
        sources.append((label, _parse_text(env, label)))
        texts.append(env.strip())
    cli = config.getoption("sbxlimit_defaults")
    if cli:
        sources.append((CLI, _parse_text(cli, CLI)))
        texts.append(cli.strip())
    every = _switch(config)
    if every is not None:
        merged: dict[str, Any] = {}
        for _label, vals in sources:
            merged.update(vals)
        # Forking every test under no limit at all is cost without a
        # purpose, and no default suits every machine: the user says which.
        if all(v is None for v in merged.values()):
            raise pytest.UsageError(
                f"{every}: no default limits or policy to put every test under; set them with "
                f"{CLI} 'memory=1Gi wall_time=60s', ${ENV} or the {INI} ini option"
            )
        if not hasattr(os, "fork"):
            raise pytest.UsageError(f"{every}: needs os.fork(), which this platform lacks")
    config.stash[_STATE] = _State(sources, texts, every)


def _ini_label(config: pytest.Config, name: str) -> str:
    return f"ini option {name}" + (f" in {config.inipath}" if config.inipath else "")


def _switch(config: pytest.Config) -> str | None:
    """What turns --sbxlimit-all on (the option, else $SBXLIMIT_ALL, else
    the ini option), or None; a bad value is a UsageError naming it."""
    if config.getoption("sbxlimit_all"):
        return ALL_CLI
    env = os.environ.get(ALL_ENV, "").strip()
    if env:
        label = f"environment variable {ALL_ENV}"
        on = _BOOL_WORDS.get(env.lower())
        if on is None:
            raise pytest.UsageError(
                f"{label}: expected true or false (also yes/no, on/off, 1/0) (got {env!r})"
            )
        return label if on else None
    label = _ini_label(config, ALL_INI)
    try:
        on = bool(config.getini(ALL_INI))
    except (ValueError, pytest.UsageError) as e:  # UsageError from pytest 9.2
        raise pytest.UsageError(f"{label}: {e}") from None
    return label if on else None


def header(config: pytest.Config) -> str | None:
    """The session header's line for --sbxlimit-all; None when it is off."""
    state = config.stash.get(_STATE, None)
    if state is None or state.every is None:
        return None
    defaults = ", ".join(
        f"{label} {text!r}" for (label, _vals), text in zip(state.sources, state.texts, strict=True)
    )
    return f"sbxlimit: every test body forked ({state.every}); defaults: {defaults}"


def forked(item: pytest.Item) -> bool:
    """Whether the test's call phase runs in a forked sandbox: the closest
    @sbxlimit or @no_sbxlimit decides (on one object, no_sbxlimit wins);
    with neither, --sbxlimit-all."""
    for node in reversed(item.listchain()):
        names = [mark.name for mark in node.own_markers]
        if OPT_OUT in names:
            return False
        if MARKER in names:
            return True
    state = item.config.stash.get(_STATE, None)
    return state is not None and state.every is not None


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
    from ._errors import ConfigError, UnknownFieldError
    from ._settings import FIELDS, SettingsError, checked, object_fields

    try:
        if mark.args:
            raise ConfigError(
                "positional arguments", mark.args, "pass fields by name (memory='64Mi', ...)"
            )
        kwargs = dict(mark.kwargs)
        values = object_fields(kwargs.pop("limits", None), "limits")
        values.update(object_fields(kwargs.pop("policy", None), "policy"))
        unknown = [k for k in kwargs if k not in FIELDS]
        if unknown:
            raise UnknownFieldError("fields", unknown, FIELDS)
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
