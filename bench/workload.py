"""The benchmark's turns: the LoCoMo dev split where present, else synthetic text.

Two layouts of the same texts:

- ingest (`segment_free`): the worker's segmenter closes nothing, so the
  ingest run leaves no enrichment work behind. Each enrichment call costs the
  small CPU model about a minute, so the ~130 sessions of the dev split would
  keep the model server busy for hours after a run that measures something
  else (and would queue ahead of everyone else's segments on a shared stack).
- enrichment (`enrich_workload`): the conversations as they are, sessions
  and times kept, conversations interleaved as if they happened at once.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import zip_longest

from epistream.client.sources import load_locomo
from epistream.contracts.turns import Turn
from epistream.pipeline.segmenter import SegmenterConfig, SegmenterState, close, estimate_tokens, feed
from epistream.pipeline.store.segments import turn_line
from epistream.testing.datasets import locomo_dev

from .produce import Record

# Without LoCoMo: a size close to the dev split, so full runs stay comparable.
SYNTHETIC_DEFAULT = 2700
# Segment-free parts stay this far under the token budget (the estimate is per line, the budget a sum).
PART_SHARE_OF_BUDGET = 0.8

_WORDS = (
    "yesterday we went hiking near the lake and my sister brought her new camera "
    "I started painting again after work because it helps me relax a lot "
    "the adoption agency called about the interview next month so we are nervous "
    "did you finish that book about pottery you were reading last summer "
    "my kids loved the museum trip and we want to go camping in the mountains soon"
).split()


@dataclass(frozen=True)
class Workload:
    source: str  # "locomo-dev" or "synthetic"
    tenant: str
    turns: list[Turn]

    @property
    def texts(self) -> list[str]:
        return [t.text for t in self.turns]

    @property
    def conversations(self) -> list[str]:
        return list(dict.fromkeys(t.conversation_id for t in self.turns))


def load_workload(*, run_id: str, limit: int | None) -> Workload:
    """The run's turns, under a tenant and conversation ids no other run uses (so every row is an insert)."""
    tenant = f"bench-{run_id}"
    path = locomo_dev()
    if path.exists():
        samples = load_locomo(path, tenant=tenant, conversation_prefix=f"bench-{run_id}-")
        turns = _interleave([s.turns for s in samples], limit)
        return Workload("locomo-dev", tenant, turns)
    return Workload("synthetic", tenant, synthetic_turns(tenant, limit or SYNTHETIC_DEFAULT))


def _interleave(conversations: list[list[Turn]], limit: int | None) -> list[Turn]:
    """Cap the count by taking round-robin across conversations, then restore each conversation's order.

    A plain prefix would put a small run's turns all in one conversation, i.e. on one
    Kafka key and one partition, which is not how the full run loads the worker.
    """
    mixed = [t for group in zip_longest(*conversations) for t in group if t is not None]
    kept = {id(t) for t in (mixed if limit is None else mixed[:limit])}
    return [t for conv in conversations for t in conv if id(t) in kept]


def synthetic_turns(tenant: str, count: int, *, conversations: int = 5, seed: int = 7) -> list[Turn]:
    """LoCoMo-like chit-chat (8-40 words a turn), deterministic for a given seed."""
    rng = random.Random(seed)
    start = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    turns = []
    for i in range(count):
        conv = i % conversations
        turns.append(
            Turn(
                tenant=tenant,
                conversation_id=f"{tenant}-synthetic-{conv}",
                turn_id=f"S{i}",
                speaker=("Alex", "Sam")[i % 2],
                text=" ".join(rng.choices(_WORDS, k=rng.randint(8, 40))).capitalize() + ".",
                ts=start + timedelta(minutes=i),
                metadata={"source": "synthetic"},
            )
        )
    return turns


def _by_conversation(turns: Sequence[Turn]) -> list[list[Turn]]:
    groups: dict[str, list[Turn]] = {}
    for t in turns:
        groups.setdefault(t.conversation_id, []).append(t)
    return list(groups.values())


def _proportional_order(groups: Sequence[Sequence[Turn]]) -> list[tuple[int, Turn]]:
    """(group index, turn), every group advancing at the same pace, so all of them end together."""
    keyed = [((i + 0.5) / len(g), gi, t) for gi, g in enumerate(groups) for i, t in enumerate(g)]
    return [(gi, t) for _, gi, t in sorted(keyed, key=lambda k: (k[0], k[1]))]


