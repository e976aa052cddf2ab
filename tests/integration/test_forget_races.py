"""Forgetting while the indexer writes: whichever transaction comes second, nothing
of the forgotten conversation is left (tables, graph, segment outbox), and
entities that survive keep only the names the surviving conversations gave them.

Each interleaving is forced, not hoped for: the writer is held at a point after
its tombstone check (a pause around one of its store calls), the forget runs on
its own connection until it either commits or waits on a lock (seen in
pg_stat_activity), and only then is the writer let go.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from datetime import UTC, date, datetime, timedelta

import numpy as np
import psycopg
import pytest

from epistream.contracts.segments import Segment, SegmentTurn
from epistream.core.metrics import Metrics
from epistream.pipeline import ingest
from epistream.pipeline.enrichment import Enrichment, FactRow, GistRow
from epistream.pipeline.ingest import ingest_batch
from epistream.pipeline.records import RawRecord
from epistream.pipeline.segmenter import SegmenterConfig
from epistream.pipeline.store import graph, memory
from epistream.pipeline.store.forget import forget
from epistream.storage.db import create_pool, tenant_scope

from .helpers import make_turns

pytestmark = pytest.mark.integration

DIM = 384
# Small segments: a few turns close one, so the outbox (memory.segments) is part of what must go.
SEGMENTER = SegmenterConfig(max_tokens=60)
T0 = datetime(2024, 5, 6, 9, 0, tzinfo=UTC)


class _HashEmbedder:
    """Deterministic unit vectors from the text: the ingest path without the ONNX model."""

    def embed(self, texts: list[str]) -> np.ndarray:
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
            v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
            rows.append(v / np.linalg.norm(v))
        return np.stack(rows) if rows else np.zeros((0, DIM), dtype=np.float32)


class _Pause:
    """Holds the first matching call until released."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.release = asyncio.Event()
        self.used = False

    async def hold(self) -> None:
        if self.used:
            return
        self.used = True
        self.reached.set()
        await self.release.wait()


async def _observer(db_url: str) -> psycopg.AsyncConnection:
    return await psycopg.AsyncConnection.connect(db_url, autocommit=True)


async def _forget_until_blocked_or_done(pool, observer, tenant: str, conversation: str | None):
    """Start a forget on its own connection; return (task, how) once it committed ("done") or
    waits on a lock another transaction holds ("blocked")."""
    pid: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def run():
        async with pool.connection() as conn:
            pid.set_result(conn.info.backend_pid)
            return await forget(conn, tenant, conversation)

    task = asyncio.create_task(run())
    backend = await asyncio.wait_for(pid, 30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if task.done():
            return task, "done"
        cur = await observer.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (backend,))
        row = await cur.fetchone()
        if row is not None and row[0] == "Lock":
            return task, "blocked"
        await asyncio.sleep(0.01)  # polling a condition, with a deadline: never a guess at timing
    raise AssertionError("forget neither finished nor waited on a lock")


async def _left_of(observer, tenant: str, conversation: str | None) -> dict[str, int]:
    """Rows and graph elements of the conversation (or, with None, of the tenant) still stored."""
    where = "tenant = %s" + ("" if conversation is None else " AND conversation_id = %s")
    args = (tenant,) if conversation is None else (tenant, conversation)
    left = {}
    for table in ("turns", "segmenter_state", "segments", "gists", "facts"):
        cur = await observer.execute(f"SELECT count(*) FROM memory.{table} WHERE {where}", args)  # noqa: S608
        left[table] = (await cur.fetchone())[0]
    left["graph"] = len(await _graph_elements(observer, tenant, conversation))
    return left


