"""The context read's learned ranker at work: what it reads of each candidate (``features``: the one feature
function, which ``python -m bench.train_ranker`` imports too) and the reordering by the model
(retrieval/ranker.py's ``LinearRanker``: plain data applied in numpy).

The ranker reorders the read's deduplicated candidates (packing.rank's order, its place one of the
features) before they are packed. Turns are ordered by the model's score; gists and facts keep their own
order after the turns (recipes.Structured.weight 0 ranks them so too). Whether the question's period still
ranks first is the model's ``period_first``: true in the shipped one, the read's documented order (learned
as a feature instead, ``about``, it read no better: docs/benchmarks/budget-recall.md).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .packing import Candidate
from .retrieval.ranker import FEATURES, LinearRanker

_WORD = re.compile(r"[a-z0-9]+")
_CAPITALISED = re.compile(r"(?<![.?!]\s)(?<!^)\b[A-Z][a-z]+")
# Function words and the question's own wording: they carry no topic.
_STOP = frozenset("""
a an and are as at be been being but by can could did do does doing for from had has have he her hers him his how
i if in into is it its just me my of on or our she so some than that the their them then there these they this
those to too up was we were what when where which who whom why will with would you your about any also
""".split())
# Dates said in a turn, absolute or relative, as words (cheaper than resolving them: every candidate is read).
_DATE_WORDS = frozenset("""
january february march april may june july august september october november december jan feb mar apr jun jul aug
sep sept oct nov dec monday tuesday wednesday thursday friday saturday sunday weekend week weeks month months year
years yesterday today tonight tomorrow ago
""".split())
_YEAR = re.compile(r"\b(?:19|20)\d\d\b")
_YEAR_DIGITS = re.compile(r"(?:19|20)\d\d")  # a cheap first test (rarely true): the bounded pattern only then
#: A word is a run of a-z, 0-9 and the apostrophe: split in one C pass, every other byte (and what is not
#: ASCII, encoded as "?") made a space (three times cheaper than the pattern [a-z0-9']+, the same words).
_NOT_TOKEN = bytes(b if chr(b) in "abcdefghijklmnopqrstuvwxyz0123456789'" else 32 for b in range(256))
_WHEN = re.compile(r"^\s*when\b|\bwhat (?:year|month|day|date|time)\b|\bhow long\b", re.IGNORECASE)
# Issue 41 item 3: what people say about themselves ("I love...", "my favourite...", "I have always..."): a
# first-person word and a word of liking in the same turn.
_FIRST_PERSON = frozenset("i i'm i've i'd my me myself".split())
_LIKING = frozenset("""
love loves loved loving prefer prefers preferred favorite favourite favorites favourites always enjoy enjoys enjoyed
like likes liked passion passionate dream dreams hate hates value values believe proud fan
""".split())
# A question about a person's traits, preferences or likely choices (LoCoMo's open-domain questions).
PREFERENCE_QUESTION = re.compile(
    r"\b(?:would|likely|might|favou?rite|prefer\w*|enjoy\w*|interest\w*|personality|traits?|considered|"
    r"what kind|what type|hobb\w+|lov\w*|likes?|passion\w*)\b", re.IGNORECASE)


def tokens_of(lowered: str) -> frozenset[str]:
    """The words of lower-cased text."""
    return frozenset(lowered.encode("ascii", "replace").translate(_NOT_TOKEN).decode("ascii").split())


def self_statement(text: str) -> bool:
    """Whether a turn says something about its speaker's likes, habits or beliefs."""
    return _self_statement(tokens_of(text.lower()))


def _self_statement(tokens: frozenset[str]) -> bool:
    return not tokens.isdisjoint(_LIKING) and not tokens.isdisjoint(_FIRST_PERSON)


def stem(word: str) -> str:
    """A crude stem: enough for "hiking" to meet "hike" and "paintings" "painting"."""
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def content_words(text: str) -> frozenset[str]:
    return frozenset(stem(w) for w in _WORD.findall(text.lower()) if w not in _STOP)


