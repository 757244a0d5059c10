"""Limits and Policy field values from text, flags, Python values and manifests.

The one parser behind the CLI's flags and ``--manifest``, the pytest plugin's
marker and ``FIELD=VALUE`` defaults, and ``Limits.from_manifest`` /
``Gate.from_manifest``.  Which fields exist and how each is written as text
come from the ``Limits`` and ``Policy`` dataclasses; validating and
normalising a value is theirs (``limit_value``, ``Policy(...)``), so a value
means the same whichever way it arrives.  Errors are :class:`ConfigError`
naming the field (``Limits.memory``) or JSON path; where the text came from
(an option, a variable, a flag) is added by :class:`SettingsError`.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from ._errors import ConfigError, UnknownFieldError
from ._limits import _KNOBS, _ORDER, MANIFEST_DEFAULTS, Limits, limit_value
from ._policy import Policy
from ._units import parse_count, parse_rate, parse_seconds

__all__ = [
    "FIELDS",
    "LIMIT_FIELDS",
    "POLICY_FIELDS",
    "Execution",
    "SettingsError",
    "build",
    "checked",
    "field_value",
    "flag_value",
    "from_text",
    "manifest_defaulted",
    "manifest_execution",
    "manifest_limits",
    "object_fields",
    "parse_words",
]

LIMIT_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Limits))
POLICY_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Policy))
FIELDS: frozenset[str] = frozenset(LIMIT_FIELDS + POLICY_FIELDS)


class SettingsError(ConfigError):
    """A value from one source (``--memory 12Zi``, ``--sbxlimit-defaults``,
    ``environment variable SBXLIMIT_DEFAULTS``) was rejected; the message is
    ``<source>: <what>``, the source first."""

    def __init__(self, source: str, problem: str, value: object = None) -> None:
        super().__init__(source, value, problem)
        self.source = source
        self.args = (f"{source}: {problem}",)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.source, self.problem, self.value))


def field_help() -> dict[str, str]:
    """Each field's first sentence from the ``Fields:`` list of the Limits
    and Policy docstrings: the CLI's help is written there once."""
    out: dict[str, str] = {}
    for cls in (Limits, Policy):
        doc = (cls.__doc__ or "").split("Fields:", 1)[-1]
        names: list[str] = []
        for line in doc.splitlines():
            m = re.match(r"^ {8}([a-z_]+(?:, [a-z_]+)*): (.*)$", line)
            if m:
                names = m.group(1).split(", ")
                for n in names:
                    out[n] = m.group(2)
            elif names and line.startswith(" " * 12):
                for n in names:
                    out[n] += " " + line.strip()
            else:
                names = []
    for name, text in out.items():
        text = re.sub(r":\w+:`([^`]+)`", r"\1", text.replace("``", ""))
        first = re.split(r"(?<=[^.]\.)\s", text, maxsplit=1)[0]
        out[name] = first.rstrip(".;:")
    return out


# -- text: FIELD=VALUE words and flag values ------------------------------------

_BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True}
_BOOL_WORDS.update({"0": False, "false": False, "no": False, "off": False})
# `none` is None (unlimited, the default, automatic) except where it would
# read as a value: no grace period, an allow-list naming `none`, a network mode.
_NONE_IS_TEXT = frozenset({"kill_grace", "env", "network"})


class _Form(NamedTuple):
    """How a field is written as text: ``bool`` (a switch), ``names`` (a
    comma list), ``ports`` (a comma list of numbers) or ``text`` (for Limits
    or Policy to read), and the words that stand for themselves (a
    Literal's values: ``env=sanitize``)."""

    kind: str
    words: frozenset[str]


def _form(hint: Any) -> _Form:
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    options = typing.get_args(hint) if union else (hint,)
    words = frozenset(
        w for o in options if typing.get_origin(o) is Literal for w in typing.get_args(o)
    )
    if bool in options:
        return _Form("bool", words)
    if tuple[int, ...] in options:
        return _Form("ports", words)
    if tuple[str, ...] in options:
        return _Form("names", words)
    return _Form("text", words)


_FORMS: dict[str, _Form] = {
    name: _form(hint)
    for cls in (Limits, Policy)
    for name, hint in typing.get_type_hints(cls).items()
    if name in FIELDS
}


