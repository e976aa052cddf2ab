"""The embedded stack's supervisor: one process that `epistream up` starts and `epistream down` stops.

It runs each embedded service and worker as its own child, in order (a child is
started once the ones before it are ready), and restarts a child that exits, or
that does not become ready in time, with exponential backoff. What happened is
written to ``run/supervisor.json`` (read by `status`) and exported as metrics:
``epistream_supervisor_restarts_total{service}``, ``epistream_supervisor_service_up{service}``.

The set of children it should run is ``run/wanted.json``; SIGHUP re-reads it,
SIGTERM stops every child (in reverse order) and then the supervisor.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from epistream.core.metrics import SupervisorMetrics
from epistream.settings.processes import Settings

from .process import pid_alive
from .service import ServiceSpec

log = logging.getLogger(__name__)

#: A child that stayed up this long before exiting starts its backoff afresh.
HEALTHY_RUN_S = 60.0
TICK_S = 0.25


@dataclass
class Child:
    spec: ServiceSpec
    state: str = "waiting"  # waiting | starting | running | backoff | stopped
    proc: subprocess.Popen | None = None
    restarts: int = 0
    failures_in_row: int = 0
    started_at: float | None = None  # monotonic
    started_wall: str | None = None
    next_start: float = 0.0  # monotonic
    last_exit: dict | None = None
    ever_started: bool = False
    detail: str = ""
    log_file: Path = field(default_factory=Path)


def state_file(state_dir: Path) -> Path:
    return state_dir / "run" / "supervisor.json"


def wanted_file(state_dir: Path) -> Path:
    return state_dir / "run" / "wanted.json"


def pid_file(state_dir: Path) -> Path:
    return state_dir / "run" / "supervisor.pid"


def log_dir(state_dir: Path) -> Path:
    return state_dir / "logs"


def read_state(state_dir: Path) -> dict:
    """The supervisor's last written state ({} before it ever ran)."""
    try:
        return json.loads(state_file(state_dir).read_text())
    except (OSError, ValueError):
        return {}


def supervisor_pid(state_dir: Path) -> int | None:
    try:
        pid = int(pid_file(state_dir).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) else None