@dataclass(frozen=True)
class Asked:
    """What the features read of the question: its searched text's content words, the names it gives
    (capitalised words besides the speakers), the speakers it names, whether it asks for a date and
    whether it asks about a person's preferences or traits."""

    words: frozenset[str]
    entities: frozenset[str]
    speakers: frozenset[str]
    when: bool
    preference: bool

    @classmethod
    def of(cls, question: str, search_text: str, speakers: Sequence[str]) -> Asked:
        named = frozenset(s.lower() for s in speakers)
        entities = frozenset(w.lower() for w in _CAPITALISED.findall(question) if w.lower() not in named
                             and w.lower() not in _STOP)
        return cls(words=content_words(search_text), entities=entities, speakers=named,
                   when=bool(_WHEN.search(question)), preference=bool(PREFERENCE_QUESTION.search(question)))


def _share(words: frozenset[str], text: str, tokens: frozenset[str]) -> float:
    """The share of ``words`` the lower-cased ``text`` holds: a short word as a token, a longer one (a stem:
    "hik", "paint") anywhere in it (a substring test is a hundred times cheaper than a pattern)."""
    if not words:
        return 0.0
    return sum(1 for w in words if (w in tokens if len(w) < 4 else w in text)) / len(words)


def _reciprocal(rank: float | None, k: float = 30.0) -> float:
    return 0.0 if rank is None else 1.0 / (k + rank)


def features(ranked: Sequence[Candidate], asked: Asked) -> np.ndarray:
    """One row of FEATURES per candidate (in ``ranked``'s order; gists and facts get rows too, read as turns
    would be, though the read does not score them). About 20 microseconds a candidate: it runs on every read."""
    fields = [c.fields for c in ranked]
    fused = [c.score - f["scores"].get("period", 0.0) for c, f in zip(ranked, fields, strict=True)]
    top = max(fused, default=0.0) or 1.0
    days = [(f["conversation_id"], f["time"].date()) for f in fields]
    segments = [(f["conversation_id"], f.get("segment_id")) for f in fields]
    day_sum: dict[tuple[str, Any], float] = defaultdict(float)
    day_count: dict[tuple[str, Any], int] = defaultdict(int)
    segment_max: dict[tuple[str, Any], float] = {}
    for day, segment, score in zip(days, segments, fused, strict=True):
        day_sum[day] += score
        day_count[day] += 1
        segment_max[segment] = max(score, segment_max.get(segment, score))
    times = [f["time"].timestamp() for f in fields]
    first, span = (min(times), (max(times) - min(times)) or 1.0) if times else (0.0, 1.0)
    speakers, words, entities = asked.speakers, asked.words, asked.entities
    rows = []
    for n, f in enumerate(fields):
        scores, score, day = f["scores"], fused[n], days[n]
        text = f["text"].lower()
        tokens = tokens_of(text)
        named = bool(speakers) and str(f.get("speaker") or "").lower() in speakers
        about_self = _self_statement(tokens)
        has_date = (not tokens.isdisjoint(_DATE_WORDS)
                    or (_YEAR_DIGITS.search(text) is not None and _YEAR.search(text) is not None))
        rows.append((
            score, score / top, math.log1p(n), _reciprocal(scores.get("dense_rank")),
            _reciprocal(scores.get("lexical_rank")), float("dense_rank" in scores), float("lexical_rank" in scores),
            float("neighbour_of" in scores), scores.get("after_seed", 0.0),
            float("source_of_gist" in scores or "source_of_fact" in scores),
            float(named), float(bool(speakers) and not named), float("period" in scores),
            day_sum[day] / top, math.log1p(day_count[day]), segment_max[segments[n]] / top,
            _share(words, text, tokens), _share(entities, text, tokens),
            float(has_date), float(has_date and asked.when), math.log1p(text.count(" ") + 1), float("?" in text),
            (times[n] - first) / span, float(about_self), float(about_self and named),
            float(about_self and asked.preference),
        ))
    return np.array(rows, dtype=np.float64).reshape(len(ranked), len(FEATURES))


def reorder(model: LinearRanker, ranked: Sequence[Candidate], asked: Asked) -> list[Candidate]:
    """``ranked`` (deduplicated, best first) in the model's order: turns by its score; gists and facts keep
    their order after the turns of their standing towards the question's period (with ``period_first``) or
    after every turn."""
    if not ranked:
        return []
    scores = model.scores(features(ranked, asked))

    def key(n: int) -> tuple[bool, bool, float, int]:
        c = ranked[n]
        about = model.period_first and "period" in c.fields["scores"]
        turn = c.kind == "turn"
        return (not about, not turn, -float(scores[n]) if turn else 0.0, n)

    return [ranked[n] for n in sorted(range(len(ranked)), key=key)]
