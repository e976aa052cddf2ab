"""The fast path on the real stack: Kafka -> Faust ingest agent -> PostgreSQL."""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import replace

import psycopg
import pytest

from epistream.consumers.retrieval import FUSED_TURNS, search_turns
from epistream.contracts.dead_letters import DeadLetter
from epistream.models.embeddings import Embedder

from .conftest import count_turns, read_topic, wait_for
from .helpers import make_turns, produce_bytes, produce_turns

pytestmark = pytest.mark.integration

DIALOGUE = [
    ("Maya", "I finally booked the ferry to Stromboli for the volcano hike in June."),
    ("Leo", "Nice! Are you bringing the new hiking boots you bought?"),
    ("Maya", "Yes, and my sister is lending me her headlamp for the night climb."),
    ("Leo", "My grandmother turned ninety last weekend, we had a huge family lunch."),
]


def test_turn_is_stored_and_found_lexically_and_densely(stack, db_url, unique):
    tenant, conversation = unique("tenant"), unique("conv")
    turns = make_turns(tenant, conversation, DIALOGUE)
    produce_turns(stack, turns)
    wait_for(lambda: count_turns(db_url, tenant, conversation) == len(turns), what="turns stored")

    embedder = Embedder.from_settings(stack)

    async def search(query: str, *pathways: str):
        from epistream.storage.db import create_pool, tenant_scope

        pool = create_pool(stack)
        await pool.open(wait=True)
        try:
            async with pool.connection() as conn, tenant_scope(conn, tenant):
                return await search_turns(
                    conn, tenant=tenant, query=query, vector=embedder.embed_query(query),
                    conversation_ids=[conversation], recipe=replace(FUSED_TURNS, top_k=3, pathways=pathways),
                )
        finally:
            await pool.close()

    lexical = asyncio.run(search("Stromboli ferry", "lexical"))
    assert lexical and lexical[0].turn_id == "t001"
    assert lexical[0].lexical_rank == 1 and lexical[0].dense_rank is None

    # No shared keyword with the stored text: only the dense pathway can find it.
    dense = asyncio.run(search("a relative celebrated a birthday with the whole family", "dense"))
    assert dense and dense[0].turn_id == "t004"
    assert dense[0].dense_rank == 1 and dense[0].lexical_rank is None

    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT speaker, text, ts, session_id, kafka_offset IS NOT NULL, vector_dims(embedding) "
            "FROM memory.turns WHERE tenant = %s AND conversation_id = %s AND turn_id = 't001'",
            (tenant, conversation),
        ).fetchone()
    assert row == ("Maya", DIALOGUE[0][1], turns[0].ts, "session_1", True, 384)


def test_malformed_turns_go_to_dlq_with_reason_and_the_stream_goes_on(stack, db_url, unique):
    tenant, conversation = unique("tenant"), unique("conv")
    not_json = b"{this is not json " + unique("marker").encode()
    missing_text = json.dumps({
        "tenant": tenant, "conversation_id": conversation, "turn_id": "bad-1",
        "speaker": "Maya", "ts": "2024-05-06T09:00:00+02:00",
    }).encode()
    naive_time = json.dumps({
        "tenant": tenant, "conversation_id": conversation, "turn_id": "bad-2",
        "speaker": "Maya", "text": "no offset on this time", "ts": "2024-05-06T09:00:00",
    }).encode()
    good = make_turns(tenant, conversation, DIALOGUE[:1])
    produce_bytes(stack, [
        (conversation.encode(), not_json), (conversation.encode(), missing_text), (conversation.encode(), naive_time),
        (conversation.encode(), good[0].to_bytes()),
    ])
    # The valid turn behind the poison ones is stored: the stream did not stop.
    wait_for(lambda: count_turns(db_url, tenant, conversation) == 1, what="valid turn stored")

    bad_values = {not_json, missing_text, naive_time}

    def ours(key, value):
        letter = DeadLetter.model_validate_json(value)
        return letter.original_value() in bad_values

    letters = [DeadLetter.model_validate_json(r.value) for r in asyncio.run(read_topic(stack, stack.topic_dlq, ours, want=3))]
    assert len(letters) == 3
    by_value = {letter.original_value(): letter for letter in letters}
    assert by_value[not_json].error_class == "ContractError" and "JSON" in by_value[not_json].error_message
    assert "text" in by_value[missing_text].error_message and "Field required" in by_value[missing_text].error_message
    assert "timezone" in by_value[naive_time].error_message
    for letter in letters:
        assert letter.topic == stack.topic_turns and letter.stage == "ingest" and letter.offset >= 0
        assert base64.b64decode(letter.key_b64 or "") == conversation.encode()


def test_producing_the_same_turns_twice_creates_no_duplicates(stack, db_url, unique):
    tenant, conversation = unique("tenant"), unique("conv")
    turns = make_turns(tenant, conversation, DIALOGUE)
    produce_turns(stack, turns)
    wait_for(lambda: count_turns(db_url, tenant, conversation) == len(turns), what="first copy stored")
    with psycopg.connect(db_url) as conn:
        first = conn.execute(
            "SELECT max(kafka_offset), max(stored_at) FROM memory.turns WHERE tenant = %s AND conversation_id = %s",
            (tenant, conversation),
        ).fetchone()

    # The same turns again, then a sentinel: once the sentinel is stored, the replay has been processed.
    sentinel = make_turns(tenant, conversation, [("Leo", "sentinel turn after the replay")])[0]
    sentinel = sentinel.model_copy(update={"turn_id": "sentinel"})
    produce_turns(stack, [*turns, sentinel])
    wait_for(lambda: count_turns(db_url, tenant, conversation) == len(turns) + 1, what="sentinel stored")
    with psycopg.connect(db_url) as conn:
        again = conn.execute(
            "SELECT max(kafka_offset), max(stored_at) FROM memory.turns "
            "WHERE tenant = %s AND conversation_id = %s AND turn_id <> 'sentinel'",
            (tenant, conversation),
        ).fetchone()
    # Unchanged rows are not rewritten: same provenance, same stored_at.
    assert again == first
