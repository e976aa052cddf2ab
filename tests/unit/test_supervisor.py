"""The supervisor's policy (order, restarts with backoff, how an exit is told) on real child
processes that stand in for services: plain `python -c` sleepers, no Kafka or database."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from epistream.core.metrics import SupervisorMetrics
from epistream.infra import supervisor as sup
from epistream.infra.service import ServiceSpec
from epistream.infra.services import _join
from epistream.infra.supervisor import Supervisor
from epistream.ops.readiness import wait_until
from epistream.settings.processes import Settings

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def _restarts(metrics: SupervisorMetrics, name: str) -> float:
    return metrics.registry.get_sample_value("epistream_supervisor_restarts_total", {"service": name}) or 0.0


@pytest.fixture
def home(tmp_path: Path) -> Settings:
    (tmp_path / "run").mkdir()
    return Settings(home=tmp_path, restart_backoff_max_s=2.0)


def _run(supervisor: Supervisor) -> threading.Thread:
    thread = threading.Thread(target=supervisor.run, daemon=True)
    thread.start()
    return thread


def _wait(check, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    return wait_until(check, timeout_s=timeout, interval_s=0.05, what="the supervisor")


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [sup.backoff_s(n, 30.0) for n in (1, 2, 3, 4, 5, 6, 7)] == [1, 2, 4, 8, 16, 30, 30]


def test_exit_is_told_by_signal_name_or_status() -> None:
    assert sup.describe_exit(-signal.SIGKILL)["text"] == "killed by SIGKILL"
    assert sup.describe_exit(-signal.SIGSEGV)["signal"] == "SIGSEGV"
    assert sup.describe_exit(3) == {"code": 3, "signal": None, "text": "exited with status 3"}


def test_a_killed_child_is_restarted_and_counted(home: Settings) -> None:
    metrics = SupervisorMetrics.create()
    supervisor = Supervisor(home, [ServiceSpec("a", SLEEPER, ready=lambda: True)], metrics)
    thread = _run(supervisor)
    try:
        first = _wait(lambda: sup.read_state(home.state_dir).get("services", {}).get("a", {}).get("pid"))
        os.kill(first, signal.SIGKILL)
        info = _wait(lambda: (i := sup.read_state(home.state_dir)["services"]["a"])["pid"] not in (None, first)
                     and i["state"] == "running" and i)
        assert info["restarts"] == 1
        assert info["last_exit"]["signal"] == "SIGKILL"
        assert _restarts(metrics, "a") == 1
        assert metrics.registry.get_sample_value("epistream_supervisor_service_up", {"service": "a"}) == 1
    finally:
        supervisor._request_stop()
        thread.join(30)
    assert not thread.is_alive()
    assert sup.read_state(home.state_dir)["services"]["a"]["state"] == "stopped"


def test_children_start_after_what_they_require_is_ready(home: Settings) -> None:
    gate = threading.Event()
    specs = [ServiceSpec("base", SLEEPER, ready=gate.is_set),
             ServiceSpec("dependent", SLEEPER, ready=lambda: True, requires=("base",))]
    supervisor = Supervisor(home, specs, SupervisorMetrics.create())
    thread = _run(supervisor)
    try:
        _wait(lambda: sup.read_state(home.state_dir).get("services", {}).get("base", {}).get("pid"))
        time.sleep(0.6)
        assert sup.read_state(home.state_dir)["services"]["dependent"]["pid"] is None
        gate.set()
        _wait(lambda: sup.read_state(home.state_dir)["services"]["dependent"]["state"] == "running")
    finally:
        supervisor._request_stop()
        thread.join(30)


def test_a_crash_looping_child_backs_off_and_status_reports_it_crashed(home: Settings) -> None:
    crasher = [sys.executable, "-c", "import sys; print('boom: native crash simulated'); sys.exit(7)"]
    supervisor = Supervisor(home, [ServiceSpec("model-server", crasher, ready=lambda: False)],
                            SupervisorMetrics.create())
    thread = _run(supervisor)
    try:
        info = _wait(lambda: (i := sup.read_state(home.state_dir).get("services", {}).get("model-server"))
                     and i["restarts"] >= 2 and i["state"] == "backoff" and i)
    finally:
        supervisor._request_stop()
        thread.join(30)
    assert info["last_exit"]["code"] == 7
    from epistream.ops.health import Health, Probe

    row = _join(Probe("model-server", Health.DOWN, "ConnectionRefused", 0.0), info, supervised=True, last=info)
    assert row.state == "crashed" and not row.running
    assert "exited with status 7" in row.detail
    assert any("boom: native crash simulated" in line for line in row.log_tail)


def test_a_child_that_never_gets_ready_is_killed_and_retried(home: Settings) -> None:
    supervisor = Supervisor(home, [ServiceSpec("slow", SLEEPER, ready=lambda: False, start_timeout_s=0.5)],
                            SupervisorMetrics.create())
    thread = _run(supervisor)
    try:
        info = _wait(lambda: (i := sup.read_state(home.state_dir).get("services", {}).get("slow"))
                     and i.get("last_exit") and i)
    finally:
        supervisor._request_stop()
        thread.join(30)
    assert "not ready after" in info["last_exit"]["text"]


def test_stop_orphans_stops_what_a_dead_supervisor_left(tmp_path: Path) -> None:
    import subprocess

    child = subprocess.Popen(SLEEPER, process_group=0)
    try:
        assert sup.stop_orphans({"services": {"x": {"pid": child.pid}}}) == ["x"]
        assert child.wait(timeout=10) == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()


def test_the_state_records_the_settings_its_children_run_with(home: Settings) -> None:
    from pydantic import SecretStr

    settings = home.with_overrides(segment_idle_s=7.5, llm_api_key=SecretStr("sk-secret"))
    Supervisor(settings, [], SupervisorMetrics.create()).write_state()
    recorded = sup.read_state(home.state_dir)["settings"]
    assert recorded["segment_idle_s"] == 7.5
    assert "sk-secret" not in str(recorded)  # secrets are masked
