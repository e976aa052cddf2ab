"""The composition root's parts: every process builds its model clients here, from its settings,
so a role's endpoint, model, timeout, retries and restart wait are decided in one place.
(The Postgres pool is `epistream.db.create_pool`; the Kafka producer `epistream.kafka_io.create_producer`.)"""

from __future__ import annotations

from typing import Literal

from .llm import ModelClient, create_client
from .metrics import Metrics
from .settings import JsonMode, Settings

Role = Literal["master", "extractor", "assistant", "judge"]


def model_client(
    settings: Settings,
    role: Role,
    metrics: Metrics,
    *,
    base_url: str | None = None,
    model: str | None = None,
    timeout_s: float | None = None,
    json_mode: JsonMode | None = None,
) -> ModelClient:
    """One role's client. The role picks the defaults: the master uses the LLM endpoint, the
    extractor its own endpoint, model and longer timeout, an assistant the endpoint it is given."""
    if role == "extractor":
        url, name, timeout = settings.extractor_url, settings.extractor_model_name, settings.extractor_timeout_s
    elif role == "assistant":
        url, name, timeout = settings.llm_base_url, settings.assistant_model or settings.llm_model, settings.llm_timeout_s
    else:
        url, name, timeout = settings.llm_base_url, settings.llm_model, settings.llm_timeout_s
    return ModelClient(
        create_client(settings, base_url=base_url or url, timeout_s=timeout_s or timeout),
        role=role, model=model or name, json_mode=json_mode or settings.llm_json_mode, metrics=metrics,
        max_retries=settings.llm_max_retries, restart_wait_s=settings.llm_restart_wait_s,
    )
