"""The benchmark's turns: the LoCoMo dev split where present, else synthetic text."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import zip_longest
from pathlib import Path

from epistream.contracts import Turn
from epistream.sources import load_locomo

LOCOMO_DEV = Path("..") / "shared" / "data" / "locomo" / "locomo-dev.json"
# Without LoCoMo: a size close to the dev split, so full runs stay comparable.
SYNTHETIC_DEFAULT = 2700

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


def load_workload(root: Path, *, run_id: str, limit: int | None) -> Workload:
    """The run's turns, under a tenant and conversation ids no other run uses (so every row is an insert)."""
    tenant = f"bench-{run_id}"
    path = (root / LOCOMO_DEV).resolve()
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
