"""Tracing's one setting of its own: OpenTelemetry itself is configured by the standard ``OTEL_*``
variables (docs/tracing.md); this says whether spans may carry text."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

from .base import SETTINGS_CONFIG


class TracingSettings(BaseSettings):
    model_config = SETTINGS_CONFIG

    trace_texts: bool = Field(False, description="Spans carry questions, prompts, completions (docs/tracing.md).")
