"""sbxlimit.otel: metrics and spans through the real OpenTelemetry SDK (its
in-memory reader and exporter), from real sandboxes hitting real limits.
The limits used (cpu_time, wall_time) hold without a cgroup, so this runs
as root and unprivileged alike.  Nothing here asserts a timing."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip(
    "opentelemetry.sdk",
    reason="opentelemetry-sdk is not installed (pip install opentelemetry-sdk)",
)

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode

import sbxlimit
import sbxlimit.asyncio as sa
import sbxlimit.otel
from sbxlimit import Limits, _tracing, audit

PY = sys.executable
SECRET = "s3cr3t-otel-t0ken-do-not-leak"
SPIN = "while True: pass"
# cpu_time is held by RLIMIT_CPU everywhere; wall_time by the supervisor.
CPU_LIMIT = Limits(cpu_time=1)
WALL_LIMIT = Limits(wall_time="200ms", kill_grace=0)


def run_sync(args: Any, **kw: Any) -> sbxlimit.SandboxResult:
    return sbxlimit.run(args, **kw)


def run_async(args: Any, **kw: Any) -> sbxlimit.SandboxResult:
    return asyncio.run(sa.run(args, **kw))


RUNS = [pytest.param(run_sync, id="run"), pytest.param(run_async, id="asyncio.run")]


class Exported:
    """What an instrumentation exported to the SDK's in-memory reader and
    span exporter."""

    def __init__(self, **kw: Any) -> None:
        self.reader = InMemoryMetricReader()
        self.spans_out = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans_out))
        self.inst = sbxlimit.otel.instrument(
            meter_provider=MeterProvider(metric_readers=[self.reader]),
            tracer_provider=tracer_provider,
            **kw,
        )

    def metrics(self) -> dict[str, Any]:
        """name -> the metric (its unit, its points)."""
        data = self.reader.get_metrics_data()
        found = {}
        for rm in data.resource_metrics if data is not None else ():
            for sm in rm.scope_metrics:
                assert sm.scope.name == "sbxlimit"
                for m in sm.metrics:
                    found[m.name] = m
        return found

    def points(self, name: str) -> dict[frozenset[tuple[str, Any]], Any]:
        """A metric's points by their attributes (empty: nothing recorded)."""
        m = self.metrics().get(name)
        if m is None:
            return {}
        return {frozenset(p.attributes.items()): p for p in m.data.data_points}

    def count(self, name: str, **attrs: Any) -> int:
        """A counter's value for exactly these attributes (dots as __)."""
        key = frozenset((k.replace("__", "."), v) for k, v in attrs.items())
        p = self.points(name).get(key)
        return 0 if p is None else p.value

    def spans(self) -> list[Any]:
        return [s for s in self.spans_out.get_finished_spans() if s.name == "sbxlimit.run"]

    def dump(self) -> str:
        """Everything exported, as the exporters would send it."""
        data = self.reader.get_metrics_data()
        text = data.to_json() if data is not None else ""
        return text + "".join(s.to_json() for s in self.spans_out.get_finished_spans())


@pytest.fixture
def otel():
    made: list[Exported] = []

    def instrument(**kw: Any) -> Exported:
        e = Exported(**kw)
        made.append(e)
        return e

    yield instrument
    for e in made:
        e.inst.close()


# -- metrics from real limits ----------------------------------------------------


@pytest.mark.parametrize("run", RUNS)
def test_a_cpu_limit_hit_is_counted_with_its_usage(run, otel):
    out = otel()
    r = run([PY, "-c", SPIN], limits=CPU_LIMIT)
    t, u = r.termination, r.usage
    assert t.reason == "cpu_time", t
    assert out.count("sbxlimit.sandbox.spawns") == 1
    assert out.count("sbxlimit.sandbox.exits", sbxlimit__termination__reason="cpu_time") == 1
    hits = out.points("sbxlimit.limit.hits")
    assert list(hits) == [
        frozenset({("sbxlimit.limit.field", "cpu_time"), ("sbxlimit.limit.mechanism", t.mechanism)})
    ]
    assert "rlimit:RLIMIT_CPU" in t.mechanism
    # The histograms carry the figures usage() reports, in bytes and seconds.
    m = out.metrics()
    assert m["sbxlimit.sandbox.peak_memory"].unit == "By"
    assert m["sbxlimit.sandbox.cpu_time"].unit == "s"
    assert m["sbxlimit.sandbox.wall_time"].unit == "s"
    reason = frozenset({("sbxlimit.termination.reason", "cpu_time")})
    for name, want in (
        ("sbxlimit.sandbox.peak_memory", u.memory_peak),
        ("sbxlimit.sandbox.cpu_time", u.cpu_total),
        ("sbxlimit.sandbox.wall_time", u.wall),
    ):
        (p,) = out.points(name).values()
        assert out.points(name).keys() == {reason}
        assert want is not None and want > 0, (name, u)
        assert (p.count, p.sum) == (1, want), name


