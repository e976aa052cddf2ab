"""What `epistream mcp` loads: a client's settings (Kafka, the tenant-claim secret, the embedded broker's
CA) and its own group; no database, no model."""

from __future__ import annotations

from ..settings import ClientSettings
from ..settings_mcp import McpSettings


class McpServerSettings(ClientSettings, McpSettings):
    model_config = ClientSettings.model_config
