"""`ask`'s progress and cancellation on the MCP side.

Progress: only a call whose client sent a progress token asks the answer worker for its steps
(`Question.progress`); each step that comes back is forwarded as `notifications/progress` with a value
counted here (1, 2, ...: strictly increasing, as the protocol asks, even when the worker starts
counting again after a crash) and a message of step names and counts, never the tenant's text. A
call without a token sends the question as before and gets no notification.

Cancellation: the SDK cancels a call's handler when its client sends `notifications/cancelled` (stdio)
or closes the request's stream (streamable HTTP); the protocol forbids answering a cancelled request,
so the server stops waiting at once (the client's wait for the reply is discarded: nothing is left
behind) and says so in its log. The answer worker still answers, and its reply is dropped on arrival."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context

from epistream.client.session import OnProgress
from epistream.contracts.replies import Progress


def progress_token(context: Context[Any, Any] | None) -> str | int | None:
    """The progress token of the call, if its client sent one (`_meta.progressToken`)."""
    if context is None:
        return None
    try:
        meta = context.request_context.meta or {}
    except ValueError:  # no request: called outside the SDK
        return None
    token = meta.get("progress_token", meta.get("progressToken"))
    return token if isinstance(token, str | int) and not isinstance(token, bool) else None


def forwarder(context: Context[Any, Any] | None) -> OnProgress | None:
    """What forwards each step of an `ask` as `notifications/progress`; None (ask for no progress) when
    the client sent no token."""
    if context is None or progress_token(context) is None:
        return None
    forwarded = 0

    async def forward(step: Progress) -> None:
        nonlocal forwarded
        forwarded += 1
        await context.report_progress(forwarded, None, step.describe())
    return forward
