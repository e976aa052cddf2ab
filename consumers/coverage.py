"""The context read's coverage step (issue 41 item 2): the head of the ranking re-picked so the pack covers
the question's several aspects and the sessions they live in, instead of the top of one ranking.

A multi-hop question's evidence lies in several sessions, and the ranking's head gathers around its best
hit (its neighbours, the same day's other turns). After the learned ranker, the candidates that may fit
(``window`` times the budget, in the ranking's order) are picked again greedily, each pick the one of most
value: its relevance (from its place in the ranking, ``1 / (rank_k + place)``: the ranker's order is kept
where nothing else differs; with ``length_power``, per token: times (the head's mean line length / its own)
to that power, a budgeted objective's density), plus ``aspect_bonus`` for each of the question's aspects it is the first to
cover (its content words, the names it gives, the speakers it names: ranking.Asked), minus ``day_penalty``
for each item already picked from its day of its conversation (a session). Values only fall as items are
picked, so a lazy heap finds each best pick without rescoring everything. Tiers stay as the ranker put
them: memory about the question's period first, turns before gists and facts.

Off by default (recipes.Coverage): measured on the budget eval, no setting helped multi-hop or open-domain
on the report split (docs/benchmarks/budget-recall.md). About 0.3 ms a read (median; p95 under 1 ms) when on,
nothing when off.

Pure: nothing here touches the database.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Sequence
from datetime import date

from epistream.models.prompts import estimate_tokens

from .packing import Candidate
from .ranking import Asked, tokens_of
from .retrieval import Coverage

#: The step off: the ranking as it is.
NO_COVERAGE = Coverage()
#: What a packed line adds to its body ("[12] ") and its newline, in tokens.
LINE_OVERHEAD_TOKENS = 3


def aspects(asked: Asked) -> frozenset[str]:
    """The question's aspects: the names it gives, the speakers it names, and its other content words
    (stems; a name's own stem, "pari" of "Paris", is the name)."""
    names = asked.entities | asked.speakers
    return names | {w for w in asked.words if not any(n.startswith(w) for n in names)}


def covered(candidate: Candidate, wanted: frozenset[str], speakers: frozenset[str]) -> frozenset[str]:
    """The aspects ``candidate`` holds: a short one as a word of its text, a longer one (a stem) anywhere in
    it (as ranking's word share reads them), a speaker also by who said it."""
    if not wanted:
        return frozenset()
    text = candidate.text.lower()
    tokens: frozenset[str] | None = None
    held = set()
    for aspect in wanted:
        if len(aspect) < 4:
            tokens = tokens_of(text) if tokens is None else tokens
            if aspect in tokens:
                held.add(aspect)
        elif aspect in text:
            held.add(aspect)
    speaker = str(candidate.fields.get("speaker") or "").lower()
    if speaker in speakers:
        held.add(speaker)
    return frozenset(held)


def _tier(candidate: Candidate, period_first: bool) -> int:
    """Where the ranker put its kind: about the period (when it ranks first), then turns, then the rest."""
    about = period_first and "period" in candidate.fields["scores"]
    return (0 if about else 2) + (0 if candidate.kind == "turn" else 1)


def window_size(ranked: Sequence[Candidate], budget_tokens: int, window: float) -> int:
    """How many of the ranking's head the step reconsiders: those within ``window`` times the budget."""
    limit = budget_tokens * window
    used = 0
    for n, candidate in enumerate(ranked):
        used += estimate_tokens(candidate.body) + LINE_OVERHEAD_TOKENS
        if used > limit:
            return n + 1
    return len(ranked)


def cover(ranked: Sequence[Candidate], asked: Asked, budget_tokens: int, weights: Coverage, *,
          period_first: bool = True) -> list[Candidate]:
    """``ranked`` (deduplicated, best first) with its head re-picked for coverage (see the module doc)."""
    if not weights.on or len(ranked) < 2:
        return list(ranked)
    head = window_size(ranked, budget_tokens, weights.window)
    wanted = aspects(asked)
    held = [covered(c, wanted, asked.speakers) for c in ranked[:head]] if weights.aspect_bonus else []
    days: list[tuple[str, date]] = [(c.conversation_id, c.day) for c in ranked[:head]]
    tiers = [_tier(c, period_first) for c in ranked[:head]]
    seen: set[str] = set()
    picked_in: dict[tuple[str, date], int] = defaultdict(int)

    lengths = [estimate_tokens(c.body) + LINE_OVERHEAD_TOKENS for c in ranked[:head]]
    mean_length = sum(lengths) / head

    def value(n: int) -> float:
        gain = 1.0 / (weights.rank_k + n)
        if weights.length_power:
            gain *= (mean_length / lengths[n]) ** weights.length_power
        if held:
            gain += weights.aspect_bonus * len(held[n] - seen)
        return gain - weights.day_penalty * picked_in[days[n]]

    # (tier, -value, place): the place breaks ties in the ranking's order. Values never rise, so a popped
    # entry whose value still holds is the best pick.
    heap = [(tiers[n], -value(n), n) for n in range(head)]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        tier, stale, n = heapq.heappop(heap)
        now = -value(n)
        if now > stale and heap and (tier, now, n) > heap[0]:
            heapq.heappush(heap, (tier, now, n))
            continue
        order.append(n)
        if held:
            seen |= held[n]
        picked_in[days[n]] += 1
    return [ranked[n] for n in order] + list(ranked[head:])
