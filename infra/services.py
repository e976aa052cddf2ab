"""The embedded stack, as `epistream up`, `status` and `down` see it.

`up` prepares what needs preparing once (Kafka's jars and storage, the PostgreSQL
cluster), starts the supervisor (:mod:`epistream.infra.supervisor`), which runs every
service and worker and restarts them when they die, waits for each to be ready
and then checks each with a probe that uses it (:mod:`epistream.ops.health`).
`status` joins the supervisor's view of each process (pid, restarts, how it last
exited) with the probes; `down` stops the supervisor and everything under it.

State lives under ``settings.home``: ``run/`` (supervisor state, pids, URIs),
``logs/`` (one file per service), ``kafka/``, ``pgdata/`` and ``cache/``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

from epistream.errors import ServiceError
from epistream.messaging.topics import ensure_topics
from epistream.ops.health import WORKERS, Health, Probe, probe_all
from epistream.settings.processes import Settings
from epistream.storage.db import admin_database_url, apply_migrations, embedded_uri_file, set_login_passwords

from . import supervisor as sup
from .postgres_server import pgdata_dir, stop_unsupervised
from .process import ManagedProcess, pid_alive

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 15


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    state: str  # up | busy | starting | crashed | down | stopped
    detail: str
    pid: int | None = None
    restarts: int = 0
    log_tail: list[str] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.state in (Health.UP, Health.BUSY)


def log_tail(path: Path | str, lines: int = LOG_TAIL_LINES) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            return f.read().decode("utf-8", errors="replace").splitlines()[-lines:]
    except OSError:
        return []


# --- up --------------------------------------------------------------------


def _adopt_unsupervised_postgres(settings: Settings) -> None:
    """A server left by an older `up` (started by pg_ctl, not supervised) is stopped so the supervisor owns it."""
    if sup.supervisor_pid(settings.state_dir) is None and stop_unsupervised(pgdata_dir(settings)):
        log.info("stopped an unsupervised PostgreSQL on %s", pgdata_dir(settings))


def _start_supervisor(settings: Settings, wanted: list[str]) -> int:
    run_dir = settings.state_dir / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    pid = sup.supervisor_pid(settings.state_dir)
    if pid is not None:  # `up` only adds: what already runs keeps running
        wanted = list(dict.fromkeys([*sup.read_state(settings.state_dir).get("wanted", []), *wanted]))
    sup.wanted_file(settings.state_dir).write_text(json.dumps(wanted))
    if pid is not None:
        os.kill(pid, signal.SIGHUP)  # re-read what it should run
        return pid
    if not _orphans_alive(settings):
        sup.state_file(settings.state_dir).unlink(missing_ok=True)  # a fresh start: restart counts from 0
    log_file = sup.log_dir(settings.state_dir) / "supervisor.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "EPISTREAM_HOME": str(settings.state_dir)}
    with open(log_file, "ab") as out:
        # A new session: the supervisor (and the stack) outlive the command that started them.
        proc = subprocess.Popen([sys.executable, "-P", "-m", "epistream.infra.supervisor"], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if sup.supervisor_pid(settings.state_dir) == proc.pid:
            return proc.pid
        if proc.poll() is not None:
            raise ServiceError("the supervisor exited at start:\n" + "\n".join(log_tail(log_file)))
        time.sleep(0.1)
    raise ServiceError("the supervisor did not start within 30s:\n" + "\n".join(log_tail(log_file)))


def _orphans_alive(settings: Settings) -> bool:
    state = sup.read_state(settings.state_dir)
    return any(info.get("pid") and pid_alive(info["pid"]) for info in state.get("services", {}).values())


def _crash_report(name: str, info: dict) -> str:
    last = info.get("last_exit") or {}
    lines = "\n".join(f"    {line}" for line in log_tail(info.get("log", "")))
    return f"{name} {last.get('text', 'failed')} (restarted {info.get('restarts', 0)} times)\n  last lines of " \
           f"{info.get('log')}:\n{lines}"


def _wait_running(settings: Settings, wanted: list[str], timeout_s: float) -> dict:
    """Until the supervisor reports every wanted child running; a child that keeps failing stops the wait."""
    deadline = time.monotonic() + timeout_s
    reported: set[str] = set()
    while True:
        state = sup.read_state(settings.state_dir)
        services = state.get("services", {})
        current = state.get("pid") == sup.supervisor_pid(settings.state_dir)  # not a dead supervisor's last word
        if current and all(services.get(n, {}).get("state") == "running" for n in wanted):
            return services
        for name in wanted:
            info = services.get(name, {})
            if info.get("last_exit") and name not in reported:
                reported.add(name)
                log.warning("%s", _crash_report(name, info))
            if info.get("restarts", 0) >= 3 and info.get("state") != "running":
                raise ServiceError(f"{name} keeps failing at start:\n{_crash_report(name, info)}")
        if sup.supervisor_pid(settings.state_dir) is None:
            raise ServiceError("the supervisor died:\n" + "\n".join(log_tail(sup.log_dir(settings.state_dir) /
                                                                            "supervisor.log")))
        if time.monotonic() > deadline:
            waiting = [n for n in wanted if services.get(n, {}).get("state") != "running"]
            raise ServiceError(f"not ready after {timeout_s:.0f}s: " + "; ".join(
                f"{n}: {services.get(n, {}).get('detail') or services.get(n, {}).get('state', 'not started')}"
                for n in waiting))
        time.sleep(0.25)


def up(settings: Settings, *, workers: bool = True, only: Collection[str] | None = None,
       timeout_s: float = 600.0) -> list[ServiceStatus]:
    """Start what is not running, wait until it is ready, and prove each piece with a probe.

    `only` names the services to start and probe (e.g. ``{"postgres"}`` for a test tier that needs
    nothing else); what already runs keeps running. Raises ServiceError naming every service that is
    not healthy, with its last log lines."""
    from .stack import service_specs

    if settings.database_url is None:
        _adopt_unsupervised_postgres(settings)
    # Building the specs does the slow one-time steps (Kafka's jars and storage, the PostgreSQL
    # cluster, finding the GGUF file) here in the foreground, where their errors are seen.
    specs = service_specs(settings)
    _set_up_external(settings)
    wanted = [s.name for s in specs if (workers or not s.name.startswith("worker-")) and (only is None or s.name in only)]
    started = time.perf_counter()
    if wanted:  # with every service external and no workers (a deployment's init job) nothing is supervised
        _start_supervisor(settings, wanted)
        _wait_running(settings, wanted, timeout_s)
    # Workers join their consumer groups a little after they serve /metrics: give the probes time.
    relevant = set(wanted) | {n for n in _probed_only(settings, workers=workers) if only is None or n in only}
    deadline = time.monotonic() + 120
    while True:
        rows = status(settings, settle=True, only=relevant)
        bad = [r for r in rows if r.name in relevant and not r.running]
        if not bad or time.monotonic() > deadline or any(r.state == "crashed" for r in bad):
            break
        time.sleep(1.0)
    if bad:
        raise ServiceError("unhealthy after start: " + "; ".join(_describe(r) for r in bad))
    log.info("stack up and healthy in %.1fs", time.perf_counter() - started)
    return rows


def _set_up_external(settings: Settings) -> None:
    """Topics on an external broker and migrations on an external database (the embedded ones get
    theirs from the supervisor, each time they start)."""
    if not settings.kafka_embedded:
        asyncio.run(ensure_topics(settings))
    if settings.database_admin_url is not None:
        apply_migrations(admin_database_url(settings))
        set_login_passwords(admin_database_url(settings), settings)


def _probed_only(settings: Settings, *, workers: bool) -> set[str]:
    """External services `up` checks but does not run; without workers, only what set-up needs."""
    probed = {"kafka"} if not settings.kafka_embedded else set()
    if settings.database_url is not None:
        probed.add("postgres")
    if workers:
        probed.add("embedder")
        if not settings.model_server_embedded:
            probed.add("model-server")
    return probed


def _describe(row: ServiceStatus) -> str:
    text = f"{row.name} is {row.state}: {row.detail}"
    if row.log_tail:
        text += "\n  last lines of its log:\n" + "\n".join(f"    {line}" for line in row.log_tail)
    return text


# --- status ----------------------------------------------------------------


def status(settings: Settings, *, settle: bool = False, only: Collection[str] | None = None) -> list[ServiceStatus]:
    """Each service's process (from the supervisor) joined with its probe; the supervisor first.

    `only` limits the probes to the named services."""
    state = sup.read_state(settings.state_dir)
    sup_pid = sup.supervisor_pid(settings.state_dir)
    services = state.get("services", {}) if sup_pid is not None else {}
    worker_pids = {w: services.get(f"worker-{w}", {}).get("pid") for w in WORKERS}
    slow = settings.with_overrides(health_timeout_s=max(settings.health_timeout_s, 30.0)) if settle else settings
    probes = asyncio.run(probe_all(slow, worker_pids=worker_pids, only=None if only is None else set(only)))
    rows = [ServiceStatus("supervisor", Health.UP if sup_pid else Health.DOWN,
                          f"pid {sup_pid}" if sup_pid else "not running", pid=sup_pid)]
    embedded = _embedded(settings)
    for probe in probes:
        rows.append(_join(probe, services.get(probe.service), supervised=probe.service in embedded,
                          last=state.get("services", {}).get(probe.service)))
    return rows


def _embedded(settings: Settings) -> set[str]:
    names = {f"worker-{w}" for w in WORKERS}
    if settings.kafka_embedded:
        names.add("kafka")
    if settings.database_url is None:
        names.add("postgres")
    if settings.model_server_embedded:
        names.add("model-server")
    return names


def _join(probe: Probe, info: dict | None, *, supervised: bool, last: dict | None) -> ServiceStatus:
    """One row: the probe's verdict, with what the supervisor knows of the process behind it."""
    if not supervised:
        return ServiceStatus(probe.service, probe.state, f"{probe.detail} [{probe.seconds * 1000:.0f} ms]")
    if info is None:
        # No live supervisor: the process may still run (its supervisor was killed), or have ended.
        pid = (last or {}).get("pid")
        if pid and pid_alive(pid):
            return ServiceStatus(probe.service, probe.state, f"{probe.detail} (pid {pid}, unsupervised: the "
                                 "supervisor is not running; `epistream up` restarts it)", pid=pid)
        ended = (last or {}).get("last_exit")
        detail = "not running" + (f" (last {ended['text']} at {ended['at']})" if ended else "")
        return ServiceStatus(probe.service, Health.DOWN, detail, log_tail=log_tail((last or {}).get("log", "")))
    pid, restarts = info.get("pid"), info.get("restarts", 0)
    where = f"pid {pid}, restarts {restarts}"
    if info.get("state") == "backoff":
        return ServiceStatus(probe.service, "crashed", f"{info.get('detail')} (restarts {restarts})",
                             restarts=restarts, log_tail=log_tail(info.get("log", "")))
    if info.get("state") in ("starting", "waiting"):
        return ServiceStatus(probe.service, "starting", f"{info.get('detail') or 'starting'} ({where})", pid=pid,
                             restarts=restarts)
    ended = info.get("last_exit")
    history = f"; last {ended['text']} at {ended['at']}" if ended else ""
    tail = log_tail(info.get("log", "")) if probe.state is Health.DOWN else []
    return ServiceStatus(probe.service, probe.state, f"{probe.detail} ({where}{history})", pid=pid,
                         restarts=restarts, log_tail=tail)


