"""`memory.events` through real worker processes (ingest and enrich, a scripted model), read with
kafka-python: a conversation's turns are stored (through the Kafka position of its last turn), its
segment closes, is enriched (the ids of its gists and facts), a later segment's fact supersedes the
earlier one, and the conversation is forgotten: each of the five kinds is seen, with the ids the
database holds. With tenant claims checked, a tenant's events go to its own topic only, which
`epistream tenant add` creates; a tenant not onboarded yet has its events wait in the outbox."""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import timedelta

import psycopg
import pytest
from kafka import KafkaConsumer, TopicPartition
from pydantic import SecretStr

from epistream.client.api import produce_raw
from epistream.contracts.turns import Turn
from epistream.core.claims import tenant_key
from epistream.messaging.tenant_topics import tenant_events_topic
from epistream.settings.processes import Settings
from epistream.testing.scripted_llm import ScriptedLLM

from .conftest import wait_for
from .deployments import BASE_PORT, deployments
from .helpers import T0, make_turns, produce_turns
from .scripted_worker import scripted_worker as scripted_worker_process

pytestmark = pytest.mark.integration

METRICS_PORT = int(os.environ.get("EPISTREAM_SUPERVISOR_METRICS_PORT", "29103")) + 20  # beside the test stack's ports


def _script(body: dict) -> tuple[int, str]:
    prompt = body["messages"][-1]["content"]
    city = "Porto" if "Porto" in prompt else "Lisbon"
    return 200, json.dumps({
        "summary": f"Iris lives in {city}.",
        "gists": [{"text": f"Iris lives in {city}.", "date": "yesterday", "turn_ids": []}],
        "facts": [{"subject": "Iris", "predicate": "lives in", "object": city, "point_in_time": "yesterday",
                   "turn_ids": []}],
    })


def _events(settings: Settings, topic: str, until, timeout: float = 120.0) -> list[dict]:
    """The topic's events from its start (kafka-python), deduplicated by event id, until `until(events)`."""
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False)
    seen: dict[str, dict] = {}
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    event = json.loads(record.value)
                    assert record.key == (event.get("conversation_id") or "").encode()
                    seen.setdefault(event["event_id"], event)
            if until(list(seen.values())):
                return list(seen.values())
        raise AssertionError(f"events not seen within {timeout:.0f}s: {sorted(e['kind'] for e in seen.values())}")
    finally:
        consumer.close()


def _of(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["kind"] == kind]


@pytest.fixture(scope="module")
def workers(kafka):
    with scripted_worker_process(kafka, _script, metrics_port=METRICS_PORT, name="events",
                                 workers=("ingest", "enrich")) as running:
        yield running


def test_a_conversation_announces_each_kind_of_event_through_enrichment_and_forget(workers, unique):
    settings, db_url = workers.settings, workers.db_url
    tenant, conversation = unique("tenant"), unique("conv")
    produce_turns(settings, make_turns(tenant, conversation, [("Iris", "I live in Lisbon."), ("Joe", "Lovely.")]))
    first = _events(settings, settings.topic_events, lambda found: _of(found, "segment_enriched"))
    # A day later, in turns of their own: a second segment, whose fact supersedes the first one's.
    later = [t.model_copy(update={"turn_id": f"later-{t.turn_id}"})
             for t in make_turns(tenant, conversation, [("Iris", "I moved to Porto."), ("Joe", "Congrats.")],
                                 start=T0 + timedelta(days=1))]
    produce_turns(settings, later)
    _events(settings, settings.topic_events, lambda found: _of(found, "fact_superseded"))
    with psycopg.connect(db_url) as conn:
        stored = conn.execute("SELECT turn_id, kafka_partition, kafka_offset FROM memory.turns WHERE tenant = %s "
                              "ORDER BY ts", (tenant,)).fetchall()
        segments = conn.execute("SELECT segment_id, turn_ids FROM memory.segments WHERE tenant = %s ORDER BY seq",
                                (tenant,)).fetchall()
        gists = conn.execute("SELECT segment_id, gist_id FROM memory.gists WHERE tenant = %s ORDER BY gist_id",
                             (tenant,)).fetchall()
        facts = conn.execute("SELECT segment_id, fact_id FROM memory.facts WHERE tenant = %s ORDER BY said_at",
                             (tenant,)).fetchall()
    done = workers.deployment.cli("forget", "--tenant", tenant, "--conversation", conversation)
    assert done.returncode == 0, done.stderr
    found = _events(settings, settings.topic_events, lambda found: _of(found, "conversation_forgotten"))
    found = [e for e in found if e["tenant"] == tenant]
    assert {e["conversation_id"] for e in found} == {conversation}

    # Stored: the last turn of each produce is the position stored through.
    positions = {(e["partition"], e["offset"]) for e in _of(found, "turns_stored")}
    assert {(stored[1][1], stored[1][2]), (stored[3][1], stored[3][2])} <= positions
    assert sum(e["turn_count"] for e in _of(found, "turns_stored")) == 4
    # Closed: both segments, with their turns.
    closed = {e["segment_id"]: (e["first_turn_id"], e["last_turn_id"], e["turn_count"])
              for e in _of(found, "segment_closed")}
    assert closed == {sid: (turns[0], turns[-1], len(turns)) for sid, turns in segments}
    # Enriched: each segment's gists and facts, by id.
    enriched = {e["segment_id"]: (e["gist_ids"], e["fact_ids"], e["gist_count"], e["fact_count"])
                for e in _of(found, "segment_enriched")}
    assert enriched == {sid: ([g for s, g in gists if s == sid], [f for s, f in facts if s == sid], 1, 1)
                        for sid, _ in segments}
    # Superseded: Lisbon's fact, by Porto's.
    [superseded] = _of(found, "fact_superseded")
    assert (superseded["fact_id"], superseded["superseded_by"]) == (facts[0][1], facts[1][1])
    # Forgotten, announced after everything it deleted.
    [forgotten] = _of(found, "conversation_forgotten")
    assert forgotten["scope"] == "conversation"
    # In order within the conversation (one key, one partition): stored, closed, enriched, ..., forgotten.
    kinds = [e["kind"] for e in found]
    assert kinds.index("turns_stored") < kinds.index("segment_closed") < kinds.index("segment_enriched")
    assert kinds[-1] == "conversation_forgotten"
    assert _of([e for e in first if e["tenant"] == tenant], "turns_stored")


