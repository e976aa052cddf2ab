"""Pure scoring for the LoCoMo evaluation: normalisation, token F1, BLEU-1,
abstention, evidence recall, question sampling and summary statistics.

Normalisation follows the LoCoMo code (snap-research/LoCoMo, task_eval/evaluation.py):
lower case, punctuation removed, the articles a/an/the removed, whitespace
collapsed. (The official script also drops "and" and Porter-stems tokens; we do
not, so our F1 is slightly stricter than theirs on inflected words.)
"""

from __future__ import annotations

import math
import random
import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
ADVERSARIAL = 5

_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
# Phrases by which an answer says it does not know (LoCoMo's own check looks for
# "no information available" and "not mentioned"; the rest are how models say it).
_ABSTAIN = re.compile(
    r"(\bi (?:do not|don't|dont|cannot|can't|could not|couldn't) (?:know|tell|say|answer|find|determine)\b"
    r"|\bnot (?:mentioned|stated|specified|provided|discussed|known|available|enough information)\b"
    r"|\bno (?:information|mention|record|evidence|data|details?)\b"
    r"|\b(?:isn't|is not|wasn't|was not|aren't|are not) (?:mentioned|stated|specified|discussed|known)\b"
    r"|\b(?:doesn't|does not|didn't|did not) (?:say|mention|specify|state)\b"
    r"|\b(?:cannot|can't|can not) be (?:answered|determined)\b"
    r"|\bunanswerable\b|\bunknown\b|\bnot sure\b)",
    re.IGNORECASE,
)


def normalize_answer(text: str) -> str:
    """LoCoMo/SQuAD normalisation: lower, drop punctuation, drop a/an/the, collapse whitespace."""
    lowered = str(text).lower()
    no_punct = lowered.translate(_PUNCTUATION)
    no_articles = _ARTICLES.sub(" ", no_punct)
    return " ".join(no_articles.split())


def tokens(text: str) -> list[str]:
    return normalize_answer(text).split()


def _overlap(prediction: str, gold: str) -> tuple[int, int, int]:
    """(shared tokens counted as multisets, prediction length, gold length), all normalised."""
    pred, ref = tokens(prediction), tokens(gold)
    return sum((Counter(pred) & Counter(ref)).values()), len(pred), len(ref)


def f1_score(prediction: str, gold: str) -> float:
    """Token F1 over multisets of normalised tokens (0 when either side is empty)."""
    same, n_pred, n_ref = _overlap(prediction, gold)
    if same == 0:  # also when either side is empty
        return 0.0
    precision, recall = same / n_pred, same / n_ref
    return 2 * precision * recall / (precision + recall)


def bleu1(prediction: str, gold: str) -> float:
    """BLEU-1 against one reference, as nltk's sentence_bleu(weights=(1, 0, 0, 0)) computes it:
    clipped unigram precision times the brevity penalty exp(1 - r/c) when c < r (1 when c > r)."""
    clipped, c, r = _overlap(prediction, gold)
    if clipped == 0:  # also when either side is empty
        return 0.0
    penalty = 1.0 if c > r else math.exp(1 - r / c)
    return penalty * clipped / c


def says_abstain(text: str) -> bool:
    """The answer text says it does not know, or that the thing is not mentioned."""
    return bool(_ABSTAIN.search((text or "").replace("\u2019", "'")))


def predicted_abstention(answer_text: str, abstained_flag: bool = False) -> bool:
    return bool(abstained_flag) or says_abstain(answer_text)


@dataclass(frozen=True)
class Scores:
    f1: float
    bleu1: float
    abstained: bool


def score_answer(prediction: str, gold: str | None, category: int, *, abstained_flag: bool = False) -> Scores:
    """F1/BLEU-1 against the gold answer; for the adversarial category (no answer
    exists) both are 1 when the system abstained and 0 otherwise, as in LoCoMo."""
    abstained = predicted_abstention(prediction, abstained_flag)
    if category == ADVERSARIAL or gold is None:
        hit = 1.0 if abstained else 0.0
        return Scores(hit, hit, abstained)
    return Scores(f1_score(prediction, gold), bleu1(prediction, gold), abstained)


@dataclass(frozen=True)
class AbstentionStats:
    precision: float | None  # of the predicted abstentions, the share that were adversarial
    recall: float | None  # of the adversarial questions, the share abstained on
    predicted: int
    gold: int
    true_positive: int


def abstention_stats(pairs: Iterable[tuple[bool, bool]]) -> AbstentionStats:
    """From (predicted abstention, gold abstention) pairs."""
    tp = predicted = gold = 0
    for pred, truth in pairs:
        predicted += bool(pred)
        gold += bool(truth)
        tp += bool(pred and truth)
    return AbstentionStats(
        precision=tp / predicted if predicted else None,
        recall=tp / gold if gold else None,
        predicted=predicted, gold=gold, true_positive=tp,
    )


def recall_at_k(gold: Iterable[str], retrieved: Iterable[str]) -> float | None:
    """Share of the gold evidence ids found among the retrieved ids (None without gold)."""
    wanted = set(gold)
    if not wanted:
        return None
    return len(wanted & set(retrieved)) / len(wanted)


T = TypeVar("T")


def sample_by_category(
    items: Sequence[T], category_of, *, categories: Iterable[int] | None = None,  # type: ignore[no-untyped-def]
    limit_per_category: int | None = None, seed: int = 0,
) -> list[T]:
    """Keep the wanted categories, at most `limit_per_category` of each drawn at random
    (seeded, independent per category), returned in their original order."""
    wanted = set(categories) if categories is not None else None
    by_category: dict[int, list[int]] = {}
    for index, item in enumerate(items):
        category = category_of(item)
        if wanted is None or category in wanted:
            by_category.setdefault(category, []).append(index)
    kept: list[int] = []
    for category in sorted(by_category):
        indexes = by_category[category]
        if limit_per_category is not None and len(indexes) > limit_per_category:
            rng = random.Random(f"{seed}:{category}")
            indexes = rng.sample(indexes, limit_per_category)
        kept.extend(indexes)
    return [items[i] for i in sorted(kept)]


def mean(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(sum(kept) / len(kept)) if kept else None


def percentile(values: Iterable[float | None], q: float) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.percentile(kept, q)) if kept else None
