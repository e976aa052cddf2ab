"""What a tool call gives back, typed: the result of each tool as the model sees
it (``payload``, JSON-ready with the keys the agent prompt describes), as a
bounded observation for a model's context (``observation``: valid JSON within a
budget, whole items left out and counted), and the evidence it showed
(``evidence``: citable id -> Evidence)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import date
from typing import TYPE_CHECKING, Any, ClassVar

from epistream.contracts.replies import Evidence

from .results import Cited, EntityContexts, GistContexts, GistHit, SegmentRead, TurnHit, cited
from .schemas import OutputAnswerArgs
from .shaping import Cut, bounded_json, plain, shallow

if TYPE_CHECKING:
    from ..assistants import QuotedTurn


def range_json(start: date | None, end: date | None) -> dict[str, str | None]:
    return {"start": start.isoformat() if start else None, "end": end.isoformat() if end else None}


class ToolResult(ABC):
    """One tool call's result."""

    tool: str
    #: the lists whose items an observation may leave out, in that order
    cuts: ClassVar[tuple[Cut, ...]] = ()

    @abstractmethod
    def payload(self) -> dict[str, Any]:
        """The whole result as JSON-ready data (strings capped, dates as ISO text)."""

    def observation(self, max_chars: int) -> str:
        """The payload as JSON text of at most ``max_chars``: whole items left out, counted in ``omitted``."""
        return bounded_json(self.payload(), self.cuts, max_chars)

    def evidence(self) -> Cited:
        """Every gist, fact and turn the result holds, by the id a model cites it with."""
        return {}


@dataclass(frozen=True)
class RetrievalResult(ToolResult):
    tool: str
    target: str
    start: date | None
    end: date | None
    hits: list[GistHit] | list[TurnHit]
    cuts: ClassVar[tuple[Cut, ...]] = (Cut(("results",)),)

    def payload(self) -> dict[str, Any]:
        return plain({"tool": self.tool, "target": self.target, "range": range_json(self.start, self.end),
                      "results": self.hits})

    def evidence(self) -> Cited:
        return cited(self.hits)


@dataclass(frozen=True)
class GistContextsResult(ToolResult):
    tool: str
    contexts: GistContexts
    # Paraphrases first, then the farthest neighbours; the gist and its source turns last.
    cuts: ClassVar[tuple[Cut, ...]] = (Cut(("similar",)), Cut(("after",)), Cut(("before",), keep_last=True),
                                       Cut(("entities",)), Cut(("source_turns",)))

    def payload(self) -> dict[str, Any]:
        return plain({"tool": self.tool, "found": True, **shallow(self.contexts)})

    def evidence(self) -> Cited:
        return self.contexts.evidence()


@dataclass(frozen=True)
class EntityContextsResult(ToolResult):
    tool: str
    start: date | None
    end: date | None
    contexts: EntityContexts
    cuts: ClassVar[tuple[Cut, ...]] = (Cut(("facts",)), Cut(("subjects",)), Cut(("objects",)), Cut(("predicates",)))

    def payload(self) -> dict[str, Any]:
        return plain({"tool": self.tool, "range": range_json(self.start, self.end), **shallow(self.contexts)})

    def evidence(self) -> Cited:
        return self.contexts.evidence()


@dataclass(frozen=True)
class SegmentResult(ToolResult):
    tool: str
    segment: SegmentRead
    cuts: ClassVar[tuple[Cut, ...]] = (Cut(("segment", "turns")),)

    def payload(self) -> dict[str, Any]:
        return plain({"tool": self.tool, "found": True, "segment": self.segment})

    def evidence(self) -> Cited:
        return self.segment.evidence()


@dataclass(frozen=True)
class NotFoundResult(ToolResult):
    """An id the model gave that is not in this memory (or not in the question's scope)."""

    tool: str
    error: str

    def payload(self) -> dict[str, Any]:
        return plain({"tool": self.tool, "found": False, "error": self.error})


@dataclass(frozen=True)
class AnswerResult(ToolResult):
    """``output_answer``, validated and echoed: the caller ends its loop with it."""

    tool: str
    answer: OutputAnswerArgs

    def payload(self) -> dict[str, Any]:
        return {"tool": self.tool, **self.answer.model_dump()}


@dataclass(frozen=True)
class AssistantReadResult(ToolResult):
    """``read_segment`` as an assistant read: the segment's quotes for the question, not its whole text."""

    segment_id: str
    summary: str | None
    quotes: list[QuotedTurn] = field(default_factory=list)
    tool: str = "read_segment"
    cuts: ClassVar[tuple[Cut, ...]] = (Cut(("quotes",)),)

    def payload(self) -> dict[str, Any]:
        return {
            "segment_id": self.segment_id, "summary": self.summary,
            "quotes": [{"turn_id": q.turn_id, "speaker": q.speaker, "text": q.quote, "ts": q.time.isoformat(),
                        "conversation_id": q.conversation_id, "segment_id": q.segment_id} for q in self.quotes],
        }

    def evidence(self) -> Cited:
        found: Cited = {}
        for q in self.quotes:
            if q.quote:
                found.setdefault(q.turn_id, Evidence(
                    conversation_id=q.conversation_id, segment_id=q.segment_id, turn_ids=[q.turn_id],
                    quote=q.quote, time=q.time, speaker=q.speaker))
        return found
