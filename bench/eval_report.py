"""The LoCoMo evaluation's aggregates, markdown summary and chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import report
from .eval_metrics import ADVERSARIAL, CATEGORY_NAMES, abstention_stats, mean, percentile

SYSTEM_LABELS = {"epistream": "epistream", "full_context": "full context", "dense_top_k": "dense top-k"}
RECALL_LABELS = {
    "summary": "summary only",
    "dense": "dense only",
    "lexical": "lexical only",
    "fused_minmax": "fused (minmax)",
    "fused_rrf": "fused (rrf)",
    "dense_turns": "dense turns (k turns)",
}


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def summarise_system(records: list[dict[str, Any]], system: str) -> dict[str, Any] | None:
    """Per category and overall: F1, BLEU-1, judge accuracy, abstention, tokens per query, latency."""
    rows = [(r["category"], r["systems"][system]) for r in records if system in r.get("systems", {})]
    if not rows:
        return None

    def block(items: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
        judged = [s["judge"] for _, s in items if s.get("judge") is not None]
        return {
            "n": len(items),
            "f1": _round(mean(s["f1"] for _, s in items)),
            "bleu1": _round(mean(s["bleu1"] for _, s in items)),
            "judge_accuracy": _round(sum(judged) / len(judged)) if judged else None,
            "judged": len(judged),
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


def summarise_recall(per_question: list[dict[str, Any]], ks: list[int]) -> dict[str, Any]:
    """Mean recall@k (and turns covered) per router configuration, overall and per category."""
    configs = [c for c in RECALL_LABELS if any(c in q["recall"] for q in per_question)]
    overall: dict[str, dict[str, Any]] = {}
    per_category: dict[str, dict[str, dict[str, Any]]] = {}
    for config in configs:
        overall[config] = {
            "recall": {str(k): _round(mean(q["recall"][config][str(k)] for q in per_question)) for k in ks},
            "recall_with_forced": {str(k): _round(mean(q.get("recall_with_forced", {}).get(config, {}).get(str(k))
                                                       for q in per_question)) for k in ks},
            "turns": {str(k): _round(mean(q["turns"][config][str(k)] for q in per_question), 1) for k in ks},
            "segments": {str(k): _round(mean(q.get("segments", {}).get(config, {}).get(str(k))
                                             for q in per_question), 2) for k in ks},
        }
        for category in sorted({q["category"] for q in per_question}):
            chosen = [q for q in per_question if q["category"] == category]
            per_category.setdefault(str(category), {})[config] = {
                str(k): _round(mean(q["recall"][config][str(k)] for q in chosen)) for k in ks}
    return {
        "questions": len(per_question),
        "questions_per_category": {str(c): sum(1 for q in per_question if q["category"] == c)
                                   for c in sorted({q["category"] for q in per_question})},
        "k": ks,
        "overall": overall,
        "per_category": per_category,
    }


def segment_recall(result: dict[str, Any]) -> dict[str, Any] | None:
    """The router's recall@k segments (results before issue 12 named it ``router_recall``)."""
    return result.get("router_recall_at_k_segments") or result.get("router_recall")


def _fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def markdown(result: dict[str, Any]) -> str:
    store = result.get("store", {})
    lines = [
        f"LoCoMo evaluation `{result['run_id']}`: {Path(result['dataset']).name}, conversations "
        f"{', '.join(result['conversations'])}; {store.get('turns', '?')} turns, {store.get('segments', '?')} segments "
        f"({store.get('enriched', '?')} enriched, {store.get('failed', '?')} failed, "
        f"{store.get('unsegmented_turns', '?')} turns still unsegmented); mode `{result['mode']}`, "
        f"model `{result['model']}`."
    ]
    recall = segment_recall(result)
    if recall and recall.get("questions"):
        lines += ["", *_recall_tables(recall)]
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
    if result.get("recall_at_budget"):
        from .budget_recall import table

        lines += ["", table({"questions": result["recall_at_budget_questions"],
                             "recall_at_budget": result["recall_at_budget"]},
                            title="Evidence recall at equal token budgets (verbatim turns)")]
    for note in result.get("notes", []):
        lines += ["", f"Note: {note}"]
    return "\n".join(lines)


