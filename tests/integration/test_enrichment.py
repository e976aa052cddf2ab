"""Enrichment on real PostgreSQL (with AGE) and OpenAI-compatible servers: a
scripted one for exact output, and the real local model for schema validity."""

from __future__ import annotations

import json
from datetime import date

import psycopg
import pytest

from epistream.errors import ModelOutputError
from epistream.pipeline.store.graph import _statement
from epistream.testing.scripted_llm import ScriptedLLM

from .seed import run_enrichment, scripted_reply, seed_segment

pytestmark = pytest.mark.integration

def _agtype(value: str | None):
    """psycopg returns agtype as its text form (JSON for scalars), NULL as None."""
    return None if value is None else json.loads(value)


def _cypher(db_url: str, cypher: str, params: dict, returns: str):
    with psycopg.connect(db_url) as conn:
        conn.execute("LOAD 'age'")
        conn.execute("SET search_path = ag_catalog, public")
        return conn.execute(_statement(cypher, returns), (json.dumps(params),)).fetchall()


def test_known_output_yields_dated_gists_facts_with_qualifiers_and_the_graph(postgres, db_url, unique):
    tenant, conversation = unique("tenant"), unique("conv")
    segment, turns = seed_segment(tenant, conversation)
    with ScriptedLLM(scripted_reply) as server:
        outcome, metrics = run_enrichment(postgres, server.base_url, segment, turns)
    assert outcome.enriched and outcome.counts is not None
    with psycopg.connect(db_url) as conn:
        gists = conn.execute("SELECT text, event_date, turn_ids FROM memory.gists WHERE tenant = %s ORDER BY ordinal",
                             (tenant,)).fetchall()
        facts = conn.execute(
            "SELECT s.name, f.predicate, o.name, f.point_in_time, f.start_time, f.end_time FROM memory.facts f"
            " JOIN memory.entities s ON s.tenant = f.tenant AND s.entity_id = f.subject_id"
            " JOIN memory.entities o ON o.tenant = f.tenant AND o.entity_id = f.object_id"
            " WHERE f.tenant = %s ORDER BY f.ordinal", (tenant,)).fetchall()
        current = conn.execute(
            "SELECT o.name FROM memory.current_facts f JOIN memory.entities s ON s.tenant = f.tenant"
            " AND s.entity_id = f.subject_id JOIN memory.entities o ON o.tenant = f.tenant"
            " AND o.entity_id = f.object_id WHERE f.tenant = %s AND s.name = 'Alice' AND f.predicate = 'lives_in'",
            (tenant,)).fetchall()
        status = conn.execute("SELECT status, summary IS NOT NULL, summary_embedding IS NOT NULL FROM memory.segments"
                              " WHERE tenant = %s", (tenant,)).fetchone()
    # Monday 2024-03-18: "last Wednesday" is 2024-03-13; "two weeks ago" is 2024-03-04.
    assert gists[0] == ("2024-03-13: Alice moved to Lisbon.", date(2024, 3, 13), ["t001"])
    assert gists[1][1] == date(2024, 3, 4) and gists[2][1] == date(2024, 2, 26)
    assert facts == [
        ("Alice", "lives_in", "Porto", None, date(2019, 1, 1), date(2024, 3, 1)),
        ("Alice", "lives_in", "Lisbon", None, date(2024, 3, 13), None),
        ("Bob", "adopted", "Rex", date(2024, 3, 4), None, None),
        ("Alice", "adopted", "Miso", date(2024, 2, 26), None, None),
    ]
    # History is kept; "current" is the newer move.
    assert current == [("Lisbon",)]
    assert status == ("enriched", True, True)

    edges = _cypher(db_url, "MATCH (s:Entity {tenant: $tenant})-[f:FACT]->(o:Entity) RETURN s.name, f.predicate,"
                            " o.name, f.start_time ORDER BY f.fact_id", {"tenant": tenant},
                    "s agtype, p agtype, o agtype, t agtype")
    assert [tuple(_agtype(v) for v in row) for row in edges] == [
        ("Alice", "lives_in", "Porto", "2019-01-01"), ("Alice", "lives_in", "Lisbon", "2024-03-13"),
        ("Bob", "adopted", "Rex", None), ("Alice", "adopted", "Miso", None),
    ]
    mentions = _cypher(db_url, "MATCH (g:Gist {tenant: $tenant})-[:MENTIONS]->(e:Entity) RETURN g.gist_id, e.name"
                               " ORDER BY g.gist_id, e.name", {"tenant": tenant}, "g agtype, e agtype")
    assert ("Bob", "Rex") == tuple(_agtype(e) for g, e in mentions if _agtype(g).endswith("g01"))
    similar = _cypher(db_url, "MATCH (a:Gist {tenant: $tenant})-[s:SIMILAR]->(b:Gist) RETURN a.gist_id, b.gist_id,"
                              " s.similarity", {"tenant": tenant}, "a agtype, b agtype, s agtype")
    # Only the paraphrase pair is above 0.8 (the two different adoptions are about 0.5).
    assert [(_agtype(a)[-3:], _agtype(b)[-3:]) for a, b, _ in similar] == [("g03", "g01")]
    assert all(float(s) > 0.8 for _, _, s in similar)
    assert metrics.memory_items.labels("fact")._value.get() == 4


