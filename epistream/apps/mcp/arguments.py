"""The MCP tools' arguments as the contracts they become, or an ArgumentError that says why not.

The SDK checks each call's arguments against the tools' JSON schemas (types, required fields, no
unknown fields); what only the contracts know (lengths, storable text, a budget's range, an ordered
time range) is checked here, before anything is sent, and comes back to the caller as a tool error."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from epistream.contracts.base import Identifier
from epistream.contracts.decoding import validated
from epistream.contracts.questions import Mode, Question
from epistream.contracts.turns import Turn
from epistream.errors import ContractError, PermanentError

#: The most turns one `remember` call takes (a larger batch is several calls).
MAX_TURNS = 500
#: The answer modes `ask` offers (the no-model read is `recall`).
ASK_MODES = ("fast", "deep", "agentic", "auto")


class ArgumentError(PermanentError, ValueError):
    """A tool's arguments that cannot become a valid record, with the reason."""


class TurnArgument(BaseModel):
    """One turn of `remember`."""

    model_config = ConfigDict(extra="forbid")

    speaker: str = Field(description="Who said it (a name, or 'user' / 'assistant').")
    text: str = Field(description="What was said, word for word.")
    time: datetime | None = Field(
        None, description="When it was said, ISO-8601 (without an offset: UTC). Default: now.")
    turn_id: str | None = Field(
        None, description="A stable id of the turn: the same id sent again is stored once. Default: a new id.")
    session_id: str | None = Field(None, description="The session it belongs to, if the caller has sessions.")


def served_tenant(name: str) -> str:
    """The tenant a server is started for, as the contracts take a tenant (or an ArgumentError)."""
    try:
        return TypeAdapter(Identifier).validate_python(name)
    except ValidationError as exc:
        raise ArgumentError(f"not a tenant name: {exc.errors()[0]['msg']}") from None


def as_instant(value: datetime | None) -> datetime | None:
    """A time as the contracts take it: one without an offset is read as UTC (as the CLI reads them)."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def turns_for(tenant: str, conversation_id: str, turns: Sequence[TurnArgument], *, now: datetime) -> list[Turn]:
    """`remember`'s turns as `memory.turns` records; an ArgumentError names the first bad one."""
    if not turns:
        raise ArgumentError("give at least one turn")
    if len(turns) > MAX_TURNS:
        raise ArgumentError(f"at most {MAX_TURNS} turns a call, not {len(turns)}: split them")
    records = []
    for n, turn in enumerate(turns, start=1):
        try:
            records.append(validated(
                Turn, what=f"turn {n}", tenant=tenant, conversation_id=conversation_id,
                turn_id=turn.turn_id if turn.turn_id is not None else f"mcp-{uuid.uuid4()}",
                speaker=turn.speaker, text=turn.text, ts=as_instant(turn.time) or now, session_id=turn.session_id,
            ))
        except ContractError as exc:
            raise ArgumentError(str(exc)) from None
    return records


def recall_question(tenant: str, question: str, *, budget_tokens: int, since: datetime | None,
                    until: datetime | None, conversation_ids: list[str] | None, now: datetime) -> Question:
    """The `context` question `recall` asks (the client builds the same one; checked here first)."""
    try:
        return validated(
            Question, what="recall", question_id=f"c-{uuid.uuid4()}", tenant=tenant, question=question,
            conversation_ids=conversation_ids or None, asked_at=now, mode=Mode.CONTEXT, budget_tokens=budget_tokens,
            time_range=None if since is None and until is None else {"start": as_instant(since),
                                                                     "end": as_instant(until)},
        )
    except ContractError as exc:
        raise ArgumentError(str(exc)) from None


def ask_question(tenant: str, question: str, *, mode: str, conversation_ids: list[str] | None,
                 now: datetime) -> Question:
    """The question `ask` sends to `memory.questions`."""
    if mode not in ASK_MODES:
        raise ArgumentError(f"mode is one of {', '.join(ASK_MODES)}, not {mode!r} (a no-model read is `recall`)")
    try:
        return validated(Question, what="question", question_id=f"q-{uuid.uuid4()}", tenant=tenant,
                         question=question, conversation_ids=conversation_ids or None, asked_at=now, mode=Mode(mode))
    except ContractError as exc:
        raise ArgumentError(str(exc)) from None


def confirmed_forget(conversation_id: str, confirm: str | None) -> str:
    """The conversation to forget, once `confirm` repeats its id exactly; refused otherwise."""
    if not conversation_id.strip():
        raise ArgumentError("name the conversation to forget")
    if confirm != conversation_id:
        raise ArgumentError(f"forgetting deletes conversation {conversation_id!r} and everything derived from it, "
                            "for good: to confirm, pass its id again as `confirm`")
    return conversation_id
