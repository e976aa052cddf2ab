"""One trace from a produced turn to its answer, through real worker processes (ingest, enrich and
answer) exporting OTLP/HTTP to a real receiver on loopback (epistream.testing.otlp), their models a
scripted OpenAI-compatible server; and an ingest worker with tracing off: no span, no header."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from opentelemetry.sdk.trace import TracerProvider

from epistream.client.api import ask, produce_raw
from epistream.contracts.questions import Mode, Question
from epistream.contracts.turns import Turn
from epistream.infra.process import ManagedProcess
from epistream.testing.otlp import OtlpReceiver, ReceivedSpan
from epistream.testing.scripted_llm import ScriptedLLM
from epistream.testing.turns import make_turns

from .conftest import count_turns, read_topic, wait_for
from .deployments import Deployment, deployments

pytestmark = pytest.mark.integration

BASE_PORT = int(os.environ.get("EPISTREAM_SUPERVISOR_METRICS_PORT", "29103")) + 80  # beside the test stack's ports (and the other tests')
KYOTO = "I booked my trip to Kyoto yesterday, the ryokan near the temple!"
TEMPLES = "Lucky you, enjoy the temples and the moss garden."
QUESTION = "Where is the ryokan trip of Iris going?"
# Turns are a minute apart: past this gap each turn closes the segment before it, in the batch that
# stores it, so the closed segment's record continues that turn's trace.
OVERRIDES = {"segment_max_gap_s": 30, "deep_reads": "segments", "llm_max_retries": 0, "segment_idle_s": 3600}
# Spans leave a worker within a fifth of a second, not the SDK's default 5 s.
QUICK_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "200"}


def _script(body: dict) -> tuple[int, str]:
    """Each role by the schema it asks for: enrichment, assistant read, master."""
    properties = body.get("response_format", {}).get("schema", {}).get("properties", {})
    prompt = body["messages"][-1]["content"]
    if "summary" in properties:
        return 200, json.dumps({
            "summary": "Iris booked a trip.", "gists": [{"text": "Iris booked a trip.", "turn_ids": ["t001"]}],
            "facts": [{"subject": "Iris", "predicate": "booked", "object": "a trip", "turn_ids": ["t001"]}]})
    if "relevant" in properties:
        said = re.search(r"\((t\d+)\) Iris: I booked", prompt)
        if said is None:
            return 200, json.dumps({"relevant": False, "evidence": []})
        return 200, json.dumps({"relevant": True, "evidence": [{"turn_id": said.group(1),
                                                                 "quote": "I booked my trip to Kyoto"}]})
    return 200, json.dumps({"answer": "To Kyoto.", "abstain": False, "evidence": [1]})


@dataclass
class Traced:
    deployment: Deployment
    receiver: OtlpReceiver
    processes: dict[str, ManagedProcess]

    def spans(self, trace_id: str | None = None) -> list[ReceivedSpan]:
        return [s for s in self.receiver.received() if trace_id is None or s.trace_id == trace_id]

    def produce(self, turns: list[Turn]) -> None:
        asyncio.run(produce_raw(self.deployment.settings, [(t.conversation_id.encode(), t.to_bytes()) for t in turns]))

    def turns(self, tenant: str, conversation: str) -> int:
        return count_turns(self.deployment.admin_url, tenant, conversation)


def _start(kafka, server: ScriptedLLM, receiver: OtlpReceiver, name: str, workers: tuple[str, ...],
           otel: dict[str, str], port: int) -> Iterator[Traced]:
    models = {"llm_base_url": server.base_url, "assistant_base_urls": server.base_url,
              "extractor_base_url": server.base_url}
    with deployments(kafka, 1, name=name, **OVERRIDES, **models) as (deployment,):
        # Only what this test sets: an OTEL_* variable of the test's own environment must not leak in.
        deployment.env = {k: v for k, v in deployment.env.items() if not k.startswith("OTEL_")} | otel
        running = Traced(deployment, receiver, {})
        try:
            for n, worker in enumerate(workers):
                running.processes[worker] = deployment.run(worker, port + n)
            yield running
        finally:
            for process in running.processes.values():
                process.stop()


@pytest.fixture(scope="module")
def traced(kafka) -> Iterator[Traced]:
    with ScriptedLLM(_script) as server, OtlpReceiver() as receiver:
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint} | QUICK_EXPORT
        yield from _start(kafka, server, receiver, "traces", ("ingest", "enrich", "answer"), otel, BASE_PORT)


@pytest.fixture(scope="module")
def untraced(kafka) -> Iterator[Traced]:
    """Tracing off by the rule (OTEL_TRACES_EXPORTER=none), with an endpoint that would show any span."""
    with ScriptedLLM(_script) as server, OtlpReceiver() as receiver:
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_TRACES_EXPORTER": "none"} | QUICK_EXPORT
        yield from _start(kafka, server, receiver, "untraced", ("ingest",), otel, BASE_PORT + 5)


def _one(spans: list[ReceivedSpan], **match: object) -> ReceivedSpan:
    found = [s for s in spans if all(getattr(s, k) == v for k, v in match.items())]
    assert len(found) == 1, (match, [(s.service, s.name, s.parent_span_id) for s in spans])
    return found[0]


def _children(spans: list[ReceivedSpan], parent: ReceivedSpan, name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.parent_span_id == parent.span_id and s.name == name]


def _kafka_attributes(span: ReceivedSpan, topic: str, operation: str) -> None:
    assert span.attributes["messaging.system"] == "kafka"
    assert span.attributes["messaging.operation.name"] == operation
    assert span.attributes["messaging.destination.name"] == topic


def _gists(db_url: str, tenant: str) -> list:
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT text FROM memory.gists WHERE tenant = %s", (tenant,)).fetchall()


def test_a_turn_and_its_question_make_one_trace_across_the_ingest_enrich_and_answer_workers(traced, unique):
    settings = traced.deployment.settings
    tenant, conversation = unique("tenant"), unique("conv")
    # The agent's own span, as an application with its own tracing has one: the client continues it.
    agent = TracerProvider().get_tracer("agent")
    with agent.start_as_current_span("agent turn and question") as root:
        traced.produce(make_turns(tenant, conversation, [("Iris", KYOTO), ("Joe", TEMPLES)]))
        wait_for(lambda: _gists(traced.deployment.admin_url, tenant), timeout=120, what="the segment enriched")
        answer = asyncio.run(ask(settings, Question(question_id=unique("q"), tenant=tenant, question=QUESTION,
                                                    mode=Mode.DEEP), timeout_s=120))
    assert answer.answer == "To Kyoto." and not answer.error
    trace_id, root_id = format(root.get_span_context().trace_id, "032x"), format(root.get_span_context().span_id, "016x")

    def master_call() -> list[ReceivedSpan]:
        return [s for s in traced.spans(trace_id) if s.attributes.get("epistream.model.role") == "master"]

    # The question's process span ends last (after its transaction): the others are in by then.
    wait_for(lambda: [s for s in traced.spans(trace_id) if s.name == f"process {settings.topic_questions}"],
             timeout=30, what="the answer worker's spans")
    spans = traced.spans(trace_id)

    # Ingest: the batch's process span links the turns' producer span; the segment the second turn
    # closed is sent in the turn's own trace.
    ingest = [s for s in traced.spans() if s.service == "epistream-ingest"]
    batches = [s for s in ingest if s.name == f"process {settings.topic_turns}" and (trace_id, root_id) in s.links]
    assert batches and all(b.kind == "consumer" and b.parent_span_id == "" for b in batches)
    _kafka_attributes(batches[0], settings.topic_turns, "process")
    assert batches[0].attributes["messaging.operation.type"] == "process"
    assert batches[0].attributes["messaging.batch.message_count"] >= 1
    assert any(_children(ingest, b, "store turns") for b in batches)
    sent = _one(spans, service="epistream-ingest", name=f"send {settings.topic_segments}")
    assert sent.kind == "producer" and sent.parent_span_id == root_id
    _kafka_attributes(sent, settings.topic_segments, "send")

    # Enrich: the segment's record continues the trace; its model call is a GenAI span.
    enriched = _one(spans, service="epistream-enrich", name=f"process {settings.topic_segments}")
    assert enriched.kind == "consumer" and enriched.parent_span_id == sent.span_id
    _kafka_attributes(enriched, settings.topic_segments, "process")
    assert enriched.attributes["messaging.destination.partition.id"].isdigit()
    assert enriched.attributes["messaging.kafka.offset"] >= 0
    (extract,) = [s for s in spans if s.service == "epistream-enrich" and s.parent_span_id == enriched.span_id
                  and s.name.startswith("chat ")]
    assert extract.kind == "client" and extract.attributes["epistream.model.role"] == "extractor"
    assert {k: extract.attributes[k] for k in ("gen_ai.system", "gen_ai.operation.name", "gen_ai.request.model",
                                               "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens")} == {
        "gen_ai.system": "openai", "gen_ai.operation.name": "chat", "gen_ai.request.model": settings.llm_model,
        "gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 5}

    # Answer: the question's record continues the trace; decoding, the router's pathways, each
    # assistant read (with its model call) and the master call are spans of it.
    process = _one(spans, service="epistream-answer", name=f"process {settings.topic_questions}")
    assert process.kind == "consumer" and process.parent_span_id == root_id
    _kafka_attributes(process, settings.topic_questions, "process")
    assert _children(spans, process, "decode question")
    (deep,) = _children(spans, process, "deep question")
    (routed,) = _children(spans, deep, "route segments")
    answer_spans = [s for s in spans if s.service == "epistream-answer"]
    assert {"route summary", "route dense", "route lexical"} <= {s.name for s in answer_spans}
    reads = _children(spans, deep, "assistant read")
    assert reads and all(len([s for s in spans if s.parent_span_id == r.span_id and s.name.startswith("chat ")]) == 1
                         for r in reads)
    (master,) = master_call()
    assert master.parent_span_id == deep.span_id and master.attributes["gen_ai.usage.output_tokens"] == 5
    assert routed.parent_span_id == deep.span_id

    # Logs point at the trace: the answer worker's line about this question carries its trace id.
    log = traced.processes["answer"].log_file.read_text(errors="replace")
    assert re.search(rf"answered {re.escape(answer.question_id)} .* trace_id={trace_id} span_id=[0-9a-f]{{16}}", log)

    # Nothing said reaches a span by default: no turn, no question, no prompt, no completion.
    for span in traced.spans():
        held = json.dumps(span.attributes)
        for text in ("ryokan", "moss garden", "To Kyoto", "I booked my trip"):
            assert text not in held, (span.name, text)


def test_a_record_without_trace_headers_is_stored_as_before(traced, unique):
    tenant, conversation = unique("tenant"), unique("conv")
    traced.produce(make_turns(tenant, conversation, [("Iris", "No tracing in this agent.")]))
    wait_for(lambda: traced.turns(tenant, conversation) == 1, timeout=60, what="the untraced turn stored")
    records = asyncio.run(read_topic(traced.deployment.settings, traced.deployment.settings.topic_turns,
                                     lambda k, v: k == conversation.encode()))
    assert [name for name, _ in records[0].headers] == []  # no span in the producer: no header


def test_tracing_off_adds_no_span_and_no_header(untraced, unique):
    settings = untraced.deployment.settings
    tenant, conversation = unique("tenant"), unique("conv")
    # Records that do carry a trace: a worker with tracing off neither continues nor forwards it.
    with TracerProvider().get_tracer("agent").start_as_current_span("agent turns"):
        untraced.produce(make_turns(tenant, conversation, [("Iris", KYOTO), ("Joe", TEMPLES)]))
    wait_for(lambda: untraced.turns(tenant, conversation) == 2, timeout=60, what="the turns stored")
    (segment,) = asyncio.run(read_topic(settings, settings.topic_segments, lambda k, v: k == conversation.encode()))
    assert [name for name, _ in segment.headers or []] == []
    produced = asyncio.run(read_topic(settings, settings.topic_turns, lambda k, v: k == conversation.encode(), want=2))
    assert all(dict(r.headers).keys() == {"traceparent"} for r in produced)  # what the worker was given
    assert untraced.receiver.received() == [] and untraced.receiver.requests == 0
