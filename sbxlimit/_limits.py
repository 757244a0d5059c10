"""``Limits``: what a sandbox may use (SPEC section 2)."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping
from typing import Any, Never, TypeVar

from ._errors import ConfigError, UnknownFieldError
from ._units import (
    parse_bytes,
    parse_count,
    parse_millicores,
    parse_seconds,
)

__all__ = ["MANIFEST_DEFAULTS", "Cores", "Count", "Duration", "Limits", "Size"]

# SPEC section 2: what a manifest means when it leaves a section out.
MANIFEST_DEFAULTS: Mapping[str, str | int] = {
    "cpu": "200m",
    "memory": "256Mi",
    "disk": "100Mi",
    "max_tool_call_duration": "15s",
    "max_concurrent_calls": 3,
    "rate_limit": "60/minute",
}

_T = TypeVar("_T")

_BYTES = ("memory", "file_size", "disk", "output", "address_space")
_BYTES_ZERO_OK = ("file_size", "output")
_SECONDS = ("cpu_time", "wall_time")
_COUNTS = ("pids", "open_files")


Size = int | float | str
"""Bytes: ``4096``, ``"512Mi"``, ``"1G"``, ``"1.5Gi"``."""
Duration = int | float | str | datetime.timedelta
"""Seconds: ``30``, ``"500ms"``, ``"2m"``, ``"1h30m"``, a ``timedelta``."""
Cores = int | float | str
"""CPU: cores (``1.5``, ``"2"``) or millicores (``"500m"``)."""
Count = int | str


@dataclasses.dataclass(frozen=True, slots=True, init=False)
class Limits:
    """What a sandbox may use.  Every field is optional; ``None`` = not limited.

    Values may be numbers or strings with units and are normalised on
    construction: bytes for ``memory``, ``file_size``, ``disk``, ``output``,
    ``address_space`` (``"512Mi"``, ``"1G"``); seconds for ``cpu_time``,
    ``wall_time``, ``kill_grace`` (``"30s"``, ``"500ms"``); millicores for
    ``cpu`` (``"500m"``, ``1.5``); counts for ``pids`` and ``open_files``.
    Bad values raise :class:`ValueError` (:class:`sbxlimit.ConfigError`)
    naming the field and the input.

    Fields:
        memory: bytes the sandbox may use (the cgroup's memory limit; without
            a cgroup, RLIMIT_DATA per process plus a watchdog on the tree's
            resident memory).
        cpu_time: CPU seconds (RLIMIT_CPU, per process; SIGXCPU, then SIGKILL
            one second later).
        cpu: CPU rate in millicores (the cgroup's CPU quota; not enforced
            without a cgroup).
        pids: processes + threads in the sandbox.
        open_files: file descriptors per process (RLIMIT_NOFILE).
        file_size: largest file the program may write (RLIMIT_FSIZE).
        disk: bytes in the workspace (Linux: a tmpfs of that size over the
            private workspace, in a mount namespace of the sandbox's own;
            else a watchdog that samples its size).
        wall_time: seconds from start until the whole tree is terminated.
        output: bytes of stdout (and, separately, stderr) passed on; past it
            the sandbox is killed, or the rest discarded with
            ``truncate_output=True``.
        kill_grace: seconds between SIGTERM and SIGKILL when time runs out.
        address_space: opt-in RLIMIT_AS cap (breaks runtimes that reserve
            large address ranges: V8, the JVM, Go).
        truncate_output: keep running past ``output`` and discard the rest.
        tolerate: limits whose refusals the program may handle and go on:
            ``"pids"`` (a refused fork or thread: EAGAIN), ``"disk"`` (a full
            workspace: ENOSPC), ``"memory"`` (a refused allocation, or one
            process killed by the cgroup's OOM killer).  By default a limit
            that is hit ends the whole sandbox with that reason; a tolerated
            one is still held, listed in ``Termination.hits`` with counts,
            and ends the sandbox only where nothing else can hold it (the
            no-cgroup watchdogs).
    """

    memory: int | None = None
    cpu_time: float | None = None
    cpu: int | None = None
    pids: int | None = None
    open_files: int | None = None
    file_size: int | None = None
    disk: int | None = None
    wall_time: float | None = None
    output: int | None = None
    kill_grace: float = 5.0
    address_space: int | None = None
    truncate_output: bool = False
    tolerate: frozenset[str] = frozenset()

    def __init__(
        self,
        *,
        memory: Size | None = None,
        cpu_time: Duration | None = None,
        cpu: Cores | None = None,
        pids: Count | None = None,
        open_files: Count | None = None,
        file_size: Size | None = None,
        disk: Size | None = None,
        wall_time: Duration | None = None,
        output: Size | None = None,
        kill_grace: Duration = 5.0,
        address_space: Size | None = None,
        truncate_output: bool = False,
        tolerate: Iterable[str] = (),
        **unknown: Never,
    ) -> None:
        if unknown:
            raise UnknownFieldError("Limits", unknown, _FIELD_NAMES)

        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        for name, value in (
            ("memory", memory),
            ("cpu_time", cpu_time),
            ("cpu", cpu),
            ("pids", pids),
            ("open_files", open_files),
            ("file_size", file_size),
            ("disk", disk),
            ("wall_time", wall_time),
            ("output", output),
            ("kill_grace", kill_grace),
            ("address_space", address_space),
            ("truncate_output", truncate_output),
            ("tolerate", tolerate),
        ):
            put(name, value)

        for name in _ORDER:
            v = getattr(self, name)
            if v is not None or name in _KNOBS:
                put(name, limit_value(name, v))

    # -- constructors -------------------------------------------------------

    @classmethod
    def coerce(cls, value: Limits | Mapping[str, Any] | None) -> Limits | None:
        """Accept a Limits, a mapping of its fields, or None."""
        return coerce_fields(cls, value, "limits")

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> Limits:
        """Read the manifest form of SPEC section 2.

        ``{"resources": {"cpu": {"limit": "500m"}, "memory": {"limit": "512Mi"},
        "disk": {"limit": "1Gi"}}, "execution_limits": {"max_tool_call_duration":
        "30s", ...}}``.  Missing cpu/memory/disk/duration take the SPEC defaults
        (200m, 256Mi, 100Mi, 15s); ``max_tool_call_duration`` becomes
        ``wall_time``.  Errors name the JSON path of the bad value.
        Concurrency and rate belong to :class:`sbxlimit.Gate`.
        """
        from ._settings import manifest_limits

        return cls(**manifest_limits(manifest))

    # -- operations ---------------------------------------------------------

    def clamp(self, ceiling: Limits) -> Limits:
        """The stricter of each field: an operator's ceiling over a request.

        ``None`` (unlimited) loses to any value; ``truncate_output`` keeps
        this object's choice.
        """
        if not isinstance(ceiling, Limits):
            raise ConfigError("ceiling", ceiling, "expected sbxlimit.Limits")
        values: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            mine, theirs = getattr(self, f.name), getattr(ceiling, f.name)
            if f.name in _KNOBS_OWN or theirs is None:
                values[f.name] = mine
            elif mine is None:
                values[f.name] = theirs
            else:
                values[f.name] = min(mine, theirs)
        return self._normalized(values)

    @classmethod
    def _normalized(cls, values: Mapping[str, Any]) -> Limits:
        """Build from values that are already normalised (no re-parsing:
        an int cpu would otherwise be read as cores a second time)."""
        obj = object.__new__(cls)
        for name, value in values.items():
            object.__setattr__(obj, name, value)
        return obj

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready normalised values: bytes, seconds, counts, and cpu as a
        millicore string (``"500m"``), so that ``Limits(**d)`` round-trips."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if d["cpu"] is not None:
            d["cpu"] = f"{int(d['cpu'])}m"
        d["tolerate"] = sorted(d["tolerate"])
        return d

    def asked(self) -> dict[str, Any]:
        """Only the fields that limit something (not None, not the knobs)."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None and f.name not in _KNOBS
        }


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(Limits))

