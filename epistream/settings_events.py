"""The settings group of memory events (docs/events.md), in its own module: epistream/settings.py is at
its size limit. Listed in epistream.settings' GROUPS and part of `ClientSettings` (a client reads the
events topic; the workers' relay prunes the outbox), with the same flat ``EPISTREAM_*`` names."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class EventSettings(BaseSettings):
    """Memory events: their topic, and how long a published one stays in its outbox."""

    model_config = SettingsConfigDict(env_prefix="EPISTREAM_", env_file=None, frozen=True, extra="ignore")

    topic_events: str = Field(
        "memory.events", description="Memory events (turns stored, segments closed and enriched, facts superseded, "
        "conversations forgotten). With tenant claims checked, each tenant's go to this name, a dot, the tenant.",
    )
    events_keep_s: float = Field(3600.0, ge=0, description="How long a published memory event stays in its outbox.")
