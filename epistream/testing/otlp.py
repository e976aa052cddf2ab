"""A real OTLP/HTTP trace receiver on loopback, for tests and benchmarks that trace worker processes:
the SDK's in-memory exporter cannot see other processes, so they export here as to any collector
(POST /v1/traces, protobuf), and the spans are decoded with opentelemetry-proto.

``python -m epistream.testing.otlp --port N`` serves the same receiver in a process of its own until
SIGTERM, so decoding costs nothing to the process that times the traced calls; it keeps counts only,
read with ``GET /v1/stats``: ``{"spans": n, "requests": m, "services": {service.name: spans}}``."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

#: OTLP's span kinds (opentelemetry.proto.trace.v1.Span.SpanKind).
KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root span
    attributes: dict[str, Any]
    links: list[tuple[str, str]] = field(default_factory=list)  # (trace_id, span_id) of each link
    status: int = 0  # 2: error


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest.FromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(ReceivedSpan(
                    service=str(resource.get("service.name", "")), name=span.name, kind=KINDS.get(span.kind, "?"),
                    trace_id=span.trace_id.hex(), span_id=span.span_id.hex(), parent_span_id=span.parent_span_id.hex(),
                    attributes={a.key: _value(a.value) for a in span.attributes},
                    links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                    status=span.status.code))
    return spans


class OtlpReceiver:
    """`with OtlpReceiver() as receiver:` point OTEL_EXPORTER_OTLP_ENDPOINT at `receiver.endpoint`; the
    spans arrive in `receiver.spans` (every export request also counted in `receiver.requests`, the spans
    per service in `receiver.services`). `port` 0: any free one; `keep=False` keeps the counts only."""

    def __init__(self, port: int = 0, *, keep: bool = True) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self.services: Counter[str] = Counter()
        self._keep = keep
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                if self.path != "/v1/stats":
                    self.send_error(404)
                    return
                data = json.dumps(receiver.stats()).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                status = 404
                if self.path == "/v1/traces":
                    spans = decode(body)
                    with receiver._lock:
                        if receiver._keep:
                            receiver.spans.extend(spans)
                        receiver.services.update(span.service for span in spans)
                        receiver.requests += 1
                    status = 200
                data = ExportTraceServiceResponse().SerializeToString()
                self.send_response(status)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        """The value of OTEL_EXPORTER_OTLP_ENDPOINT (the exporter adds /v1/traces)."""
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def received(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def stats(self) -> dict[str, Any]:
        """What /v1/stats answers: spans and export requests received, and the spans of each service."""
        with self._lock:
            return {"spans": sum(self.services.values()), "requests": self.requests, "services": dict(self.services)}

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m epistream.testing.otlp",
                                description="An OTLP/HTTP trace receiver on loopback, counting what it receives "
                                            "(GET /v1/stats), until SIGTERM.")
    p.add_argument("--port", type=int, required=True, help="the port on 127.0.0.1 (the exporters' endpoint)")
    args = p.parse_args(argv)
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # before the server's threads start: they inherit it
    with OtlpReceiver(args.port, keep=False) as receiver:
        print(f"receiving OTLP/HTTP at {receiver.endpoint}", flush=True)
        signal.sigwait(stop)
        print(f"stopping: {receiver.stats()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
