"""`epistream mcp` on the real stack, driven by the MCP SDK's own client: over stdio (the server a
subprocess, as Claude Desktop or Cursor start it) and over streamable HTTP. remember -> recall sees
it, ask answers with evidence, forget -> gone, bad arguments -> a tool error with the reason, and
with Kafka unreachable every call ends in a tool error instead of hanging."""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.types import CallToolResult
from pydantic import SecretStr

from epistream.apps.mcp import cursor as events_cursor
from epistream.contracts.dead_letters import DeadLetter
from epistream.core.claims import tenant_key
from epistream.testing.scripted_llm import ScriptedLLM

from .conftest import ROOT, read_topic
from .deployments import BASE_PORT, deployments
from .mcp_servers import free_port as _free_port
from .mcp_servers import http_server
from .mcp_servers import server_command as _server_command
from .seed import seed_memory

pytestmark = [pytest.mark.integration]

#: Long enough for a CPU model's answer on a busy machine; a call that passes it fails the test.
CALL_TIMEOUT_S = 360.0


def _params(tenant: str, env: dict[str, str] | None = None) -> StdioServerParameters:
    # The SDK starts a stdio server with a minimal environment: the EPISTREAM_* settings go in `env`,
    # as an MCP client's configuration gives them (docs/mcp.md).
    return StdioServerParameters(command=sys.executable, args=_server_command(tenant)[1:],
                                 env=dict(os.environ) | (env or {}), cwd=str(ROOT))


def _stdio(tenant: str, env: dict[str, str] | None = None, **options: Any) -> Client:
    """The SDK's client of a stdio server for `tenant` (`options`: the Client's, e.g. its protocol mode)."""
    return Client(_params(tenant, env), read_timeout_seconds=CALL_TIMEOUT_S, **options)


@asynccontextmanager
async def _http(tenant: str, env: dict[str, str] | None = None) -> AsyncIterator[Client]:
    async with _http_server(tenant, env) as url, Client(url, read_timeout_seconds=CALL_TIMEOUT_S) as client:
        yield client


def _http_server(tenant: str, env: dict[str, str] | None = None) -> AbstractAsyncContextManager[str]:
    """A streamable-HTTP server for `tenant` (`env`: settings over the test's); as a context, its URL."""
    return http_server(tenant, dict(os.environ) | (env or {}))


async def _call(client: Client, name: str, arguments: dict[str, Any]) -> CallToolResult:
    return await client.call_tool(name, arguments)


