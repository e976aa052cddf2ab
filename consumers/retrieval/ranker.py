"""The context read's learned ranker as data: a logistic regression's standardisation, coefficients and
intercept over the read's FEATURES (computed by consumers/ranking.py), loaded from the JSON file
``python -m bench.train_ranker`` writes and applied in numpy: nothing is unpickled and no training library
is needed to serve. Pure: a file is read, nothing touches the database.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from epistream.errors import SettingsError

#: What the model reads of a candidate, in this order (the shipped file names them; loading checks them).
FEATURES: tuple[str, ...] = (
    "fused", "fused_share", "log_place", "dense_rr", "lexical_rr", "in_dense", "in_lexical",
    "neighbour", "neighbour_after", "source", "speaker_named", "other_speaker", "about",
    "day_share", "day_count", "segment_share", "word_overlap", "entity_overlap", "has_date", "when_date",
    "log_words", "asks", "recency", "self_statement", "self_named", "self_preference",
)

class RankerFileError(SettingsError):
    """A ranker file that cannot be used (EPISTREAM_CONTEXT_RANKER's): unreadable, or not this read's features."""


@dataclass(frozen=True)
class LinearRanker:
    """A logistic regression over standardised FEATURES: score = intercept + sum(coef * (x - mean) / scale)."""

    name: str
    means: tuple[float, ...]
    scales: tuple[float, ...]
    coefficients: tuple[float, ...]
    intercept: float
    #: Memory about the question's period ranks before the rest, as the read without a ranker ranks it.
    period_first: bool = True

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LinearRanker:
        if tuple(data.get("features", ())) != FEATURES:
            raise RankerFileError(f"its features {data.get('features')} are not this read's {list(FEATURES)}")
        try:
            model = cls(name=str(data["name"]), means=tuple(map(float, data["means"])),
                        scales=tuple(map(float, data["scales"])),
                        coefficients=tuple(map(float, data["coefficients"])), intercept=float(data["intercept"]),
                        period_first=bool(data.get("period_first", True)))
        except (KeyError, TypeError, ValueError) as exc:
            raise RankerFileError(f"not a ranker file ({type(exc).__name__}: {exc})") from None
        if not len(model.means) == len(model.scales) == len(model.coefficients) == len(FEATURES):
            raise RankerFileError(f"{len(FEATURES)} means, scales and coefficients are needed")
        if any(s <= 0 for s in model.scales):
            raise RankerFileError("every scale must be positive")
        return model

    @classmethod
    def load(cls, path: Path) -> LinearRanker:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise RankerFileError(f"{path}: {type(exc).__name__}: {exc}") from None
        return cls.from_json(data)

    def scores(self, rows: np.ndarray) -> np.ndarray:
        standard = (rows - np.asarray(self.means)) / np.asarray(self.scales)
        return np.asarray(standard @ np.asarray(self.coefficients) + self.intercept)
