"""Fusing the router's pathway scores into one score per segment (pure maths).

Weighted min-max: each pathway's scores normalised to [0, 1] and weighted; reciprocal
rank: 1 / (k + rank) summed over pathways. (Fused turn search does its reciprocal-rank
fusion in SQL, on the same formula: consumers/retrieval/turns.py.)
"""

from __future__ import annotations

from .recipes import SEGMENT_PATHWAYS, SegmentRecipe

Scores = dict[str, dict[str, float]]  # pathway -> segment_id -> score


def reciprocal_rank(rank: int, k: int) -> float:
    return 1.0 / (k + rank)


def min_max(values: dict[str, float]) -> dict[str, float]:
    """Scores scaled to [0, 1]; all equal counts as 1."""
    low, high = min(values.values()), max(values.values())
    return {key: 1.0 if high == low else (value - low) / (high - low) for key, value in values.items()}


def fuse(scores: Scores, recipe: SegmentRecipe) -> dict[str, float]:
    """Combine the recipe's pathways' scores: weighted min-max, or reciprocal rank."""
    fused: dict[str, float] = {}
    weights = dict(zip(SEGMENT_PATHWAYS, recipe.weights, strict=True))
    for pathway in recipe.pathways:
        pathway_scores = scores.get(pathway, {})
        if not pathway_scores:
            continue
        if recipe.fusion == "rrf":
            ranked = sorted(pathway_scores, key=lambda s: (-pathway_scores[s], s))
            for rank, segment_id in enumerate(ranked, start=1):
                fused[segment_id] = fused.get(segment_id, 0.0) + reciprocal_rank(rank, recipe.rrf_k)
            continue
        for segment_id, normalised in min_max(pathway_scores).items():
            fused[segment_id] = fused.get(segment_id, 0.0) + weights[pathway] * normalised
    return fused
