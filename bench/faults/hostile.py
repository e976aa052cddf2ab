"""The hostile phase: each crafted record (epistream.testing.hostile.CASES) is produced, followed on the same
partition by a good turn; the record must be stored verbatim or dead-lettered with a reason, the good
turn after it stored, and the ingest worker never restarted.

A stored case's value is a turn whose tenant, conversation and turn id say where to look for it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg

from epistream.contracts.turns import Turn
from epistream.infra import services, supervisor
from epistream.messaging.kafka_io import create_producer
from epistream.ops.readiness import WaitTimeout, wait_for_turns
from epistream.settings.processes import Settings
from epistream.testing.hostile import CASES, HostileCase

from ..cleanup import forget_tenants
from . import observe


@dataclass(frozen=True)
class Sent:
    case: HostileCase
    partition: int
    sentinel: Turn


async def _produce(settings: Settings, cases: Sequence[HostileCase], tenant: str) -> list[Sent]:
    producer = create_producer(settings)
    await producer.start()
    sent = []
    try:
        for n, case in enumerate(cases):
            meta = await producer.send_and_wait(settings.topic_turns, key=case.key, value=case.value)
            sentinel = Turn(tenant=tenant, conversation_id=f"{tenant}-after-{n:03d}", turn_id="good",
                            speaker="Ann", text=f"The good record after {case.name}.", ts=datetime.now(UTC))
            await producer.send_and_wait(settings.topic_turns, key=case.key, value=sentinel.to_bytes(),
                                         partition=meta.partition)
            sent.append(Sent(case, meta.partition, sentinel))
    finally:
        await producer.stop()
    return sent


def _stored_verbatim(url: str, value: bytes, later: dict[tuple[str, str, str], bytes]) -> str | None:
    """None when the stored turn holds what this value (or a later one with the same ids) says."""
    data = json.loads(value)
    ids = (data["tenant"], data["conversation_id"], data["turn_id"])
    newest = json.loads(later.get(ids, value))
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT speaker, text FROM memory.turns WHERE tenant = %s AND conversation_id = %s "
                           "AND turn_id = %s", ids).fetchone()
    if row is None:
        return "not stored"
    if (row[0], row[1]) != (newest["speaker"], newest["text"]):
        return "stored with other content"
    return None


def run_hostile(settings: Settings, url: str, run_id: str, *, timeout_s: float = 300.0) -> dict[str, Any]:
    cases, source = CASES, "epistream.testing.hostile"
    tenant = f"faults-{run_id}-hostile"
    print(f"\n== hostile inputs: {len(cases)} cases from {source}", flush=True)
    before = supervisor.read_state(settings.state_dir).get("services", {}).get("worker-ingest", {})
    pid_before = services.service_pid(settings, "worker-ingest")
    dlq_start = asyncio.run(observe.topic_ends(settings, [settings.topic_dlq]))[settings.topic_dlq]
    sent = asyncio.run(_produce(settings, cases, tenant))
    sentinel_ids = [s.sentinel for s in sent]
    waited: str | None = None
    try:
        wait_for_turns(url, tenant, len(sentinel_ids), timeout_s=timeout_s)
    except WaitTimeout as exc:
        waited = str(exc)
    letters = observe.letters(observe.read_topic_sync(settings, settings.topic_dlq, dlq_start))
    # Keyed by the SHA-256 of the whole original: a letter near Kafka's limit carries only a prefix of it.
    lettered = {d.value_sha256 or hashlib.sha256(d.original_value() or b"").hexdigest(): d for d in letters}
    later: dict[tuple[str, str, str], bytes] = {}
    for s in sent:  # a duplicate id with new text: the last one produced is what must be stored
        if s.case.expect == "stored":
            d = json.loads(s.case.value)
            later[(d["tenant"], d["conversation_id"], d["turn_id"])] = s.case.value
    with psycopg.connect(url) as conn:
        stored_sentinels = {r[0] for r in conn.execute(
            "SELECT conversation_id FROM memory.turns WHERE tenant = %s", (tenant,)).fetchall()}
    results = []
    for s in sent:
        problems = []
        if s.case.expect == "dead":
            letter = lettered.get(hashlib.sha256(s.case.value).hexdigest())
            if letter is None:
                problems.append("not dead-lettered")
            elif not letter.error_message:
                problems.append("dead-lettered without a reason")
        elif why := _stored_verbatim(url, s.case.value, later):
            problems.append(why)
        if s.sentinel.conversation_id not in stored_sentinels:
            problems.append("the good record after it was not stored")
        results.append({"name": s.case.name, "expect": s.case.expect, "reason": s.case.reason,
                        "status": "failed" if problems else "ok", "detail": "; ".join(problems)})
    # Forgotten once checked: their turns close segments nobody waits for, and the enrich worker would
    # spend the model server on them for the next run to compete with (a benchmark's "alone" no more).
    written = {tenant} | {json.loads(s.case.value)["tenant"] for s in sent if s.case.expect == "stored"}
    removed = forget_tenants(url, sorted(written))
    after = supervisor.read_state(settings.state_dir).get("services", {}).get("worker-ingest", {})
    restarted = after.get("restarts", 0) - before.get("restarts", 0)
    pid_after = services.service_pid(settings, "worker-ingest")
    failed = [r["name"] for r in results if r["status"] == "failed"]
    summary = {"source": source, "cases": len(results), "failed": len(failed), "failed_cases": failed,
               "worker_restarts": restarted, "worker_pid_changed": pid_before != pid_after,
               "wait": waited, "results": results, "forgotten": {"tenants": sorted(written), "rows": removed}}
    print(f"   {len(results)} cases, {len(failed)} failed{': ' + ', '.join(failed) if failed else ''}; "
          f"ingest worker restarts during the phase: {restarted}")
    return summary
