"""Poll PostgreSQL until a tenant's turns are stored, every segment is closed and none is pending."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

POLL_S = 1.0
PROGRESS_EVERY_S = 30.0
TICK_EVERY_S = 10.0

STATE = """
SELECT (SELECT count(*) FROM memory.turns WHERE tenant = %(t)s),
       (SELECT count(*) FROM memory.segmenter_state WHERE tenant = %(t)s AND cardinality(open_turn_ids) > carried),
       (SELECT min(closed_at) FROM memory.segments WHERE tenant = %(t)s)
"""
SEGMENTS = "SELECT segment_id, status FROM memory.segments WHERE tenant = %(t)s"


@dataclass(frozen=True)
class Sample:
    t_s: float  # since the stream started
    stored_turns: int
    closed: int
    done: int  # enriched or failed
    enriched: int = 0


@dataclass
class WaitOutcome:
    complete: bool
    reason: str  # done | deadline | stalled | interrupted
    waited_s: float
    # When the bench first saw each segment leave 'pending' (unix time): an upper bound of when it was
    # done, within one poll; enriched_at is a lower bound (the store transaction's start).
    seen_done_at: dict[str, float] = field(default_factory=dict)
    timeline: list[Sample] = field(default_factory=list)


@dataclass(frozen=True)
class WaitLimits:
    deadline_s: float  # from the stream's start
    stall_s: float  # no turn stored, segment closed or segment finished for this long


def wait_for_enrichment(
    url: str, tenant: str, *, expected_turns: int, expected_segments: int, started: float, limits: WaitLimits,
    tick: Callable[[], None] | None = None,
) -> WaitOutcome:
    """`started` is the stream's time.time(); KeyboardInterrupt (and SIGTERM, see run.py) ends the wait early.
    `tick` runs every TICK_EVERY_S (the caller scrapes the worker's counters)."""
    last_tick = 0.0
    outcome = WaitOutcome(False, "interrupted", 0.0)
    last_change, last_key, last_print = time.time(), (-1, -1, -1), 0.0
    try:
        with psycopg.connect(url, autocommit=True) as conn:  # autocommit: each poll sees new commits
            while True:
                now = time.time()
                stored, open_segments, first_closed = conn.execute(STATE, {"t": tenant}).fetchone()  # type: ignore[misc]
                statuses = dict(conn.execute(SEGMENTS, {"t": tenant}).fetchall())
                for sid, status in statuses.items():
                    if status != "pending":
                        outcome.seen_done_at.setdefault(sid, now)
                done = sum(1 for s in statuses.values() if s != "pending")
                enriched = sum(1 for s in statuses.values() if s == "enriched")
                sample = Sample(round(now - started, 1), stored, len(statuses), done, enriched)
                if not outcome.timeline or now - started - outcome.timeline[-1].t_s >= 5 or done != outcome.timeline[-1].done:
                    outcome.timeline.append(sample)
                key = (stored, len(statuses), done)
                if key != last_key:
                    last_key, last_change = key, now
                if stored >= expected_turns and open_segments == 0 and statuses and done == len(statuses):
                    outcome.complete, outcome.reason = True, "done"
                    break
                if now - started > limits.deadline_s:
                    outcome.reason = "deadline"
                    break
                if now - last_change > limits.stall_s:
                    outcome.reason = "stalled"
                    break
                if tick is not None and now - last_tick >= TICK_EVERY_S:
                    tick()
                    last_tick = now
                if now - last_print >= PROGRESS_EVERY_S:
                    print("    " + progress_line(sample, expected_turns, expected_segments, first_closed, now), flush=True)
                    last_print = now
                time.sleep(POLL_S)
    except KeyboardInterrupt:
        outcome.reason = "interrupted"
    outcome.waited_s = time.time() - started
    return outcome


def progress_line(s: Sample, expected_turns: int, expected_segments: int, first_closed, now: float) -> str:  # type: ignore[no-untyped-def]
    line = (
        f"t={s.t_s / 60:5.1f} min  turns stored {s.stored_turns}/{expected_turns}  "
        f"segments closed {s.closed}/{expected_segments}, done {s.done} ({s.enriched} enriched)"
    )
    if first_closed is not None and s.done:
        minutes = (now - first_closed.timestamp()) / 60
        rate = s.done / minutes
        eta = (expected_segments - s.done) / rate if rate > 0 else float("inf")
        line += f"  {rate:.2f} segments/min, ~{eta:.0f} min to go"
    return line
