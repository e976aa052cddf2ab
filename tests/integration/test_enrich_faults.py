"""Enrichment under faults, on real PostgreSQL with scripted models: a model that refuses, errs or
hangs pauses enrichment (the segment waits, the breaker stops the calls) and the waiting segments
are enriched from the store once it answers; database errors are retried or fail the segment with a
reason, never leave it silently pending; oversize segments are fitted to the model's context."""

from __future__ import annotations

import asyncio
import copy
import json
import socket
import threading
import time
from datetime import datetime

import psycopg
import pytest

from epistream.contracts.segments import Segment, SegmentTurn
from epistream.core.metrics import Metrics
from epistream.core.retry import Backoff
from epistream.models.embeddings import Embedder
from epistream.models.llm import ModelClient, create_client
from epistream.models.prompts import estimate_tokens
from epistream.pipeline import enrich
from epistream.pipeline.breaker import CircuitBreaker
from epistream.pipeline.enrich import EnrichDeps, enrich_segment, retry_waiting
from epistream.pipeline.ingest import ingest_batch
from epistream.pipeline.records import RawRecord
from epistream.pipeline.segmenter import SegmenterConfig
from epistream.pipeline.store import memory
from epistream.storage.db import tenant_scope
from epistream.testing.scripted_llm import ScriptedLLM

from .helpers import make_turns
from .seed import DIALOGUE, KNOWN_OUTPUT, TZ, scripted_reply, seed_segment

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def embedder(postgres) -> Embedder:
    return Embedder.from_settings(postgres)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _breaker(clock: FakeClock | None = None) -> CircuitBreaker:
    return CircuitBreaker(Backoff(first_s=5.0, cap_s=60.0, jitter_low=1.0, jitter_high=1.0),
                          clock=clock or time.monotonic)


def _deps(settings, pool, embedder, base_url: str, *, breaker: CircuitBreaker | None = None, timeout_s: float = 30.0,
          retries: int = 1) -> EnrichDeps:
    metrics = Metrics.create()
    extractor = ModelClient(create_client(settings, base_url=base_url, timeout_s=timeout_s), role="extractor",
                            model=settings.llm_model, json_mode=settings.llm_json_mode, metrics=metrics,
                            max_retries=retries, backoff_s=0.01, restart_wait_s=0.2)
    return EnrichDeps(settings, pool, embedder, extractor, metrics, breaker or _breaker())


async def _store(pool, embedder, segment, turns) -> None:
    """The segment's turns and its row, as the ingest worker leaves them."""
    records = [RawRecord("memory.turns", 0, i, None, t.to_bytes(), None) for i, t in enumerate(turns)]
    await ingest_batch(records, pool=pool, embedder=embedder, metrics=Metrics.create(),
                       segmenter=SegmenterConfig(max_tokens=1_000_000))
    async with pool.connection() as conn, tenant_scope(conn, segment.tenant):
        await conn.execute(
            "INSERT INTO memory.segments (tenant, conversation_id, segment_id, seq, turn_ids, start_ts, end_ts,"
            " raw_text, token_estimate, close_reason) VALUES (%s, %s, %s, %s, %s, %s, %s, 'raw', 100, 'session')",
            (segment.tenant, segment.conversation_id, segment.segment_id, segment.seq, [t.turn_id for t in turns],
             turns[0].ts, turns[-1].ts))


def _status(db_url: str, tenant: str) -> list[tuple]:
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT segment_id, status, error FROM memory.segments WHERE tenant = %s"
                            " ORDER BY segment_id", (tenant,)).fetchall()