@pytest.mark.parametrize("run", RUNS)
def test_a_wall_time_kill_is_a_hit_and_a_supervisor_kill(run, otel):
    out = otel()
    r = run(["sleep", "60"], limits=WALL_LIMIT)
    assert r.termination.reason == "wall_time"
    assert out.count("sbxlimit.sandbox.exits", sbxlimit__termination__reason="wall_time") == 1
    assert (
        out.count(
            "sbxlimit.limit.hits",
            sbxlimit__limit__field="wall_time",
            sbxlimit__limit__mechanism="watchdog:wall_time",
        )
        == 1
    )
    assert (
        out.count(
            "sbxlimit.sandbox.kills",
            sbxlimit__kill__source="supervisor",
            sbxlimit__limit__field="wall_time",
        )
        == 1
    )


def test_a_clean_exit_is_counted_and_hits_nothing(otel):
    out = otel()
    runs = [sbxlimit.run([PY, "-c", "pass"], limits=CPU_LIMIT) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0]
    assert out.count("sbxlimit.sandbox.spawns") == 2
    assert out.count("sbxlimit.sandbox.exits", sbxlimit__termination__reason="exited") == 2
    assert out.points("sbxlimit.limit.hits") == {}
    (cpu,) = out.points("sbxlimit.sandbox.cpu_time").values()
    assert (cpu.count, cpu.sum) == (2, sum(r.usage.cpu_total for r in runs))
    # A peak not measured (too short for a sample, no cgroup) is not made up.
    peaks = [r.usage.memory_peak for r in runs if r.usage.memory_peak is not None]
    got = out.points("sbxlimit.sandbox.peak_memory").values()
    assert [(p.count, p.sum) for p in got] == ([(len(peaks), sum(peaks))] if peaks else [])


# -- Gate and Quota denials: by reason and field, keys only when asked -----------


def _deny(key: str) -> None:
    gate = sbxlimit.Gate(max_concurrent=1)
    with gate.call(key), pytest.raises(sbxlimit.ConcurrencyLimited), gate.call(key):
        pass
    gate = sbxlimit.Gate(rate="1/hour")
    with gate.call(key):
        pass
    with pytest.raises(sbxlimit.RateLimited), gate.call(key):
        pass
    quota = sbxlimit.Quota(max_sandboxes=1)
    adm = quota.admit(None, key=key)
    with pytest.raises(sbxlimit.QuotaExceeded):
        quota.admit(None, key=key)
    adm.release()


def test_gate_and_quota_denials_are_counted_without_their_keys(otel):
    out = otel()
    _deny(f"tenant-{SECRET}")
    assert out.count("sbxlimit.gate.denials", sbxlimit__gate__reason="concurrency_limited") == 1
    assert out.count("sbxlimit.gate.denials", sbxlimit__gate__reason="rate_limited") == 1
    assert (
        out.count(
            "sbxlimit.quota.denials",
            sbxlimit__quota__field="sandboxes",
            sbxlimit__quota__reason="full",
        )
        == 1
    )
    assert SECRET not in out.dump()


def test_keys_are_exported_only_through_key_attribute(otel):
    out = otel(key_attribute=lambda k: "gold" if k.startswith("gold-") else None)
    _deny(f"gold-{SECRET}")
    _deny(f"free-{SECRET}")  # mapped to None: no key attribute
    gate = "sbxlimit.gate.denials"
    assert out.count(gate, sbxlimit__gate__reason="rate_limited", sbxlimit__key="gold") == 1
    assert out.count(gate, sbxlimit__gate__reason="rate_limited") == 1
    assert SECRET not in out.dump()


