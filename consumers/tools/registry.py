"""The tools a model may call: name, one-line description and argument schema
(TOOL_SPECS, and in the OpenAI ``tools`` format), and a call's arguments
validated against them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from .schemas import (
    FindEntityContextsArgs,
    FindGistContextsArgs,
    LexicalRetrieveArgs,
    OutputAnswerArgs,
    ReadSegmentArgs,
    SemanticRetrieveArgs,
    ToolArgs,
    ToolArgumentError,
)


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    arguments: type[ToolArgs]


_SPECS = (
    ToolSpec("semantic_retrieve", "Find gists or turns close in meaning to a query, optionally within a time range.",
             SemanticRetrieveArgs),
    ToolSpec("lexical_retrieve", "Find gists or turns containing the query's words, optionally within a time range.",
             LexicalRetrieveArgs),
    ToolSpec("find_gist_contexts",
             "Expand a gist: its source turns, neighbouring gists in time, mentioned entities, similar gists.",
             FindGistContextsArgs),
    ToolSpec("find_entity_contexts",
             "Dated facts (subject, predicate, object) by entity, relation and time range; ordered, paged, "
             "counted, or first/last.", FindEntityContextsArgs),
    ToolSpec("read_segment", "Read a segment's raw dialogue, summary and turns.", ReadSegmentArgs),
    ToolSpec("output_answer", "Give the final answer (or abstain) with the ids of the supporting evidence.",
             OutputAnswerArgs),
)
SPECS_BY_NAME: dict[str, ToolSpec] = {spec.name: spec for spec in _SPECS}
TOOL_SPECS: list[dict[str, Any]] = [
    {"name": spec.name, "description": spec.description, "parameters": spec.arguments.model_json_schema()}
    for spec in _SPECS
]


def openai_tools() -> list[dict[str, Any]]:
    """TOOL_SPECS in the OpenAI chat-completions ``tools`` format."""
    return [{"type": "function", "function": dict(spec)} for spec in TOOL_SPECS]


def validate_arguments(name: str, arguments: dict[str, Any] | str | None) -> ToolArgs:
    """The tool's argument model built from ``arguments`` (a dict, or a JSON object text)."""
    spec = SPECS_BY_NAME.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ToolArgumentError(str(name), f"unknown tool; known tools: {', '.join(SPECS_BY_NAME)}")
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ToolArgumentError(name, f"arguments are not JSON: {exc.msg}") from None
    if not isinstance(arguments, dict):
        raise ToolArgumentError(name, "arguments must be a JSON object")
    try:
        return spec.arguments.model_validate(arguments)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or 'arguments'}: {error['msg']}" for error in exc.errors()
        )
        raise ToolArgumentError(name, f"invalid arguments: {problems}") from None
