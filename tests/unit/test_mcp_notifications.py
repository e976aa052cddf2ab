"""The MCP server's notification rules, apart from Kafka and the SDK: which resources a memory event changes
and when the resource list does; the resource list's cursor; which log messages a failed call makes (the
server's own words only, never the caller's text) and which levels pass."""

from __future__ import annotations

from datetime import UTC, datetime

import mcp_types as types
import pytest
from mcp.server.subscriptions import InMemorySubscriptionBus
from mcp.shared.exceptions import MCPError

from epistream.apps.mcp.changes import (
    KnownConversations,
    change_of,
    fact_conversation,
    resource_of,
    uri,
)
from epistream.apps.mcp.conversations import page_after, page_cursor
from epistream.apps.mcp.notify import Notifier, at_least, failure
from epistream.contracts.events import MemoryEvent

AT = datetime(2026, 12, 6, tzinfo=UTC)


def _event(kind: str, conversation: str | None = "c-1", **fields: object) -> MemoryEvent:
    return MemoryEvent(event_id="e", kind=kind, tenant="acme", conversation_id=conversation, occurred_at=AT,
                       **fields)


def test_an_enriched_segment_changes_the_timeline_and_the_facts_and_not_the_list():
    change = change_of(_event("segment_enriched", segment_id="c-1#0000"), KnownConversations())
    assert change.updated == {uri("c-1", "timeline"), uri("c-1", "facts")} and not change.listed


def test_a_superseded_fact_changes_the_facts_of_both_conversations():
    change = change_of(_event("fact_superseded", "c-2", fact_id="c-1#0003/f01", superseded_by="c-2#0000/f00"),
                       KnownConversations())
    assert change.updated == {uri("c-1", "facts"), uri("c-2", "facts")} and not change.listed


def test_the_first_turns_of_a_conversation_change_the_list_once():
    known = KnownConversations()
    assert change_of(_event("turns_stored", turn_count=2), known).listed
    assert not change_of(_event("turns_stored", turn_count=1), known).listed  # already listed
    assert change_of(_event("turns_stored", "c-2", turn_count=1), known).listed
    assert not change_of(_event("segment_closed", segment_id="c-1#0000"), known).updated


def test_a_forget_changes_the_conversations_resources_and_the_list_and_it_may_appear_again():
    known = KnownConversations()
    change_of(_event("turns_stored"), known)
    forgotten = change_of(_event("conversation_forgotten", scope="conversation"), known)
    assert forgotten.listed and forgotten.updated == {uri("c-1", "timeline"), uri("c-1", "facts")}
    assert change_of(_event("turns_stored"), known).listed  # remembered again after the forget


def test_a_whole_tenant_forget_changes_every_known_conversation_and_the_list():
    known = KnownConversations()
    for conversation in ("a", "b"):
        change_of(_event("turns_stored", conversation), known)
    everything = change_of(_event("conversation_forgotten", None, scope="tenant"), known)
    assert everything.everything and everything.listed
    assert everything.updated == {uri(c, k) for c in ("a", "b") for k in ("timeline", "facts")}
    assert list(known) == []


def test_known_conversations_are_bounded_the_oldest_dropped_first():
    known = KnownConversations(limit=2)
    assert [known.first_seen(c) for c in ("a", "b", "a", "c")] == [True, True, False, True]
    assert list(known) == ["a", "c"]  # b was the least recently seen


def test_resource_uris_and_fact_ids_are_read_back():
    assert resource_of(uri("team/x#1", "facts")) == ("team/x#1", "facts")
    assert resource_of("epistream://conversations/c-1/summary") is None
    assert resource_of("file:///etc/passwd") is None and resource_of("epistream://conversations//timeline") is None
    assert fact_conversation("chat#7#0012/f03") == "chat#7" and fact_conversation("f-1") is None


def test_the_resource_list_cursor_round_trips_and_refuses_anything_else():
    assert page_after(page_cursor("chat/ü 42")) == "chat/ü 42"
    for bad in ("", "cv1.", "cv1.!!!", "ev1.abc", page_cursor("x")[:-1] + "\xff"):
        with pytest.raises(MCPError, match="not a cursor"):
            page_after(bad)


@pytest.mark.parametrize(("reason", "level", "message"), [
    ("Error executing tool recall: Kafka at 10.0.0.5:9092 failed: KafkaConnectionError: ...", "error",
     "tool recall failed: Kafka at 10.0.0.5:9092 unreachable"),
    ("no memory read within 30 s: is the epistream stack up (Kafka at k:1, the workers)?", "warning",
     "tool recall failed: no memory read within 30 s (is the epistream stack up?)"),
    # A refusal that quotes the caller's text: only that the call failed.
    ("Error executing tool recall: not a valid recall: question: my secret diary says Kafka at x failed", "warning",
     "tool recall failed (the caller got the reason)"),
])
def test_a_failed_call_logs_the_servers_own_reason_only(reason, level, message):
    assert failure("tool recall", reason) == (level, message)


def test_a_level_passes_at_or_above_the_floor():
    assert at_least("error", "warning") and at_least("warning", "warning") and not at_least("info", "warning")


def test_a_listen_streams_resources_count_as_subscribed_while_it_is_open():
    """What a whole-tenant forget tells: the resources open listen streams asked for (two streams may ask for
    the same one: it stays until both close), never a URI of no resource of this server."""
    notifier = Notifier(InMemorySubscriptionBus(), default_level="warning")

    def listen(*uris: str) -> types.SubscriptionsListenRequestParams:
        return types.SubscriptionsListenRequestParams(
            notifications=types.SubscriptionFilter(resource_subscriptions=list(uris)))

    with notifier.listening(listen(uri("a", "timeline"), "file:///etc/passwd")):
        with notifier.listening(listen(uri("a", "timeline"), uri("b", "facts"))):
            assert notifier.subscribed() == {uri("a", "timeline"), uri("b", "facts")}
        assert notifier.subscribed() == {uri("a", "timeline")}
    assert notifier.subscribed() == set()
    with pytest.raises(MCPError, match="at most 1000"), \
            notifier.listening(listen(*(uri(f"c{n}", "facts") for n in range(1001)))):
        pass
