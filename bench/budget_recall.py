"""``python -m bench.budget_recall`` (``make eval-budget``): evidence recall at equal token budgets.

For every LoCoMo question with evidence (categories 1-4) of the chosen split, every system's ranked
context is cut at 250/500/1,000/2,000/4,000 tokens (bench/budget_systems.py) and scored: the share of
evidence turns present verbatim (the primary figure) and, labelled apart, also crediting the source
turns of gists and facts.

Systems: four in process over the dataset's turns (BM25, MiniLM over the bare text, MiniLM over
``[session date] speaker: text``, their RRF), and, unless ``--offline``, those over the memory stored
by the ingest worker's own code in a database of the run's own on the embedded PostgreSQL (the context
read and its ablations, fused and dense turn search, the deep-mode router and reading windows, the fused
search's own top_k turns). Splits: choices are tuned on ``pick`` and reported on ``report`` (issue 12);
``all`` is both. Writes JSON and a PNG (summaries, chart and markdown below), prints markdown tables.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from collections.abc import Iterable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from epistream.client.sources import LocomoSample, load_locomo
from epistream.settings.processes import Settings
from epistream.testing.datasets import locomo_dev

from . import report
from .budget_systems import (
    BUDGETS,
    ContextRead,
    DeepWindows,
    DiskCachedEmbed,
    MemoEmbedder,
    OfflineTurns,
    Query,
    RouterSegments,
    StoredTurns,
    System,
    build_conversations,
    context_tokens,
    cut,
    dated_text,
    recall_with_sources,
    verbatim_recall,
    where_missed,
)
from .eval_metrics import ADVERSARIAL, CATEGORY_NAMES, mean
from .stack import up

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results" / "budget-recall.json"
# Issue 12's split of the dev conversations: choices are picked on the first, figures reported on the second.
SPLITS = {"pick": ("conv-26", "conv-30", "conv-41"), "report": ("conv-42", "conv-43")}
TENANT = "budget-eval"
#: The ranker trained with the self-statement features too (issue 41 item 3's ablation).
SELF_RANKER = ROOT / "bench" / "results" / "context-ranker-self.json"


def split_samples(samples: list[LocomoSample], split: str) -> list[LocomoSample]:
    """The split's conversations; an id the file lacks is an error, not a silently smaller split."""
    return chosen(samples, [c for name in SPLITS for c in SPLITS[name]] if split == "all" else list(SPLITS[split]),
                  f"split {split!r}")


def chosen(samples: list[LocomoSample], wanted: list[str], what: str) -> list[LocomoSample]:
    """The samples of the ``wanted`` conversation ids, in the file's order; one the file lacks is an error."""
    present = {s.sample_id for s in samples}
    missing = [c for c in wanted if c not in present]
    if missing:
        raise SystemExit(f"{what}: conversations {missing} are not in the file (it has {sorted(present)})")
    return [s for s in samples if s.sample_id in wanted]


def queries_of(samples: list[LocomoSample], vectors) -> list[Query]:  # type: ignore[no-untyped-def]
    """Every non-adversarial question with evidence, with its embedding (in the order of ``questions_with_evidence``)."""
    out = []
    for sample, number, qa in questions_with_evidence(samples):
        asked_at = max(t.ts for t in sample.turns) + timedelta(days=1)
        out.append(Query(key=f"{sample.sample_id}#{number}", sample_id=sample.sample_id,
                         conversation_id=sample.conversation_id, question=qa.question, category=qa.category,
                         evidence=tuple(qa.evidence), asked_at=asked_at, vector=vectors[len(out)]))
    return out


def questions_with_evidence(samples: list[LocomoSample]):  # type: ignore[no-untyped-def]
    for sample in samples:
        for number, qa in enumerate(sample.qa):
            if qa.category != ADVERSARIAL and qa.evidence:
                yield sample, number, qa


def embedded(settings: Settings, samples: list[LocomoSample]):  # type: ignore[no-untyped-def]
    """The project's embedder, the conversations with their embeddings and the questions with theirs (kept
    on disk under the state directory: a rerun does not embed again)."""
    from epistream.models.embeddings import Embedder

    embedder = Embedder.from_settings(settings)
    model_key = f"{embedder.name}:{settings.embedding_model_path}:{settings.embedding_max_tokens}"
    embed = DiskCachedEmbed(embedder.embed, settings.state_dir / "cache", model_key)
    embed_questions = DiskCachedEmbed(lambda texts: embedder.embed(texts, kind="query"), settings.state_dir / "cache",
                                      f"{model_key}:query")
    conversations = build_conversations({s.conversation_id: s.turns for s in samples}, embed)
    questions = [qa.question for _, _, qa in questions_with_evidence(samples)]
    return embedder, conversations, queries_of(samples, embed_questions(questions))


