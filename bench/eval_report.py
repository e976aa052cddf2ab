"""The LoCoMo evaluation's aggregates, markdown summary and chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import report
from .eval_metrics import ADVERSARIAL, CATEGORY_NAMES, abstention_stats, mean, percentile

SYSTEM_LABELS = {"epistream": "epistream", "full_context": "full context", "dense_top_k": "dense top-k"}


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def summarise_system(records: list[dict[str, Any]], system: str) -> dict[str, Any] | None:
    """Per category and overall: F1, BLEU-1, abstention, tokens per query, latency."""
    rows = [(r["category"], r["systems"][system]) for r in records if system in r.get("systems", {})]
    if not rows:
        return None

    def block(items: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
        return {
            "n": len(items),
            "f1": _round(mean(s["f1"] for _, s in items)),
            "bleu1": _round(mean(s["bleu1"] for _, s in items)),
            "abstained": sum(1 for _, s in items if s["abstained"]),
            "errors": sum(1 for _, s in items if s.get("error")),
            "cited_evidence_recall": _round(mean(s.get("cited_evidence_recall") for _, s in items)),
            "context_evidence_recall": _round(mean(s.get("context_evidence_recall") for _, s in items)),
        }

    per_category = {str(c): block([(cat, s) for cat, s in rows if cat == c]) for c in sorted({c for c, _ in rows})}
    answerable = [(c, s) for c, s in rows if c != ADVERSARIAL]
    abst = abstention_stats((s["abstained"], c == ADVERSARIAL) for c, s in rows)
    roles: dict[str, dict[str, float]] = {}
    for role in sorted({role for _, s in rows for role in s.get("tokens", {})}):
        used = [s["tokens"].get(role, {}) for _, s in rows]
        roles[role] = {
            "prompt": round(mean(u.get("prompt", 0) for u in used) or 0.0, 1),
            "completion": round(mean(u.get("completion", 0) for u in used) or 0.0, 1),
            "calls": round(mean(u.get("calls", 0) for u in used) or 0.0, 2),
        }
    latencies = [s.get("latency_s") for _, s in rows]
    roundtrips = [s.get("roundtrip_s") for _, s in rows]
    return {
        "per_category": per_category,
        "answerable_1_4": block(answerable) if answerable else None,
        "all": block(rows),
        "abstention": {"precision": _round(abst.precision), "recall": _round(abst.recall),
                       "predicted": abst.predicted, "gold": abst.gold, "true_positive": abst.true_positive},
        "tokens_per_query": roles,
        "tokens_per_query_total": round(sum(r["prompt"] + r["completion"] for r in roles.values()), 1),
        "latency_s": {"mean": _round(mean(latencies), 2), "p50": _round(percentile(latencies, 50), 2),
                      "p95": _round(percentile(latencies, 95), 2)},
        # Through Kafka, send to reply: includes waiting behind the other questions in flight.
        "roundtrip_s": {"p50": _round(percentile(roundtrips, 50), 2), "p95": _round(percentile(roundtrips, 95), 2)},
    }


def _fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def markdown(result: dict[str, Any]) -> str:
    store = result.get("store", {})
    lines = [
        f"LoCoMo evaluation `{result['run_id']}`: {Path(result['dataset']).name}, conversations "
        f"{', '.join(result['conversations'])}; {store.get('turns', '?')} turns, {store.get('segments', '?')} segments "
        f"({store.get('enriched', '?')} enriched, {store.get('failed', '?')} failed); mode `{result['mode']}`, "
        f"model `{result['model']}`."
    ]
    systems = {name: s for name, s in result.get("systems", {}).items() if s}
    if systems:
        lines += ["", f"Answers ({result['questions_asked']} sampled questions; category 5 scores 1 for an "
                      "abstention, 0 otherwise):", "", *_answer_tables(systems, result.get("baseline_k"))]
    requests = result.get("answer_worker_model_requests")
    if requests:
        lines += ["", "Answer worker's model requests while the questions ran (from its /metrics): " + "; ".join(
            f"{role} " + ", ".join(f"{outcome} {count:.0f}" for outcome, count in sorted(outcomes.items()))
            for role, outcomes in sorted(requests.items()) if outcomes) + "."]
    unanswered = result.get("unanswered")
    if unanswered:
        lines += ["", f"Not answered within the timeout: {unanswered} question(s) (scored as abstentions)."]
    for note in result.get("notes", []):
        lines += ["", f"Note: {note}"]
    return "\n".join(lines)


def _answer_tables(systems: dict[str, dict[str, Any]], baseline_k: int | None) -> list[str]:
    names = list(systems)
    label = {n: SYSTEM_LABELS.get(n, n) + (f" (k={baseline_k})" if n == "dense_top_k" else "") for n in names}
    header = ["category", "n", *(f"{label[n]} F1 | BLEU-1" for n in names)]
    categories = sorted({c for n in names for c in systems[n]["per_category"]}, key=int)
    picks = [(f"{c} {CATEGORY_NAMES.get(int(c), '')}", lambda s, c=c: s["per_category"].get(c)) for c in categories]
    picks += [("1-4 overall", lambda s: s["answerable_1_4"]), ("all", lambda s: s["all"])]
    rows = []
    for title, pick in picks:
        blocks = [pick(systems[n]) for n in names]
        row = [title, next((b["n"] for b in blocks if b), 0)]
        row += [f"{_fmt(b['f1'] if b else None)} | {_fmt(b['bleu1'] if b else None)}" for b in blocks]
        rows.append(row)
    costs = []
    for n in names:
        s = systems[n]
        roles = ", ".join(f"{role} {t['prompt']:.0f}+{t['completion']:.0f}"
                          for role, t in s["tokens_per_query"].items() if t["calls"]) or "none"
        calls = sum(t["calls"] for t in s["tokens_per_query"].values())
        costs.append([label[n], _fmt(s["abstention"]["precision"], 2), _fmt(s["abstention"]["recall"], 2),
                      f"{s['all']['abstained']}/{s['all']['n']}", s["all"]["errors"],
                      _fmt(s["all"]["context_evidence_recall"], 2), roles, f"{calls:.1f}",
                      f"{_fmt(s['latency_s']['p50'], 1)} / {_fmt(s['latency_s']['p95'], 1)}"])
    return [report.table(header, rows, "lr" + "rr" * len(names)), "",
            report.table(["system", "abstention precision", "abstention recall (cat 5)", "abstained", "errors",
                          "context holds the evidence", "tokens/query (prompt+completion) by role", "calls/query",
                          "latency p50 / p95 (s)"], costs, "lrrrrrlrr")]


def write_chart(result: dict[str, Any], path: Path) -> None:
    """Token F1 per category and over 1-4, a bar per system."""
    systems = {name: s for name, s in result.get("systems", {}).items() if s}
    fig, ax = report.subplots(figsize=(7.5, 4.8))
    colors = {"epistream": "#d62728", "full_context": "#1f77b4", "dense_top_k": "#2ca02c"}
    if systems:
        categories = sorted({c for s in systems.values() for c in s["per_category"]}, key=int)
        report.grouped_bars(ax, len(categories) + 1, [
            (SYSTEM_LABELS.get(name, name),
             [(s["per_category"].get(c) or {}).get("f1") or 0.0 for c in categories]
             + [(s["answerable_1_4"] or {}).get("f1") or 0.0], colors.get(name))
            for name, s in systems.items()])
        ax.set_xticks(range(len(categories) + 1),
                      [*(f"{c}\n{CATEGORY_NAMES.get(int(c), '')}" for c in categories), "1-4\noverall"])
        ax.set_ylabel("token F1 (cat 5: abstention)")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=8)
        ax.set_title(f"answers, {result.get('questions_asked', 0)} questions, mode {result.get('mode')}")
    else:
        ax.text(0.5, 0.5, "no answers", ha="center")
    fig.suptitle(f"LoCoMo {', '.join(result.get('conversations', []))} — {result.get('model')}", fontsize=10)
    report.save(fig, path)
