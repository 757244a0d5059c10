"""Parsing of sizes, durations, CPU rates and counts, Kubernetes style.

Each parser takes the field name (for the error message) and the input, and
returns the normalised value: bytes (int), seconds (float), millicores (int),
count (int).  Bad input raises :class:`ConfigError` naming the field and the
input; nothing here touches the system.
"""

from __future__ import annotations

import datetime
import math
import re
import threading
from decimal import ROUND_CEILING, Decimal

from ._errors import ConfigError

__all__ = [
    "Millicores",
    "format_bytes",
    "format_seconds",
    "parse_bytes",
    "parse_count",
    "parse_millicores",
    "parse_rate",
    "parse_seconds",
]

_BYTE_UNITS = {
    "": 1,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_MAX_INT = 2**63 - 1
# The longest duration anything accepts: what a thread may wait for
# (threading.TIMEOUT_MAX, about 292 years on Linux); beyond it a timer, a
# wait or an rlimit would overflow.
MAX_SECONDS = min(threading.TIMEOUT_MAX, float(2**62))
# The most events a rate may allow per period (a float counts them exactly).
MAX_RATE = 2**53
# Units in any case ("1gi", "1GB", "1kib"): only a bare lowercase "m" is
# refused, since Kubernetes reads it as milli.
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(?:([kmgtpe])(i)?)?(b)?\s*$", re.I)
_DURATION_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(us|ms|s|m|h|d)")
_NUMBER_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*$")
_CPU_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(m)?\s*$")
_RATE_RE = re.compile(r"^\s*([0-9]+)\s*/\s*(second|sec|s|minute|min|m|hour|h)\s*$")
_RATE_UNITS = {
    "second": 1.0,
    "sec": 1.0,
    "s": 1.0,
    "minute": 60.0,
    "min": 60.0,
    "m": 60.0,
    "hour": 3600.0,
    "h": 3600.0,
}


def _number(field: str, value: object, what: str) -> Decimal:
    """An int or float that is finite and not a bool, as an exact Decimal
    (a float is taken at its shortest repr: 0.1 is 0.1, not 0.1000...0555)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, value, f"expected {what}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(field, value, f"must be finite ({what})")
        return Decimal(repr(value))
    return Decimal(value)


def _ceil(field: str, value: object, amount: Decimal, limit: int) -> int:
    """Round up to a whole number, refusing what does not fit in `limit`."""
    if amount > limit:
        raise ConfigError(field, value, "is too large")
    return int(amount.to_integral_value(rounding=ROUND_CEILING))


def _whole(field: str, value: object, digits: str) -> int:
    """A run of decimal digits as an int; past any limit's size it is "too
    large" (int() itself refuses more than 4300 digits with a ValueError
    that would not name the field)."""
    significant = digits.lstrip("0")
    if len(significant) > 30:
        raise ConfigError(field, value, "is too large")
    return int(significant or "0")


def _check_nul(field: str, value: str) -> None:
    if "\0" in value:
        raise ConfigError(field, value, "contains a NUL byte")


def parse_bytes(field: str, value: object, *, allow_zero: bool = False) -> int:
    """``512Mi``, ``1G``, ``1.5Gi``, ``4096`` → bytes (rounded up)."""
    if isinstance(value, str):
        _check_nul(field, value)
        m = _SIZE_RE.match(value)
        if not m or (m.group(2) == "m" and not m.group(3) and not m.group(4)):
            hint = ""
            if m:
                hint = f"; 'm' means milli in Kubernetes units, did you mean '{m.group(1)}Mi'?"
            raise ConfigError(
                field,
                value,
                "not a size; use bytes or a number with Ki, Mi, Gi, Ti (binary) "
                f"or K, M, G, T (decimal), e.g. '512Mi'{hint}",
            )
        unit = (m.group(2) or "").upper() + ("i" if m.group(3) else "")
        amount = Decimal(m.group(1)) * _BYTE_UNITS[unit]
        if not unit:
            _whole_bytes(field, value, amount, m.group(1))
    else:
        amount = _number(field, value, "a size in bytes or a string such as '512Mi'")
        _whole_bytes(field, value, amount, repr(value))
    if amount < 0:
        raise ConfigError(field, value, "must not be negative")
    result = _ceil(field, value, amount, _MAX_INT)
    if result == 0 and not allow_zero:
        raise ConfigError(field, value, "must be greater than zero")
    return result


def _whole_bytes(field: str, value: object, amount: Decimal, number: str) -> None:
    """A size without a unit is bytes, and a fraction of a byte is a unit
    left out ("1.5" meant 1.5 Mi or G, not 2 bytes)."""
    if amount != amount.to_integral_value():
        raise ConfigError(
            field,
            value,
            f"a size without a unit is bytes, and this is a fraction of one; "
            f"add the unit you meant, e.g. '{number}Gi' or '{number}Mi'",
        )


def parse_seconds(field: str, value: object, *, allow_zero: bool = False) -> float:
    """``30s``, ``500ms``, ``2m``, ``1h30m``, ``1.5``, ``timedelta`` → seconds."""
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, str):
        _check_nul(field, value)
        text = value.strip()
        if _NUMBER_RE.match(text):
            seconds = float(text)
        else:
            pos, seconds, parts = 0, 0.0, 0
            for m in _DURATION_PART.finditer(text):
                if m.start() != pos and text[pos : m.start()].strip():
                    break
                seconds += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
                pos, parts = m.end(), parts + 1
            if parts == 0 or text[pos:].strip():
                raise ConfigError(
                    field,
                    value,
                    "not a duration; use seconds or a number with ms, s, m, h, "
                    "e.g. '30s', '500ms', '1h30m'",
                )
    else:
        seconds = float(_number(field, value, "a duration in seconds or a string such as '30s'"))
    if not math.isfinite(seconds):
        raise ConfigError(field, value, "must be finite")
    if seconds < 0:
        raise ConfigError(field, value, "must not be negative")
    if seconds == 0 and not allow_zero:
        raise ConfigError(field, value, "must be greater than zero")
    if seconds > MAX_SECONDS:
        raise ConfigError(field, value, f"is too large (at most {MAX_SECONDS:.0f} s, ~292 years)")
    return seconds


class Millicores(int):
    """An already normalised CPU amount.  A plain int means cores (as in
    Kubernetes); this subclass marks millicores, so that normalising again
    (``dataclasses.replace``, ``Limits(**limits.asked())``) keeps the value."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Millicores({int(self)})"

    def __str__(self) -> str:
        return str(int(self))


