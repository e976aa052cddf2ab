"""The agentic tools' argument handling, without a database: validation as data,
date expressions into ranges, result size limits, tool specs."""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta, timezone

import pytest

from epistream.consumers.tools import TOOL_SPECS, ToolArgumentError, call_tool, openai_tools, validate_arguments
from epistream.consumers.tools.limits import MAX_LIMIT
from epistream.consumers.tools.schemas import FindEntityContextsArgs, LexicalRetrieveArgs, period, resolve_range
from epistream.consumers.tools.shaping import fit
from epistream.core.dates import ResolvedDate

ASKED_AT = datetime(2025, 6, 15, 12, 0, tzinfo=timezone(timedelta(hours=1)))


@pytest.mark.parametrize(("resolved", "expected"), [
    (ResolvedDate(date(2024, 2, 29), "day"), (date(2024, 2, 29), date(2024, 2, 29))),
    (ResolvedDate(date(2024, 3, 13), "week"), (date(2024, 3, 11), date(2024, 3, 17))),
    (ResolvedDate(date(2024, 2, 17), "month"), (date(2024, 2, 1), date(2024, 2, 29))),
    (ResolvedDate(date(2023, 6, 15), "year"), (date(2023, 1, 1), date(2023, 12, 31))),
])
def test_a_resolved_date_stands_for_its_whole_period(resolved, expected):
    assert period(resolved) == expected


@pytest.mark.parametrize(("arguments", "expected"), [
    ({"during": "May 2023"}, (date(2023, 5, 1), date(2023, 5, 31))),
    ({"during": "last year"}, (date(2024, 1, 1), date(2024, 12, 31))),
    ({"during": "last month"}, (date(2025, 5, 1), date(2025, 5, 31))),
    ({"during": "yesterday"}, (date(2025, 6, 14), date(2025, 6, 14))),
    ({"start": "2023", "end": "2023"}, (date(2023, 1, 1), date(2023, 12, 31))),
    ({"start": "2024-03"}, (date(2024, 3, 1), None)),
    ({"end": "2024-03"}, (None, date(2024, 3, 31))),
    ({"start": "2024-03-18", "end": "around May 2024"}, (date(2024, 3, 18), date(2024, 5, 31))),
    ({"during": "2024", "start": "2024-06-10"}, (date(2024, 6, 10), date(2024, 12, 31))),  # the intersection
    ({}, (None, None)),
])
def test_date_arguments_resolve_against_the_question_time(arguments, expected):
    args = LexicalRetrieveArgs(query="x", **arguments)
    assert resolve_range("lexical_retrieve", args, ASKED_AT) == expected


@pytest.mark.parametrize(("arguments", "message"), [
    ({"during": "soonish"}, "during: cannot read 'soonish'"),
    ({"start": "2025", "end": "2024"}, "empty time range"),
])
def test_unreadable_or_empty_ranges_are_argument_errors(arguments, message):
    with pytest.raises(ToolArgumentError, match=message):
        resolve_range("lexical_retrieve", LexicalRetrieveArgs(query="x", **arguments), ASKED_AT)


def test_arguments_are_validated_as_data():
    args = validate_arguments("find_entity_contexts", '{"subject": " Alice ", "limit": "5"}')
    assert isinstance(args, FindEntityContextsArgs) and args.subject == "Alice" and args.limit == 5
    assert args.order == "asc" and args.aggregate == "none" and args.offset == 0 and not args.current_only
    for bad, where in [({"limit": MAX_LIMIT + 1}, "limit"), ({"offset": -1}, "offset"), ({"order": "random"}, "order"),
                       ({"subject": "!!!"}, "subject"), ({"predicate": "--"}, "predicate"),
                       ({"subject": "Alice", "tenant": "someone-else"}, "tenant")]:
        with pytest.raises(ToolArgumentError, match=f"find_entity_contexts: invalid arguments: {where}"):
            validate_arguments("find_entity_contexts", bad)
    with pytest.raises(ToolArgumentError, match="unknown tool"):
        validate_arguments("execute_sql", {})
    with pytest.raises(ToolArgumentError, match="not JSON"):
        validate_arguments("read_segment", "{segment_id: 1")
    with pytest.raises(ToolArgumentError, match="JSON object"):
        validate_arguments("read_segment", ["seg0"])  # type: ignore[arg-type]


async def test_call_tool_rejects_bad_calls_before_touching_the_database():
    kwargs = {"tenant": "t", "embedder": None, "conversation_ids": None, "asked_at": ASKED_AT}
    with pytest.raises(ToolArgumentError):
        await call_tool(None, "lexical_retrieve", {"query": "x", "limit": 1000}, **kwargs)
    with pytest.raises(ToolArgumentError, match="cannot read"):
        await call_tool(None, "semantic_retrieve", {"query": "x", "during": "whenever"}, **kwargs)
    answer = await call_tool(None, "output_answer", {"answer": "", "abstain": True}, **kwargs)
    assert answer == {"tool": "output_answer", "answer": "", "abstain": True, "evidence": []}


def test_results_are_cut_to_size():
    payload = {"tool": "lexical_retrieve", "results": [{"text": "x" * 900, "n": i} for i in range(40)]}
    fitted = fit(payload, max_chars=5_000)
    assert fitted["truncated"] is True and len(json.dumps(fitted)) <= 5_000
    assert [r["n"] for r in fitted["results"]] == list(range(len(fitted["results"])))  # the best ranked stay
    small = {"tool": "read_segment", "found": False}
    assert fit(dict(small)) == small


def test_every_tool_has_a_strict_bounded_schema():
    specs = {s["name"]: s for s in TOOL_SPECS}
    assert set(specs) == {"semantic_retrieve", "lexical_retrieve", "find_gist_contexts", "find_entity_contexts",
                          "read_segment", "output_answer"}
    for spec in TOOL_SPECS:
        assert spec["description"] and "\n" not in spec["description"]
        assert spec["parameters"]["type"] == "object" and spec["parameters"]["additionalProperties"] is False
    entity = specs["find_entity_contexts"]["parameters"]["properties"]
    assert entity["limit"]["maximum"] == MAX_LIMIT and entity["offset"]["maximum"] == 1000
    assert set(entity["aggregate"]["enum"]) == {"none", "count", "first", "last"}
    assert specs["output_answer"]["parameters"]["properties"]["evidence"]["type"] == "array"
    assert openai_tools()[0] == {"type": "function", "function": TOOL_SPECS[0]}
