"""The shared settings parser (sbxlimit/_settings.py): FIELD=VALUE words,
flag values, Python values and manifests to Limits and Policy fields."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from sbxlimit import ConfigError, Gate, Limits, Policy, UnknownFieldError, _limits
from sbxlimit import _settings as s
from sbxlimit._units import Millicores

Mi = 1 << 20


# -- the field tables -----------------------------------------------------------


def test_fields_are_those_of_the_dataclasses():
    assert tuple(f.name for f in dataclasses.fields(Limits)) == s.LIMIT_FIELDS
    assert tuple(f.name for f in dataclasses.fields(Policy)) == s.POLICY_FIELDS
    assert set(s.LIMIT_FIELDS) | set(s.POLICY_FIELDS) == s.FIELDS
    assert not set(s.LIMIT_FIELDS) & set(s.POLICY_FIELDS)
    # every field has a text form, and Limits normalises (and checks) each of its own
    assert set(s._FORMS) == s.FIELDS
    assert sorted(_limits._ORDER) == sorted(s.LIMIT_FIELDS)


SWITCHES = [
    f.name
    for cls in (Limits, Policy)
    for f in dataclasses.fields(cls)
    if isinstance(f.default, bool) or f.name == "isolate_pids"
]


@pytest.mark.parametrize("name", SWITCHES)
def test_every_switch_reads_as_a_bool(name):
    for word, value in [("true", True), ("YES", True), ("on", True), ("1", True)]:
        assert s.from_text(name, word) is value
    for word in ("false", "No", "off", "0"):
        assert s.from_text(name, word) is False
    with pytest.raises(ConfigError) as info:
        s.from_text(name, "maybe")
    assert str(info.value) == f"{name}: expected true or false (got 'maybe')"


# -- one value from text ----------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "value"),
    [
        # sizes, durations, CPU, counts: text for Limits, normalised by it
        ("memory", "256Mi", 256 * Mi),
        ("file_size", "0", 0),
        ("output", "1Ki", 1024),
        ("address_space", "1G", 10**9),
        ("cpu_time", "1m30s", 90.0),
        ("wall_time", "500ms", 0.5),
        ("kill_grace", "0", 0.0),
        ("cpu", "500m", Millicores(500)),
        ("cpu", "2", Millicores(2000)),
        ("pids", "64", 64),
        ("open_files", "100", 100),
        # switches
        ("truncate_output", "yes", True),
        ("harden", "off", False),
        ("terminal", "true", True),
        ("drop_secrets", "1", True),
        ("isolate_pids", "false", False),
        # lists, comma-separated
        ("writable_roots", "/tmp/a,/srv//b/", ("/tmp/a", "/srv/b")),
        ("deny_read", "/etc/shadow", ("/etc/shadow",)),
        ("deny_write", "/a,,/b", ("/a", "/b")),
        ("unix_sockets", "/run/x.sock", ("/run/x.sock",)),
        ("capabilities", "net_bind_service,CAP_KILL", ("CAP_KILL", "CAP_NET_BIND_SERVICE")),
        ("env", "PATH,HOME", ("PATH", "HOME")),
        ("env", "sanitize", "sanitize"),
        ("proxy_ports", "8080,3128", (3128, 8080)),
        # names
        ("tolerate", "memory,pids", frozenset({"memory", "pids"})),
        ("tolerate", "disk", frozenset({"disk"})),
        ("network", "deny", "deny"),
        ("workdir", "/tmp/w", "/tmp/w"),
        # none: no limit, the default, automatic
        ("memory", "none", None),
        ("wall_time", "None", None),
        ("truncate_output", "none", None),
        ("tolerate", "NONE", None),
        ("workdir", "none", None),
        ("isolate_pids", "none", None),
    ],
)
def test_a_word_becomes_the_fields_value(name, text, value):
    got = s.field_value(name, s.from_text(name, text))
    assert got == value and type(got) is type(value)


def test_cpu_stays_millicores_through_a_second_reading():
    cpu = s.field_value("cpu", s.from_text("cpu", "2"))
    assert isinstance(cpu, Millicores)
    assert Limits(cpu=cpu).cpu == 2000


@pytest.mark.parametrize(("name", "value"), [("kill_grace", "none"), ("network", "none")])
def test_none_is_text_where_it_would_read_as_a_value(name, value):
    assert s.from_text(name, "none") == value
    with pytest.raises(ConfigError) as info:
        s.field_value(name, value)
    assert info.value.field == f"{('Limits' if name in s.LIMIT_FIELDS else 'Policy')}.{name}"
    assert s.from_text("env", "none") == ("none",)  # an allow-list naming `none`


@pytest.mark.parametrize(
    ("name", "text", "field", "message"),
    [
        ("memory", "lots", "Limits.memory", "not a size"),
        ("memory", "5m", "Limits.memory", "did you mean '5Mi'?"),
        ("cpu_time", "soon", "Limits.cpu_time", "not a duration"),
        ("pids", "many", "Limits.pids", "not a whole number"),
        ("cpu", "fast", "Limits.cpu", "not a CPU amount"),
        ("tolerate", "cpu", "Limits.tolerate", "only memory, pids, disk can be tolerated"),
        ("network", "sometimes", "Policy.network", "expected 'allow', 'deny' or 'proxy'"),
        ("writable_roots", "rel/path", "Policy.writable_roots[0]", "must be an absolute path"),
        ("capabilities", "fly", "Policy.capabilities", "not a Linux capability name"),
        ("proxy_ports", "0", "Policy.proxy_ports", "expected a TCP port 1..65535"),
        ("harden", "none", "Policy.harden", "expected a bool"),
    ],
)
def test_a_bad_value_names_its_field(name, text, field, message):
    with pytest.raises(ConfigError) as info:
        s.field_value(name, s.from_text(name, text))
    assert info.value.field == field and message in str(info.value)


def test_ports_that_are_not_numbers_name_the_field():
    with pytest.raises(ConfigError) as info:
        s.from_text("proxy_ports", "80,http")
    assert str(info.value) == "proxy_ports: expected comma-separated TCP ports (got '80,http')"


def test_an_unknown_field_is_refused_by_name():
    for call in (lambda: s.from_text("memroy", "1"), lambda: s.field_value("memroy", 1)):
        with pytest.raises(UnknownFieldError) as info:
            call()
        assert info.value.names == ["memroy"]
        assert "did you mean 'memory'? known: address_space, allow_domains, capabilities," in str(
            info.value
        )


@pytest.mark.parametrize(
    "call",
    [
        lambda: Limits(memroy="1Gi"),  # type: ignore[call-arg]
        lambda: Policy(netwrok="deny"),  # type: ignore[call-arg]
        lambda: Limits.coerce({"memroy": "1Gi"}),
        lambda: Policy.coerce({"netwrok": "deny"}),
    ],
)
def test_a_misspelt_field_is_the_same_error_everywhere_with_a_hint(call):
    # Limits(memroy=...) was Python's TypeError, {"memroy": ...} a
    # ConfigError, neither with a hint: now one error that is both.
    with pytest.raises(UnknownFieldError) as info:
        call()
    assert isinstance(info.value, ConfigError)
    assert isinstance(info.value, TypeError)
    assert "did you mean 'memory'?" in str(info.value) or "did you mean 'network'?" in str(
        info.value
    )
    back = pickle.loads(pickle.dumps(info.value))
    assert (type(back), str(back)) == (type(info.value), str(info.value))


def test_a_rule_between_two_policy_fields_waits_for_the_merged_values():
    assert s.field_value("network", "proxy") == "proxy"
    assert s.field_value("proxy_ports", (8080,)) == (8080,)
    with pytest.raises(ConfigError, match="network='proxy' needs allow_domains"):
        s.build({"network": "proxy"})


# -- words from a source ----------------------------------------------------------


def test_words_become_checked_values():
    values = s.parse_words(
        "memory=256Mi wall-time=30s network=deny 'deny_read=/a b,/c' harden=no tolerate=pids",
        "src",
    )
    assert values == {
        "memory": 256 * Mi,
        "wall_time": 30.0,
        "network": "deny",
        "deny_read": ("/a b", "/c"),
        "harden": False,
        "tolerate": frozenset({"pids"}),
    }
    assert s.parse_words("  ", "src") == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("memory=lots", "src: Limits.memory: not a size; use bytes or a number with Ki,"),
        ("memroy=1Gi", "src: unknown field 'memroy'; did you mean 'memory'? known: address_space,"),
        ("memory", "src: expected FIELD=VALUE words such as 'memory=256Mi wall_time=30s' "),
        ("=1", "src: expected FIELD=VALUE words"),
        ("memory='1Gi", 'src: No closing quotation (got "memory=\'1Gi")'),
        ("strict=perhaps", "src: strict: expected true or false (got 'perhaps')"),
        ("proxy_ports=x", "src: proxy_ports: expected comma-separated TCP ports (got 'x')"),
        ("network=sometimes", "src: Policy.network: expected 'allow', 'deny' or 'proxy'"),
    ],
)
def test_bad_words_name_the_source(text, message):
    with pytest.raises(s.SettingsError) as info:
        s.parse_words(text, "src")
    assert str(info.value).startswith(message)
    assert info.value.source == "src"


def test_a_settings_error_is_a_config_error_and_pickles():
    e = s.SettingsError("--memory 12Zi", "not a size", "12Zi")
    assert isinstance(e, ConfigError) and isinstance(e, ValueError)
    assert str(e) == "--memory 12Zi: not a size"
    back = pickle.loads(pickle.dumps(e))
    assert (type(back), str(back), back.source, back.value) == (type(e), str(e), e.source, "12Zi")


def test_checked_names_the_source_of_python_values():
    assert s.checked({"memory": "1Mi", "open_files": 10.0}, "m") == {
        "memory": 1024 * 1024,
        "open_files": 10,
    }
    with pytest.raises(s.SettingsError) as info:
        s.checked({"pids": 0}, "@pytest.mark.sbxlimit on t.py::t")
    assert str(info.value) == (
        "@pytest.mark.sbxlimit on t.py::t: Limits.pids: must be at least 1 (got 0)"
    )


def test_checked_reports_the_limits_first_in_the_order_limits_checks_them():
    with pytest.raises(s.SettingsError) as info:
        s.checked({"network": "sometimes", "pids": 0, "memory": "lots"}, "m")
    assert str(info.value).startswith("m: Limits.memory: not a size")


# -- flags ----------------------------------------------------------------------


def test_a_flag_value_is_normalised():
    assert s.flag_value("--memory", "memory", "64Mi") == 64 * Mi
    assert s.flag_value("--timeout", "wall_time", "2m") == 120.0
    assert s.flag_value("--tolerate", "tolerate", "memory,disk") == {"memory", "disk"}


@pytest.mark.parametrize(
    ("flag", "name", "text", "message"),
    [
        ("--memory", "memory", "12Zi", "--memory 12Zi: not a size"),
        ("--timeout", "wall_time", "soon", "--timeout soon: not a duration"),
        ("--kill-grace", "kill_grace", "-1", "--kill-grace -1: not a duration"),
        ("--memory", "memory", "none", "--memory none: not a size"),
        ("--tolerate", "tolerate", "cpu", "--tolerate cpu: only memory, pids, disk can be"),
    ],
)
def test_a_bad_flag_value_names_the_flag(flag, name, text, message):
    with pytest.raises(s.SettingsError) as info:
        s.flag_value(flag, name, text)
    assert str(info.value).startswith(message)
    assert "(got" not in str(info.value)


# -- merged values ----------------------------------------------------------------


def test_build_makes_only_what_is_asked_for():
    assert s.build({}) == (None, None)
    assert s.build({"memory": 64 * Mi}) == (Limits(memory="64Mi"), None)
    assert s.build({"network": "deny"}) == (None, Policy(network="deny"))
    # None: unlimited for a limit, the default for a knob and a policy field
    assert s.build({"memory": None}) == (Limits(), None)
    assert s.build({"kill_grace": None, "tolerate": None, "harden": None}) == (None, None)
    # ... and a private workspace for workdir
    assert s.build({"workdir": None}) == (None, Policy())


def test_object_fields_are_what_differs_from_the_default():
    assert s.object_fields(None, "limits") == {}
    assert s.object_fields({"memory": "1Gi"}, "limits") == {"memory": "1Gi"}
    assert s.object_fields(Limits(memory="1Mi", cpu="1"), "limits") == {
        "memory": 1024 * 1024,
        "cpu": "1000m",
    }
    assert s.object_fields(Policy(network="deny"), "policy") == {"network": "deny"}
    with pytest.raises(ConfigError) as info:
        s.object_fields(Policy(), "limits")
    assert info.value.field == "limits" and "expected sbxlimit.Limits" in str(info.value)


# -- manifests --------------------------------------------------------------------


def test_manifest_limits_and_execution_read_one_manifest():
    manifest = {
        "resources": {"cpu": {"limit": "1", "request": "500m"}, "pids": 32},
        "execution_limits": {"max_tool_call_duration": "30s", "rate_limit": "10/second"},
    }
    assert s.manifest_limits(manifest) == {
        "cpu": 1000,
        "memory": 256 * Mi,
        "disk": 100 * Mi,
        "pids": 32,
        "wall_time": 30.0,
    }
    assert s.manifest_execution(manifest) == (30.0, 3, "10/second")
    assert Limits.from_manifest(manifest) == Limits(**s.manifest_limits(manifest))


@pytest.mark.parametrize(
    ("manifest", "field"),
    [
        ({"execution_limits": {"max_calls": 1}}, "execution_limits.max_calls"),
        ({"limits": {}}, "limits"),
        ({"execution_limits": []}, "execution_limits"),
        ({"execution_limits": {"rate_limit": "often"}}, "execution_limits.rate_limit"),
    ],
)
def test_limits_and_gate_refuse_a_manifest_alike(manifest, field):
    errors = []
    for read in (Limits.from_manifest, Gate.from_manifest):
        with pytest.raises(ConfigError) as info:
            read(manifest)
        errors.append(str(info.value))
        assert info.value.field == field
    assert errors[0] == errors[1]


def test_a_manifest_request_is_checked_under_its_path():
    with pytest.raises(ConfigError) as info:
        s.manifest_limits({"resources": {"memory": {"request": "lots"}}})
    assert info.value.field == "resources.memory.request"
