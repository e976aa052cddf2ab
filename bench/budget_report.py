"""Summaries, chart and markdown of the equal-budget recall eval (pure, apart from writing the PNG)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .eval_metrics import CATEGORY_NAMES, mean

FIGURES = ("recall", "recall_with_sources", "tokens")


def summarise(records: list[dict[str, Any]], systems: Iterable[str], budgets: Iterable[int],
              piece_counts: Iterable[int] = ()) -> dict[str, Any]:
    """Means over questions: overall and per category, keyed system -> budget (as a string); and
    recall of the first k pieces for the rankings (``recall_at_pieces``, k counts pieces)."""
    systems, budgets = list(systems), [str(b) for b in budgets]
    out: dict[str, Any] = {"questions": len(records)}
    out["recall_at_pieces"] = {
        s: {str(k): _mean(records, "recall_at_pieces", s, str(k)) for k in piece_counts}
        for s in systems if any(s in r.get("recall_at_pieces", {}) for r in records)}
    for figure in FIGURES:
        out[f"{figure}_at_budget"] = {
            s: {b: _mean(records, figure, s, b) for b in budgets} for s in systems}
        categories = sorted({r["category"] for r in records})
        out[f"{figure}_at_budget_by_category"] = {
            s: {str(c): {b: _mean([r for r in records if r["category"] == c], figure, s, b) for b in budgets}
                for c in categories}
            for s in systems}
    out["questions_by_category"] = {str(c): sum(1 for r in records if r["category"] == c)
                                    for c in sorted({r["category"] for r in records})}
    return out


def _mean(records: list[dict[str, Any]], figure: str, system: str, budget: str) -> float | None:
    value = mean(r[figure][system][budget] for r in records if system in r[figure])
    return None if value is None else round(value, 3)


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def table(summary: dict[str, Any], figure: str = "recall", title: str = "") -> str:
    """One markdown table: a row per system, a column per budget."""
    rows = summary[f"{figure}_at_budget"]
    budgets = list(next(iter(rows.values())).keys()) if rows else []
    lines = [f"**{title}** ({summary['questions']} questions)" if title else "",
             "| system | " + " | ".join(f"{int(b):,}" for b in budgets) + " |",
             "|---|" + "---:|" * len(budgets)]
    for system, values in rows.items():
        lines.append(f"| {system} | " + " | ".join(_cell(values[b]) for b in budgets) + " |")
    return "\n".join(line for line in lines if line)


def category_table(summary: dict[str, Any], budget: str, figure: str = "recall") -> str:
    """Per category at one budget: a row per system."""
    rows = summary[f"{figure}_at_budget_by_category"]
    categories = list(summary["questions_by_category"])
    head = " | ".join(f"{c} {CATEGORY_NAMES.get(int(c), '')} ({summary['questions_by_category'][c]})"
                      for c in categories)
    lines = [f"| system @ {int(budget):,} tokens | {head} |", "|---|" + "---:|" * len(categories)]
    for system, by_category in rows.items():
        lines.append(f"| {system} | " + " | ".join(_cell(by_category[c][budget]) for c in categories) + " |")
    return "\n".join(lines)


def markdown(result: dict[str, Any]) -> str:
    parts = [f"Evidence recall at equal token budgets (tokens = ceil(chars/4) of `speaker: text`); "
             f"conversations {', '.join(result['conversations'])}"]
    for split, summary in result["by_split"].items():
        parts.append(table(summary, "recall", f"{split}: verbatim evidence recall"))
        parts.append(category_table(summary, "1000"))
    last = next(reversed(result["by_split"].values()))
    parts.append(table(last, "tokens", "tokens in the cut context (mean)"))
    parts.append(table(last, "recall_with_sources", "recall also crediting gist/fact source turns"))
    parts.append(table({"questions": last["questions"], "pieces_at_budget": last["recall_at_pieces"]}, "pieces",
                       "recall of the first k pieces (k counts turns, not tokens; the old figures' unit)"))
    return "\n\n".join(parts)


def write_chart(path: Path, result: dict[str, Any]) -> None:
    """Recall vs budget, one line per system, a panel per split."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    splits = list(result["by_split"])
    fig, axes = plt.subplots(1, len(splits), figsize=(5.5 * len(splits), 4.5), squeeze=False, sharey=True)
    for ax, split in zip(axes[0], splits, strict=True):
        summary = result["by_split"][split]
        for system, values in summary["recall_at_budget"].items():
            xs = [int(b) for b, v in values.items() if v is not None]
            # Dashed: lines expected to lie on another (ablations; the SQL twin of an offline ranking).
            dashed = system.endswith("_simple") or system == "dense_turns"
            ax.plot(xs, [values[str(x)] for x in xs], marker="o", label=system, linestyle="--" if dashed else "-")
        ax.set_xscale("log")
        ax.set_xticks([int(b) for b in result["budgets"]], [str(b) for b in result["budgets"]])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("token budget")
        ax.set_title(f"{split} ({summary['questions']} questions)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("evidence recall (verbatim)")
    axes[0][-1].legend(fontsize=7, loc="lower right", ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
