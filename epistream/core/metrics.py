"""Every Prometheus metric, defined once against an injected registry.

Names follow ``epistream_<subsystem>_<name>_<unit>``; counters end in
``_total``; durations are histograms in seconds; labels are bounded
(stages, outcomes, roles, error classes, never user text).
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

_FAST = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_SLOW = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)


@dataclass(frozen=True)
class Metrics:
    registry: CollectorRegistry
    turns_ingested: Counter
    dead_letters: Counter
    ingest_batch_seconds: Histogram
    embedding_seconds: Histogram
    produce_to_searchable_seconds: Histogram
    segments_closed: Counter
    segments_enriched: Counter
    enrich_seconds: Histogram
    produce_to_facts_seconds: Histogram
    memory_items: Counter
    model_requests: Counter
    model_tokens: Counter
    model_latency_seconds: Histogram
    model_in_flight: Gauge
    questions_answered: Counter
    answer_latency_seconds: Histogram
    context_read_seconds: Histogram
    consumer_lag: Gauge
    consumer_reseeks: Counter
    watermark_gaps: Counter
    router_candidates: Histogram
    task_failures: Counter
    reembed_pending: Gauge
    reembedded: Counter
    read_after_wait_seconds: Histogram
    reads_incomplete: Counter
    memory_events_published: Counter
    answer_in_flight: Gauge
    answer_slot_wait_seconds: Histogram
    answer_publish_seconds: Histogram

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> Metrics:
        reg = registry if registry is not None else CollectorRegistry()
        return cls(
            registry=reg,
            turns_ingested=Counter(
                "epistream_ingest_turns_total",
                "Turns written by the ingest agent, by outcome (inserted, updated, unchanged).",
                ["outcome"],
                registry=reg,
            ),
            dead_letters=Counter(
                "epistream_dlq_messages_total",
                "Messages sent to the dead-letter topic, by stage and error class.",
                ["stage", "error_class"],
                registry=reg,
            ),
            ingest_batch_seconds=Histogram(
                "epistream_ingest_batch_duration_seconds",
                "Time to embed and store one batch of turns.",
                buckets=_FAST,
                registry=reg,
            ),
            embedding_seconds=Histogram(
                "epistream_embedding_duration_seconds",
                "Time to embed one batch of texts.",
                buckets=_FAST,
                registry=reg,
            ),
            produce_to_searchable_seconds=Histogram(
                "epistream_ingest_produce_to_searchable_seconds",
                "From the Kafka record timestamp to the turn being stored and searchable.",
                buckets=_FAST,
                registry=reg,
            ),
            segments_closed=Counter(
                "epistream_segments_closed_total",
                "Segments closed by the segmenter.",
                registry=reg,
            ),
            segments_enriched=Counter(
                "epistream_enrich_segments_total",
                "Segments through enrichment, by outcome (enriched, failed, forgotten, done: already enriched).",
                ["outcome"],
                registry=reg,
            ),
            enrich_seconds=Histogram(
                "epistream_enrich_duration_seconds",
                "Time to enrich and store one segment (model call included).",
                buckets=_SLOW,
                registry=reg,
            ),
            produce_to_facts_seconds=Histogram(
                "epistream_enrich_produce_to_facts_seconds",
                "From the newest Kafka timestamp of a segment's turns to its gists and facts being stored.",
                buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
                registry=reg,
            ),
            memory_items=Counter(
                "epistream_enrich_items_total",
                "Gists, facts and entity mentions written by enrichment.",
                ["kind"],
                registry=reg,
            ),
            model_requests=Counter(
                "epistream_model_requests_total",
                "Model calls by role, endpoint and outcome (ok, retry, failed, invalid_output).",
                ["role", "endpoint", "outcome"],
                registry=reg,
            ),
            model_tokens=Counter(
                "epistream_model_tokens_total",
                "Tokens used by role, endpoint and kind (prompt, completion).",
                ["role", "endpoint", "kind"],
                registry=reg,
            ),
            model_latency_seconds=Histogram(
                "epistream_model_request_duration_seconds",
                "Model call latency by role and endpoint.",
                ["role", "endpoint"],
                buckets=_SLOW,
                registry=reg,
            ),
            model_in_flight=Gauge(
                "epistream_model_requests_in_flight",
                "Model calls waiting for their reply, by role and endpoint (health tells a busy server from a dead one).",
                ["role", "endpoint"],
                registry=reg,
            ),
            questions_answered=Counter(
                "epistream_answer_questions_total",
                "Questions answered by mode and outcome (answered, abstained, failed, withdrawn).",
                ["mode", "outcome"],
                registry=reg,
            ),
            answer_latency_seconds=Histogram(
                "epistream_answer_duration_seconds",
                "Question-to-answer latency by mode.",
                ["mode"],
                buckets=_SLOW,
                registry=reg,
            ),
            context_read_seconds=Histogram(
                "epistream_context_read_duration_seconds",
                "Time to build a `context` read's reply (embedding, retrieval, packing; no model call).",
                # Fine around the goal (p95 <= 50 ms).
                buckets=(0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5),
                registry=reg,
            ),
            consumer_lag=Gauge(
                "epistream_consumer_lag_messages",
                "Messages not yet consumed, by consumer group and topic (summed over partitions).",
                ["group", "topic"],
                registry=reg,
            ),
            consumer_reseeks=Counter(
                "epistream_consumer_reseeks_total",
                "Times a worker found a partition stalled behind its committed offset with nothing in flight "
                "(records its consumer fetched and dropped), by group and action: seek (back to the committed "
                "offsets) or restart (stalled again after a seek: the worker stops and is started afresh).",
                ["group", "action"], registry=reg,
            ),
            watermark_gaps=Counter(
                "epistream_watermark_gaps_total",
                "Gaps under the ingest side's read-your-own-writes mark that outlived their grace, by outcome: "
                "skipped (the log holds records there: the partition is sought back to them), empty (markers or "
                "an aborted transaction only: the gap is filled) or restart (skipped again after a seek).",
                ["outcome"], registry=reg,
            ),
            router_candidates=Histogram(
                "epistream_router_candidates",
                "Segments or reading windows deep mode's assistants read for one question.",
                buckets=(0, 1, 2, 3, 5, 8, 10, 15, 20),
                registry=reg,
            ),
            reembed_pending=Gauge(
                "epistream_reembed_pending_rows",
                "Stored vectors another embedding model (or an older turn text) made, still to re-embed, by kind.",
                ["kind"], registry=reg,
            ),
            reembedded=Counter(
                "epistream_reembedded_rows_total",
                "Stored vectors re-embedded with the configured embedding model, by kind.",
                ["kind"], registry=reg,
            ),
            memory_events_published=Counter(
                "epistream_memory_events_published_total",
                "Memory events the relay delivered from the outbox to Kafka, by kind (docs/events.md).",
                ["kind"], registry=reg,
            ),
            task_failures=Counter(
                "epistream_task_failures_total",
                "Runs of a periodic task (housekeeping) that failed and were skipped, by task and error class.",
                ["task", "error_class"],
                registry=reg,
            ),
            answer_in_flight=Gauge(
                "epistream_answer_questions_in_flight",
                "Questions an answer worker is reading or answering now, by lane (read: no model call; model).",
                ["lane"], registry=reg,
            ),
            answer_slot_wait_seconds=Histogram(
                "epistream_answer_slot_wait_seconds",
                "How long questions waited for a slot of their lane (EPISTREAM_ANSWER_READ_CONCURRENCY, "
                "EPISTREAM_ANSWER_MODEL_CONCURRENCY).",
                ["lane"], buckets=_FAST, registry=reg,
            ),
            answer_publish_seconds=Histogram(
                "epistream_answer_publish_seconds",
                "How long one transaction of replies and the group's offset took to commit.",
                buckets=_FAST, registry=reg,
            ),
            read_after_wait_seconds=Histogram(
                "epistream_answer_read_after_wait_seconds",
                "How long questions with `after` positions waited for ingest to store through them, by outcome "
                "(stored, timed_out, never_produced: a position on no partition or past its end, not waited for).",
                ["outcome"], buckets=_FAST, registry=reg,
            ),
            reads_incomplete=Counter(
                "epistream_answer_reads_incomplete_total",
                "Replies marked incomplete: their `after` positions were not stored within EPISTREAM_READ_AFTER_TIMEOUT_S.",
                registry=reg,
            ),
        )

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Expose ``/metrics`` on a background thread."""
        start_http_server(port, addr=host, registry=self.registry)


@dataclass(frozen=True)
class SupervisorMetrics:
    """What the embedded supervisor exports: restarts and liveness per service."""

    registry: CollectorRegistry
    restarts: Counter
    service_up: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> SupervisorMetrics:
        reg = registry if registry is not None else CollectorRegistry()
        return cls(
            registry=reg,
            restarts=Counter(
                "epistream_supervisor_restarts_total",
                "Times the supervisor restarted a service or worker after it exited or never became ready.",
                ["service"],
                registry=reg,
            ),
            service_up=Gauge(
                "epistream_supervisor_service_up",
                "1 while the service's process runs and passed its readiness check, else 0.",
                ["service"],
                registry=reg,
            ),
        )

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.registry)


def parse_samples(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition (names carry their _total/_sum/_count/_bucket suffix)."""
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def read_samples(url: str, timeout_s: float = 5.0) -> list[Sample]:
    """Every sample a ``/metrics`` endpoint serves, parsed by prometheus_client (raises OSError when unreachable)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (a configured local URL)
        return parse_samples(response.read().decode("utf-8", errors="replace"))


def sample_sum(samples: Iterable[Sample], name: str, **labels: str) -> float:
    """The sum of `name` over every series whose labels include `labels` (0 when none matches)."""
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))