async def stored(settings: Settings, samples: list[LocomoSample], conversations):  # type: ignore[no-untyped-def]
    """A database of the run's own with the samples' turns stored by the ingest worker's code, unenriched."""
    from .budget_systems import CachedEmbedder, Memory

    memory = await Memory.create(settings, TENANT)
    turns = [t for s in samples for t in s.turns]
    # memory.turns embeds the dated text (epistream.models.embeddings.turn_embedding_text), as dense_dated does.
    cached = CachedEmbedder([dated_text(t) for t in turns], [v for c in conversations.values() for v in c.dated])
    await memory.store(turns, cached)
    return memory


async def score(systems: list[System], queries: list[Query], budgets: tuple[int, ...] = BUDGETS
                ) -> list[dict[str, Any]]:
    """Per question, per system, per budget: verbatim recall, recall with sources, tokens used."""
    records = []
    for query in queries:
        record: dict[str, Any] = {"key": query.key, "sample_id": query.sample_id, "category": query.category,
                                  "evidence": list(query.evidence), "recall": {}, "recall_with_sources": {},
                                  "tokens": {}}
        for system in systems:
            ranked = None if system.budget_aware else await system.pieces(query, max(budgets))
            for figure in ("recall", "recall_with_sources", "tokens"):
                record[figure].setdefault(system.name, {})
            for budget in budgets:
                context = cut(await system.pieces(query, budget) if ranked is None else ranked, budget)
                record["recall"][system.name][str(budget)] = verbatim_recall(query.evidence, context)
                record["recall_with_sources"][system.name][str(budget)] = recall_with_sources(query.evidence, context)
                record["tokens"][system.name][str(budget)] = context_tokens(context)
                if isinstance(system, ContextRead) and system.explain_misses:
                    # The second read only where there is something to place: most contexts hold it all.
                    complete = record["recall"][system.name][str(budget)] == 1.0
                    gathered = [] if complete else await system.gathered_turns(query, budget)
                    record.setdefault("where_missed", {}).setdefault(system.name, {})[str(budget)] = where_missed(
                        query.evidence, context, gathered)
        records.append(record)
    return records


