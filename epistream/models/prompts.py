"""The prompt registry, and the text every prompt builds the same way.

A prompt is a versioned Markdown file in the package that owns it (``epistream.pipeline.prompts``,
``epistream.consumers.prompts``), registered there beside the pydantic schema of the reply it asks for.
Files are read once, through importlib.resources, so an installed wheel serves them as a
checkout does (they are package data in pyproject.toml). A version names one wording: it is
stored with what the prompt produced, so a new wording is a new file, never an edit.

User text enters a prompt only inside a fence that it cannot close (`fence`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from importlib import resources
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel

S = TypeVar("S", bound=BaseModel)


@dataclass(frozen=True)
class Prompt(Generic[S]):
    name: str  # "enrich"
    version: str  # "enrich_v1": the file's stem, and what is stored with the output
    template: str  # the system prompt, as the file says it
    schema: type[S]  # what the model must reply


_REGISTRY: dict[str, Prompt[Any]] = {}  # prompts of every reply schema


def register(package: str, name: str, number: int, schema: type[S]) -> Prompt[S]:
    """Read ``<name>_v<number>.md`` from ``package`` and register it with its reply's schema."""
    version = f"{name}_v{number}"
    template = resources.files(package).joinpath(f"{version}.md").read_text(encoding="utf-8").strip()
    known = _REGISTRY.get(version)
    if known is not None and known.template != template:
        raise ValueError(f"prompt {version} is registered twice with different texts")
    prompt = Prompt(name, version, template, schema)
    _REGISTRY[version] = prompt
    return prompt


def prompt(version: str) -> Prompt[Any]:
    """A registered prompt (its package must have been imported)."""
    try:
        return _REGISTRY[version]
    except KeyError:
        raise KeyError(f"no prompt {version!r}; registered: {sorted(_REGISTRY)}") from None


def estimate_tokens(text: str) -> int:
    """About four characters a token for English under common BPE vocabularies (at least one):
    a budget needs an estimate, not one model's exact tokenizer. The one token count of the
    project: segment budgets, prompt fitting and the context read's budget all use it."""
    return max(1, math.ceil(len(text) / 4))


def load_prompt(version: str) -> str:
    """A registered prompt's text."""
    return prompt(version).template


class DatedTurn(Protocol):
    @property
    def ts(self) -> datetime: ...
    @property
    def turn_id(self) -> str: ...
    @property
    def speaker(self) -> str: ...
    @property
    def text(self) -> str: ...


def turn_line(turn: DatedTurn) -> str:
    """A turn as the extractor and the assistants read it: when (with the weekday, which
    relative dates need), which turn (the id they cite), who, what."""
    return f"[{turn.ts:%Y-%m-%d %H:%M} ({turn.ts:%A})] ({turn.turn_id}) {turn.speaker}: {turn.text}"


@cache
def _tag_opening(tag: str) -> re.Pattern[str]:
    # `<tag`, `</tag`, `< / TAG` ...: whatever a model could read as the fence's own markup.
    return re.compile(rf"<(?=\s*/?\s*{re.escape(tag)})", re.IGNORECASE)


def fence(tag: str, text: str) -> str:
    """``text`` between ``<tag>`` and ``</tag>`` lines, with every ``<`` that would open or close
    that tag inside it written as ``&lt;``: text quoted from a user cannot end the fence early
    and pose as instructions after it."""
    return f"<{tag}>\n{_tag_opening(tag).sub('&lt;', text)}\n</{tag}>"
