"""The tools' vocabulary and bounds: what a model may ask for, and how much comes back."""

from __future__ import annotations

from typing import Literal

Target = Literal["gists", "turns"]
Operator = Literal["or", "and", "phrase"]
Order = Literal["asc", "desc"]
Aggregate = Literal["none", "count", "first", "last"]

MAX_LIMIT = 50
MAX_OFFSET = 1000
MAX_WINDOW = 10
SIMILAR_LIMIT = 5
ENTITY_MATCH_LIMIT = 20
MAX_TEXT_CHARS = 1500  # any one string in a tool result
MAX_RAW_TEXT_CHARS = 12_000  # a segment's raw text
MAX_RESULT_CHARS = 24_000  # a whole tool result, as JSON (call_tool)
