"""`epistream mcp`'s resources beyond reading them, driven by the MCP SDK's own client on real workers:
`resources/list` by page, completion of `conversation_id`, subscriptions (`resources/subscribe` of the
2025 protocols, `subscriptions/listen` of 2026-07-28) told of an enriched segment and of a forget, the
resource list's changes, and log notifications of what the server does at the level the client set."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import mcp_types as types
import pytest
from mcp import Client, MCPError
from mcp.client.subscriptions import Subscription
from mcp.shared.subscriptions import ResourcesListChanged, ResourceUpdated, ServerEvent

from epistream.client import api
from epistream.testing.scripted_llm import ScriptedLLM

from .deployments import BASE_PORT, deployments
from .seed import DIALOGUE, scripted_reply
from .test_mcp import CALL_TIMEOUT_S, _call, _free_port, _http_server, _ok, _stdio, _until

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")]

TIMELINE_TEMPLATE = "epistream://conversations/{conversation_id}/timeline"


def _uri(conversation: str, kind: str) -> str:
    return f"epistream://conversations/{conversation}/{kind}"


class Heard:
    """What a client's message handler received: the server's notifications, in order."""

    def __init__(self) -> None:
        self.notifications: list[types.ServerNotification] = []

    async def __call__(self, message: types.ServerNotification | Exception) -> None:
        if not isinstance(message, Exception):
            self.notifications.append(message)

    def updated(self) -> list[str]:
        return [n.params.uri for n in self.notifications if isinstance(n, types.ResourceUpdatedNotification)]

    def list_changes(self) -> int:
        return sum(isinstance(n, types.ResourceListChangedNotification) for n in self.notifications)

    def logs(self) -> list[tuple[str, Any]]:
        return [(n.params.level, n.params.data) for n in self.notifications
                if isinstance(n, types.LoggingMessageNotification)]


async def _heard(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    async def done() -> bool:
        return check()
    await _until(done, timeout=timeout, what=what)


async def _remember(client: Client, conversation: str, turns: list[tuple[str, str]], **ids: Any) -> None:
    now = datetime.now(UTC)
    await _ok(client, "remember", {"conversation_id": conversation, "turns": [
        {"speaker": speaker, "text": text, "time": (now + timedelta(seconds=n)).isoformat(), "turn_id": f"t{n:03d}"}
        for n, (speaker, text) in enumerate(turns, start=1)]})


async def test_list_complete_subscribe_and_log_on_a_2025_client(stack, unique):
    """A handshake-era client over stdio (what most clients speak): resources/list pages through the
    tenant's conversations behind a cursor; completion offers the ids that start with what was typed;
    a forget tells it that the resources it still subscribes to changed, and the list; log messages
    come at the level it set, saying what the server did and never what the caller wrote."""
    tenant = unique("mcp-live")
    heard = Heard()
    async with _stdio(tenant, {"EPISTREAM_MCP_LIST_PAGE": "2"}, mode="legacy", message_handler=heard) as client:
        assert client.server_capabilities.resources is not None
        assert client.server_capabilities.resources.subscribe and client.server_capabilities.resources.list_changed
        await client.set_logging_level("info")
        for uri in (_uri("proj-a", "timeline"), _uri("proj-a", "facts"), _uri("proj-b", "timeline")):
            await client.subscribe_resource(uri)
        await client.unsubscribe_resource(_uri("proj-b", "timeline"))
        assert ("info", f"subscribed to {_uri('proj-a', 'facts')}") in heard.logs()
        assert ("info", f"unsubscribed from {_uri('proj-b', 'timeline')}") in heard.logs()
        with pytest.raises(MCPError, match="not a resource of this server"):
            await client.subscribe_resource("file:///etc/passwd")

        for conversation in ("proj-a", "proj-b", "other"):
            await _remember(client, conversation, [("Ana", "I keep bees on the roof.")])
        await _heard(lambda: heard.list_changes() >= 3, "a list change for each new conversation")

        first = await client.list_resources(cache_mode="bypass")
        assert [r.uri for r in first.resources] == [_uri(c, k) for c in ("other", "proj-a") for k in ("timeline", "facts")]
        rest = await client.list_resources(cursor=first.next_cursor)
        assert [r.uri for r in rest.resources] == [_uri("proj-b", "timeline"), _uri("proj-b", "facts")]
        assert rest.next_cursor is None and "1 turn(s)" in (rest.resources[0].description or "")
        with pytest.raises(MCPError, match="not a cursor"):
            await client.list_resources(cursor="cv1.bm90LWEtY3Vyc29y!")

        completed = (await client.complete(types.ResourceTemplateReference(uri=TIMELINE_TEMPLATE),
                                           {"name": "conversation_id", "value": "proj-"})).completion
        assert completed.values == ["proj-a", "proj-b"] and completed.total == 2 and completed.has_more is False

        secret = f"my diary {uuid.uuid4().hex}"
        refused = await _call(client, "recall", {"question": secret, "budget_tokens": 10})
        assert refused.is_error
        assert ("warning", "tool recall failed (the caller got the reason)") in heard.logs()
        await client.set_logging_level("error")
        logged = len(heard.logs())
        assert (await _call(client, "recall", {"question": secret, "budget_tokens": 10})).is_error
        assert len(heard.logs()) == logged  # a warning, below the level set
        assert not any(secret in str(data) for _, data in heard.logs())

        for conversation in ("proj-a", "proj-b", "other"):
            await _ok(client, "forget", {"conversation_id": conversation, "confirm": conversation})
        # Each forget: its conversation's resources (the subscribed ones are told), then the list.
        await _heard(lambda: heard.list_changes() >= 6, "a list change for each forget")
        assert sorted(heard.updated()) == [_uri("proj-a", "facts"), _uri("proj-a", "timeline")]


async def _collect(subscription: Subscription, into: list[ServerEvent]) -> None:
    async for event in subscription:
        into.append(event)


def test_an_enriched_segment_is_told_to_its_subscribers_of_both_eras_only(kafka, unique):
    """One HTTP server, real ingest and enrich workers (a scripted model enriches): a 2025 client subscribed
    to a conversation's timeline and facts, and a 2026 client listening to its timeline, are told when its
    segment is enriched and when it is forgotten; a 2025 client that subscribed to nothing and a 2026 client
    that listens to the list only hear of the list's changes, never of the resources. A 2026 client that asks
    for log messages gets a failed call's on its answer."""
    tenant, conversation = unique("mcp-sub"), unique("conv")
    timeline, facts = _uri(conversation, "timeline"), _uri(conversation, "facts")
    with ScriptedLLM(scripted_reply) as llm, deployments(kafka, 1, name="mcpsub", llm_base_url=llm.base_url) as made:
        deployment = made[0]
        workers = [deployment.run("ingest", BASE_PORT + 16), deployment.run("enrich", BASE_PORT + 17)]
        try:
            async def drive() -> None:
                subscriber, bystander, asked = Heard(), Heard(), Heard()
                listened: list[ServerEvent] = []
                listed: list[ServerEvent] = []
                async with (_http_server(tenant, deployment.env) as url,
                            Client(url, mode="legacy", message_handler=subscriber,
                                   read_timeout_seconds=CALL_TIMEOUT_S) as legacy,
                            Client(url, mode="legacy", message_handler=bystander,
                                   read_timeout_seconds=CALL_TIMEOUT_S) as idle,
                            Client(url, read_timeout_seconds=CALL_TIMEOUT_S, log_level="warning",
                                   message_handler=asked) as modern,
                            Client(url, read_timeout_seconds=CALL_TIMEOUT_S) as watcher):
                    assert legacy.protocol_version.startswith("2025") and modern.protocol_version == "2026-07-28"
                    assert (await idle.list_tools()).tools  # the bystander's connection is known to the server
                    # A 2026 client asks for log messages per request (`log_level`): a failed call's rides its answer.
                    assert (await _call(modern, "recall", {"question": "my diary", "budget_tokens": 10})).is_error
                    assert asked.logs() == [("warning", "tool recall failed (the caller got the reason)")]
                    await legacy.subscribe_resource(timeline)
                    await legacy.subscribe_resource(facts)
                    async with (modern.listen(resource_subscriptions=[timeline], resources_list_changed=True) as sub,
                                watcher.listen(resources_list_changed=True) as list_only):
                        tasks = [asyncio.create_task(_collect(sub, listened)),
                                 asyncio.create_task(_collect(list_only, listed))]
                        await _remember(legacy, conversation, DIALOGUE)  # t001..t005: the scripted enrichment's ids
                        await _heard(lambda: timeline in subscriber.updated(), "the enriched segment's notification",
                                     timeout=120)
                        assert set(subscriber.updated()) == {timeline, facts}
                        await _heard(lambda: ResourceUpdated(uri=timeline) in listened, "the listen stream's")
                        await _ok(legacy, "forget", {"conversation_id": conversation, "confirm": conversation})
                        await _heard(lambda: subscriber.list_changes() >= 2 and len(subscriber.updated()) >= 4,
                                     "the forget's notifications")
                        await _heard(lambda: listened.count(ResourcesListChanged()) >= 2, "the forget's, listened")
                        await _heard(lambda: listed.count(ResourcesListChanged()) >= 2, "the list's changes")
                        for task in tasks:
                            task.cancel()
                assert listened.count(ResourceUpdated(uri=timeline)) >= 2 and ResourceUpdated(uri=facts) not in listened
                assert not any(isinstance(e, ResourceUpdated) for e in listed)
                assert bystander.updated() == [] and bystander.list_changes() >= 2
            asyncio.run(drive())
        finally:
            for worker in workers:
                worker.stop()


