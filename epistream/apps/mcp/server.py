"""The MCP server: five tools over one EpistreamClient kept for the server's lifetime (its lifespan), for
one tenant, each call bounded by a timeout; the conversations' timeline and facts as resources (listed,
completed, subscribed to: conversations.py, notify.py, watch.py).

Every call ends in a result or a tool error (``is_error``) whose text says why: arguments the schema
or the contracts refuse, Kafka unreachable, no reply within the timeout, the answer worker's own
error. Nothing a caller sends can crash the server or leave a call waiting past its timeout."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar

import anyio
import mcp_types as types
from aiokafka.errors import KafkaError
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.server.subscriptions import InMemorySubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from epistream.apps.mcp import cursor, memory, progress
from epistream.apps.mcp.arguments import (
    ArgumentError,
    TurnArgument,
    ask_question,
    confirmed_forget,
    recall_question,
    turns_for,
)
from epistream.apps.mcp.auth import BearerAuth
from epistream.apps.mcp.changes import RESOURCES
from epistream.apps.mcp.conversations import ConversationResources
from epistream.apps.mcp.live import serve_live
from epistream.apps.mcp.notify import Notifier
from epistream.apps.mcp.watch import EventWatch
from epistream.client.session import EpistreamClient
from epistream.contracts.events import MemoryEvent
from epistream.contracts.questions import (
    CONTEXT_BUDGET_DEFAULT,
    CONTEXT_BUDGET_MAX,
    CONTEXT_BUDGET_MIN,
    ConversationPage,
    Question,
)
from epistream.contracts.replies import Answer, MemoryContext
from epistream.errors import ContractError
from epistream.settings.processes import McpServerSettings

log = logging.getLogger(__name__)
T = TypeVar("T")

INSTRUCTIONS = """Long-term memory of conversations (epistream). `remember` stores turns as they are said;
`recall` returns the memory most relevant to a question within a token budget, as a text block to put
in your prompt (no model call, a second or so); `ask` has epistream answer from memory with evidence;
`forget` deletes a conversation for good (repeat its id as `confirm`). A recall right after a remember
sees what was remembered. `events` says what changed in memory since its `cursor` (turns stored, segments
closed and enriched, facts superseded, conversations forgotten): poll it, passing the cursor back.
Resources: epistream://conversations/<id>/timeline (its events in time order) and
epistream://conversations/<id>/facts (its current facts), listed per conversation, with the id completed;
subscribe to one to be told when it changes (a segment enriched, a fact superseded, the conversation
forgotten), and to the list to be told when a conversation appears or is forgotten."""

ConversationIds = Annotated[list[str] | None, Field(
    description="Only these conversations (default: every conversation of the tenant).")]


def _checked(build: Callable[[], T]) -> T:
    """What `build` makes of a tool's arguments, or the ToolError that says why it cannot."""
    try:
        return build()
    except ArgumentError as exc:
        raise ToolError(str(exc)) from None


def _incomplete(reason: str | None) -> str:
    """The warning a reply carries when it could not wait for what this server wrote (never silently stale)."""
    return "" if reason is None else f"\n(incomplete: {reason})"


#: The longest an `events` call waits for an event, and the most events it returns.
EVENTS_MAX_WAIT_S = 60.0
EVENTS_MAX_LIMIT = 1000


def _event_line(event: MemoryEvent) -> str:
    """One event as a line for the model: its time, kind, conversation and what changed (ids and counts)."""
    what = {
        "turns_stored": lambda: f"{event.turn_count} turn(s) {event.first_turn_id}..{event.last_turn_id} searchable",
        "segment_closed": lambda: f"segment {event.segment_id} closed ({event.turn_count} turns), to be enriched",
        "segment_enriched": lambda: f"segment {event.segment_id}: {event.gist_count} gist(s), {event.fact_count} "
                                    "fact(s) stored",
        "fact_superseded": lambda: f"fact {event.fact_id} superseded by {event.superseded_by}",
        "conversation_forgotten": lambda: "forgotten" if event.scope != "tenant" else "every conversation forgotten",
    }[event.kind]()
    return f"{event.occurred_at.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ} {event.kind} {event.conversation_id or '(tenant)'}: {what}"


def _text(text: str, structured: dict) -> CallToolResult:
    return CallToolResult(content=[TextContent(text=text)], structured_content=structured)


