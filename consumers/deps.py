"""What answering needs, built once per answer worker (consumers/worker.py) and passed down typed."""

from __future__ import annotations

from dataclasses import dataclass

from psycopg_pool import AsyncConnectionPool

from epistream.embeddings import Embedder
from epistream.llm import ModelClient
from epistream.metrics import Metrics
from epistream.settings import Settings

from .assistants import AssistantPool
from .router import RouterConfig


@dataclass(frozen=True)
class AnswerDeps:
    settings: Settings
    pool: AsyncConnectionPool
    embedder: Embedder
    master: ModelClient
    metrics: Metrics
    assistants: AssistantPool
    router: RouterConfig


def router_config(settings: Settings) -> RouterConfig:
    return RouterConfig(top_k=settings.router_top_k, candidates=settings.router_candidates,
                        fusion=settings.router_fusion,
                        weights=settings.pathway_weights, force_include=settings.router_force_include,
                        rrf_k=settings.rrf_k)