def test_key_attribute_str_exports_raw_keys_on_metrics_and_spans(otel):
    out = otel(key_attribute=str)
    r = sbxlimit.run([PY, "-c", "pass"], limits=CPU_LIMIT, audit_key="agent-7")
    assert out.count("sbxlimit.sandbox.spawns", sbxlimit__key="agent-7") == 1
    (span,) = out.spans()
    assert span.attributes["sbxlimit.key"] == "agent-7"
    assert span.attributes["sbxlimit.sandbox.id"] == r.sandbox_id


def test_network_events_count_decisions_never_hosts(otel):
    # The proxy's events, as its sandbox emits them (tests/test_proxy.py
    # runs the proxy itself): the host is the program's choice.
    out = otel()
    fields = {"field": "network", "sandbox_id": "x-1", "program": "curl"}
    audit.emit("net_allowed", host=f"{SECRET}.test", port=443, mechanism="proxy:connect",
               observed=1500, **fields)  # fmt: skip
    audit.emit("net_denied", host=f"{SECRET}.test", port=80, mechanism="proxy:http",
               detail="not allowed", observed=0, **fields)  # fmt: skip
    conns = "sbxlimit.net.connections"
    assert (
        out.count(conns, sbxlimit__net__decision="allowed", sbxlimit__net__protocol="connect") == 1
    )
    assert out.count(conns, sbxlimit__net__decision="denied", sbxlimit__net__protocol="http") == 1
    assert out.count("sbxlimit.net.io", sbxlimit__net__protocol="connect") == 1500
    assert SECRET not in out.dump()


# -- spans around run() -------------------------------------------------------------


@pytest.mark.parametrize("run", RUNS)
def test_run_span_says_how_a_limit_ended_it(run, otel):
    out = otel()
    r = run([PY, "-c", SPIN], limits=CPU_LIMIT)
    (span,) = out.spans()
    a, t = span.attributes, r.termination
    assert a["sbxlimit.program"] == os.path.basename(PY)
    assert a["sbxlimit.sandbox.id"] == r.sandbox_id
    assert a["sbxlimit.termination.reason"] == "cpu_time"
    assert a["process.exit.code"] == r.returncode
    assert a["sbxlimit.limits.cpu_time"] == 1.0
    assert (a["sbxlimit.termination.limit"], a["sbxlimit.termination.mechanism"]) == (
        t.limit,
        t.mechanism,
    )
    assert a["sbxlimit.usage.memory_peak"] == r.usage.memory_peak
    assert a["sbxlimit.usage.cpu_time"] == r.usage.cpu_total
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "limit: cpu_time"
    assert "error.type" not in a  # run() returned: no exception


@pytest.mark.parametrize("run", RUNS)
def test_run_span_of_a_clean_exit_is_not_an_error(run, otel):
    out = otel()
    r = run([PY, "-c", "raise SystemExit(3)"], limits={"memory": "1Gi", "pids": 64})
    (span,) = out.spans()
    a = span.attributes
    assert (a["sbxlimit.termination.reason"], a["process.exit.code"]) == ("exited", 3)
    assert r.returncode == 3
    assert a["sbxlimit.limits.memory"] == 1 << 30 and a["sbxlimit.limits.pids"] == 64
    assert span.status.status_code is StatusCode.UNSET


@pytest.mark.parametrize("run", RUNS)
def test_run_span_of_a_raising_run_names_the_error_type_only(run, otel):
    out = otel()
    with pytest.raises(sbxlimit.LimitExceeded):
        run([PY, "-c", SPIN, SECRET], limits=CPU_LIMIT, check=True)
    with pytest.raises(sbxlimit.RunTimeout):
        run(["sleep", "60"], timeout=0.2)
    with pytest.raises(OSError):
        run([f"/nonexistent/{SECRET}/tool"])
    limit, timeout, missing = out.spans()
    assert limit.attributes["error.type"] == "LimitExceeded"
    assert limit.attributes["sbxlimit.termination.reason"] == "cpu_time"
    assert limit.status.description == "limit: cpu_time"
    assert timeout.attributes["error.type"] == "RunTimeout"
    assert timeout.attributes["sbxlimit.program"] == "sleep"
    assert timeout.status.status_code is StatusCode.ERROR
    assert missing.status.status_code is StatusCode.ERROR
    assert missing.attributes["error.type"] == "FileNotFoundError"
    for s in (limit, timeout, missing):
        assert s.events == ()  # no exception event: its message quotes argv
    assert SECRET not in out.dump()