async def run(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    tenant = args.enriched or TENANT
    # bench.locomo_eval stores a file's conversations under ids prefixed with its tenant.
    prefix = f"{tenant}-" if args.enriched else ""
    loaded = load_locomo(args.path, tenant=tenant, conversation_prefix=prefix)
    samples = (split_samples(loaded, args.split) if args.conversations is None
               else chosen(loaded, [c.strip() for c in args.conversations.split(",") if c.strip()], "--conversations"))
    timings: dict[str, float] = {}
    started = time.perf_counter()
    embedder, conversations, queries = embedded(settings, samples)
    timings["embed_s"] = round(time.perf_counter() - started, 1)
    print(f"{len(queries)} questions with evidence over {sum(len(s.turns) for s in samples)} turns of "
          f"{len(samples)} conversations ({timings['embed_s']}s to embed)", flush=True)
    systems: list[System] = [OfflineTurns(name, conversations) for name in
                             ("bm25", "dense_bare", "dense_dated", "rrf_bm25_dense_dated")]
    memory = None
    result: dict[str, Any] = {"dataset": str(Path(args.path).resolve()), "split": args.split,
                              "splits": {k: list(v) for k, v in SPLITS.items()},
                              "conversations": [s.sample_id for s in samples], "budgets": list(BUDGETS),
                              "token_estimate": "epistream.pipeline.segmenter.estimate_tokens(f'{speaker}: {text}')"}
    try:
        if not args.offline:
            from epistream.consumers.retrieval import from_settings

            from .budget_systems import Memory

            started = time.perf_counter()
            turns = [t for s in samples for t in s.turns]
            if args.enriched:
                memory = await Memory.attach(settings, tenant)
            else:
                memory = await stored(settings, samples, conversations)
            result["store"] = {table: await memory.count(table) for table in ("turns", "segments", "gists", "facts")}
            result["enriched"] = args.enriched
            timings["store_s"] = round(time.perf_counter() - started, 1)
            print(f"stored {result['store']} in database {memory.name} ({timings['store_s']}s)", flush=True)
            recipes = from_settings(settings)
            by_id = {(t.conversation_id, t.turn_id): t for t in turns}
            systems += stored_systems(memory, recipes, by_id, embedder, enriched=bool(args.enriched))
        systems = only(systems, args.systems)
        # The harness's own objects (every turn's words for the in-process baselines, the embeddings) are
        # no read's: frozen, the collector stops walking them during the timed reads (a worker holds none).
        gc.collect()
        gc.freeze()
        started = time.perf_counter()
        records = await score(systems, queries)
        timings["score_s"] = round(time.perf_counter() - started, 1)
        result["context_latency_ms"] = {s.name: latency_summary(s.latencies_ms) for s in systems
                                        if isinstance(s, ContextRead)}
    finally:
        if memory is not None and (not args.keep or args.enriched):
            await memory.drop()  # an attached memory's pool only: its database is the stack's
    names = [s.name for s in systems]
    present = {r["sample_id"] for r in records}
    result["by_split"] = {
        split: summarise([r for r in records if r["sample_id"] in ids], names, BUDGETS)
        for split, ids in (("pick", SPLITS["pick"]), ("report", SPLITS["report"]),
                           ("all", SPLITS["pick"] + SPLITS["report"]))
        if present & set(ids)}
    headline = result["by_split"]["all" if "all" in result["by_split"] else next(iter(result["by_split"]))]
    for figure in FIGURES:
        result[f"{figure}_at_budget"] = headline[f"{figure}_at_budget"]
        result[f"{figure}_at_budget_by_category"] = headline[f"{figure}_at_budget_by_category"]
    result["timings"] = timings
    result["questions"] = [kept_per_question(r) for r in records]
    return result


def only(systems: list[System], names: str | None) -> list[System]:
    """``systems`` restricted to ``names`` (comma-separated; None: all), in their own order; an unknown name is refused."""
    if names is None:
        return systems
    wanted = {n.strip() for n in names.split(",") if n.strip()}
    unknown = wanted - {s.name for s in systems}
    if unknown:
        sys.exit(f"--systems: no system named {', '.join(sorted(unknown))} (known: {', '.join(s.name for s in systems)})")
    return [s for s in systems if s.name in wanted]


def kept_per_question(record: dict[str, Any]) -> dict[str, Any]:
    """What the JSON keeps of a question (the summaries hold the means of the rest): its ids and
    verbatim recall per system and budget."""
    return {k: record[k] for k in ("key", "sample_id", "category", "evidence", "recall")}


def stored_systems(memory, recipes, turns_by_id, embedder, *,  # type: ignore[no-untyped-def]
                   enriched: bool = False) -> list[System]:
    """The systems over the stored memory: the context read and its ablations (no ranker; with the coverage
    step, off by default; no neighbour turns; no speaker matching; rrf_k 60), fused and dense turn search, the deep-mode router, deep mode's reading
    windows and the fused search's own top_k turns. (The ts_rank_cd and 'english' re-stemming ablations
    left with their switches: docs/experiments.md.) Over an enriched memory, also the read without each
    of what enrichment adds (gists, facts, the gists' source turns), with none of it, with gists and
    facts ranked by their own score among the turns (the default ranks them after), and with the source turns of the best facts (entity links)."""
    from epistream.consumers.retrieval import Coverage, LinearRanker, Neighbours, Sources, Structured

    memo = MemoEmbedder(embedder)
    no_speakers = replace(recipes, turns=replace(recipes.turns, speaker_bonus=0.0))
    rrf_60 = replace(recipes, turns=replace(recipes.turns, rrf_k=60))
    read = recipes.context
    tried = Coverage(length_power=0.25, rank_k=5.0)  # the coverage step's best setting on pick (consumers/coverage.py)
    no_sources = replace(read, sources=Sources(gists=0))
    enrichment = [
        ContextRead(memory, recipes, memo, name="context_no_gists",
                    read=replace(read, structured=Structured(gists=False))),
        ContextRead(memory, recipes, memo, name="context_no_facts",
                    read=replace(read, structured=Structured(facts=False))),
        ContextRead(memory, recipes, memo, name="context_no_sources", read=no_sources),
        ContextRead(memory, recipes, memo, name="context_turns_only",
                    read=replace(no_sources, structured=Structured(gists=False, facts=False))),
        ContextRead(memory, recipes, memo, name="context_structured_by_score",
                    read=replace(read, structured=Structured(weight=1.0))),
        ContextRead(memory, recipes, memo, name="context_fact_sources", read=replace(read, sources=Sources(facts=5))),
    ] if enriched else []
    rankers = [ContextRead(memory, recipes, memo, name="context_no_ranker", read=replace(read, ranker=None)),
               ContextRead(memory, recipes, memo, name="context_depth_linear", read=replace(read, depth_exponent=1.0)),
               # Issue 41 item 2: the best coverage step on pick (relevance per token), off by default: it did not
               # help multi-hop on report (docs/benchmarks/budget-recall.md).
               ContextRead(memory, recipes, memo, name="context_coverage", read=replace(read, coverage=tried))]
    if SELF_RANKER.exists():  # python -m bench.train_ranker --without '' --out bench/results/context-ranker-self.json
        rankers.append(ContextRead(memory, recipes, memo, name="context_ranker_self",
                                   read=replace(read, ranker=LinearRanker.load(SELF_RANKER))))
    return [ContextRead(memory, recipes, memo, explain_misses=True), *rankers, *enrichment,
            ContextRead(memory, recipes, memo, name="context_no_neighbours",
                        read=replace(read, neighbours=Neighbours(seeds=0))),
            ContextRead(memory, no_speakers, memo, name="context_no_speakers"),
            ContextRead(memory, rrf_60, memo, name="context_rrf_k_60"),
            StoredTurns("fused_turns", memory, recipes), StoredTurns("dense_turns", memory, recipes, dense_only=True),
            RouterSegments(memory, recipes, turns_by_id), DeepWindows(memory, recipes, memo),
            StoredTurns("top_k_turns", memory, recipes, recipe_top_k=True)]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.budget_recall", description=__doc__.split("\n\n")[0])
    p.add_argument("path", nargs="?", type=Path, default=locomo_dev(),
                   help="a LoCoMo-format JSON file (default: $LOCOMO_DEV, else the shared development split)")
    p.add_argument("--split", choices=("pick", "report", "all"), default="all")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results (a directory: budget-recall.json in it)")
    p.add_argument("--conversations", help="only these conversations (comma-separated ids), instead of --split's")
    p.add_argument("--offline", action="store_true", help="only the in-process baselines (no PostgreSQL)")
    p.add_argument("--keep", action="store_true", help="keep the run's database")
    p.add_argument("--enriched", metavar="TENANT",
                   help="read the memory bench.locomo_eval stored and enriched under TENANT on the running stack "
                        "(its --keep) instead of storing the turns unenriched; adds the enrichment ablations")
    p.add_argument("--no-up", action="store_true", help="do not start the embedded PostgreSQL")
    p.add_argument("--systems", help="score only these systems (comma-separated names, e.g. context,context_no_ranker: "
                                     "a quicker run, or a latency measurement without the other reads beside it)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = Settings()
    if not args.path.exists():
        sys.exit(f"{args.path}: no such file")
    if not args.offline and not args.no_up:
        up(settings, only={"postgres"})
    started = time.perf_counter()
    result = asyncio.run(run(args, settings))
    result["timings"]["total_s"] = round(time.perf_counter() - started, 1)
    result["machine"] = report.machine_info(ROOT)
    out = args.out / DEFAULT_OUT.name if args.out.is_dir() or not args.out.suffix else args.out
    report.write_json(out, result)
    chart = out.with_suffix(".png")
    write_chart(chart, result)
    print(f"\nwrote {out} and {chart}\n")
    print(markdown(result))
    return 0


# --- summaries, markdown and chart (pure, apart from writing the PNG) -----------------------------

FIGURES = ("recall", "recall_with_sources", "tokens")


def summarise(records: list[dict[str, Any]], systems: Iterable[str], budgets: Iterable[int]) -> dict[str, Any]:
    """Means over questions: overall and per category, keyed system -> budget (as a string)."""
    systems, budgets = list(systems), [str(b) for b in budgets]
    out: dict[str, Any] = {"questions": len(records)}
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
    explained = sorted({s for r in records for s in r.get("where_missed", {})})
    if explained:
        out["missed_evidence"] = {s: {b: missed_evidence(records, s, b) for b in budgets} for s in explained}
    return out


def missed_evidence(records: list[dict[str, Any]], system: str, budget: str) -> dict[str, dict[str, Any]]:
    """Why ``system``'s context at ``budget`` lacks evidence, per category (and ``all``), counted in evidence
    turns: held verbatim, gathered by the read but ranked below what fitted, or never gathered; the
    median place of the gathered-but-missed among the gathered turns, and the median turns a context held."""
    out: dict[str, dict[str, Any]] = {}
    for category in ["all", *sorted({str(r["category"]) for r in records})]:
        placed = [(r, r["where_missed"][system][budget]) for r in records
                  if category in ("all", str(r["category"])) and budget in r.get("where_missed", {}).get(system, {})]
        places = [p for _, w in placed for p in w["missed"].values()]
        evidence = sum(len(r["evidence"]) for r, _ in placed)
        below = [p for p in places if p is not None]
        out[category] = {"evidence_turns": evidence, "in_context": evidence - len(places),
                         "gathered_ranked_below": len(below), "not_gathered": len(places) - len(below),
                         "place_of_ranked_below_p50": statistics.median_high(below) if below else None,
                         "turns_in_context_p50": statistics.median_high(w["turns_in_context"] for _, w in placed)
                         if placed else None}
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


def latency_summary(latencies_ms: dict[int, list[float]]) -> dict[str, dict[str, float]]:
    """Per budget, the median and p95 of the read's own latency (one read per question; the questions one
    after another, so on a quiet machine this is the read alone)."""
    return {str(budget): {"p50": round(float(np.percentile(values, 50)), 1),
                          "p95": round(float(np.percentile(values, 95)), 1), "reads": len(values)}
            for budget, values in sorted(latencies_ms.items()) if values}


def markdown(result: dict[str, Any]) -> str:
    parts = [f"Evidence recall at equal token budgets (tokens = ceil(chars/4) of `speaker: text`); "
             f"conversations {', '.join(result['conversations'])}"]
    for split, summary in result["by_split"].items():
        parts.append(table(summary, "recall", f"{split}: verbatim evidence recall"))
        parts.append(category_table(summary, "1000"))
        for system, per_budget in summary.get("missed_evidence", {}).items():
            parts.append(missed_table(per_budget["1000"], f"{split}: where {system}'s missing evidence was, 1000 tokens"))
    last = next(reversed(result["by_split"].values()))
    parts.append(table(last, "tokens", "tokens in the cut context (mean)"))
    parts.append(table(last, "recall_with_sources", "recall also crediting gist/fact source turns"))
    if result.get("context_latency_ms"):
        budgets = sorted({b for per in result["context_latency_ms"].values() for b in per}, key=int)
        rows = ["| read latency ms, p50 / p95 | " + " | ".join(budgets) + " |", "|---|" + "---:|" * len(budgets)]
        rows += [f"| {name} | " + " | ".join(f"{per[b]['p50']} / {per[b]['p95']}" if b in per else "" for b in budgets)
                 + " |" for name, per in result["context_latency_ms"].items()]
        parts.append("\n".join(rows))
    return "\n\n".join(parts)


def missed_table(per_category: dict[str, dict[str, Any]], title: str) -> str:
    rows = [f"**{title}**", "", "| category | evidence turns | in context | gathered, ranked below (place p50) "
            "| not gathered | turns in context p50 |", "|---|---:|---:|---:|---:|---:|"]
    for category, m in per_category.items():
        name = CATEGORY_NAMES.get(int(category), category) if category.isdigit() else category
        rows.append(f"| {name} | {m['evidence_turns']} | {m['in_context']} | {m['gathered_ranked_below']} "
                    f"({m['place_of_ranked_below_p50'] or '-'}) | {m['not_gathered']} | {m['turns_in_context_p50']} |")
    return "\n".join(rows)


def write_chart(path: Path, result: dict[str, Any]) -> None:
    """Recall vs budget, one line per system, a panel per split."""
    from matplotlib.ticker import NullFormatter

    splits = list(result["by_split"])
    fig, axes = report.subplots(1, len(splits), figsize=(5.5 * len(splits), 4.5), squeeze=False, sharey=True)
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
    report.save(fig, path)


if __name__ == "__main__":
    sys.exit(main())
