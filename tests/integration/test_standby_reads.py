"""Reads from a hot standby (issue 38, deliverable 3): the test stack's PostgreSQL is the primary, a
standby of it streams from it (PostgreSQL's own replication, infra/postgres_standby.py), the real ingest
worker writes to the primary, and an answer worker whose EPISTREAM_DATABASE_READ_URL names the standby
reads from it, the read-after marks included. A read right after a produce holds its turn; with replay
paused on the standby, a read waits its bound and says it is incomplete though the primary has the turn
(never a complete reply without it); once replay resumes, the same read is complete."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from epistream.client.api import produce_turns
from epistream.contracts.positions import Position
from epistream.contracts.replies import MemoryContext
from epistream.contracts.turns import Turn
from epistream.infra.postgres_server import prepare_postgres
from epistream.infra.postgres_standby import Standby, start_standby, wait_replayed
from epistream.storage.db import WORKER_ROLE

from .conftest import count_turns, wait_for
from .recall import holds, own_turn, recall_now
from .scripted_worker import PORT_OFFSET, Scripted, no_model_call, scripted_worker

pytestmark = pytest.mark.integration

METRICS_PORT = int(os.environ.get("EPISTREAM_SUPERVISOR_METRICS_PORT", "29103")) + 90  # beside the other tests' ports
BOUND_S = 5.0  # EPISTREAM_READ_AFTER_TIMEOUT_S of the deployment (the product's default)
T0 = datetime(2024, 6, 3, 9, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def standby(kafka) -> Iterator[Standby]:
    """A hot standby of the test stack's PostgreSQL, removed after the module."""
    running = start_standby(prepare_postgres(kafka), kafka.state_dir / f"standby-{uuid.uuid4().hex[:8]}")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def workers(kafka, standby: Standby) -> Iterator[Scripted]:
    """A deployment's ingest worker on the primary, and its answer worker reading from the standby."""
    with scripted_worker(kafka, no_model_call, metrics_port=METRICS_PORT, name="standby", workers=("ingest",),
                         overrides={"read_after_timeout_s": BOUND_S}) as running:
        assert running.deployment is not None
        wait_replayed(running.db_url, standby.uri("postgres"))  # the deployment's database, migrated, is there
        # The workers' own login (its user, password, database), on the standby's socket.
        read_url = make_conninfo(running.deployment.env["EPISTREAM_DATABASE_URL"], host=str(standby.socket_dir))
        running.processes["answer"] = running.deployment.run(
            "answer", METRICS_PORT + PORT_OFFSET["answer"], env={"EPISTREAM_DATABASE_READ_URL": read_url})
        yield running


@pytest.fixture
def tenant() -> str:
    return f"standby-{uuid.uuid4().hex[:8]}"


def _read(workers: Scripted, turn: Turn, positions: dict[str, Position]) -> tuple[MemoryContext, float]:
    return recall_now(workers.settings, turn, positions, bound_s=BOUND_S)


def _produce(workers: Scripted, turn: Turn) -> dict[str, Position]:
    return asyncio.run(produce_turns(workers.settings, [turn]))


def _on_standby(workers: Scripted, standby: Standby) -> str:
    assert workers.deployment is not None
    return standby.uri(workers.deployment.name)


def test_a_read_from_the_standby_right_after_a_produce_holds_the_turn(workers, standby, tenant):
    # Once warm (the ingest worker has joined its group and stored a turn that reached the standby),
    # every read asked at once after its produce waits for the standby's mark and holds its turn.
    warm = own_turn(tenant, "warm", 0, t0=T0)
    _produce(workers, warm)
    wait_for(lambda: count_turns(_on_standby(workers, standby), tenant, "warm") == 1, timeout=120,
             what="the first turn replayed on the standby")
    for n in range(1, 6):
        turn = own_turn(tenant, f"c{n % 3}", n, t0=T0)
        reply, _ = _read(workers, turn, _produce(workers, turn))
        assert reply.error is None and reply.incomplete is None, reply.incomplete
        assert holds(reply, turn)
    with psycopg.connect(_on_standby(workers, standby)) as conn:  # the answer worker reads there
        readers = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND datname = %s",
                               (WORKER_ROLE, workers.deployment.name)).fetchone()
    assert readers is not None and readers[0] >= 1


def test_a_standby_that_lags_makes_a_read_wait_its_bound_and_say_so_never_stale(workers, standby, tenant):
    with psycopg.connect(_on_standby(workers, standby), autocommit=True) as conn:
        conn.execute("SELECT pg_wal_replay_pause()")
        try:
            wait_for(lambda: conn.execute("SELECT pg_get_wal_replay_pause_state()").fetchone() == ("paused",),
                     timeout=30, what="replay paused")
            turn = own_turn(tenant, "lagging", 1, t0=T0)
            positions = _produce(workers, turn)
            wait_for(lambda: count_turns(workers.db_url, tenant, "lagging") == 1, timeout=60,
                     what="the turn stored on the primary")
            reply, waited = _read(workers, turn, positions)
            position = positions["lagging"]
            assert reply.error is None and not holds(reply, turn)  # the standby has not replayed it...
            assert reply.incomplete == (f"not stored within {BOUND_S:g}s: lagging@{position.partition}:"
                                        f"{position.offset}; the read may miss those turns")  # ...and says so
            assert waited >= BOUND_S
            assert count_turns(_on_standby(workers, standby), tenant, "lagging") == 0
        finally:
            conn.execute("SELECT pg_wal_replay_resume()")
    # Replay goes on: the same read waits for the standby to catch up and is complete.
    reply, _ = _read(workers, turn, positions)
    assert reply.incomplete is None and holds(reply, turn)
