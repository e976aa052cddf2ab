"""The whole slow path through real worker processes (ingest, then enrich): turns on Kafka ->
segment closed when idle -> memory.segments -> enrichment -> rows and graph,
or -> memory.dlq when the model keeps answering nonsense; a model server that refuses
connections for a while loses nothing (the segments wait, then are enriched).

The worker runs on its own topics and consumer group, with its extractor
pointed at a scripted OpenAI-compatible server, so the output is exact."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from dataclasses import dataclass

import psycopg
import pytest
from pydantic import SecretStr

from epistream.contracts import DeadLetter, Segment
from epistream.kafka_io import ensure_topics
from epistream.readiness import port_open
from epistream.settings import Settings
from infra.process import ManagedProcess, wait_until
from tests.support.scripted_llm import ScriptedLLM

from .conftest import drop_database, own_database, read_topic, wait_for
from .helpers import make_turns, produce_turns

pytestmark = pytest.mark.integration

METRICS_PORT = int(os.environ.get("EPISTREAM_SUPERVISOR_METRICS_PORT", "29103")) + 10  # beside the test stack's ports
POISON = "POISONED-SEGMENT"
OUTAGE = "OUTAGE-CONVERSATION"


def _script(body: dict) -> tuple[int, str]:
    prompt = body["messages"][-1]["content"]
    if POISON in json.dumps(body["messages"]):
        return 200, "I will not answer in JSON."
    assert "<segment>" in prompt
    return 200, json.dumps({
        "summary": "Iris booked a trip to Kyoto.",
        "gists": [{"text": "Iris booked a trip to Kyoto.", "date": "yesterday", "turn_ids": ["t001"]}],
        "facts": [{"subject": "I", "predicate": "booked trip to", "object": "Kyoto", "point_in_time": "yesterday",
                   "turn_ids": ["t001"]}],
    })


@dataclass
class Scripted:
    settings: Settings
    db_url: str
    server: ScriptedLLM


@pytest.fixture(scope="module")
def scripted_worker(kafka):
    """A worker of its own, on a database of its own (one deployment, one memory: the stack's worker
    must not see, close or enrich this worker's conversations), talking to a scripted model."""
    stack = kafka
    suffix = uuid.uuid4().hex[:8]
    url = own_database(stack, f"scripted_{suffix}")
    server = ScriptedLLM(_script).__enter__()
    overrides = {
        "database_url": url,
        "topic_turns": f"scripted-{suffix}.turns", "topic_segments": f"scripted-{suffix}.segments",
        "topic_questions": f"scripted-{suffix}.questions", "topic_answers": f"scripted-{suffix}.answers",
        "topic_dlq": f"scripted-{suffix}.dlq", "indexer_group": f"scripted-{suffix}",
        "enrich_group": f"scripted-{suffix}-enrich", "ingest_metrics_port": METRICS_PORT,
        "enrich_metrics_port": METRICS_PORT + 1, "extractor_base_url": server.base_url, "llm_max_retries": 1,
        # A refused connection counts at once, and a paused enrichment probes again within seconds.
        "llm_restart_wait_s": 0.5, "enrich_retry_every_s": 1.0, "enrich_pause_max_s": 2.0,
    }
    settings = stack.with_overrides(**(overrides | {"database_url": SecretStr(url)}))
    asyncio.run(ensure_topics(settings))
    env = dict(os.environ) | {f"EPISTREAM_{k.upper()}": str(v) for k, v in overrides.items()}
    scripted = Scripted(settings, url, server)
    processes = []
    try:
        for worker, port in (("ingest", METRICS_PORT), ("enrich", METRICS_PORT + 1)):
            process = ManagedProcess(f"worker-scripted-{worker}-{suffix}", stack.state_dir)
            process.spawn([sys.executable, "-m", "epistream.shell.cli", "worker", worker], env=env)
            processes.append(process)
            wait_until(lambda port=port: port_open("127.0.0.1", port), timeout=60, what=f"scripted {worker} worker",
                       log_file=process.log_file)
        yield scripted
    finally:
        for process in processes:
            process.stop()
        scripted.server.__exit__(None, None, None)  # the one running now (a test may have restarted it)
        drop_database(stack, f"scripted_{suffix}")


def test_turns_become_gists_facts_and_graph_through_the_worker(scripted_worker, unique):
    db_url = scripted_worker.db_url
    tenant, conversation = unique("tenant"), unique("conv")
    turns = make_turns(tenant, conversation, [("Iris", "I booked my trip to Kyoto yesterday!"),
                                              ("Joe", "Lucky you, enjoy the temples.")])
    produce_turns(scripted_worker.settings, turns)

    def gists():
        with psycopg.connect(db_url) as conn:
            return conn.execute("SELECT text, event_date FROM memory.gists WHERE tenant = %s", (tenant,)).fetchall()

    rows = wait_for(gists, timeout=90, what="gists from the worker")
    # The turns were said on 2024-05-06: "yesterday" is 2024-05-05.
    assert rows == [("2024-05-05: Iris booked a trip to Kyoto.", turns[0].ts.date().replace(day=5))]
    with psycopg.connect(db_url) as conn:
        conn.execute("LOAD 'age'")
        conn.execute("SET search_path = ag_catalog, public")
        edges = conn.execute(
            "SELECT * FROM cypher('memory_graph', $$ MATCH (s:Entity {tenant: $tenant})-[f:FACT]->(o:Entity)"
            " RETURN s.name, f.predicate, o.name, f.point_in_time $$, %s::agtype) AS (s agtype, p agtype, o agtype,"
            " t agtype)", (json.dumps({"tenant": tenant}),)).fetchall()
    assert [tuple(json.loads(v) for v in e) for e in edges] == [("Iris", "booked_trip_to", "Kyoto", "2024-05-05")]


def test_a_segment_the_model_cannot_enrich_is_dead_lettered_and_its_turns_stay_searchable(
        scripted_worker, unique):
    db_url = scripted_worker.db_url
    tenant, conversation = unique("tenant"), unique("conv")
    turns = make_turns(tenant, conversation, [("Iris", f"{POISON}: tell me about glaciers"),
                                              ("Joe", "Glaciers move slowly.")])
    produce_turns(scripted_worker.settings, turns)
    settings = scripted_worker.settings
    letters = asyncio.run(read_topic(settings, settings.topic_dlq,
                                     lambda k, v: k == conversation.encode(), timeout=90))
    letter = DeadLetter.model_validate_json(letters[0].value)
    assert letter.stage == "enrich" and letter.error_class == "ModelOutputError"
    assert letter.topic == settings.topic_segments and letter.attempts == 2
    segment = Segment.from_bytes(letter.original_value())
    assert segment.conversation_id == conversation and [t.turn_id for t in segment.turns] == ["t001", "t002"]
    with psycopg.connect(db_url) as conn:
        status = conn.execute("SELECT status FROM memory.segments WHERE tenant = %s", (tenant,)).fetchone()
        found = conn.execute("SELECT turn_id FROM memory.turns WHERE tenant = %s AND tsv @@ "
                             "plainto_tsquery('english', 'glaciers') ORDER BY turn_id", (tenant,)).fetchall()
    assert status == ("failed",) and found == [("t001",), ("t002",)]


def test_a_model_server_that_refuses_connections_for_a_while_loses_no_segment(scripted_worker, unique):
    settings, db_url = scripted_worker.settings, scripted_worker.db_url
    port = int(scripted_worker.server.base_url.rsplit(":", 1)[1].split("/")[0])
    scripted_worker.server.__exit__(None, None, None)  # the model server is down: connections are refused
    tenant = unique("tenant")
    conversations = [unique(f"conv{i}") for i in range(3)]
    for conversation in conversations:
        produce_turns(settings, make_turns(tenant, conversation, [("Iris", f"{OUTAGE}: I booked my trip to Kyoto."),
                                                                  ("Joe", "Lucky you.")]))

    def statuses():
        with psycopg.connect(db_url) as conn:
            return dict(conn.execute("SELECT conversation_id, status FROM memory.segments WHERE tenant = %s",
                                     (tenant,)).fetchall())

    wait_for(lambda: len(statuses()) == 3 and set(statuses().values()) == {"waiting"}, timeout=120,
             what="segments waiting for the model")
    scripted_worker.server = ScriptedLLM(_script, port=port).__enter__()  # back, on the same port
    wait_for(lambda: set(statuses().values()) == {"enriched"}, timeout=120, what="waiting segments enriched")
    assert sorted(statuses()) == sorted(conversations)
    letters = asyncio.run(read_topic(settings, settings.topic_dlq, lambda k, v: k.decode() in conversations,
                                     timeout=5))
    assert letters == []
