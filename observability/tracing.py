"""Traces (CONTRACT 13.6): OpenTelemetry over OTLP/HTTP when the operator asks for it, and the
W3C `traceparent` an endpoint with `traceContext` receives either way.

Exporting is on when `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set
in the process's environment; every other `OTEL_*` variable (service name, sampler, headers,
batch delays) is read by OpenTelemetry itself. Then the API's requests are server spans
(opentelemetry-instrumentation-flask), PostgreSQL and Redis calls are spans inside them
(-psycopg, -redis), and each delivery attempt is a `webhook.attempt` span made here, a child of
the request that published its event (`publishing_traceparent`, stored with the event). With
neither variable set, nothing of OpenTelemetry is even imported: no span, no exporter, no
instrumented call.

The attempt span is made by hand around the one place that sends (services/delivery/loop.py),
not by aiohttp's client instrumentation, which would add `traceparent` to every request: only
an endpoint that asked for it gets one.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Mapping
from typing import Any

from flask import Flask, has_request_context, request

TRACEPARENT = "traceparent"
EXPORT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
ATTEMPT_SPAN = "webhook.attempt"
# Version 00 of W3C Trace Context, as its spec writes it (lower-case hex); ids of zeros are
# invalid, and so is version ff.
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE_ID = "0" * 32
_ZERO_SPAN_ID = "0" * 16
# A trace we start ourselves (OpenTelemetry off, no parent) says it may have been recorded, so
# that a receiver's parent-based sampler keeps its side of the trace.
SAMPLED = "01"

# What makes `webhook.attempt` spans, once `start_tracing` has set OpenTelemetry up.
_attempts: _AttemptSpans | None = None


def exporting_requested(environ: Mapping[str, str]) -> bool:
    """Whether the operator asked for traces (CONTRACT 13.6's two variables)."""
    return any(environ.get(name, "").strip() for name in EXPORT_VARIABLES)


def tracing() -> bool:
    """This process exports traces."""
    return _attempts is not None


def start_tracing(service_name: str, *, app: Flask | None = None) -> bool:
    """Set up OpenTelemetry for this process when the environment asks for it (else nothing):
    the OTLP/HTTP exporter behind a batching processor, PostgreSQL and Redis instrumented, and
    `app`'s requests as server spans. `service_name` unless `OTEL_SERVICE_NAME` names one.
    Whether traces are exported."""
    global _attempts  # one tracer provider per process, as OpenTelemetry has it
    if not exporting_requested(os.environ):
        return False
    if _attempts is None:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
        from opentelemetry.instrumentation.redis import RedisInstrumentor
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        named = os.environ.get("OTEL_SERVICE_NAME", "").strip()
        provider = TracerProvider(
            resource=Resource.create({} if named else {SERVICE_NAME: service_name})
        )
        # Spans leave in batches on a thread of the SDK's: a slow collector costs memory up to
        # the queue's bound (then spans are dropped), never a request's or an attempt's time.
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        PsycopgInstrumentor().instrument()
        RedisInstrumentor().instrument()
        _attempts = _AttemptSpans(trace.get_tracer("brand_api.webhooks"))
    if app is not None:
        from opentelemetry.instrumentation.flask import FlaskInstrumentor

        FlaskInstrumentor().instrument_app(app)
    return True


def stop_tracing() -> None:
    """Send what is still batched (a worker stopping); nothing when not exporting."""
    if _attempts is None:
        return
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    shutdown = getattr(provider, "shutdown", None)
    if shutdown is not None:
        shutdown()


def parse_traceparent(value: str | None) -> tuple[str, str, str] | None:
    """(trace id, parent id, flags) of a valid version-00 `traceparent`, else None."""
    found = _TRACEPARENT.fullmatch(value.strip()) if value else None
    if found is None or found[1] == _ZERO_TRACE_ID or found[2] == _ZERO_SPAN_ID:
        return None
    return found[1], found[2], found[3]


def publishing_traceparent() -> str | None:
    """The trace context an event published now keeps, for its attempts to join: the current
    span's (the API request's server span) when exporting, else the `traceparent` the request
    came with, if valid; None outside a request with neither."""
    if _attempts is not None:
        from opentelemetry import trace

        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            return _format(
                f"{context.trace_id:032x}", f"{context.span_id:016x}", f"{context.trace_flags:02x}"
            )
    if has_request_context():
        parsed = parse_traceparent(request.headers.get(TRACEPARENT))
        if parsed is not None:
            return _format(*parsed)
    return None


class _AttemptSpans:
    """The OpenTelemetry calls an attempt makes, bound once: a worker makes hundreds of attempt
    spans a second, and importing or building a propagator per span was a third of its cost."""

    def __init__(self, tracer: Any) -> None:
        from opentelemetry import trace
        from opentelemetry.context import Context
        from opentelemetry.trace import SpanKind, Status, StatusCode

        self._tracer = tracer
        self._trace = trace
        self._context = Context
        self._client = SpanKind.CLIENT
        self._failed = lambda error: Status(StatusCode.ERROR, error)

    def start(self, parent: tuple[str, str, str] | None, attributes: dict[str, Any]) -> Any:
        """A child of the publishing request (a retry days later too: one trace from the
        postback to its last attempt); a root of its own when no request published it."""
        context = self._context()
        if parent is not None:
            trace_id, span_id, flags = parent
            remote = self._trace.SpanContext(
                int(trace_id, 16),
                int(span_id, 16),
                is_remote=True,
                trace_flags=self._trace.TraceFlags(int(flags, 16)),
            )
            context = self._trace.set_span_in_context(self._trace.NonRecordingSpan(remote), context)
        return self._tracer.start_span(
            ATTEMPT_SPAN, context=context, kind=self._client, attributes=attributes
        )

    def end(self, span: Any, http_status: int | None, error: str | None) -> None:
        if http_status is not None:
            span.set_attribute("http.response.status_code", http_status)
        if error is not None:
            span.set_status(self._failed(error))
        span.end()


class AttemptTrace:
    """One delivery attempt's place in a trace: a `webhook.attempt` span when exporting, and
    the `traceparent` an endpoint with `traceContext` is sent."""

    def __init__(self, parent: str | None, attributes: dict[str, Any]) -> None:
        self._parent = parse_traceparent(parent)
        self._span: Any = None
        if _attempts is not None:
            self._span = _attempts.start(self._parent, attributes)

    def traceparent(self) -> str:
        """The header's value: the attempt span's context when exporting, else a span id of
        our own in the publisher's trace (a new trace when none)."""
        if self._span is not None:
            context = self._span.get_span_context()
            return _format(
                f"{context.trace_id:032x}", f"{context.span_id:016x}", f"{context.trace_flags:02x}"
            )
        trace_id, _, flags = self._parent or (_random_hex(16), None, SAMPLED)
        return _format(trace_id, _random_hex(8), flags)

    def end(self, http_status: int | None, error: str | None) -> None:
        """The answer's status when one came; the error as the span's status when it failed."""
        if self._span is not None and _attempts is not None:
            _attempts.end(self._span, http_status, error)


def _format(trace_id: str, span_id: str, flags: str) -> str:
    return f"00-{trace_id}-{span_id}-{flags}"


def _random_hex(size: int) -> str:
    """`size` random bytes in hex, never all zeros (an invalid id)."""
    while True:
        value = secrets.token_hex(size)
        if value.strip("0"):
            return value
