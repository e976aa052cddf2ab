"""The answer workers: their consumer group, their metrics port, and how long a read waits for its own writes."""

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
