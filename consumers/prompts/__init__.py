"""Versioned prompts, each beside the pydantic schema of the output it asks for."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

PROMPT_DIR = Path(__file__).resolve().parent
ANSWER_PROMPT_VERSION = "answer_v1"


class MasterAnswer(BaseModel):
    """What the master model must return for a `fast` answer."""

    model_config = ConfigDict(extra="ignore")

    answer: str = Field(max_length=300)
    abstain: bool
    evidence: list[int] = Field(default_factory=list, max_length=5)


@cache
def load_prompt(version: str) -> str:
    return (PROMPT_DIR / f"{version}.md").read_text().strip()
