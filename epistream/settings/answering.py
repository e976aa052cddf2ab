"""The answer workers: their consumer group, their metrics port, how many questions each answers at once,
and how long a read waits for its own writes."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

from .base import SETTINGS_CONFIG


class AnswerSettings(BaseSettings):
    model_config = SETTINGS_CONFIG

    answer_group: str = Field("epistream-answer", description="Consumer group of the answer workers.")
    answer_metrics_port: int = Field(9102, description="The answer worker's /metrics.")
    read_after_timeout_s: float = Field(
        5.0, gt=0, le=300,
        description="Longest wait of the answer worker for a question's `after` positions to be stored; past it "
        "the read goes ahead and its reply says it is incomplete (docs/read-your-writes.md).",
    )
    answer_read_concurrency: int = Field(
        8, ge=1, le=256,
        description="Questions that call no model (`context` reads, listings) one answer worker reads at once. "
        "A lane of their own: a read never waits for a slot behind a model call.",
    )
    answer_model_concurrency: int = Field(
        2, ge=1, le=64,
        description="Questions that call a model (fast, deep, agentic, auto) one answer worker answers at once. "
        "Each deep question fans out to EPISTREAM_ASSISTANT_CONCURRENCY assistant calls of its own.",
    )
    answer_max_in_flight: int = Field(
        1_000, ge=1, le=10_000,
        description="Questions one answer worker holds read and not yet published (waiting for their positions, "
        "for a slot, or answering): a memory bound, far above what the lanes answer at once, so a backlog of "
        "model questions leaves room for reads; past it the worker stops fetching until some are published.",
    )
