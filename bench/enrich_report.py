"""The enrichment benchmark's result: what a run measured (its rows, its wait, the direct model calls), built
into one JSON-able dict, drawn as a three-panel chart and printed as markdown tables (bench.report writes
them). Pure, apart from drawing the chart.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import report
from .produce import SteadySend
from .worker_metrics import ExtractorCounters
from .workload import Workload

# --- what a run measured --------------------------------------------------------------------------

@dataclass(frozen=True)
class RunRows:
    conversations: list[dict[str, Any]]
    segments: list[dict[str, Any]]
    turn_latencies_s: np.ndarray
    entities: int


def percentiles(values: np.ndarray | list[float]) -> dict[str, float | None]:
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return {"n": 0, "p50": None, "p95": None, "max": None}
    p50, p95 = np.percentile(a, [50, 95])
    return {"n": int(a.size), "p50": round(float(p50), 2), "p95": round(float(p95), 2), "max": round(float(a.max()), 2)}


def segment_timings(rows: RunRows) -> dict[str, Any]:
    """Where an enriched segment's time went, from its own timestamps: produced_at (newest turn's Kafka
    time) -> closed_at (the segmenter closed it) -> enriched_at (the store transaction began)."""
    enriched = [s for s in rows.segments if s["status"] == "enriched" and s["produced_at"] is not None]

    def secs(a: str, b: str) -> list[float]:
        return [(s[b] - s[a]).total_seconds() for s in enriched if s[a] is not None and s[b] is not None]

    return {"produce_to_facts_s": percentiles(secs("produced_at", "enriched_at")),
            "close_to_facts_s": percentiles(secs("closed_at", "enriched_at"))}


@dataclass(frozen=True)
class DirectCall:
    seconds: float
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None
    valid: bool  # parses and validates as EnrichmentOut, as the worker requires
    error: str | None = None


@dataclass(frozen=True)
class DirectBaseline:
    """The worker's request for one segment, sent straight to the model server: what each segment costs
    the model back to back."""

    segment_id: str
    turns: int
    token_estimate: int
    call: DirectCall

    @property
    def segments_per_min(self) -> float:
        return 60.0 / self.call.seconds

    def to_dict(self) -> dict[str, Any]:
        return {
            "segment_id": self.segment_id,
            "turns": self.turns,
            "token_estimate": self.token_estimate,
            "first_call": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self.call).items()},
            "segments_per_min": round(self.segments_per_min, 3),
        }


@dataclass(frozen=True)
class Sample:
    t_s: float  # since the stream started
    stored_turns: int
    closed: int
    done: int  # enriched or failed
    enriched: int = 0


@dataclass
class WaitOutcome:
    complete: bool
    reason: str  # done | deadline | stalled | interrupted
    waited_s: float
    # When the bench first saw each segment leave 'pending' (unix time): an upper bound of when it was
    # done, within one poll; enriched_at is a lower bound (the store transaction's start).
    seen_done_at: dict[str, float] = field(default_factory=dict)
    timeline: list[Sample] = field(default_factory=list)


# --- the result -----------------------------------------------------------------------------------

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
    throughput: dict[str, Any] = {
        "span_s": round(span_s, 1) if span_s else None,
        "span_note": "first segment closed -> last segment seen enriched or failed (or the end of the wait)",
        "segments_done": done,
        "segments_per_min": round(per_min, 3) if per_min else None,
    }
    if direct is not None and direct.call.seconds:
        # The pipeline against the model's own limit, measured in the same run.
        throughput["direct_segments_per_min"] = round(direct.segments_per_min, 3)
        throughput["pipeline_over_direct"] = round(per_min / direct.segments_per_min, 3) if per_min else None
    return {
        "workload": {
            "source": workload.source, "tenant": workload.tenant, "quick": quick,
            "conversations": len(workload.conversations), "turns": turns,
            "rate_turns_per_s": rate,
            "achieved_turns_per_s": round(stream.achieved_per_s, 2) if stream else None,
            "stream_s": round(stream.seconds, 1) if stream else None,
            "stream_max_behind_schedule_s": round(stream.max_behind_s, 3) if stream else None,
        },
        "worker_settings": worker,
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
        "memory": {
            "gists": sum(int(c["gists"]) for c in rows.conversations),
            "facts": sum(int(c["facts"]) for c in rows.conversations),
            "entities": rows.entities,
        },
        "throughput": throughput,
        "model_calls": _calls(counters, turns, done),
        "latency_s": {
            "produce_to_searchable": percentiles(rows.turn_latencies_s),
            **segment_timings(rows),
            "note": "searchable: memory.turns.stored_at - produced_at (Kafka time) per turn; facts: "
            "memory.segments.enriched_at - produced_at (its newest turn's Kafka time) per enriched segment. Both "
            "stamps are now() of the writing transaction, i.e. its start: lower bounds",
        },
        # For the chart: turn latencies as 21 quantiles (0, 5, ..., 100 %), segment latencies whole.
        "distributions": {
            "turn_latency_quantiles_s": [round(float(q), 3) for q in np.percentile(rows.turn_latencies_s, range(0, 101, 5))]
            if rows.turn_latencies_s.size else [],
            "segment_produce_to_facts_s": [
                round((x["enriched_at"] - x["produced_at"]).total_seconds(), 2) for x in enriched if x["produced_at"]
            ],
        },
        "direct_model": direct.to_dict() if direct else None,
        "cpu": cpu,
        "timeline_columns": ["seconds since the first send", "turns stored", "segments closed", "enriched or failed",
                             "enriched"],
        "timeline": [[s.t_s, s.stored_turns, s.closed, s.done, s.enriched] for s in outcome.timeline],
        "machine": machine,
    }


def _count_by(rows: list[dict[str, Any]], key: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rows:
        counts[str(r[key])] = counts.get(str(r[key]), 0) + 1
    return counts


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
        "source": "deltas of the ingest worker's /metrics over the run (role=extractor)",
    }


JSON_NAME = "enrich.json"


# --- the chart ------------------------------------------------------------------------------------

def write_chart(result: dict[str, Any], path: Path) -> None:
    fig, (timeline, latency, rates) = report.subplots(1, 3, figsize=(15, 4.6))
    _timeline(timeline, result)
    _latency(latency, result)
    _rates(rates, result)
    w, m = result["workload"], result["machine"]
    state = "" if result["outcome"]["complete"] else f" - PARTIAL ({result['outcome']['reason']})"
    fig.suptitle(
        f"epistream enrichment: {w['turns']} turns of {w['conversations']} {w['source']} conversations at "
        f"{w['rate_turns_per_s']:g} turns/s, {m['nproc']} CPUs{state}"
    )
    report.save(fig, path)


def _timeline(ax, result: dict[str, Any]) -> None:  # type: ignore[no-untyped-def]
    points = result["timeline"]
    if points:
        minutes = [p[0] / 60 for p in points]
        ax.step(minutes, [p[2] for p in points], where="post", label="segments closed", color="#1f77b4")
        ax.step(minutes, [p[3] for p in points], where="post", label="enriched or failed", color="#d62728")
        if len(points[0]) > 4:
            ax.step(minutes, [p[4] for p in points], where="post", label="enriched", color="#2ca02c")
    ax.axhline(result["segments"]["expected"], ls="--", color="#999", lw=1, label="expected segments")
    stream_min = (result["workload"]["stream_s"] or 0) / 60
    ax.axvline(stream_min, ls=":", color="#555", lw=1, label="last turn sent")
    ax.set_xlabel("minutes since the first turn was sent")
    ax.set_ylabel("segments")
    ax.set_title("closing vs enrichment (the gap is the queue)")
    ax.legend(fontsize=8, loc="lower right")


def _latency(ax, result: dict[str, Any]) -> None:  # type: ignore[no-untyped-def]
    dist = result["distributions"]
    quantiles = dist["turn_latency_quantiles_s"]
    if quantiles:
        ax.plot(quantiles, [i / (len(quantiles) - 1) for i in range(len(quantiles))], label="produce -> searchable (turns)")
    facts = sorted(dist["segment_produce_to_facts_s"])
    if facts:
        ax.step(facts, [(i + 1) / len(facts) for i in range(len(facts))], where="post",
                label="produce -> facts (enriched segments)")
    ax.set_xscale("log")
    ax.set_xlabel("seconds (log scale)")
    ax.set_ylabel("share of items at or below")
    ax.set_title("latency distributions")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")


def _rates(ax, result: dict[str, Any]) -> None:  # type: ignore[no-untyped-def]
    t = result["throughput"]
    labels, values, colors = ["pipeline\n(steady stream)"], [t.get("segments_per_min") or 0.0], ["#d62728"]
    if t.get("direct_segments_per_min"):
        labels.append("model alone,\nsame request\nback to back")
        values.append(t["direct_segments_per_min"])
        colors.append("#1f77b4")
    report.bars(ax, labels, values, colors, label="{:.2f}/min")
    ax.set_ylabel("segments per minute")
    ratio = t.get("pipeline_over_direct")
    ax.set_title("throughput vs the model's limit" + (f" (ratio {ratio:.2f})" if ratio else ""))
    ax.set_ylim(top=max(values + [0.1]) * 1.25)


# --- markdown ---------------------------------------------------------------------

def _fmt(p: dict[str, Any] | None, unit: str = "s") -> str:
    if not p or p.get("p50") is None:
        return "n/a"
    return f"{p['p50']:,.1f} {unit} / {p['p95']:,.1f} {unit}"


def _spread(values: list[int]) -> str:
    if not values:
        return "n/a"
    return f"{min(values)}-{max(values)} (mean {sum(values) / len(values):.1f})"


def markdown(result: dict[str, Any]) -> str:
    w, s, t, m = result["workload"], result["segments"], result["throughput"], result["machine"]
    calls, lat, direct = result["model_calls"], result["latency_s"], result["direct_model"]
    conv = result["per_conversation"]
    state = "complete" if result["outcome"]["complete"] else f"PARTIAL: stopped ({result['outcome']['reason']})"
    lines = [
        f"Enrichment benchmark: {w['turns']} turns of {w['conversations']} {w['source']} conversations streamed at "
        f"{w['rate_turns_per_s']:g} turns/s ({state} after {result['outcome']['waited_s'] / 60:.1f} min), "
        f"{m['nproc']} CPUs, commit {m['git_commit'] or 'unknown'}, {m['timestamp']}; worker idle timeout "
        f"{result['worker_settings']['segment_idle_s']} s, extractor budget {result['worker_settings']['extractor_max_tokens']} "
        f"tokens, call timeout {_timeout(result['worker_settings'])} s",
        "",
        "| measure | value |",
        "|---|---:|",
        f"| segments closed (expected) | {s['closed']} ({s['expected']}) |",
        f"| enriched / failed / pending | {s['enriched']} / {s['failed']} / {s['pending']}"
        + (f" ({100 * s['failed_share']:.0f}% failed)" if s["failed_share"] is not None else "") + " |",
        f"| segments per conversation | {_spread([c['segments'] for c in conv])} |",
        f"| gists / facts per conversation | {_spread([c['gists'] for c in conv])} / {_spread([c['facts'] for c in conv])} |",
        f"| enrichment throughput, pipeline | {_num(t.get('segments_per_min'))} segments/min over "
        f"{_num((t.get('span_s') or 0) / 60, 1)} min |",
    ]
    if direct:
        f = direct["first_call"]
        lines.append(
            f"| model alone, the worker's request for one median segment, back to back | "
            f"{_num(t.get('direct_segments_per_min'))} segments/min ({f['seconds']:.1f} s: {f['prompt_tokens']} prompt + "
            f"{f['completion_tokens']} completion tokens, finish `{f['finish_reason']}`, valid {f['valid']}) |"
        )
        lines.append(f"| pipeline / model limit | {_num(t.get('pipeline_over_direct'))} |")
    if calls:
        o = calls["by_outcome"]
        lines += [
            f"| model calls (extractor) | {calls['total']} ({_num(calls['per_1000_turns'], 1)} per 1,000 turns, "
            f"{_num(calls['per_segment_done'])} per finished segment; mean {_num(calls['mean_call_s'], 1)} s) |",
            f"| call outcomes: ok / invalid output / error, retried / failed | {o['ok']} / {o['invalid_output']} / "
            f"{o['retry_after_error']} / {o['failed']} |",
            f"| extractor tokens, prompt / completion | {calls['prompt_tokens']:,} / {calls['completion_tokens']:,} |",
        ]
    lines += [
        f"| produce -> searchable p50 / p95 (turns) | {_fmt(lat['produce_to_searchable'])} |",
        f"| produce -> facts p50 / p95 (enriched segments) | {_fmt(lat['produce_to_facts_s'])} |",
        f"| of which close -> facts (queue + model + store) | {_fmt(lat['close_to_facts_s'])} |",
        "",
        report.table(["conversation", "turns", "segments (expected)", "enriched", "failed", "gists", "facts"],
                     ([c["conversation_id"].removeprefix(w["tenant"] + "-"), c["turns"],
                       f"{c['segments']} ({c['expected_segments']})", c["enriched"], c["failed"], c["gists"],
                       c["facts"]] for c in conv)),
        "",
        *_notes(result),
    ]
    return "\n".join(lines)


def _timeout(worker: dict[str, Any]) -> str | None:
    """The extractor's own timeout where the pipeline has one, else the shared model timeout."""
    return worker.get("extractor_timeout_s") or worker.get("llm_timeout_s")


def _num(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _notes(result: dict[str, Any]) -> list[str]:
    cpu = result["cpu"]
    return [f"CPU-seconds over the run ({cpu['wall_s'] / 60:.1f} min x {cpu['cores']} cores = "
            f"{cpu['wall_s'] * cpu['cores']:.0f} available, {cpu['machine_busy_cpu_s']:.0f} used): " + ", ".join(
                f"{p['process']} {p['cpu_s']:.0f}" for p in cpu["top_processes"][:5])
            + f", processes that exited meanwhile {cpu['exited_or_unattributed_cpu_s']:.0f}.\n"]
