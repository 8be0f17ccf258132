"""An OTLP/HTTP trace receiver of the tests' own on 127.0.0.1: what a collector (Jaeger, Tempo,
an OpenTelemetry Collector) is to a deployment. It decodes each POST /v1/traces body as the
protobuf `ExportTraceServiceRequest` (opentelemetry-proto's classes) and keeps every span with
its service's name, so a test reads the spans the API and the workers really exported."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

KINDS = {
    Span.SPAN_KIND_INTERNAL: "internal",
    Span.SPAN_KIND_SERVER: "server",
    Span.SPAN_KIND_CLIENT: "client",
    Span.SPAN_KIND_PRODUCER: "producer",
    Span.SPAN_KIND_CONSUMER: "consumer",
}


@dataclass
class ReceivedSpan:
    service: str
    name: str
    kind: str
    trace_id: str  # hex, as a traceparent writes it
    span_id: str
    parent_span_id: str  # "" for a root
    attributes: dict[str, Any]
    # (trace id, span id) of each link.
    links: list[tuple[str, str]] = field(default_factory=list)


def _value(any_value) -> Any:
    which = any_value.WhichOneof("value")
    return None if which is None else getattr(any_value, which)


def _attributes(pairs) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Condition()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.receiver = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """What `OTEL_EXPORTER_OTLP_ENDPOINT` is set to (the exporter adds /v1/traces)."""
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def wait_for(
        self, found: Callable[[list[ReceivedSpan]], bool], *, timeout: float = 20.0, what: str
    ) -> list[ReceivedSpan]:
        """Every span so far, once `found(spans)` holds."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not found(self.spans):
                left = deadline - time.monotonic()
                if left <= 0:
                    names = [(s.service, s.name, s.trace_id) for s in self.spans]
                    raise AssertionError(f"no {what} among {len(names)} spans: {names}")
                self._lock.wait(left)
            return list(self.spans)

    def _add(self, request: ExportTraceServiceRequest) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            service = _attributes(resource_spans.resource.attributes).get("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        ReceivedSpan(
                            service=service,
                            name=span.name,
                            kind=KINDS.get(span.kind, "unspecified"),
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            attributes=_attributes(span.attributes),
                            links=[
                                (link.trace_id.hex(), link.span_id.hex()) for link in span.links
                            ],
                        )
                    )
        with self._lock:
            self.requests += 1
            self.spans.extend(spans)
            self._lock.notify_all()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path != "/v1/traces":
            self._answer(404, b"")
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.server.receiver._add(request)  # type: ignore[attr-defined]
        self._answer(200, ExportTraceServiceResponse().SerializeToString())

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args) -> None:
        pass
