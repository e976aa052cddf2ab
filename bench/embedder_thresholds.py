"""The similarity thresholds of each embedding model card, derived from MiniLM's hand-set ones.

A threshold means "this close counts as the same thing". Cosines are not comparable across models
(e5's sit in 0.7-1.0), so a card's threshold is the one that makes the same share of decisions on
the same data: over the LoCoMo dev split's turns (for SIMILAR gist edges) and the capitalised names
in them (for entity merging), each text's nearest-neighbour cosine under MiniLM gives the share
of texts above MiniLM's threshold; a card's threshold is the same quantile of its own
nearest-neighbour cosines. Prints one JSON object; the cards in epistream/settings/embedder_cards.py carry
the rounded figures.

    python -m bench.embedder_thresholds [LOCOMO_JSON]   # default: $LOCOMO_DEV, else the shared split
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

from epistream.client.sources import load_locomo
from epistream.models.embeddings import Embedder
from epistream.settings.embedder_cards import CARDS
from epistream.settings.processes import Settings
from epistream.testing.datasets import locomo_dev

REFERENCE = "all-minilm-l6-v2-int8"
NAME = re.compile(r"\b[A-Z][a-z]+(?:\s[A-Z][a-z]+)*\b")


def nearest_cosines(vectors: np.ndarray) -> np.ndarray:
    sims = vectors @ vectors.T
    np.fill_diagonal(sims, -1.0)
    return sims.max(axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", nargs="?", type=Path, default=locomo_dev())
    parser.add_argument("--turns", type=int, default=3000, help="turns sampled (the same for every card)")
    args = parser.parse_args()
    turns = [t.text for s in load_locomo(args.path) for t in s.turns]
    texts = [turns[i] for i in np.random.default_rng(0).choice(len(turns), min(args.turns, len(turns)), replace=False)]
    names = sorted({m for t in turns for m in NAME.findall(t)})
    reference = CARDS[REFERENCE]
    near = {}
    for name in CARDS:
        embedder = Embedder.from_settings(Settings(embedding_model=name))
        near[name] = (nearest_cosines(embedder.embed(texts)), nearest_cosines(embedder.embed(names)))
    shares = (float((near[REFERENCE][0] > reference.similar_threshold).mean()),
              float((near[REFERENCE][1] > reference.entity_merge_threshold).mean()))
    result = {"texts": len(texts), "names": len(names),
              "share_above": {"similar": shares[0], "entity_merge": shares[1]}, "cards": {}}
    for name, (text_near, name_near) in near.items():
        result["cards"][name] = {"similar_threshold": round(float(np.quantile(text_near, 1 - shares[0])), 3),
                                 "entity_merge_threshold": round(float(np.quantile(name_near, 1 - shares[1])), 3)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