async def _graph_elements(observer, tenant: str, conversation: str | None) -> list:
    await observer.execute("LOAD 'age'")
    await observer.execute("SET search_path = ag_catalog, public")
    params = {"tenant": tenant, "prefix": "" if conversation is None else f"{conversation}#"}
    rows = []
    for cypher in ("MATCH (g:Gist {tenant: $tenant}) WHERE g.segment_id STARTS WITH $prefix RETURN g.gist_id",
                   "MATCH ()-[r {tenant: $tenant}]->() WHERE r.segment_id STARTS WITH $prefix RETURN id(r)"):
        cur = await observer.execute(graph._statement(cypher), (json.dumps(params),))
        rows += await cur.fetchall()
    if conversation is None:
        cur = await observer.execute(graph._statement("MATCH (n {tenant: $tenant}) RETURN id(n)"),
                                     (json.dumps(params),))
        rows += await cur.fetchall()
    return rows


def _records(turns) -> list[RawRecord]:
    now_ms = int(time.time() * 1000)
    return [RawRecord("memory.turns", 0, i, t.conversation_id.encode(), t.to_bytes(), now_ms)
            for i, t in enumerate(turns)]


def _dialogue(n: int, first: int = 1) -> list[tuple[str, str]]:
    return [("Ana" if i % 2 else "Ben", f"turn {i} about the trip to the coast and the boat") for i in
            range(first, first + n)]


async def _open_pool(settings):
    pool = create_pool(settings.with_overrides(db_pool_min=1, db_pool_max=4))
    await pool.open(wait=True)
    return pool


@pytest.mark.parametrize("whole_tenant", [False, True], ids=["conversation", "whole-tenant"])
async def test_an_ingest_that_checked_the_tombstones_before_a_forget_leaves_nothing(
    postgres, db_url, unique, monkeypatch, whole_tenant
):
    tenant, gone, kept = unique("tenant"), unique("gone"), unique("kept")
    pool, observer = await _open_pool(postgres), await _observer(db_url)
    metrics, embedder = Metrics.create(), _HashEmbedder()
    try:
        first = make_turns(tenant, gone, _dialogue(4)) + make_turns(tenant, kept, _dialogue(4))
        await ingest_batch(_records(first), pool=pool, embedder=embedder, metrics=metrics, segmenter=SEGMENTER)
        later = [t.model_copy(update={"turn_id": f"u{t.turn_id}"}) for t in first]

        # The batch is held after its tombstone check, right before it writes the turns.
        pause, real_upsert = _Pause(), ingest.upsert_turns

        async def held_upsert(conn, turns, *args, **kwargs):
            await pause.hold()
            return await real_upsert(conn, turns, *args, **kwargs)

        monkeypatch.setattr(ingest, "upsert_turns", held_upsert)
        writing = asyncio.create_task(ingest_batch(_records(later), pool=pool, embedder=embedder, metrics=metrics,
                                                   segmenter=SEGMENTER))
        await asyncio.wait_for(pause.reached.wait(), 30)
        forgetting, _ = await _forget_until_blocked_or_done(pool, observer, tenant, None if whole_tenant else gone)
        pause.release.set()
        await asyncio.wait_for(writing, 60)
        await asyncio.wait_for(forgetting, 60)

        assert await _left_of(observer, tenant, None if whole_tenant else gone) == dict.fromkeys(
            ("turns", "segmenter_state", "segments", "gists", "facts", "graph"), 0)
        if not whole_tenant:
            assert (await _left_of(observer, tenant, kept))["turns"] == 8
        # A replay after the forget stores nothing either.
        replay = await ingest_batch(_records(later), pool=pool, embedder=embedder, metrics=metrics,
                                    segmenter=SEGMENTER)
        assert set(o for o, t in zip(replay.outcomes, later, strict=True) if t.conversation_id == gone) == \
            {"tombstoned"}
    finally:
        await observer.close()
        await pool.close()


