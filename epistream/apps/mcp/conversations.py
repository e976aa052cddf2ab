"""The tenant's conversations as MCP resources: `resources/list` (a timeline and a facts resource per
conversation, a page at a time behind an opaque cursor) and `completion/complete` of the templates'
`conversation_id` (the ids that start with what was typed). Both read the conversations listing
through the answer worker (memory.read_conversations), under the tenant's row-level security."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from epistream.apps.mcp.changes import uri
from epistream.contracts.questions import CONVERSATIONS_PAGE_MAX, ConversationPage
from epistream.contracts.replies import ConversationEntry, MemoryContext

#: The argument of the resource templates that completes.
ARGUMENT = "conversation_id"
_CURSOR = "cv1."

ReadPage = Callable[[ConversationPage], Awaitable[MemoryContext]]


def page_cursor(after: str) -> str:
    """The opaque cursor of the page that follows conversation `after`."""
    return _CURSOR + base64.urlsafe_b64encode(after.encode()).decode().rstrip("=")


def page_after(cursor: str) -> str:
    """The conversation a cursor `page_cursor` made follows; INVALID_PARAMS (as the protocol asks) if it is none."""
    body = cursor[len(_CURSOR):]
    try:
        after = base64.b64decode(body + "=" * (-len(body) % 4), altchars=b"-_", validate=True).decode()
        if not cursor.startswith(_CURSOR) or not after:
            raise ValueError
        return after
    except (ValueError, binascii.Error):  # UnicodeDecodeError is a ValueError
        raise MCPError(types.INVALID_PARAMS, "not a cursor of resources/list: pass the nextCursor a listing "
                       "returned, unchanged") from None


def resources_of(entry: ConversationEntry) -> list[types.Resource]:
    """A conversation's two resources, as a listing names them."""
    cid, said = entry.conversation_id, f"{entry.turns} turn(s), the last said {entry.last_turn_at:%Y-%m-%d %H:%M} UTC"
    return [
        types.Resource(uri=uri(cid, "timeline"), name=f"{cid} timeline", mime_type="text/plain",
                       description=f"Gists of conversation {cid} in time order ({said})"),
        types.Resource(uri=uri(cid, "facts"), name=f"{cid} facts", mime_type="text/plain",
                       description=f"Current facts of conversation {cid} ({said})"),
    ]


class ConversationResources:
    """The handlers, over a function that reads a page of the conversations listing."""

    def __init__(self, read: ReadPage, templates: frozenset[str], *, page_size: int) -> None:
        self._read = read
        self._templates = templates
        self._page_size = page_size  # conversations a resources/list page names

    async def list_resources(self, ctx: ServerRequestContext[Any, Any],
                             params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        cursor = params.cursor if params is not None else None
        try:
            page = ConversationPage(after=None if cursor is None else page_after(cursor), limit=self._page_size)
        except ValidationError:
            raise MCPError(types.INVALID_PARAMS, "not a cursor of resources/list") from None
        reply = await self._read(page)
        entries = reply.conversations or []
        return types.ListResourcesResult(
            resources=[r for entry in entries for r in resources_of(entry)],
            next_cursor=page_cursor(entries[-1].conversation_id) if reply.more and entries else None)

    async def complete(self, ref: types.ResourceTemplateReference | types.PromptReference,
                       argument: types.CompletionArgument,
                       context: types.CompletionContext | None) -> types.Completion | None:
        """The conversation ids that start with the typed value, at most a hundred, with their honest total."""
        if not isinstance(ref, types.ResourceTemplateReference) or ref.uri not in self._templates \
                or argument.name != ARGUMENT:
            return None
        try:
            page = ConversationPage(prefix=argument.value, limit=CONVERSATIONS_PAGE_MAX, count=True)
        except ValidationError:  # a prefix no id can start with (too long, a NUL)
            return types.Completion(values=[], total=0, has_more=False)
        reply = await self._read(page)
        values = [entry.conversation_id for entry in reply.conversations or []]
        return types.Completion(values=values, total=reply.total, has_more=bool(reply.more))