# --- ingest: the same texts, laid out so the segmenter never closes a segment ---


@dataclass(frozen=True)
class IngestLayout:
    turns: list[Turn]  # in produce order
    records: list[Record]
    parts: int  # conversations after splitting


def segment_free(turns: Sequence[Turn], *, partitions: Sequence[int], max_tokens: int) -> IngestLayout:
    """Rewrite turns so no segment closes while they stream in: no session ids, one second between turns
    (no gap), each conversation split into parts under the token budget.

    Nothing closes by idleness either, as long as every part keeps receiving turns until the end: the
    parts advance at the same pace, and are spread over the partitions by size (the worker reads the
    partitions round-robin). Sealing the tenant right after the run (a tombstone) voids the idle closes
    that would follow. Texts, speakers and turn ids, hence embedding and storage work, are unchanged.
    """
    parts: list[list[Turn]] = []
    for conversation in _by_conversation(turns):
        parts.extend(_split(conversation, max_tokens * PART_SHARE_OF_BUDGET))
    load = dict.fromkeys(partitions, 0)
    partition_of = [0] * len(parts)
    for index in sorted(range(len(parts)), key=lambda i: -len(parts[i])):  # largest first, to the least loaded
        target = min(load, key=lambda p: (load[p], p))
        load[target] += len(parts[index])
        partition_of[index] = target
    ordered = _proportional_order(parts)
    return IngestLayout(
        turns=[t for _, t in ordered],
        records=[Record.of(t, partition_of[gi]) for gi, t in ordered],
        parts=len(parts),
    )


def _split(conversation: list[Turn], limit: float) -> list[list[Turn]]:
    start = conversation[0].ts
    dense = [
        t.model_copy(update={"session_id": None, "ts": start + timedelta(seconds=i)}) for i, t in enumerate(conversation)
    ]
    tokens = [estimate_tokens(turn_line(t.speaker, t.text, t.ts)) for t in dense]
    count = max(1, math.ceil(sum(tokens) / limit))
    target = sum(tokens) / count  # near-equal parts, each under `limit`
    parts: list[list[Turn]] = [[]]
    used = 0
    for turn, n in zip(dense, tokens, strict=True):
        if parts[-1] and used + n > target and len(parts) < count:
            parts.append([])
            used = 0
        parts[-1].append(turn)
        used += n
    suffix = conversation[0].conversation_id
    return [[t.model_copy(update={"conversation_id": f"{suffix}-p{k:02d}"}) for t in p] for k, p in enumerate(parts)]


# --- enrichment: the conversations as they happened ---------------------------


def enrich_workload(
    *, run_id: str, conversations: int | None, turns_per_conversation: int | None
) -> Workload:
    """The first `conversations` of the split, each cut to its first `turns_per_conversation` turns,
    interleaved so they all stream at once and end together."""
    tenant = f"bench-{run_id}-enrich"
    path = locomo_dev()
    if path.exists():
        samples = load_locomo(path, tenant=tenant, conversation_prefix=f"{tenant}-")
        groups, source = [s.turns for s in samples], "locomo-dev"
    else:
        groups, source = _by_conversation(synthetic_turns(tenant, SYNTHETIC_DEFAULT)), "synthetic"
    groups = [g[:turns_per_conversation] for g in groups[:conversations]]
    return Workload(source, tenant, [t for _, t in _proportional_order(groups)])


def expected_segments(turns: Sequence[Turn], config: SegmenterConfig) -> dict[str, int]:
    """Segments per conversation the worker should close for these turns, fed in this order: the
    segmenter's own pure logic, plus the idle close of whatever is left open at the end."""
    counts: dict[str, int] = {}
    for conversation in _by_conversation(turns):
        state, closed = SegmenterState(), 0
        for t in conversation:
            step = feed(
                state, turn_id=t.turn_id, tokens=estimate_tokens(turn_line(t.speaker, t.text, t.ts)), ts=t.ts,
                session_id=t.session_id, config=config,
            )
            state, closed = step.state, closed + len(step.closed)
        closed += len(close(state, "idle", config).closed)
        counts[conversation[0].conversation_id] = closed
    return counts

