"""Where the embedded services keep their state, how they are watched and restarted."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings

from .base import SETTINGS_CONFIG

KAFKA_CA_FILE = "ca.crt"


class SupervisionSettings(BaseSettings):
    """Where the embedded services keep their state, how they are watched and restarted."""

    model_config = SETTINGS_CONFIG

    home: Path = Field(Path(".epistream"), description="State directory: data, logs, pids, caches.")
    supervisor_metrics_port: int = Field(9103, description="The embedded supervisor's /metrics (restarts per service).")
    health_timeout_s: float = Field(10.0, description="How long one health probe may take before it counts as failed.")
    restart_backoff_max_s: float = Field(30.0, description="Longest wait before the supervisor restarts a crashed service.")
    @property
    def state_dir(self) -> Path:
        return self.home.resolve()

    @property
    def kafka_tls_dir(self) -> Path:
        """Where the embedded broker keeps its CA and certificate (epistream.ops.tls writes them)."""
        return self.state_dir / "kafka" / "tls"

    @property
    def kafka_embedded_ca(self) -> Path:
        """The embedded broker's CA, which its clients trust by default: a path only, so a client
        install needs no cryptography package."""
        return self.kafka_tls_dir / KAFKA_CA_FILE
