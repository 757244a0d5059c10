"""OpenTelemetry export of sbxlimit's audit events, usage and runs.

    import sbxlimit.otel

    instrumentation = sbxlimit.otel.instrument()  # the global providers
    ...
    instrumentation.close()  # or: with sbxlimit.otel.instrument(): ...

Metrics come from :mod:`sbxlimit.audit` events (a subscriber): sandboxes
spawned and exited, limits hit, kills, warnings, degradations, Gate and
Quota denials, connections through the filtering proxy, and each sandbox's
peak memory, CPU and wall time as histograms.  A span named
``sbxlimit.run`` covers each :func:`sbxlimit.run` and
:func:`sbxlimit.asyncio.run`.  See docs/opentelemetry.md.

What is never exported: argv beyond the program's base name, environment,
program output, paths, hosts the program connected to, and -- unless
``key_attribute`` asks for them -- Gate, Quota and audit keys.  Metric
attributes take a few fixed values each (reasons, limit names,
mechanisms), so the number of time series stays bounded.

Needs ``opentelemetry-api`` (``pip install 'sbxlimit[otel]'``); ``import
sbxlimit`` never imports it, only ``import sbxlimit.otel`` does.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

try:
    from opentelemetry import metrics as _metrics
    from opentelemetry import trace as _trace
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "sbxlimit.otel needs the OpenTelemetry API, which is not installed.\n"
        "Hint: pip install 'sbxlimit[otel]' (or opentelemetry-api)"
    ) from e

from . import __version__, _tracing, audit

__all__ = ["SCOPE", "Instrumentation", "instrument"]

SCOPE = "sbxlimit"  # the instrumentation scope of every meter and tracer
logger = logging.getLogger("sbxlimit.otel")

# Peaks from 64 KiB to 64 GiB in powers of two: the SDK's default buckets
# (0..10000) are for milliseconds, useless for bytes.
_BYTES_BUCKETS = tuple(float(2**n) for n in range(16, 37))
_SECONDS_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
)  # fmt: skip

_lock = threading.Lock()
_active: Instrumentation | None = None

KeyAttribute = Callable[[str], str | None]


def instrument(
    *,
    meter_provider: _metrics.MeterProvider | None = None,
    tracer_provider: _trace.TracerProvider | None = None,
    metrics: bool = True,
    spans: bool = True,
    key_attribute: KeyAttribute | None = None,
) -> Instrumentation:
    """Export sbxlimit's metrics and spans through OpenTelemetry until the
    returned :class:`Instrumentation` is closed.

    meter_provider / tracer_provider: where to export; None: the global
    ones (``opentelemetry.metrics.set_meter_provider`` ...; through the
    API's proxies, so one set later is used too).
    metrics / spans: what to export.  key_attribute: a function from a Gate
    or Quota key, or a sandbox's ``audit_key``, to the value of the
    ``sbxlimit.key`` attribute (None leaves it out).  Without it keys are
    never exported: they may be tenant ids, and each distinct value makes
    new time series; ``key_attribute=str`` exports them as they are, a
    function mapping tenants to a few tiers keeps the series bounded.

    One instrumentation at a time: a second ``instrument()`` before the
    first is closed raises RuntimeError.
    """
    global _active
    if key_attribute is not None and not callable(key_attribute):
        raise TypeError("key_attribute must be callable (a key -> an attribute value or None)")
    with _lock:
        if _active is not None:
            raise RuntimeError(
                "sbxlimit.otel.instrument(): sbxlimit is already instrumented.\n"
                "Hint: close() the Instrumentation the first call returned"
            )
        inst = Instrumentation(
            meter_provider if metrics else None,
            tracer_provider if spans else None,
            metrics=metrics,
            spans=spans,
            key_attribute=key_attribute,
        )
        _active = inst
    return inst


class Instrumentation:
    """What :func:`instrument` set up; :meth:`close` (or ``uninstrument()``,
    or leaving ``with``) undoes it.  Closing twice is harmless."""

    def __init__(
        self,
        meter_provider: _metrics.MeterProvider | None,
        tracer_provider: _trace.TracerProvider | None,
        *,
        metrics: bool,
        spans: bool,
        key_attribute: KeyAttribute | None,
    ) -> None:
        self._key_attribute = key_attribute
        self._closed = False
        self._unsubscribe: Callable[[], None] | None = None
        self._hook: Callable[[], contextlib.AbstractContextManager[_tracing.RunSpan]] | None = None
        if metrics:
            self._instruments = _Instruments(
                _metrics.get_meter(SCOPE, __version__, meter_provider=meter_provider)
            )
            self._unsubscribe = audit.subscribe(self._on_event)
        if spans:
            self._tracer = _trace.get_tracer(SCOPE, __version__, tracer_provider=tracer_provider)
            self._hook = self._run_span
            _tracing.hook = self._hook

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop recording: unsubscribe from the audit, no more spans."""
        global _active
        with _lock:
            if self._closed:
                return
            self._closed = True
            if self._unsubscribe is not None:
                self._unsubscribe()
            if self._hook is not None and _tracing.hook is self._hook:
                _tracing.hook = None
            if _active is self:
                _active = None

    uninstrument = close

    def __enter__(self) -> Instrumentation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "active"
        parts = [p for p, on in (("metrics", self._unsubscribe), ("spans", self._hook)) if on]
        return f"<sbxlimit.otel.Instrumentation {state} {'+'.join(parts) or 'nothing'}>"

    # -- metrics, from audit events ---------------------------------------------

    def _key(self, key: str | None) -> dict[str, str]:
        if key is None or self._key_attribute is None:
            return {}
        try:
            value = self._key_attribute(key)
        except Exception:  # the caller's function: the rest is still recorded
            logger.exception("sbxlimit.otel: key_attribute failed")
            return {}
        return {} if value is None else {"sbxlimit.key": str(value)}

    def _on_event(self, e: audit.Event) -> None:
        # An event already on its way when close() ran is dropped.
        if self._closed:
            return
        i = self._instruments
        a = _attrs(self._key(e.key))
        name = e.name
        if name == "spawn":
            i.spawns.add(1, a)
        elif name == "exit":
            a = _attrs(a, {"sbxlimit.termination.reason": e.detail})
            i.exits.add(1, a)
            if e.memory_peak is not None:
                i.peak_memory.record(e.memory_peak, a)
            if e.cpu_time is not None:
                i.cpu_time.record(e.cpu_time, a)
            if e.wall_time is not None:
                i.wall_time.record(e.wall_time, a)
        elif name in ("limit_exceeded", "resource_warning", "degraded"):
            a = _attrs(
                a, {"sbxlimit.limit.field": e.field, "sbxlimit.limit.mechanism": e.mechanism}
            )
            if name == "limit_exceeded":
                i.limit_hits.add(1, a)
            elif name == "resource_warning":
                i.warnings.add(1, a)
            else:
                i.degradations.add(1, a)
        elif name == "killed":
            a = _attrs(a, {"sbxlimit.kill.source": e.detail, "sbxlimit.limit.field": e.field})
            i.kills.add(1, a)
        elif name == "gate_denied":
            i.gate_denials.add(1, _attrs(a, {"sbxlimit.gate.reason": e.detail}))
        elif name == "quota_denied":
            a = _attrs(a, {"sbxlimit.quota.field": e.field, "sbxlimit.quota.reason": e.detail})
            i.quota_denials.add(1, a)
        elif name in ("net_allowed", "net_denied"):
            # Never the host: the program picks it, so it is unbounded (and
            # may say more than it should); the protocol is one of four.
            protocol = (e.mechanism or "").removeprefix("proxy:") or None
            a = _attrs(a, {"sbxlimit.net.protocol": protocol})
            decision = "allowed" if name == "net_allowed" else "denied"
            i.net_connections.add(1, _attrs(a, {"sbxlimit.net.decision": decision}))
            if name == "net_allowed" and isinstance(e.observed, int) and e.observed > 0:
                i.net_io.add(e.observed, a)

    # -- spans, around run() ----------------------------------------------------

    @contextlib.contextmanager
    def _run_span(self) -> Iterator[_RunSpan]:
        with self._tracer.start_as_current_span(
            "sbxlimit.run", record_exception=False, set_status_on_exception=False
        ) as span:
            # Never record_exception: the messages of CalledProcessError and
            # TimeoutExpired quote the whole command line.
            run = _RunSpan(span, self)
            error: BaseException | None = None
            try:
                yield run
            except BaseException as e:
                error = e
                raise
            finally:
                if span.is_recording():
                    try:
                        run.finish(error)
                    except Exception:  # telemetry never changes the run's outcome
                        logger.exception("sbxlimit.otel: recording a run's span failed")


class _RunSpan:
    """One ``sbxlimit.run`` span: attributes from the run's Popen."""

    def __init__(self, span: _trace.Span, inst: Instrumentation) -> None:
        self._span = span
        self._inst = inst
        self._process: Any = None

    def spawned(self, process: Any) -> None:
        self._process = process

    def finish(self, error: BaseException | None) -> None:
        span, p = self._span, self._process
        status: str | None = None
        if p is not None:
            attrs: dict[str, Any] = {
                "sbxlimit.sandbox.id": p.sandbox_id,
                "sbxlimit.program": p.program,
            }
            attrs.update(self._inst._key(getattr(p._sbx, "audit_key", None)))
            lim = p.limits
            if lim is not None:
                for field, value in lim.asked().items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        attrs[f"sbxlimit.limits.{field}"] = value
            t = p.termination
            if t is not None:  # reaped: the verdict and the final usage
                attrs["sbxlimit.termination.reason"] = t.reason
                if t.returncode is not None:
                    attrs["process.exit.code"] = t.returncode
                if t.is_limit:
                    status = f"limit: {t.reason}"
                    for name in ("limit", "observed", "mechanism"):
                        v = getattr(t, name)
                        if v is not None:
                            attrs[f"sbxlimit.termination.{name}"] = v
                u = p.usage()
                for name, v in (
                    ("memory_peak", u.memory_peak),
                    ("cpu_time", u.cpu_total),
                    ("wall_time", u.wall),
                ):
                    if v is not None:
                        attrs[f"sbxlimit.usage.{name}"] = v
            span.set_attributes(attrs)
        if error is not None:
            # The type only: its message may quote argv.
            kind = type(error).__qualname__
            span.set_attribute("error.type", kind)
            status = status or kind
        if status is not None:
            span.set_status(_trace.Status(_trace.StatusCode.ERROR, status))


class _Instruments:
    """The meter's instruments, made once per instrumentation."""

    def __init__(self, meter: _metrics.Meter) -> None:
        c = meter.create_counter
        self.spawns = c("sbxlimit.sandbox.spawns", "{sandbox}", "Sandboxes started")
        self.exits = c("sbxlimit.sandbox.exits", "{sandbox}", "Sandboxes reaped, by how they ended")
        self.limit_hits = c("sbxlimit.limit.hits", "{hit}", "Limits that ended a sandbox")
        self.warnings = c(
            "sbxlimit.limit.warnings", "{warning}", "Sandboxes that passed warn_at of a limit"
        )
        self.kills = c("sbxlimit.sandbox.kills", "{kill}", "Forced kills of a sandbox's tree")
        self.degradations = c(
            "sbxlimit.sandbox.degradations",
            "{degradation}",
            "Limits or protections held by a fallback, or not at all",
        )
        self.gate_denials = c("sbxlimit.gate.denials", "{call}", "Calls a Gate refused")
        self.quota_denials = c("sbxlimit.quota.denials", "{sandbox}", "Sandboxes a Quota refused")
        self.net_connections = c(
            "sbxlimit.net.connections", "{connection}", "Connections through the filtering proxy"
        )
        self.net_io = c("sbxlimit.net.io", "By", "Bytes through the filtering proxy, both ways")
        self.peak_memory = _histogram(
            meter, "sbxlimit.sandbox.peak_memory", "By", "A sandbox's peak memory", _BYTES_BUCKETS
        )
        self.cpu_time = _histogram(
            meter, "sbxlimit.sandbox.cpu_time", "s", "A sandbox's CPU time, user + system",
            _SECONDS_BUCKETS,
        )  # fmt: skip
        self.wall_time = _histogram(
            meter, "sbxlimit.sandbox.wall_time", "s", "A sandbox's wall time", _SECONDS_BUCKETS
        )


def _histogram(
    meter: _metrics.Meter, name: str, unit: str, description: str, buckets: tuple[float, ...]
) -> _metrics.Histogram:
    try:
        return meter.create_histogram(
            name, unit, description, explicit_bucket_boundaries_advisory=buckets
        )
    except TypeError:  # opentelemetry-api < 1.23 has no advisory: the SDK's buckets
        return meter.create_histogram(name, unit, description)


def _attrs(base: dict[str, str], more: dict[str, str | None] | None = None) -> dict[str, str]:
    """`base` plus the values of `more` that are set (OTel drops None)."""
    if not more:
        return base
    return {**base, **{k: v for k, v in more.items() if v is not None}}
