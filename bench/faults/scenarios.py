"""The scenarios: each injects one fault while its workload streams, and returns once the fault is over
(the service back, the outage lifted). Settling and checking are the runner's job.

Durations are the issue's; ``--quick`` shortens the outages (same code, same checks).
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg

from epistream.client.session import EpistreamClient
from epistream.contracts.turns import Turn
from epistream.infra import services
from epistream.ops.readiness import poll
from epistream.pipeline.erasure import forget_everywhere
from epistream.settings.processes import Settings
from epistream.storage.db import open_pool

from . import inject
from .inject import FaultLog
from .stream import Stream
from .workload import Workload


@dataclass(frozen=True)
class Durations:
    pg_outage_s: float
    pg_outage_before_sigterm_s: float
    broker_pause_s: float
    model_down_s: float
    model_hang_s: float


FULL_DURATIONS = Durations(pg_outage_s=60, pg_outage_before_sigterm_s=10, broker_pause_s=30, model_down_s=600,
                           model_hang_s=300)
QUICK_DURATIONS = Durations(pg_outage_s=20, pg_outage_before_sigterm_s=5, broker_pause_s=15, model_down_s=60,
                            model_hang_s=20)


@dataclass
class Context:
    settings: Settings
    url: str  # the login role's URL: the checks see every tenant's rows
    workload: Workload
    stream: Stream
    log: FaultLog
    durations: Durations
    rng: random.Random
    #: set by the forget scenario: the conversation that must leave nothing behind
    forgotten: str | None = None
    #: set by scenarios that read with `after` during recovery: each read's (complete, holds its turn)
    reads_after: list[tuple[bool, bool]] | None = None


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    inject: Callable[[Context], None]
    #: conversations of the workload that change session half way, so a segment of theirs closes
    #: (and is enriched) while their later turns still stream
    split_sessions: int = 0


def _kill_ingest_three_times(ctx: Context) -> None:
    for point in sorted(ctx.rng.uniform(0.1, 0.9) for _ in range(3)):
        ctx.stream.wait_progress(point)
        inject.kill9(ctx.settings, "worker-ingest", ctx.log)


def _kill_answer(ctx: Context) -> None:
    ctx.stream.wait_progress(ctx.rng.uniform(0.4, 0.7))
    inject.kill9(ctx.settings, "worker-answer", ctx.log)


def _sigterm_indexer_in_pg_outage(ctx: Context) -> None:
    ctx.stream.wait_progress(0.3)
    services.hold_down(ctx.settings, "postgres")
    ctx.log.note("postgres stopped")
    time.sleep(ctx.durations.pg_outage_before_sigterm_s)  # the indexer is now waiting on the database
    pid = services.signal_service(ctx.settings, "worker-ingest", signal.SIGTERM)
    ctx.log.note(f"SIGTERM worker-ingest (pid {pid}) while postgres is down")
    time.sleep(max(0.0, ctx.durations.pg_outage_s - ctx.durations.pg_outage_before_sigterm_s))
    new = services.bring_back(ctx.settings, "postgres", timeout_s=300)
    ctx.log.note(f"postgres back (pid {new})")


def _pg_restart(sig: signal.Signals) -> Callable[[Context], None]:
    def run(ctx: Context) -> None:
        ctx.stream.wait_progress(ctx.rng.uniform(0.3, 0.6))
        inject.restart(ctx.settings, "postgres", sig, ctx.log)

    return run


def _pg_down(ctx: Context) -> None:
    ctx.stream.wait_progress(0.3)
    inject.down_for(ctx.settings, "postgres", ctx.durations.pg_outage_s, ctx.log)


def _kafka_restart(ctx: Context) -> None:
    ctx.stream.wait_progress(ctx.rng.uniform(0.3, 0.6))
    inject.restart(ctx.settings, "kafka", signal.SIGTERM, ctx.log)


#: Reads with `after` asked while the workers recover from a broker outage, and the bound each may wait.
RECOVERY_READS = 10
RECOVERY_READ_BOUND_S = 120.0


def _kafka_down_past_the_session(ctx: Context) -> None:
    """The broker stopped for three session timeouts while ingest and enrichment run: every worker's
    group membership expires, and each rejoins when the broker is back. Meanwhile, and at once after,
    turns are produced and read back with `after` (as an agent does): each read must hold its turn or
    say it is incomplete, never reply complete without it."""
    ctx.stream.wait_progress(0.3)
    inject.down_for(ctx.settings, "kafka", 3 * ctx.settings.kafka_session_timeout_s, ctx.log)
    ctx.reads_after = asyncio.run(_reads_after(ctx.settings, f"{ctx.workload.tenant}-reads", RECOVERY_READS))
    ctx.log.note(f"{len(ctx.reads_after)} reads with `after` during recovery: "
                 f"{sum(c for c, _ in ctx.reads_after)} complete, {sum(h for _, h in ctx.reads_after)} held their turn")


async def _reads_after(settings: Settings, tenant: str, count: int) -> list[tuple[bool, bool]]:
    """Produce a turn and at once read `context` for its words after its position, `count` times, with
    one long-lived client (on its own tenant: the workload's turns are checked apart)."""
    seen = []
    async with EpistreamClient(settings) as client:
        for n in range(count):
            turn = Turn(tenant=tenant, conversation_id=f"r{n % 3}", turn_id=f"read-{n:03d}", speaker="Ana",
                        text=f"Locker {n} holds the {uuid.uuid4().hex[:6]} parcel from Lisbon.",
                        ts=datetime(2024, 5, 6, 9, n, tzinfo=UTC))
            positions = await client.produce_turns([turn])
            reply = await client.context(tenant=tenant, question=turn.text, budget_tokens=200,
                                         after=list(positions.values()), timeout_s=RECOVERY_READ_BOUND_S)
            holds = any(item.kind == "turn" and item.turn_id == turn.turn_id for item in reply.items)
            seen.append((reply.error is None and reply.incomplete is None, holds))
    return seen


def _kafka_pause(ctx: Context) -> None:
    ctx.stream.wait_progress(0.3)
    inject.paused_for(ctx.settings, "kafka", ctx.durations.broker_pause_s, ctx.log)


def _model_down(ctx: Context) -> None:
    ctx.stream.wait_progress(0.2)
    inject.down_for(ctx.settings, "model-server", ctx.durations.model_down_s, ctx.log)


def _model_hung(ctx: Context) -> None:
    ctx.stream.wait_progress(0.2)
    inject.paused_for(ctx.settings, "model-server", ctx.durations.model_hang_s, ctx.log)


def _rebalance(ctx: Context) -> None:
    extra = inject.spawn_ingest_worker(ctx.settings, ctx.log)
    try:
        ctx.stream.wait_progress(ctx.rng.uniform(0.4, 0.6))
        extra.kill9()
        ctx.log.note(f"kill -9 the second ingest worker (pid {extra.pid}): its partitions move to the first")
    finally:
        extra.stop()


PENDING_SEGMENT = """
SELECT count(*) FROM memory.segments WHERE tenant = %s AND conversation_id = %s AND published_at IS NOT NULL
"""


def _forget_while_ingested(ctx: Context) -> None:
    """Forget the conversation once one of its segments is sent for enrichment, while its turns still stream."""
    target = ctx.workload.conversations[0]
    tenant = ctx.workload.tenant
    with psycopg.connect(ctx.url, autocommit=True) as conn:
        poll(lambda: conn.execute(PENDING_SEGMENT, (tenant, target)).fetchone()[0],  # type: ignore[index]
             lambda n: n > 0 or ctx.stream.progress >= 0.9, what=f"a segment of {target} sent for enrichment",
             timeout_s=900, interval_s=0.2)
    ctx.log.note(f"forgetting {target} (stream at {ctx.stream.progress:.0%})")

    async def run() -> None:
        pool = await open_pool(ctx.settings)  # what `epistream forget` does
        try:
            done = await forget_everywhere(ctx.settings, pool, tenant, target)
        finally:
            await pool.close()
        ctx.log.note(f"forgot {target}: {done.rows}, {done.graph_elements} graph elements")

    asyncio.run(run())
    ctx.forgotten = target


SCENARIOS: list[Scenario] = [
    Scenario("kill9-ingest-x3", "kill -9 of the ingest worker three times at random points",
             _kill_ingest_three_times),
    Scenario("kill9-answer", "kill -9 of the answer worker", _kill_answer),
    Scenario("sigterm-indexer-pg-down", "SIGTERM of the indexer during a PostgreSQL outage",
             _sigterm_indexer_in_pg_outage),
    Scenario("pg-restart-fast", "PostgreSQL restart, fast shutdown (SIGINT)", _pg_restart(signal.SIGINT)),
    Scenario("pg-restart-immediate", "PostgreSQL restart, immediate shutdown (SIGQUIT)",
             _pg_restart(signal.SIGQUIT)),
    Scenario("pg-down", "PostgreSQL down (60 s; 20 s quick)", _pg_down),
    Scenario("kafka-restart", "Kafka broker restart", _kafka_restart),
    Scenario("kafka-paused", "broker paused with SIGSTOP (30 s; 15 s quick)", _kafka_pause),
    Scenario("kafka-down-past-session", "broker down for three consumer session timeouts while ingest and "
             "enrichment run; reads with `after` during recovery", _kafka_down_past_the_session, split_sessions=2),
    Scenario("model-down", "model server down (10 min; 60 s quick)", _model_down),
    Scenario("model-hung", "model server hung with SIGSTOP (5 min; 20 s quick)", _model_hung),
    Scenario("rebalance-kill", "two ingest workers in one group, one killed (rebalance)", _rebalance),
    Scenario("forget-during-ingest", "a forget while its conversation is ingested and enriched",
             _forget_while_ingested, split_sessions=1),
]
BY_NAME = {s.name: s for s in SCENARIOS}
