"""The enrichment benchmark: stream LoCoMo at a steady rate, wait until every segment is enriched or
failed (sampling the tenant's progress as it goes), then read what happened from the database, the
worker's counters and the model server itself: one enrichment request, exactly as the worker builds it,
sent straight to the model server, the model's own limit in the same run (what a new segment costs the
model back to back: the system prompt's prefix is already evaluated, as it is between the worker's calls).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import openai
import psycopg
from psycopg.rows import dict_row
from pydantic import ValidationError

from epistream.contracts.segments import Segment
from epistream.models.llm import response_format
from epistream.ops.readiness import WaitTimeout
from epistream.pipeline.enrich import build_messages
from epistream.pipeline.prompts import EnrichmentOut
from epistream.pipeline.segmenter import SegmenterConfig
from epistream.pipeline.store.segments import load_segment
from epistream.settings.processes import Settings

from . import cleanup, enrich_report, report
from .enrich_report import DirectBaseline, DirectCall, RunRows, Sample, WaitOutcome, build_result
from .produce import Record, SteadySend, send_steady
from .stack import (
    CpuSnapshot,
    cpu_report,
    managed_pid,
    restart_ingest_worker,
    wait_until_idle,
    worker_pid,
    worker_setting,
)
from .store_state import StoreState, wait_for_enrichment
from .worker_metrics import Increase, scrape_extractor
from .workload import enrich_workload, expected_segments

ROOT = Path(__file__).resolve().parent.parent
# How long to wait for the model server to finish others' (or abandoned) requests before streaming, and
# before the direct calls, whose timing is only the model's own on an otherwise idle server.
IDLE_BEFORE_STREAM_S = 60.0
IDLE_BEFORE_DIRECT_S = 300.0
# The worker's settings that shape this benchmark, as its supervisor records them (it may predate ours).
WORKER_SETTINGS = tuple(
    name for name in (
        "segment_idle_s", "segment_max_tokens", "segment_overlap", "segment_max_gap_s", "extractor_max_tokens",
        "extractor_timeout_s", "llm_timeout_s", "llm_max_retries", "enrich_concurrency",
    )
    if name in Settings.model_fields  # settings come and go as the pipeline evolves
)


def _worker_settings(settings: Settings) -> dict[str, str | None]:
    return {name: worker_setting(settings, name) for name in WORKER_SETTINGS}


@dataclass(frozen=True)
class EnrichOptions:
    rate: float
    conversations: int | None
    turns_per_conversation: int | None
    max_minutes: float
    stall_minutes: float
    keep: bool
    quick: bool
    results: Path


def _segmenter_config(worker: dict[str, str | None]) -> SegmenterConfig:
    return SegmenterConfig(
        max_tokens=int(worker["segment_max_tokens"] or 4096),
        overlap_share=float(worker["segment_overlap"] or 0.1),
        max_gap=timedelta(seconds=float(worker["segment_max_gap_s"] or 21600)),
    )


class _Stream(threading.Thread):
    """The producer on its own thread and event loop, so the main thread can poll meanwhile."""

    def __init__(self, settings: Settings, records: list[Record], rate: float) -> None:
        super().__init__(name="bench-stream", daemon=True)  # daemon: an interrupted run does not wait for it
        self.settings, self.records, self.rate = settings, records, rate
        self.result: SteadySend | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = asyncio.run(send_steady(self.settings, self.records, self.rate))
        except BaseException as exc:  # reported by the main thread
            self.error = exc


def run_enrich(settings: Settings, url: str, run_id: str, opts: EnrichOptions) -> dict[str, Any]:
    worker = _worker_settings(settings)
    workload = enrich_workload(
        run_id=run_id, conversations=opts.conversations,
        turns_per_conversation=opts.turns_per_conversation,
    )
    expected = expected_segments(workload.turns, _segmenter_config(worker))
    model_pid = managed_pid(settings, "model-server")
    print(f"\nenrichment: {len(workload.turns)} turns of {len(workload.conversations)} conversations at "
          f"{opts.rate:g} turns/s, tenant {workload.tenant}; expect {sum(expected.values())} segments; "
          f"worker idle timeout {worker['segment_idle_s']}s")
    # Bounded: with other tenants' segments queued, the model server never goes idle.
    waited_idle = wait_until_idle(model_pid, timeout_s=IDLE_BEFORE_STREAM_S)
    print(f"  model server {'idle' if waited_idle < IDLE_BEFORE_STREAM_S else 'still busy'} after "
          f"{waited_idle:.0f}s; streaming")

    # Summed across scrapes, so a worker restarted mid-run (its counters back at zero) loses at most a tick.
    counters, cpu_before = Increase(scrape_extractor(settings)), CpuSnapshot.take()
    stream = _Stream(settings, [Record.of(t) for t in workload.turns], opts.rate)
    started = time.time()
    stream.start()
    outcome = wait_for_enrichment_sampled(
        url, workload.tenant, expected_turns=len(workload.turns), expected_segments=sum(expected.values()),
        started=started, limits=WaitLimits(opts.max_minutes * 60, opts.stall_minutes * 60),
        tick=lambda: counters.add(scrape_extractor(settings)),
    )
    time.sleep(0.5)  # the worker counts a segment just after the commit the poll saw
    counters.add(scrape_extractor(settings))
    cpu_after = CpuSnapshot.take()
    print(f"  {outcome.reason} after {outcome.waited_s / 60:.1f} min")
    if stream.error is not None:
        raise RuntimeError("streaming the turns failed") from stream.error

    rows = read_run(url, workload.tenant)
    typical = typical_segment_id(rows.segments)
    segment = load(url, workload.tenant, typical) if typical else None
    result_cleanup: dict[str, Any] = {"kept": opts.keep}
    cpu = cpu_report(settings, cpu_before, cpu_after)

    def assemble(direct: DirectBaseline | None) -> dict[str, Any]:
        result = build_result(
            workload=workload, quick=opts.quick, rate=opts.rate, worker=worker, expected=expected,
            stream=stream.result, outcome=outcome, rows=rows, counters=counters.total, direct=direct,
            started=started, cpu=cpu, machine=report.machine_info(ROOT),
        )
        result["cleanup"] = result_cleanup
        return result

    direct = None
    try:
        if not outcome.complete and not opts.keep:
            result_cleanup.update(_cut_off(settings, url, workload.tenant))
        # Written now, and again with the baseline: the figures survive a run killed during the direct calls.
        report.write_results(opts.results / enrich_report.JSON_NAME, assemble(None), enrich_report.write_chart)
        if segment is not None:
            token_estimate = next(s["token_estimate"] for s in rows.segments if s["segment_id"] == typical)
            direct = _direct_baseline(settings, model_pid, segment, token_estimate)
    finally:
        if not opts.keep:
            again = cleanup.forget_tenants(url, [workload.tenant])  # everything, or what came after _cut_off
            removed = {k: v + result_cleanup.get("removed", {}).get(k, 0) for k, v in again.items()}
            result_cleanup.update(removed=removed)
            print(f"removed the enrichment run's rows ({sum(removed.values())})")
    result = assemble(direct)
    report.write_results(opts.results / enrich_report.JSON_NAME, result, enrich_report.write_chart,
                         enrich_report.markdown)
    return result


def _cut_off(settings: Settings, url: str, tenant: str) -> dict[str, Any]:
    """A run stopped early: what is still queued would keep the model busy long after it (and spoil the
    baseline), so drop the queue, re-queue other tenants' segments, forget this run's rows, and restart
    the ingest worker, which has most of the dropped segments in memory already (Faust prefetches)."""
    purge = cleanup.drop_queued_segments(settings, url)
    removed = cleanup.forget_tenants(url, [tenant])
    pid = restart_ingest_worker(settings) if worker_pid(settings) is not None else None
    print(f"  dropped {purge.dropped_messages} queued segment messages, re-queued {purge.requeued_other_segments} "
          f"of other tenants, restarted the ingest worker (pid {pid}) to drop what it had prefetched")
    return {
        "queued_segments_dropped": purge.dropped_messages,
        "other_tenants_segments_requeued": purge.requeued_other_segments,
        "ingest_worker_restarted_as": pid,
        "removed": removed,
    }


def _direct_baseline(settings: Settings, model_pid: int | None, segment: Segment, token_estimate: int
                     ) -> DirectBaseline:
    waited = wait_until_idle(model_pid, timeout_s=IDLE_BEFORE_DIRECT_S)
    idle = waited < IDLE_BEFORE_DIRECT_S
    print(f"direct model baseline: segment {segment.segment_id} ({len(segment.turns)} turns), model "
          f"server {'idle' if idle else 'STILL BUSY (baseline is contended)'} after {waited:.0f}s")
    call = call_once(settings, segment)
    print(f"  {call.seconds:.1f}s; {call.completion_tokens} completion tokens, finish {call.finish_reason}, "
          f"valid {call.valid}")
    return DirectBaseline(segment.segment_id, len(segment.turns), token_estimate, call)


# --- the wait, sampled: a timeline of the tenant's progress, when each segment was seen done ------

POLL_S = 1.0
PROGRESS_EVERY_S = 30.0
TICK_EVERY_S = 10.0

SEGMENT_STATUSES = "SELECT segment_id, status FROM memory.segments WHERE tenant = %(t)s"


@dataclass(frozen=True)
class WaitLimits:
    deadline_s: float  # from the stream's start
    stall_s: float  # no turn stored, segment closed or segment finished for this long


@dataclass
class _Sampler:
    """Runs after every poll of the product's wait: the bench's own records of the run."""

    conn: psycopg.Connection
    tenant: str
    started: float
    expected_turns: int
    expected_segments: int
    outcome: WaitOutcome
    tick: Callable[[], None] | None
    last_tick: float = 0.0
    last_print: float = 0.0

    def __call__(self, state: StoreState, _waited_s: float) -> None:
        now = time.time()
        for sid, status in self.conn.execute(SEGMENT_STATUSES, {"t": self.tenant}).fetchall():
            if status != "pending":
                self.outcome.seen_done_at.setdefault(sid, now)
        sample = Sample(round(now - self.started, 1), state.turns, state.segments, state.done_segments, state.enriched)
        timeline = self.outcome.timeline
        if not timeline or now - self.started - timeline[-1].t_s >= 5 or sample.done != timeline[-1].done:
            timeline.append(sample)
        if state.enrichment_finished(self.expected_turns):
            return
        if self.tick is not None and now - self.last_tick >= TICK_EVERY_S:
            self.tick()
            self.last_tick = now
        if now - self.last_print >= PROGRESS_EVERY_S:
            print("    " + progress_line(sample, self.expected_turns, self.expected_segments, state.first_closed_at,
                                         now), flush=True)
            self.last_print = now


def wait_for_enrichment_sampled(
    url: str, tenant: str, *, expected_turns: int, expected_segments: int, started: float, limits: WaitLimits,
    tick: Callable[[], None] | None = None,
) -> WaitOutcome:
    """`started` is the stream's time.time(); KeyboardInterrupt (and SIGTERM, see run.py) ends the wait early.
    `tick` runs every TICK_EVERY_S (the caller scrapes the worker's counters)."""
    outcome = WaitOutcome(False, "interrupted", 0.0)
    try:
        with psycopg.connect(url, autocommit=True) as conn:  # autocommit: each poll sees new commits
            sampler = _Sampler(conn, tenant, started, expected_turns, expected_segments, outcome, tick)
            wait_for_enrichment(url, tenant, expected_turns=expected_turns,
                                timeout_s=max(0.0, limits.deadline_s - (time.time() - started)),
                                stall_s=limits.stall_s, interval_s=POLL_S, on_poll=sampler)
        outcome.complete, outcome.reason = True, "done"
    except WaitTimeout as exc:
        outcome.reason = exc.reason  # deadline | stalled
    except KeyboardInterrupt:
        outcome.reason = "interrupted"
    outcome.waited_s = time.time() - started
    return outcome


def progress_line(s: Sample, expected_turns: int, expected_segments: int, first_closed, now: float) -> str:  # type: ignore[no-untyped-def]
    line = (
        f"t={s.t_s / 60:5.1f} min  turns stored {s.stored_turns}/{expected_turns}  "
        f"segments closed {s.closed}/{expected_segments}, done {s.done} ({s.enriched} enriched)"
    )
    if first_closed is not None and s.done:
        minutes = (now - first_closed.timestamp()) / 60
        rate = s.done / minutes
        eta = (expected_segments - s.done) / rate if rate > 0 else float("inf")
        line += f"  {rate:.2f} segments/min, ~{eta:.0f} min to go"
    return line


# --- what the run left in PostgreSQL --------------------------------------------------------------

PER_CONVERSATION = """
SELECT t.conversation_id,
       (SELECT count(*) FROM memory.turns x WHERE x.tenant = t.tenant AND x.conversation_id = t.conversation_id) AS turns,
       count(s.*) AS segments,
       count(s.*) FILTER (WHERE s.status = 'enriched') AS enriched,
       count(s.*) FILTER (WHERE s.status = 'failed') AS failed,
       count(s.*) FILTER (WHERE s.status = 'pending') AS pending,
       coalesce(sum(s.attempts), 0) AS attempts,
       (SELECT count(*) FROM memory.gists g WHERE g.tenant = t.tenant AND g.conversation_id = t.conversation_id) AS gists,
       (SELECT count(*) FROM memory.facts f WHERE f.tenant = t.tenant AND f.conversation_id = t.conversation_id) AS facts
FROM (SELECT DISTINCT tenant, conversation_id FROM memory.turns WHERE tenant = %(t)s) t
LEFT JOIN memory.segments s ON s.tenant = t.tenant AND s.conversation_id = t.conversation_id
GROUP BY t.tenant, t.conversation_id ORDER BY t.conversation_id
"""
SEGMENTS = """
SELECT segment_id, conversation_id, close_reason, token_estimate, cardinality(turn_ids) AS turns, status, attempts,
       error, produced_at, closed_at, published_at, enriched_at,
       (SELECT count(*) FROM memory.gists g WHERE g.tenant = s.tenant AND g.segment_id = s.segment_id) AS gists,
       (SELECT count(*) FROM memory.facts f WHERE f.tenant = s.tenant AND f.segment_id = s.segment_id) AS facts
FROM memory.segments s WHERE tenant = %(t)s ORDER BY closed_at
"""
TURN_LATENCIES = """
SELECT extract(epoch FROM stored_at - produced_at)::float8 FROM memory.turns
WHERE tenant = %(t)s AND produced_at IS NOT NULL
"""
ENTITIES = "SELECT count(*) FROM memory.entities WHERE tenant = %(t)s"


def read_run(url: str, tenant: str) -> RunRows:
    params = {"t": tenant}
    with psycopg.connect(url) as conn:
        cur = conn.cursor(row_factory=dict_row)
        conversations = cur.execute(PER_CONVERSATION, params).fetchall()
        segments = cur.execute(SEGMENTS, params).fetchall()
        latencies = np.array([r[0] for r in conn.execute(TURN_LATENCIES, params).fetchall()], dtype=np.float64)
        entities = int(conn.execute(ENTITIES, params).fetchone()[0])  # type: ignore[index]
    return RunRows(conversations, segments, latencies, entities)


# --- the model's own limit (see the module's docstring) -------------------------------------------

# Far above the worker's own timeout: the baseline must finish to be a baseline.
DIRECT_TIMEOUT_S = 1800.0


def typical_segment_id(segments: list[dict[str, Any]]) -> str | None:
    """The segment of median size: the model's cost grows with the prompt."""
    if not segments:
        return None
    ordered = sorted(segments, key=lambda s: (s["token_estimate"], s["segment_id"]))
    return str(ordered[len(ordered) // 2]["segment_id"])


def load(url: str, tenant: str, segment_id: str) -> Segment | None:
    """The segment as the worker published it (turns in their speakers' local time)."""

    async def run() -> Segment | None:
        async with await psycopg.AsyncConnection.connect(url) as conn:
            return await load_segment(conn, tenant, segment_id)

    return asyncio.run(run())


def call_once(settings: Settings, segment: Segment) -> DirectCall:
    # The worker's request, sent by a plain client: no retries, and a timeout the call cannot hit.
    client = openai.OpenAI(
        base_url=settings.extractor_url, api_key=settings.llm_api_key.get_secret_value(),
        timeout=DIRECT_TIMEOUT_S, max_retries=0,
    )
    started = time.perf_counter()
    try:
        with client:
            response = client.chat.completions.create(
                model=settings.extractor_model_name,
                messages=build_messages(segment),  # type: ignore[arg-type]
                max_tokens=settings.extractor_max_tokens,
                temperature=0.0,  # what ModelClient.complete_json sends
                response_format=response_format(EnrichmentOut, settings.llm_json_mode),  # type: ignore[arg-type]
            )
    except openai.OpenAIError as exc:
        return DirectCall(time.perf_counter() - started, 0, 0, None, False, f"{type(exc).__name__}: {exc}"[:300])
    seconds = time.perf_counter() - started
    choice = response.choices[0] if response.choices else None
    content = (choice.message.content or "") if choice else ""
    try:
        EnrichmentOut.model_validate(json.loads(content, strict=False))
        valid = True
    except (json.JSONDecodeError, ValidationError):
        valid = False
    usage = response.usage
    return DirectCall(
        seconds, usage.prompt_tokens if usage else 0, usage.completion_tokens if usage else 0,
        choice.finish_reason if choice else None, valid,
    )
