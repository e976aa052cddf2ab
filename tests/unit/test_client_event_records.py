"""Which records of an events topic a reader of one tenant gets: its own events; another tenant's (the
shared topic carries every tenant's) and a record that is no event are passed, never raised, so that no
reader, iterator or `events` cursor, stops at them for good."""

from __future__ import annotations

from datetime import UTC, datetime

from epistream.client.api import _tenant_event
from epistream.contracts.events import new_event


def test_a_reader_gets_its_tenants_events_and_passes_the_rest():
    event = new_event("conversation_forgotten", "acme", "c-1", datetime(2026, 12, 4, tzinfo=UTC),
                      identity=("c-1",), scope="conversation")
    assert _tenant_event(event.to_bytes(), "acme") == event
    assert _tenant_event(event.to_bytes(), "other") is None
    for value in (None, b"", b"not json", b"{}", b'{"kind": "nonesuch", "tenant": "acme"}'):
        assert _tenant_event(value, "acme") is None
