"""The memory-event contract: stable ids (the same change, the same id), one flat model per kind, and
where a tenant's events go."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import SecretStr, ValidationError

from epistream.contracts.events import KINDS, MemoryEvent, event_id, new_event
from epistream.contracts.turns import Turn
from epistream.messaging.tenant_topics import events_topic_for, tenant_events_topic
from epistream.pipeline.records import RawRecord
from epistream.pipeline.store.events import superseded
from epistream.settings.processes import ClientSettings

AT = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def test_an_event_id_depends_on_the_change_and_never_on_its_time():
    one = new_event("segment_closed", "t", "c", AT, identity=("c#0001", ["t1", "t2"]), segment_id="c#0001")
    again = new_event("segment_closed", "t", "c", AT + timedelta(hours=1), identity=("c#0001", ["t1", "t2"]),
                      segment_id="c#0001")
    assert one.event_id == again.event_id and len(one.event_id) == 32
    others = {event_id("segment_closed", "t", "c", "c#0001", ["t1"]),  # other turns
              event_id("segment_closed", "u", "c", "c#0001", ["t1", "t2"]),  # another tenant
              event_id("segment_enriched", "t", "c", "c#0001", ["t1", "t2"]),  # another kind
              event_id("segment_closed", "t", "d", "c#0001", ["t1", "t2"])}  # another conversation
    assert one.event_id not in others and len(others) == 4


def test_an_event_round_trips_as_json_without_the_fields_its_kind_does_not_use():
    event = new_event("fact_superseded", "t", "c", AT, identity=("f1", "f2"), fact_id="f1", superseded_by="f2")
    raw = event.to_bytes()
    assert b"gist_ids" not in raw and b"partition" not in raw
    assert MemoryEvent.from_bytes(raw) == event
    assert event.key() == b"c"
    forgotten = new_event("conversation_forgotten", "t", None, AT, identity=(), scope="tenant")
    assert forgotten.key() == b""


def test_an_unknown_kind_or_field_is_refused():
    with pytest.raises(ValidationError):
        MemoryEvent(event_id="x", kind="turns_deleted", tenant="t", occurred_at=AT)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        MemoryEvent.model_validate({"event_id": "x", "kind": "turns_stored", "tenant": "t", "occurred_at": AT,
                                    "text": "no user text travels in an event"})
    assert len(KINDS) == 5


def test_supersession_is_announced_only_where_the_current_fact_changed():
    before = {("iris", "lives_in"): "c#0001/f01", ("iris", "works_at"): "c#0001/f02"}
    after = {("iris", "lives_in"): "c#0002/f01", ("iris", "works_at"): "c#0001/f02", ("joe", "likes"): "c#0002/f02"}
    [event] = superseded("t", "c", AT, before, after)
    assert (event.kind, event.fact_id, event.superseded_by) == ("fact_superseded", "c#0001/f01", "c#0002/f01")


def test_turns_stored_is_one_event_per_conversation_through_its_last_turn_and_none_for_a_replay():
    import asyncio

    from epistream.pipeline.store import events

    class Clock:
        """Answers the one statement turns_stored runs (the transaction's time)."""

        async def execute(self, statement, params=None):
            assert statement == events.NOW
            return self

        async def fetchone(self):
            return (AT,)

    def written(conversation: str, offsets: list[int], outcome: str) -> list[tuple[Turn, RawRecord, str]]:
        return [(Turn(tenant="t", conversation_id=conversation, turn_id=f"t{o}", speaker="s", text="x", ts=AT),
                 RawRecord("memory.turns", 3, o, conversation.encode(), b""), outcome) for o in offsets]

    chunk = written("a", [10, 12], "inserted") + written("b", [11], "updated") + written("c", [13], "unchanged")
    stored = asyncio.run(events.turns_stored(Clock(), "t", chunk))  # type: ignore[arg-type]
    assert [(e.conversation_id, e.partition, e.offset, e.first_turn_id, e.last_turn_id, e.turn_count)
            for e in stored] == [("a", 3, 12, "t10", "t12", 2), ("b", 3, 11, "t11", "t11", 1)]
    again = asyncio.run(events.turns_stored(Clock(), "t", written("a", [10, 12], "inserted")))  # type: ignore[arg-type]
    assert again[0].event_id == stored[0].event_id
    assert asyncio.run(events.turns_stored(Clock(), "t", written("a", [10, 12], "unchanged"))) == []  # type: ignore[arg-type]


def test_with_claims_checked_each_tenant_has_its_own_events_topic():
    assert tenant_events_topic("memory.events", "acme-eu_1") == "memory.events.acme-eu_1"
    assert not tenant_events_topic("memory.events", "acme.eu").startswith("memory.events.acme.")
    open_settings = ClientSettings()
    assert events_topic_for(open_settings, "acme") == "memory.events"
    checked = ClientSettings(tenant_key_secret=SecretStr("s" * 40))
    assert events_topic_for(checked, "acme") == "memory.events.acme"
