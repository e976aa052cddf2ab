"""The ingest batch in chunks (issue 13): each chunk is written in its own transaction, in partition
order, while the next one is embedded; a permanent error isolates records within its chunk only,
never storing or counting a committed chunk twice; a cancel leaves the next chunk's embedding unused.

PostgreSQL is faked at the one seam that writes (`epistream.pipeline.ingest._write`); the embedder is a stub
that records when it ran. The same behaviour against the real database: tests/integration/test_ingest_chunks.py."""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import numpy as np
import psycopg
import pytest

from epistream.contracts.turns import SegmentCloseRequest, Turn
from epistream.core.metrics import Metrics
from epistream.pipeline import ingest
from epistream.pipeline.ingest import ingest_batch, split_chunks
from epistream.pipeline.records import RawRecord
from epistream.pipeline.segmenter import SegmenterConfig

T0 = datetime(2024, 5, 6, 9, 0, tzinfo=UTC)
CONFIG = SegmenterConfig(max_tokens=10_000, overlap_share=0.0, max_gap=timedelta(hours=1))
POISON = "POISON"


def turn(n: int, text: str | None = None) -> bytes:
    return Turn(tenant="t", conversation_id="c", turn_id=f"t{n:03d}", speaker="Ana", text=text or f"t{n:03d}",
                ts=T0 + timedelta(minutes=n)).to_bytes()


def close(after: str) -> bytes:
    return SegmentCloseRequest(kind="segment_close", tenant="t", conversation_id="c", after_turn_id=after).to_bytes()


def records(values: list[bytes]) -> list[RawRecord]:
    return [RawRecord("memory.turns", 0, i, b"c", v) for i, v in enumerate(values)]


