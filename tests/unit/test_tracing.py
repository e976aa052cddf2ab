"""epistream.core.tracing's rules: when tracing is on, what a header and a span carry, what a log line gains.
Spans go to the SDK's in-memory exporter here; the workers' real traces are tests/integration/test_tracing.py."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from epistream.core import tracing


@pytest.mark.parametrize(("environ", "on"), [
    ({}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
    ({"OTEL_SERVICE_NAME": "x", "OTEL_EXPORTER_OTLP_HEADERS": "a=b"}, False),
])
def test_tracing_is_on_only_where_the_otel_variables_say_so(environ, on):
    assert tracing.configured(environ) is on


def test_setup_without_the_variables_leaves_tracing_off():
    assert tracing.setup("epistream-test", environ={}) is False
    assert not tracing.enabled()


def test_setup_refuses_an_exporter_it_cannot_build():
    with pytest.raises(ValueError, match="zipkin"):
        tracing.setup("epistream-test", environ={"OTEL_TRACES_EXPORTER": "zipkin"})


@pytest.fixture
def exported(monkeypatch) -> InMemorySpanExporter:
    """Tracing on, into memory (what `setup` does, but without the global provider)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("test"))
    return exporter


def test_off_there_is_no_span_and_no_header():
    assert not tracing.enabled()
    with tracing.span("anything") as current:
        assert current is None
        assert tracing.inject([("epistream-sig", b"s")]) == [("epistream-sig", b"s")]
    assert tracing.extract([("traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01")]) is None


def test_a_header_carries_the_span_on_and_back(exported):
    with tracing.span("send t", kind="producer") as sent:
        headers = tracing.inject([("epistream-sig", b"s")])
    assert headers[0] == ("epistream-sig", b"s") and [n for n, _ in headers[1:]] == ["traceparent"]
    parent = tracing.extract(headers)
    with tracing.span("process t", kind="consumer", parent=parent) as processed:
        pass
    assert processed.get_span_context().trace_id == sent.get_span_context().trace_id
    assert processed.parent.span_id == sent.get_span_context().span_id


def test_a_record_without_trace_headers_starts_no_parent(exported):
    assert tracing.extract([("epistream-sig", b"s")]) is None
    assert tracing.extract([("traceparent", b"not a traceparent")]) is None


def test_a_failed_span_names_the_error_type_but_never_its_message(exported):
    with pytest.raises(ValueError), tracing.span("decode question"):
        raise ValueError("input_value='what the user said'")
    (span,) = exported.get_finished_spans()
    assert span.attributes["error.type"] == "ValueError"
    assert span.events == () and "what the user said" not in str(span.status.description)


def test_texts_reach_a_span_only_where_the_setting_asks(exported, monkeypatch):
    with tracing.span("chat m") as current:
        tracing.set_text(current, "gen_ai.input.messages", "hello")
    monkeypatch.setattr(tracing, "_texts", True)
    with tracing.span("chat m") as current:
        tracing.set_text(current, "gen_ai.input.messages", "hello")
    first, second = exported.get_finished_spans()
    assert "gen_ai.input.messages" not in first.attributes
    assert second.attributes["gen_ai.input.messages"] == "hello"


async def test_a_traced_function_runs_in_its_span_with_fixed_attributes_only(exported):
    @tracing.traced("retrieve gists", {"epistream.pathways": "dense"})
    async def nearest(question: str) -> str:
        return question.upper()

    assert await nearest("private words") == "PRIVATE WORDS"
    (span,) = exported.get_finished_spans()
    assert span.name == "retrieve gists" and dict(span.attributes) == {"epistream.pathways": "dense"}


def test_each_closed_segment_continues_its_conversations_latest_traced_record(exported):
    with tracing.span("first") as first:
        a = tracing.inject()
    with tracing.span("second") as second:
        b = tracing.inject()
    origins = tracing.origins_of([("t", "c1", a), ("t", "c1", b), ("t", "c2", []), ("u", "c1", a)])
    assert set(origins) == {("t", "c1"), ("u", "c1")}
    with tracing.publishing(origins):
        found = tracing.origin("t", "c1")
        assert tracing.origin("t", "c2") is None
    assert tracing.origin("t", "c1") is None  # outside the publishing block
    from opentelemetry import trace
    assert trace.get_current_span(found).get_span_context().span_id == second.get_span_context().span_id
    assert first.get_span_context().span_id != second.get_span_context().span_id


def test_messaging_attributes_follow_the_conventions():
    assert tracing.messaging("process", "process", "memory.turns", partition=3, offset=7, group="g", count=2) == {
        "messaging.system": "kafka", "messaging.operation.name": "process", "messaging.operation.type": "process",
        "messaging.destination.name": "memory.turns", "messaging.destination.partition.id": "3",
        "messaging.kafka.offset": 7, "messaging.consumer.group.name": "g", "messaging.batch.message_count": 2}
    # A record with no Kafka position (a segment retried from the store) names none.
    assert "messaging.kafka.offset" not in tracing.messaging("process", "process", "s", partition=-1, offset=-1)


def test_log_lines_inside_a_span_carry_its_ids(exported, monkeypatch, caplog):
    monkeypatch.setattr(logging, "_logRecordFactory", logging.getLogRecordFactory())  # restored after
    tracing._mark_log_records()
    logger = logging.getLogger("epistream.test_tracing")
    with caplog.at_level(logging.INFO, logger="epistream.test_tracing"):
        logger.info("outside %s", "a span")
        with tracing.span("work") as current:
            logger.info("inside %s at 100%%", "a span")
    outside, inside = caplog.records
    assert outside.getMessage() == "outside a span" and not hasattr(outside, "trace_id")
    context = current.get_span_context()
    assert inside.getMessage() == (f"inside a span at 100% trace_id={context.trace_id:032x} "
                                   f"span_id={context.span_id:016x}")
    assert inside.trace_id == f"{context.trace_id:032x}"


def test_the_base_install_runs_untraced_without_the_opentelemetry_packages():
    # A process where `import opentelemetry` fails, as in an install without the tracing extra.
    program = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "import epistream.client.api\n"
        "from epistream.core import tracing\n"
        "assert tracing.setup('x', environ={'OTEL_EXPORTER_OTLP_ENDPOINT': 'http://127.0.0.1:1'}) is False\n"
        "with tracing.span('s') as current:\n"
        "    assert current is None and tracing.inject([('a', b'b')]) == [('a', b'b')]\n"
        "print('untraced')\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "untraced", done.stderr
    assert "install epistream[tracing]" in done.stderr
