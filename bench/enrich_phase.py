"""The enrichment benchmark: stream LoCoMo at a steady rate, wait until every segment is enriched or
failed, then read what happened from the database, the worker's counters and the model server itself."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from epistream.contracts import Segment
from epistream.pipeline.segmenter import SegmenterConfig
from epistream.settings import Settings

from . import cleanup, enrich_report, report
from .enrich_measure import DirectBaseline, load, measure_direct, read_run, typical_segment_id
from .enrich_result import build_result
from .enrich_wait import WaitLimits, wait_for_enrichment_sampled
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
from .worker_metrics import ExtractorCounters, Increase, model_calls_all_workers, scrape_extractor
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


@dataclass
class WorkerWatch:
    """The ingest worker across the run: its counters' increase, and whether it was restarted."""

    settings: Settings
    counters: Increase[ExtractorCounters]
    pids: list[int]

    @classmethod
    def start(cls, settings: Settings) -> WorkerWatch:
        pid = worker_pid(settings)
        return cls(settings, Increase(scrape_extractor(settings)), [pid] if pid else [])

    def tick(self) -> None:
        self.counters.add(scrape_extractor(self.settings))
        pid = worker_pid(self.settings)
        if pid and (not self.pids or self.pids[-1] != pid):
            self.pids.append(pid)

    @property
    def restarted(self) -> bool:
        return len(self.pids) > 1 or self.counters.resets > 0


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
        ROOT, run_id=run_id, conversations=opts.conversations,
        turns_per_conversation=opts.turns_per_conversation,
    )
    expected = expected_segments(workload.turns, _segmenter_config(worker))
    model_pid = managed_pid(settings, "model-server")
    print(f"\nenrichment: {len(workload.turns)} turns of {len(workload.conversations)} conversations at "
          f"{opts.rate:g} turns/s, tenant {workload.tenant}; expect {sum(expected.values())} segments; "
          f"worker idle timeout {worker['segment_idle_s']}s")
    others_waiting = {t: n for t, n in cleanup.pending_by_tenant(url).items() if t != workload.tenant}
    if others_waiting:
        print(f"  note: segments of other tenants are waiting for the same worker: {others_waiting}")
    # Bounded: with other tenants' segments queued, the model server never goes idle.
    waited_idle = wait_until_idle(model_pid, timeout_s=IDLE_BEFORE_STREAM_S)
    print(f"  model server {'idle' if waited_idle < IDLE_BEFORE_STREAM_S else 'still busy'} after "
          f"{waited_idle:.0f}s; streaming")

    watch, cpu_before = WorkerWatch.start(settings), CpuSnapshot.take()
    window_start = datetime.now(UTC)
    stream = _Stream(settings, [Record.of(t) for t in workload.turns], opts.rate)
    started = time.time()
    stream.start()
    outcome = wait_for_enrichment_sampled(
        url, workload.tenant, expected_turns=len(workload.turns), expected_segments=sum(expected.values()),
        started=started, limits=WaitLimits(opts.max_minutes * 60, opts.stall_minutes * 60), tick=watch.tick,
    )
    time.sleep(0.5)  # the worker counts a segment just after the commit the poll saw
    watch.tick()
    cpu_after = CpuSnapshot.take()
    worker_at_end = _worker_settings(settings)
    if watch.restarted:
        print(f"  note: the ingest worker was restarted during the run (pids {watch.pids}); settings now {worker_at_end}")
    window = (window_start, datetime.now(UTC))
    print(f"  {outcome.reason} after {outcome.waited_s / 60:.1f} min")
    if stream.error is not None:
        raise RuntimeError("streaming the turns failed") from stream.error

    rows = read_run(url, workload.tenant, window)
    typical = typical_segment_id(rows.segments)
    segment = load(url, workload.tenant, typical) if typical else None
    result_cleanup: dict[str, Any] = {"kept": opts.keep}
    cpu = cpu_report(settings, cpu_before, cpu_after)

    def assemble(direct: DirectBaseline | None, idle_for_direct: bool | None) -> dict[str, Any]:
        result = build_result(
            workload=workload, quick=opts.quick, rate=opts.rate, worker=worker, expected=expected,
            stream=stream.result, outcome=outcome, rows=rows, counters=watch.counters.total, direct=direct,
            started=started, cpu=cpu, machine=report.machine_info(ROOT),
        )
        result["cleanup"] = result_cleanup
        result["worker_restarts"] = {
            "pids": watch.pids, "counter_resets": watch.counters.resets, "settings_at_end": worker_at_end,
            "note": "a worker restarted mid-run (by anyone) may run other code and settings for the rest of the "
            "run; counters are summed across restarts from 10 s scrapes, so a restart loses at most ~10 s of counts",
        }
        result["model_server_idle_before_stream"] = waited_idle < IDLE_BEFORE_STREAM_S
        result["model_server_idle_before_direct"] = idle_for_direct
        result["other_tenants_waiting_at_start"] = others_waiting
        return result

    direct, idle_for_direct = None, None
    try:
        if not outcome.complete and not opts.keep:
            result_cleanup.update(_cut_off(settings, url, workload.tenant))
        # Written now, and again with the baseline: the figures survive a run killed during the direct calls.
        enrich_report.write_all(opts.results, assemble(None, None))
        if segment is not None:
            token_estimate = next(s["token_estimate"] for s in rows.segments if s["segment_id"] == typical)
            direct, idle_for_direct = _direct_baseline(settings, model_pid, segment, token_estimate)
    finally:
        if not opts.keep:
            again = cleanup.forget_tenants(url, [workload.tenant])  # everything, or what came after _cut_off
            removed = {k: v + result_cleanup.get("removed", {}).get(k, 0) for k, v in again.items()}
            left = cleanup.remaining_rows(url, [workload.tenant])
            result_cleanup.update(removed=removed, remaining=left)
            print(f"removed the enrichment run's rows ({sum(removed.values())}); left: {sum(left.values())}")
    result = assemble(direct, idle_for_direct)
    enrich_report.write_all(opts.results, result)
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


def _direct_baseline(
    settings: Settings, model_pid: int | None, segment: Segment, token_estimate: int
) -> tuple[DirectBaseline, bool]:
    waited = wait_until_idle(model_pid, timeout_s=IDLE_BEFORE_DIRECT_S)
    idle = waited < IDLE_BEFORE_DIRECT_S
    print(f"direct model baseline: segment {segment.segment_id} ({len(segment.turns)} turns), model "
          f"server {'idle' if idle else 'STILL BUSY (baseline is contended)'} after {waited:.0f}s")
    direct = measure_direct(settings, segment, token_estimate, lambda: model_calls_all_workers(settings))
    print(f"  {direct.first.seconds:.1f}s then {direct.repeat.seconds:.1f}s (prompt cached); "
          f"{direct.first.completion_tokens} completion tokens, finish {direct.first.finish_reason}, "
          f"valid {direct.first.valid}")
    return direct, idle
