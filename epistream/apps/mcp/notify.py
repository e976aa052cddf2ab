"""What `epistream mcp` tells its clients unasked: a resource updated, the resource list changed, and log
messages about what the server itself does, on both protocol eras the SDK serves.

2026-07-28 clients open `subscriptions/listen` streams: the SDK's ListenHandler serves them from the
server's SubscriptionBus and filters each stream to what it asked for, so this module publishes each
change on the bus once. Handshake-era clients (2025-06-18, 2025-11-25) subscribe per resource
(`resources/subscribe`) and set a log level (`logging/setLevel`) on their connection, and get
`notifications/resources/updated`, `.../list_changed` and `notifications/message` on the connection's
own channel: this module keeps, per such connection, what it subscribed to and its level, and drops
both when the connection closes. A 2026 client's log messages ride its own request (the SDK's
per-request opt-in); a message about no request (the events reader failing) reaches handshake-era
clients only.

Log messages say what the server did (a call failed and why in the server's own words, Kafka
unreachable, a subscription added): never the text of a turn or a question, nor an error text that
could quote one."""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from mcp.server.connection import Connection, allowed_log_levels
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.subscriptions import ResourcesListChanged, ResourceUpdated, SubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from epistream.apps.mcp.changes import resource_of

log = logging.getLogger(__name__)

LEVELS: tuple[types.LoggingLevel, ...] = ("debug", "info", "notice", "warning", "error", "critical", "alert",
                                          "emergency")
#: The logger name the server's log messages carry.
LOGGER = "epistream"
#: The most resources one connection, or one listen stream, may subscribe to (a client cannot grow the
#: server's memory without end).
MAX_SUBSCRIPTIONS = 1_000

# The reasons server.py gives (a tool's result prefixed by the SDK with "Error executing tool NAME: ").
_PREFIX = r"^(?:Error executing tool \S+: )?"
_KAFKA_FAILED = re.compile(_PREFIX + r"Kafka at (\S+) failed")
_NO_REPLY = re.compile(_PREFIX + r"no ([a-z ]+?) within ([0-9.]+) s")


def at_least(level: types.LoggingLevel, floor: types.LoggingLevel) -> bool:
    return LEVELS.index(level) >= LEVELS.index(floor)


def failure(what: str, reason: str) -> tuple[types.LoggingLevel, str]:
    """A failed call's log message, from the server's own reasons only: Kafka unreachable (an error), no
    reply in time (a warning), or just that it failed (a warning), never the reason's text otherwise
    (a contract's refusal or the answer worker's error can quote what the caller sent)."""
    if (kafka := _KAFKA_FAILED.match(reason)) is not None:
        return "error", f"{what} failed: Kafka at {kafka[1]} unreachable"
    if (late := _NO_REPLY.match(reason)) is not None:
        return "warning", f"{what} failed: no {late[1]} within {late[2]} s (is the epistream stack up?)"
    return "warning", f"{what} failed (the caller got the reason)"


def _connection(ctx: ServerRequestContext[Any, Any]) -> Connection:
    # The SDK (2.3.0) hands a handler the per-request ServerSession only; the connection behind it is the
    # one thing that outlives the request: its identity ties a subscribe to an unsubscribe, its channel
    # carries notifications later, and its exit stack runs when the client goes.
    connection = getattr(ctx.session, "_connection", None)
    if not isinstance(connection, Connection):
        raise MCPError(types.INTERNAL_ERROR, "this MCP SDK keeps no connection on its session")
    return connection


@dataclass
class _Peer:
    """A handshake-era connection: what it subscribed to and the least severe log message it wants."""

    connection: Connection
    level: types.LoggingLevel
    subscribed: set[str] = field(default_factory=set)


