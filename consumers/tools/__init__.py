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

The package hands on what agentic mode and the tools' callers need: the tools, their specs and
validation, dispatch, and the results agentic mode tells apart. Everything else (typed hits, shaping,
bounds, argument schemas) is imported from its module.
"""

from .dispatch import call_tool, run_tool
from .facts import find_entity_contexts
from .gists import find_gist_contexts
from .observations import AssistantReadResult, SegmentResult, ToolResult
from .registry import SPECS_BY_NAME, TOOL_SPECS, openai_tools, validate_arguments
from .retrieval import lexical_retrieve, semantic_retrieve
from .schemas import OutputAnswerArgs, ToolArgumentError
from .segments import read_segment

__all__ = [
    "SPECS_BY_NAME", "TOOL_SPECS", "AssistantReadResult", "OutputAnswerArgs", "SegmentResult", "ToolArgumentError",
    "ToolResult", "call_tool", "find_entity_contexts", "find_gist_contexts", "lexical_retrieve", "openai_tools",
    "read_segment", "run_tool", "semantic_retrieve", "validate_arguments",
]