# --- down ------------------------------------------------------------------


def down(settings: Settings, *, timeout_s: float = 180.0) -> list[ServiceStatus]:
    from . import prometheus_server  # started separately, by `epistream prometheus up`

    rows: list[ServiceStatus] = []
    if prometheus_server.stop(settings.state_dir / prometheus_server.NAME):
        rows.append(ServiceStatus("prometheus", "stopped", "stopped"))
    state = sup.read_state(settings.state_dir)
    running = [n for n, i in state.get("services", {}).items() if i.get("pid") and pid_alive(i["pid"])]
    pid = sup.supervisor_pid(settings.state_dir)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)  # it stops its children in reverse order, then itself
        deadline = time.monotonic() + timeout_s
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        rows.append(ServiceStatus("supervisor", "stopped", "stopped"))
    else:
        rows.append(ServiceStatus("supervisor", "stopped", "was not running"))
    leftovers = sup.stop_orphans(sup.read_state(settings.state_dir))  # what a dead supervisor left behind
    leftovers += _stop_unsupervised(settings)
    for name in (*(f"worker-{w}" for w in WORKERS), "model-server", "kafka", "postgres"):
        was = name in running or name in leftovers
        rows.append(ServiceStatus(name, "stopped", "stopped" if was else "was not running"))
    embedded_uri_file(settings).unlink(missing_ok=True)
    return rows


