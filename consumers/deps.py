"""What answering needs, built once per answer worker (consumers/worker.py) and passed down typed."""

from __future__ import annotations

from dataclasses import dataclass

from psycopg_pool import AsyncConnectionPool

from epistream.core.metrics import Metrics
from epistream.models.embeddings import Embedder
from epistream.models.llm import ModelClient
from epistream.settings.processes import Settings

from .assistants import AssistantPool
from .read_after import TurnsLog
from .retrieval import Recipes


@dataclass(frozen=True)
class AnswerDeps:
    settings: Settings
    #: The primary. Nothing on the answer side writes today; every read below uses `read_pool`.
    pool: AsyncConnectionPool
    embedder: Embedder
    master: ModelClient
    metrics: Metrics
    assistants: AssistantPool
    recipes: Recipes
    #: Where every read of answering goes, the read-after marks included (Resources.read_pool: a hot
    #: standby's pool, or `pool` itself): the marks and the memory then come from the same server.
    read_pool: AsyncConnectionPool
    #: Where the turns topic's log ends (a read-after names positions never produced at once); None: not asked.
    turns_log: TurnsLog | None = None