class Clock:
    """Every step of a run, with when it started and ended, in one list."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, tuple[str, ...], float, float]] = []
        self._lock = threading.Lock()

    def add(self, kind: str, ids: tuple[str, ...], started: float) -> None:
        with self._lock:
            self.spans.append((kind, ids, started, time.perf_counter()))

    def of(self, kind: str) -> list[tuple[tuple[str, ...], float, float]]:
        return [(ids, s, e) for k, ids, s, e in self.spans if k == kind]


class SlowEmbedder:
    """Takes `seconds` per call, off the event loop like ONNX Runtime; raises on a poisoned text."""

    def __init__(self, clock: Clock, seconds: float = 0.0) -> None:
        self.clock, self.seconds = clock, seconds

    def embed(self, texts: list[str]) -> np.ndarray:
        started = time.perf_counter()
        time.sleep(self.seconds)
        self.clock.add("embed", tuple(t.rsplit(" ", 1)[-1] for t in texts), started)
        if any(POISON in t for t in texts):
            raise ValueError("the tokenizer choked")
        return np.ones((len(texts), 384), dtype=np.float32)


class Transaction:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    @asynccontextmanager
    async def transaction(self):  # type: ignore[no-untyped-def]
        try:
            yield
        except BaseException:
            self.log.append("rollback")
            raise
        self.log.append("commit")


class FakePool:
    def __init__(self) -> None:
        self.log: list[str] = []

    @asynccontextmanager
    async def connection(self):  # type: ignore[no-untyped-def]
        yield Transaction(self.log)


@pytest.fixture
def writes(monkeypatch):  # type: ignore[no-untyped-def]
    """Replace the SQL with a recorder: what each transaction wrote, when, and failures on demand."""

    class Writes:
        clock = Clock()
        seconds = 0.0
        fail_on: set[str] = set()
        transient_once: set[str] = set()

    async def write(conn, items, vector_of, segmenter, result):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        await asyncio.sleep(Writes.seconds)
        ids = tuple(t.turn_id if isinstance(t, Turn) else f"close@{t.after_turn_id}" for _, t in items)
        Writes.clock.add("write", ids, started)
        for i in ids:
            if i in Writes.transient_once:
                Writes.transient_once.discard(i)
                raise psycopg.OperationalError("server closed the connection")
            if i in Writes.fail_on:
                raise psycopg.errors.NumericValueOutOfRange(f"{i} does not fit")
        turns = [t for _, t in items if isinstance(t, Turn)]
        assert all(id(t) in vector_of for t in turns), "a chunk was written without its own vectors"
        result.stored.extend(turns)
        result.outcomes.extend("inserted" for _ in turns)

    async def advance(conn, runs):  # type: ignore[no-untyped-def]
        Writes.clock.add("mark", tuple(f"{p}@{first}-{last}" for (_, p), spans in sorted(runs.items())
                                       for first, last in spans), time.perf_counter())

    monkeypatch.setattr(ingest, "_write", write)
    monkeypatch.setattr(ingest, "advance", advance)
    return Writes


def run(batch: list[RawRecord], embedder, pool: FakePool, chunk: int):  # type: ignore[no-untyped-def]
    return asyncio.run(ingest_batch(batch, pool=pool, embedder=embedder, metrics=Metrics.create(), segmenter=CONFIG,
                                    max_backoff_s=0.01, chunk_turns=chunk))


def test_chunks_hold_at_most_n_turns_and_a_close_stays_where_it_stands():
    items = [(r, ingest.decode_record(r)) for r in records([turn(1), turn(2), close("t002"), turn(3), turn(4),
                                                             turn(5)])]
    chunks = split_chunks(items, 2)
    shape = [[getattr(d, "turn_id", "close") for _, d in c] for c in chunks]
    assert shape == [["t001", "t002", "close"], ["t003", "t004"], ["t005"]]
    assert split_chunks(items, 100) == [items]
    assert split_chunks([], 3) == []


def test_chunks_are_written_in_partition_order_each_in_its_own_transaction(writes):
    pool = FakePool()
    batch = records([turn(1), turn(2), turn(3), close("t003"), turn(4), turn(5)])
    result = run(batch, SlowEmbedder(writes.clock), pool, chunk=2)
    assert [ids for ids, _, _ in writes.clock.of("write")] == [("t001", "t002"), ("t003", "close@t003", "t004"),
                                                               ("t005",)]
    assert pool.log == ["commit"] * 3
    assert [t.turn_id for t in result.stored] == ["t001", "t002", "t003", "t004", "t005"]
    assert result.outcomes == ["inserted"] * 5 and result.dead == []


def test_the_next_chunk_is_embedded_while_this_one_is_written(writes):
    writes.seconds = 0.3
    embedder = SlowEmbedder(writes.clock, seconds=0.2)
    run(records([turn(n) for n in range(1, 7)]), embedder, FakePool(), chunk=2)
    embeds, commits = writes.clock.of("embed"), writes.clock.of("write")
    assert [ids for ids, _, _ in embeds] == [("t001", "t002"), ("t003", "t004"), ("t005", "t006")]
    for k in range(2):
        (_, embed_start, _), (_, write_start, write_end) = embeds[k + 1], commits[k]
        # Chunk k+1's embedding starts before chunk k's write and runs during it...
        assert embed_start < write_start + 0.05 and embed_start < write_end
        # ...but only once chunk k's own vectors were in: two embeddings never split the cores.
        assert embed_start >= embeds[k][2]


def test_a_permanent_error_in_a_later_chunk_isolates_only_its_records(writes):
    writes.fail_on = {"t005"}
    pool = FakePool()
    result = run(records([turn(n) for n in range(1, 8)]), SlowEmbedder(writes.clock), pool, chunk=2)
    written = [ids for ids, _, _ in writes.clock.of("write")]
    # Chunks 1 and 2 committed once and are never written again; chunk 3 fails whole, then record by
    # record; chunk 4 follows.
    assert written == [("t001", "t002"), ("t003", "t004"), ("t005", "t006"), ("t005",), ("t006",), ("t007",)]
    # Then the record set aside is covered in the watermark by a commit of its own.
    assert pool.log == ["commit", "commit", "rollback", "rollback", "commit", "commit", "commit"]
    assert [r.record.offset for r in result.dead] == [4]
    assert [t.turn_id for t in result.stored] == ["t001", "t002", "t003", "t004", "t006", "t007"]
    assert result.outcomes == ["inserted"] * 6


def test_a_chunk_whose_embedding_fails_is_isolated_and_the_others_stored_once(writes):
    pool = FakePool()
    batch = records([turn(1), turn(2), turn(3, f"{POISON} here"), turn(4), turn(5)])
    result = run(batch, SlowEmbedder(writes.clock), pool, chunk=2)
    assert [r.record.offset for r in result.dead] == [2]
    assert [ids for ids, _, _ in writes.clock.of("write")] == [("t001", "t002"), ("t004",), ("t005",)]
    assert [t.turn_id for t in result.stored] == ["t001", "t002", "t004", "t005"]
    assert result.outcomes == ["inserted"] * 4


def test_a_transient_error_retries_its_chunk_alone_and_blocks_the_next(writes):
    writes.transient_once = {"t003"}
    pool = FakePool()
    result = run(records([turn(n) for n in range(1, 6)]), SlowEmbedder(writes.clock), pool, chunk=2)
    assert [ids for ids, _, _ in writes.clock.of("write")] == [("t001", "t002"), ("t003", "t004"),
                                                               ("t003", "t004"), ("t005",)]
    assert pool.log == ["commit", "rollback", "commit", "commit"]
    assert result.dead == [] and result.outcomes == ["inserted"] * 5


def test_a_cancel_mid_batch_abandons_the_next_chunks_embedding_unused(writes):
    writes.seconds = 3600.0  # PostgreSQL hangs on chunk 1
    embedder = SlowEmbedder(writes.clock, seconds=0.2)
    pool = FakePool()

    async def scenario() -> None:
        task = asyncio.ensure_future(ingest_batch(records([turn(n) for n in range(1, 7)]), pool=pool,
                                                  embedder=embedder, metrics=Metrics.create(), segmenter=CONFIG,
                                                  chunk_turns=2))
        await asyncio.sleep(0.05)  # chunk 1 embedded? not yet: 0.2 s
        while not any(k == "embed" for k, *_ in writes.clock.spans):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.02)  # chunk 1 is being written, chunk 2 being embedded
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.4)  # long enough for chunk 2's embedding thread to finish

    asyncio.run(scenario())
    assert [ids for ids, _, _ in writes.clock.of("embed")] == [("t001", "t002"), ("t003", "t004")]
    assert writes.clock.of("write") == []  # the hung write never finished, and chunk 2 was never written
    assert pool.log == ["rollback"]


def marks(writes) -> list[tuple[str, ...]]:  # type: ignore[no-untyped-def]
    return [ids for ids, _, _ in writes.clock.of("mark")]


def test_each_chunk_adds_its_records_offsets_to_the_watermark_in_its_own_transaction(writes):
    pool = FakePool()
    run(records([turn(1), turn(2), turn(3), close("t003"), turn(4), turn(5)]), SlowEmbedder(writes.clock), pool,
        chunk=2)
    assert marks(writes) == [("0@0-1",), ("0@2-4",), ("0@5-5",)] and pool.log == ["commit"] * 3


def test_unusable_records_are_covered_by_one_commit_after_the_last_chunk(writes):
    pool = FakePool()
    run(records([turn(1), b"not json", turn(2), turn(3), b"{}"]), SlowEmbedder(writes.clock), pool, chunk=2)
    # Ingest is done with offsets 1 and 4 (they go to the DLQ): left out, they would be gaps under the mark.
    assert marks(writes) == [("0@0-0", "0@2-2"), ("0@3-3",), ("0@1-1", "0@4-4")] and pool.log == ["commit"] * 3


def test_a_batch_of_unusable_records_alone_commits_only_its_watermark(writes):
    pool = FakePool()
    result = run(records([b"not json", b"{}"]), SlowEmbedder(writes.clock), pool, chunk=2)
    assert writes.clock.of("write") == [] and marks(writes) == [("0@0-1",)] and pool.log == ["commit"]
    assert [r.record.offset for r in result.dead] == [0, 1]


def test_a_record_that_cannot_be_stored_is_covered_once_it_is_set_aside(writes):
    writes.fail_on = {"t003"}
    run(records([turn(1), turn(2), turn(3)]), SlowEmbedder(writes.clock), FakePool(), chunk=2)
    assert marks(writes) == [("0@0-1",), ("0@2-2",)]  # the failed transactions wrote none; the cover did


def test_the_watermark_is_kept_per_partition(writes):
    batch = [RawRecord("memory.turns", p, o, b"c", turn(n)) for n, (p, o) in enumerate([(0, 7), (1, 3), (0, 8)], 1)]
    run(batch, SlowEmbedder(writes.clock), FakePool(), chunk=128)
    assert marks(writes) == [("0@7-8", "1@3-3")]
