"""The indexer's prompts (Markdown files here), each registered beside the pydantic schema of its output."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from epistream.models.prompts import register

# Bounds keep a small model's grammar-constrained output within the completion
# budget (EPISTREAM_EXTRACTOR_MAX_TOKENS): a reply cut short is invalid JSON.
_SHORT = 80


class GistOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    text: str = Field(min_length=1, max_length=200)
    date: str | None = Field(default=None, max_length=30)
    turn_ids: list[str] = Field(default_factory=list, max_length=4)


class FactOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    subject: str = Field(min_length=1, max_length=_SHORT)
    predicate: str = Field(min_length=1, max_length=40)
    object: str = Field(min_length=1, max_length=_SHORT)
    point_in_time: str | None = Field(default=None, max_length=30)
    start_time: str | None = Field(default=None, max_length=30)
    end_time: str | None = Field(default=None, max_length=30)
    turn_ids: list[str] = Field(default_factory=list, max_length=4)


class EnrichmentOut(BaseModel):
    """What the extractor model must return for one segment."""

    model_config = ConfigDict(extra="ignore")

    summary: str = Field(min_length=1, max_length=500)
    # At least one of each: a ~4K-token stretch of dialogue always holds an event
    # and a fact, and a small model otherwise takes the empty way out.
    gists: list[GistOut] = Field(min_length=1, max_length=8)
    facts: list[FactOut] = Field(min_length=1, max_length=8)


ENRICH_PROMPT = register(__name__, "enrich", 1, EnrichmentOut)
