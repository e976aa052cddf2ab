"""The router: which segments should an assistant read for this question?

The retrieval package scores segments on three pathways (summary, dense, lexical;
consumers/retrieval/segments.py) and fuses them as the recipe says
(consumers/retrieval/fusion.py). The router decides: the best ``top_k`` by fused
score, plus any segment a turn matching every keyword force-includes, each with
its turn ids (an open segment: the conversation's turns not yet in a closed one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from psycopg import AsyncConnection

from .retrieval import (
    OPEN_SUFFIX,
    SEGMENT_PATHWAYS,
    SegmentRecipe,
    fuse,
    route_params,
    score_segments,
    segment_turn_ids,
)
from .timefilter import DateRange


@dataclass(frozen=True)
class RoutedSegment:
    segment_id: str
    conversation_id: str
    turn_ids: tuple[str, ...]
    score: float
    pathway_scores: dict[str, float] = field(default_factory=dict)
    forced: bool = False

    @property
    def is_open(self) -> bool:
        return self.segment_id.endswith(OPEN_SUFFIX)


def select(fused: dict[str, float], forced: set[str], top_k: int) -> list[str]:
    """The top-k by fused score, plus any force-included segment beyond them."""
    ranked = sorted(fused, key=lambda s: (-fused[s], s))
    chosen = ranked[:top_k]
    chosen += [s for s in ranked[top_k:] if s in forced][:top_k]
    return chosen


async def route(
    conn: AsyncConnection,
    *,
    tenant: str,
    question: str,
    vector: np.ndarray,
    conversation_ids: list[str] | None,
    recipe: SegmentRecipe,
    window: DateRange | None = None,
) -> list[RoutedSegment]:
    """Activated segments, best first. Run inside `tenant_scope(conn, tenant)`."""
    params = route_params(tenant=tenant, question=question, vector=vector, conversation_ids=conversation_ids,
                          recipe=recipe, window=window)
    found = await score_segments(conn, params, recipe)
    fused = fuse(found.scores, recipe)
    chosen = select(fused, found.forced, recipe.top_k)
    turn_ids = await segment_turn_ids(conn, params, chosen, found)
    return [
        RoutedSegment(
            segment_id=s, conversation_id=found.conversation.get(s, s.rsplit("#", 1)[0]),
            turn_ids=turn_ids.get(s, ()), score=round(fused[s], 6),
            pathway_scores={p: round(found.scores[p][s], 6) for p in SEGMENT_PATHWAYS if s in found.scores[p]},
            forced=s in found.forced,
        )
        for s in chosen
    ]