def _refused_url() -> str:
    """A loopback port nothing listens on: every connection is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


async def test_a_refused_model_leaves_the_segment_waiting_not_failed(postgres, pool, embedder, db_url, unique):
    tenant = unique("tenant")
    segment, turns = seed_segment(tenant, unique("conv"))
    await _store(pool, embedder, segment, turns)
    breaker = _breaker()
    outcome = await enrich_segment(segment, _deps(postgres, pool, embedder, _refused_url(), breaker=breaker))
    assert outcome.status == "waiting" and outcome.error is None  # nothing to dead-letter
    [(_, status, error)] = _status(db_url, tenant)
    assert status == "waiting" and "ModelUnavailable" in error
    assert not breaker.allows_call()


async def test_a_hung_model_is_bounded_by_the_call_timeout_and_the_segment_waits(postgres, pool, embedder, db_url,
                                                                                   unique):
    tenant = unique("tenant")
    segment, turns = seed_segment(tenant, unique("conv"))
    await _store(pool, embedder, segment, turns)

    def hang(body: dict) -> tuple[int, str]:
        time.sleep(3.0)
        return scripted_reply(body)

    with ScriptedLLM(hang) as server:
        outcome = await enrich_segment(segment, _deps(postgres, pool, embedder, server.base_url, timeout_s=0.3))
    assert outcome.status == "waiting" and outcome.error is None
    assert [s for _, s, _ in _status(db_url, tenant)] == ["waiting"]


async def test_an_outage_pauses_enrichment_and_the_waiting_segments_resume_from_the_store(
        postgres, pool, embedder, db_url, unique):
    tenant, conversation = unique("tenant"), unique("conv")
    first, turns = seed_segment(tenant, conversation)
    second = first.model_copy(update={"segment_id": f"{conversation}#0001", "seq": 1})
    await _store(pool, embedder, first, turns)
    await _store(pool, embedder, second, turns)
    up = {"now": False}
    clock = FakeClock()
    breaker = _breaker(clock)
    with ScriptedLLM(lambda body: scripted_reply(body) if up["now"] else (503, "loading model")) as server:
        deps = _deps(postgres, pool, embedder, server.base_url, breaker=breaker)
        assert (await enrich_segment(first, deps)).status == "waiting"
        calls = len(server.requests)
        assert calls == 2  # the client's own attempts, then the breaker opened
        # While the breaker is open the model is not called: the segment waits in the store.
        assert (await enrich_segment(second, deps)).status == "waiting"
        assert len(server.requests) == calls
        assert await retry_waiting(deps) == []  # not due yet
        up["now"] = True
        clock.now += 5.0  # the backoff has passed: the breaker half-opens and one call probes
        outcomes = await retry_waiting(deps)
    ours = {first.segment_id, second.segment_id}  # other tests' waiting segments are retried too
    assert sorted(o.status for o in outcomes if o.segment_id in ours) == ["enriched", "enriched"]
    assert [s for _, s, _ in _status(db_url, tenant)] == ["enriched", "enriched"]
    assert breaker.allows_call()


async def test_a_nul_in_model_output_is_removed_before_it_is_stored(postgres, pool, embedder, db_url, unique):
    tenant = unique("tenant")
    segment, turns = seed_segment(tenant, unique("conv"))
    await _store(pool, embedder, segment, turns)
    output = copy.deepcopy(KNOWN_OUTPUT)
    output["summary"] = "Alice moved\u0000 to Lisbon."
    output["gists"][0]["text"] = "Alice moved to\u0000 Lisbon."
    output["facts"][1]["object"] = "Lis\u0000bon\ud800"
    with ScriptedLLM(lambda body: (200, json.dumps(output))) as server:
        outcome = await enrich_segment(segment, _deps(postgres, pool, embedder, server.base_url))
    assert outcome.status == "enriched"
    with psycopg.connect(db_url) as conn:
        summary = conn.execute("SELECT summary FROM memory.segments WHERE tenant = %s", (tenant,)).fetchone()[0]
        gist = conn.execute("SELECT text FROM memory.gists WHERE tenant = %s AND ordinal = 0", (tenant,)).fetchone()[0]
        names = [r[0] for r in conn.execute("SELECT name FROM memory.entities WHERE tenant = %s", (tenant,))]
    assert summary == "Alice moved to Lisbon." and gist == "2024-03-13: Alice moved to Lisbon."
    assert "Lisbon" in names


async def test_a_transient_database_error_is_retried_without_a_second_model_call(
        postgres, pool, embedder, db_url, unique, monkeypatch):
    tenant = unique("tenant")
    segment, turns = seed_segment(tenant, unique("conv"))
    await _store(pool, embedder, segment, turns)
    store, failures = memory.store_enrichment, []

    async def deadlocks_once(*args, **kwargs):
        if not failures:
            failures.append(1)
            raise psycopg.errors.DeadlockDetected("deadlock detected")
        return await store(*args, **kwargs)

    monkeypatch.setattr(memory, "store_enrichment", deadlocks_once)
    with ScriptedLLM(scripted_reply) as server:
        outcome = await enrich_segment(segment, _deps(postgres, pool, embedder, server.base_url))
        assert len(server.requests) == 1
    assert outcome.status == "enriched" and failures == [1]
    assert [s for _, s, _ in _status(db_url, tenant)] == ["enriched"]


async def test_any_other_error_fails_the_segment_with_its_reason(postgres, pool, embedder, db_url, unique,
                                                                  monkeypatch):
    tenant = unique("tenant")
    segment, turns = seed_segment(tenant, unique("conv"))
    await _store(pool, embedder, segment, turns)

    def overflows(*_args: object) -> None:
        raise OverflowError("date value out of range")

    monkeypatch.setattr(enrich, "postprocess", overflows)
    with ScriptedLLM(scripted_reply) as server:
        outcome = await enrich_segment(segment, _deps(postgres, pool, embedder, server.base_url))
    assert outcome.status == "failed" and isinstance(outcome.error, OverflowError)
    [(_, status, error)] = _status(db_url, tenant)
    assert status == "failed" and error == "OverflowError: date value out of range"


async def test_entities_are_written_in_name_order_whatever_the_model_order(postgres, pool, embedder, unique,
                                                                          monkeypatch):
    """Two enrichments of one tenant lock entity rows in the same order, so they cannot deadlock."""
    tenant = unique("tenant")
    segment, turns = seed_segment(tenant, unique("conv"))
    await _store(pool, embedder, segment, turns)
    resolve, order = memory._entity, []

    async def recording(conn, segment, normalized, *args):
        order.append(normalized)
        return await resolve(conn, segment, normalized, *args)

    monkeypatch.setattr(memory, "_entity", recording)
    with ScriptedLLM(scripted_reply) as server:
        assert (await enrich_segment(segment, _deps(postgres, pool, embedder, server.base_url))).status == "enriched"
    assert len(order) == 6 and order == sorted(order)


async def test_a_segment_over_the_model_context_is_truncated_deliberately_and_enriched(
        postgres, pool, embedder, db_url, unique):
    tenant, conversation = unique("tenant"), unique("conv")
    padding = [("Bob", f"Filler sentence number {i} about the weather in Lisbon today. " * 5) for i in range(50)]
    huge = ("I wrote a very long story. " + "word " * 4000)[:20_000]  # the longest turn the contract takes
    turns = make_turns(tenant, conversation, [*DIALOGUE, *padding, ("Alice", huge)],
                       start=datetime(2024, 3, 18, 20, 0, tzinfo=TZ))
    segment = Segment(
        tenant=tenant, conversation_id=conversation, segment_id=f"{conversation}#0000", seq=0, close_reason="budget",
        overlap_turns=0, token_estimate=sum(estimate_tokens(t.text) for t in turns),
        turns=[SegmentTurn(turn_id=t.turn_id, speaker=t.speaker, text=t.text, ts=t.ts) for t in turns],
    )
    assert sum(estimate_tokens(t.text) for t in segment.turns) > postgres.model_ctx - postgres.extractor_max_tokens

    def context_of_the_model(body: dict) -> tuple[int, str]:
        # As llama.cpp does: a prompt that leaves no room for the completion is refused.
        prompt = sum(estimate_tokens(m["content"]) for m in body["messages"])
        if prompt + body["max_tokens"] > postgres.model_ctx:
            return 400, f"Requested tokens ({prompt}) exceed context window of {postgres.model_ctx}"
        return scripted_reply(body)

    await _store(pool, embedder, segment, turns)
    with ScriptedLLM(context_of_the_model) as server:
        outcome = await enrich_segment(segment, _deps(postgres, pool, embedder, server.base_url))
        prompt = server.requests[-1]["messages"][-1]["content"]
    assert outcome.status == "enriched" and outcome.truncated_chars > 0
    assert "[... truncated" in prompt and "I wrote a very long story." in prompt
    assert [s for _, s, _ in _status(db_url, tenant)] == ["enriched"]


async def _correct(pool, embedder, turn, text: str) -> None:
    """A correction of a stored turn (same id, new text), as the ingest worker applies it."""
    corrected = turn.model_copy(update={"text": text})
    await ingest_batch([RawRecord("memory.turns", 0, 999, None, corrected.to_bytes(), None)], pool=pool,
                       embedder=embedder, metrics=Metrics.create(), segmenter=SegmenterConfig(max_tokens=1_000_000))


async def test_a_segment_message_older_than_a_correction_is_not_enriched(postgres, pool, embedder, db_url, unique):
    """Defect 7: the message was sent before a turn in it was corrected; its text is stale, so it must not mark
    the segment enriched (the rebuilt segment's own message will)."""
    tenant = unique("tenant")
    segment, turns = seed_segment(tenant, unique("conv"))
    await _store(pool, embedder, segment, turns)
    await _correct(pool, embedder, turns[0], "Actually I moved to Porto, not Lisbon.")
    with ScriptedLLM(scripted_reply) as server:
        outcome = await enrich_segment(segment, _deps(postgres, pool, embedder, server.base_url))
        assert server.requests == []  # spared: the model would have read the old text
    assert outcome.status == "stale" and not outcome.enriched
    assert [s for _, s, _ in _status(db_url, tenant)] == ["pending"]


async def test_a_correction_committed_while_the_model_reads_leaves_the_segment_to_be_enriched_again(
        postgres, pool, embedder, db_url, unique):
    """Defect 7, the race: the correction lands after the check but before the store; the old enrichment is
    dropped, nothing of it is stored, and the segment stays pending for the rebuilt message."""
    tenant = unique("tenant")
    segment, turns = seed_segment(tenant, unique("conv"))
    await _store(pool, embedder, segment, turns)

    def correcting_reply(body: dict) -> tuple[int, str]:
        def correct() -> None:  # on its own loop: the test's loop is awaiting this very reply
            asyncio.run(_correct_with_own_pool(postgres, embedder, turns[0], "Actually I moved to Porto."))

        worker = threading.Thread(target=correct)
        worker.start()
        worker.join()
        return scripted_reply(body)

    with ScriptedLLM(correcting_reply) as server:
        outcome = await enrich_segment(segment, _deps(postgres, pool, embedder, server.base_url))
    assert outcome.status == "stale" and not outcome.enriched
    assert [s for _, s, _ in _status(db_url, tenant)] == ["pending"]
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM memory.gists WHERE tenant = %s", (tenant,)).fetchone()[0] == 0
    corrected = segment.turns[0].model_copy(update={"text": "Actually I moved to Porto."})
    fresh = segment.model_copy(update={"turns": [corrected, *segment.turns[1:]]})
    with ScriptedLLM(scripted_reply) as server:
        assert (await enrich_segment(fresh, _deps(postgres, pool, embedder, server.base_url))).status == "enriched"


async def _correct_with_own_pool(settings, embedder, turn, text: str) -> None:
    from epistream.storage.db import create_pool

    own = create_pool(settings)
    await own.open(wait=True)
    try:
        await _correct(own, embedder, turn, text)
    finally:
        await own.close()