# Fields that say how, not how much: not limits of their own.
_KNOBS = ("kill_grace", "truncate_output", "tolerate")
# Kept from the request when an operator's ceiling clamps it.
_KNOBS_OWN = ("truncate_output", "tolerate")
TOLERABLE = ("memory", "pids", "disk")


# Below these no program starts (measured: a dynamically linked /bin/true
# needs about 256 KiB of memory and 4 MiB of address space, Python 8 MiB), so
# a smaller value is a unit left out ("100" meant 100Mi), not a limit.
_STARTUP_FLOOR = {"memory": 2**20, "address_space": 4 * 2**20}


def _too_small(value: object, floor: int) -> str:
    hint = ""
    if isinstance(value, int):
        hint = "; a size without a unit is bytes"
    elif isinstance(value, str) and value.strip().isdigit():
        hint = f"; a size without a unit is bytes: did you mean '{value.strip()}Mi'?"
    return f"too small for any program to start (at least {floor >> 20} MiB){hint}"


# The order in which Limits checks its fields (the first bad one is reported).
_ORDER = (*_BYTES, *_SECONDS, *_COUNTS, "cpu", "kill_grace", "truncate_output", "tolerate")


def limit_value(name: str, value: object, field: str | None = None) -> Any:
    """One Limits field's value normalised as Limits holds it: bytes,
    seconds, a count, millicores, a bool or the tolerated names.  A bad
    value is a ConfigError naming `field` (default ``Limits.<name>``; a
    manifest passes its JSON path)."""
    where = field or f"Limits.{name}"
    if name in _BYTES:
        n = parse_bytes(where, value, allow_zero=name in _BYTES_ZERO_OK)
        if name in _STARTUP_FLOOR and n < _STARTUP_FLOOR[name]:
            raise ConfigError(where, value, _too_small(value, _STARTUP_FLOOR[name]))
        return n
    if name in _SECONDS:
        return parse_seconds(where, value)
    if name == "open_files":
        n = parse_count(where, value)
        if n < 4:
            # With fewer, a dynamically linked program exits 127 before its
            # first line: the loader cannot open libc.
            raise ConfigError(
                where, value, "must be at least 4 (stdin, stdout, stderr and one to load libc)"
            )
        return n
    if name in _COUNTS:
        return parse_count(where, value)
    if name == "cpu":
        return parse_millicores(where, value)
    if name == "kill_grace":
        return parse_seconds(where, value, allow_zero=True)
    if name == "truncate_output":
        if not isinstance(value, bool):
            raise ConfigError(where, value, "expected a bool")
        return value
    if name == "tolerate":
        return _parse_tolerate(where, value)
    raise ConfigError(where, value, "not a field of Limits")


def _parse_tolerate(field: str, value: object) -> frozenset[str]:
    if isinstance(value, str):
        value = value.replace(",", " ").split()
    if not isinstance(value, Iterable) or not all(isinstance(v, str) for v in value):
        raise ConfigError(field, value, "expected names of limits")
    names: frozenset[str] = frozenset(value)
    bad = sorted(map(repr, names - set(TOLERABLE)))
    if bad:
        raise ConfigError(field, ", ".join(bad), f"only {', '.join(TOLERABLE)} can be tolerated")
    return names


def coerce_fields(cls: type[_T], value: object, arg: str) -> _T | None:
    """`value` as a `cls` (a dataclass): itself, built from a mapping of its
    fields, or None; anything else is a ConfigError naming `arg`."""
    if value is None or isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = set(value) - known
        if unknown:
            raise UnknownFieldError(arg, unknown, known)
        return cls(**value)
    raise ConfigError(
        arg, value, f"expected sbxlimit.{cls.__name__}, a dict of its fields, or None"
    )
