"""Read the ingest worker's Prometheus counters, to split its time into embedding and storing."""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from epistream.settings import Settings


@dataclass(frozen=True)
class IngestCounters:
    batches: float = 0.0
    batch_seconds: float = 0.0
    embed_seconds: float = 0.0
    turns: float = 0.0

    def __sub__(self, other: IngestCounters) -> IngestCounters:
        return IngestCounters(
            self.batches - other.batches,
            self.batch_seconds - other.batch_seconds,
            self.embed_seconds - other.embed_seconds,
            self.turns - other.turns,
        )


def scrape(settings: Settings) -> IngestCounters | None:
    """The worker's cumulative counters, or None where /metrics cannot be read (the figures are optional)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{settings.ingest_metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value  # sums the outcome labels
    return IngestCounters(
        batches=values.get("epistream_ingest_batch_duration_seconds_count", 0.0),
        batch_seconds=values.get("epistream_ingest_batch_duration_seconds_sum", 0.0),
        embed_seconds=values.get("epistream_embedding_duration_seconds_sum", 0.0),
        turns=values.get("epistream_ingest_turns_total", 0.0),
    )
