"""Segmentation and enrichment, the indexer's slow path."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

from .base import SETTINGS_CONFIG


class SegmentSettings(BaseSettings):
    """Segmentation and enrichment (the indexer's slow path)."""

    model_config = SETTINGS_CONFIG

    segment_max_tokens: int = Field(4096, description="Token budget that closes a segment.")
    segment_overlap: float = Field(0.10, description="Share of the budget carried into the next segment.")
    segment_max_gap_s: float = Field(6 * 3600, description="A longer gap between turns closes the segment.")
    segment_idle_s: float = Field(300.0, description="Close a conversation's open segment after this idle time.")
    segment_check_every_s: float = Field(5.0, description="How often idle segments and the segment outbox are checked (the housekeeping tick).")
    enrich_concurrency: int = Field(1, description="Segments enriched at once per worker.")
    enrich_retry_every_s: float = Field(
        5.0, description="During a model outage: first pause before a probe call, and how often waiting segments are retried."
    )
    enrich_pause_max_s: float = Field(300.0, description="Longest pause between probe calls while the model stays down.")
    similar_threshold: float | None = Field(
        None, description="Cosine similarity above which gists get SIMILAR edges. Unset: the embedding model card's."
    )
    entity_merge_threshold: float | None = Field(
        None, description="Name-embedding similarity that merges two entities. Unset: the embedding model card's."
    )
