"""The fault suite's workload: many conversations with unique turn ids, questions interleaved, a few
invalid records mixed in, all under one tenant per scenario (the run id in every id, so runs never mix).

The plan is the produce order; the stream (:mod:`bench.faults.stream`) sends it at a steady rate
while a scenario injects its fault, and the invariants compare the store with it afterwards.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from epistream.contracts.questions import Mode, Question
from epistream.contracts.turns import Turn

_WORDS = (
    "we walked along the river after dinner and talked about the new job offer in Lisbon "
    "my brother is repainting the kitchen green because the landlord finally agreed "
    "the choir rehearsal moved to Wednesday so I will miss the pottery class again "
    "she adopted two kittens from the shelter last week and named them after rivers"
).split()
_SPEAKERS = ("Ana", "Ben")
T0 = datetime(2025, 3, 3, 18, 0, tzinfo=UTC)

Kind = Literal["turn", "question", "invalid"]


@dataclass(frozen=True)
class Size:
    """How much one scenario streams."""

    conversations: int
    turns_per_conversation: int
    questions: int
    invalid: int
    rate_per_s: float  # records (turns, questions, invalid) sent per second

    @property
    def records(self) -> int:
        return self.conversations * self.turns_per_conversation + self.questions + self.invalid


#: The quick suite: a stream of about 25 s, short enough to run every scenario in well under an hour
#: of model time; each conversation fits one segment (closed idle after its last turn).
QUICK = Size(conversations=4, turns_per_conversation=10, questions=2, invalid=3, rate_per_s=2.0)
FULL = Size(conversations=12, turns_per_conversation=30, questions=8, invalid=8, rate_per_s=3.0)
#: What `make test` runs: the smallest stream that still interleaves conversations and questions.
TINY = Size(conversations=2, turns_per_conversation=5, questions=1, invalid=2, rate_per_s=2.0)


@dataclass(frozen=True)
class Item:
    """One record of the plan, as it goes to Kafka."""

    kind: Kind
    topic: Literal["turns", "questions"]
    key: bytes
    value: bytes
    turn: Turn | None = None
    question: Question | None = None
    why_invalid: str | None = None


@dataclass(frozen=True)
class Workload:
    tenant: str
    plan: list[Item]
    conversations: list[str] = field(default_factory=list)

    @property
    def turns(self) -> list[Turn]:
        return [i.turn for i in self.plan if i.turn is not None]

    @property
    def questions(self) -> list[Question]:
        return [i.question for i in self.plan if i.question is not None]

    @property
    def invalid(self) -> list[Item]:
        return [i for i in self.plan if i.kind == "invalid"]


def scenario_tenant(run_id: str, scenario: str) -> str:
    return f"faults-{run_id}-{scenario}"


def _turn(tenant: str, conversation: str, index: int, rng: random.Random, session: str) -> Turn:
    return Turn(
        tenant=tenant, conversation_id=conversation, turn_id=f"{conversation}-t{index:03d}",
        speaker=_SPEAKERS[index % 2], text=" ".join(rng.choices(_WORDS, k=rng.randint(8, 18))).capitalize() + ".",
        # A minute apart, one session (or two): besides the budget, only a session change and the idle
        # close after the last turn cut a segment, so a clean replay knows every boundary.
        ts=T0 + timedelta(minutes=index), session_id=session, metadata={"index": index},
    )


def _invalid(tenant: str, conversation: str, n: int) -> tuple[bytes, str]:
    """Invalid records of the kinds producers really send: each fails the contract for a stated reason."""
    base = {"tenant": tenant, "conversation_id": conversation, "turn_id": f"{conversation}-bad{n}",
            "speaker": "Ana", "text": "this record is broken", "ts": T0.isoformat()}
    kinds = [
        (b"{not json at all " + conversation.encode(), "invalid JSON"),
        (json.dumps({k: v for k, v in base.items() if k != "ts"}).encode(), "missing field ts"),
        (json.dumps({**base, "speaker": 42}).encode(), "wrong type for speaker"),
        (json.dumps({**base, "colour": "blue"}).encode(), "unknown field"),
        (json.dumps({**base, "ts": "2025-03-03T18:00:00"}).encode(), "timestamp without a zone"),
    ]
    return kinds[n % len(kinds)]


def build(run_id: str, scenario: str, size: Size, *, seed: int = 11, split_sessions: int = 0) -> Workload:
    """The plan: conversations interleaved round-robin, questions and invalid records spread evenly.
    The first `split_sessions` conversations change session half way (a segment closes mid-stream)."""
    rng = random.Random(f"{seed}-{scenario}")
    tenant = scenario_tenant(run_id, scenario)
    conversations = [f"{tenant}-c{i:02d}" for i in range(size.conversations)]
    turns = []
    for i in range(size.turns_per_conversation):
        for conversation in conversations:
            split = conversations.index(conversation) < split_sessions and i >= size.turns_per_conversation // 2
            turn = _turn(tenant, conversation, i, rng, "s2" if split else "s1")
            turns.append(Item("turn", "turns", conversation.encode(), turn.to_bytes(), turn=turn))
    extras: list[Item] = []
    for n in range(size.invalid):
        conversation = conversations[n % len(conversations)]
        value, why = _invalid(tenant, conversation, n)
        extras.append(Item("invalid", "turns", conversation.encode(), value, why_invalid=why))
    for n in range(size.questions):
        conversation = conversations[n % len(conversations)]
        q = Question(question_id=f"{tenant}-q{n:02d}", tenant=tenant, question="What did Ana say about the kittens?",
                     conversation_ids=[conversation], asked_at=T0 + timedelta(days=1), mode=Mode.FAST)
        extras.append(Item("question", "questions", q.question_id.encode(), q.to_bytes(), question=q))
    rng.shuffle(extras)
    plan = list(turns)
    # Spread the extras over the middle of the stream (never first: the fault should meet them).
    step = max(1, len(turns) // (len(extras) + 1))
    for n, extra in enumerate(extras):
        plan.insert(min(len(plan), (n + 1) * step + n), extra)
    return Workload(tenant, plan, conversations)
