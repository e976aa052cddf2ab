"""Versioned prompts, each beside the pydantic schema of the output it asks for."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

PROMPT_DIR = Path(__file__).resolve().parent
ANSWER_PROMPT_VERSION = "answer_v1"
ASSISTANT_PROMPT_VERSION = "assistant_v1"
MASTER_PROMPT_VERSION = "master_v1"


class MasterAnswer(BaseModel):
    """What the master model must return for a `fast` answer."""

    model_config = ConfigDict(extra="ignore")

    answer: str = Field(max_length=300)
    abstain: bool
    evidence: list[int] = Field(default_factory=list, max_length=5)


class QuotedEvidence(BaseModel):
    model_config = ConfigDict(extra="ignore")

    turn_id: str = Field(max_length=60)
    quote: str = Field(min_length=1, max_length=400)


class AssistantReply(BaseModel):
    """What an assistant returns after reading one segment."""

    model_config = ConfigDict(extra="ignore")

    relevant: bool
    evidence: list[QuotedEvidence] = Field(default_factory=list, max_length=6)


@cache
def load_prompt(version: str) -> str:
    return (PROMPT_DIR / f"{version}.md").read_text().strip()