async def test_a_forget_in_progress_holds_an_ingest_until_it_commits_and_the_ingest_then_skips(
    postgres, db_url, unique, monkeypatch
):
    tenant, gone = unique("tenant"), unique("gone")
    pool, observer = await _open_pool(postgres), await _observer(db_url)
    metrics, embedder = Metrics.create(), _HashEmbedder()
    try:
        turns = make_turns(tenant, gone, _dialogue(6))
        await ingest_batch(_records(turns[:3]), pool=pool, embedder=embedder, metrics=metrics, segmenter=SEGMENTER)
        # The forget is held after its tombstone is written, before it deletes anything.
        pause, real_run = _Pause(), graph.run

        async def held_run(conn, statement, params):
            if "DELETE" in statement:
                await pause.hold()
            return await real_run(conn, statement, params)

        monkeypatch.setattr(graph, "run", held_run)
        forgetting = asyncio.create_task(_forget_on(pool, tenant, gone))
        await asyncio.wait_for(pause.reached.wait(), 30)
        writing = asyncio.create_task(ingest_batch(_records(turns[3:]), pool=pool, embedder=embedder,
                                                   metrics=metrics, segmenter=SEGMENTER))
        await _until_blocked_or_done(observer, writing)
        pause.release.set()
        await asyncio.wait_for(forgetting, 60)
        result = await asyncio.wait_for(writing, 60)
        assert await _left_of(observer, tenant, gone) == dict.fromkeys(
            ("turns", "segmenter_state", "segments", "gists", "facts", "graph"), 0)
        assert result.outcomes and set(result.outcomes) <= {"tombstoned", "inserted"}
    finally:
        await observer.close()
        await pool.close()


async def _forget_on(pool, tenant: str, conversation: str | None):
    async with pool.connection() as conn:
        return await forget(conn, tenant, conversation)


async def _until_blocked_or_done(observer, task: asyncio.Task) -> str:
    """Until `task` finished or some session of this database waits on a lock."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if task.done():
            return "done"
        cur = await observer.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                     " AND wait_event_type = 'Lock'")
        if (await cur.fetchone())[0]:
            return "blocked"
        await asyncio.sleep(0.01)
    raise AssertionError("the writer neither finished nor waited on a lock")


# --- enrichment ---------------------------------------------------------------------------------


def _unit(*weights: tuple[int, float]) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    for axis, w in weights:
        v[axis] = w
    return v / np.linalg.norm(v)


def _segment(tenant: str, conversation: str, seq: int, speakers: list[str]) -> Segment:
    return Segment(
        tenant=tenant, conversation_id=conversation, segment_id=f"{conversation}#{seq:04d}", seq=seq,
        close_reason="session", overlap_turns=0, token_estimate=50, produced_at=T0,
        turns=[SegmentTurn(turn_id=f"t{seq}{i}", speaker=s, text=f"{s} talks", ts=T0 + timedelta(days=seq, minutes=i))
               for i, s in enumerate(speakers)],
    )


async def _add_segment_row(pool, segment: Segment) -> None:
    async with pool.connection() as conn, tenant_scope(conn, segment.tenant):
        await conn.execute(
            "INSERT INTO memory.segments (tenant, conversation_id, segment_id, seq, turn_ids, start_ts, end_ts,"
            " raw_text, token_estimate, close_reason) VALUES (%s, %s, %s, %s, %s, %s, %s, 'raw', 50, 'session')",
            (segment.tenant, segment.conversation_id, segment.segment_id, segment.seq,
             [t.turn_id for t in segment.turns], segment.turns[0].ts, segment.turns[-1].ts),
        )


def _enrichment(segment: Segment, entities: dict[str, tuple[str, np.ndarray]], facts: list[tuple[str, str, str]],
                axis: int) -> tuple[Enrichment, np.ndarray]:
    """One gist mentioning every entity, and the facts given (normalised subject, predicate, normalised object);
    vectors: summary and gist on their own axes, then the entities' as given."""
    sid, turn = segment.segment_id, segment.turns[0]
    gist = GistRow(gist_id=f"{sid}/g00", ordinal=0, text=f"{turn.ts.date()}: something happened.",
                   event_date=turn.ts.date(), precision="day", turn_ids=(turn.turn_id,), said_at=turn.ts)
    rows = [FactRow(fact_id=f"{sid}/f{i:02d}", ordinal=i, subject=entities[s][0], predicate=p, object=entities[o][0],
                    point_in_time=date(2024, 5, 1), start_time=None, end_time=None, turn_ids=(turn.turn_id,),
                    said_at=turn.ts) for i, (s, p, o) in enumerate(facts)]
    enrichment = Enrichment(summary="summary", gists=[gist], facts=rows,
                            entities={n: surface for n, (surface, _) in entities.items()},
                            mentions={gist.gist_id: sorted(entities)})
    vectors = np.stack([_unit((axis, 1.0)), _unit((axis + 1, 1.0)), *(v for _, v in entities.values())])
    return enrichment, vectors