async def test_with_kafka_unreachable_a_call_logs_it_and_a_subscription_is_refused(unique):
    """No broker: a failed call's log message names the broker it could not reach (an error), and a
    subscription is refused, since no change could be told."""
    closed = _free_port()
    heard = Heard()
    env = {"EPISTREAM_KAFKA_BOOTSTRAP": f"127.0.0.1:{closed}", "EPISTREAM_MCP_TIMEOUT_S": "3"}
    async with _stdio(unique("mcp-down"), env, mode="legacy", message_handler=heard) as client:
        assert (await client.call_tool("recall", {"question": "anything?"}, read_timeout_seconds=60)).is_error
        assert heard.logs() == [("error", f"tool recall failed: Kafka at 127.0.0.1:{closed} unreachable")]
        with pytest.raises(MCPError, match=f"memory events cannot be read .*127.0.0.1:{closed}"):
            await client.subscribe_resource(_uri("c", "timeline"))


async def test_a_whole_tenant_forget_tells_a_listen_stream_of_a_conversation_the_server_never_saw(stack, unique):
    """A 2026 client listening to the timeline of a conversation stored before its server started (so the
    server never saw it stored) is told when an operator forgets the whole tenant: the streams' own
    resources count among those a whole-tenant forget changes, not only the conversations seen since."""
    tenant, conversation = unique("mcp-tenant"), unique("conv")
    timeline = _uri(conversation, "timeline")
    async with _stdio(tenant) as writer:
        await _remember(writer, conversation, [("Ana", "I keep bees on the roof.")])
        assert "bees" in (await _call(writer, "recall", {"question": "Who keeps bees?"})).content[0].text
    listened: list[ServerEvent] = []
    async with _stdio(tenant) as client, client.listen(resource_subscriptions=[timeline]) as subscription:
        task = asyncio.create_task(_collect(subscription, listened))
        try:
            await api.forget(stack, tenant=tenant)
            await _heard(lambda: ResourceUpdated(uri=timeline) in listened, "the whole-tenant forget's notification")
        finally:
            task.cancel()
