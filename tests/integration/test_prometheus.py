"""A real Prometheus scrapes both workers, stores their series and loads the alert rules."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from epistream.core.metrics import read_samples, sample_sum
from epistream.infra import prometheus_server

from .conftest import count_turns, wait_for
from .helpers import make_turns, produce_turns

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not prometheus_server.PROMETHEUS_BIN.exists(),
        reason=f"{prometheus_server.PROMETHEUS_BIN} is absent (Debian package `prometheus`; `make system-deps`)",
    ),
]

PORT = int(os.environ.get("EPISTREAM_SUPERVISOR_METRICS_PORT", "29103")) - 13  # beside the test stack's ports
ALERTS = Path(prometheus_server.RULES_FILE)


@pytest.fixture(scope="module")
def prometheus(stack):
    state_dir = stack.state_dir / "prometheus"
    prometheus_server.stop(state_dir)  # a leftover from an interrupted run
    detail = prometheus_server.start(
        state_dir, prometheus_server.worker_targets(stack), port=PORT, scrape_interval="1s", fresh=True
    )
    print(f"[prometheus] {detail}")
    yield PORT
    prometheus_server.stop(state_dir)
    assert prometheus_server.pid(state_dir) is None


def value(port: int, promql: str) -> float | None:
    """The single value of an instant query, None when it has no result."""
    result = prometheus_server.query(port, promql)
    if not result:
        return None
    assert len(result) == 1, result
    return float(result[0]["value"][1])


def scraped_turns_inserted(metrics_port: int) -> float:
    samples = read_samples(f"http://127.0.0.1:{metrics_port}/metrics")
    return sample_sum(samples, "epistream_ingest_turns_total", outcome="inserted")


def target_health(port: int) -> dict[str, str]:
    return {t["labels"]["job"]: t["health"] for t in prometheus_server.targets(port)}


def test_every_worker_and_the_supervisor_are_scraped(prometheus):
    wanted = {"epistream-ingest": "up", "epistream-enrich": "up", "epistream-answer": "up",
              "epistream-supervisor": "up"}
    wait_for(lambda: target_health(prometheus) == wanted, timeout=60, what=f"targets {wanted}")
    wait_for(lambda: value(prometheus, 'up{job="epistream-ingest"}') == 1, timeout=30, what="ingest worker up")
    assert value(prometheus, 'up{job="epistream-answer"}') == 1
    assert value(prometheus, 'up{job="epistream-enrich"}') == 1
    assert value(prometheus, 'epistream_supervisor_service_up{service="worker-ingest"}') == 1


def test_a_produced_turn_reaches_prometheus(prometheus, stack, db_url, unique):
    wait_for(lambda: value(prometheus, 'up{job="epistream-ingest"}') == 1, timeout=60, what="ingest worker up")
    tenant, conversation = unique("prom"), unique("conv")
    produce_turns(stack, make_turns(tenant, conversation, [("A", "Prometheus should count this turn.")]))
    # The indexer may be busy enriching earlier segments on the CPU model: allow for it.
    wait_for(lambda: count_turns(db_url, tenant, conversation) == 1, timeout=180, what="turn stored")
    # What the worker itself says now includes our turn; Prometheus must catch up to it.
    expected = scraped_turns_inserted(stack.ingest_metrics_port)
    assert expected >= 1

    def caught_up() -> bool:
        got = value(prometheus, 'sum(epistream_ingest_turns_total{job="epistream-ingest", outcome="inserted"})')
        return got is not None and got >= expected

    wait_for(caught_up, timeout=30, what="epistream_ingest_turns_total in Prometheus")
    # Histograms arrive with their buckets, so the dashboard's quantiles work.
    p95 = value(
        prometheus,
        "histogram_quantile(0.95, sum by (le) (epistream_ingest_produce_to_searchable_seconds_bucket))",
    )
    assert p95 is not None and p95 > 0
    # Each worker reports its group's lag per topic from a periodic task (the indexer's
    # runs between enrichments, so it can take a while on a busy CPU model).
    wanted = {("epistream-ingest", stack.topic_turns), ("epistream-answer", stack.topic_questions)}

    def lag_series() -> bool:
        series = prometheus_server.query(prometheus, "epistream_consumer_lag_messages")
        return {(s["metric"]["job"], s["metric"]["topic"]) for s in series} >= wanted

    wait_for(lag_series, timeout=120, interval=1, what=f"epistream_consumer_lag_messages for {sorted(wanted)}")


def test_alert_rules_are_loaded(prometheus):
    declared = {
        rule["alert"] for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]
    }
    loaded = {
        rule["name"]: rule
        for group in prometheus_server.rules(prometheus)
        for rule in group["rules"]
        if rule["type"] == "alerting"
    }
    assert set(loaded) == declared
    assert all(rule["health"] != "err" for rule in loaded.values()), loaded
