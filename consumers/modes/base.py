"""What a mode returns, and the abstentions every mode shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from epistream.contracts.replies import Evidence
from epistream.models.llm import Usage


class Abstention(StrEnum):
    """The words of an answer that is not one: the asker reads why."""

    NO_MEMORY = "I don't know: nothing in this memory is about that."
    NO_EVIDENCE = "I don't know: nothing in this memory supports an answer."
    MODEL_FAILED = "I could not answer: the model failed."
    #: anything else went wrong (the question is in the dead-letter topic with the reason)
    FAILED = "I could not answer: answering this question failed."
    #: the model answered with nothing
    EMPTY = "I don't know"


@dataclass(frozen=True)
class ModeResult:
    answer: str
    abstained: bool
    evidence: list[Evidence]
    master: Usage = field(default_factory=Usage)
    assistants: Usage = field(default_factory=Usage)

    @classmethod
    def abstain(cls, why: Abstention, *, master: Usage | None = None, assistants: Usage | None = None) -> ModeResult:
        return cls(why.value, True, [], master or Usage(), assistants or Usage())


def model_text(answer: str) -> str:
    """The model's answer as the asker reads it (never empty)."""
    return answer.strip() or Abstention.EMPTY.value
