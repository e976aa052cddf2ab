"""The broker, how every client connects to it, and the topics with their partitions and retention."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings

from .base import SETTINGS_CONFIG


class KafkaSettings(BaseSettings):
    model_config = SETTINGS_CONFIG

    kafka_bootstrap: str = Field("127.0.0.1:19092", description="Kafka bootstrap servers.")
    kafka_embedded: bool = Field(True, description="Start a local single-node KRaft broker.")
    kafka_controller_port: int = Field(19093, description="Embedded broker's controller port.")
    kafka_version: str = Field("4.4.0", description="Embedded Kafka release (Maven Central): 4.x (default) or 3.9.x.")
    kafka_heap: str = Field("768m", description="Embedded broker's Java heap.")
    # The Kafka clients' own default, and 6 s above the broker's floor (group.min.session.timeout.ms): a
    # killed worker's partitions moved after 61 s under Faust's default of 60 (docs/experiments.md).
    kafka_session_timeout_s: float = Field(
        10.0, ge=6.0, le=300.0,
        description="How long a silent worker keeps its partitions in its consumer group (heartbeats every third of it).",
    )
    kafka_security_protocol: Literal["PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL", "SSL"] = Field(
        "PLAINTEXT", description="How every Kafka client connects: PLAINTEXT, SASL_PLAINTEXT, SASL_SSL or SSL.",
    )
    kafka_sasl_mechanism: Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"] = Field(
        "SCRAM-SHA-512", description="SASL mechanism of the SASL protocols.",
    )
    kafka_username: str | None = Field(None, description="SASL user name (required by the SASL protocols).")
    kafka_password: SecretStr | None = Field(None, description="SASL password (required by the SASL protocols).")
    kafka_ssl_cafile: Path | None = Field(
        None, description="CA bundle that signed the broker's certificate (SSL, SASL_SSL). Unset: the embedded broker's own CA, or the system's for an external broker.",
    )
    topic_turns: str = Field("memory.turns", description="Turns topic (keyed by conversation id).")

    @model_validator(mode="after")
    def _sasl_login(self) -> Self:
        # Refused at start-up with the variables named, not later by aiokafka when a client is built.
        if self.kafka_security_protocol.startswith("SASL_") and not (
            self.kafka_username and self.kafka_password and self.kafka_password.get_secret_value()
        ):
            raise ValueError(
                f"EPISTREAM_KAFKA_SECURITY_PROTOCOL={self.kafka_security_protocol} needs EPISTREAM_KAFKA_USERNAME "
                "and EPISTREAM_KAFKA_PASSWORD"
            )
        return self

    @field_validator("turns_retention_days", "dlq_retention_days", "topic_retention_days")
    @classmethod
    def _retention(cls, value: float) -> float:
        if value != -1 and value <= 0:
            raise ValueError("a positive number of days, or -1 for forever")
        return value

    @property
    def kafka_heartbeat_interval_s(self) -> float:
        """A third of the session timeout: two heartbeats may be lost before a worker is taken for dead."""
        return self.kafka_session_timeout_s / 3

    topic_segments: str = Field("memory.segments", description="Closed segments, the enrich worker's queue.")
    topic_questions: str = Field("memory.questions", description="Questions topic (keyed by question id).")
    topic_answers: str = Field(
        "memory.answers", description="Default reply topic. With tenant claims checked, each tenant's replies go to "
        "a topic of its own: this name, a dot, the tenant.",
    )
    topic_dlq: str = Field("memory.dlq", description="Dead letters: the original bytes with the stage and the reason.")
    topic_forgotten: str = Field(
        "memory.forgotten", description="Compacted topic of forgotten conversations, read by every worker before memory.turns."
    )
    topic_health: str = Field("epistream.health", description="Topic the Kafka health probe writes to and reads back.")
    # -1 (forever) or a positive number of days: Kafka's retention.ms, set on create and on every start.
    turns_retention_days: float = Field(
        -1, description="How long memory.turns and memory.segments (the enrich worker's queue) keep a record, in days "
        "(-1: forever). A rebuild reads only what memory.turns keeps.",
    )
    dlq_retention_days: float = Field(
        14, description="How long memory.dlq keeps a dead letter, in days (-1: forever); a forgotten conversation's "
        "letters go with them.",
    )
    topic_retention_days: float = Field(
        7, description="How long memory.questions and memory.answers keep a record, in days (-1: forever).",
    )
    # 6: one, two or three ingest workers share them evenly (with 4, Faust gave a third worker none).
    turns_partitions: int = Field(6, description="Partitions of memory.turns (keyed by conversation).")
    questions_partitions: int = Field(
        12, ge=1,
        description="Partitions of memory.questions and memory.answers: up to this many answer workers share the "
        "questions (12 divides evenly among 1, 2, 3, 4 or 6 workers; docs/design.md#the-answer-worker).",
    )