SECRET = "events-claims-secret-" + "x" * 32


def test_with_claims_checked_a_tenant_reads_only_its_own_events_topic(kafka, unique):
    a, b, late = unique("tenant-a"), unique("tenant-b"), unique("tenant-late")
    with ScriptedLLM(_script) as llm, deployments(kafka, 1, name="evclaims", tenant_key_secret=SecretStr(SECRET),
                                                  extractor_base_url=llm.base_url, llm_max_retries=1) as (guarded,):
        settings = guarded.settings
        for tenant in (a, b):
            onboarded = guarded.cli("tenant", "add", tenant)
            assert onboarded.returncode == 0, onboarded.stderr
            assert f"# memory events: {tenant_events_topic(settings.topic_events, tenant)}" in onboarded.stdout
        worker = guarded.run("ingest", BASE_PORT + 12)
        try:
            for tenant in (late, a, b):  # `late` is not onboarded yet: it has no events topic
                turns: list[Turn] = make_turns(tenant, unique("conv"), [("Iris", f"{tenant} says hello.")])
                asyncio.run(produce_raw(settings, [(t.conversation_id.encode(), t.to_bytes()) for t in turns],
                                        tenant_key=tenant_key(SECRET.encode(), tenant)))
            own_a = _events(settings, tenant_events_topic(settings.topic_events, a),
                            lambda found: _of(found, "turns_stored"))
            own_b = _events(settings, tenant_events_topic(settings.topic_events, b),
                            lambda found: _of(found, "turns_stored"))
            # The late tenant's event waits in the outbox (it held up no one else) until it is onboarded.
            def waiting() -> list[tuple]:
                with psycopg.connect(guarded.admin_url) as conn:
                    return conn.execute("SELECT published_at FROM memory.event_outbox WHERE tenant = %s",
                                        (late,)).fetchall()

            wait_for(lambda: waiting() == [(None,)], timeout=60, what="the late tenant's event in the outbox")
            time.sleep(2 * settings.events_relay_every_s)  # relay rounds pass: it stays there
            assert waiting() == [(None,)]
            assert guarded.cli("tenant", "add", late).returncode == 0
            own_late = _events(settings, tenant_events_topic(settings.topic_events, late),
                               lambda found: _of(found, "turns_stored"))
        finally:
            worker.stop()
        assert {e["tenant"] for e in own_a} == {a} and {e["tenant"] for e in own_b} == {b}
        assert {e["tenant"] for e in own_late} == {late}
        # The shared topic carries nobody's events where claims are checked.
        consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False)
        try:
            shared = [TopicPartition(settings.topic_events, p)
                      for p in sorted(consumer.partitions_for_topic(settings.topic_events) or [])]
            ends = consumer.end_offsets(shared)
            starts = consumer.beginning_offsets(shared)
        finally:
            consumer.close()
        assert all(ends[tp] == starts[tp] for tp in shared)
