"""REMem's agentic-mode tools on real PostgreSQL (pgvector, full-text, row-level
security), over a synthetic timeline written straight into the memory tables."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone

import pytest

from epistream.consumers.tools import (
    TOOL_SPECS,
    ToolArgumentError,
    call_tool,
    find_entity_contexts,
    find_gist_contexts,
    lexical_retrieve,
    read_segment,
    semantic_retrieve,
)
from epistream.core.names import normalize_name
from epistream.models.embeddings import Embedder
from epistream.storage.db import create_pool, tenant_scope

pytestmark = pytest.mark.integration

LOCAL = timezone(timedelta(hours=1))
ASKED_AT = datetime(2025, 6, 15, 12, 0, tzinfo=LOCAL)


def at(day: str, hour: int = 20) -> datetime:
    return datetime.fromisoformat(day).replace(hour=hour, tzinfo=LOCAL)


# turn id -> (speaker, text, local time)
TURNS = {
    "t01": ("Alice", "I ran the Porto Half Marathon yesterday with my sister Marta!", at("2023-05-15")),
    "t02": ("Alice", "Back from Paris, we saw the Louvre. I also started cello lessons this month.", at("2023-05-21")),
    "t03": ("Alice", "Rome was lovely, even on a work trip for Acme.", at("2023-08-03")),
    "t04": ("Alice", "Ran the Lisbon 10K yesterday in the rain.", at("2024-02-11")),
    "t05": ("Alice", "I moved from Porto to Lisbon last Wednesday, after living in Porto since 2019.", at("2024-03-18")),
    "t06": ("Alice", "I ran the Berlin Marathon yesterday in under four hours!", at("2024-09-30")),
    "t07": ("Alice", "Today I ran the Madrid 5K with colleagues.", at("2024-11-17")),
    "t08": ("Alice", "Cold morning for the Valencia 10K today.", at("2025-01-12")),
}
# segment -> turn ids (seg2 carries t06 as overlap, as the segmenter does)
SEGMENTS = {"seg0": ["t01", "t02", "t03"], "seg1": ["t04", "t05", "t06"], "seg2": ["t06", "t07", "t08"]}
# (gist id, event date, precision, text, source turns, mentioned entities)
GISTS = [
    ("seg0/g00", "2023-05-14", "day", "Alice ran the Porto Half Marathon with her sister Marta.", ["t01"],
     ["Alice", "Porto Half Marathon", "Marta"]),
    ("seg0/g01", "2023-05-20", "day", "Alice visited Paris and saw the Louvre.", ["t02"], ["Alice", "Paris"]),
    ("seg0/g02", "2023-05-01", "month", "Alice started learning to play the cello.", ["t02"], ["Alice"]),
    ("seg0/g03", "2023-08-02", "day", "Alice visited Rome on a work trip.", ["t03"], ["Alice", "Rome"]),
    ("seg1/g00", "2024-02-10", "day", "Alice ran the Lisbon 10K in the rain.", ["t04"], ["Alice", "Lisbon 10K"]),
    ("seg1/g01", "2024-03-13", "day", "Alice moved from Porto to Lisbon.", ["t05"], ["Alice", "Porto", "Lisbon"]),
    ("seg1/g02", "2024-09-29", "day", "Alice ran the Berlin Marathon in under four hours.", ["t06"],
     ["Alice", "Berlin Marathon"]),
    # The same event drawn again from the overlap turn: a near-paraphrase (cosine ~0.96).
    ("seg2/g00", "2024-09-29", "day", "Alice finished the Berlin Marathon in less than four hours.", ["t06"],
     ["Alice", "Berlin Marathon"]),
    ("seg2/g01", "2024-11-17", "day", "Alice ran the Madrid 5K with colleagues.", ["t07"], ["Alice", "Madrid 5K"]),
    ("seg2/g02", "2025-01-12", "day", "Alice ran the Valencia 10K on a cold morning.", ["t08"],
     ["Alice", "Valencia 10K"]),
]
# (fact id, subject, predicate, object, point_in_time, start_time, end_time, source turn)
FACTS = [
    ("seg0/f00", "Alice", "ran_race", "Porto Half Marathon", "2023-05-14", None, None, "t01"),
    ("seg0/f01", "Alice", "visited", "Paris", "2023-05-20", None, None, "t02"),
    ("seg0/f02", "Alice", "visited", "Rome", "2023-08-02", None, None, "t03"),
    ("seg0/f03", "Alice", "works_at", "Acme", None, None, None, "t03"),  # undated: its time is when it was said
    ("seg1/f00", "Alice", "ran_race", "Lisbon 10K", "2024-02-10", None, None, "t04"),
    ("seg1/f01", "Alice", "lives_in", "Porto", None, "2019-01-01", "2024-03-01", "t05"),
    ("seg1/f02", "Alice", "lives_in", "Lisbon", None, "2024-03-13", None, "t05"),
    ("seg1/f03", "Alice", "ran_race", "Berlin Marathon", "2024-09-29", None, None, "t06"),
    ("seg2/f00", "Alice", "ran_race", "Berlin Marathon", "2024-09-29", None, None, "t06"),  # overlap duplicate
    ("seg2/f01", "Alice", "ran_race", "Madrid 5K", "2024-11-17", None, None, "t07"),
    ("seg2/f02", "Alice", "ran_race", "Valencia 10K", "2025-01-12", None, None, "t08"),
]
ALIASES = {"Alice": ["Ali"]}

# Another tenant: the same names, different facts. None of it may ever show.
OTHER_TURNS = {"t01": ("Alice", "I live in Madrid now and I ran the Berlin Marathon in 2024.", at("2024-10-01"))}
OTHER_SEGMENTS = {"seg0": ["t01"]}
OTHER_GISTS = [("seg0/g00", "2024-09-29", "day", "Alice ran the Berlin Marathon for charity.", ["t01"],
                ["Alice", "Berlin Marathon"])]
OTHER_FACTS = [
    ("seg0/f00", "Alice", "lives_in", "Madrid", None, "2024-06-01", None, "t01"),
    ("seg0/f01", "Alice", "ran_race", "Berlin Marathon", "2024-09-29", None, None, "t01"),
]


@dataclass
class Memory:
    pool: object
    embedder: Embedder
    tenant: str
    other_tenant: str
    conversation: str


@pytest.fixture(scope="module")
def embedder(postgres) -> Embedder:
    return Embedder.from_settings(postgres)


async def seed(pool, embedder: Embedder, tenant: str, conversation: str, turns, segments, gists, facts) -> None:
    names = sorted({n for g in gists for n in g[5]} | {f[1] for f in facts} | {f[3] for f in facts})
    turn_vectors = embedder.embed([text for _, text, _ in turns.values()])
    gist_vectors = embedder.embed([f"{d if p == 'day' else d[:7]}: {text}" for _, d, p, text, _, _ in gists])
    name_vectors = embedder.embed(names)
    entity = {name: f"{tenant}/e/{normalize_name(name)}" for name in names}
    async with pool.connection() as conn, tenant_scope(conn, tenant):
        async with conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO memory.turns (tenant, conversation_id, turn_id, speaker, text, ts, session_id, embedding,"
                " tz_offset_s) VALUES (%s, %s, %s, %s, %s, %s, 's1', %s, 3600)",
                [(tenant, conversation, tid, speaker, text, ts, vec)
                 for (tid, (speaker, text, ts)), vec in zip(turns.items(), turn_vectors)])
            await cur.executemany(
                "INSERT INTO memory.segments (tenant, conversation_id, segment_id, seq, turn_ids, overlap_turns,"
                " start_ts, end_ts, raw_text, token_estimate, close_reason, summary, status)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, 100, 'budget', %s, 'enriched')",
                [(tenant, conversation, sid, seq, ids, 1 if seq else 0, turns[ids[0]][2], turns[ids[-1]][2],
                  "\n".join(f"[{turns[t][2]:%Y-%m-%d %H:%M}] {turns[t][0]}: {turns[t][1]}" for t in ids),
                  f"Summary of {sid}.")
                 for seq, (sid, ids) in enumerate(segments.items())])
            await cur.executemany(
                "INSERT INTO memory.entities (tenant, entity_id, name, normalized_name, aliases, embedding, first_seen)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s)",
                [(tenant, entity[n], n, normalize_name(n), ALIASES.get(n, []), vec, at("2019-01-01"))
                 for n, vec in zip(names, name_vectors)])
            await cur.executemany(
                "INSERT INTO memory.gists (tenant, gist_id, conversation_id, segment_id, ordinal, text, event_date,"
                " date_precision, turn_ids, said_at, embedding) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                [(tenant, gid, conversation, gid.split("/")[0], int(gid[-2:]),
                  f"{d if p == 'day' else d[:7]}: {text}", date.fromisoformat(d), p, ids, turns[ids[0]][2], vec)
                 for (gid, d, p, text, ids, _), vec in zip(gists, gist_vectors)])
            await cur.executemany(
                "INSERT INTO memory.gist_mentions (tenant, gist_id, entity_id) VALUES (%s, %s, %s)",
                [(tenant, g[0], entity[n]) for g in gists for n in g[5]])
            await cur.executemany(
                "INSERT INTO memory.facts (tenant, fact_id, conversation_id, segment_id, ordinal, subject_id,"
                " predicate, object_id, point_in_time, start_time, end_time, turn_ids, said_at)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                [(tenant, fid, conversation, fid.split("/")[0], int(fid[-2:]), entity[s], p, entity[o],
                  pit and date.fromisoformat(pit), st and date.fromisoformat(st), et and date.fromisoformat(et),
                  [turn], turns[turn][2])
                 for fid, s, p, o, pit, st, et, turn in facts])


@pytest.fixture
async def memory(postgres, embedder, unique) -> AsyncIterator[Memory]:
    pool = create_pool(postgres)
    await pool.open(wait=True)
    tenant, other, conversation = unique("tools"), unique("tools-other"), unique("conv")
    await seed(pool, embedder, tenant, conversation, TURNS, SEGMENTS, GISTS, FACTS)
    await seed(pool, embedder, other, conversation, OTHER_TURNS, OTHER_SEGMENTS, OTHER_GISTS, OTHER_FACTS)
    try:
        yield Memory(pool, embedder, tenant, other, conversation)
    finally:
        await pool.close()


async def run(memory: Memory, tool, *, tenant: str | None = None, scope: str | None = None, **kwargs):
    """Run a tool function inside `scope`'s tenant_scope (default: the memory's tenant)."""
    scope = scope or memory.tenant
    async with memory.pool.connection() as conn, tenant_scope(conn, scope):
        return await tool(conn, tenant=tenant or scope, **kwargs)


async def call(memory: Memory, name: str, arguments, *, tenant: str | None = None, conversation_ids=None):
    tenant = tenant or memory.tenant
    async with memory.pool.connection() as conn, tenant_scope(conn, tenant):
        result = await call_tool(conn, name, arguments, tenant=tenant, embedder=memory.embedder,
                                 conversation_ids=conversation_ids, asked_at=ASKED_AT)
    json.dumps(result)  # JSON as it is
    return result


def objects(result) -> list[str]:
    return [f.object for f in result.facts]


# --------------------------------------------------------------------------- facts
async def test_ordering_gives_the_first_and_last_race(memory):
    first = await run(memory, find_entity_contexts, subject="Alice", predicate="ran race", aggregate="first")
    last = await run(memory, find_entity_contexts, subject="Alice", predicate="ran_race", aggregate="last")
    assert objects(first) == ["Porto Half Marathon"] and objects(last) == ["Valencia 10K"]
    assert first.total == last.total == 5  # the overlap duplicate of the Berlin Marathon counts once
    newest = await run(memory, find_entity_contexts, subject="alice", predicate="ran_race", order="desc", limit=3)
    assert objects(newest) == ["Valencia 10K", "Madrid 5K", "Berlin Marathon"]
    everything = await run(memory, find_entity_contexts, subject="Alice", predicate="ran_race", limit=50)
    assert objects(everything) == ["Porto Half Marathon", "Lisbon 10K", "Berlin Marathon", "Madrid 5K",
                                   "Valencia 10K"]
    berlin = everything.facts[2]
    assert (berlin.fact_id, berlin.subject, berlin.predicate, berlin.point_in_time) == (
        "seg1/f03", "Alice", "ran_race", date(2024, 9, 29))
    assert berlin.turn_ids == ["t06"] and berlin.conversation_id == memory.conversation
    assert berlin.said_at == TURNS["t06"][2] and berlin.start_time is None and berlin.end_time is None


async def test_offset_gives_the_second_race_and_last_with_offset_the_one_before_the_latest(memory):
    second = await run(memory, find_entity_contexts, subject="Alice", predicate="ran_race", limit=1, offset=1)
    assert objects(second) == ["Lisbon 10K"] and second.total == 5
    before_last = await run(memory, find_entity_contexts, subject="Alice", predicate="ran_race", aggregate="last",
                            offset=1)
    assert objects(before_last) == ["Madrid 5K"]
    beyond = await run(memory, find_entity_contexts, subject="Alice", predicate="ran_race", offset=10)
    assert beyond.facts == [] and beyond.total == 5


async def test_counting_races_in_a_year_and_last_year(memory):
    in_2024 = await run(memory, find_entity_contexts, subject="Alice", predicate="ran_race", aggregate="count",
                        start=date(2024, 1, 1), end=date(2024, 12, 31))
    assert in_2024.count == 3 and objects(in_2024) == ["Lisbon 10K", "Berlin Marathon", "Madrid 5K"]
    # Asked on 2025-06-15: "last year" is all of 2024.
    last_year = await call(memory, "find_entity_contexts",
                           {"subject": "Alice", "predicate": "ran_race", "aggregate": "count", "during": "last year"})
    assert last_year["count"] == 3 and last_year["range"] == {"start": "2024-01-01", "end": "2024-12-31"}
    this_year = await call(memory, "find_entity_contexts",
                           {"subject": "Alice", "predicate": "ran_race", "aggregate": "count", "start": "2025"})
    assert this_year["count"] == 1 and this_year["facts"][0]["object"] == "Valencia 10K"


async def test_time_filters_in_may_2023_and_undated_facts_by_when_they_were_said(memory):
    may = await call(memory, "find_entity_contexts", {"subject": "Alice", "start": "May 2023", "end": "May 2023"})
    assert may["range"] == {"start": "2023-05-01", "end": "2023-05-31"}
    # Events in May, and the period that spans it (ordered by its start).
    assert [(f["predicate"], f["object"], f["point_in_time"]) for f in may["facts"]] == [
        ("lives_in", "Porto", None), ("ran_race", "Porto Half Marathon", "2023-05-14"),
        ("visited", "Paris", "2023-05-20")]
    august = await call(memory, "find_entity_contexts", {"subject": "Alice", "during": "August 2023"})
    assert [(f["predicate"], f["object"]) for f in august["facts"]] == [
        ("lives_in", "Porto"), ("visited", "Rome"), ("works_at", "Acme")]
    # Before a date: only an end bound ("end" closes its whole period).
    before = await call(memory, "find_entity_contexts", {"predicate": "visited", "end": "2023-06"})
    assert [f["object"] for f in before["facts"]] == ["Paris"]


async def test_contradicting_facts_current_versus_history(memory):
    current = await run(memory, find_entity_contexts, subject="Alice", predicate="lives", current_only=True)
    assert objects(current) == ["Lisbon"] and current.predicates == ["lives_in"]
    in_2022 = await call(memory, "find_entity_contexts",
                         {"subject": "Alice", "predicate": "lives_in", "during": "2022"})
    assert [f["object"] for f in in_2022["facts"]] == ["Porto"]
    porto = in_2022["facts"][0]
    assert (porto["start_time"], porto["end_time"], porto["point_in_time"]) == ("2019-01-01", "2024-03-01", None)
    # March 2024 overlaps both periods: history in time order; newest first on request.
    march = await call(memory, "find_entity_contexts",
                       {"subject": "Alice", "predicate": "lives_in", "during": "March 2024", "order": "desc"})
    assert [f["object"] for f in march["facts"]] == ["Lisbon", "Porto"]
    # An open-ended period holds until today.
    now = await run(memory, find_entity_contexts, subject="Alice", predicate="lives_in",
                    start=date(2025, 6, 1), end=date(2025, 6, 15))
    assert objects(now) == ["Lisbon"]
    # current_only keeps one fact per subject and predicate.
    latest = await run(memory, find_entity_contexts, subject="Alice", current_only=True, limit=50)
    assert sorted((f.predicate, f.object) for f in latest.facts) == [
        ("lives_in", "Lisbon"), ("ran_race", "Valencia 10K"), ("visited", "Rome"), ("works_at", "Acme")]


async def test_entity_and_predicate_matching(memory):
    # Exact normalised name wins over containment: "Porto" is not the Porto Half Marathon.
    porto = await run(memory, find_entity_contexts, object="the Porto")
    assert porto.objects == ["Porto"] and objects(porto) == ["Porto"]
    # An alias, then containment in a normalised name.
    alias = await run(memory, find_entity_contexts, subject="ALI", predicate="visited")
    assert alias.subjects == ["Alice"] and objects(alias) == ["Paris", "Rome"]
    marathons = await run(memory, find_entity_contexts, object="marathon")
    assert sorted(marathons.objects) == ["Berlin Marathon", "Porto Half Marathon"]
    assert objects(marathons) == ["Porto Half Marathon", "Berlin Marathon"]
    # Predicates: exact, else prefix ('lives' -> 'lives_in'), else containment ('race' -> 'ran_race').
    assert (await run(memory, find_entity_contexts, predicate="race")).predicates == ["ran_race"]
    # A name or predicate that matches nothing filters everything out (never ignored).
    nobody = await run(memory, find_entity_contexts, subject="Zebedee", aggregate="count")
    assert nobody.count == 0 and nobody.facts == [] and nobody.subjects == []
    nothing = await run(memory, find_entity_contexts, subject="Alice", predicate="owns")
    assert nothing.total == 0 and nothing.predicates == []
    # The caller's conversation scope applies.
    elsewhere = await run(memory, find_entity_contexts, subject="Alice", conversation_ids=["another-conversation"])
    assert elsewhere.total == 0


# --------------------------------------------------------------------------- retrieval
async def test_lexical_retrieval_of_gists_and_turns_with_time_filters(memory):
    berlin = await run(memory, lexical_retrieve, query="Berlin marathon", target="gists", operator="and")
    assert {g.gist_id for g in berlin} == {"seg1/g02", "seg2/g00"}
    assert berlin[0].event_date == date(2024, 9, 29) and berlin[0].turn_ids == ["t06"]
    any_word = await call(memory, "lexical_retrieve", {"query": "Marathon in Madrid", "during": "2023"})
    assert [r["gist_id"] for r in any_word["results"]] == ["seg0/g00"]
    phrase = await run(memory, lexical_retrieve, query="half marathon", operator="phrase")
    assert [g.gist_id for g in phrase] == ["seg0/g00"]
    assert await run(memory, lexical_retrieve, query="marathon half", operator="phrase") == []
    # A month-precision gist covers its whole month.
    cello = await call(memory, "lexical_retrieve", {"query": "cello", "start": "2023-05-20", "end": "2023-06-30"})
    assert [(r["gist_id"], r["date_precision"]) for r in cello["results"]] == [("seg0/g02", "month")]
    assert (await call(memory, "lexical_retrieve", {"query": "cello", "during": "June 2023"}))["results"] == []
    # Turns: filtered on the speaker's local day; each carries its segment for read_segment.
    rain = await call(memory, "lexical_retrieve", {"query": "rain", "target": "turns", "during": "2024-02-11"})
    assert [(r["turn_id"], r["segment_id"], r["ts"]) for r in rain["results"]] == [
        ("t04", "seg1", "2024-02-11T20:00:00+01:00")]
    assert (await call(memory, "lexical_retrieve",
                       {"query": "rain", "target": "turns", "during": "2024-02-12"}))["results"] == []
    assert await run(memory, lexical_retrieve, query="the of and", target="turns") == []  # stop words only


async def test_semantic_retrieval_of_gists_and_turns_with_time_filters(memory):
    query = "Which marathon did Alice run in Berlin?"
    vector = memory.embedder.embed_query(query)
    gists = await run(memory, semantic_retrieve, vector=vector, target="gists", limit=3)
    assert gists[0].gist_id in {"seg1/g02", "seg2/g00"} and gists[0].score > 0.8
    assert [g.score for g in gists] == sorted((g.score for g in gists), reverse=True)
    only_2023 = await call(memory, "semantic_retrieve", {"query": query, "during": "2023", "limit": 2})
    assert [r["gist_id"] for r in only_2023["results"]][0] == "seg0/g00"
    assert all(r["event_date"].startswith("2023") for r in only_2023["results"])
    turns = await call(memory, "semantic_retrieve",
                       {"query": "a cold morning race in Valencia", "target": "turns", "limit": 1})
    assert [(r["turn_id"], r["segment_id"]) for r in turns["results"]] == [("t08", "seg2")]
    before_2025 = await call(memory, "semantic_retrieve",
                             {"query": "a cold morning race in Valencia", "target": "turns", "end": "2024",
                              "limit": 50})
    assert len(before_2025["results"]) == 7 and "t08" not in {r["turn_id"] for r in before_2025["results"]}
    scoped = await run(memory, semantic_retrieve, vector=vector, conversation_ids=["another-conversation"])
    assert scoped == []


# --------------------------------------------------------------------------- exploration
async def test_find_gist_contexts_gives_source_turns_neighbours_entities_and_similar(memory):
    found = await run(memory, find_gist_contexts, gist_id="seg1/g02", window=2)
    assert found is not None and found.gist.text == "2024-09-29: Alice ran the Berlin Marathon in under four hours."
    assert [(t.turn_id, t.speaker, t.text) for t in found.source_turns] == [("t06", "Alice", TURNS["t06"][1])]
    assert found.source_turns[0].ts == TURNS["t06"][2]
    assert [g.gist_id for g in found.before] == ["seg1/g00", "seg1/g01"]
    assert [g.gist_id for g in found.after] == ["seg2/g00", "seg2/g01"]
    assert [e.name for e in found.entities] == ["Alice", "Berlin Marathon"]
    assert next(e for e in found.entities if e.name == "Alice").aliases == ["Ali"]
    # Only the paraphrase is above 0.8 (the other races are about 0.6-0.7).
    assert [g.gist_id for g in found.similar] == ["seg2/g00"] and found.similar[0].score > 0.8
    edge = await call(memory, "find_gist_contexts", {"gist_id": "seg0/g00", "window": 1})
    # Neighbours follow event_date: the May 2023 (month precision) gist sorts at 2023-05-01.
    assert edge["found"] and [g["gist_id"] for g in edge["before"]] == ["seg0/g02"]
    assert [g["gist_id"] for g in edge["after"]] == ["seg0/g01"]
    assert [e["name"] for e in edge["entities"]] == ["Alice", "Marta", "Porto Half Marathon"]
    assert await run(memory, find_gist_contexts, gist_id="seg9/g00") is None
    missing = await call(memory, "find_gist_contexts", {"gist_id": "seg9/g00"})
    assert missing["found"] is False and "seg9/g00" in missing["error"]


async def test_read_segment_returns_text_summary_and_turns_in_order(memory):
    segment = await run(memory, read_segment, segment_id="seg2")
    assert segment is not None and segment.summary == "Summary of seg2." and segment.status == "enriched"
    assert [t.turn_id for t in segment.turns] == ["t06", "t07", "t08"]
    assert "Berlin Marathon" in segment.raw_text and segment.turns[1].text == TURNS["t07"][1]
    assert segment.start_ts == TURNS["t06"][2] and segment.end_ts == TURNS["t08"][2]
    read = await call(memory, "read_segment", {"segment_id": "seg0"})
    assert read["found"] and [t["turn_id"] for t in read["segment"]["turns"]] == ["t01", "t02", "t03"]
    assert read["segment"]["turns"][0]["ts"] == "2023-05-15T20:00:00+01:00"
    assert (await call(memory, "read_segment", {"segment_id": "nope"}))["found"] is False
    assert await run(memory, read_segment, segment_id="seg0", conversation_ids=["another-conversation"]) is None


# --------------------------------------------------------------------------- validation and isolation
@pytest.mark.parametrize(("name", "arguments", "message"), [
    ("find_entity_contexts", {"subject": "Alice", "limit": 0}, "limit"),
    ("find_entity_contexts", {"subject": "Alice", "limit": 51}, "limit"),
    ("find_entity_contexts", {"subject": "Alice", "offset": 1001}, "offset"),
    ("find_entity_contexts", {"subject": "Alice", "aggregate": "sum"}, "aggregate"),
    ("find_entity_contexts", {"subject": "Alice", "during": "the day the music died"}, "cannot read"),
    ("find_entity_contexts", {"subject": "Alice", "start": "2024", "end": "2023"}, "empty time range"),
    ("lexical_retrieve", {"query": "Berlin", "sql": "DROP TABLE memory.facts"}, "sql"),
    ("lexical_retrieve", {"query": "Berlin", "operator": "near"}, "operator"),
    ("semantic_retrieve", {"query": ""}, "query"),
    ("read_segment", {}, "segment_id"),
    ("drop_tables", {}, "unknown tool"),
    ("output_answer", {"answer": "", "abstain": False}, "abstain"),
])
async def test_bad_arguments_and_unknown_tools_are_rejected_as_data(memory, name, arguments, message):
    with pytest.raises(ToolArgumentError, match=message) as raised:
        await call(memory, name, arguments)
    assert isinstance(raised.value, ValueError) and raised.value.tool == name


async def test_output_answer_is_validated_and_echoed_and_every_tool_has_a_spec(memory):
    answer = await call(memory, "output_answer", '{"answer": "Lisbon", "evidence": ["seg1/f02"]}')
    assert answer == {"tool": "output_answer", "answer": "Lisbon", "abstain": False, "evidence": ["seg1/f02"]}
    assert [s["name"] for s in TOOL_SPECS] == ["semantic_retrieve", "lexical_retrieve", "find_gist_contexts",
                                              "find_entity_contexts", "read_segment", "output_answer"]
    assert all(s["parameters"]["additionalProperties"] is False for s in TOOL_SPECS)


async def test_another_tenants_memory_never_appears(memory):
    current = await run(memory, find_entity_contexts, subject="Alice", predicate="lives_in", current_only=True)
    assert objects(current) == ["Lisbon"]
    # Their entity "Madrid" does not exist here: the name falls back to containment, "Madrid 5K".
    madrid = await run(memory, find_entity_contexts, object="Madrid")
    assert madrid.objects == ["Madrid 5K"] and objects(madrid) == ["Madrid 5K"]
    berlin = await run(memory, lexical_retrieve, query="Berlin charity", target="gists")
    assert {g.gist_id for g in berlin} == {"seg1/g02", "seg2/g00"}
    assert all("charity" not in g.text for g in berlin)
    vector = memory.embedder.embed_query("Alice ran the Berlin Marathon for charity.")
    assert all("charity" not in g.text for g in await run(memory, semantic_retrieve, vector=vector, limit=50))
    assert "Madrid" not in (await run(memory, read_segment, segment_id="seg0")).raw_text
    # Naming the other tenant inside this tenant's scope shows nothing: the database enforces it.
    for tool, kwargs in [(find_entity_contexts, {"subject": "Alice"}),
                         (lexical_retrieve, {"query": "Berlin"}),
                         (semantic_retrieve, {"vector": vector})]:
        result = await run(memory, tool, tenant=memory.other_tenant, scope=memory.tenant, **kwargs)
        assert (result.total if hasattr(result, "total") else len(result)) == 0
    assert await run(memory, find_gist_contexts, tenant=memory.other_tenant, scope=memory.tenant,
                     gist_id="seg0/g00") is None
    # And the other tenant sees only its own.
    theirs = await run(memory, find_entity_contexts, scope=memory.other_tenant, subject="Alice", current_only=True)
    assert sorted(objects(theirs)) == ["Berlin Marathon", "Madrid"]
    count = await call(memory, "find_entity_contexts", {"predicate": "ran_race", "aggregate": "count"},
                       tenant=memory.other_tenant)
    assert count["count"] == 1
