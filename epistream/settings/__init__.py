"""Typed settings, read from ``EPISTREAM_*`` environment variables: one module per group.

One settings object is built per process in ``main()`` (through :func:`load_settings`, which names
each bad variable) and passed down; nothing else reads the environment. The groups are classes of
their own (Kafka, the database, the models, segments, retrieval, the workers, answering, tracing,
security, supervision, MCP, events); :class:`Settings` is the workers' union, :class:`ClientSettings`
the few a client needs. The variables keep flat names (``EPISTREAM_ROUTER_TOP_K``).

This face names every group for those who import from ``epistream.settings``; the project's own code
imports from the modules (``epistream.settings.processes``), and callers of the library find
``ClientSettings`` and ``load_settings`` in ``epistream`` itself."""

from __future__ import annotations

from epistream.errors import SettingsError

from .answering import AnswerSettings
from .base import ENV_PREFIX, SETTINGS_CONFIG
from .database import PostgresSettings
from .events import EventSettings
from .kafka import KafkaSettings
from .mcp import McpSettings
from .models import JsonMode, ModelSettings
from .processes import GROUPS, ClientSettings, McpServerSettings, Settings, load_settings
from .retrieval import RetrievalSettings
from .security import SecuritySettings
from .segments import SegmentSettings
from .supervision import KAFKA_CA_FILE, SupervisionSettings
from .tracing import TracingSettings
from .workers import WorkerSettings

__all__ = [
    "AnswerSettings",
    "ClientSettings",
    "ENV_PREFIX",
    "EventSettings",
    "GROUPS",
    "JsonMode",
    "KAFKA_CA_FILE",
    "KafkaSettings",
    "McpServerSettings",
    "McpSettings",
    "ModelSettings",
    "PostgresSettings",
    "RetrievalSettings",
    "SETTINGS_CONFIG",
    "SecuritySettings",
    "SegmentSettings",
    "Settings",
    "SettingsError",
    "SupervisionSettings",
    "TracingSettings",
    "WorkerSettings",
    "load_settings",
]
