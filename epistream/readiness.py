"""Waiting until the stack has done something: a condition holds, a port or URL answers, a
tenant's turns are stored, its segments are enriched.

One poll loop for the demo, the embedded stack, the benchmarks and the tests. A wait
ends at its deadline (`timeout_s`) or, with `stall_s`, as soon as nothing has progressed for that
long (a dead worker need not use up a long deadline); either raises :class:`WaitTimeout`.
"""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.request
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import psycopg

T = TypeVar("T")
S = TypeVar("S")

#: Called after every poll with what was read and the seconds waited so far (progress lines, sampling).
OnPoll = Callable[[Any, float], None]


class WaitTimeout(TimeoutError):
    """A wait ran out: `reason` is "deadline" or "stalled"; `last` is the last thing read."""

    def __init__(self, what: str, *, reason: str, waited_s: float, limit_s: float, last: object = None) -> None:
        self.what, self.reason, self.waited_s, self.last = what, reason, waited_s, last
        told = f"timed out after {waited_s:.0f}s" if reason == "deadline" else f"no progress for {limit_s:.0f}s"
        seen = "" if last is None or isinstance(last, bool) else f" (last seen: {last})"
        super().__init__(f"{told} waiting for {what}{seen}")


class _Clock:
    """The deadline and stall bookkeeping shared by the sync and async loops."""

    def __init__(self, what: str, timeout_s: float | None, stall_s: float | None,
                 progress: Callable[[Any], Hashable]) -> None:
        self.what, self.timeout_s, self.stall_s, self.progress = what, timeout_s, stall_s, progress
        self.started = self.last_change = time.monotonic()
        self.last_key: Hashable = object()

    def waited(self) -> float:
        return time.monotonic() - self.started

    def check(self, state: object) -> None:
        """Raise WaitTimeout when the deadline passed or the state stopped changing."""
        now = time.monotonic()
        key = self.progress(state)
        if key != self.last_key:
            self.last_key, self.last_change = key, now
        if self.timeout_s is not None and now - self.started >= self.timeout_s:
            raise WaitTimeout(self.what, reason="deadline", waited_s=now - self.started, limit_s=self.timeout_s,
                              last=state)
        if self.stall_s is not None and now - self.last_change > self.stall_s:
            raise WaitTimeout(self.what, reason="stalled", waited_s=now - self.started, limit_s=self.stall_s,
                              last=state)


def poll(read: Callable[[], S], done: Callable[[S], bool], *, what: str, timeout_s: float | None = None,
         stall_s: float | None = None, interval_s: float = 0.25, progress: Callable[[S], Hashable] = repr,
         on_poll: OnPoll | None = None) -> S:
    """Call `read` every `interval_s` until `done(state)`; return that state.

    `progress` says what counts as moving on (by default any change of the state)."""
    clock = _Clock(what, timeout_s, stall_s, progress)
    while True:
        state = read()
        if on_poll is not None:
            on_poll(state, clock.waited())
        if done(state):
            return state
        clock.check(state)
        time.sleep(interval_s)


async def poll_async(read: Callable[[], Awaitable[S]], done: Callable[[S], bool], *, what: str,
                     timeout_s: float | None = None, stall_s: float | None = None, interval_s: float = 0.25,
                     progress: Callable[[S], Hashable] = repr, on_poll: OnPoll | None = None) -> S:
    """:func:`poll` inside an event loop (cancellable, unlike a blocking wait on a thread)."""
    clock = _Clock(what, timeout_s, stall_s, progress)
    while True:
        state = await read()
        if on_poll is not None:
            on_poll(state, clock.waited())
        if done(state):
            return state
        clock.check(state)
        await asyncio.sleep(interval_s)


def wait_until(check: Callable[[], T], *, timeout_s: float, what: str, interval_s: float = 0.25) -> T:
    """Until `check()` returns something truthy; that value. WaitTimeout names `what` after `timeout_s`."""
    return poll(check, bool, what=what, timeout_s=timeout_s, interval_s=interval_s, progress=lambda _: 0)


# --- something answers ---------------------------------------------------------


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """Something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def url_ok(url: str, timeout_s: float = 2.0) -> bool:
    """A GET of `url` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (a configured local URL)
            return response.status == 200
    except OSError:
        return False


def wait_for_port(host: str, port: int, *, timeout_s: float, what: str | None = None) -> None:
    wait_until(lambda: port_open(host, port), timeout_s=timeout_s, what=what or f"{host}:{port} to accept connections")


def wait_for_url(url: str, *, timeout_s: float, what: str | None = None) -> None:
    wait_until(lambda: url_ok(url), timeout_s=timeout_s, what=what or f"{url} to answer")


# --- the store: turns stored, segments enriched --------------------------------------

# Run as the login role (RLS binds only the workers' role): the tenant is a bound parameter.
STORED_TURNS = """
SELECT count(*) FROM memory.turns
WHERE tenant = %(tenant)s
  AND (%(conversation)s::text IS NULL OR conversation_id = %(conversation)s)
  AND (%(turn_ids)s::text[] IS NULL OR turn_id = ANY(%(turn_ids)s))
"""