def test_a_failing_key_attribute_never_fails_the_run(otel):
    def broken(key: str) -> str:
        raise RuntimeError("broken")

    out = otel(key_attribute=broken)
    r = sbxlimit.run([PY, "-c", "pass"], limits=CPU_LIMIT, audit_key="k")
    assert r.returncode == 0
    # Only the key is missing: the rest is recorded.
    assert out.count("sbxlimit.sandbox.spawns") == 1
    (span,) = out.spans()
    assert "sbxlimit.key" not in span.attributes
    assert span.attributes["sbxlimit.sandbox.id"] == r.sandbox_id


# -- nothing secret, ever --------------------------------------------------------


@pytest.mark.parametrize("run", RUNS)
def test_no_secret_from_argv_env_or_output_is_exported(run, otel):
    out = otel()
    code = (
        "import os, sys, time\n"
        "print(os.environ['TOKEN'], sys.argv[1], flush=True)\n"
        "open('note.txt', 'w').write(sys.argv[1])\n"
        "time.sleep(60)\n"
    )
    r = run(
        [PY, "-c", code, SECRET],
        env={**os.environ, "TOKEN": SECRET},
        capture_output=True,
        limits=WALL_LIMIT,
        policy=sbxlimit.Policy(),
        audit_key=SECRET,
    )
    assert r.termination.reason == "wall_time"
    assert SECRET.encode() in r.stdout  # the program had it, and said it
    shell = run(f"TOKEN={SECRET} sh -c 'echo {SECRET}'", shell=True, capture_output=True)
    assert SECRET.encode() in shell.stdout
    dumped = out.dump()
    assert len(out.spans()) == 2 and "sbxlimit.sandbox.spawns" in dumped
    assert SECRET not in dumped
    assert SECRET not in json.dumps([dict(s.attributes) for s in out.spans()])


# -- switching it off ----------------------------------------------------------------


def test_close_stops_recording_and_is_idempotent(otel):
    out = otel()
    sbxlimit.run([PY, "-c", "pass"], limits=CPU_LIMIT)
    assert (out.count("sbxlimit.sandbox.spawns"), len(out.spans())) == (1, 1)
    assert audit.active()
    out.inst.close()
    out.inst.uninstrument()  # again: harmless
    assert out.inst.closed and _tracing.hook is None
    # Unsubscribed: with nobody else listening, no event is even built.
    assert not audit.active()
    sbxlimit.run([PY, "-c", "pass"], limits=CPU_LIMIT)
    asyncio.run(sa.run([PY, "-c", "pass"], limits=CPU_LIMIT))
    assert (out.count("sbxlimit.sandbox.spawns"), len(out.spans())) == (1, 1)
    # Closed, it may be instrumented again; as a context manager too.
    with Exported().inst as again:
        assert _tracing.hook is not None
    assert again.closed and _tracing.hook is None


def test_one_instrumentation_at_a_time(otel):
    out = otel()
    with pytest.raises(RuntimeError, match="already instrumented"):
        sbxlimit.otel.instrument()
    assert not out.inst.closed


def test_metrics_only_or_spans_only(otel):
    out = otel(spans=False)
    sbxlimit.run([PY, "-c", "pass"], limits=CPU_LIMIT)
    assert _tracing.hook is None
    assert out.count("sbxlimit.sandbox.spawns") == 1 and out.spans() == []
    out.inst.close()
    out = otel(metrics=False)
    sbxlimit.run([PY, "-c", "pass"], limits=CPU_LIMIT)
    assert out.metrics() == {} and len(out.spans()) == 1


def test_the_global_providers_by_default(otel):
    # None set: the API's no-op providers; nothing fails, nothing is kept.
    with sbxlimit.otel.instrument() as inst:
        assert sbxlimit.run([PY, "-c", "pass"], limits=CPU_LIMIT).returncode == 0
    assert inst.closed


def test_import_sbxlimit_does_not_import_opentelemetry():
    code = (
        "import sys, sbxlimit, sbxlimit.asyncio, sbxlimit.audit\n"
        "sbxlimit.run([sys.executable, '-c', 'pass'], limits={'cpu_time': 5})\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(sbxlimit.__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip() == "[]", done.stdout
