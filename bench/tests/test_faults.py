"""A short run of the fault-injection suite (`python -m bench.faults`, the same code): a small workload
through three faults of the shared stack, each asserted to lose nothing, duplicate nothing and keep
every invariant. Disruptive: the conftest runs it after every other test."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest

from bench.faults import settle, workload
from bench.faults.runner import run_scenario
from bench.faults.scenarios import BY_NAME, QUICK_DURATIONS
from epistream.pipeline.erasure import forget_everywhere
from epistream.settings.processes import Settings
from epistream.storage.db import admin_database_url, open_pool

pytestmark = [pytest.mark.integration, pytest.mark.disruptive]

# The cheapest scenarios that still exercise each layer: a worker crash, a database restart, a broker restart.
SHORT_RUN = ["kill9-ingest-x3", "pg-restart-fast", "kafka-restart"]


LEFT_TO_ENRICH = "SELECT DISTINCT tenant, conversation_id FROM memory.segments WHERE status = 'pending'"


@pytest.fixture(scope="module", autouse=True)
def earlier_tests_conversations_forgotten(stack: Settings) -> None:
    """The earlier tests are done with their conversations, but the shared enrich worker still has their
    segments queued (30-odd, each a model call of up to a minute on 2 cores), and a scenario waits for
    its own segments behind them all: they are forgotten first (what `epistream forget` does), and the
    worker skips each without a model call."""
    with psycopg.connect(admin_database_url(stack), autocommit=True) as conn:
        left = conn.execute(LEFT_TO_ENRICH).fetchall()

    async def forget_all() -> None:
        pool = await open_pool(stack)
        try:
            for tenant, conversation in left:
                await forget_everywhere(stack, pool, tenant, conversation)
        finally:
            await pool.close()

    asyncio.run(forget_all())


@pytest.mark.parametrize("name", SHORT_RUN)
def test_a_fault_loses_nothing_duplicates_nothing_and_keeps_every_invariant(stack, db_url, name):
    result = run_scenario(stack, db_url, f"t{uuid.uuid4().hex[:6]}", BY_NAME[name], workload.TINY,
                          QUICK_DURATIONS, settle.Limits(healthy_s=240, turns_stall_s=120, enrich_stall_s=300,
                                                         answers_s=300))
    failed = {n: v["detail"] for n, v in result["invariants"].items() if v["status"] != "ok"}
    assert (result["lost"], result["duplicated"], failed, result["problems"]) == (0, 0, {}, []), result["events"]
