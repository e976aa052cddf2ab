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

import numpy as np

from epistream.settings import Settings
from pipeline.segmenter import SegmenterConfig

from . import cleanup, enrich_report, report
from .enrich_measure import RunRows, failures, percentiles, read_run, segment_timings
from .enrich_wait import WaitLimits, WaitOutcome, wait_for_enrichment
from .model_direct import DirectBaseline, load, measure_direct, typical_segment_id
from .produce import Record, SteadySend, send_steady
from .stack import CpuSnapshot, cpu_report, managed_pid, wait_until_idle, worker_pid, worker_setting
from .worker_metrics import ExtractorCounters, Increase, scrape_extractor
from .workload import Workload, enrich_workload, expected_segments

ROOT = Path(__file__).resolve().parent.parent
# How long to wait for the model server to finish others' (or abandoned) requests before streaming, and
# before the direct calls, whose timing is only the model's own on an otherwise idle server.
IDLE_BEFORE_STREAM_S = 60.0
IDLE_BEFORE_DIRECT_S = 300.0
# The worker's settings that shape this benchmark, read from its environment (it may predate ours).
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
    outcome = wait_for_enrichment(
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
    try:
        if not outcome.complete:
            # What is still queued would keep the model busy long after the run (and spoil the baseline).
            purge = cleanup.drop_queued_segments(settings, url) if not opts.keep else None
            if not opts.keep:
                cleanup.forget_tenants(url, [workload.tenant])
            result_cleanup["queued_segments_dropped"] = purge.dropped_messages if purge else 0
            result_cleanup["other_tenants_segments_requeued"] = purge.requeued_other_segments if purge else 0
            if purge:
                print(f"  dropped {purge.dropped_messages} queued segment messages; other tenants' pending "
                      f"segments re-queued: {purge.requeued_other_segments}")
        direct, idle_for_direct = None, None
        if segment is not None:
            waited = wait_until_idle(model_pid, timeout_s=IDLE_BEFORE_DIRECT_S)
            idle_for_direct = waited < IDLE_BEFORE_DIRECT_S
            print(f"direct model baseline: segment {segment.segment_id} ({len(segment.turns)} turns), model "
                  f"server {'idle' if idle_for_direct else 'STILL BUSY (baseline is contended)'} after {waited:.0f}s")
            token_estimate = next(s["token_estimate"] for s in rows.segments if s["segment_id"] == typical)
            direct = measure_direct(
                settings, segment, token_estimate,
                lambda: (c.calls if (c := scrape_extractor(settings)) is not None else None),
            )
            print(f"  {direct.first.seconds:.1f}s then {direct.repeat.seconds:.1f}s (prompt cached); "
                  f"{direct.first.completion_tokens} completion tokens, finish {direct.first.finish_reason}, "
                  f"valid {direct.first.valid}")
    finally:
        if not opts.keep:
            removed = cleanup.forget_tenants(url, [workload.tenant])
            left = cleanup.remaining_rows(url, [workload.tenant])
            result_cleanup.update(removed=removed, remaining=left)
            print(f"removed the enrichment run's rows ({sum(removed.values())}); left: {sum(left.values())}")

    result = build_result(
        workload=workload, opts=opts, worker=worker, expected=expected, stream=stream.result, outcome=outcome,
        rows=rows, counters=watch.counters.total, direct=direct,
        started=started, cpu=cpu_report(settings, cpu_before, cpu_after), machine=report.machine_info(ROOT),
    )
    result["cleanup"] = result_cleanup
    result["worker_restarts"] = {
        "pids": watch.pids, "counter_resets": watch.counters.resets, "settings_at_end": worker_at_end,
        "note": "a worker restarted mid-run (by anyone) may run other code and settings for the rest of the run; "
        "counters are summed across restarts from 10 s scrapes, so a restart loses at most ~10 s of counts",
    }
    result["model_server_idle_before_stream"] = waited_idle < IDLE_BEFORE_STREAM_S
    result["model_server_idle_before_direct"] = idle_for_direct
    result["other_tenants_waiting_at_start"] = others_waiting
    enrich_report.write_all(opts.results, result)
    return result


def build_result(
    *, workload: Workload, opts: EnrichOptions, worker: dict[str, str | None], expected: dict[str, int],
    stream: SteadySend | None, outcome: WaitOutcome, rows: RunRows, counters: ExtractorCounters | None,
    direct: DirectBaseline | None, started: float, cpu: dict[str, Any], machine: dict[str, Any],
) -> dict[str, Any]:
    segs = rows.segments
    enriched = [s for s in segs if s["status"] == "enriched"]
    failed = [s for s in segs if s["status"] == "failed"]
    done = len(enriched) + len(failed)
    first_closed = min((s["closed_at"].timestamp() for s in segs), default=None)
    last_done = max((outcome.seen_done_at[s["segment_id"]] for s in segs if s["segment_id"] in outcome.seen_done_at), default=None)
    span_end = last_done if outcome.complete else started + outcome.waited_s
    span_s = (span_end - first_closed) if first_closed is not None and span_end is not None else None
    per_min = done / (span_s / 60) if span_s else None
    turns = len(workload.turns)
    result: dict[str, Any] = {
        "workload": {
            "source": workload.source, "tenant": workload.tenant, "quick": opts.quick,
            "conversations": len(workload.conversations), "turns": turns,
            "rate_turns_per_s": opts.rate,
            "achieved_turns_per_s": round(stream.achieved_per_s, 2) if stream else None,
            "stream_s": round(stream.seconds, 1) if stream else None,
            "stream_max_behind_schedule_s": round(stream.max_behind_s, 3) if stream else None,
        },
        "worker_settings": worker,
        "idle_note": "the benchmark starts the stack with EPISTREAM_SEGMENT_IDLE_S (default 20 s, --idle-s) in "
        "up()'s environment, which the workers inherit; the value above is the running worker's own",
        "outcome": {"complete": outcome.complete, "reason": outcome.reason, "waited_s": round(outcome.waited_s, 1)},
        "segments": {
            "expected": sum(expected.values()), "closed": len(segs), "enriched": len(enriched),
            "failed": len(failed), "pending": len(segs) - done,
            "failed_share": round(len(failed) / done, 3) if done else None,
            "by_close_reason": _count_by(segs, "close_reason"),
            "prompt_token_estimate": percentiles([s["token_estimate"] for s in segs]),
            "turns_per_segment": percentiles([s["turns"] for s in segs]),
            "attempts_total": int(sum(s["attempts"] for s in segs)),
        },
        "per_conversation": [
            {**{k: int(v) if k != "conversation_id" else v for k, v in c.items()},
             "expected_segments": expected.get(c["conversation_id"])}
            for c in rows.conversations
        ],
        "lacking": _lacking(rows.conversations),
        "memory": {
            "gists": sum(int(c["gists"]) for c in rows.conversations),
            "facts": sum(int(c["facts"]) for c in rows.conversations),
            "entities": rows.entities,
        },
        "throughput": {
            "span_s": round(span_s, 1) if span_s else None,
            "span_note": "first segment closed -> last segment seen enriched or failed (or the end of the wait)",
            "segments_done": done,
            "segments_per_min": round(per_min, 3) if per_min else None,
        },
        "model_calls": _calls(counters, turns, done),
        "latency_s": {
            "produce_to_searchable": percentiles(rows.turn_latencies_s),
            **segment_timings(rows, outcome.seen_done_at),
            "note": "searchable: memory.turns.stored_at - produced_at (Kafka time) per turn; facts: "
            "memory.segments.enriched_at - produced_at (its newest turn's Kafka time) per enriched segment. Both "
            "stamps are now() of the writing transaction, i.e. its start: lower bounds. 'seen' is when the "
            "benchmark's 1 s poll first saw the segment committed: an upper bound",
        },
        "failures": failures(rows),
        # For the chart: turn latencies as 21 quantiles (0, 5, ..., 100 %), segment latencies whole.
        "distributions": {
            "turn_latency_quantiles_s": [round(float(q), 3) for q in np.percentile(rows.turn_latencies_s, range(0, 101, 5))]
            if rows.turn_latencies_s.size else [],
            "segment_produce_to_facts_s": [
                round((x["enriched_at"] - x["produced_at"]).total_seconds(), 2) for x in enriched if x["produced_at"]
            ],
        },
        "direct_model": direct.to_dict() if direct else None,
        "neighbours": {
            "other_tenants_segments_in_window": rows.neighbours,
            "note": "the worker's counters are per process: other tenants' segments closed or enriched in the "
            "window also count in model_calls and tokens",
        },
        "cpu": cpu,
        "timeline_columns": ["seconds since the first send", "turns stored", "segments closed", "enriched or failed",
                             "enriched"],
        "timeline": [[s.t_s, s.stored_turns, s.closed, s.done, s.enriched] for s in outcome.timeline],
        "machine": machine,
    }
    _compare(result, direct, counters, per_min, span_s)
    if not outcome.complete and per_min:
        result["projection"] = _projection(result, started, first_closed)
    return result


def _count_by(rows: list[dict[str, Any]], key: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rows:
        counts[str(r[key])] = counts.get(str(r[key]), 0) + 1
    return counts


def _lacking(conversations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"conversation_id": c["conversation_id"], "missing": [k for k in ("segments", "gists", "facts") if not c[k]]}
        for c in conversations if not (c["segments"] and c["gists"] and c["facts"])
    ]


def _calls(counters: ExtractorCounters | None, turns: int, done: int) -> dict[str, Any] | None:
    if counters is None:
        return None
    calls = counters.calls
    return {
        "total": int(calls),
        "per_1000_turns": round(1000 * calls / turns, 1) if turns else None,
        "per_segment_done": round(calls / done, 2) if done else None,
        "by_outcome": {
            "ok": int(counters.calls_ok), "invalid_output": int(counters.calls_invalid_output),
            "retry_after_error": int(counters.calls_retry), "failed": int(counters.calls_failed),
        },
        "seconds_total": round(counters.call_seconds, 1),
        "mean_call_s": round(counters.call_seconds / calls, 2) if calls else None,
        "prompt_tokens": int(counters.prompt_tokens),
        "completion_tokens": int(counters.completion_tokens),
        "tokens_note": "calls that timed out report no tokens, though the model server may have generated them",
        "worker_segments_enriched": int(counters.segments_enriched),
        "worker_segments_failed": int(counters.segments_failed),
        "worker_enrich_seconds_enriched": round(counters.enrich_seconds, 1),
        "source": "deltas of the ingest worker's /metrics over the run (role=extractor)",
    }


def _compare(result: dict[str, Any], direct: DirectBaseline | None, counters: ExtractorCounters | None,
             per_min: float | None, span_s: float | None) -> None:
    """Pipeline against the model's physical limit, measured in the same run."""
    t = result["throughput"]
    if direct is None or not direct.first.seconds:
        return
    t["direct_segments_per_min"] = round(direct.segments_per_min, 3)
    t["pipeline_over_direct"] = round(per_min / direct.segments_per_min, 3) if per_min else None
    if counters and span_s:
        bound = direct.model_bound_seconds(counters.prompt_tokens, counters.completion_tokens)
        if bound is not None:
            # The tokens the pipeline actually had generated, at the direct calls' speed: the time the
            # model alone needed; the rest of the span went to waiting, retries cut short, and contention.
            t["model_bound_s"] = round(bound, 1)
            t["model_bound_share_of_span"] = round(bound / span_s, 3)
        t["model_call_share_of_span"] = round(counters.call_seconds / span_s, 3)


def _projection(result: dict[str, Any], started: float, first_closed: float | None) -> dict[str, Any]:
    s, t = result["segments"], result["throughput"]
    rate = t["segments_per_min"]
    lead_min = ((first_closed - started) / 60) if first_closed else 0.0
    remaining = max(0, s["expected"] - t["segments_done"])
    return {
        "segments_remaining": remaining,
        "minutes_remaining_at_this_rate": round(remaining / rate, 1),
        "projected_total_minutes": round(lead_min + s["expected"] / rate, 1),
        "note": "at the run's own segments/min; extra model calls for failures are included in that rate",
    }