def _recall_tables(recall: dict[str, Any]) -> list[str]:
    ks, by_category = recall["k"], recall["per_category"]
    overall = report.table(
        ["pathway", *(f"R@{k}" for k in ks), *(f"turns@{k}" for k in ks)],
        ([RECALL_LABELS[config], *(_fmt(figures["recall"][str(k)]) for k in ks),
          *(_fmt(figures["turns"][str(k)], 1) for k in ks)] for config, figures in recall["overall"].items()))
    k_mid = str(ks[len(ks) // 2])
    per_category = report.table(
        ["pathway", *(f"{c} {CATEGORY_NAMES.get(int(c), '')} (n={recall['questions_per_category'][c]})"
                      for c in by_category)],
        ([RECALL_LABELS[config], *(_fmt(by_category[c][config][k_mid]) for c in by_category)]
         for config in recall["overall"]))
    return [f"Router evidence recall@k segments ({recall['questions']} questions with evidence; k counts segments, "
            "dense turns count turns; turns = mean turns the k items hold):", "", overall, "",
            f"Recall@{k_mid} per category:", "", per_category]


def _answer_tables(systems: dict[str, dict[str, Any]], baseline_k: int | None) -> list[str]:
    names = list(systems)
    label = {n: SYSTEM_LABELS.get(n, n) + (f" (k={baseline_k})" if n == "dense_top_k" else "") for n in names}
    judge = any(systems[n]["all"]["judged"] for n in names)
    header = ["category", "n", *(f"{label[n]} F1 | BLEU-1" for n in names),
              *(f"{label[n]} judge" for n in names if judge)]
    categories = sorted({c for n in names for c in systems[n]["per_category"]}, key=int)
    picks = [(f"{c} {CATEGORY_NAMES.get(int(c), '')}", lambda s, c=c: s["per_category"].get(c)) for c in categories]
    picks += [("1-4 overall", lambda s: s["answerable_1_4"]), ("all", lambda s: s["all"])]
    rows = []
    for title, pick in picks:
        blocks = [pick(systems[n]) for n in names]
        row = [title, next((b["n"] for b in blocks if b), 0)]
        row += [f"{_fmt(b['f1'] if b else None)} | {_fmt(b['bleu1'] if b else None)}" for b in blocks]
        row += [_fmt(b["judge_accuracy"] if b else None) for b in blocks] if judge else []
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
    return [report.table(header, rows, "lr" + "rr" * len(names) + "r" * len(names) * judge), "",
            report.table(["system", "abstention precision", "abstention recall (cat 5)", "abstained", "errors",
                          "context holds the evidence", "tokens/query (prompt+completion) by role", "calls/query",
                          "latency p50 / p95 (s)"], costs, "lrrrrrlrr")]


def write_chart(result: dict[str, Any], path: Path) -> None:
    systems = {name: s for name, s in result.get("systems", {}).items() if s}
    recall = segment_recall(result) or {}
    fig, (left, right) = report.subplots(1, 2, figsize=(13, 4.8))
    colors = {"epistream": "#d62728", "full_context": "#1f77b4", "dense_top_k": "#2ca02c"}
    if systems:
        categories = sorted({c for s in systems.values() for c in s["per_category"]}, key=int)
        report.grouped_bars(left, len(categories) + 1, [
            (SYSTEM_LABELS.get(name, name),
             [(s["per_category"].get(c) or {}).get("f1") or 0.0 for c in categories]
             + [(s["answerable_1_4"] or {}).get("f1") or 0.0], colors.get(name))
            for name, s in systems.items()])
        left.set_xticks(range(len(categories) + 1),
                        [*(f"{c}\n{CATEGORY_NAMES.get(int(c), '')}" for c in categories), "1-4\noverall"])
        left.set_ylabel("token F1 (cat 5: abstention)")
        left.set_ylim(0, 1)
        left.legend(fontsize=8)
        left.set_title(f"answers, {result.get('questions_asked', 0)} questions, mode {result.get('mode')}")
    else:
        left.text(0.5, 0.5, "no answers", ha="center")
    if recall.get("overall"):
        configs = list(recall["overall"])
        report.grouped_bars(right, len(configs), [
            (f"@{k}", [recall["overall"][c]["recall"][str(k)] or 0.0 for c in configs], None) for k in recall["k"]])
        right.set_xticks(range(len(configs)), [RECALL_LABELS[c].replace(" (", "\n(") for c in configs], fontsize=8)
        right.set_ylim(0, 1)
        right.set_ylabel("turn-level evidence recall")
        right.legend(fontsize=8)
        right.set_title(f"router recall@k, {recall['questions']} questions")
    else:
        right.text(0.5, 0.5, "no recall", ha="center")
    fig.suptitle(f"LoCoMo {', '.join(result.get('conversations', []))} — {result.get('model')}", fontsize=10)
    report.save(fig, path)
