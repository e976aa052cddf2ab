"""The product's waits (epistream.ops.readiness) and its one Prometheus text parser, without a stack."""

from __future__ import annotations

import asyncio
import http.server
import socket
import threading
import time

import pytest

from epistream.core.metrics import parse_samples, sample_sum
from epistream.ops.readiness import WaitTimeout, poll, poll_async, port_open, url_ok, wait_until


def test_wait_until_returns_the_first_truthy_value():
    values = iter([None, 0, [], "ready"])
    assert wait_until(lambda: next(values), timeout_s=5, what="a value", interval_s=0.01) == "ready"


def test_wait_until_names_what_it_waited_for():
    with pytest.raises(WaitTimeout, match=r"timed out after 0s waiting for the moon") as caught:
        wait_until(lambda: False, timeout_s=0.05, what="the moon", interval_s=0.01)
    assert caught.value.reason == "deadline"
    assert isinstance(caught.value, TimeoutError)


def test_a_stalled_poll_stops_before_its_deadline():
    started = time.monotonic()
    with pytest.raises(WaitTimeout, match="no progress for 0s") as caught:
        poll(lambda: 3, lambda n: n >= 5, what="five turns", timeout_s=30, stall_s=0.1, interval_s=0.01)
    assert caught.value.reason == "stalled" and caught.value.last == 3
    assert time.monotonic() - started < 5


def test_progress_keeps_a_poll_going_and_on_poll_sees_every_state():
    counter = iter(range(100))
    seen: list[int] = []
    got = poll(lambda: next(counter), lambda n: n >= 20, what="twenty", timeout_s=10, stall_s=0.5, interval_s=0.001,
               on_poll=lambda n, waited: seen.append(n))
    assert got == 20 and seen == list(range(21))


def test_the_async_poll_has_the_same_rules():
    async def never() -> int:
        return 0

    with pytest.raises(WaitTimeout, match="waiting for nothing"):
        asyncio.run(poll_async(never, bool, what="nothing", timeout_s=0.05, interval_s=0.01))


def test_a_port_and_a_url_answer_once_served():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert port_open("127.0.0.1", port)
        assert url_ok(f"http://127.0.0.1:{port}/")
        assert not url_ok(f"http://127.0.0.1:{port}/no-such-file")
    finally:
        server.shutdown()
        server.server_close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert not port_open("127.0.0.1", free)
    assert not url_ok(f"http://127.0.0.1:{free}/")


EXPOSITION = """\
# HELP epistream_model_requests_total Model calls.
# TYPE epistream_model_requests_total counter
epistream_model_requests_total{role="extractor",endpoint="a",outcome="ok"} 3.0
epistream_model_requests_total{role="extractor",endpoint="b",outcome="ok"} 2.0
epistream_model_requests_total{role="master",endpoint="a",outcome="retry"} 1.0
# HELP epistream_answer_duration_seconds Latency.
# TYPE epistream_answer_duration_seconds histogram
epistream_answer_duration_seconds_bucket{mode="fast",le="+Inf"} 4.0
epistream_answer_duration_seconds_count{mode="fast"} 4.0
epistream_answer_duration_seconds_sum{mode="fast"} 2.5
"""


def test_one_parser_reads_names_labels_and_values():
    samples = parse_samples(EXPOSITION)
    assert sample_sum(samples, "epistream_model_requests_total", role="extractor") == 5.0
    assert sample_sum(samples, "epistream_model_requests_total", role="extractor", endpoint="b") == 2.0
    assert sample_sum(samples, "epistream_model_requests_total") == 6.0
    assert sample_sum(samples, "epistream_answer_duration_seconds_count", mode="fast") == 4.0
    assert sample_sum(samples, "epistream_answer_duration_seconds_count", mode="deep") == 0.0
    assert sample_sum(samples, "epistream_no_such_metric") == 0.0
