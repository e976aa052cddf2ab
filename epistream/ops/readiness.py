"""Waiting until the stack has done something: a condition holds, a port or URL answers, a
tenant's turns are stored.

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
from typing import Any, TypeVar

import psycopg

from epistream.errors import ServiceError

T = TypeVar("T")
S = TypeVar("S")

#: Called after every poll with what was read and the seconds waited so far (progress lines, sampling).
OnPoll = Callable[[Any, float], None]


class WaitTimeout(ServiceError, TimeoutError):
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


# --- the store: turns stored ------------------------------------------------------------

# Run as the login role (RLS binds only the workers' role): the tenant is a bound parameter.
STORED_TURNS = """
SELECT count(*) FROM memory.turns
WHERE tenant = %(tenant)s
  AND (%(conversation)s::text IS NULL OR conversation_id = %(conversation)s)
  AND (%(turn_ids)s::text[] IS NULL OR turn_id = ANY(%(turn_ids)s))
"""


def _turns_params(tenant: str, conversation_id: str | None, turn_ids: Sequence[str] | None) -> dict[str, object]:
    return {"tenant": tenant, "conversation": conversation_id, "turn_ids": None if turn_ids is None else list(turn_ids)}


def stored_turns(conn: psycopg.Connection, tenant: str, *, conversation_id: str | None = None,
                 turn_ids: Sequence[str] | None = None) -> int:
    """How many of the tenant's turns (of one conversation, of these ids) are stored."""
    row = conn.execute(STORED_TURNS, _turns_params(tenant, conversation_id, turn_ids)).fetchone()
    return int(row[0]) if row else 0


def wait_for_turns(url: str, tenant: str, expected: int, *, conversation_id: str | None = None,
                   turn_ids: Sequence[str] | None = None, timeout_s: float | None = None,
                   stall_s: float | None = None, interval_s: float = 0.25, on_poll: OnPoll | None = None) -> int:
    """Until at least `expected` of the tenant's turns (of one conversation, of these ids) are stored."""
    with psycopg.connect(url, autocommit=True) as conn:  # autocommit: each poll sees new commits
        return poll(lambda: stored_turns(conn, tenant, conversation_id=conversation_id, turn_ids=turn_ids),
                    lambda n: n >= expected, what=f"{expected} turns of {tenant} to be stored",
                    timeout_s=timeout_s, stall_s=stall_s, interval_s=interval_s, on_poll=on_poll)
