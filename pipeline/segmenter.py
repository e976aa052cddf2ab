"""Groups a conversation's turns into segments: pure logic over an immutable state.

A segment closes when its token budget is reached, at a session boundary or
a long gap between turns, or when the conversation goes idle (an explicit
close request, see :mod:`epistream.pipeline.store.segments`). Segments closed by budget or
idleness carry their last turns (about ``overlap_share`` of the budget) into
the next segment, so an event told across the cut is read whole at least
once; session and gap boundaries are natural cuts and carry nothing.

Everything here is deterministic in the order of turns, so replaying
``memory.turns`` rebuilds the same segments.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Literal

# Re-exported: the estimate lives in the shared core (the query side counts with it too).
from epistream.models.prompts import estimate_tokens as estimate_tokens

CloseReason = Literal["budget", "session", "gap", "idle"]


@dataclass(frozen=True)
class SegmenterConfig:
    max_tokens: int = 4096
    overlap_share: float = 0.10
    max_gap: timedelta = timedelta(hours=6)


@dataclass(frozen=True)
class OpenTurn:
    turn_id: str
    tokens: int


@dataclass(frozen=True)
class SegmenterState:
    next_seq: int = 0
    open: tuple[OpenTurn, ...] = ()
    # How many leading turns of `open` were carried over from the previous segment.
    carried: int = 0
    last_ts: datetime | None = None
    last_session_id: str | None = None

    @property
    def open_tokens(self) -> int:
        return sum(t.tokens for t in self.open)

    @property
    def has_new_turns(self) -> bool:
        return len(self.open) > self.carried


@dataclass(frozen=True)
class ClosedSegment:
    seq: int
    turn_ids: tuple[str, ...]
    overlap_turns: int
    token_estimate: int
    reason: CloseReason


@dataclass(frozen=True)
class Step:
    state: SegmenterState
    closed: list[ClosedSegment] = field(default_factory=list)


def close(state: SegmenterState, reason: CloseReason, config: SegmenterConfig) -> Step:
    """Close the open segment, if it has turns of its own."""
    if not state.has_new_turns:
        return Step(state)
    segment = ClosedSegment(
        seq=state.next_seq,
        turn_ids=tuple(t.turn_id for t in state.open),
        overlap_turns=state.carried,
        token_estimate=state.open_tokens,
        reason=reason,
    )
    carry = _overlap(state.open, config) if reason in ("budget", "idle") else ()
    return Step(replace(state, next_seq=state.next_seq + 1, open=carry, carried=len(carry)), [segment])


def _overlap(turns: tuple[OpenTurn, ...], config: SegmenterConfig) -> tuple[OpenTurn, ...]:
    """The longest tail of `turns` within the overlap budget (never the whole segment)."""
    budget = config.overlap_share * config.max_tokens
    kept: list[OpenTurn] = []
    used = 0
    for turn in reversed(turns[1:]):
        if used + turn.tokens > budget:
            break
        kept.append(turn)
        used += turn.tokens
    return tuple(reversed(kept))


def feed(
    state: SegmenterState,
    *,
    turn_id: str,
    tokens: int,
    ts: datetime,
    session_id: str | None,
    config: SegmenterConfig,
) -> Step:
    """Add one turn; return the new state and the segments this closed (at most two)."""
    closed: list[ClosedSegment] = []
    boundary = _boundary(state, ts, session_id, config)
    if boundary is not None:
        step = close(state, boundary, config)
        closed.extend(step.closed)
        # A natural boundary: nothing from before it belongs to the next segment.
        state = replace(step.state, open=(), carried=0)
    state = replace(
        state,
        open=(*state.open, OpenTurn(turn_id, tokens)),
        last_ts=ts if state.last_ts is None else max(state.last_ts, ts),
        last_session_id=session_id if session_id is not None else state.last_session_id,
    )
    if state.open_tokens >= config.max_tokens:
        step = close(state, "budget", config)
        closed.extend(step.closed)
        state = step.state
    return Step(state, closed)


def _boundary(
    state: SegmenterState, ts: datetime, session_id: str | None, config: SegmenterConfig
) -> CloseReason | None:
    if not state.open:
        return None
    if session_id is not None and state.last_session_id is not None and session_id != state.last_session_id:
        return "session"
    if state.last_ts is not None and ts - state.last_ts > config.max_gap:
        return "gap"
    return None
