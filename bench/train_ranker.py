"""``python -m bench.train_ranker``: trains the context read's learned ranker (consumers/ranking.py) and
writes the file the package ships (epistream/data/context-ranker-v1.json), byte for byte the same
on a rerun.

On the pick split only (bench.budget_recall.SPLITS["pick"]): its conversations are stored unenriched in a
database of the run's own on the embedded PostgreSQL, as bench.budget_recall stores them; every question
with evidence (categories 1-4) is read at each of ``--budgets``, and each deduplicated candidate the read
gathered becomes a row of the read's own features (consumers.ranking.features), labelled 1 when it is one
of the question's evidence turns. A logistic regression (scikit-learn, L2, lbfgs: deterministic) over
the standardised rows gives the weights; floats are rounded and keys sorted, so the file is the same
on every run over the same candidates. Print the sha256 to put in epistream/settings/ranker_cards.py.

Why a logistic regression: about 600 evidence turns among some 150,000 candidate rows are few labels for
trees to learn interactions from without overfitting three conversations; its weights are 2 x 26 numbers
a reader can check, applied in microseconds in numpy (the read's latency goal) with no library.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from epistream.client.sources import load_locomo
from epistream.consumers.context import gather
from epistream.consumers.ranking import features
from epistream.consumers.retrieval import FEATURES
from epistream.consumers.timefilter import QuestionTime
from epistream.contracts.questions import Mode, Question
from epistream.settings.processes import Settings
from epistream.settings.ranker_cards import BUILTIN
from epistream.testing.datasets import locomo_dev

from . import report

ROOT = Path(__file__).resolve().parent.parent

#: Budgets the candidates are gathered at (the read asks the fused search for more turns at a larger one).
TRAIN_BUDGETS = (1000, 4000)
#: The regularisation, chosen on the pick split by leaving one of its conversations out (each trained on the
#: other two): at 1,000 / 4,000 tokens C 0.01 0.864 / 0.958, 0.03 0.869 / 0.962, 0.1 0.874 / 0.961, 1 0.873 / 0.961.
C = 0.1
#: Left out of the shipped ranker: the self-statement signal (issue 41 item 3) did not help on report (the
#: budget eval's context_ranker_self row), so it is not kept.
SELF_FEATURES = ("self_statement", "self_named", "self_preference")
DIGITS = 6


@dataclass(frozen=True)
class Example:
    """One read of one question at one budget: its candidates' feature rows and their labels."""

    key: str
    sample_id: str
    category: int
    budget: int
    rows: np.ndarray
    labels: np.ndarray


async def gather_examples(settings: Settings, path: Path, conversations: Sequence[str], budgets: Sequence[int],
                          keep: list[Any] | None = None) -> list[Example]:
    """The labelled candidates of every question of ``conversations`` at every budget. ``keep``: a list that
    receives (query, budget, gathered) for each read too (the offline evaluation reads them)."""
    from epistream.consumers.retrieval import CONTEXT_READ, from_settings

    from .budget_recall import TENANT, chosen, embedded, stored
    from .budget_systems import MemoEmbedder, _ContextDeps

    samples = chosen(load_locomo(path, tenant=TENANT), list(conversations), "the training split")
    embedder, found, queries = embedded(settings, samples)
    memory = await stored(settings, samples, found)
    recipes = from_settings(settings)
    deps = _ContextDeps(memory.pool, MemoEmbedder(embedder), recipes)
    out: list[Example] = []
    try:
        for query in queries:
            question = Question(question_id=query.key, tenant=TENANT, question=query.question,
                                asked_at=query.asked_at, mode=Mode.CONTEXT, conversation_ids=[query.conversation_id])
            for budget in budgets:
                gathered = await gather(deps, question, when=QuestionTime.of(question), budget_tokens=budget,
                                        read=CONTEXT_READ)
                ranked = gathered.ranked(None)
                evidence = set(query.evidence)
                labels = np.array([float(c.kind == "turn" and c.fields["turn_id"] in evidence) for c in ranked])
                out.append(Example(query.key, query.sample_id, query.category, budget,
                                   features(ranked, gathered.asked), labels))
                if keep is not None:
                    keep.append((query, budget, gathered))
    finally:
        await memory.drop()
    return out


def fit(examples: Sequence[Example], *, c: float = C, name: str = BUILTIN.name,
        without: Sequence[str] = ()) -> dict[str, Any]:
    """The ranker file's content: a logistic regression over the standardised rows (``without``: features
    left out, their coefficients 0)."""
    from sklearn.linear_model import LogisticRegression

    rows = np.vstack([e.rows for e in examples])
    labels = np.concatenate([e.labels for e in examples])
    used = [n for n, f in enumerate(FEATURES) if f not in without]
    means = rows.mean(axis=0)
    scales = rows.std(axis=0)
    scales[scales == 0] = 1.0
    # Rounded before use, so the file applied at read time is the model that was fitted.
    means, scales = np.round(means, DIGITS), np.round(scales, DIGITS)
    standard = (rows - means) / scales
    model = LogisticRegression(C=c, max_iter=5000, solver="lbfgs")
    model.fit(standard[:, used], labels)
    coefficients = np.zeros(len(FEATURES))
    coefficients[used] = model.coef_[0]
    return {
        "name": name, "kind": "logistic-regression", "features": list(FEATURES),
        "means": [round(float(v), DIGITS) for v in means], "scales": [round(float(v), DIGITS) for v in scales],
        "coefficients": [round(float(v), DIGITS) for v in coefficients],
        "intercept": round(float(model.intercept_[0]), DIGITS),
        # Memory about the question's period first, as the read without a ranker has it: learned as a feature
        # instead, pick read within 0.005 of it (leaving a conversation out) and report the same.
        "period_first": True,
        "training": {"split": "pick", "rows": int(len(labels)), "positives": int(labels.sum()), "C": c,
                     "budgets": sorted({e.budget for e in examples}), "without": list(without)},
    }


def ranker_text(model: dict[str, Any]) -> str:
    """The file's exact text: keys sorted, one value per line."""
    return json.dumps(model, sort_keys=True, indent=1) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.train_ranker", description=__doc__.split("\n\n")[0])
    p.add_argument("path", nargs="?", type=Path, default=locomo_dev(), help="a LoCoMo-format JSON file")
    p.add_argument("--out", type=Path, default=BUILTIN.path, help="the ranker file to write")
    p.add_argument("--c", type=float, default=C, help="the inverse regularisation strength")
    p.add_argument("--without", default=",".join(SELF_FEATURES),
                   help="features to leave out, comma-separated (default: the self-statement ones; '' for none)")
    p.add_argument("--name", default=BUILTIN.name)
    p.add_argument("--no-up", action="store_true", help="do not start the embedded PostgreSQL")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from .budget_recall import SPLITS
    from .stack import up

    args = parse_args(argv)
    settings = Settings()
    without = [w.strip() for w in args.without.split(",") if w.strip()]
    unknown = [w for w in without if w not in FEATURES]
    if unknown:
        sys.exit(f"--without: unknown features {unknown}; the features are {list(FEATURES)}")
    if not args.no_up:
        up(settings, only={"postgres"})
    examples = asyncio.run(gather_examples(settings, args.path, SPLITS["pick"], TRAIN_BUDGETS))
    model = fit(examples, c=args.c, name=args.name, without=without)
    if args.out.resolve() != BUILTIN.path.resolve():
        # A result, not the shipped file (which must stay the same bytes: its provenance is its card):
        # where and under what load it was trained.
        model["machine"] = report.machine_info(ROOT)
    text = ranker_text(model)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}: sha256 {hashlib.sha256(text.encode()).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