def _stop_unsupervised(settings: Settings) -> list[str]:
    """Processes an older, unsupervised `up` left (pid files), and a server on our data directory."""
    stopped = [name for name in (*(f"worker-{w}" for w in WORKERS), "model-server", "kafka")
               if ManagedProcess(name, settings.state_dir).stop(timeout=30)]
    if stop_unsupervised(pgdata_dir(settings)):
        stopped.append("postgres")
    return stopped


# --- single services ---------------------------------------------------------


def service_pid(settings: Settings, name: str) -> int | None:
    """The pid of a supervised service or worker (None when it is not running)."""
    if sup.supervisor_pid(settings.state_dir) is None:
        return None
    pid = sup.read_state(settings.state_dir).get("services", {}).get(name, {}).get("pid")
    return pid if pid and pid_alive(pid) else None


def wait_restarted(settings: Settings, name: str, old_pid: int | None, *, timeout_s: float = 180.0) -> int:
    """Until the supervisor runs `name` again under a new pid, ready; that pid."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = sup.read_state(settings.state_dir).get("services", {}).get(name, {})
        if info.get("state") == "running" and info.get("pid") not in (None, old_pid):
            return int(info["pid"])
        time.sleep(0.2)
    raise ServiceError(f"{name} was not running again within {timeout_s:.0f}s: {info.get('detail')}")


def restart_service(settings: Settings, name: str, *, timeout_s: float = 180.0,
                    sig: signal.Signals = signal.SIGTERM) -> int:
    """Stop one supervised service (SIGTERM by default, so it shuts down cleanly; PostgreSQL reads SIGINT as a
    fast and SIGQUIT as an immediate shutdown) and wait until the supervisor has started it again; its new
    pid. The restart is counted like any other."""
    pid = signal_service(settings, name, sig)
    return wait_restarted(settings, name, pid, timeout_s=timeout_s)


def signal_service(settings: Settings, name: str, sig: signal.Signals) -> int:
    """Send `sig` to a supervised service's process group (what it forked gets it too); the pid signalled."""
    pid = service_pid(settings, name)
    if pid is None:
        raise ServiceError(f"{name} is not running under the supervisor")
    os.killpg(pid, sig)
    return pid


