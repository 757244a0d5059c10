"""Property tests of every parser of user input: units, Limits and Policy
coercion, manifests, FIELD=VALUE words and the CLI's flags.

Two kinds of property: what is written in the documented grammar means
exactly what it says (and survives the round trip through ``to_dict``), and
anything else, of any type, is a ConfigError that names the field (or the
manifest's JSON path, or the flag) - never another exception, never a
silently different value.  The Seatbelt profile builder has its own
(tests/test_seatbelt_policy.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import shlex
from decimal import ROUND_CEILING, Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sbxlimit import ConfigError, Gate, Limits, Policy, _cli
from sbxlimit._settings import LIMIT_FIELDS, POLICY_FIELDS, field_value, from_text, parse_words
from sbxlimit._units import (
    MAX_RATE,
    MAX_SECONDS,
    parse_bytes,
    parse_count,
    parse_millicores,
    parse_rate,
    parse_seconds,
)

settings.register_profile(
    "sbxlimit", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=150
)
settings.load_profile("sbxlimit")

MAX_INT = 2**63 - 1
BYTE_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
BYTE_UNITS |= {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
DURATION_UNITS = {
    "us": Decimal("1e-6"),
    "ms": Decimal("1e-3"),
    "s": 1,
    "m": 60,
    "h": 3600,
    "d": 86400,
}
RATE_UNITS = {"second": 1.0, "sec": 1.0, "s": 1.0, "minute": 60.0, "min": 60.0, "m": 60.0}
RATE_UNITS |= {"hour": 3600.0, "h": 3600.0}

# Numbers as people write them: digits, a point, and very long runs of
# digits (past int()'s 4300-digit limit).
decimals = st.one_of(
    st.integers(0, 10**6).map(str),
    st.decimals(0, 10**6, allow_nan=False, allow_infinity=False, places=3).map(str),
    st.text("0123456789", min_size=1, max_size=5000),
).filter(lambda s: "E" not in s and "e" not in s)
# Anything at all, for the "junk is a ConfigError naming the field" properties.
junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(),
    st.text("0123456789.-+ eEkKMGTPimsuhd/,\0", max_size=40),
    st.text("0123456789", min_size=4290, max_size=4400),
    st.binary(max_size=20),
    st.lists(st.one_of(st.text(max_size=8), st.integers())),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.timedeltas(),
    st.builds(object),
)


def names_field(e: ConfigError, field: str) -> bool:
    return e.field == field or e.field.startswith((f"{field}[", f"{field}."))


def _ceil(d: Decimal) -> int:
    return int(d.to_integral_value(rounding=ROUND_CEILING))


# -- units -------------------------------------------------------------------------


@given(decimals, st.sampled_from(sorted(BYTE_UNITS)), st.sampled_from(["", "B"]), st.booleans())
def test_a_size_means_what_it_says(number: str, unit: str, b: str, spaced: bool) -> None:
    text = f"{number}{' ' if spaced else ''}{unit}{b}"
    exact = _ceil(Decimal(number) * BYTE_UNITS[unit])
    if not unit and Decimal(number) != _ceil(Decimal(number)):
        with pytest.raises(ConfigError, match="fraction") as e:
            parse_bytes("Limits.memory", text)
    elif exact > MAX_INT:
        with pytest.raises(ConfigError, match="too large") as e:
            parse_bytes("Limits.memory", text)
    elif exact == 0:
        with pytest.raises(ConfigError, match="greater than zero") as e:
            parse_bytes("Limits.memory", text)
        assert parse_bytes("Limits.output", text, allow_zero=True) == 0
    else:
        assert parse_bytes("Limits.memory", text) == exact
        return
    assert e.value.field == "Limits.memory"


@given(st.integers(1, MAX_INT))
def test_a_size_in_bytes_is_itself(n: int) -> None:
    assert parse_bytes("f", n) == n == parse_bytes("f", str(n)) == parse_bytes("f", f" {n} B ")


@given(
    st.lists(st.tuples(decimals, st.sampled_from(sorted(DURATION_UNITS))), min_size=1, max_size=4)
)
def test_a_duration_is_the_sum_of_its_parts(parts: list[tuple[str, str]]) -> None:
    text = "".join(f"{n}{u}" for n, u in parts)
    exact = sum(float(n) * float(DURATION_UNITS[u]) for n, u in parts)
    if not math.isfinite(exact) or exact > MAX_SECONDS or exact == 0:
        with pytest.raises(ConfigError) as e:
            parse_seconds("Limits.wall_time", text)
        assert e.value.field == "Limits.wall_time"
    else:
        assert parse_seconds("Limits.wall_time", text) == pytest.approx(exact, rel=1e-12)


@given(st.integers(1, MAX_INT))
def test_millicores_are_themselves_and_cores_are_thousands(n: int) -> None:
    assert parse_millicores("cpu", f"{n}m") == n
    assert parse_millicores("cpu", parse_millicores("cpu", f"{n}m")) == n  # normalised stays
    if n <= MAX_INT // 1000:
        assert parse_millicores("cpu", n) == parse_millicores("cpu", str(n)) == n * 1000


@given(st.integers(1, MAX_RATE), st.sampled_from(sorted(RATE_UNITS)))
def test_a_rate_is_its_count_per_its_period(n: int, unit: str) -> None:
    assert parse_rate("rate", f"{n}/{unit}") == (n, RATE_UNITS[unit])
    assert parse_rate("rate", f" {n} / {unit} ") == (n, RATE_UNITS[unit])


def test_a_rate_of_thousands_of_digits_is_too_large() -> None:
    # int() refuses more than 4300 digits with a ValueError of its own.
    manifest = {"execution_limits": {"rate_limit": "9" * 5000 + "/minute"}}
    with pytest.raises(ConfigError, match="too large") as e:
        Gate.from_manifest(manifest)
    assert e.value.field == "execution_limits.rate_limit"


PARSERS: list[tuple[str, Any]] = [
    ("bytes", parse_bytes),
    ("seconds", parse_seconds),
    ("millicores", parse_millicores),
    ("count", parse_count),
    ("rate", parse_rate),
]


@pytest.mark.parametrize(("kind", "parse"), PARSERS, ids=[k for k, _ in PARSERS])
@given(value=junk)
def test_a_parser_accepts_or_names_the_field(kind: str, parse: Any, value: object) -> None:
    try:
        parse("the.field", value)
    except ConfigError as e:
        assert e.field == "the.field", e
        assert "the.field" in str(e)


# -- Limits and Policy ---------------------------------------------------------------

sizes = st.one_of(
    st.integers(1, 2**40),
    st.tuples(st.integers(1, 4096), st.sampled_from(["Ki", "Mi", "Gi", "K", "M", "G"])).map(
        lambda t: f"{t[0]}{t[1]}"
    ),
)
# memory and address_space: at least what a program starts with (4 MiB covers both).
startable = st.one_of(
    st.integers(4 * 2**20, 2**40),
    st.tuples(st.integers(5, 4096), st.sampled_from(["Mi", "Gi", "M", "G"])).map(
        lambda t: f"{t[0]}{t[1]}"
    ),
)
durations = st.one_of(
    st.integers(1, 10**6),
    st.floats(0.001, 10**6),
    st.integers(1, 10**5).map(lambda n: f"{n}ms"),
    st.timedeltas(datetime.timedelta(milliseconds=1), datetime.timedelta(days=365)),
)
limits_kwargs = st.fixed_dictionaries(
    {},
    optional={
        "memory": startable,
        "file_size": sizes,
        "disk": sizes,
        "output": sizes,
        "address_space": startable,
        "cpu_time": durations,
        "wall_time": durations,
        "kill_grace": durations,
        "pids": st.integers(1, 10**6),
        "open_files": st.integers(4, 10**6).map(str),
        "cpu": st.one_of(st.integers(1, 64), st.integers(1, 64000).map(lambda n: f"{n}m")),
        "truncate_output": st.booleans(),
        "tolerate": st.sets(st.sampled_from(["memory", "pids", "disk"])),
    },
)


@given(limits_kwargs)
def test_limits_survive_their_round_trip(kwargs: dict[str, Any]) -> None:
    limits = Limits(**kwargs)
    again = Limits(**json.loads(json.dumps(limits.to_dict())))
    assert again == limits
    knobs = {k: getattr(limits, k) for k in ("kill_grace", "truncate_output", "tolerate")}
    assert Limits(**limits.asked(), **knobs) == limits
    assert Limits.coerce(kwargs) == limits


@given(limits_kwargs, limits_kwargs)
def test_clamp_is_the_stricter_of_each(a: dict[str, Any], b: dict[str, Any]) -> None:
    mine, ceiling = Limits(**a), Limits(**b)
    clamped = mine.clamp(ceiling)
    for name in LIMIT_FIELDS:
        got, x, y = getattr(clamped, name), getattr(mine, name), getattr(ceiling, name)
        if name in ("truncate_output", "tolerate"):
            assert got == x
        elif x is None or y is None:
            assert got == (y if x is None else x)
        else:
            assert got == min(x, y)


@pytest.mark.parametrize("field", LIMIT_FIELDS)
@given(value=junk)
def test_a_bad_limit_names_its_field(field: str, value: object) -> None:
    try:
        Limits(**{field: value})
    except ConfigError as e:
        assert names_field(e, f"Limits.{field}"), e


paths = st.lists(st.text(st.characters(exclude_characters="\0"), max_size=12), max_size=4).map(
    lambda parts: "/" + "/".join(parts)
)
policy_kwargs = st.fixed_dictionaries(
    {},
    optional={
        "workdir": st.one_of(st.none(), paths),
        "keep_workdir": st.booleans(),
        "writable_roots": st.lists(paths, max_size=3),
        "deny_read": st.lists(paths, max_size=3),
        "deny_write": st.lists(paths, max_size=3),
        "unix_sockets": st.lists(paths, max_size=3),
        "protect_dotfiles": st.booleans(),
        "env": st.one_of(
            st.just("sanitize"),
            st.lists(st.text(st.characters(exclude_characters="=\0"), min_size=1, max_size=8)),
        ),
        "drop_secrets": st.booleans(),
        "harden": st.booleans(),
        "isolate_pids": st.one_of(st.none(), st.booleans()),
        "capabilities": st.lists(st.sampled_from(["net_bind_service", "CAP_CHOWN", "kill"])),
        "terminal": st.booleans(),
        "strict": st.booleans(),
    },
)
networks = st.one_of(
    st.just({}),
    st.sampled_from([{"network": "allow"}, {"network": "deny"}]),
    st.lists(st.integers(1, 65535), min_size=1, max_size=4).map(
        lambda ports: {"network": "proxy", "proxy_ports": ports}
    ),
)


@given(policy_kwargs, networks)
def test_a_policy_survives_its_round_trip(kwargs: dict[str, Any], network: dict[str, Any]) -> None:
    policy = Policy(**kwargs, **network)
    assert Policy(**json.loads(json.dumps(policy.to_dict()))) == policy
    assert Policy.coerce({**kwargs, **network}) == policy
    for name in ("writable_roots", "deny_read", "deny_write", "unix_sockets"):
        assert all(p.startswith("/") and "//" not in p[1:] for p in getattr(policy, name))


@pytest.mark.parametrize("field", POLICY_FIELDS)
@given(value=junk)
def test_a_bad_policy_field_names_itself(field: str, value: object) -> None:
    try:
        Policy(**{field: value})
    except ConfigError as e:
        assert names_field(e, f"Policy.{field}"), e


# -- manifests -----------------------------------------------------------------------

RESOURCES = ["cpu", "memory", "disk", "pids", "open_files", "file_size", "cpu_time", "output"]
resource_values = {
    "cpu": st.sampled_from(["100m", "2", 1, "1.5"]),
    "memory": startable,
    "disk": sizes,
    "file_size": sizes,
    "output": sizes,
    "pids": st.integers(1, 4096),
    "open_files": st.integers(4, 4096),
    "cpu_time": st.sampled_from(["10s", "1m", 30, "1h30m"]),
}


@st.composite
def manifests(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {}
    keys = draw(st.lists(st.sampled_from(RESOURCES), unique=True))
    if keys or draw(st.booleans()):
        resources: dict[str, Any] = {}
        for k in keys:
            value = draw(resource_values[k])
            form = draw(st.sampled_from(["bare", "limit", "both"]))
            resources[k] = (
                value
                if form == "bare"
                else {"limit": value}
                if form == "limit"
                else {"limit": value, "request": value}
            )
        out["resources"] = resources
    execution = draw(
        st.fixed_dictionaries(
            {},
            optional={
                "max_tool_call_duration": st.sampled_from(["30s", "2m", 5]),
                "max_concurrent_calls": st.integers(1, 50),
                "rate_limit": st.integers(1, 1000).map(lambda n: f"{n}/minute"),
            },
        )
    )
    if execution:
        out["execution_limits"] = execution
    return out


def _value(entry: Any) -> Any:
    return entry["limit"] if isinstance(entry, dict) else entry


@given(manifests())
def test_a_manifest_means_what_it_says(manifest: dict[str, Any]) -> None:
    manifest = json.loads(json.dumps(manifest))  # as read from a file
    limits = Limits.from_manifest(manifest)
    resources = manifest.get("resources", {})
    defaults = {"cpu": "200m", "memory": "256Mi", "disk": "100Mi"}
    for key in RESOURCES:
        want = _value(resources[key]) if key in resources else defaults.get(key)
        expected = Limits(**{key: want}) if want is not None else Limits()
        assert getattr(limits, key) == getattr(expected, key), key
    execution = manifest.get("execution_limits", {})
    assert limits.wall_time == parse_seconds("t", execution.get("max_tool_call_duration", "15s"))
    Gate.from_manifest(manifest)  # the other half of the same manifest reads too


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=12), inner, max_size=3)
    ),
    max_leaves=12,
)
near_manifests = st.one_of(
    json_values,
    st.dictionaries(st.sampled_from(["resources", "execution_limits", "other"]), json_values),
    st.fixed_dictionaries(
        {
            "resources": st.dictionaries(
                st.sampled_from([*RESOURCES, "gpu"]),
                st.one_of(
                    json_values,
                    st.dictionaries(st.sampled_from(["limit", "request", "max"]), json_values),
                ),
            )
        }
    ),
    st.fixed_dictionaries(
        {
            "execution_limits": st.dictionaries(
                st.sampled_from(
                    ["max_tool_call_duration", "max_concurrent_calls", "rate_limit", "retries"]
                ),
                json_values,
            )
        }
    ),
)


@given(near_manifests)
def test_a_bad_manifest_names_the_json_path(manifest: Any) -> None:
    for read in (Limits.from_manifest, Gate.from_manifest):
        try:
            read(manifest)
        except ConfigError as e:
            # "manifest" (the document), or a path that leads to the value.
            assert e.field == "manifest" or _resolves(manifest, e.field), e


def _resolves(manifest: Any, path: str) -> bool:
    if not isinstance(manifest, dict):
        return False
    if path in manifest:  # a top-level key (which may hold a dot itself)
        return True
    head, _, rest = path.partition(".")
    return head in manifest and _resolves(manifest[head], rest)


# -- FIELD=VALUE words and the CLI's flags ---------------------------------------------

limit_texts = {
    "memory": startable.map(str),
    "wall_time": st.integers(1, 10**5).map(lambda n: f"{n}ms"),
    "pids": st.integers(1, 10**5).map(str),
    "cpu": st.integers(1, 64000).map(lambda n: f"{n}m"),
    "network": st.sampled_from(["allow", "deny"]),
    "harden": st.sampled_from(["true", "no", "on", "0"]),
    "deny_read": st.lists(paths.filter(lambda p: "," not in p), min_size=1, max_size=3).map(
        ",".join
    ),
}


@given(st.dictionaries(st.sampled_from(sorted(limit_texts)), st.just(None), min_size=1), st.data())
def test_words_mean_what_each_field_says(keys: dict[str, None], data: st.DataObject) -> None:
    words = {k: data.draw(limit_texts[k]) for k in keys}
    text = shlex.join(f"{k.replace('_', '-')}={v}" for k, v in words.items())
    assert parse_words(text, "--sbxlimit-defaults") == {
        k: field_value(k, from_text(k, v)) for k, v in words.items()
    }


@given(st.text(max_size=60))
def test_any_words_parse_or_name_their_source(text: str) -> None:
    try:
        parse_words(text, "SBXLIMIT_DEFAULTS")
    except ConfigError as e:
        assert e.field.startswith("SBXLIMIT_DEFAULTS"), e


CLI = _cli._parser()


class _Exit(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise _Exit(message)


VALUE_FLAGS = [
    (f.flags[0], name)
    for name, f in _cli._FLAGS.items()
    if f.kind == "value" and name in LIMIT_FIELDS
]


@pytest.mark.parametrize(("flag", "field"), VALUE_FLAGS)
@given(value=st.one_of(st.text(max_size=30), st.text("0123456789", min_size=4290, max_size=4400)))
def test_a_cli_flag_reads_its_value_or_names_itself(flag: str, field: str, value: str) -> None:
    assume(not value.startswith("-") and value.lower() != "none")  # none: unlimited
    args = CLI.parse_args(["run", "--no-config", flag, value, "--", "true"])
    try:
        limits = _cli._settings(args).limits
    except ConfigError as e:
        assert e.field == f"{flag} {value}", e
        with pytest.raises(ConfigError):
            Limits(**{field: value})
    else:
        assert limits is not None and getattr(limits, field) == getattr(
            Limits(**{field: value}), field
        )
