"""How fast a stored memory moves to another embedding model.

The LoCoMo dev split is stored by the worker's own ingest code as a MiniLM worker stores it, then
re-embedded in place to the configured model by the indexer's own rounds (pipeline.reembed, batches
of EPISTREAM_REEMBED_BATCH, no pause between them), beside the configured model alone on the same
texts in the same run (batches of EPISTREAM_EMBEDDING_BATCH). No Kafka, no model server.

    python -m bench.reembed_rate [LOCOMO_JSON] [--out bench/results/reembed.json]   # default: $LOCOMO_DEV, else the shared split
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

from epistream.client.sources import load_locomo
from epistream.models.embeddings import Embedder, turn_embedding_text
from epistream.pipeline.reembed import pending, reembed_round
from epistream.settings.processes import Settings
from epistream.storage.db import create_pool
from epistream.testing.datasets import locomo_dev

from . import report
from .budget_systems import CachedEmbedder, Memory
from .stack import up

ROOT = Path(__file__).resolve().parent.parent
FROM = "all-minilm-l6-v2-int8"
TENANT = "reembed"


async def run(path: Path, settings: Settings) -> dict[str, Any]:
    turns = [t for s in load_locomo(path, tenant=TENANT) for t in s.turns]
    texts = [turn_embedding_text(t.speaker, t.text, t.ts) for t in turns]
    old_settings = settings.with_overrides(embedding_model=FROM)
    memory = await Memory.create(old_settings, TENANT)
    try:
        await memory.store(turns, CachedEmbedder(texts, Embedder.from_settings(old_settings).embed(texts)))
        new = Embedder.from_settings(settings)
        new.embed(texts[: settings.embedding_batch])  # ONNX Runtime allocates on its first run
        started = time.perf_counter()
        new.embed(texts)
        bare_s = time.perf_counter() - started
        pool = create_pool(settings, url=memory.pool.conninfo)
        await pool.open(wait=True)
        try:
            before = await pending(pool, new.name)
            started = time.perf_counter()
            rows = 0
            while (n := await reembed_round(pool, new, limit=settings.reembed_batch, budget_s=3600.0)) > 0:
                rows += n
            switch_s = time.perf_counter() - started
            assert await pending(pool, new.name) == {}, "rows left after the switch"
        finally:
            await pool.close()
    finally:
        await memory.drop()
    return {"from": FROM, "to": settings.embedding_model, "rows": rows,
            "rows_by_kind": {kind: n for (kind, _), n in before.items()},
            "switch_s": round(switch_s, 1), "switch_rows_per_s": round(rows / switch_s, 1),
            "bare_texts": len(texts), "bare_s": round(bare_s, 1), "bare_per_s": round(len(texts) / bare_s, 1),
            "switch_over_bare": round((rows / switch_s) / (len(texts) / bare_s), 2),
            "reembed_batch": settings.reembed_batch, "embedding_batch": settings.embedding_batch}


def plot(result: dict[str, Any], path: Path) -> None:
    fig, ax = report.subplots(figsize=(6, 2.4))
    labels = [f"switch {result['from']} → {result['to']} (in place)", f"{result['to']} alone, same texts"]
    values = [result["switch_rows_per_s"], result["bare_per_s"]]
    report.bars(ax, labels, values, ["tab:blue", "tab:gray"], label="{:,.0f}/s", horizontal=True)
    ax.set_xlabel("rows (texts) per second, 2 cores")
    ax.set_xlim(0, max(values) * 1.3)
    report.save(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", nargs="?", type=Path, default=locomo_dev())
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "reembed.json")
    args = parser.parse_args()
    settings = Settings()
    up(settings, only={"postgres"})
    result = asyncio.run(run(args.path, settings))
    result["machine"] = report.machine_info(ROOT)
    report.write_results(args.out, result, plot)
    print(result)


if __name__ == "__main__":
    main()
