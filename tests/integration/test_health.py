"""Health probes against the real stack, and against servers that fail the way real ones did:
a model server that lists its model but dies at its first completion, and one that is busy."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from epistream.infra import services
from epistream.models.llm import endpoint_name
from epistream.ops.health import Health, probe_all, probe_model


@pytest.mark.integration
async def test_the_embedded_model_server_completes_before_anything_relies_on_it(stack):
    # `up` already ran this probe; it runs first here too, so a server that crashes at its first
    # completion (a CPU instruction the OS does not enable) fails this test, not a later one.
    # A long budget: the test stack's worker may be enriching a replayed segment, and the probe must
    # see a completion, not a busy server.
    probe = await probe_model(stack.with_overrides(health_timeout_s=300.0), stack.llm_base_url)
    assert probe.state is Health.UP, probe.detail


@pytest.mark.integration
def test_every_service_and_worker_answers_its_probe(stack):
    rows = {row.name: row for row in services.status(stack)}
    assert set(rows) >= {"supervisor", "kafka", "postgres", "model-server", "embedder", "worker-ingest",
                         "worker-answer"}
    unhealthy = {name: row.detail for name, row in rows.items() if not row.running}
    assert not unhealthy
    assert "read back" in rows["kafka"].detail
    assert "as epistream_worker" in rows["postgres"].detail
    assert "member of" in rows["worker-ingest"].detail and "member of" in rows["worker-answer"].detail


class _ListsModelsThenDies(BaseHTTPRequestHandler):
    """Answers /v1/models like a loaded server, and drops the connection on a completion."""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        body = b'{"object": "list", "data": [{"id": "smollm2", "object": "model"}]}'
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.connection.shutdown(socket.SHUT_RDWR)  # what a segfaulting server looks like from the client


class _Hangs(_ListsModelsThenDies):
    def do_POST(self) -> None:
        threading.Event().wait(5)


def _serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_server_that_lists_models_but_dies_at_completion_is_down(settings):
    server = _serve(_ListsModelsThenDies)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        probe = await probe_model(settings.with_overrides(health_timeout_s=5.0), url)
    finally:
        server.shutdown()
    assert probe.state is Health.DOWN
    assert "Connection" in probe.detail or "Protocol" in probe.detail


async def test_a_server_that_does_not_answer_is_busy_while_workers_have_calls_in_flight(settings):
    server = _serve(_Hangs)
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    quick = settings.with_overrides(health_timeout_s=1.0, ingest_metrics_port=_free_port(),
                                    answer_metrics_port=_free_port())
    try:
        assert (await probe_model(quick, url)).state is Health.DOWN  # no worker waits on it: it is down
        # A worker's /metrics saying it waits on this endpoint makes the same silence "busy".
        registry = CollectorRegistry()
        gauge = Gauge("epistream_model_requests_in_flight", "", ["role", "endpoint"], registry=registry)
        gauge.labels("extractor", endpoint_name(url)).set(1)
        start_http_server(quick.ingest_metrics_port, addr="127.0.0.1", registry=registry)
        probe = await probe_model(quick, url)
    finally:
        server.shutdown()
    assert probe.state is Health.BUSY, probe.detail
    assert probe.healthy and "in flight" in probe.detail


async def test_probes_report_failures_instead_of_raising(settings):
    nowhere = settings.with_overrides(kafka_bootstrap=f"127.0.0.1:{_free_port()}", health_timeout_s=2.0,
                                      ingest_metrics_port=_free_port(), answer_metrics_port=_free_port())
    probes = {p.service: p for p in await probe_all(nowhere, only={"kafka", "worker-ingest", "worker-answer"})}
    assert all(p.state is Health.DOWN for p in probes.values()), probes
