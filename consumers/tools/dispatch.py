"""The dispatcher a model loop uses: a call's arguments validated as data, its
date expressions resolved against the time the question was asked, then the
tool run inside the caller's tenant scope.

``run_tool`` gives the typed result (observation and evidence for the agent);
``call_tool`` the same result as a JSON-ready dict cut to ``max_chars``.
Each tool is one plain async function of (the call's scope, its typed
arguments), looked up by name in RUNNERS.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, Protocol

import numpy as np
from psycopg import AsyncConnection

from epistream.core import tracing

from .facts import find_entity_contexts
from .gists import find_gist_contexts
from .limits import MAX_RESULT_CHARS
from .observations import (
    AnswerResult,
    EntityContextsResult,
    GistContextsResult,
    NotFoundResult,
    RetrievalResult,
    SegmentResult,
    ToolResult,
)
from .registry import validate_arguments
from .retrieval import lexical_retrieve, semantic_retrieve
from .schemas import (
    FindEntityContextsArgs,
    FindGistContextsArgs,
    LexicalRetrieveArgs,
    OutputAnswerArgs,
    ReadSegmentArgs,
    SemanticRetrieveArgs,
    TimeArgs,
    resolve_range,
)
from .segments import read_segment
from .shaping import fit


class Embeds(Protocol):
    def embed_query(self, text: str) -> np.ndarray: ...


@dataclass(frozen=True)
class CallScope:
    """What a call runs with that the model does not choose: the caller's connection, tenant,
    embedder and conversations, and the call's resolved range of days."""

    tool: str
    conn: AsyncConnection
    tenant: str
    embedder: Embeds | None
    conversation_ids: list[str] | None
    start: date | None = None
    end: date | None = None


async def _semantic(scope: CallScope, args: SemanticRetrieveArgs) -> ToolResult:
    if scope.embedder is None:
        raise ValueError("semantic_retrieve needs an embedder")
    vector = await asyncio.to_thread(scope.embedder.embed_query, args.query)
    hits = await semantic_retrieve(scope.conn, tenant=scope.tenant, vector=vector,
                                   conversation_ids=scope.conversation_ids, target=args.target,
                                   start=scope.start, end=scope.end, limit=args.limit)
    return RetrievalResult(scope.tool, args.target, scope.start, scope.end, hits)


async def _lexical(scope: CallScope, args: LexicalRetrieveArgs) -> ToolResult:
    hits = await lexical_retrieve(scope.conn, tenant=scope.tenant, query=args.query,
                                  conversation_ids=scope.conversation_ids, target=args.target,
                                  start=scope.start, end=scope.end, limit=args.limit, operator=args.operator)
    return RetrievalResult(scope.tool, args.target, scope.start, scope.end, hits)


async def _gist_contexts(scope: CallScope, args: FindGistContextsArgs) -> ToolResult:
    found = await find_gist_contexts(scope.conn, tenant=scope.tenant, gist_id=args.gist_id, window=args.window,
                                     conversation_ids=scope.conversation_ids)
    if found is None:
        return NotFoundResult(scope.tool, f"no gist {args.gist_id!r} in this memory")
    return GistContextsResult(scope.tool, found)


async def _entity_contexts(scope: CallScope, args: FindEntityContextsArgs) -> ToolResult:
    found = await find_entity_contexts(
        scope.conn, tenant=scope.tenant, subject=args.subject, predicate=args.predicate, object=args.object,
        start=scope.start, end=scope.end, order=args.order, limit=args.limit, offset=args.offset,
        aggregate=args.aggregate, current_only=args.current_only, conversation_ids=scope.conversation_ids)
    return EntityContextsResult(scope.tool, scope.start, scope.end, found)


async def _read_segment(scope: CallScope, args: ReadSegmentArgs) -> ToolResult:
    found = await read_segment(scope.conn, tenant=scope.tenant, segment_id=args.segment_id,
                               conversation_ids=scope.conversation_ids)
    if found is None:
        return NotFoundResult(scope.tool, f"no segment {args.segment_id!r} in this memory")
    return SegmentResult(scope.tool, found)


Runner = Callable[[CallScope, Any], Awaitable[ToolResult]]
RUNNERS: dict[str, Runner] = {
    "semantic_retrieve": _semantic,
    "lexical_retrieve": _lexical,
    "find_gist_contexts": _gist_contexts,
    "find_entity_contexts": _entity_contexts,
    "read_segment": _read_segment,
}


async def run_tool(
    conn: AsyncConnection | None,
    name: str,
    arguments: dict[str, Any] | str | None,
    *,
    tenant: str,
    embedder: Embeds | None,
    conversation_ids: list[str] | None,
    asked_at: datetime | None,
) -> ToolResult:
    """Validate a model's tool call, run it inside the caller's tenant scope, return its typed result.

    Raises ToolArgumentError (a ValueError) for an unknown tool or bad arguments, before
    touching the database. ``output_answer`` is only validated and echoed: the caller ends
    the loop with it. ``conversation_ids`` (the question's scope) is the caller's, never the model's.
    """
    args = validate_arguments(name, arguments)
    if isinstance(args, OutputAnswerArgs):
        return AnswerResult(name, args)
    anchor = asked_at or datetime.now(UTC)
    start, end = resolve_range(name, args, anchor) if isinstance(args, TimeArgs) else (None, None)
    if conn is None:
        raise ValueError("call_tool needs a connection for data tools")
    scope = CallScope(name, conn, tenant, embedder, conversation_ids, start, end)
    with tracing.span(f"tool {name}", attributes={"epistream.tool": name}):  # a known name: validated above
        return await RUNNERS[name](scope, args)


async def call_tool(
    conn: AsyncConnection | None,
    name: str,
    arguments: dict[str, Any] | str | None,
    *,
    tenant: str,
    embedder: Embeds | None,
    conversation_ids: list[str] | None,
    asked_at: datetime | None,
    max_chars: int = MAX_RESULT_CHARS,
) -> dict[str, Any]:
    """``run_tool``'s result as a JSON-ready dict, its biggest lists cut until it fits ``max_chars``
    (``"truncated": true`` when they were); ``output_answer`` echoed as it is."""
    result = await run_tool(conn, name, arguments, tenant=tenant, embedder=embedder,
                            conversation_ids=conversation_ids, asked_at=asked_at)
    if isinstance(result, AnswerResult):
        return result.payload()
    return fit(result.payload(), max_chars)
