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

import psycopg
import pytest

from epistream.contracts.dead_letters import DeadLetter
from epistream.contracts.segments import Segment
from epistream.testing.scripted_llm import ScriptedLLM

from .conftest import read_topic, wait_for
from .helpers import make_turns, produce_turns
from .scripted_worker import scripted_worker as scripted_worker_process

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


@pytest.fixture(scope="module")
def scripted_worker(kafka):
    """The ingest and enrich workers of their own (see :mod:`.scripted_worker`), talking to a scripted model."""
    # A refused connection counts at once, and a paused enrichment probes again within seconds.
    quick = {"llm_restart_wait_s": 0.5, "enrich_retry_every_s": 1.0, "enrich_pause_max_s": 2.0}
    with scripted_worker_process(kafka, _script, metrics_port=METRICS_PORT, workers=("ingest", "enrich"),
                                 overrides=quick) as worker:
        yield worker


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