async def _ok(client: Client, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await _call(client, name, arguments)
    assert not result.is_error, result.content[0].text
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def _until(check: Callable[[], Awaitable[bool]], *, timeout: float = 60.0, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"not within {timeout:.0f}s: {what}"
        await asyncio.sleep(0.5)


def _mentions(reply: dict[str, Any], conversation: str, phrase: str) -> bool:
    return any(item["conversation_id"] == conversation and phrase in item["text"] for item in reply["items"])


async def _recall(client: Client, phrase: str, conversation: str) -> dict[str, Any]:
    return await _ok(client, "recall", {"question": f"Who keeps {phrase}?", "budget_tokens": 500,
                                        "conversation_ids": [conversation]})


async def _remembered(client: Client, conversation: str, phrase: str, turns: list[dict[str, Any]]) -> dict[str, Any]:
    """`remember` the turns, then `recall` at once: the read waits for them (read-your-own-writes), so it
    must see the one that says `phrase`, and say it is complete. Returns remember's result."""
    done = await _ok(client, "remember", {"conversation_id": conversation, "turns": turns})
    reply = await _recall(client, phrase, conversation)
    assert _mentions(reply, conversation, phrase) and "incomplete" not in reply, reply
    return done


async def test_a_recall_right_after_each_remember_sees_it_100_of_100(stack, unique):
    tenant, conversation = unique("mcp-ryow"), unique("conv")
    async with _stdio(tenant) as client:
        # One conversation: a read before its newest turn is stored finds the older ones only (and a
        # conversation each would leave the shared stack's enrich worker a hundred segments to enrich).
        for _ in range(100):
            phrase = f"parcel {uuid.uuid4().hex[:6]} to Faro"  # words of its own: only this turn says them
            done = await _remembered(client, conversation, phrase, [{"speaker": "Lia", "text": f"I sent {phrase}."}])
            assert [p["offset"] >= 0 for p in done["positions"]] == [True]
        # Forgotten, so the enrich worker skips its segments without calling the model.
        await _ok(client, "forget", {"conversation_id": conversation, "confirm": conversation})


async def test_stdio_remember_recall_ask_forget(stack, unique):
    tenant, conversation = unique("mcp-stdio"), unique("conv")
    phrase = "a tortoise named Quasimodo"
    async with _stdio(tenant) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert names == {"remember", "recall", "ask", "forget", "events"}
        done = await _remembered(client, conversation, phrase, [
            {"speaker": "Ines", "text": f"I keep {phrase} in my garden in Braga.", "time": "2024-05-02T10:00:00+01:00",
             "turn_id": "t1"},
            {"speaker": "Sam", "text": "How old is the tortoise?", "time": "2024-05-02T10:01:00+01:00"}])
        assert done["produced"] == 2 and done["turn_ids"][0] == "t1"
        reply = await _recall(client, phrase, conversation)
        assert reply["used_tokens"] <= reply["budget_tokens"] == 500 and phrase in reply["text"]

        answer = await _ok(client, "ask", {"question": "Where does Ines keep her tortoise?", "mode": "fast",
                                           "conversation_ids": [conversation]})
        assert answer["mode"] == "fast" and isinstance(answer["answer"], str)
        assert all(e["conversation_id"] == conversation for e in answer["evidence"])

        refused = await _call(client, "forget", {"conversation_id": conversation})
        assert refused.is_error and "confirm" in refused.content[0].text
        assert _mentions(await _recall(client, phrase, conversation), conversation, phrase)  # still there

        await _ok(client, "forget", {"conversation_id": conversation, "confirm": conversation})

        async def gone() -> bool:
            return not (await _recall(client, phrase, conversation))["items"]
        await _until(gone, what="the forgotten conversation leaves recall")


async def test_http_remember_then_recall_and_bad_arguments(stack, unique):
    tenant, conversation = unique("mcp-http"), unique("conv")
    phrase = "a cello called Rosalind"
    async with _http(tenant) as client:
        await _remembered(client, conversation, phrase, [{"speaker": "Ana", "text": f"I play {phrase} every evening."}])

        for name, arguments, reason in [
            ("remember", {"conversation_id": conversation, "turns": []}, "at least one turn"),
            ("remember", {"conversation_id": conversation, "turns": [{"speaker": "Ana"}]}, "text"),
            ("recall", {"question": phrase, "budget_tokens": 10}, "50 to 32000"),
            ("recall", {"question": phrase, "since": "2024-02-01", "until": "2024-01-01"}, "starts"),
            ("ask", {"question": phrase, "mode": "telepathic"}, "mode"),
        ]:
            result = await _call(client, name, arguments)
            assert result.is_error and reason in result.content[0].text, (name, result.content[0].text)


async def test_another_tenants_server_recalls_nothing_of_it(stack, unique):
    tenant, conversation = unique("mcp-own"), unique("conv")
    phrase = "a kite shaped like a heron"
    async with _stdio(tenant) as mine:
        await _remembered(mine, conversation, phrase, [{"speaker": "Rui", "text": f"I fly {phrase} on Sundays."}])
    async with _stdio(unique("mcp-other")) as theirs:
        assert not (await _recall(theirs, phrase, conversation))["items"]


async def test_resources_list_a_conversations_timeline_and_current_facts(stack, unique):
    tenant, conversation = unique("mcp-res"), unique("conv")
    await asyncio.to_thread(seed_memory, stack, tenant, conversation)  # gists and facts of a known enrichment
    async with _stdio(tenant) as client:
        templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
        assert templates == {"epistream://conversations/{conversation_id}/timeline",
                             "epistream://conversations/{conversation_id}/facts"}
        timeline = await client.read_resource(f"epistream://conversations/{conversation}/timeline",
                                              cache_mode="bypass")
        text = timeline.contents[0].text  # type: ignore[union-attr]
        assert text.index("Alice adopted a cat named Miso.") < text.index("Alice moved to Lisbon.")  # time order
        facts = (await client.read_resource(f"epistream://conversations/{conversation}/facts",
                                            cache_mode="bypass")).contents[0].text  # type: ignore[union-attr]
        assert "Alice lives in Lisbon" in facts and "Porto" not in facts  # current facts only
    async with _stdio(unique("mcp-res-other")) as stranger:
        other = await stranger.read_resource(f"epistream://conversations/{conversation}/timeline", cache_mode="bypass")
        assert "Lisbon" not in other.contents[0].text  # type: ignore[union-attr]


async def test_an_unreachable_stack_is_a_tool_error_not_a_hang(unique):
    closed = _free_port()  # nothing listens there
    env = {"EPISTREAM_KAFKA_BOOTSTRAP": f"127.0.0.1:{closed}", "EPISTREAM_MCP_TIMEOUT_S": "5",
           "EPISTREAM_MCP_ASK_TIMEOUT_S": "5"}
    async with _stdio(unique("mcp-down"), env) as client:
        for name, arguments in [("remember", {"conversation_id": "c", "turns": [{"speaker": "a", "text": "hi"}]}),
                                ("recall", {"question": "anything?"}),
                                ("ask", {"question": "anything?", "mode": "fast"}),
                                ("forget", {"conversation_id": "c", "confirm": "c"}),
                                ("events", {"wait_s": 0})]:
            result = await client.call_tool(name, arguments, read_timeout_seconds=60)
            assert result.is_error, name
            text = result.content[0].text
            assert f"127.0.0.1:{closed}" in text, text  # says which broker it could not reach
        with pytest.raises(MCPError, match=f"127.0.0.1:{closed}"):
            await client.read_resource("epistream://conversations/c/timeline", cache_mode="bypass")


SECRET = "mcp-claims-secret-" + "x" * 32


def _never_called(body: dict) -> tuple[int, str]:
    return 500, "recall makes no model call"


def test_with_claims_on_it_signs_as_its_tenant_and_hears_on_its_own_topic(kafka, unique):
    """Tenant claims checked (real ingest and answer workers with the operator's secret): a server holding
    A's key, and not the secret, gets A's turns stored, A's recall answered on A's own reply topic and A's
    events from A's own events topic; a server for B holding A's key gets nothing of B's stored."""
    a, b, conversation = unique("mcp-claims-a"), unique("mcp-claims-b"), unique("conv")
    phrase = "a lighthouse painted in stripes"
    key_a = tenant_key(SECRET.encode(), a).hex()
    with ScriptedLLM(_never_called) as llm, deployments(kafka, 1, tenant_key_secret=SecretStr(SECRET),
                                                        llm_base_url=llm.base_url) as made:
        guarded = made[0]
        assert guarded.cli("tenant", "add", a).returncode == 0  # A's reply topic
        backend = {k: v for k, v in guarded.env.items() if k != "EPISTREAM_TENANT_KEY_SECRET"} | {
            "EPISTREAM_MCP_TENANT_KEY": key_a}
        ingest, answer = guarded.run("ingest", BASE_PORT + 11), guarded.run("answer", BASE_PORT + 12)
        try:
            async def drive() -> None:
                async with _stdio(a, backend) as mine:
                    start = await _ok(mine, "events", {"wait_s": 0})
                    await _remembered(mine, conversation, phrase,
                                      [{"speaker": "Lia", "text": f"I live in {phrase} near Aveiro."}])
                    # Its events come from A's own events topic, read with A's key.
                    await _events_until(mine, start["cursor"], lambda found: "turns_stored" in _kinds(found, conversation))
                async with _stdio(b, backend) as spoofing:  # B's server, A's key: B's claim is not proven
                    await _ok(spoofing, "remember", {"conversation_id": conversation,
                                                     "turns": [{"speaker": "Mallory", "text": "B was here."}]})
            asyncio.run(drive())
            letters = asyncio.run(read_topic(guarded.settings, guarded.settings.topic_dlq,
                                             lambda k, v: k == conversation.encode(), timeout=60))
        finally:
            ingest.stop()
            answer.stop()
        assert guarded.turns(a, conversation) == 1 and guarded.turns(b, conversation) == 0
        assert [DeadLetter.model_validate_json(r.value).error_class for r in letters] == ["ClaimRejected"]


async def _events_until(client: Client, after: str, done: Callable[[list[dict[str, Any]]], bool], *,
                        timeout: float = 120.0) -> tuple[list[dict[str, Any]], str]:
    """Poll `events` from cursor `after`, each call from the cursor the last returned, until `done` of
    what came; returns what came and the cursor to read on from."""
    found: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while not done(found):
        assert time.monotonic() < deadline, f"not within {timeout:.0f}s: {[e['kind'] for e in found]}"
        polled = await _ok(client, "events", {"after": after, "wait_s": 5})
        found, after = found + polled["events"], polled["cursor"]
    return found, after


def _kinds(events: list[dict[str, Any]], conversation: str) -> set[str]:
    return {e["kind"] for e in events if e["conversation_id"] == conversation}


def test_events_are_polled_with_a_cursor_through_remember_and_forget(kafka, unique):
    """The `events` tool on a real ingest worker (two partitions): from a first cursor, remember -> its
    turns_stored and, past a 7-hour gap, the first segment's segment_closed; forget -> conversation_forgotten
    on a later poll from the returned cursor, nothing seen twice; read again one event a call from the
    first cursor, the same events in the same order; a bad cursor is a tool error."""
    tenant, conversation = unique("mcp-events"), unique("conv")
    with ScriptedLLM(_never_called) as llm, deployments(kafka, 1, name="mcpev", llm_base_url=llm.base_url) as made:
        deployment = made[0]
        ingest = deployment.run("ingest", BASE_PORT + 13)
        try:
            async def drive() -> None:
                async with _stdio(tenant, deployment.env) as client:
                    start = await _ok(client, "events", {"wait_s": 0})  # from now on: nothing of a new tenant
                    assert start["events"] == [] and start["expired"] is False
                    # Times near now: a segment whose last turn is hours old closes soon after it is stored,
                    # and t2's must stay open (no event of it) for the test to know every event it expects.
                    now = datetime.now(UTC)
                    await _ok(client, "remember", {"conversation_id": conversation, "turns": [
                        {"speaker": "Ada", "text": "I bought a red canoe.",
                         "time": (now - timedelta(hours=7)).isoformat(), "turn_id": "t1"},
                        {"speaker": "Ada", "text": "It leaks.", "time": now.isoformat(), "turn_id": "t2"}]})
                    stored, after = await _events_until(client, start["cursor"], lambda found: {
                        "turns_stored", "segment_closed"} <= _kinds(found, conversation))
                    assert any(e["kind"] == "turns_stored" and e["last_turn_id"] == "t2" for e in stored)
                    closed = [e for e in stored if e["kind"] == "segment_closed"]
                    assert [(e["first_turn_id"], e["last_turn_id"], e["turn_count"]) for e in closed] == [("t1", "t1", 1)]
                    again = await _ok(client, "events", {"after": after, "wait_s": 0})
                    assert again["events"] == [] and again["cursor"] == after  # the cursor passed them all

                    await _ok(client, "forget", {"conversation_id": conversation, "confirm": conversation})
                    forgotten, _ = await _events_until(client, after, lambda found: "conversation_forgotten" in
                                                       _kinds(found, conversation))
                    assert not {e["event_id"] for e in forgotten} & {e["event_id"] for e in stored}

                    one_by_one, cursor = [], start["cursor"]  # the cursor is exact when a batch is cut at its limit
                    while (polled := await _ok(client, "events", {"after": cursor, "wait_s": 0, "limit": 1}))["events"]:
                        assert len(polled["events"]) == 1
                        one_by_one, cursor = one_by_one + polled["events"], polled["cursor"]
                    # One conversation, one partition: the same events in the same order.
                    assert [e["event_id"] for e in one_by_one] == [e["event_id"] for e in stored + forgotten]

                    topic = deployment.settings.topic_events
                    for bad, reason in [("not-a-cursor", "not a cursor"), (cursor[:-6], "damaged"),
                                        (events_cursor.encode({0: 1}, topic=topic, tenant="someone-else"), "another"),
                                        (events_cursor.encode({0: 10**9}, topic=topic, tenant=tenant), "past the end"),
                                        (events_cursor.encode({7: 0}, topic=topic, tenant=tenant), "no partition 7")]:
                        result = await _call(client, "events", {"after": bad, "wait_s": 0})
                        assert result.is_error and reason in result.content[0].text, result.content[0].text
            asyncio.run(drive())
        finally:
            ingest.stop()
