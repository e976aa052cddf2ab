"""The pure part of :mod:`bench.scale.workers`: how partitions split among workers, what was lost or
stored twice (rows against the records of the log), how long a killed worker's partitions took to move,
and whether each question was answered exactly once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np


def even_share(partitions: int, workers: int) -> list[int]:
    """Partitions per worker, largest first, as an even assignor splits them (4 over 3: 2, 1, 1; a worker
    beyond the partition count gets none and stays idle)."""
    if partitions < 0 or workers < 1:
        raise ValueError("partitions >= 0 and workers >= 1")
    base, extra = divmod(partitions, workers)
    return [base + (i < extra) for i in range(workers)]


def speedup_bound(partitions: int, workers: int) -> float:
    """The most `workers` can gain over one when every partition carries the same load and nothing else
    limits them: the busiest worker's share sets the pace (4 partitions: 1, 2, 2, 4 for 1-4 workers)."""
    busiest = even_share(partitions, workers)[0]
    return partitions / busiest if busiest else 0.0


@dataclass(frozen=True)
class Row:
    """A turn with its Kafka provenance: a record read back from memory.turns, or a stored row
    (kafka_partition, kafka_offset)."""

    conversation_id: str
    turn_id: str
    partition: int
    offset: int

    @property
    def key(self) -> tuple[str, str]:
        return self.conversation_id, self.turn_id


@dataclass(frozen=True)
class Accounting:
    produced: int  # distinct turns produced
    records: int  # their records in the log (more than `produced` where a producer resent one)
    rows: int  # rows stored
    distinct: int  # distinct turn ids among the rows
    lost: int  # produced, never stored
    duplicated: int  # rows beyond one per turn, plus rows of turns never produced
    provenance_mismatch: int  # rows whose kafka_partition/kafka_offset is no record of that turn

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.provenance_mismatch)

    def as_json(self) -> dict[str, int | bool]:
        return {**asdict(self), "ok": self.ok}


def account(produced: Iterable[Row], stored: Iterable[Row]) -> Accounting:
    """Rows against the log: every produced turn stored once, from one of its own records."""
    records: dict[tuple[str, str], set[tuple[int, int]]] = {}
    count = 0
    for r in produced:
        records.setdefault(r.key, set()).add((r.partition, r.offset))
        count += 1
    rows = list(stored)
    per_turn = Counter(r.key for r in rows)
    return Accounting(
        produced=len(records), records=count, rows=len(rows), distinct=len(per_turn),
        lost=sum(1 for key in records if key not in per_turn),
        duplicated=sum(n - 1 for n in per_turn.values()) + sum(n for k, n in per_turn.items() if k not in records),
        provenance_mismatch=sum(1 for r in rows if r.key in records and (r.partition, r.offset) not in records[r.key]),
    )


@dataclass(frozen=True)
class Timed:
    """A stored turn's partition and its produce and store times (seconds, one clock)."""

    partition: int
    produced_at: float
    stored_at: float

    @property
    def latency(self) -> float:
        return self.stored_at - self.produced_at


@dataclass(frozen=True)
class Takeover:
    first_store_s: float | None  # kill -> the first turn stored on a partition the killed worker held
    caught_up_s: float | None  # kill -> the last of those partitions' turns that waited longer than `late_s`
    late_s: float  # what counts as waited: twice the p95 latency before the kill, at least 1 s
    backlog: int  # turns of the moved partitions that waited longer than `late_s`
    others_first_store_s: float | None  # kill -> the first turn stored on any other partition
    others_max_latency_s: float | None  # the other partitions' worst latency after the kill (a paused group)

    def as_json(self) -> dict[str, float | int | None]:
        return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def takeover(rows: Sequence[Timed], *, killed_at: float, moved: Iterable[int]) -> Takeover:
    """How long the killed worker's partitions (`moved`) waited for a new owner, from the rows' times."""
    moved = set(moved)
    before = [r.latency for r in rows if r.stored_at < killed_at]
    late = max(1.0, 2 * float(np.percentile(before, 95))) if before else 1.0
    after = [r for r in rows if r.stored_at >= killed_at]
    mine = [r for r in after if r.partition in moved]
    others = [r for r in after if r.partition not in moved]
    waited = [r for r in mine if r.latency > late]
    first = min((r.stored_at for r in mine), default=None)
    return Takeover(
        first_store_s=None if first is None else first - killed_at,
        caught_up_s=max(r.stored_at for r in waited) - killed_at if waited else
        (None if first is None else first - killed_at),
        late_s=late, backlog=len(waited),
        others_first_store_s=min((r.stored_at for r in others), default=killed_at) - killed_at if others else None,
        others_max_latency_s=max((r.latency for r in others), default=None),
    )


@dataclass(frozen=True)
class Answered:
    asked: int
    answered: int  # questions with at least one committed reply
    unanswered: int
    answered_twice: int  # questions with more than one committed reply

    @property
    def exactly_once(self) -> bool:
        return self.unanswered == 0 and self.answered_twice == 0

    def as_json(self) -> dict[str, int | bool]:
        return {**asdict(self), "exactly_once": self.exactly_once}


def answered(asked: Sequence[str], reply_keys: Iterable[str]) -> Answered:
    """Committed replies (by question id) against the questions asked."""
    replies = Counter(reply_keys)
    return Answered(asked=len(asked), answered=sum(1 for q in asked if replies[q]),
                    unanswered=sum(1 for q in asked if not replies[q]),
                    answered_twice=sum(1 for q in asked if replies[q] > 1))