def parse_millicores(field: str, value: object) -> Millicores:
    """``500m`` → 500, ``1.5`` or ``"1.5"`` → 1500, ``2`` → 2000 (cores, as in Kubernetes)."""
    if isinstance(value, Millicores):
        return value
    if isinstance(value, str):
        _check_nul(field, value)
        m = _CPU_RE.match(value)
        if not m:
            raise ConfigError(
                field, value, "not a CPU amount; use cores ('1.5') or millicores ('500m')"
            )
        amount = Decimal(m.group(1)) * (1 if m.group(2) else 1000)
    else:
        amount = _number(field, value, "a number of cores or a string such as '500m'") * 1000
    if amount < 0:
        raise ConfigError(field, value, "must not be negative")
    result = _ceil(field, value, amount, _MAX_INT)
    if result < 1:
        raise ConfigError(field, value, "must be at least 1m (one thousandth of a core)")
    return Millicores(result)


def parse_count(field: str, value: object, *, minimum: int = 1) -> int:
    """A whole number of things (processes, descriptors), at least ``minimum``."""
    if isinstance(value, str):
        _check_nul(field, value)
        if not re.match(r"^\s*[0-9]+\s*$", value):
            raise ConfigError(field, value, "not a whole number")
        result = _whole(field, value, value.strip())
    elif isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            result = int(value)
        else:
            raise ConfigError(field, value, "expected a whole number")
    else:
        result = value
    if result < minimum:
        raise ConfigError(field, value, f"must be at least {minimum}")
    if result > 2**62:
        raise ConfigError(field, value, "is too large")
    return result


def parse_rate(field: str, value: object) -> tuple[int, float]:
    """``100/minute`` → (100, 60.0): that many events per that many seconds."""
    if not isinstance(value, str):
        raise ConfigError(field, value, "expected a rate such as '100/minute'")
    _check_nul(field, value)
    m = _RATE_RE.match(value)
    if not m:
        raise ConfigError(field, value, "not a rate; use N/second, N/minute or N/hour")
    count = _whole(field, value, m.group(1))
    if count < 1:
        raise ConfigError(field, value, "must allow at least one call")
    if count > MAX_RATE:
        raise ConfigError(field, value, f"is too large (at most {MAX_RATE} per period)")
    return count, _RATE_UNITS[m.group(2)]


def format_bytes(n: float) -> str:
    """1536 → '1.5 KiB'; for messages people read."""
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        n /= 1024
        if n < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}" if n < 100 else f"{n:.0f} {unit}"
    raise AssertionError("unreachable")


def format_seconds(s: float) -> str:
    """2.5 → '2.5 s', 0.25 → '250 ms', 90 → '90 s'."""
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s == int(s):
        return f"{int(s)} s"
    return f"{s:.1f} s"
