"""Versioned enrichment prompts, each beside the pydantic schema of its output."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

PROMPT_DIR = Path(__file__).resolve().parent
ENRICH_PROMPT_VERSION = "enrich_v1"

# Bounds keep a small model's grammar-constrained output finite.
_SHORT = 120


class GistOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    text: str = Field(min_length=1, max_length=300)
    date: str | None = Field(default=None, max_length=40)
    turn_ids: list[str] = Field(default_factory=list, max_length=6)


class FactOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    subject: str = Field(min_length=1, max_length=_SHORT)
    predicate: str = Field(min_length=1, max_length=60)
    object: str = Field(min_length=1, max_length=_SHORT)
    point_in_time: str | None = Field(default=None, max_length=40)
    start_time: str | None = Field(default=None, max_length=40)
    end_time: str | None = Field(default=None, max_length=40)
    turn_ids: list[str] = Field(default_factory=list, max_length=6)


class EnrichmentOut(BaseModel):
    """What the extractor model must return for one segment."""

    model_config = ConfigDict(extra="ignore")

    summary: str = Field(min_length=1, max_length=800)
    # At least one of each: a ~4K-token stretch of dialogue always holds an event
    # and a fact, and a small model otherwise takes the empty way out.
    gists: list[GistOut] = Field(min_length=1, max_length=12)
    facts: list[FactOut] = Field(min_length=1, max_length=16)


@cache
def load_prompt(version: str) -> str:
    return (PROMPT_DIR / f"{version}.md").read_text().strip()
