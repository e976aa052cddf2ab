"""Read the ingest worker's Prometheus counters: its ingest time split, and the extractor's calls and tokens.

Counters are cumulative since the worker started, so every figure is a
difference between two scrapes. They are per worker, not per tenant: another
tenant's work in between is in the difference too.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Generic, TypeVar

from prometheus_client.samples import Sample

from epistream.core.metrics import parse_samples, read_samples, sample_sum
from epistream.ops.health import worker_metrics_url
from epistream.settings.processes import Settings


def scrape_samples(settings: Settings, worker: str = "ingest") -> list[Sample] | None:
    """Every sample of a worker's /metrics (default: the ingest worker's), or None where it cannot be read."""
    try:
        return read_samples(worker_metrics_url(settings, worker))
    except OSError:
        return None


@dataclass(frozen=True)
class _Counters:
    def __sub__(self, other):  # type: ignore[no-untyped-def]
        return type(self)(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})

    def __add__(self, other):  # type: ignore[no-untyped-def]
        return type(self)(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})


@dataclass(frozen=True, eq=False)
class IngestCounters(_Counters):
    batches: float = 0.0
    batch_seconds: float = 0.0
    embed_seconds: float = 0.0
    turns: float = 0.0


@dataclass(frozen=True, eq=False)
class ExtractorCounters(_Counters):
    # Model calls by outcome: each is one HTTP request to the model server.
    calls_ok: float = 0.0
    calls_invalid_output: float = 0.0  # answered, but not JSON of the schema: retried with a repair note
    calls_retry: float = 0.0  # timeout, connection error, 429 or 5xx: retried after a backoff
    calls_failed: float = 0.0  # a client error: not retried
    call_seconds: float = 0.0  # summed latency of the calls above
    prompt_tokens: float = 0.0
    completion_tokens: float = 0.0

    @property
    def calls(self) -> float:
        return self.calls_ok + self.calls_invalid_output + self.calls_retry + self.calls_failed


def _requests_by_role(samples: list[Sample]) -> dict[str, dict[str, float]]:
    counts: dict[str, dict[str, float]] = {}
    for sample in samples:
        if sample.name == "epistream_model_requests_total":
            by_outcome = counts.setdefault(sample.labels.get("role", "?"), {})
            outcome = sample.labels.get("outcome", "?")
            by_outcome[outcome] = by_outcome.get(outcome, 0.0) + sample.value
    return counts


def parse_model_requests(text: str) -> dict[str, dict[str, float]]:
    """{role: {outcome: count}} from a worker's Prometheus text (summed over endpoints)."""
    return _requests_by_role(parse_samples(text))


def model_requests(settings: Settings, worker: str) -> dict[str, dict[str, float]] | None:
    """The model-request counters of one worker ("ingest" or "answer"; None when unreachable)."""
    samples = scrape_samples(settings, worker)
    return None if samples is None else _requests_by_role(samples)


def request_delta(before: dict | None, after: dict | None) -> dict[str, dict[str, float]] | None:
    if before is None or after is None:
        return None
    return {role: {o: after[role][o] - before.get(role, {}).get(o, 0.0) for o in after[role]
                   if after[role][o] - before.get(role, {}).get(o, 0.0)} for role in after}


def scrape(settings: Settings) -> IngestCounters | None:
    samples = scrape_samples(settings)
    if samples is None:
        return None
    return IngestCounters(
        batches=sample_sum(samples, "epistream_ingest_batch_duration_seconds_count"),
        batch_seconds=sample_sum(samples, "epistream_ingest_batch_duration_seconds_sum"),
        embed_seconds=sample_sum(samples, "epistream_embedding_duration_seconds_sum"),
        turns=sample_sum(samples, "epistream_ingest_turns_total"),
    )


def scrape_extractor(settings: Settings) -> ExtractorCounters | None:
    samples = scrape_samples(settings)
    if samples is None:
        return None
    role = {"role": "extractor"}
    return ExtractorCounters(
        **{
            f"calls_{outcome}": sample_sum(samples, "epistream_model_requests_total", outcome=outcome, **role)
            for outcome in ("ok", "invalid_output", "retry", "failed")
        },
        call_seconds=sample_sum(samples, "epistream_model_request_duration_seconds_sum", **role),
        prompt_tokens=sample_sum(samples, "epistream_model_tokens_total", kind="prompt", **role),
        completion_tokens=sample_sum(samples, "epistream_model_tokens_total", kind="completion", **role),
    )


C = TypeVar("C", IngestCounters, ExtractorCounters)


class Increase(Generic[C]):
    """Counter growth over a run from repeated scrapes, like Prometheus's increase(): when the
    worker restarts its counters start again from zero, and the growth since then is kept instead
    of a negative difference. Scrape often enough that little is lost at a restart."""

    def __init__(self, first: C | None) -> None:
        self.last = first
        self.total: C | None = None if first is None else type(first)()

    def add(self, current: C | None) -> None:
        if current is None:
            return
        if self.last is None or self.total is None:
            self.last, self.total = current, type(current)()
            return
        step = current - self.last
        if any(getattr(step, f.name) < 0 for f in fields(step)):
            step = current  # everything since the restart
        self.total = self.total + step  # type: ignore[operator]
        self.last = current
