"""A tenant's progress through the pipeline, read from the rows themselves (turns stored, segments
closed, enriched or failed, gists, facts), and the waits until its enrichment is finished: the
enrichment benchmark, the LoCoMo evaluation and the fault suite wait on it.

Queries run as the login role (RLS binds only the workers' role): the tenant is a bound parameter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from epistream.ops.readiness import OnPoll, poll

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
       (SELECT count(*) FROM memory.segments WHERE status IN ('enriched', 'failed')),
       (SELECT min(closed_at) FROM memory.segments WHERE tenant = %(tenant)s)
"""


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
    #: Segments finished in the whole store, every tenant's: the enrich worker's own progress.
    store_done: int = 0
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

    def progress(self) -> tuple[int, int, int, int]:
        """What moving on means: a turn stored, a segment closed, a segment finished, this tenant's or
        another's. On a shared stack the enrich worker may work through others' segments queued ahead of
        this tenant's (each a model call of up to a minute on 2 cores): busy, not stalled."""
        return self.turns, self.segments, self.done_segments, self.store_done


def _state(row: Sequence[Any] | None) -> StoreState:
    if row is None:
        return StoreState(0, 0, 0, 0, 0)
    *counts, first_closed = row
    return StoreState(*(int(v) for v in counts), first_closed_at=first_closed)


def store_state(conn: psycopg.Connection, tenant: str) -> StoreState:
    return _state(conn.execute(STORE_STATE, {"tenant": tenant}).fetchone())


def wait_for_enrichment(url: str, tenant: str, *, expected_turns: int = 0, timeout_s: float | None = None,
                        stall_s: float | None = None, interval_s: float = 1.0,
                        on_poll: OnPoll | None = None) -> StoreState:
    """Until every turn is stored and in a closed segment and every segment is enriched or failed."""
    with psycopg.connect(url, autocommit=True) as conn:
        return poll(lambda: store_state(conn, tenant), lambda s: s.enrichment_finished(expected_turns),
                    what=f"the segments of {tenant} to be enriched", timeout_s=timeout_s, stall_s=stall_s,
                    interval_s=interval_s, progress=StoreState.progress, on_poll=on_poll)


def segments_awaiting_enrichment(url: str) -> int:
    """Segments of any tenant the enrich worker has still to enrich: while there are some, the model server
    takes the cores a benchmark of something else would need."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM memory.segments WHERE status NOT IN ('enriched', 'failed')").fetchone()
    return int(row[0]) if row else 0
