"""Memory events (docs/events.md): part of `ClientSettings`, since a client reads the events topic; the
workers' relay prunes the outbox."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

from .base import SETTINGS_CONFIG


class EventSettings(BaseSettings):
    """Memory events: their topic, and how long a published one stays in its outbox."""

    model_config = SETTINGS_CONFIG

    topic_events: str = Field(
        "memory.events", description="Memory events (turns stored, segments closed and enriched, facts superseded, "
        "conversations forgotten). With tenant claims checked, each tenant's go to this name, a dot, the tenant.",
    )
    events_relay_every_s: float = Field(
        5.0, gt=0, le=3600, description="How often a worker's relay looks in the outbox for events others wrote (a CLI "
        "forget, a crashed worker's rows); its own are relayed right after they commit.",
    )
    events_keep_s: float = Field(3600.0, ge=0, description="How long a published memory event stays in its outbox.")
