"""The enrichment run's wait (store_state.wait_for_enrichment), sampled as it goes:
a timeline of the tenant's progress, when each segment was first seen done, progress lines."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from epistream.readiness import WaitTimeout

from .store_state import StoreState, wait_for_enrichment

POLL_S = 1.0
PROGRESS_EVERY_S = 30.0
TICK_EVERY_S = 10.0

SEGMENT_STATUSES = "SELECT segment_id, status FROM memory.segments WHERE tenant = %(t)s"


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


@dataclass
class _Sampler:
    """Runs after every poll of the product's wait: the bench's own records of the run."""

    conn: psycopg.Connection
    tenant: str
    started: float
    expected_turns: int
    expected_segments: int
    outcome: WaitOutcome
    tick: Callable[[], None] | None
    last_tick: float = 0.0
    last_print: float = 0.0

    def __call__(self, state: StoreState, _waited_s: float) -> None:
        now = time.time()
        for sid, status in self.conn.execute(SEGMENT_STATUSES, {"t": self.tenant}).fetchall():
            if status != "pending":
                self.outcome.seen_done_at.setdefault(sid, now)
        sample = Sample(round(now - self.started, 1), state.turns, state.segments, state.done_segments, state.enriched)
        timeline = self.outcome.timeline
        if not timeline or now - self.started - timeline[-1].t_s >= 5 or sample.done != timeline[-1].done:
            timeline.append(sample)
        if state.enrichment_finished(self.expected_turns):
            return
        if self.tick is not None and now - self.last_tick >= TICK_EVERY_S:
            self.tick()
            self.last_tick = now
        if now - self.last_print >= PROGRESS_EVERY_S:
            print("    " + progress_line(sample, self.expected_turns, self.expected_segments, state.first_closed_at,
                                         now), flush=True)
            self.last_print = now


def wait_for_enrichment_sampled(
    url: str, tenant: str, *, expected_turns: int, expected_segments: int, started: float, limits: WaitLimits,
    tick: Callable[[], None] | None = None,
) -> WaitOutcome:
    """`started` is the stream's time.time(); KeyboardInterrupt (and SIGTERM, see run.py) ends the wait early.
    `tick` runs every TICK_EVERY_S (the caller scrapes the worker's counters)."""
    outcome = WaitOutcome(False, "interrupted", 0.0)
    try:
        with psycopg.connect(url, autocommit=True) as conn:  # autocommit: each poll sees new commits
            sampler = _Sampler(conn, tenant, started, expected_turns, expected_segments, outcome, tick)
            wait_for_enrichment(url, tenant, expected_turns=expected_turns,
                                timeout_s=max(0.0, limits.deadline_s - (time.time() - started)),
                                stall_s=limits.stall_s, interval_s=POLL_S, on_poll=sampler)
        outcome.complete, outcome.reason = True, "done"
    except WaitTimeout as exc:
        outcome.reason = exc.reason  # deadline | stalled
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
