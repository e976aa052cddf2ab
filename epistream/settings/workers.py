"""The workers' consumer groups, batches and metrics ports, and how the answer worker waits."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

from .base import SETTINGS_CONFIG


class WorkerSettings(BaseSettings):
    model_config = SETTINGS_CONFIG

    indexer_group: str = Field("epistream-indexer", description="Faust app id (consumer group) of the indexer.")
    ingest_batch: int = Field(128, description="Turns the ingest agent takes at once.")
    ingest_batch_within_s: float = Field(0.2, description="Longest wait to fill a batch.")
    # 128, the batch: on 2 cores smaller chunks measured slower (docs/experiments.md), since each chunk is
    # length-sorted on its own and its ONNX batches pad to their longest text.
    ingest_chunk: int = Field(
        128, ge=1, le=100_000,
        description="Turns of a batch embedded and stored per transaction; the next chunk is embedded while one "
        "is written. At least the batch (the default): one transaction, no overlap; smaller chunks pad ONNX "
        "batches more.",
    )
    watermark_gap_grace_s: float = Field(
        60.0, gt=0, le=3600,
        description="How long a gap under the read-your-own-writes mark (records never stored while later ones "
        "were) may last before the ingest worker reads it from the log: sought back to when records are there, "
        "filled when only transaction markers are (pipeline/gaps.py). Reads waiting on it say incomplete meanwhile.",
    )
    metrics_host: str = Field("127.0.0.1", description="Address /metrics binds to (0.0.0.0 in containers).")
    ingest_metrics_port: int = Field(9101, description="The ingest worker's /metrics.")
    enrich_group: str = Field("epistream-enrich", description="Faust app id (consumer group) of the enrich worker.")
    enrich_metrics_port: int = Field(9104, description="The enrich worker's /metrics.")