async def _store(pool, settings, segment: Segment, enrichment: Enrichment, vectors: np.ndarray):
    async with pool.connection() as conn:
        return await memory.store_enrichment(conn, segment, enrichment, vectors, settings=settings,
                                             prompt_version="test")


async def test_an_enrichment_committing_during_a_forget_leaves_no_gist_vertices_or_edges(
    postgres, db_url, unique, monkeypatch
):
    tenant, gone = unique("tenant"), unique("gone")
    pool, observer = await _open_pool(postgres), await _observer(db_url)
    try:
        segment = _segment(tenant, gone, 0, ["Ana", "Ben"])
        await _add_segment_row(pool, segment)
        enrichment, vectors = _enrichment(
            segment, {"ana": ("Ana", _unit((10, 1.0))), "ben": ("Ben", _unit((11, 1.0)))},
            [("ana", "knows", "ben")], axis=0)
        # The enrichment is held inside its transaction, right before its first Gist vertex.
        pause, real_run = _Pause(), graph.run

        async def held_run(conn, statement, params):
            if statement is graph.CREATE_GIST:
                await pause.hold()
            return await real_run(conn, statement, params)

        monkeypatch.setattr(graph, "run", held_run)
        storing = asyncio.create_task(_store(pool, postgres, segment, enrichment, vectors))
        await asyncio.wait_for(pause.reached.wait(), 30)
        forgetting, _ = await _forget_until_blocked_or_done(pool, observer, tenant, gone)
        pause.release.set()
        await asyncio.wait_for(storing, 60)
        await asyncio.wait_for(forgetting, 60)

        assert await _graph_elements(observer, tenant, None) == []
        assert await _left_of(observer, tenant, gone) == dict.fromkeys(
            ("turns", "segmenter_state", "segments", "gists", "facts", "graph"), 0)
        cur = await observer.execute("SELECT count(*) FROM memory.entities WHERE tenant = %s", (tenant,))
        assert (await cur.fetchone())[0] == 0
    finally:
        await observer.close()
        await pool.close()


