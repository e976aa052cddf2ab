"""Every read of the memory on the query side, its SQL written once.

- ``fragments``: the pieces statements are composed from: columns, the tenant,
  conversation and time-window filters, the keyword queries, nearest-by-meaning,
  turns by id (psycopg.sql; values always bound).
- ``recipes``: retrieval as data: which pathways run, their candidate pools, the
  fusion and top_k, deep mode's reading windows, the context read's tuning, as frozen
  recipes; the named ones; ``from_settings``.
- ``ranker``: the context read's learned ranker as data (a logistic regression over named features), pure.
- ``fusion``: the router's score fusion (weighted min-max, reciprocal rank), pure.
- ``turns``: fused turn search (fast mode) and a conversation's turns by id.
- ``segments``: the router's pathways (summary, dense, lexical), open segments,
  the chosen segments' turn ids; the router's decision is consumers/router.py.
- ``structured``: the context read's gists and named-entity facts, as typed rows.
- ``speakers``: the speakers a question names (looked up among the tenant's), and the
  question without their names.
- ``seeds``: the tools' semantic and lexical searches over gists and turns.
- ``conversations``: a page of the tenant's conversation ids by prefix (the MCP resource list).
- ``execute``: running a statement into dict rows, or typed ones.

The package hands on the recipes, the reads and the rows they return, which the rest of the
answer side uses; the SQL's pieces (fragments, seeds, execute) are imported from their modules.
"""

from .fusion import fuse, reciprocal_rank
from .ranker import FEATURES, LinearRanker, RankerFileError
from .recipes import (
    CONTEXT_READ,
    DENSE_TURNS,
    FUSED_TURNS,
    PERIOD_BOOST,
    SEGMENT_PATHWAYS,
    ContextRecipe,
    Coverage,
    Neighbours,
    Recipes,
    SegmentRecipe,
    Sources,
    Structured,
    TurnRecipe,
    WindowRecipe,
    from_settings,
)
from .segments import OPEN_SUFFIX, route_params, score_segments, segment_turn_ids
from .structured import Fact, Gist, GistRow, NamedFact, NearGist, StatedFact, facts_named, nearest_gists
from .turns import NeighbourTurn, RetrievedTurn, TurnRow, load_turns, neighbour_turns, search_turns, turns_at

__all__ = [
    # recipes
    "CONTEXT_READ", "DENSE_TURNS", "FUSED_TURNS", "PERIOD_BOOST", "SEGMENT_PATHWAYS", "ContextRecipe", "Coverage", "Neighbours",
    "Recipes", "SegmentRecipe", "Sources", "Structured", "TurnRecipe", "WindowRecipe", "from_settings",
    # reads and their rows
    "Fact", "Gist", "GistRow", "NamedFact", "NearGist", "NeighbourTurn", "RetrievedTurn", "StatedFact", "TurnRow", "facts_named",
    "load_turns", "nearest_gists", "neighbour_turns", "search_turns", "turns_at",
    # the context read's learned ranker (its features: consumers/ranking.py)
    "FEATURES", "LinearRanker", "RankerFileError",
    # the router's pathways and fusion
    "OPEN_SUFFIX", "fuse", "reciprocal_rank", "route_params", "score_segments", "segment_turn_ids",
]