class Tools:
    """The tools, bound to the server's settings, its tenant, its client and what it has written."""

    def __init__(self, settings: McpServerSettings, tenant: str) -> None:
        self.settings = settings
        self.tenant = tenant
        self.key = settings.mcp_key
        self.written = memory.Written()
        self._client: EpistreamClient | None = None

    @asynccontextmanager
    async def lifespan(self, _server: object) -> AsyncIterator[dict]:
        """The server's lifespan: one client (one producer, one reply consumer) for every call while it runs."""
        async with EpistreamClient(self.settings) as client:
            self._client = client
            try:
                yield {}
            finally:
                self._client = None

    @property
    def client(self) -> EpistreamClient:
        if self._client is None:  # only outside the lifespan, where the SDK calls no tool
            raise ToolError("the server is not running")
        return self._client

    async def _bounded(self, what: str, call: Awaitable[T], timeout_s: float,
                       error: type[Exception] = ToolError) -> T:
        """`call`'s result, or an `error` (a tool's, or a resource's) saying why there is none within `timeout_s`."""
        bootstrap = self.settings.kafka_bootstrap
        try:
            # In the tool's own task (not wait_for's task of its own): a call its client cancels unwinds
            # through the client's wait, which is gone before the cancellation reaches the tool.
            async with asyncio.timeout(timeout_s):
                return await call
        except TimeoutError:
            raise error(f"no {what} within {timeout_s:g} s: is the epistream stack up (Kafka at {bootstrap}, "
                        "the workers)?") from None
        except KafkaError as exc:
            raise error(f"Kafka at {bootstrap} failed: {exc}") from None
        except ContractError as exc:
            raise error(str(exc)) from None

    async def _read(self, what: str, read: Callable[..., Awaitable[T]], request: Question, timeout_s: float,
                    **extra: object) -> T:
        """A question's reply, once the ingest side stored what this server wrote to its conversations."""
        after = self.written.after(request.conversation_ids)
        return await self._bounded(what, read(self.client, request, after=after, timeout_s=timeout_s,
                                              tenant_key=self.key, **extra), timeout_s)

    async def remember(
        self,
        conversation_id: Annotated[str, Field(description="The conversation the turns belong to.")],
        turns: Annotated[list[TurnArgument], Field(description="One or more turns, in the order they were said.")],
    ) -> CallToolResult:
        """Store turns of a conversation in long-term memory (memory.turns). They are searchable within
        about a second; gists and facts follow when the conversation's segment closes."""
        records = _checked(lambda: turns_for(self.tenant, conversation_id, turns, now=datetime.now(UTC)))
        positions = await self._bounded("acknowledgement from Kafka", memory.produce(
            self.client, records, tenant_key=self.key), self.settings.mcp_timeout_s)
        self.written.note(positions)
        conversation = records[0].conversation_id
        return _text(f"remembered {len(records)} turn(s) of conversation {conversation!r}", {
            "conversation_id": conversation, "turn_ids": [r.turn_id for r in records], "produced": len(records),
            "positions": [{"partition": p.partition, "offset": p.offset} for p in positions.values()]})

    async def recall(
        self,
        question: Annotated[str, Field(description="What the memory is for: a question or the topic at hand.")],
        budget_tokens: Annotated[int, Field(description=f"Most tokens of memory to return ({CONTEXT_BUDGET_MIN} to "
                                                        f"{CONTEXT_BUDGET_MAX}).")] = CONTEXT_BUDGET_DEFAULT,
        since: Annotated[datetime | None, Field(
            description="Only memory from this time on (ISO-8601; without an offset: UTC).")] = None,
        until: Annotated[datetime | None, Field(description="Only memory before this time.")] = None,
        conversation_ids: ConversationIds = None,
    ) -> CallToolResult:
        """The memory most relevant to a question within a token budget (no model call): a prompt-ready
        text block (turns verbatim with their dates, gists, current facts) and its items."""
        request = _checked(lambda: recall_question(
            self.tenant, question, budget_tokens=budget_tokens, since=since, until=until,
            conversation_ids=conversation_ids, now=datetime.now(UTC)))
        reply: MemoryContext = await self._read("memory read", memory.read_context, request,
                                                self.settings.mcp_timeout_s)
        if reply.error:
            raise ToolError(f"the answer worker could not read memory: {reply.error}")
        text = (reply.text or "(no memory matches)") + _incomplete(reply.incomplete)
        return _text(text, reply.model_dump(mode="json", exclude_none=True))

    async def ask(
        self,
        question: Annotated[str, Field(description="The question to answer from memory.")],
        mode: Annotated[Literal["fast", "deep", "agentic", "auto"], Field(
            description="fast: one model call over the best memory; deep: assistants read the best passages; "
                        "agentic: a tool loop over gists and facts; auto: the router picks.")] = "auto",
        conversation_ids: ConversationIds = None,
        ctx: Context | None = None,
    ) -> CallToolResult:
        """Answer a question from memory, with the evidence (quotes, conversations, turn ids, times). With a
        progress token, each step of answering is reported as it is taken."""
        request = _checked(lambda: ask_question(self.tenant, question, mode=mode, conversation_ids=conversation_ids,
                                                now=datetime.now(UTC)))
        started = time.monotonic()
        try:
            answer: Answer = await self._read("answer", memory.answer, request, self.settings.mcp_ask_timeout_s,
                                              on_progress=progress.forwarder(ctx))
        except asyncio.CancelledError:  # the client cancelled the call (progress.py): stop waiting, say so
            log.info("ask %s cancelled by its client after %.1f s: stopped waiting for the answer (%d call(s) "
                     "still waiting, %d listening to progress)", request.question_id, time.monotonic() - started,
                     self.client.waiting, self.client.listening)
            raise
        if answer.error:
            raise ToolError(f"the answer failed: {answer.error}")
        lines = [answer.answer + (" (abstained: no evidence in memory)" if answer.abstained else "")]
        lines += [f"- {e.time:%Y-%m-%d} {e.conversation_id}: {e.quote}" for e in answer.evidence]
        return _text("\n".join(lines) + _incomplete(answer.incomplete), answer.model_dump(mode="json", exclude_none=True))

    async def forget(
        self,
        conversation_id: Annotated[str, Field(description="The conversation to delete, with all derived from it.")],
        confirm: Annotated[str | None, Field(
            description="The same conversation id again: forgetting is final.")] = None,
    ) -> CallToolResult:
        """Forget a conversation for good: its turns, segments, gists and facts, here and in every rebuild."""
        conversation = _checked(lambda: confirmed_forget(conversation_id, confirm))
        await self._bounded("acknowledgement from Kafka", memory.forget(
            self.client, tenant=self.tenant, conversation_id=conversation), self.settings.mcp_timeout_s)
        return _text(f"forgot conversation {conversation!r}: the ingest workers delete it as they read the erasure "
                     "(within seconds)", {"conversation_id": conversation, "tenant": self.tenant})

    async def events(
        self,
        after: Annotated[str | None, Field(
            description="The `cursor` an earlier events call returned. None: from this call on.")] = None,
        wait_s: Annotated[float, Field(ge=0, le=EVENTS_MAX_WAIT_S, description=(
            "Seconds to wait for an event when none is there yet (0 to 60)."))] = 2.0,
        limit: Annotated[int, Field(ge=1, le=EVENTS_MAX_LIMIT, description="Most events to return (1 to 1000).")] = 100,
    ) -> CallToolResult:
        """What changed in memory after `after`: turns stored (searchable), segments closed and enriched (their
        gists and facts), facts superseded, conversations forgotten; and the `cursor` to pass next time."""
        topic = memory.events_topic(self.settings, self.tenant, self.key)
        try:
            offsets = None if after is None else cursor.decode(after, topic=topic, tenant=self.tenant)
            batch = await self._bounded("events read", memory.read_events(
                self.settings, tenant=self.tenant, after=offsets, wait_s=wait_s, limit=limit, tenant_key=self.key),
                wait_s + self.settings.mcp_timeout_s)
        except (cursor.CursorError, memory.EventCursorError) as exc:
            raise ToolError(f"bad cursor: {exc}") from None
        following = cursor.encode(batch.next_offsets, topic=topic, tenant=self.tenant)
        lines = [_event_line(e) for e in batch.events] or [f"(no new events within {wait_s:g} s)"]
        if batch.expired:
            lines.insert(0, "(some events after the cursor were older than the topic keeps: they are gone)")
        lines.append(f"next: call events with after={following}")
        return _text("\n".join(lines), {"events": [e.model_dump(mode="json", exclude_none=True) for e in batch.events],
                                        "cursor": following, "expired": batch.expired})

    async def _listing(self, conversation_id: str, listing: Literal["timeline", "facts"]) -> str:
        timeout = self.settings.mcp_timeout_s
        reply: MemoryContext = await self._bounded("memory read", memory.read_listing(
            self.client, tenant=self.tenant, conversation_id=conversation_id, listing=listing, timeout_s=timeout,
            tenant_key=self.key), timeout, error=ResourceError)
        if reply.error:
            raise ResourceError(f"the answer worker could not read memory: {reply.error}")
        if not reply.items:
            return (f"(no {'gists' if listing == 'timeline' else 'facts'} yet: they follow when a segment of the "
                    "conversation closes and is enriched)")
        # In the listing's order (when things happened), not the text block's (when they were said).
        return "\n".join(item.line for item in reply.items)

    async def conversation_page(self, page: ConversationPage) -> MemoryContext:
        """A page of the tenant's conversations (resources/list, completion/complete), or an MCPError saying why not."""
        timeout = self.settings.mcp_timeout_s
        try:
            reply: MemoryContext = await self._bounded("conversations listing", memory.read_conversations(
                self.client, tenant=self.tenant, page=page, timeout_s=timeout, tenant_key=self.key), timeout,
                error=ResourceError)
        except (ResourceError, ToolError) as exc:
            raise MCPError(types.INTERNAL_ERROR, str(exc)) from None
        if reply.error:
            raise MCPError(types.INTERNAL_ERROR, f"the answer worker could not list conversations: {reply.error}")
        return reply

    async def timeline(self, conversation_id: str) -> str:
        """The conversation's gists (one-sentence events, each starting with its date) in time order."""
        return await self._listing(conversation_id, "timeline")

    async def facts(self, conversation_id: str) -> str:
        """The conversation's current facts (subject, predicate, object, when it held)."""
        return await self._listing(conversation_id, "facts")


