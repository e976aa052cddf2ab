"""Okapi BM25 over short documents, in process (the eval's lexical turn baseline; no dependency)."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
# Function words that carry no topic: ranking on them only adds noise.
STOP_WORDS = frozenset("""
a an and are as at be been but by did do does for from had has have he her him his how i if in into is it its
me my of on or our she so than that the their them then there they this to was we were what when where which
who whom why will with would you your
""".split())


def words(text: str) -> list[str]:
    """Lower-case word tokens minus stop words."""
    return [w for w in _WORD.findall(text.lower()) if w not in STOP_WORDS]


class BM25:
    """Okapi BM25 (k1, b) with the non-negative idf log(1 + (N - n + 0.5) / (n + 0.5))."""

    def __init__(self, documents: Sequence[str], *, k1: float = 1.5, b: float = 0.75) -> None:
        self._docs = [Counter(words(d)) for d in documents]
        self._lengths = [sum(c.values()) for c in self._docs]
        self._average = (sum(self._lengths) / len(self._lengths)) if self._lengths else 0.0
        frequency: Counter[str] = Counter()
        for doc in self._docs:
            frequency.update(doc.keys())
        n = len(self._docs)
        self._idf = {w: math.log(1 + (n - f + 0.5) / (f + 0.5)) for w, f in frequency.items()}
        self._k1, self._b = k1, b

    def scores(self, query: str) -> list[float]:
        terms = words(query)
        out = []
        for doc, length in zip(self._docs, self._lengths, strict=True):
            norm = self._k1 * (1 - self._b + self._b * length / self._average) if self._average else self._k1
            score = 0.0
            for term in terms:
                tf = doc.get(term)
                if tf:
                    score += self._idf[term] * tf * (self._k1 + 1) / (tf + norm)
            out.append(score)
        return out
