"""The retrieval tools of REMem's agentic mode, as plain async functions over a
connection already inside ``tenant_scope``, one job per module:

- ``retrieval``: ``semantic_retrieve`` / ``lexical_retrieve`` seed gists or turns,
  by meaning (pgvector HNSW) or by words (Postgres full-text), with time filters.
- ``gists``: ``find_gist_contexts``, a gist's source turns, neighbours in time,
  mentioned entities and near-paraphrases (cosine above the model card's similar threshold).
- ``facts``: ``find_entity_contexts``, temporal facts by subject / predicate /
  object and time range, ordered, paged and aggregated (count, first, last).
- ``segments``: ``read_segment``, a segment's raw text, summary and turns.
- ``results``: what they find, typed (each gist, turn and fact knows its evidence);
  ``observations``: each tool's result as the model sees it, bounded, with its evidence.
- ``schemas``: arguments as data and their date expressions; ``registry``: the tool
  specs and argument validation; ``dispatch``: ``run_tool`` / ``call_tool``.
- ``shaping``: JSON shaping; ``limits``: vocabulary and bounds. The SQL they share
  (fragments and the seed searches) lives in consumers/retrieval.
"""

from .dispatch import RUNNERS, CallScope, Embeds, call_tool, run_tool
from .facts import find_entity_contexts
from .gists import find_gist_contexts
from .limits import (
    ENTITY_MATCH_LIMIT,
    MAX_LIMIT,
    MAX_OFFSET,
    MAX_RAW_TEXT_CHARS,
    MAX_RESULT_CHARS,
    MAX_TEXT_CHARS,
    MAX_WINDOW,
    SIMILAR_LIMIT,
    Aggregate,
    Operator,
    Order,
    Target,
)
from .observations import (
    AnswerResult,
    AssistantReadResult,
    EntityContextsResult,
    GistContextsResult,
    NotFoundResult,
    RetrievalResult,
    SegmentResult,
    ToolResult,
)
from .registry import SPECS_BY_NAME, TOOL_SPECS, ToolSpec, openai_tools, validate_arguments
from .results import Cited, EntityContexts, EntityRef, FactRow, GistContexts, GistHit, SegmentRead, TurnHit
from .retrieval import lexical_retrieve, semantic_retrieve
from .schemas import (
    FindEntityContextsArgs,
    FindGistContextsArgs,
    LexicalRetrieveArgs,
    OutputAnswerArgs,
    ReadSegmentArgs,
    SemanticRetrieveArgs,
    TimeArgs,
    ToolArgs,
    ToolArgumentError,
    period,
    resolve_range,
)
from .segments import read_segment
from .shaping import Cut, bounded_json, fit, plain

__all__ = [
    "ENTITY_MATCH_LIMIT", "MAX_LIMIT", "MAX_OFFSET", "MAX_RAW_TEXT_CHARS", "MAX_RESULT_CHARS", "MAX_TEXT_CHARS",
    "MAX_WINDOW", "RUNNERS", "SIMILAR_LIMIT", "SPECS_BY_NAME", "TOOL_SPECS",
    "Aggregate", "AnswerResult", "AssistantReadResult", "CallScope", "Cited", "Cut", "Embeds", "EntityContexts",
    "EntityContextsResult", "EntityRef", "FactRow", "FindEntityContextsArgs", "FindGistContextsArgs",
    "GistContexts", "GistContextsResult", "GistHit", "LexicalRetrieveArgs", "NotFoundResult", "Operator", "Order",
    "OutputAnswerArgs", "ReadSegmentArgs", "RetrievalResult", "SegmentRead", "SegmentResult",
    "SemanticRetrieveArgs", "Target", "TimeArgs", "ToolArgs", "ToolArgumentError", "ToolResult", "ToolSpec",
    "TurnHit", "bounded_json", "call_tool", "find_entity_contexts", "find_gist_contexts", "fit",
    "lexical_retrieve", "openai_tools", "period", "plain", "read_segment", "resolve_range", "run_tool",
    "semantic_retrieve", "validate_arguments",
]