# open_conversations: conversations with turns no closed segment holds yet (beyond the carried overlap),
# the segmenter's own notion of "open" (its idle-close query uses the same test).
STORE_STATE = """
SELECT (SELECT count(*) FROM memory.turns WHERE tenant = %(tenant)s),
       (SELECT count(*) FROM memory.segmenter_state
         WHERE tenant = %(tenant)s AND cardinality(open_turn_ids) > carried),
       (SELECT count(*) FROM memory.segments WHERE tenant = %(tenant)s),
       (SELECT count(*) FROM memory.segments WHERE tenant = %(tenant)s AND status = 'enriched'),
       (SELECT count(*) FROM memory.segments WHERE tenant = %(tenant)s AND status = 'failed'),
       (SELECT count(*) FROM memory.gists WHERE tenant = %(tenant)s),
       (SELECT count(*) FROM memory.facts WHERE tenant = %(tenant)s),
       (SELECT min(closed_at) FROM memory.segments WHERE tenant = %(tenant)s)
"""


def _turns_params(tenant: str, conversation_id: str | None, turn_ids: Sequence[str] | None) -> dict[str, object]:
    return {"tenant": tenant, "conversation": conversation_id, "turn_ids": None if turn_ids is None else list(turn_ids)}


def stored_turns(conn: psycopg.Connection, tenant: str, *, conversation_id: str | None = None,
                 turn_ids: Sequence[str] | None = None) -> int:
    """How many of the tenant's turns (of one conversation, of these ids) are stored."""
    row = conn.execute(STORED_TURNS, _turns_params(tenant, conversation_id, turn_ids)).fetchone()
    return int(row[0]) if row else 0


@dataclass(frozen=True)
class StoreState:
    """A tenant's progress through the pipeline, from the rows themselves."""

    turns: int
    open_conversations: int
    segments: int
    enriched: int
    failed: int
    gists: int = 0
    facts: int = 0
    first_closed_at: datetime | None = None

    @property
    def pending(self) -> int:
        return self.segments - self.enriched - self.failed

    @property
    def done_segments(self) -> int:
        """Enriched or failed: no model call left to make."""
        return self.enriched + self.failed

    def enrichment_finished(self, expected_turns: int = 0) -> bool:
        """Every turn is stored and in a closed segment, and every segment is enriched or failed."""
        return self.turns >= expected_turns and self.open_conversations == 0 and self.segments > 0 \
            and self.pending == 0

    def progress(self) -> tuple[int, int, int]:
        """What moving on means: a turn stored, a segment closed, a segment finished."""
        return self.turns, self.segments, self.done_segments


def _state(row: Sequence[Any] | None) -> StoreState:
    if row is None:
        return StoreState(0, 0, 0, 0, 0)
    *counts, first_closed = row
    return StoreState(*(int(v) for v in counts), first_closed_at=first_closed)


def store_state(conn: psycopg.Connection, tenant: str) -> StoreState:
    return _state(conn.execute(STORE_STATE, {"tenant": tenant}).fetchone())


async def store_state_async(conn: psycopg.AsyncConnection, tenant: str) -> StoreState:
    cur = await conn.execute(STORE_STATE, {"tenant": tenant})
    return _state(await cur.fetchone())


def wait_for_turns(url: str, tenant: str, expected: int, *, conversation_id: str | None = None,
                   turn_ids: Sequence[str] | None = None, timeout_s: float | None = None,
                   stall_s: float | None = None, interval_s: float = 0.25, on_poll: OnPoll | None = None) -> int:
    """Until at least `expected` of the tenant's turns (of one conversation, of these ids) are stored."""
    with psycopg.connect(url, autocommit=True) as conn:  # autocommit: each poll sees new commits
        return poll(lambda: stored_turns(conn, tenant, conversation_id=conversation_id, turn_ids=turn_ids),
                    lambda n: n >= expected, what=f"{expected} turns of {tenant} to be stored",
                    timeout_s=timeout_s, stall_s=stall_s, interval_s=interval_s, on_poll=on_poll)


def wait_for_enrichment(url: str, tenant: str, *, expected_turns: int = 0, timeout_s: float | None = None,
                        stall_s: float | None = None, interval_s: float = 1.0,
                        on_poll: OnPoll | None = None) -> StoreState:
    """Until every turn is stored and in a closed segment and every segment is enriched or failed."""
    with psycopg.connect(url, autocommit=True) as conn:
        return poll(lambda: store_state(conn, tenant), lambda s: s.enrichment_finished(expected_turns),
                    what=f"the segments of {tenant} to be enriched", timeout_s=timeout_s, stall_s=stall_s,
                    interval_s=interval_s, progress=StoreState.progress, on_poll=on_poll)


async def wait_for_enrichment_async(url: str, tenant: str, *, expected_turns: int = 0,
                                    timeout_s: float | None = None, stall_s: float | None = None,
                                    interval_s: float = 1.0, on_poll: OnPoll | None = None) -> StoreState:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        return await poll_async(lambda: store_state_async(conn, tenant),
                                lambda s: s.enrichment_finished(expected_turns),
                                what=f"the segments of {tenant} to be enriched", timeout_s=timeout_s,
                                stall_s=stall_s, interval_s=interval_s, progress=StoreState.progress,
                                on_poll=on_poll)
