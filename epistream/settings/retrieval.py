"""What a question reads: the fused turn search, the router's segment pathways, deep mode's windows."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode

from .base import SETTINGS_CONFIG, split_commas
from .ranker_cards import ranker_file


class RetrievalSettings(BaseSettings):
    """What a question reads: the fast mode's fused turn search (``retrieve_*``, ``rrf_k``) and the
    router's segment pathways (``router_*``) -- one group, one job."""

    model_config = SETTINGS_CONFIG

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
        1000, ge=0, description="Turns the rarest words of a question may find by full text (0: no cap, every word)."
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

    context_ranker: str = Field(
        "builtin", description="The context read's learned ranker: none (the pathways' fused scores), builtin (the "
        "shipped context-ranker-v1, checked against its card's sha256 at start) or the path of a file "
        "`python -m bench.train_ranker --out` wrote.",
    )

    _split_weights = field_validator("router_weights", mode="before")(split_commas)

    @field_validator("router_weights")
    @classmethod
    def _usable_weights(cls, value: tuple[float, float, float]) -> tuple[float, float, float]:
        if any(w < 0 for w in value) or sum(value) == 0:
            raise ValueError("three weights (summary, dense, lexical), none negative, not all zero")
        return value

    @field_validator("context_ranker")
    @classmethod
    def _ranker_file(cls, value: str) -> str:
        ranker_file(value)  # missing or corrupt: refuse to start
        return value

    @property
    def context_ranker_path(self) -> Path | None:
        return ranker_file(self.context_ranker)

    @property
    def pathway_weights(self) -> tuple[float, float, float]:
        return self.router_weights

    @property
    def fast_context_tokens(self) -> int:
        """Fast mode's context budget in tokens (estimate_tokens counts four characters a token)."""
        return self.answer_context_chars // 4
