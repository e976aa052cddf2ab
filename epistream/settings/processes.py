"""What each process loads: the groups in documentation order, the client's and the workers' unions,
and :func:`load_settings`, which names each bad variable."""

from __future__ import annotations

from typing import TypeVar, overload

from pydantic import ValidationError
from pydantic_settings import BaseSettings

from epistream.errors import SettingsError

from .answering import AnswerSettings
from .base import ENV_PREFIX, SETTINGS_CONFIG
from .database import PostgresSettings
from .events import EventSettings
from .kafka import KafkaSettings
from .mcp import McpSettings
from .models import ModelSettings
from .retrieval import RetrievalSettings
from .security import SecuritySettings
from .segments import SegmentSettings
from .supervision import SupervisionSettings
from .tracing import TracingSettings
from .workers import WorkerSettings

#: The groups in the order documentation lists them.
GROUPS: tuple[type[BaseSettings], ...] = (
    KafkaSettings, PostgresSettings, ModelSettings, SegmentSettings, RetrievalSettings, WorkerSettings, AnswerSettings,
    TracingSettings, SecuritySettings, SupervisionSettings, McpSettings, EventSettings,
)


class ClientSettings(KafkaSettings, SecuritySettings, SupervisionSettings, EventSettings):
    """What a client needs: the broker, its topics, the tenant-claim secret of the operator's tools,
    and the home where an embedded broker keeps its CA."""

    model_config = SETTINGS_CONFIG


class Settings(ClientSettings, PostgresSettings, ModelSettings, SegmentSettings, RetrievalSettings, WorkerSettings,
               AnswerSettings, TracingSettings):
    """Every setting of one process: the union of the groups."""

    model_config = SETTINGS_CONFIG

    def with_overrides(self, **values: object) -> Settings:
        return self.model_copy(update=values)

    @property
    def similar_cutoff(self) -> float:
        """The gist SIMILAR-edge threshold: set, or the embedding model card's."""
        return self.embedder_card.similar_threshold if self.similar_threshold is None else self.similar_threshold

    @property
    def entity_merge_cutoff(self) -> float:
        return (self.embedder_card.entity_merge_threshold if self.entity_merge_threshold is None
                else self.entity_merge_threshold)



class McpServerSettings(ClientSettings, McpSettings):
    """What `epistream mcp` loads: a client's settings (Kafka, the tenant-claim secret, the embedded
    broker's CA) and its own group; no database, no model."""

    model_config = SETTINGS_CONFIG


AnySettings = TypeVar("AnySettings", bound=BaseSettings)


@overload
def load_settings() -> Settings: ...


@overload
def load_settings(kind: type[AnySettings]) -> AnySettings: ...


def load_settings(kind: type[BaseSettings] = Settings) -> BaseSettings:
    """The process's settings (all of them, or a group such as :class:`ClientSettings`), or a SettingsError
    naming each bad variable: bad configuration stops a process at start-up, not at its first question."""
    try:
        return kind()
    except ValidationError as exc:
        # A model validator's error has no field (loc is empty): its message names the variables itself.
        problems = [f"{ENV_PREFIX}{str(err['loc'][0]).upper()}: {err['msg']}" if err["loc"] else err["msg"]
                    for err in exc.errors()]
        raise SettingsError("invalid configuration:\n  " + "\n  ".join(problems)) from None