async def test_surviving_entities_keep_only_the_names_the_surviving_conversations_gave_them(
    postgres, db_url, unique
):
    tenant, gone, kept = unique("tenant"), unique("gone"), unique("kept")
    pool, observer = await _open_pool(postgres), await _observer(db_url)
    # Near-identical vectors (cosine 0.995, over the merge threshold) make one entity of two names.
    alice, alice_near = _unit((20, 1.0)), _unit((20, 1.0), (21, 0.1))
    bob, bob_near = _unit((22, 1.0)), _unit((22, 1.0), (23, 0.1))
    rex = _unit((24, 1.0))
    try:
        steps = [
            # The forgotten conversation names Alice first ("Alice Smith") and alone knows Rex...
            (_segment(tenant, gone, 0, ["Ana"]), {"alice smith": ("Alice Smith", alice), "rex": ("Rex", rex)},
             [("alice smith", "owns", "rex")]),
            # ...the kept one calls her "Alice Smyth" (an alias of the same entity) and names Bob first...
            (_segment(tenant, kept, 0, ["Ana"]), {"alice smyth": ("Alice Smyth", alice_near), "bob": ("Bob", bob)},
             [("alice smyth", "knows", "bob")]),
            # ...and the forgotten one later calls Bob "Bobby" (an alias it alone gave).
            (_segment(tenant, gone, 1, ["Ana"]), {"bobby": ("Bobby", bob_near), "rex": ("Rex", rex)},
             [("bobby", "walks", "rex")]),
        ]
        for axis, (segment, entities, facts) in enumerate(steps):
            await _add_segment_row(pool, segment)
            enrichment, vectors = _enrichment(segment, entities, facts, axis=2 * axis)
            assert isinstance(await _store(pool, postgres, segment, enrichment, vectors), memory.StoreCounts)
        cur = await observer.execute("SELECT name, aliases FROM memory.entities WHERE tenant = %s ORDER BY name",
                                     (tenant,))
        assert await cur.fetchall() == [("Alice Smith", ["Alice Smyth"]), ("Bob", ["Bobby"]), ("Rex", [])]

        await _forget_on(pool, tenant, gone)

        cur = await observer.execute(
            "SELECT name, normalized_name, aliases, embedding::text FROM memory.entities WHERE tenant = %s"
            " ORDER BY name", (tenant,))
        rows = await cur.fetchall()
        assert [r[:3] for r in rows] == [("Alice Smyth", "alice smyth", []), ("Bob", "bob", [])]
        # The embedding is the surviving name's, not the forgotten one's.
        assert np.allclose(json.loads(rows[0][3]), alice_near, atol=1e-6)
        await observer.execute("LOAD 'age'")
        await observer.execute("SET search_path = ag_catalog, public")
        cur = await observer.execute(graph._statement("MATCH (e:Entity {tenant: $tenant}) RETURN e.name"),
                                     (json.dumps({"tenant": tenant}),))
        assert sorted(json.loads(r[0]) for r in await cur.fetchall()) == ["Alice Smyth", "Bob"]
        # No text the forgotten conversation gave survives in any table of the tenant.
        for table in ("entities", "facts", "gists", "segments", "turns"):
            cur = await observer.execute(
                f"SELECT count(*) FROM memory.{table} t WHERE t.tenant = %s"  # noqa: S608
                " AND (t::text ILIKE '%%Smith%%' OR t::text ILIKE '%%Bobby%%' OR t::text ILIKE '%%Rex%%')",
                (tenant,))
            assert (await cur.fetchone())[0] == 0, table
        # The kept conversation's fact still reads with its own names.
        cur = await observer.execute(
            "SELECT s.name, f.predicate, o.name FROM memory.facts f JOIN memory.entities s ON s.tenant = f.tenant"
            " AND s.entity_id = f.subject_id JOIN memory.entities o ON o.tenant = f.tenant"
            " AND o.entity_id = f.object_id WHERE f.tenant = %s", (tenant,))
        assert await cur.fetchall() == [("Alice Smyth", "knows", "Bob")]

        # The entity's id was minted from the forgotten name: a later first sighting of that name, far
        # from every stored embedding, lands on it instead of colliding with it.
        later = _segment(tenant, kept, 1, ["Ana"])
        await _add_segment_row(pool, later)
        enrichment, vectors = _enrichment(later, {"alice smith": ("Alice Smith", _unit((30, 1.0)))}, [], axis=8)
        assert isinstance(await _store(pool, postgres, later, enrichment, vectors), memory.StoreCounts)
        cur = await observer.execute("SELECT name, aliases FROM memory.entities WHERE tenant = %s ORDER BY name",
                                     (tenant,))
        assert await cur.fetchall() == [("Alice Smyth", []), ("Bob", [])]
        cur = await observer.execute("SELECT count(*) FROM memory.entity_names WHERE tenant = %s AND surface = %s",
                                     (tenant, "Alice Smith"))
        assert (await cur.fetchone())[0] == 1
    finally:
        await observer.close()
        await pool.close()
