"""Deep mode's reading windows: what each assistant reads.

E-mem's assistants read whole segments the router ranks (about 23 turns each). Measured at equal
budgets (bench.budget_recall, ``router`` against ``deep_windows``), whole segments spend the budget
on turns around the wrong places. A window is instead a run of turns around one of the best turns
of the fused search (consumers/best_turns.py): ``each_side`` turns before and after it in its
conversation, within the question's time window. Windows that share a turn are one window. They
are taken best seed first while they fit ``budget_tokens`` (counted like a context's turns,
``speaker: text``), at most ``windows`` of them: one assistant read each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from psycopg import AsyncConnection

from epistream.models.prompts import estimate_tokens

from .assistants import SegmentText, SegmentTurnText
from .retrieval import OPEN_SUFFIX, RetrievedTurn, WindowRecipe, neighbour_turns


@dataclass
class Window:
    conversation_id: str
    segment_id: str  # the first seed's segment (its conversation's open segment when it has none)
    turns: dict[str, RetrievedTurn] = field(default_factory=dict)  # turn id -> turn

    @property
    def tokens(self) -> int:
        return sum(turn_tokens(t) for t in self.turns.values())

    def text(self) -> SegmentText:
        """What an assistant reads; each turn keeps its own segment, for the evidence it is quoted in."""
        ordered = sorted(self.turns.values(), key=lambda t: (t.ts, t.turn_id))
        return SegmentText(self.segment_id, self.conversation_id,
                           [SegmentTurnText(t.turn_id, t.speaker, t.text, t.ts, segment_of(t)) for t in ordered])


def segment_of(turn: RetrievedTurn) -> str:
    """The turn's segment, or its conversation's open segment while it is in no closed one."""
    return turn.segment_id or f"{turn.conversation_id}{OPEN_SUFFIX}"


def turn_tokens(turn: RetrievedTurn) -> int:
    return estimate_tokens(f"{turn.speaker}: {turn.text}")


def merge_windows(seeds: Sequence[RetrievedTurn], around: dict[int, list[RetrievedTurn]],
                  recipe: WindowRecipe) -> list[Window]:
    """Best seed first: its window (``around[i]``: the turns beside seed ``i``, 1-based) joins a
    window it shares a turn with, or starts one, while the budget and the window count allow."""
    windows: list[Window] = []
    used = 0
    for n, seed in enumerate(seeds, start=1):
        run = {t.turn_id: t for t in [seed, *around.get(n, [])]}
        mine = [w for w in windows if w.conversation_id == seed.conversation_id]
        joined = next((w for w in mine if run.keys() & w.turns.keys()), None)
        taken = {k for w in mine for k in w.turns}
        new = {k: t for k, t in run.items() if k not in taken}  # a turn is read once, in the first window holding it
        cost = sum(turn_tokens(t) for t in new.values())
        if used + cost > recipe.budget_tokens or (joined is None and len(windows) >= recipe.windows):
            continue
        if joined is None:
            joined = Window(seed.conversation_id, segment_of(seed))
            windows.append(joined)
        joined.turns.update(new)
        used += cost
    return windows


async def reading_windows(conn: AsyncConnection, *, tenant: str, seeds: Sequence[RetrievedTurn], recipe: WindowRecipe,
                          start: datetime | None = None, end: datetime | None = None) -> list[Window]:
    """The windows around the best ``recipe.seeds`` of ``seeds``, in the order of their best seed.
    Run inside ``tenant_scope(conn, tenant)``."""
    tried = list(seeds[: recipe.seeds])
    beside = await neighbour_turns(conn, tenant=tenant, seeds=tried, each_side=recipe.each_side, start=start, end=end)
    around: dict[int, list[RetrievedTurn]] = {}
    for neighbour in beside:
        around.setdefault(neighbour.seed, []).append(neighbour.turn)
    return merge_windows(tried, around, recipe)
