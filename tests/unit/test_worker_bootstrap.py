"""The two Faust workers as pipeline/bootstrap.py builds them: the options they share and the ones each
adds, their agents, tasks and timers; the resources opened in order; the lag a tick reads once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import faust
import pytest

from epistream.core.metrics import Metrics
from epistream.pipeline import app as ingest_app
from epistream.pipeline import bootstrap, enrich_app
from epistream.pipeline.bootstrap import LagReading, WorkerApp, WorkerResources
from epistream.settings.processes import Settings

SHARED = {"web_enabled": False, "autodiscover": False, "consumer_auto_offset_reset": "earliest",
          "producer_acks": -1, "topic_allow_declare": False, "topic_disable_leader": True}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings().with_overrides(home=tmp_path)


@pytest.fixture
def timers(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, float]]:
    """(app id, timer, interval) of each timer an app declares from here on."""
    declared: list[tuple[str, str, float]] = []
    timer = faust.App.timer

    def recording(app: faust.App, interval: float, **options: Any) -> Any:
        def register(fun: Any) -> Any:
            declared.append((app.conf.id, fun.__name__, interval))
            return timer(app, interval, **options)(fun)
        return register

    monkeypatch.setattr(faust.App, "timer", recording)
    return declared


def agents_of(app: faust.App) -> dict[str, tuple[list[str], int]]:
    return {name: (sorted(agent.channel.topics), agent.concurrency) for name, agent in app.agents.items()}


def test_the_indexer_has_its_agents_and_one_housekeeping_timer(settings: Settings, timers: list):
    app = ingest_app.create_app(settings, Metrics.create())
    assert app.conf.id == settings.indexer_group
    assert agents_of(app) == {"ingest": ([settings.topic_turns], 1), "forgotten": ([settings.topic_forgotten], 1)}
    assert timers == [(settings.indexer_group, "housekeeping_timer", settings.segment_check_every_s)]
    assert len(app._app_tasks) == 2  # the event relay and the timer


def test_the_enrich_worker_has_its_agent_its_retry_timer_and_its_own_lag_timer(settings: Settings, timers: list):
    app = enrich_app.create_app(settings, Metrics.create())
    assert app.conf.id == settings.enrich_group
    assert agents_of(app) == {"enrich": ([settings.topic_segments], settings.enrich_concurrency)}
    assert timers == [(settings.enrich_group, "resume_waiting", settings.enrich_retry_every_s),
                      (settings.enrich_group, "watch_lag", settings.segment_check_every_s)]
    assert len(app._app_tasks) == 3


def test_both_workers_share_the_options_and_only_enrich_holds_an_event_for_a_model_call(settings: Settings):
    ingest, enrich = (m.create_app(settings, Metrics.create()) for m in (ingest_app, enrich_app))
    for app, client in ((ingest, "ingest"), (enrich, "enrich")):
        assert {key: getattr(app.conf, key) for key in SHARED} == SHARED
        assert str(app.conf.store) == "memory:"  # "memory://", as Faust parses it
        assert app.conf.broker_client_id.startswith(f"epistream-{client}-")
        assert app.conf.broker_session_timeout == settings.kafka_session_timeout_s
        assert app.conf.broker_heartbeat_interval == settings.kafka_heartbeat_interval_s
        assert Path(app.conf.datadir) == settings.state_dir / "faust" / app.conf.id
    assert enrich.conf.broker_max_poll_interval == enrich_app.worst_case_call_s(settings) + 120.0
    assert ingest.conf.broker_max_poll_interval == faust.App("default", autodiscover=False).conf.broker_max_poll_interval


class Recorded(WorkerResources):
    worker_name = "recorded"
    steps: list[str]

    def metrics_port(self) -> int:
        return 0

    async def opened(self, shared: Any) -> None:
        self.steps.append("opened")


def test_resources_catch_up_on_erasures_before_the_worker_builds_on_them_and_serves_metrics(
        settings: Settings, monkeypatch: pytest.MonkeyPatch):
    steps: list[str] = []

    class Shared:
        pool = "pool"

        async def close(self) -> None:
            steps.append("closed")

    async def open_shared(settings: Settings, metrics: Metrics, *, standby_reads: bool = True) -> Shared:
        steps.append("open" if not standby_reads else "open with standby reads")
        return Shared()

    async def catch_up(settings: Settings, pool: object) -> None:
        steps.append(f"catch up with {pool}")

    metrics = Metrics.create()
    monkeypatch.setattr(bootstrap.Resources, "open", open_shared)
    monkeypatch.setattr(bootstrap.erasure, "catch_up", catch_up)
    monkeypatch.setattr(Metrics, "serve", lambda self, port, host: steps.append(f"serve :{port}"))

    async def scenario() -> None:
        resources = Recorded(settings, metrics)
        resources.steps = steps
        assert resources.pool_if_open() is None
        await resources.on_start()
        assert resources.pool_if_open() == "pool"
        await resources.on_stop()

    asyncio.run(scenario())
    assert steps == ["open", "catch up with pool", "opened", "serve :0", "closed"]


def test_a_tick_reads_the_lag_once_and_gives_the_log_ends_by_partition(settings: Settings,
                                                                      monkeypatch: pytest.MonkeyPatch):
    worker = WorkerApp.build(settings, Metrics.create(), Recorded, group="g", client="test", consumed=("t",))
    reads: list[tuple[str, list[str]]] = []

    async def report_lag(settings: Settings, metrics: Metrics, group: str, topics: list[str]) -> dict | None:
        reads.append((group, topics))
        return {("t", 0): (5, 9), ("t", 1): (-1, 3)} if len(reads) == 1 else None

    monkeypatch.setattr(bootstrap, "report_lag", report_lag)
    reading = LagReading(worker)
    assert reading.lag is None
    assert asyncio.run(reading.log_ends()) == {0: 9, 1: 3}
    assert reading.lag == {("t", 0): (5, 9), ("t", 1): (-1, 3)}
    assert reads == [("g", ["t"])]
    assert asyncio.run(LagReading(worker).log_ends()) is None  # the broker could not say
