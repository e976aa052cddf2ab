"""The enrichment results as JSON, a three-panel chart and markdown tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: no display on CI or servers
import matplotlib.pyplot as plt  # noqa: E402

from .report import write_json  # noqa: E402

JSON_NAME, PNG_NAME = "enrich.json", "enrich.png"


def write_all(folder: Path, result: dict[str, Any]) -> None:
    write_json(folder / JSON_NAME, result)
    write_chart(folder / PNG_NAME, result)


def write_chart(path: Path, result: dict[str, Any]) -> None:
    fig, (timeline, latency, rates) = plt.subplots(1, 3, figsize=(15, 4.6))
    _timeline(timeline, result)
    _latency(latency, result)
    _rates(rates, result)
    w, m = result["workload"], result["machine"]
    state = "" if result["outcome"]["complete"] else f" - PARTIAL ({result['outcome']['reason']})"
    fig.suptitle(
        f"epistream enrichment: {w['turns']} turns of {w['conversations']} {w['source']} conversations at "
        f"{w['rate_turns_per_s']:g} turns/s, {m['nproc']} CPUs{state}"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
    bars = ax.bar(labels, values, color=colors)
    for bar, value in zip(bars, values, strict=True):
        ax.annotate(f"{value:.2f}/min", (bar.get_x() + bar.get_width() / 2, value), ha="center", va="bottom")
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
        "| conversation | turns | segments (expected) | enriched | failed | gists | facts |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {c['conversation_id'].removeprefix(w['tenant'] + '-')} | {c['turns']} | "
            f"{c['segments']} ({c['expected_segments']}) | {c['enriched']} | {c['failed']} | {c['gists']} | {c['facts']} |"
            for c in conv
        ),
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
    notes = []
    restarts = result.get("worker_restarts") or {}
    if len(restarts.get("pids", [])) > 1 or restarts.get("counter_resets"):
        changed = {k: v for k, v in restarts["settings_at_end"].items() if result["worker_settings"].get(k) != v}
        notes.append(f"The ingest worker was restarted during the run (pids {restarts['pids']}); settings that "
                     f"changed: {changed or 'none'}. Figures mix both workers.")
    if result["lacking"]:
        so_far = "" if result["outcome"]["complete"] else " so far (the run was stopped before they were reached)"
        notes.append(f"Conversations lacking output{so_far}: " + "; ".join(
            f"{x['conversation_id']} (no {', '.join(x['missing'])})" for x in result["lacking"]) + ".")
    if result["failures"]:
        notes.append("Failed segments by error: " + "; ".join(
            f"{cls} x{v['segments']} ({v['example'][:120]})" for cls, v in result["failures"].items()) + ".")
    if result["neighbours"]["other_tenants_segments_in_window"]:
        notes.append(f"Other tenants used the same worker meanwhile: {result['neighbours']['other_tenants_segments_in_window']} "
                     "(their calls are in the counters too).")
    cpu = result["cpu"]
    notes.append(f"CPU-seconds over the run ({cpu['wall_s'] / 60:.1f} min x {cpu['cores']} cores = "
                 f"{cpu['wall_s'] * cpu['cores']:.0f} available, {cpu['machine_busy_cpu_s']:.0f} used): " + ", ".join(
                     f"{p['process']} {p['cpu_s']:.0f}" for p in cpu["top_processes"][:5])
                 + f", processes that exited meanwhile {cpu['exited_or_unattributed_cpu_s']:.0f}.")
    if direct_busy := [
        name for name in ("first_call", "repeat_call")
        if ((result["direct_model"] or {}).get(name) or {}).get("other_calls_meanwhile")
    ]:
        notes.append(f"Workers' model calls finished during the direct {' and '.join(direct_busy)}: that call waited "
                     "for the model server, so the model-limit figure is an underestimate.")
    if result.get("model_server_idle_before_direct") is False:
        notes.append("The model server was still busy (other tenants' or abandoned requests) when the direct "
                     "calls were made: the model-limit figures are contended too.")
    direct = result["direct_model"]
    if direct and direct.get("generation_tokens_per_s"):
        notes.append(f"Model speed measured by the direct calls: prompt {direct['prompt_tokens_per_s']} tokens/s, "
                     f"generation {direct['generation_tokens_per_s']} tokens/s.")
    if "projection" in result:
        p = result["projection"]
        notes.append(f"Projection: {p['segments_remaining']} segments left, ~{p['minutes_remaining_at_this_rate']:.0f} min "
                     f"more at this rate; the whole run would take ~{p['projected_total_minutes']:.0f} min and "
                     f"~{p['projected_model_calls']} model calls.")
    return [n + "\n" for n in notes]
