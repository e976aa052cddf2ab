"""The enrichment benchmark's result: one JSON-able dict from the run's rows, counters and baseline."""

from __future__ import annotations

from typing import Any

import numpy as np

from .enrich_measure import DirectBaseline, RunRows, failures, percentiles, segment_timings
from .enrich_wait import WaitOutcome
from .produce import SteadySend
from .worker_metrics import ExtractorCounters
from .workload import Workload


def build_result(
    *, workload: Workload, quick: bool, rate: float, worker: dict[str, str | None], expected: dict[str, int],
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
            "source": workload.source, "tenant": workload.tenant, "quick": quick,
            "conversations": len(workload.conversations), "turns": turns,
            "rate_turns_per_s": rate,
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
    calls = result["model_calls"]
    return {
        "segments_remaining": remaining,
        "projected_model_calls": round(calls["per_segment_done"] * s["expected"]) if calls and calls["per_segment_done"] else None,
        "minutes_remaining_at_this_rate": round(remaining / rate, 1),
        "projected_total_minutes": round(lead_min + s["expected"] / rate, 1),
        "note": "at the run's own segments/min and model calls per finished segment (retries included)",
    }