def build_server(settings: McpServerSettings, tenant: str) -> MCPServer:
    """The MCP server for `tenant` (arguments.served_tenant checked its name)."""
    tools = Tools(settings, tenant)
    bus = InMemorySubscriptionBus()
    notifier = Notifier(bus, default_level=settings.mcp_log_level)
    watch = EventWatch(settings, tenant, notifier)

    @asynccontextmanager
    async def lifespan(server: object) -> AsyncIterator[dict]:
        async with tools.lifespan(server) as state, watch.running():
            yield state

    server: MCPServer = MCPServer("epistream", instructions=INSTRUCTIONS, log_level="WARNING", lifespan=lifespan,
                                  subscriptions=bus, middleware=[notifier])
    server.add_tool(tools.remember, annotations=ToolAnnotations(destructive_hint=False))
    server.add_tool(tools.recall, annotations=ToolAnnotations(read_only_hint=True))
    server.add_tool(tools.ask, annotations=ToolAnnotations(read_only_hint=True))
    server.add_tool(tools.forget, annotations=ToolAnnotations(destructive_hint=True))
    server.add_tool(tools.events, annotations=ToolAnnotations(read_only_hint=True))
    templates = (f"{RESOURCES}/{{conversation_id}}/timeline", f"{RESOURCES}/{{conversation_id}}/facts")
    server.resource(templates[0], name="timeline", mime_type="text/plain",
                    description="A conversation's gists in time order")(tools.timeline)
    server.resource(templates[1], name="facts", mime_type="text/plain",
                    description="A conversation's current facts")(tools.facts)
    serve_live(server, ConversationResources(tools.conversation_page, frozenset(templates),
                                             page_size=settings.mcp_list_page), notifier, watch)
    return server


def serve(settings: McpServerSettings, *, tenant: str, transport: Literal["stdio", "http"], host: str,
          port: int) -> None:
    """Run until the client (stdio) or the process (HTTP) ends."""
    server = build_server(settings, tenant)
    if transport == "stdio":
        server.run("stdio")
    else:
        anyio.run(_serve_http, server, settings, host, port)


async def _serve_http(server: MCPServer, settings: McpServerSettings, host: str, port: int) -> None:
    """The SDK's streamable-HTTP app (its DNS-rebinding guard on loopback) under uvicorn, as the SDK's
    `run` does, but behind the bearer-token check when EPISTREAM_MCP_TOKEN is set (auth.py)."""
    import uvicorn

    app: Any = server.streamable_http_app(host=host)
    if settings.mcp_token is not None:
        app = BearerAuth(app, settings.mcp_token.get_secret_value())
    log.info("epistream MCP server on http://%s:%d/mcp (%s)", host, port,
             "bearer token required" if settings.mcp_token is not None else "no login")
    await uvicorn.Server(uvicorn.Config(app, host=host, port=port,
                                        log_level=server.settings.log_level.lower())).serve()
