"""The faults themselves, on the embedded stack's public controls (epistream.infra.services): kill a service,
stop it cleanly or at once, keep it down for a while, freeze it, and run a second ingest worker
in the same consumer group."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from epistream.errors import ServiceError
from epistream.infra import services
from epistream.infra.process import pid_alive
from epistream.messaging.kafka_io import group_members, worker_client_id
from epistream.ops.health import worker_group
from epistream.ops.readiness import poll
from epistream.settings.processes import Settings


@dataclass
class FaultLog:
    """What a scenario did, when (seconds since the scenario started)."""

    t0: float = field(default_factory=time.monotonic)
    events: list[tuple[float, str]] = field(default_factory=list)
    ended_at: float | None = None  # monotonic: the fault is over (the service is back, the outage lifted)

    def note(self, what: str) -> None:
        at = round(time.monotonic() - self.t0, 1)
        self.events.append((at, what))
        print(f"    [{at:7.1f}s] {what}", flush=True)

    def end(self) -> None:
        self.ended_at = time.monotonic()
        self.note("fault over")


def kill9(settings: Settings, name: str, log: FaultLog, *, wait: bool = True) -> None:
    pid = services.signal_service(settings, name, signal.SIGKILL)
    log.note(f"kill -9 {name} (pid {pid})")
    if wait:
        new = services.wait_restarted(settings, name, pid, timeout_s=300)
        log.note(f"{name} running again (pid {new})")


def restart(settings: Settings, name: str, sig: signal.Signals, log: FaultLog) -> None:
    log.note(f"{sig.name} to {name}")
    new = services.restart_service(settings, name, sig=sig, timeout_s=300)
    log.note(f"{name} running again (pid {new})")


def down_for(settings: Settings, name: str, seconds: float, log: FaultLog) -> None:
    services.hold_down(settings, name)
    log.note(f"{name} stopped, kept down for {seconds:.0f}s")
    time.sleep(seconds)
    new = services.bring_back(settings, name, timeout_s=300)
    log.note(f"{name} back (pid {new})")


def paused_for(settings: Settings, name: str, seconds: float, log: FaultLog) -> None:
    pid = services.pause_service(settings, name)
    log.note(f"SIGSTOP {name} (pid {pid}) for {seconds:.0f}s")
    try:
        time.sleep(seconds)
    finally:
        services.resume_service(settings, name)
    log.note(f"SIGCONT {name}")


# --- a second ingest worker in the same group ------------------------------------------------------

#: The extra worker serves /metrics here: beside the supervised worker's port, never on it.
EXTRA_METRICS_OFFSET = 50


@dataclass
class ExtraWorker:
    """An ingest worker the supervisor does not run (so nothing restarts it once killed)."""

    proc: subprocess.Popen

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill9(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        """Clean-up whatever happened: SIGTERM, then SIGKILL."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.kill9()


def spawn_ingest_worker(settings: Settings, log: FaultLog, *, join_timeout_s: float = 240.0) -> ExtraWorker:
    """Start `epistream worker ingest` beside the supervised one, in the same group, serving /metrics at
    the supervised worker's port + EXTRA_METRICS_OFFSET; return once Kafka lists it as a member with
    partitions of its own."""
    env = {**os.environ, "EPISTREAM_HOME": str(settings.state_dir),
           "EPISTREAM_INGEST_METRICS_PORT": str(settings.ingest_metrics_port + EXTRA_METRICS_OFFSET)}
    log_file = settings.state_dir / "logs" / "worker-ingest-extra.log"
    with open(log_file, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-P", "-m", "epistream.apps.cli.main", "worker", "ingest"], env=env,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, process_group=0)
    extra = ExtraWorker(proc)
    log.note(f"another ingest worker started (pid {proc.pid}, log {log_file.name})")
    client_id = worker_client_id("ingest", pid=proc.pid)
    group = worker_group(settings, "ingest")

    def assigned() -> int:
        """Its partitions; -1 while it is no member of a stable group."""
        if not pid_alive(proc.pid):
            raise ServiceError(f"the extra ingest worker exited (see {log_file})")
        state, members = asyncio.run(group_members(settings, group))
        held = next((m.partitions for m in members if m.client_id == client_id), -1)
        return held if state == "Stable" else -1

    try:
        poll(assigned, lambda n: n > 0, what="the extra ingest worker to join and get partitions",
             timeout_s=join_timeout_s, interval_s=1.0)
    except BaseException:
        extra.stop()
        raise
    log.note(f"the extra ingest worker (pid {proc.pid}) is in the group")
    return extra