def from_text(name: str, text: str) -> Any:
    """One ``FIELD=VALUE`` word's value as field `name` takes it: ``none`` is
    None (not for kill_grace, env, network), a switch a bool (true/false,
    yes/no, on/off, 1/0), a list the tuple of its comma-separated items,
    ports ints; the rest stays text for Limits or Policy to read.  A
    ConfigError names the field when the text is not of its form."""
    form = _FORMS.get(name)
    if form is None:
        raise UnknownFieldError("fields", [name], FIELDS)
    if text.lower() == "none" and name not in _NONE_IS_TEXT:
        return None
    if form.kind == "bool":
        try:
            return _BOOL_WORDS[text.lower()]
        except KeyError:
            raise ConfigError(name, text, "expected true or false") from None
    if text in form.words:
        return text
    if form.kind == "names":
        return tuple(p for p in text.split(",") if p)
    if form.kind == "ports":
        try:
            return tuple(int(p) for p in text.split(",") if p)
        except ValueError:
            raise ConfigError(name, text, "expected comma-separated TCP ports") from None
    return text


def parse_words(text: str, source: str) -> dict[str, Any]:
    """``FIELD=VALUE`` words (shell quoting; ``-`` for ``_`` in names) as
    checked field values; a SettingsError naming `source` for anything
    wrong.  Each value is checked on its own (see :func:`checked`)."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise SettingsError(source, f"{e} (got {text!r})", text) from None
    values: dict[str, Any] = {}
    for word in words:
        name, sep, value = word.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not name:
            raise SettingsError(
                source,
                f"expected FIELD=VALUE words such as 'memory=256Mi wall_time=30s' (got {word!r})",
                word,
            )
        if name not in FIELDS:
            raise SettingsError(source, UnknownFieldError("fields", [name], FIELDS).problem, name)
        try:
            values[name] = from_text(name, value)
        except ConfigError as e:
            raise SettingsError(source, str(e), value) from None
    return checked(values, source)


def flag_value(flag: str, name: str, text: str) -> Any:
    """A command-line flag's value for field `name`, checked and normalised;
    a SettingsError names the flag and the value (``--memory 12Zi: not a
    size; ...``)."""
    try:
        return field_value(name, text)
    except ConfigError as e:
        raise SettingsError(f"{flag} {text}", e.problem, text) from None


# -- values ---------------------------------------------------------------------


def field_value(name: str, value: Any) -> Any:
    """`value` for field `name` of Limits or Policy, checked on its own and
    normalised as the object holds it (bytes, seconds, millicores, absolute
    paths, ...); None stays None for a limit (see :func:`build`).  A rule
    between two policy fields is left to the merged values (network='proxy'
    in one place, proxy_ports in another).  A ConfigError names the field
    (``Limits.memory``, ``Policy.network``)."""
    if name in LIMIT_FIELDS:
        return None if value is None else limit_value(name, value)
    if name not in POLICY_FIELDS:
        raise UnknownFieldError("fields", [name], FIELDS)
    companion: dict[str, Any] = {}
    if name == "network" and value == "proxy":
        companion = {"proxy_ports": (1,)}
    elif name in ("proxy_ports", "allow_domains"):
        companion = {"network": "proxy"}
    elif name == "deny_domains":
        companion = {"network": "proxy", "allow_domains": ("example.invalid",)}
    return getattr(Policy(**{name: value}, **companion), name)


def checked(values: Mapping[str, Any], source: str) -> dict[str, Any]:
    """:func:`field_value` of each value, for values from one source (a
    marker, an option); a SettingsError naming `source` for the first bad
    one (limits before policy fields, as Limits and then Policy would)."""
    out = dict(values)
    # The limits first, in the order Limits checks them, then the policy's.
    for name in sorted(values, key=lambda n: _ORDER.index(n) if n in _ORDER else len(_ORDER)):
        try:
            out[name] = field_value(name, values[name])
        except (ConfigError, TypeError) as e:
            raise SettingsError(source, str(e), values[name]) from None
    return out


def build(values: Mapping[str, Any]) -> tuple[Limits | None, Policy | None]:
    """Limits and Policy from merged field values (None when no field of
    that kind is set).  A None value is: unlimited for a limit, the default
    for kill_grace, truncate_output and tolerate and for a policy field, a
    private workspace for workdir."""
    lim = {
        k: v for k, v in values.items() if k in LIMIT_FIELDS and (v is not None or k not in _KNOBS)
    }
    pol = {
        k: v for k, v in values.items() if k in POLICY_FIELDS and (v is not None or k == "workdir")
    }
    return (Limits(**lim) if lim else None, Policy(**pol) if pol else None)


def object_fields(value: Any, what: str) -> dict[str, Any]:
    """The fields a ``limits=`` or ``policy=`` argument (`what`) sets: a
    mapping's items, or a Limits/Policy object's fields that differ from the
    default."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    cls: type[Limits] | type[Policy] = Limits if what == "limits" else Policy
    if not isinstance(value, cls):
        raise ConfigError(what, value, f"expected sbxlimit.{cls.__name__}, a dict, or None")
    default = cls().to_dict()
    return {k: v for k, v in value.to_dict().items() if v != default[k]}