def describe_exit(returncode: int) -> dict:
    """An exit status as a person reads it: the code, or the signal's name."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return {"code": None, "signal": name, "text": f"killed by {name}"}
    return {"code": returncode, "signal": None, "text": f"exited with status {returncode}"}


def backoff_s(failures_in_row: int, cap_s: float) -> float:
    """1 s, 2 s, 4 s ... up to `cap_s`, for the 1st, 2nd, 3rd ... failure in a row."""
    return min(cap_s, 2.0 ** max(0, failures_in_row - 1))


class Supervisor:
    def __init__(self, settings: Settings, specs: Sequence[ServiceSpec], metrics: SupervisorMetrics) -> None:
        self.settings = settings
        self.state_dir = settings.state_dir
        self.metrics = metrics
        self.children = {s.name: Child(s, log_file=log_dir(self.state_dir) / f"{s.name}.log") for s in specs}
        self.wanted: list[str] = []
        # What every child's Settings() reads (they run with this process's environment), for `status`
        # and the benchmarks; secrets come out masked.
        self.child_settings = settings.model_dump(mode="json")
        self._stop = False
        self._reload = True

    # --- signals ---------------------------------------------------------
    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self._request_stop())
        signal.signal(signal.SIGINT, lambda *_: self._request_stop())
        signal.signal(signal.SIGHUP, lambda *_: self._request_reload())

    def _request_stop(self) -> None:
        self._stop = True

    def _request_reload(self) -> None:
        self._reload = True

    # --- the loop --------------------------------------------------------
    def run(self) -> None:
        log.info("supervisor %d watching %s", os.getpid(), self.state_dir)
        while not self._stop:
            if self._reload:
                self._reload = False
                self._read_wanted()
            self.tick()
            self.write_state()
            time.sleep(TICK_S)
        self.stop_all()
        self.write_state(stopping=True)

    def _read_wanted(self) -> None:
        try:
            names = json.loads(wanted_file(self.state_dir).read_text())
        except (OSError, ValueError):
            names = list(self.children)
        self.wanted = [n for n in self.children if n in names]
        for name, child in self.children.items():
            if name not in self.wanted and child.proc is not None:
                self._stop_child(child)
                child.state = "stopped"  # started again when it is wanted again
                child.detail = "stopped: not wanted"

    def tick(self) -> None:
        now = time.monotonic()
        for name in self.wanted:
            child = self.children[name]
            self._reap(child, now)
            if child.state == "starting":
                self._check_started(child, now)
            if child.state in ("waiting", "backoff", "stopped") and now >= child.next_start and self._requirements_met(child):
                self._spawn(child)
            self.metrics.service_up.labels(name).set(1 if child.state == "running" else 0)

    def _requirements_met(self, child: Child) -> bool:
        return all(self.children[r].state == "running" for r in child.spec.requires if r in self.wanted)

    def _reap(self, child: Child, now: float) -> None:
        if child.proc is None or child.proc.poll() is None:
            return
        ran_s = now - (child.started_at or now)
        exit_info = describe_exit(child.proc.returncode)
        self._failed(child, {**exit_info, "ran_s": round(ran_s, 1)}, now, healthy_run=ran_s >= HEALTHY_RUN_S)

    def _failed(self, child: Child, exit_info: dict, now: float, *, healthy_run: bool = False) -> None:
        child.proc = None
        child.failures_in_row = 1 if healthy_run else child.failures_in_row + 1
        delay = backoff_s(child.failures_in_row, self.settings.restart_backoff_max_s)
        child.last_exit = {**exit_info, "at": datetime.now(UTC).isoformat(timespec="seconds")}
        child.state = "backoff"
        child.next_start = now + delay
        child.detail = f"{exit_info['text']}; restarting in {delay:.0f}s"
        log.warning("%s %s after %.1fs; restart in %.0fs", child.spec.name, exit_info["text"],
                    exit_info.get("ran_s", 0.0), delay)

    def _check_started(self, child: Child, now: float) -> None:
        try:
            ready = child.spec.ready()
        except Exception:  # a readiness check that raises means "not yet"
            ready = False
        if ready:
            try:
                if child.spec.after_ready is not None:
                    child.spec.after_ready()
            except Exception as exc:
                log.exception("%s: set-up after start failed", child.spec.name)
                self._stop_child(child)
                self._failed(child, {"code": None, "signal": None, "text": f"set-up failed: {type(exc).__name__}: "
                                     f"{str(exc)[:200]}"}, now)
                return
            child.state = "running"
            child.detail = ""
            log.info("%s ready (pid %d)", child.spec.name, child.proc.pid if child.proc else -1)
        elif now - (child.started_at or now) > child.spec.start_timeout_s:
            self._stop_child(child, kill=True)
            self._failed(child, {"code": None, "signal": None,
                                 "text": f"not ready after {child.spec.start_timeout_s:.0f}s"}, now)

    def _spawn(self, child: Child) -> None:
        spec = child.spec
        child.log_file.parent.mkdir(parents=True, exist_ok=True)
        if child.ever_started:
            child.restarts += 1
            self.metrics.restarts.labels(spec.name).inc()
        with open(child.log_file, "ab") as out:
            stamp = datetime.now(UTC).isoformat(timespec="seconds")
            out.write(f"\n--- {stamp} supervisor starts {spec.name} (restart {child.restarts}) ---\n".encode())
            out.flush()
            try:
                child.proc = subprocess.Popen(
                    list(spec.argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=dict(spec.env) if spec.env is not None else None,
                    user=spec.user,
                    process_group=0,  # its own group: stopping it stops what it forked
                )
            except OSError as exc:
                child.ever_started = True
                self._failed(child, {"code": None, "signal": None, "text": f"could not start: {exc}"},
                             time.monotonic())
                return
        child.ever_started = True
        child.state = "starting"
        child.started_at = time.monotonic()
        child.started_wall = datetime.now(UTC).isoformat(timespec="seconds")
        child.detail = "starting"
        log.info("started %s (pid %d)", spec.name, child.proc.pid)

    def _stop_child(self, child: Child, *, kill: bool = False) -> None:
        proc = child.proc
        if proc is None:
            return
        sig = signal.SIGKILL if kill else child.spec.stop_signal
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=child.spec.stop_timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0fs: killing it", child.spec.name, child.spec.stop_timeout_s)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
        child.proc = None

    def stop_all(self) -> None:
        for name in reversed(list(self.children)):
            child = self.children[name]
            if child.proc is not None:
                log.info("stopping %s", name)
                self._stop_child(child)
            child.state = "stopped"
            self.metrics.service_up.labels(name).set(0)

    # --- state for `status` --------------------------------------------------
    def write_state(self, *, stopping: bool = False) -> None:
        services = {}
        for name, child in self.children.items():
            if name not in self.wanted and child.proc is None and not child.ever_started:
                continue
            services[name] = {
                "state": child.state,
                "pid": child.proc.pid if child.proc is not None else None,
                "restarts": child.restarts,
                "started_at": child.started_wall,
                "last_exit": child.last_exit,
                "detail": child.detail,
                "log": str(child.log_file),
                "stop_signal": int(child.spec.stop_signal),
            }
        payload = {"pid": os.getpid(), "stopping": stopping, "wanted": self.wanted, "services": services,
                   "settings": self.child_settings, "written_at": datetime.now(UTC).isoformat(timespec="seconds")}
        target = state_file(self.state_dir)
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(payload, indent=1))
        os.replace(tmp, target)  # atomic: `status` never reads half a file


def stop_orphans(state: dict) -> list[str]:
    """Stop children a dead supervisor left running (their pids from its last state), workers first."""
    stopped = []
    for name, info in reversed(list(state.get("services", {}).items())):
        pid = info.get("pid")
        if pid and pid_alive(pid):
            try:
                os.killpg(pid, info.get("stop_signal", signal.SIGTERM))
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 20
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if pid_alive(pid):
                os.killpg(pid, signal.SIGKILL)
            stopped.append(name)
    return stopped


def main() -> int:
    from .stack import service_specs

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings()
    state_dir = settings.state_dir
    (state_dir / "run").mkdir(parents=True, exist_ok=True)
    orphans = stop_orphans(read_state(state_dir))
    if orphans:
        log.warning("stopped %s left running by a supervisor that died", ", ".join(orphans))
    pid_file(state_dir).write_text(str(os.getpid()))
    metrics = SupervisorMetrics.create()
    try:
        metrics.serve(settings.supervisor_metrics_port, host=settings.metrics_host)
    except OSError as exc:  # metrics are telemetry: supervise anyway
        log.warning("supervisor metrics not served on :%d: %s", settings.supervisor_metrics_port, exc)
    supervisor = Supervisor(settings, service_specs(settings), metrics)
    supervisor.install_signal_handlers()
    try:
        supervisor.run()
    finally:
        pid_file(state_dir).unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
