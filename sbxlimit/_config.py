"""Default limits and policy from a TOML file and ``SBXLIMIT_*`` variables.

Read by the CLI (lowest precedence first: file, environment, ``--manifest``,
flags) and by :func:`load_config` for API callers who want the same
defaults; nothing else reads them, so a library call never changes
behaviour because of the environment it happens to run in.

- The file: ``--config FILE``, else the first of ``sbxlimit.toml`` (its top
  level) or ``pyproject.toml`` (its ``[tool.sbxlimit]`` table) found in the
  directory or its parents.  Keys are Limits and Policy field names, values
  TOML strings, numbers, booleans or arrays: ``memory = "256Mi"``,
  ``network = "deny"``, ``deny_read = ["/home/me/.ssh"]``.
- The environment: ``SBXLIMIT_<FIELD>`` for any field (``SBXLIMIT_MEMORY=256Mi``,
  ``SBXLIMIT_WALL_TIME=30s``, ``SBXLIMIT_NETWORK=deny``), read as the
  pytest plugin's ``FIELD=VALUE`` words are.

A file found by searching may only tighten the sandbox (a program allowed
to write where it runs could leave one that frees its next run); a file
named with ``--config`` / ``load_config(path)`` may set anything.  One
writable by group or others is refused either way.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import tomllib
from collections.abc import Mapping
from typing import Any

from ._errors import ConfigError, UnknownFieldError
from ._limits import Limits
from ._policy import Policy
from ._settings import FIELDS, SettingsError, build, checked, from_text

__all__ = ["ENV_PREFIX", "Config", "find_file", "load_config", "read_env", "read_file"]

ENV_PREFIX = "SBXLIMIT_"
FILE_NAMES = ("sbxlimit.toml", "pyproject.toml")


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    """Defaults read from a file and the environment: the field values (as
    Limits and Policy hold them), where each came from, and the Limits and
    Policy they make (None when no field of that kind is set)."""

    values: Mapping[str, Any]
    sources: Mapping[str, str]  # field -> "sbxlimit.toml", "SBXLIMIT_MEMORY", ...
    file: str | None

    @property
    def limits(self) -> Limits | None:
        return build(self.values)[0]

    @property
    def policy(self) -> Policy | None:
        return build(self.values)[1]


def find_file(start: str | os.PathLike[str] | None = None) -> str | None:
    """The nearest ``sbxlimit.toml``, or ``pyproject.toml`` with a
    ``[tool.sbxlimit]`` table, in `start` (default: the current directory)
    or a parent; None if there is none."""
    here = os.path.abspath(os.fspath(start) if start is not None else os.getcwd())
    while True:
        for name in FILE_NAMES:
            path = os.path.join(here, name)
            if os.path.isfile(path) and (name != "pyproject.toml" or _has_table(path)):
                return path
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def _has_table(path: str) -> bool:
    try:
        return "sbxlimit" in _load(path).get("tool", {})
    except ConfigError:
        return True  # let read_file say what is wrong with it


def _load(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                raise ConfigError(
                    path, oct(st.st_mode & 0o777), "writable by others than its owner: refused"
                )
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(path, None, e.strerror or str(e)) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, None, f"not valid TOML: {e}") from None


# What a file found by searching may not say: each widens the sandbox past
# the defaults.  A program allowed to write where it runs could otherwise
# leave a sbxlimit.toml there that frees the next run started there.
_WIDENING: dict[str, Any] = {
    "workdir": lambda v: v is not None,
    "writable_roots": bool,
    "capabilities": bool,
    "unix_sockets": bool,
    "protect_dotfiles": lambda v: v is False,
    "harden": lambda v: v is False,
    "isolate_pids": lambda v: v is False,
    "terminal": lambda v: v is True,
}


def read_file(path: str, *, found: bool = False) -> dict[str, Any]:
    """The checked field values of a config file: the top level of a
    ``sbxlimit.toml`` (or any other name), ``[tool.sbxlimit]`` of a
    ``pyproject.toml``.  A SettingsError names the file and the key.
    `found`: the file was found by searching, not named, and may only
    tighten the sandbox (no workdir, writable roots, capabilities, Unix
    sockets, and no protection turned off)."""
    try:
        doc = _load(path)
    except ConfigError as e:
        raise SettingsError(path, e.problem, e.value) from None
    where = path
    if os.path.basename(path) == "pyproject.toml":
        doc = doc.get("tool", {}).get("sbxlimit", {})
        where = f"{path} [tool.sbxlimit]"
    if not isinstance(doc, dict):
        raise SettingsError(where, "expected a table of Limits and Policy fields", doc)
    unknown = [k for k in doc if k not in FIELDS]
    if unknown:
        raise SettingsError(where, UnknownFieldError("fields", unknown, FIELDS).problem, unknown)
    values = checked(doc, where)
    if found:
        for name, value in values.items():
            if name in _WIDENING and _WIDENING[name](value):
                raise SettingsError(
                    where,
                    f"{name} = {doc[name]!r} would widen the sandbox, and a config file found by "
                    "searching may only tighten it (a program that could write here could "
                    "free its next run); name the file with --config (load_config(path)) if "
                    "you trust it",
                    value,
                )
    return values


def read_env(environ: Mapping[str, str] | None = None) -> dict[str, tuple[str, Any]]:
    """``SBXLIMIT_<FIELD>`` variables: field -> (variable, checked value).
    Other ``SBXLIMIT_*`` names (``SBXLIMIT_DEFAULTS``, ``SBXLIMIT_DEBUG``)
    are not fields and are left alone."""
    env = os.environ if environ is None else environ
    out: dict[str, tuple[str, Any]] = {}
    for var, text in env.items():
        if not var.startswith(ENV_PREFIX):
            continue
        name = var[len(ENV_PREFIX) :].lower()
        if name not in FIELDS:
            continue
        try:
            value = checked({name: from_text(name, text)}, var)[name]
        except ConfigError as e:
            raise SettingsError(f"environment variable {var}", str(e), text) from None
        out[name] = (var, value)
    return out


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    start: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """The defaults the CLI would use: the config file at `path` (else the
    nearest one from `start`, see :func:`find_file`), then ``SBXLIMIT_*``
    variables of `environ` (default ``os.environ``) over it.

    >>> cfg = sbxlimit.load_config()
    >>> sbxlimit.run(cmd, limits=cfg.limits, policy=cfg.policy)

    A bad file or variable is a :class:`sbxlimit.ConfigError` naming it.
    """
    file = os.fspath(path) if path is not None else find_file(start)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if file is not None:
        for name, value in read_file(file, found=path is None).items():
            values[name], sources[name] = value, file
    for name, (var, value) in read_env(environ).items():
        values[name], sources[name] = value, var
    return Config(values, sources, file)
