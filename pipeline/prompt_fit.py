"""Fitting a segment to the extractor's context window: a segment of the token budget plus one
very long turn must not exceed the model's context and fail on every try. The longest turns are
cut first, each to the same length, with a marker that says how much was left out; the raw turns
stay whole (and searchable) in memory.turns."""

from __future__ import annotations

from dataclasses import dataclass

from epistream.contracts.segments import SegmentTurn
from epistream.models.prompts import estimate_tokens

#: estimate_tokens counts four characters a token; tokenizers differ, so only this share is used.
SAFETY = 0.85
#: Room for the chat template's own tokens around the messages.
TEMPLATE_TOKENS = 64


def marker(cut: int) -> str:
    return f" [... truncated {cut} characters]"


@dataclass(frozen=True)
class Fitted:
    turns: list[SegmentTurn]
    #: characters of turn text left out of the prompt (0: the segment fit whole)
    truncated_chars: int
    truncated_turns: tuple[str, ...]


def prompt_budget_chars(*, context_tokens: int, completion_tokens: int, fixed_text: str) -> int:
    """Characters of turn text a prompt may carry beside `fixed_text` (instructions, framing)."""
    tokens = context_tokens - completion_tokens - estimate_tokens(fixed_text) - TEMPLATE_TOKENS
    return max(0, int(tokens * SAFETY) * 4)


def fit_turns(turns: list[SegmentTurn], budget_chars: int, *, line_overhead: int) -> Fitted:
    """`turns` whose texts plus `line_overhead` characters each fit `budget_chars`, cutting the
    longest texts to one common length (the largest that fits)."""
    lengths = [len(t.text) for t in turns]
    if sum(lengths) + line_overhead * len(turns) <= budget_chars:
        return Fitted(list(turns), 0, ())
    room = budget_chars - line_overhead * len(turns)

    def used(cap: int) -> int:
        return sum(n if n <= cap else cap + len(marker(n - cap)) for n in lengths)

    low, high = 0, max(lengths)  # the largest cap whose total fits: binary search
    while low < high:
        cap = (low + high + 1) // 2
        if used(cap) <= room:
            low = cap
        else:
            high = cap - 1
    fitted, cut_total, cut_ids = [], 0, []
    for turn in turns:
        cut = len(turn.text) - low
        if cut > 0:
            fitted.append(turn.model_copy(update={"text": turn.text[:low] + marker(cut)}))
            cut_total += cut
            cut_ids.append(turn.turn_id)
        else:
            fitted.append(turn)
    return Fitted(fitted, cut_total, tuple(cut_ids))
