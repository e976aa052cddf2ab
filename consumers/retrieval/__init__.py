"""Every read of the memory on the query side, its SQL written once.

- ``fragments``: the pieces statements are composed from: columns, the tenant,
  conversation and time-window filters, the keyword queries, nearest-by-meaning,
  turns by id (psycopg.sql; values always bound).
- ``recipes``: retrieval as data: which pathways run, their candidate pools, the
  fusion and top_k, deep mode's reading windows, as frozen recipes; the named ones;
  ``from_settings``.
- ``fusion``: the router's score fusion (weighted min-max, reciprocal rank), pure.
- ``turns``: fused turn search (fast mode) and a conversation's turns by id.
- ``segments``: the router's pathways (summary, dense, lexical), open segments,
  the chosen segments' turn ids; the router's decision is consumers/router.py.
- ``structured``: fast mode's gists and named-entity facts.
- ``speakers``: the speakers a question names (looked up among the tenant's), and the
  question without their names.
- ``seeds``: the tools' semantic and lexical searches over gists and turns.
- ``execute``: running a statement into dict rows.
"""

from .execute import rows
from .fragments import (
    ALL_KEYWORDS,
    GIST_COLUMNS,
    GIST_FIELDS,
    KEYWORD_PHRASE,
    TURN_COLUMNS,
    TURN_FIELDS,
    TextSearchConfig,
    TurnOrder,
    WindowUnit,
    any_keyword,
    columns,
    conversations,
    fact_days,
    gist_days,
    in_conversations,
    in_scope,
    matches,
    nearest,
    nearest_in_order,
    of_tenant,
    overlaps_window,
    segment_of,
    turns_by_id,
)
from .fusion import Scores, fuse, min_max, reciprocal_rank
from .recipes import (
    DEEP_WINDOWS,
    DENSE_TURNS,
    FUSED_TURNS,
    KEYWORD_CONFIG,
    ROUTER_DEFAULT,
    ROUTER_RRF,
    SEGMENT_PATHWAYS,
    TURN_PATHWAYS,
    FusionMethod,
    Recipes,
    SegmentPathway,
    SegmentRecipe,
    TurnPathway,
    TurnRecipe,
    WindowRecipe,
    from_settings,
)
from .seeds import LEXICAL_GISTS, LEXICAL_TURNS, SEMANTIC_GISTS, SEMANTIC_TURNS
from .segments import OPEN_SUFFIX, Candidates, route_params, score_segments, segment_turn_ids
from .structured import facts_named, nearest_gists
from .turns import NeighbourTurn, RetrievedTurn, load_turns, neighbour_turns, search_turns, turns_at

__all__ = [
    "ALL_KEYWORDS", "DEEP_WINDOWS", "DENSE_TURNS", "FUSED_TURNS", "GIST_COLUMNS", "GIST_FIELDS", "KEYWORD_CONFIG", "KEYWORD_PHRASE", "LEXICAL_GISTS",
    "LEXICAL_TURNS", "OPEN_SUFFIX", "ROUTER_DEFAULT", "ROUTER_RRF", "SEGMENT_PATHWAYS", "SEMANTIC_GISTS",
    "SEMANTIC_TURNS", "TURN_COLUMNS", "TURN_FIELDS", "TURN_PATHWAYS", "Candidates",
    "FusionMethod", "NeighbourTurn", "Recipes", "RetrievedTurn", "Scores", "SegmentPathway", "SegmentRecipe", "TextSearchConfig",
    "TurnOrder", "TurnPathway", "TurnRecipe", "WindowRecipe", "WindowUnit", "any_keyword", "columns", "conversations",
    "fact_days", "facts_named", "from_settings", "gist_days", "fuse", "in_conversations", "in_scope", "load_turns", "matches", "min_max",
    "nearest", "nearest_gists", "nearest_in_order", "of_tenant", "overlaps_window", "reciprocal_rank",
    "neighbour_turns", "route_params", "rows", "score_segments", "search_turns", "segment_of", "segment_turn_ids", "turns_at", "turns_by_id",
]