def pause_service(settings: Settings, name: str) -> int:
    """Freeze a supervised service (SIGSTOP): it keeps its sockets and answers nothing, like a hung host.
    The supervisor sees a live process and leaves it alone; resume_service thaws it."""
    return signal_service(settings, name, signal.SIGSTOP)


def resume_service(settings: Settings, name: str) -> int:
    return signal_service(settings, name, signal.SIGCONT)


def _set_wanted(settings: Settings, change: Callable[[list[str]], list[str]]) -> None:
    """Change what the running supervisor runs, and have it re-read that (SIGHUP)."""
    pid = sup.supervisor_pid(settings.state_dir)
    if pid is None:
        raise ServiceError("the supervisor is not running")
    wanted = change(list(sup.read_state(settings.state_dir).get("wanted", [])))
    sup.wanted_file(settings.state_dir).write_text(json.dumps(wanted))
    os.kill(pid, signal.SIGHUP)


def hold_down(settings: Settings, name: str, *, timeout_s: float = 90.0) -> None:
    """Stop a supervised service with its own stop signal and keep it stopped (the supervisor no longer
    restarts it) until bring_back: an outage of known length."""
    pid = service_pid(settings, name)
    _set_wanted(settings, lambda wanted: [n for n in wanted if n != name])
    deadline = time.monotonic() + timeout_s
    while pid is not None and pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if pid is not None and pid_alive(pid):
        raise ServiceError(f"{name} (pid {pid}) did not stop within {timeout_s:.0f}s")


def bring_back(settings: Settings, name: str, *, timeout_s: float = 180.0) -> int:
    """Have the supervisor run a held-down service again; its pid once it is ready."""
    _set_wanted(settings, lambda wanted: [*wanted, name] if name not in wanted else wanted)
    return wait_restarted(settings, name, None, timeout_s=timeout_s)