class Notifier:
    """The server's notifications: publishes changes on the bus (2026 listen streams) and sends them to the
    handshake-era connections that asked; logs to the clients that asked, at or above their level."""

    def __init__(self, bus: SubscriptionBus, *, default_level: types.LoggingLevel) -> None:
        self.bus = bus
        self.default_level = default_level
        self._peers: dict[int, _Peer] = {}
        self._listened: Counter[str] = Counter()  # the resources open listen streams asked for, and how many

    def _peer(self, ctx: ServerRequestContext[Any, Any]) -> _Peer | None:
        """The request's handshake-era connection, noted on its first request (None: a 2026 request)."""
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return None
        connection = _connection(ctx)
        key = id(connection)
        if key not in self._peers:
            self._peers[key] = _Peer(connection, self.default_level)
            connection.exit_stack.callback(self._peers.pop, key, None)
        return self._peers[key]

    # -- requests --

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """Middleware: note a handshake-era connection, and log a failed tool call or resource read to its client."""
        if ctx.request_id is not None:
            self._peer(ctx)
        what = _called(ctx)
        try:
            result = await call_next(ctx)
        except MCPError as exc:
            if what is not None:
                await self.tell(ctx, *failure(what, exc.error.message))
            raise
        if what is not None and isinstance(result, dict) and result.get("isError"):
            content = result.get("content") or [{}]
            await self.tell(ctx, *failure(what, str(content[0].get("text", ""))))
        return result

    async def subscribe(self, ctx: ServerRequestContext[Any, Any], params: types.SubscribeRequestParams,
                        ) -> types.EmptyResult:
        """`resources/subscribe` (handshake era): updates of this resource go to this connection."""
        peer = self._peer(ctx)
        uri = str(params.uri)
        if peer is None or resource_of(uri) is None:
            raise MCPError(types.INVALID_PARAMS, f"not a resource of this server: {uri[:200]!r} (subscribe to "
                           "epistream://conversations/<id>/timeline or .../facts)")
        if uri not in peer.subscribed and len(peer.subscribed) >= MAX_SUBSCRIPTIONS:
            raise MCPError(types.INVALID_PARAMS, f"at most {MAX_SUBSCRIPTIONS} subscriptions a connection")
        peer.subscribed.add(uri)
        await self.tell(ctx, "info", f"subscribed to {uri}")
        return types.EmptyResult()

    async def unsubscribe(self, ctx: ServerRequestContext[Any, Any], params: types.UnsubscribeRequestParams,
                          ) -> types.EmptyResult:
        """`resources/unsubscribe` (handshake era): no more updates of this resource to this connection."""
        peer = self._peer(ctx)
        uri = str(params.uri)
        if peer is not None and uri in peer.subscribed:
            peer.subscribed.discard(uri)
            await self.tell(ctx, "info", f"unsubscribed from {uri}")
        return types.EmptyResult()

    async def set_level(self, ctx: ServerRequestContext[Any, Any], params: types.SetLevelRequestParams,
                        ) -> types.EmptyResult:
        """`logging/setLevel` (handshake era; a 2026 client sets its level on each request)."""
        peer = self._peer(ctx)
        if peer is not None:
            peer.level = params.level
        return types.EmptyResult()

    async def tell(self, ctx: ServerRequestContext[Any, Any], level: types.LoggingLevel, message: str) -> None:
        """A log message about this request, to its client if it asked for that level (on its request's stream)."""
        peer = self._peer(ctx)
        wanted = (at_least(level, peer.level) if peer is not None
                  else level in allowed_log_levels(ctx.protocol_version, ctx.meta))
        if wanted:
            await ctx.session.send_notification(types.LoggingMessageNotification(
                params=types.LoggingMessageNotificationParams(level=level, data=message, logger=LOGGER)),
                related_request_id=ctx.request_id)

    # -- changes and server-wide messages --

    async def updated(self, uris: Iterable[str]) -> None:
        """Each resource changed: to the listen streams that asked for it, and the connections subscribed to it."""
        for uri in sorted(set(uris)):
            await self.bus.publish(ResourceUpdated(uri=uri))
            for peer in list(self._peers.values()):
                if uri in peer.subscribed:
                    await peer.connection.send_resource_updated(uri)

    async def list_changed(self) -> None:
        """The resource list changed: to the listen streams that asked, and every handshake-era connection."""
        await self.bus.publish(ResourcesListChanged())
        for peer in list(self._peers.values()):
            await peer.connection.send_resource_list_changed()

    @contextmanager
    def listening(self, params: types.SubscriptionsListenRequestParams) -> Iterator[None]:
        """A 2026 listen stream's resources, named in `subscribed` while the stream is open (the SDK's
        ListenHandler filters what each stream gets; this is how a whole-tenant forget learns of them)."""
        uris = {str(uri) for uri in params.notifications.resource_subscriptions or ()}
        if len(uris) > MAX_SUBSCRIPTIONS:
            raise MCPError(types.INVALID_PARAMS, f"at most {MAX_SUBSCRIPTIONS} subscriptions a listen stream")
        uris = {uri for uri in uris if resource_of(uri) is not None}
        self._listened.update(uris)
        try:
            yield
        finally:
            self._listened.subtract(uris)
            for uri in uris:
                if self._listened[uri] <= 0:
                    del self._listened[uri]

    def subscribed(self) -> set[str]:
        """Every resource a handshake-era connection subscribed to or an open listen stream asked for."""
        return {uri for peer in self._peers.values() for uri in peer.subscribed} | set(self._listened)

    async def broadcast(self, level: types.LoggingLevel, message: str) -> None:
        """A log message about no request: to every handshake-era connection that wants its level."""
        log.log(logging.ERROR if at_least(level, "error") else logging.INFO, "%s", message)
        for peer in list(self._peers.values()):
            if at_least(level, peer.level):
                await peer.connection.notify("notifications/message",
                                             {"level": level, "data": message, "logger": LOGGER})


def _called(ctx: ServerRequestContext[Any, Any]) -> str | None:
    """What a request calls, for a failure's message: the tool, or the resource read (None: neither)."""
    params = ctx.params or {}
    if ctx.method == "tools/call":
        return f"tool {str(params.get('name', '?'))[:100]}"
    if ctx.method == "resources/read":
        return f"read of {str(params.get('uri', '?'))[:300]}"
    return {"resources/list": "resources/list", "completion/complete": "completion"}.get(ctx.method)
