"""Limits, Policy, unit parsing and the error hierarchy (SPEC sections 2, 3, 10).

Pure Python: nothing here starts a process.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import json
import math
import os
import pathlib
import pickle
import subprocess

import pytest

import sbxlimit
from sbxlimit import ConfigError, LimitExceeded, Limits, Policy, SandboxSetupError
from sbxlimit._units import (
    Millicores,
    format_bytes,
    format_seconds,
    parse_bytes,
    parse_count,
    parse_millicores,
    parse_rate,
    parse_seconds,
)

Ki, Mi, Gi = 2**10, 2**20, 2**30

SPEC_MANIFEST = {
    "resources": {
        "cpu": {"limit": "500m"},
        "memory": {"limit": "512Mi"},
        "disk": {"limit": "1Gi"},
    },
    "execution_limits": {
        "max_tool_call_duration": "30s",
        "max_concurrent_calls": 5,
        "rate_limit": "100/minute",
    },
}


def check_config_error(exc: BaseException, field: str, value: object) -> None:
    """A ConfigError that names the field and shows the input as given."""
    assert isinstance(exc, ConfigError)
    assert isinstance(exc, ValueError)
    assert exc.field == field
    assert field in str(exc)
    assert repr(value) in str(exc)


# ---------------------------------------------------------------------------
# 1. Units
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("512Mi", 536870912),
        ("1G", 10**9),
        ("1.5Gi", 1610612736),
        ("100K", 100_000),
        ("100k", 100_000),
        ("1Ki", 1024),
        ("2Ti", 2 * 2**40),
        ("4096", 4096),
        (4096, 4096),
        (4096.0, 4096),
        ("512MiB", 512 * Mi),
        ("512MB", 512 * 10**6),
        ("512B", 512),
        (" 64Mi ", 64 * Mi),
        ("64 Mi", 64 * Mi),
        (".5Ki", 512),
        ("1.", 1),
    ],
)
def test_parse_bytes_accepts(value, expected):
    result = parse_bytes("f", value)
    assert result == expected
    assert type(result) is int


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0.0001Ki", 1),
        ("1.0001K", 1001),
        ("0.3Gi", math.ceil(0.3 * Gi)),
    ],
)
def test_parse_bytes_rounds_fractions_up(value, expected):
    assert parse_bytes("f", value) == expected


@pytest.mark.parametrize("value", ["1.5", 1.5, 0.001, "0.1", " 2.5 B"])
def test_parse_bytes_refuses_a_fraction_of_a_byte(value):
    # "1.5" was 2 bytes: a unit left out, not a size anyone means.
    with pytest.raises(ConfigError, match="unit") as info:
        parse_bytes("Limits.memory", value)
    check_config_error(info.value, "Limits.memory", value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1gi", Gi),
        ("1GI", Gi),
        ("2mi", 2 * Mi),
        ("1kib", 1024),
        ("1KIB", 1024),
        ("1g", 10**9),
        ("1gb", 10**9),
        ("1mb", 10**6),
        ("1MB", 10**6),
        ("3kb", 3000),
    ],
)
def test_parse_bytes_units_in_any_case(value, expected):
    # "1k" was accepted and "1gi" refused: the case of a unit means nothing
    # but for a bare "m" (Kubernetes' milli).
    assert parse_bytes("f", value) == expected


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("memory", "100"),
        ("memory", 4096),
        ("memory", "1000Ki"),
        ("address_space", "2Mi"),
        ("open_files", 3),
        ("open_files", "1"),
    ],
)
def test_limits_below_what_any_program_starts_with_are_refused(field, value):
    # `--memory 100` ran /bin/true into exit 127 with nothing said.
    with pytest.raises(ConfigError) as info:
        Limits(**{field: value})
    check_config_error(info.value, f"Limits.{field}", value)
    assert "at least" in str(info.value)


def test_a_tiny_size_without_a_unit_suggests_one():
    with pytest.raises(ConfigError, match="did you mean '100Mi'"):
        Limits(memory="100")


@pytest.mark.parametrize(
    "value",
    [
        -1,
        -0.5,
        "-1",
        "-1Mi",
        float("nan"),
        float("inf"),
        float("-inf"),
        True,
        False,
        None,
        [1],
        {"a": 1},
        b"512Mi",
        "",
        "   ",
        "12Zi",
        "Mi",
        "1.2.3",
        "1e6",
        "nan",
        "inf",
        "512\0Mi",
        "8Ei",
        2**63,
    ],
)
def test_parse_bytes_rejects(value):
    with pytest.raises(ConfigError) as info:
        parse_bytes("Limits.memory", value)
    check_config_error(info.value, "Limits.memory", value)


def test_parse_bytes_nul_byte_is_named():
    with pytest.raises(ConfigError, match="NUL"):
        parse_bytes("f", "1\0")


@pytest.mark.parametrize("value", ["5m", "512m", " 1.5 m "])
def test_parse_bytes_lowercase_m_hints_at_mi(value):
    with pytest.raises(ConfigError) as info:
        parse_bytes("Limits.memory", value)
    check_config_error(info.value, "Limits.memory", value)
    assert "Mi" in str(info.value)
    assert "milli" in str(info.value)


@pytest.mark.parametrize("value", [0, "0", "0Mi", 0.0, "0.0"])
def test_parse_bytes_zero(value):
    with pytest.raises(ConfigError, match="greater than zero"):
        parse_bytes("f", value)
    assert parse_bytes("f", value, allow_zero=True) == 0


@pytest.mark.parametrize(
    ("parse", "value", "expected"),
    [
        (parse_bytes, "16.1K", 16100),
        (parse_bytes, "32.2K", 32200),
        (parse_millicores, "4.03", 4030),
        (parse_millicores, "2.007", 2007),
    ],
)
def test_exact_decimal_strings_are_not_rounded_up(parse, value, expected):
    assert parse("f", value) == expected


def test_parse_bytes_keeps_large_ints_exact():
    assert parse_bytes("f", 2**53 + 1) == 2**53 + 1


@pytest.mark.parametrize(
    ("parse", "value"),
    [
        (parse_bytes, 10**400),
        (parse_seconds, 10**400),
        (parse_millicores, 10**400),
        (parse_bytes, "9" * 400),
        (parse_millicores, "9" * 400),
    ],
    ids=["bytes-int", "seconds-int", "cpu-int", "bytes-str", "cpu-str"],
)
def test_huge_numbers_raise_config_error(parse, value):
    with pytest.raises(ConfigError):
        parse("f", value)


def test_huge_duration_string_is_config_error():
    with pytest.raises(ConfigError, match="finite"):
        parse_seconds("f", "9" * 400)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("30s", 30.0),
        ("500ms", 0.5),
        ("2m", 120.0),
        ("1h30m", 5400.0),
        ("1h 30m", 5400.0),
        ("1m30s", 90.0),
        ("100us", 1e-4),
        ("1d", 86400.0),
        ("1.5", 1.5),
        (" 7 ", 7.0),
        (".5s", 0.5),
        (2, 2.0),
        (0.25, 0.25),
        (datetime.timedelta(minutes=1, seconds=5), 65.0),
    ],
)
def test_parse_seconds_accepts(value, expected):
    result = parse_seconds("f", value)
    assert result == pytest.approx(expected)
    assert type(result) is float


@pytest.mark.parametrize("value", ["0", "0s", 0, 0.0, "0ms", datetime.timedelta(0)])
def test_parse_seconds_zero(value):
    with pytest.raises(ConfigError, match="greater than zero"):
        parse_seconds("f", value)
    assert parse_seconds("f", value, allow_zero=True) == 0.0


@pytest.mark.parametrize(
    "value",
    [
        "abc",
        "1x",
        "x1s",
        "1s x",
        "1s2",
        "s",
        "",
        "-1",
        "-1s",
        -1,
        -0.5,
        datetime.timedelta(seconds=-1),
        float("nan"),
        float("inf"),
        "nan",
        "inf",
        True,
        None,
        [1],
        "1\0s",
    ],
)
def test_parse_seconds_rejects(value):
    with pytest.raises(ConfigError) as info:
        parse_seconds("Limits.wall_time", value)
    check_config_error(info.value, "Limits.wall_time", value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("500m", 500),
        (" 250m ", 250),
        ("1.5", 1500),
        (1.5, 1500),
        ("2", 2000),
        (2, 2000),
        (0.5, 500),
        ("0.5m", 1),
        ("1.1", 1100),
        (0.0001, 1),
    ],
)
def test_parse_millicores_accepts(value, expected):
    result = parse_millicores("f", value)
    assert result == expected
    # Millicores (an int) marks the value as normalised: parsing it again
    # keeps it, where a plain int would be read as cores.
    assert type(result) is Millicores
    assert parse_millicores("f", result) == expected


@pytest.mark.parametrize(
    "value",
    [
        "0m",
        "0",
        0,
        0.0,
        "-1",
        -1,
        "-500m",
        "500Mi",
        "500 millicores",
        "abc",
        "",
        True,
        None,
        [1],
        float("nan"),
        float("inf"),
        "5\0m",
    ],
)
def test_parse_millicores_rejects(value):
    with pytest.raises(ConfigError) as info:
        parse_millicores("Limits.cpu", value)
    check_config_error(info.value, "Limits.cpu", value)


@pytest.mark.parametrize(
    ("value", "minimum", "expected"),
    [
        (5, 1, 5),
        ("5", 1, 5),
        (" 12 ", 1, 12),
        (5.0, 1, 5),
        (0, 0, 0),
        ("0", 0, 0),
        (2**62, 1, 2**62),
    ],
)
def test_parse_count_accepts(value, minimum, expected):
    result = parse_count("f", value, minimum=minimum)
    assert result == expected
    assert type(result) is int


@pytest.mark.parametrize(
    "value",
    [0, "0", -1, "-1", "+5", 5.5, "5.5", "5.0", "", "five", True, False, None, [5],
     float("nan"), float("inf"), 2**62 + 1, "5\0"],
)  # fmt: skip
def test_parse_count_rejects(value):
    with pytest.raises(ConfigError) as info:
        parse_count("Limits.pids", value)
    check_config_error(info.value, "Limits.pids", value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("100/minute", (100, 60.0)),
        ("1/second", (1, 1.0)),
        ("5/hour", (5, 3600.0)),
        ("10/s", (10, 1.0)),
        ("10/min", (10, 60.0)),
        (" 3 / h ", (3, 3600.0)),
    ],
)
def test_parse_rate_accepts(value, expected):
    assert parse_rate("f", value) == expected


@pytest.mark.parametrize(
    "value",
    ["0/minute", "-1/minute", "1.5/minute", "100", "100/day", "/minute", "", 100, None,
     (100, 60), "1/minute\0"],
)  # fmt: skip
def test_parse_rate_rejects(value):
    with pytest.raises(ConfigError) as info:
        parse_rate("execution_limits.rate_limit", value)
    check_config_error(info.value, "execution_limits.rate_limit", value)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1, "1 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (Mi, "1.0 MiB"),
        (99 * Mi, "99.0 MiB"),
        (100 * Mi, "100 MiB"),
        (512 * Mi, "512 MiB"),
        (Gi + Gi // 2, "1.5 GiB"),
        (2**50, "1.0 PiB"),
        (2**60, "1024 PiB"),
    ],
)
def test_format_bytes(n, text):
    assert format_bytes(n) == text


@pytest.mark.parametrize(
    ("s", "text"),
    [
        (2.5, "2.5 s"),
        (0.25, "250 ms"),
        (0.0, "0 ms"),
        (0.001, "1 ms"),
        (1, "1 s"),
        (90, "90 s"),
        (90.0, "90 s"),
        (3.75, "3.8 s"),
    ],
)
def test_format_seconds(s, text):
    assert format_seconds(s) == text


# ---------------------------------------------------------------------------
# 2. Limits
# ---------------------------------------------------------------------------


def test_limits_defaults():
    lim = Limits()
    assert lim.kill_grace == 5.0
    assert lim.truncate_output is False
    for name in ("memory", "cpu_time", "cpu", "pids", "open_files", "file_size", "disk",
                 "wall_time", "output", "address_space"):  # fmt: skip
        assert getattr(lim, name) is None
    assert lim.asked() == {}


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("memory", "512Mi", 512 * Mi),
        ("memory", 2**20, 2**20),
        ("address_space", "4Gi", 4 * Gi),
        ("file_size", "10Mi", 10 * Mi),
        ("file_size", 0, 0),
        ("disk", "1G", 10**9),
        ("output", "1Mi", Mi),
        ("output", "0", 0),
        ("cpu_time", "10s", 10.0),
        ("cpu_time", 2, 2.0),
        ("wall_time", "1h30m", 5400.0),
        ("wall_time", datetime.timedelta(seconds=3), 3.0),
        ("kill_grace", "500ms", 0.5),
        ("kill_grace", 0, 0.0),
        ("kill_grace", "0s", 0.0),
        ("cpu", "500m", 500),
        ("cpu", 1.5, 1500),
        ("cpu", 2, 2000),
        ("pids", 64, 64),
        ("pids", "64", 64),
        ("open_files", 256.0, 256),
        ("truncate_output", True, True),
    ],
)
def test_limits_normalises(field, value, expected):
    lim = Limits(**{field: value})
    got = getattr(lim, field)
    assert got == expected
    if field == "cpu":
        assert type(got) is Millicores
    else:
        assert type(got) is type(expected)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("memory", "5m"),
        ("memory", 0),
        ("memory", -1),
        ("memory", True),
        ("memory", float("nan")),
        ("address_space", "0"),
        ("disk", 0),
        ("disk", "1Zi"),
        ("file_size", -1),
        ("output", [1]),
        ("cpu_time", "0"),
        ("cpu_time", "abc"),
        ("wall_time", -1),
        ("wall_time", float("inf")),
        ("kill_grace", -1),
        ("kill_grace", None),
        ("cpu", "0m"),
        ("cpu", "500Mi"),
        ("pids", 0),
        ("pids", 1.5),
        ("open_files", "many"),
        ("open_files", True),
        ("truncate_output", 1),
        ("truncate_output", "yes"),
        ("truncate_output", None),
    ],
)
def test_limits_rejects_naming_field_and_input(field, value):
    with pytest.raises(ConfigError) as info:
        Limits(**{field: value})
    check_config_error(info.value, f"Limits.{field}", value)
    assert isinstance(info.value, sbxlimit.Error)


def test_limits_is_keyword_only():
    with pytest.raises(TypeError):
        Limits("512Mi")  # type: ignore[misc]


def test_limits_is_immutable():
    lim = Limits(memory="1Gi")
    with pytest.raises(dataclasses.FrozenInstanceError):
        lim.memory = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        lim.kill_grace = 1.0  # type: ignore[misc]
    assert lim.memory == Gi


def test_limits_equality_and_hash():
    a = Limits(memory="512Mi", cpu_time="2s", cpu="1500m", pids="10")
    b = Limits(memory=536870912, cpu_time=2, cpu=1.5, pids=10)
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1
    assert a != Limits(memory="512Mi")
    assert {a: "x"}[b] == "x"


def test_limits_coerce():
    lim = Limits(memory="1Gi")
    assert Limits.coerce(lim) is lim
    assert Limits.coerce(None) is None
    assert Limits.coerce({"memory": "1Gi"}) == lim
    assert Limits.coerce({}) == Limits()


def test_limits_coerce_rejects_unknown_fields():
    with pytest.raises(ConfigError) as info:
        Limits.coerce({"memory": "1Gi", "memroy": "1Gi", "gpu": 1})
    assert info.value.field == "limits"
    assert "gpu" in str(info.value)
    assert "memroy" in str(info.value)


def test_limits_coerce_unknown_keys_of_any_type():
    with pytest.raises(ConfigError) as info:
        Limits.coerce({1: 2, "x": 3, "memory": "1Gi"})  # type: ignore[dict-item]
    assert info.value.field == "limits" and "'x'" in str(info.value) and "1" in str(info.value)


@pytest.mark.parametrize(
    "kw",
    [
        {"cpu_time": 2**63},
        {"cpu_time": 1e19},
        {"wall_time": "99999999999999999999999d"},
        {"kill_grace": 1e300},
    ],
)
def test_durations_past_what_anything_can_wait_are_refused(kw):
    with pytest.raises(ConfigError, match="too large"):
        Limits(**kw)


def test_a_manifest_duration_past_any_timer_is_refused():
    manifest = {"execution_limits": {"max_tool_call_duration": "99999999999999999999999d"}}
    with pytest.raises(ConfigError, match="too large"):
        Limits.from_manifest(manifest)


def test_the_longest_durations_accepted_still_spawn():
    from sbxlimit._units import MAX_SECONDS

    r = sbxlimit.run(["true"], limits=Limits(cpu_time=MAX_SECONDS, wall_time=MAX_SECONDS))
    assert r.returncode == 0


@pytest.mark.parametrize("value", ["512Mi", 5, ["memory"], Policy(), (("memory", 1),)])
def test_limits_coerce_rejects_wrong_types(value):
    with pytest.raises(ConfigError) as info:
        Limits.coerce(value)  # type: ignore[arg-type]
    assert info.value.field == "limits"


def test_limits_coerce_validates_values():
    with pytest.raises(ConfigError) as info:
        Limits.coerce({"memory": "5m"})
    check_config_error(info.value, "Limits.memory", "5m")


FULL = Limits(
    memory="512Mi",
    cpu_time="10s",
    pids=64,
    open_files=256,
    file_size="10Mi",
    disk="1Gi",
    wall_time="30s",
    output="1Mi",
    kill_grace="2s",
    address_space="4Gi",
    truncate_output=True,
)


def test_limits_to_dict_is_json():
    d = FULL.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["memory"] == 512 * Mi
    assert d["cpu_time"] == 10.0
    assert d["truncate_output"] is True
    assert set(d) == {f.name for f in dataclasses.fields(Limits)}


def test_limits_to_dict_round_trips_without_cpu():
    assert Limits(**FULL.to_dict()) == FULL
    assert Limits(**json.loads(json.dumps(FULL.to_dict()))) == FULL


def test_limits_to_dict_round_trips_cpu():
    lim = Limits(cpu="500m")
    assert Limits(**lim.to_dict()) == lim


def test_limits_pickle_and_replace_round_trip():
    assert pickle.loads(pickle.dumps(FULL)) == FULL
    assert pickle.loads(pickle.dumps(Limits(cpu="500m"))).cpu == 500
    assert dataclasses.replace(FULL) == FULL


def test_limits_asked_lists_only_limiting_fields():
    assert Limits().asked() == {}
    assert Limits(kill_grace=1, truncate_output=True).asked() == {}
    assert Limits(memory="1Mi", file_size=0, wall_time=3).asked() == {
        "memory": Mi,
        "file_size": 0,
        "wall_time": 3.0,
    }
    assert "kill_grace" not in FULL.asked()
    assert "truncate_output" not in FULL.asked()
    assert set(FULL.asked()) == {k for k, v in FULL.to_dict().items() if v is not None} - {
        "kill_grace",
        "truncate_output",
        "tolerate",
    }


# ---------------------------------------------------------------------------
# 3. Limits.from_manifest
# ---------------------------------------------------------------------------


def test_from_manifest_spec_example():
    lim = Limits.from_manifest(SPEC_MANIFEST)
    assert lim.cpu == 500
    assert lim.memory == 512 * Mi
    assert lim.disk == Gi
    assert lim.wall_time == 30.0
    assert lim.kill_grace == 5.0
    assert lim.pids is None


def test_from_manifest_round_trips_through_json():
    assert Limits.from_manifest(json.loads(json.dumps(SPEC_MANIFEST))) == Limits.from_manifest(
        SPEC_MANIFEST
    )


@pytest.mark.parametrize(
    "manifest",
    [
        {},
        {"resources": {}},
        {"execution_limits": {}},
        {"resources": {}, "execution_limits": {}},
        {"resources": {"cpu": {"request": "100m"}, "memory": {"request": "64Mi"}}},
    ],
)
def test_from_manifest_defaults(manifest):
    lim = Limits.from_manifest(manifest)
    assert lim.cpu == 200
    assert lim.memory == 256 * Mi
    assert lim.disk == 100 * Mi
    assert lim.wall_time == 15.0
    assert lim.pids is None
    assert lim.cpu_time is None


def test_from_manifest_partial_keeps_other_defaults():
    lim = Limits.from_manifest({"resources": {"memory": {"limit": "1Gi"}}})
    assert (lim.memory, lim.cpu, lim.disk, lim.wall_time) == (Gi, 200, 100 * Mi, 15.0)


@pytest.mark.parametrize(
    ("cpu", "millicores"),
    [("500m", 500), ("1.5", 1500), (2, 2000), (0.25, 250), ("1", 1000)],
)
def test_from_manifest_cpu_units(cpu, millicores):
    assert Limits.from_manifest({"resources": {"cpu": {"limit": cpu}}}).cpu == millicores


def test_from_manifest_max_tool_call_duration_is_wall_time():
    for value, seconds in [("2m", 120.0), (45, 45.0), ("1h30m", 5400.0), ("500ms", 0.5)]:
        m = {"execution_limits": {"max_tool_call_duration": value}}
        assert Limits.from_manifest(m).wall_time == seconds


def test_from_manifest_other_resources_and_bare_values():
    lim = Limits.from_manifest(
        {
            "resources": {
                "memory": "128Mi",
                "pids": {"limit": 32},
                "open_files": 100,
                "file_size": {"limit": "1Mi", "request": "1Ki"},
                "cpu_time": {"limit": "5s"},
                "output": {"limit": 0},
            }
        }
    )
    assert lim.memory == 128 * Mi
    assert lim.pids == 32
    assert lim.open_files == 100
    assert lim.file_size == Mi
    assert lim.cpu_time == 5.0
    assert lim.output == 0


@pytest.mark.parametrize(
    ("manifest", "path", "value"),
    [
        ({"resources": {"memory": {"limit": "5m"}}}, "resources.memory.limit", "5m"),
        ({"resources": {"memory": {"limit": -1}}}, "resources.memory.limit", -1),
        ({"resources": {"memory": "lots"}}, "resources.memory", "lots"),
        ({"resources": {"disk": {"limit": "0"}}}, "resources.disk.limit", "0"),
        ({"resources": {"cpu": {"limit": "0m"}}}, "resources.cpu.limit", "0m"),
        ({"resources": {"cpu": {"limit": "fast"}}}, "resources.cpu.limit", "fast"),
        ({"resources": {"pids": {"limit": 0}}}, "resources.pids.limit", 0),
        ({"resources": {"cpu_time": {"limit": "1x"}}}, "resources.cpu_time.limit", "1x"),
        ({"resources": {"memory": {"limit": None}}}, "resources.memory.limit", None),
        (
            {"execution_limits": {"max_tool_call_duration": "forever"}},
            "execution_limits.max_tool_call_duration",
            "forever",
        ),
        (
            {"execution_limits": {"max_tool_call_duration": 0}},
            "execution_limits.max_tool_call_duration",
            0,
        ),
        (
            {"execution_limits": {"max_concurrent_calls": 0}},
            "execution_limits.max_concurrent_calls",
            0,
        ),
        (
            {"execution_limits": {"max_concurrent_calls": "many"}},
            "execution_limits.max_concurrent_calls",
            "many",
        ),
        (
            {"execution_limits": {"max_concurrent_calls": True}},
            "execution_limits.max_concurrent_calls",
            True,
        ),
        (
            {"execution_limits": {"rate_limit": "100/fortnight"}},
            "execution_limits.rate_limit",
            "100/fortnight",
        ),
        ({"execution_limits": {"rate_limit": 100}}, "execution_limits.rate_limit", 100),
        (
            {"execution_limits": {"rate_limit": "0/minute"}},
            "execution_limits.rate_limit",
            "0/minute",
        ),
    ],
)
def test_from_manifest_bad_values_name_json_path(manifest, path, value):
    with pytest.raises(ConfigError) as info:
        Limits.from_manifest(manifest)
    check_config_error(info.value, path, value)


def test_from_manifest_valid_concurrency_and_rate_do_not_change_limits():
    base = Limits.from_manifest({})
    m = {"execution_limits": {"max_concurrent_calls": 5, "rate_limit": "10/second"}}
    assert Limits.from_manifest(m) == base


def test_from_manifest_unknown_resource():
    with pytest.raises(ConfigError) as info:
        Limits.from_manifest({"resources": {"gpu": {"limit": 1}}})
    assert info.value.field == "resources.gpu"
    assert "unknown resource" in str(info.value)


def test_from_manifest_unknown_key_in_resource_entry():
    with pytest.raises(ConfigError) as info:
        Limits.from_manifest({"resources": {"memory": {"limit": "1Gi", "max": "2Gi"}}})
    assert info.value.field == "resources.memory"
    assert "max" in str(info.value)


def test_from_manifest_unknown_execution_limit():
    with pytest.raises(ConfigError) as info:
        Limits.from_manifest({"execution_limits": {"max_calls": 5}})
    assert info.value.field == "execution_limits.max_calls"
    # as Gate.from_manifest says it: what is known
    assert "unknown execution limit; known: ['max_concurrent_calls'," in str(info.value)


def test_from_manifest_unknown_section():
    with pytest.raises(ConfigError) as info:
        Limits.from_manifest({"resources": {}, "limits": {}})
    assert info.value.field == "limits"
    assert "unknown manifest section" in str(info.value)


@pytest.mark.parametrize("manifest", [None, [], "resources", 5, [("resources", {})]])
def test_from_manifest_rejects_non_mapping(manifest):
    with pytest.raises(ConfigError) as info:
        Limits.from_manifest(manifest)  # type: ignore[arg-type]
    assert info.value.field == "manifest"


@pytest.mark.parametrize("section", ["resources", "execution_limits"])
@pytest.mark.parametrize("value", [[], "x", 5, None])
def test_from_manifest_rejects_non_mapping_sections(section, value):
    with pytest.raises(ConfigError) as info:
        Limits.from_manifest({section: value})
    assert info.value.field == section


# ---------------------------------------------------------------------------
# 4. Limits.clamp
# ---------------------------------------------------------------------------


def test_clamp_takes_stricter_of_each_field():
    request = Limits(memory="1Gi", wall_time="60s", pids=100, file_size=0, kill_grace=10)
    ceiling = Limits(memory="512Mi", wall_time="120s", pids=50, file_size="1Mi", kill_grace=1)
    got = request.clamp(ceiling)
    assert got.memory == 512 * Mi
    assert got.wall_time == 60.0
    assert got.pids == 50
    assert got.file_size == 0
    assert got.kill_grace == 1.0


def test_clamp_none_loses_to_a_value():
    got = Limits(memory="1Gi").clamp(Limits(disk="10Mi", cpu_time="3s"))
    assert got.memory == Gi
    assert got.disk == 10 * Mi
    assert got.cpu_time == 3.0
    assert got.open_files is None
    assert Limits().clamp(Limits()) == Limits()


def test_clamp_keeps_own_truncate_output():
    assert Limits(truncate_output=True).clamp(Limits(truncate_output=False)).truncate_output
    assert not Limits(truncate_output=False).clamp(Limits(truncate_output=True)).truncate_output


def test_clamp_returns_new_object():
    a = Limits(memory="1Gi")
    b = a.clamp(Limits(memory="1Mi"))
    assert a.memory == Gi
    assert b.memory == Mi
    assert b is not a


def test_clamp_is_symmetric_for_limits_fields():
    a = Limits(memory="1Gi", wall_time=5, pids=10)
    b = Limits(memory="1Mi", wall_time=50, open_files=20)
    assert a.clamp(b) == b.clamp(a)


@pytest.mark.parametrize("ceiling", [None, {"memory": "1Gi"}, "1Gi", 5])
def test_clamp_ceiling_must_be_limits(ceiling):
    with pytest.raises(ConfigError) as info:
        Limits().clamp(ceiling)  # type: ignore[arg-type]
    assert info.value.field == "ceiling"


@pytest.mark.parametrize(
    ("mine", "theirs", "expected"),
    [("500m", None, 500), (None, "500m", 500), ("2", "500m", 500), ("250m", "1", 250)],
)
def test_clamp_cpu(mine, theirs, expected):
    assert Limits(cpu=mine).clamp(Limits(cpu=theirs)).cpu == expected


def test_clamp_manifest_limits_by_operator_ceiling():
    got = Limits.from_manifest(SPEC_MANIFEST).clamp(Limits(memory="256Mi"))
    assert got.memory == 256 * Mi
    assert got.cpu == 500


# ---------------------------------------------------------------------------
# 5. Policy
# ---------------------------------------------------------------------------


def test_policy_defaults():
    p = Policy()
    assert p.workdir is None
    assert p.keep_workdir is False
    assert p.writable_roots == ()
    assert p.deny_read == ()
    assert p.deny_write == ()
    assert p.protect_dotfiles is True
    assert p.network == "allow"
    assert p.proxy_ports == ()
    assert p.env == "sanitize"
    assert p.harden is True
    assert p.isolate_pids is None  # automatic: where no cgroup holds the tree
    assert p.strict is False


def test_policy_is_immutable_and_hashable():
    p = Policy(writable_roots=["/tmp/a"], env=["PATH"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.network = "deny"  # type: ignore[misc]
    assert p == Policy(writable_roots=("/tmp/a",), env=("PATH",))
    assert hash(p) == hash(Policy(writable_roots=("/tmp/a",), env=("PATH",)))


@pytest.mark.parametrize(
    ("kwargs", "field", "value"),
    [
        ({"workdir": "rel/dir"}, "Policy.workdir", "rel/dir"),
        ({"workdir": "."}, "Policy.workdir", "."),
        ({"workdir": ""}, "Policy.workdir", ""),
        ({"writable_roots": ["rel"]}, "Policy.writable_roots[0]", "rel"),
        ({"writable_roots": ["/ok", "rel"]}, "Policy.writable_roots[1]", "rel"),
        ({"deny_read": ["/ok", "/ok2", "x"]}, "Policy.deny_read[2]", "x"),
        ({"deny_write": [pathlib.Path("rel")]}, "Policy.deny_write[0]", pathlib.Path("rel")),
    ],
)
def test_policy_rejects_relative_paths(kwargs, field, value):
    with pytest.raises(ConfigError) as info:
        Policy(**kwargs)
    check_config_error(info.value, field, value)
    assert "absolute" in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"workdir": "/tmp/a\0b"}, "Policy.workdir"),
        ({"workdir": b"/tmp/a\0b"}, "Policy.workdir"),
        ({"writable_roots": ["/tmp/\0"]}, "Policy.writable_roots[0]"),
        ({"deny_read": ["/etc", "/etc/\0shadow"]}, "Policy.deny_read[1]"),
    ],
)
def test_policy_rejects_nul_bytes(kwargs, field):
    with pytest.raises(ConfigError, match="NUL") as info:
        Policy(**kwargs)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"workdir": 5}, "Policy.workdir"),
        ({"writable_roots": "/tmp"}, "Policy.writable_roots"),
        ({"writable_roots": b"/tmp"}, "Policy.writable_roots"),
        ({"deny_read": pathlib.Path("/tmp")}, "Policy.deny_read"),
        ({"deny_write": None}, "Policy.deny_write"),
        ({"writable_roots": [None]}, "Policy.writable_roots[0]"),
    ],
)
def test_policy_rejects_path_types(kwargs, field):
    with pytest.raises(ConfigError) as info:
        Policy(**kwargs)
    assert info.value.field == field


def test_policy_accepts_pathlike_and_normalises():
    p = Policy(
        workdir=pathlib.Path("/tmp/work/./sub/.."),
        writable_roots=[pathlib.Path("/tmp/a/../b"), "/var//tmp/"],
        deny_read=(x for x in ["/etc/ssh/"]),
        deny_write=[b"/home/u/.ssh"],
    )
    assert p.workdir == "/tmp/work"
    assert p.writable_roots == ("/tmp/b", "/var/tmp")
    assert p.deny_read == ("/etc/ssh",)
    assert p.deny_write == ("/home/u/.ssh",)
    assert all(isinstance(x, str) for x in (*p.writable_roots, *p.deny_read, *p.deny_write))


class _Fs(os.PathLike):
    def __fspath__(self) -> str:
        return "/srv/data/"


def test_policy_accepts_custom_pathlike():
    assert Policy(workdir=_Fs()).workdir == "/srv/data"


@pytest.mark.parametrize("network", ["allow", "deny"])
def test_policy_network_modes(network):
    assert Policy(network=network).network == network


@pytest.mark.parametrize("network", ["ALLOW", "none", "", None, True, ["deny"]])
def test_policy_network_rejects(network):
    with pytest.raises(ConfigError) as info:
        Policy(network=network)
    assert info.value.field == "Policy.network"


def test_policy_proxy_ports_sorted_and_deduplicated():
    p = Policy(network="proxy", proxy_ports=[8080, 3128, 8080])
    assert p.proxy_ports == (3128, 8080)
    assert Policy(network="proxy", proxy_ports=(1, 65535)).proxy_ports == (1, 65535)


def test_policy_proxy_needs_ports():
    with pytest.raises(ConfigError, match=r"needs allow_domains .* or proxy_ports") as info:
        Policy(network="proxy")
    assert info.value.field == "Policy.proxy_ports"


@pytest.mark.parametrize("network", ["allow", "deny"])
def test_policy_ports_need_proxy(network):
    with pytest.raises(ConfigError, match="proxy") as info:
        Policy(network=network, proxy_ports=[8080])
    assert info.value.field == "Policy.proxy_ports"


@pytest.mark.parametrize(
    "ports", [[0], [65536], [-1], [True], ["8080"], [80.0], 8080, "8080", None]
)
def test_policy_proxy_ports_rejects(ports):
    with pytest.raises(ConfigError) as info:
        Policy(network="proxy", proxy_ports=ports)
    assert info.value.field == "Policy.proxy_ports"


def test_policy_env_allow_list():
    p = Policy(env=["PATH", "HOME", "LANG"])
    assert p.env == ("PATH", "HOME", "LANG")
    assert Policy(env=()).env == ()


@pytest.mark.parametrize(
    "env", ["keep", "", "PATH", b"PATH", 5, None, ["A=B"], [""], ["A\0B"], [b"PATH"], [1]]
)
def test_policy_env_rejects(env):
    with pytest.raises(ConfigError) as info:
        Policy(env=env)
    assert info.value.field == "Policy.env"


ENV = {
    "PATH": "/usr/bin",
    "HOME": "/home/u",
    "LD_PRELOAD": "/evil.so",
    "LD_LIBRARY_PATH": "/evil",
    "DYLD_INSERT_LIBRARIES": "/evil.dylib",
    "DYLD_LIBRARY_PATH": "/evil",
    "OLD_LD_": "kept",
    "MY_LD_THING": "kept",
}


def test_filter_env_sanitize_drops_loader_variables():
    got = Policy().filter_env(ENV)
    assert got == {"PATH": "/usr/bin", "HOME": "/home/u", "OLD_LD_": "kept", "MY_LD_THING": "kept"}


def test_filter_env_sanitize_bytes_keys():
    env = {os.fsencode(k): os.fsencode(v) for k, v in ENV.items()}
    got = Policy().filter_env(env)
    assert set(got) == {b"PATH", b"HOME", b"OLD_LD_", b"MY_LD_THING"}
    assert got[b"PATH"] == b"/usr/bin"


def test_filter_env_does_not_modify_input():
    env = dict(ENV)
    Policy().filter_env(env)
    assert env == ENV


def test_filter_env_allow_list_keeps_only_listed():
    p = Policy(env=["PATH", "LD_PRELOAD", "MISSING"])
    assert p.filter_env(ENV) == {"PATH": "/usr/bin", "LD_PRELOAD": "/evil.so"}
    assert p.filter_env({b"PATH": b"/bin", b"HOME": b"/h"}) == {b"PATH": b"/bin"}
    assert Policy(env=()).filter_env(ENV) == {}


@pytest.mark.parametrize("field", ["keep_workdir", "protect_dotfiles", "harden", "strict"])
@pytest.mark.parametrize("value", [1, 0, "yes", None])
def test_policy_bool_fields_must_be_bool(field, value):
    with pytest.raises(ConfigError) as info:
        Policy(**{field: value})
    check_config_error(info.value, f"Policy.{field}", value)


def test_policy_coerce():
    p = Policy(network="deny")
    assert Policy.coerce(p) is p
    assert Policy.coerce(None) is None
    assert Policy.coerce({"network": "deny"}) == p
    assert Policy.coerce({}) == Policy()


def test_policy_coerce_rejects_unknown_fields():
    with pytest.raises(ConfigError) as info:
        Policy.coerce({"network": "deny", "netwrok": "allow"})
    assert info.value.field == "policy"
    assert "netwrok" in str(info.value)


@pytest.mark.parametrize("value", ["deny", 5, ["network"], Limits()])
def test_policy_coerce_rejects_wrong_types(value):
    with pytest.raises(ConfigError) as info:
        Policy.coerce(value)  # type: ignore[arg-type]
    assert info.value.field == "policy"


def test_policy_coerce_validates_values():
    with pytest.raises(ConfigError) as info:
        Policy.coerce({"writable_roots": ["rel"]})
    assert info.value.field == "Policy.writable_roots[0]"


def test_policy_to_dict_is_json_and_round_trips():
    p = Policy(
        workdir="/tmp/w",
        writable_roots=["/tmp/a"],
        deny_read=["/etc/shadow"],
        network="proxy",
        proxy_ports=[3128],
        env=["PATH"],
        strict=True,
    )
    d = p.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["writable_roots"] == ["/tmp/a"]
    assert d["proxy_ports"] == [3128]
    assert d["env"] == ["PATH"]
    assert Policy(**d) == p
    assert json.loads(json.dumps(Policy().to_dict()))["env"] == "sanitize"


# ---------------------------------------------------------------------------
# 6. Errors
# ---------------------------------------------------------------------------


def test_config_error_hierarchy_and_attributes():
    assert issubclass(ConfigError, sbxlimit.Error)
    assert issubclass(ConfigError, ValueError)
    e = ConfigError("Limits.memory", "5m", "not a size")
    assert e.field == "Limits.memory"
    assert e.value == "5m"
    assert "Limits.memory" in str(e)
    assert "'5m'" in str(e)
    assert "not a size" in str(e)
    with pytest.raises(ValueError):
        Limits(memory="5m")


def test_config_error_pickles():
    e = ConfigError("Limits.memory", "5m", "not a size")
    e2 = pickle.loads(pickle.dumps(e))
    assert (type(e2), e2.field, e2.value, str(e2)) == (ConfigError, e.field, e.value, str(e))


def test_unsupported_error_pickles():
    e = sbxlimit.UnsupportedError({"cpu": "needs a cgroup"})
    e2 = pickle.loads(pickle.dumps(e))
    assert e2.items == e.items
    assert str(e2) == str(e)


def test_unsupported_error():
    e = sbxlimit.UnsupportedError({"cpu": "needs a cgroup", "disk": "no tmpfs"})
    assert isinstance(e, sbxlimit.Error)
    assert e.items == {"cpu": "needs a cgroup", "disk": "no tmpfs"}
    assert "cpu: needs a cgroup" in str(e)
    assert "Hint:" in str(e)


def test_sandbox_setup_error_attributes():
    e = SandboxSetupError("rlimit:RLIMIT_NOFILE", errno.EPERM, 7)
    assert isinstance(e, sbxlimit.Error)
    assert isinstance(e, OSError)
    assert e.step == "rlimit:RLIMIT_NOFILE"
    assert e.errno == errno.EPERM
    assert e.detail == 7
    assert e.strerror == os.strerror(errno.EPERM)
    assert e.filename is None
    s = str(e)
    assert "rlimit:RLIMIT_NOFILE" in s
    assert "Hint:" in s
    if os.geteuid() == 0:
        assert "fs.nr_open" in s  # root is not short of CAP_SYS_RESOURCE
    else:
        assert "CAP_SYS_RESOURCE" in s
    assert "CAP_SYS_RESOURCE" in str(SandboxSetupError("rlimit:RLIMIT_CPU", errno.EPERM, 7))
    assert f"[Errno {errno.EPERM}]" in s


@pytest.mark.parametrize(
    ("step", "err", "detail", "filename"),
    [
        ("rlimit:RLIMIT_NOFILE", errno.EPERM, 7, None),
        ("setuid", errno.EPERM, 1000, None),
        ("chdir", errno.ENOENT, 0, "/no/such/dir"),
        ("exec", 0, 0, None),
    ],
)
def test_sandbox_setup_error_pickles(step, err, detail, filename):
    e = SandboxSetupError(step, err, detail, filename)
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is SandboxSetupError
    assert (e2.step, e2.errno, e2.detail, e2.filename) == (step, err, detail, filename)
    assert str(e2) == str(e)
    assert step in str(e2)
    assert "Hint:" in str(e2)
    if filename:
        assert filename in str(e2)


def test_limit_exceeded_is_called_process_error():
    assert issubclass(LimitExceeded, subprocess.CalledProcessError)
    assert issubclass(LimitExceeded, sbxlimit.Error)
    t = sbxlimit.Termination(
        reason="memory",
        limit=Mi,
        observed=2 * Mi,
        mechanism="rlimit:RLIMIT_DATA",
        message="memory limit of 1.0 MiB hit",
        returncode=-9,
        signal=9,
    )
    with pytest.raises(subprocess.CalledProcessError) as info:
        raise LimitExceeded(t, ["prog", "arg"], output=b"out", stderr=b"err")
    e = info.value
    assert isinstance(e, LimitExceeded)
    assert e.termination is t
    assert e.returncode == -9
    assert e.cmd == ["prog", "arg"]
    assert e.output == b"out"
    assert e.stderr == b"err"
    assert str(e) == "memory limit of 1.0 MiB hit"
    e2 = pickle.loads(pickle.dumps(e))
    assert e2.termination == t
    assert e2.returncode == -9
