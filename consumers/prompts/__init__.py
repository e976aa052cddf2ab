"""The answer side's prompts (Markdown files here), each registered beside the pydantic schema
of the output it asks for."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from epistream.models.prompts import load_prompt, register


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


ANSWER_PROMPT = register(__name__, "answer", 1, MasterAnswer)  # `fast`: numbered excerpts in, one answer out
MASTER_PROMPT = register(__name__, "master", 1, MasterAnswer)  # `deep`: the assistants' quotes in
ASSISTANT_PROMPT = register(__name__, "assistant", 1, AssistantReply)  # one segment, one question
# The agent's prompt (agent_v1.md) is registered in epistream.consumers.modes.agentic: its schema names the
# tools, and the tools import the assistants, which import this package.

# The evaluation baselines (bench/eval_baselines.py) read the `fast` prompt by these names.
ANSWER_PROMPT_VERSION = ANSWER_PROMPT.version
__all__ = [
    "ANSWER_PROMPT", "ANSWER_PROMPT_VERSION", "ASSISTANT_PROMPT", "MASTER_PROMPT",
    "AssistantReply", "MasterAnswer", "QuotedEvidence", "load_prompt",
]