def test_enriching_twice_yields_the_same_rows(postgres, db_url, unique):
    tenant, conversation = unique("tenant"), unique("conv")
    segment, turns = seed_segment(tenant, conversation)

    def snapshot():
        with psycopg.connect(db_url) as conn:
            return [conn.execute(f"SELECT * FROM memory.{table} WHERE tenant = %s ORDER BY 2", (tenant,)).fetchall()
                    for table in ("gists", "facts", "entities", "gist_mentions")]

    def graph_counts():
        return _cypher(db_url, "MATCH (n {tenant: $tenant}) OPTIONAL MATCH (n)-[r]->() RETURN count(DISTINCT n),"
                               " count(r)", {"tenant": tenant}, "n agtype, r agtype")

    with ScriptedLLM(scripted_reply) as server:
        run_enrichment(postgres, server.base_url, segment, turns)
        first, first_graph = snapshot(), graph_counts()
        # A redelivery of an enriched segment costs no model call.
        outcome, metrics = run_enrichment(postgres, server.base_url, segment, turns)
        assert len(server.requests) == 1 and outcome.enriched
        assert metrics.segments_enriched.labels("done")._value.get() == 1
        # Enriching it again for real (as a new prompt version would) replaces its rows with the same ones.
        with psycopg.connect(db_url) as conn:
            conn.execute("UPDATE memory.segments SET status = 'pending' WHERE tenant = %s", (tenant,))
        run_enrichment(postgres, server.base_url, segment, turns)
        assert len(server.requests) == 2
    assert snapshot() == first and graph_counts() == first_graph
    assert len(first[0]) == 4 and len(first[1]) == 4


def test_a_forgotten_segment_costs_no_model_call(postgres, db_url, unique):
    tenant, conversation = unique("tenant"), unique("conv")
    segment, turns = seed_segment(tenant, conversation)
    outcome, metrics = run_enrichment(postgres, "http://unused", segment, turns, segment_row=False)
    assert not outcome.enriched and outcome.error is None
    assert metrics.segments_enriched.labels("forgotten")._value.get() == 1


def test_invalid_output_is_retried_then_the_segment_fails_and_its_turns_stay_searchable(postgres, db_url, unique):
    tenant, conversation = unique("tenant"), unique("conv")
    segment, turns = seed_segment(tenant, conversation)
    with ScriptedLLM(lambda body: (200, '{"summary": "no gists here"}')) as server:
        outcome, metrics = run_enrichment(postgres, server.base_url, segment, turns, retries=2)
        assert len(server.requests) == 3
    assert not outcome.enriched and isinstance(outcome.error, ModelOutputError)
    with psycopg.connect(db_url) as conn:
        status, error, attempts = conn.execute(
            "SELECT status, error, attempts FROM memory.segments WHERE tenant = %s", (tenant,)).fetchone()
        searchable = conn.execute(
            "SELECT count(*) FROM memory.turns WHERE tenant = %s AND tsv @@ plainto_tsquery('english', 'Lisbon')",
            (tenant,)).fetchone()[0]
    assert status == "failed" and "gists" in error and attempts == 1
    assert searchable == 1
    assert metrics.segments_enriched.labels("failed")._value.get() == 1


def test_the_real_local_model_produces_schema_valid_rows(stack, db_url, unique):
    tenant, conversation = unique("tenant"), unique("conv")
    segment, turns = seed_segment(tenant, conversation)
    outcome, _ = run_enrichment(stack, stack.llm_base_url, segment, turns)
    assert outcome.enriched, outcome.error
    with psycopg.connect(db_url) as conn:
        gists = conn.execute("SELECT text, event_date, turn_ids FROM memory.gists WHERE tenant = %s",
                             (tenant,)).fetchall()
        facts = conn.execute("SELECT predicate, turn_ids FROM memory.facts WHERE tenant = %s", (tenant,)).fetchall()
    turn_ids = {t.turn_id for t in turns}
    assert gists and facts
    for text, event_date, ids in gists:
        assert text.startswith(event_date.isoformat()[:4]) and set(ids) <= turn_ids
    for predicate, ids in facts:
        assert predicate and set(ids) <= turn_ids