# -- manifests (SPEC section 2) ---------------------------------------------------

# Manifest "resources" keys and the Limits field each one sets.
_RESOURCE_KEYS = {
    "cpu": "cpu",
    "memory": "memory",
    "disk": "disk",
    "pids": "pids",
    "open_files": "open_files",
    "file_size": "file_size",
    "cpu_time": "cpu_time",
    "output": "output",
}
# The resources a manifest that leaves them out still limits (MANIFEST_DEFAULTS).
_RESOURCE_DEFAULTS = ("cpu", "memory", "disk")
_EXECUTION_KEYS = ("max_tool_call_duration", "max_concurrent_calls", "rate_limit")
_SECTIONS = ("resources", "execution_limits")


class Execution(NamedTuple):
    """A manifest's ``execution_limits``, read."""

    timeout: float
    max_concurrent: int
    rate: str


def manifest_execution(manifest: Mapping[str, Any]) -> Execution:
    """The ``execution_limits`` of a manifest, with the SPEC defaults (15s,
    3 concurrent calls, 60/minute) for what it leaves out; the manifest's
    sections are checked too.  A ConfigError names the JSON path of a bad
    value (``execution_limits.rate_limit``)."""
    if not isinstance(manifest, Mapping):
        raise ConfigError("manifest", manifest, "expected a mapping (parsed JSON object)")
    for key in manifest:
        if key not in _SECTIONS:
            raise ConfigError(str(key), manifest[key], "unknown manifest section")
    execution = manifest.get("execution_limits", {})
    if not isinstance(execution, Mapping):
        raise ConfigError("execution_limits", execution, "expected an object")
    for key in execution:
        if key not in _EXECUTION_KEYS:
            raise ConfigError(
                f"execution_limits.{key}",
                execution[key],
                f"unknown execution limit; known: {sorted(_EXECUTION_KEYS)}",
            )
    values = {k: execution.get(k, MANIFEST_DEFAULTS[k]) for k in _EXECUTION_KEYS}
    timeout = parse_seconds(
        "execution_limits.max_tool_call_duration", values["max_tool_call_duration"]
    )
    max_concurrent = parse_count(
        "execution_limits.max_concurrent_calls", values["max_concurrent_calls"]
    )
    rate = values["rate_limit"]
    parse_rate("execution_limits.rate_limit", rate)
    assert isinstance(rate, str)  # parse_rate accepts strings only
    return Execution(timeout, max_concurrent, rate)


def manifest_limits(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Limits field values from a manifest: its ``resources`` (an entry is a
    value or ``{"limit": ..., "request": ...}``; a request is checked, not
    enforced) and ``max_tool_call_duration`` as wall_time, with the SPEC
    defaults for cpu, memory, disk and the duration.  The whole manifest is
    checked; a ConfigError names the JSON path of a bad value
    (``resources.memory.limit``)."""
    execution = manifest_execution(manifest)
    resources = manifest.get("resources", {})
    if not isinstance(resources, Mapping):
        raise ConfigError("resources", resources, "expected an object")
    values: dict[str, Any] = {k: limit_value(k, MANIFEST_DEFAULTS[k]) for k in _RESOURCE_DEFAULTS}
    for key, entry in resources.items():
        path = f"resources.{key}"
        field = _RESOURCE_KEYS.get(key)
        if field is None:
            raise ConfigError(path, entry, f"unknown resource; known: {sorted(_RESOURCE_KEYS)}")
        if isinstance(entry, Mapping):
            extra = set(entry) - {"limit", "request"}
            if extra:
                raise ConfigError(path, entry, f"unknown key(s) {sorted(extra)}")
            if "request" in entry:
                limit_value(field, entry["request"], f"{path}.request")
            if "limit" not in entry:
                continue
            path, entry = f"{path}.limit", entry["limit"]
        values[field] = limit_value(field, entry, path)
    values["wall_time"] = execution.timeout
    return values


def manifest_defaulted(manifest: Mapping[str, Any]) -> set[str]:
    """The Limits fields :func:`manifest_limits` sets from the SPEC defaults
    because the manifest leaves them out (for saying so: a manifest that
    sets only memory still limits cpu, disk and wall_time)."""
    resources = manifest.get("resources", {})
    execution = manifest.get("execution_limits", {})
    given = {_RESOURCE_KEYS.get(k) for k in resources} if isinstance(resources, Mapping) else set()
    out = {f for f in _RESOURCE_DEFAULTS if f not in given}
    if not isinstance(execution, Mapping) or "max_tool_call_duration" not in execution:
        out.add("wall_time")
    return out
