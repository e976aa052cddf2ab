"""The requests MCPServer (SDK 2.3.0) has no decorator for, registered on its lowlevel Server: the resource
list by page, the subscriptions of both protocol eras (each answered once the events reader holds its
place), the log level; and the completion of the resource templates' `conversation_id`."""

from __future__ import annotations

import functools

import mcp_types as types
from mcp.server import MCPServer, NotificationOptions
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import ListenHandler
from mcp.shared.exceptions import MCPError

from epistream.apps.mcp.conversations import ConversationResources
from epistream.apps.mcp.notify import Notifier
from epistream.apps.mcp.watch import EventWatch


def serve_live(server: MCPServer, conversations: ConversationResources, notifier: Notifier,
               watch: EventWatch) -> None:
    """Register them on `server` (its lowlevel Server, as the SDK's own Client reaches it)."""
    lowlevel = server._lowlevel_server
    listen = ListenHandler(notifier.bus)

    async def positioned() -> None:
        # A subscription is honoured from its answer on: the events reader must hold its place by then.
        if not await watch.positioned():
            raise MCPError(types.INTERNAL_ERROR, "memory events cannot be read (is Kafka at "
                           f"{watch.settings.kafka_bootstrap} up?): no notification could be sent")

    async def subscribe(ctx: ServerRequestContext, params: types.SubscribeRequestParams) -> types.EmptyResult:
        await positioned()
        return await notifier.subscribe(ctx, params)

    async def listen_from_now(ctx: ServerRequestContext,
                              params: types.SubscriptionsListenRequestParams) -> types.SubscriptionsListenResult:
        await positioned()
        with notifier.listening(params):
            return await listen(ctx, params)

    lowlevel.add_request_handler("resources/list", types.PaginatedRequestParams, conversations.list_resources)
    lowlevel.add_request_handler("resources/subscribe", types.SubscribeRequestParams, subscribe)
    lowlevel.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, notifier.unsubscribe)
    lowlevel.add_request_handler("subscriptions/listen", types.SubscriptionsListenRequestParams, listen_from_now)
    lowlevel.add_request_handler("logging/setLevel", types.SetLevelRequestParams, notifier.set_level)
    server.completion()(conversations.complete)
    # Handshake-era clients learn of list_changed from the initialize result's capabilities, which the SDK
    # builds with no NotificationOptions wherever it serves (stdio, each HTTP session): give it ours.
    lowlevel.create_initialization_options = functools.partial(  # type: ignore[method-assign]
        lowlevel.create_initialization_options, NotificationOptions(resources_changed=True))
