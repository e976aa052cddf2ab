"""A real Prometheus (Debian's ``/usr/bin/prometheus``) run as a plain process,
scraping given targets with the alert rules of ``infra/prometheus/alerts.yml``.

State lives under the given directory, as for the other embedded services:
``prometheus.yml`` (rendered), ``data/`` (the TSDB), ``run/prometheus.pid`` and
``logs/prometheus.log``. Starting is idempotent (a live pid file means running;
a changed configuration is reloaded); stopping is by pid.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from epistream.errors import ServiceError
from epistream.ops.readiness import port_open, url_ok
from epistream.settings.processes import Settings

from .process import ManagedProcess, wait_until

PROMETHEUS_BIN = Path("/usr/bin/prometheus")
RULES_FILE = Path(__file__).resolve().parent / "prometheus" / "alerts.yml"
DEFAULT_PORT = 19090  # not 9090: where Debian's own prometheus service listens
NAME = "prometheus"


def worker_targets(settings: Settings, host: str = "127.0.0.1") -> dict[str, list[str]]:
    """The workers' and the supervisor's metrics endpoints, under the job names the alert rules use."""
    return {
        "epistream-ingest": [f"{host}:{settings.ingest_metrics_port}"],
        "epistream-enrich": [f"{host}:{settings.enrich_metrics_port}"],
        "epistream-answer": [f"{host}:{settings.answer_metrics_port}"],
        "epistream-supervisor": [f"{host}:{settings.supervisor_metrics_port}"],
    }


def render_config(
    targets: Mapping[str, Sequence[str]] | Sequence[str],
    *,
    scrape_interval: str = "5s",
    rule_files: Sequence[Path] = (RULES_FILE,),
) -> str:
    """A Prometheus configuration scraping ``targets``: {job: [host:port, ...]},
    or a plain host:port list (one job, ``epistream``).

    JSON is valid YAML, so no YAML library is needed to write it.
    """
    jobs = dict(targets) if isinstance(targets, Mapping) else {"epistream": list(targets)}
    for job, hosts in jobs.items():
        for target in hosts:
            host, _, port = target.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"scrape target {target!r} of job {job!r} is not host:port")
    config = {
        "global": {
            "scrape_interval": scrape_interval,
            "scrape_timeout": scrape_interval,
            "evaluation_interval": scrape_interval,
        },
        "rule_files": [str(Path(p).resolve()) for p in rule_files],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": list(hosts)}]} for job, hosts in jobs.items()
        ],
    }
    return json.dumps(config, indent=2) + "\n"


def _process(state_dir: Path) -> ManagedProcess:
    return ManagedProcess(NAME, Path(state_dir))


def _url(port: int, path: str, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{port}{path}"


def ready(port: int) -> bool:
    return url_ok(_url(port, "/-/ready"), timeout_s=2.0)


def start(
    state_dir: Path,
    targets: Mapping[str, Sequence[str]] | Sequence[str],
    *,
    port: int = DEFAULT_PORT,
    scrape_interval: str = "5s",
    rule_files: Sequence[Path] = (RULES_FILE,),
    binary: Path = PROMETHEUS_BIN,
    retention: str = "2d",
    fresh: bool = False,
    timeout: float = 60.0,
) -> str:
    """Start Prometheus on 127.0.0.1:``port`` unless it already runs from ``state_dir``.

    An already running one gets the newly rendered configuration through ``/-/reload``.
    ``fresh`` starts a stopped one with an empty TSDB (no series left from an earlier run).
    """
    state_dir = Path(state_dir).resolve()
    proc = _process(state_dir)
    config_file = state_dir / "prometheus.yml"
    config = render_config(targets, scrape_interval=scrape_interval, rule_files=rule_files)
    state_dir.mkdir(parents=True, exist_ok=True)
    previous = config_file.read_text() if config_file.exists() else None
    config_file.write_text(config)
    if proc.pid() is not None:
        if previous != config:
            reload(port)
        wait_until(lambda: ready(port), timeout=timeout, what="Prometheus", log_file=proc.log_file)
        return f"pid {proc.pid()} on http://127.0.0.1:{port}"
    if not Path(binary).exists():
        raise ServiceError(f"{binary} not found (Debian: apt-get install prometheus, or `make system-deps`)")
    if port_open("127.0.0.1", port):
        raise ServiceError(f"port {port} is taken by a process this state directory did not start")
    if fresh:
        shutil.rmtree(state_dir / "data", ignore_errors=True)
    proc.spawn(
        [
            str(binary),
            f"--config.file={config_file}",
            f"--storage.tsdb.path={state_dir / 'data'}",
            f"--storage.tsdb.retention.time={retention}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
        ],
        cwd=state_dir,
    )
    wait_until(lambda: ready(port), timeout=timeout, what="Prometheus", log_file=proc.log_file)
    return f"pid {proc.pid()} on http://127.0.0.1:{port}"


def stop(state_dir: Path) -> bool:
    """Stop the Prometheus started from ``state_dir``; return whether one was running."""
    proc = _process(Path(state_dir).resolve())
    pid_before = proc.pid()
    stopped = proc.stop(timeout=30)
    if pid_before is not None:
        try:  # started by this process (a test): reap it rather than leave a zombie
            os.waitpid(pid_before, os.WNOHANG)
        except ChildProcessError:
            pass
    return stopped


def pid(state_dir: Path) -> int | None:
    return _process(Path(state_dir).resolve()).pid()


def start_for(settings: Settings, *, port: int = DEFAULT_PORT, scrape_interval: str = "5s") -> str:
    """Prometheus for a stack's two workers, its state under ``<home>/prometheus``."""
    return start(settings.state_dir / NAME, worker_targets(settings), port=port, scrape_interval=scrape_interval)


# --- the HTTP API ----------------------------------------------------------


def _api(port: int, path: str, params: Mapping[str, str] | None = None, *, method: str = "GET",
         timeout: float = 10.0) -> Any:
    url = _url(port, path) + ("?" + urllib.parse.urlencode(params) if params else "")
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = json.load(response)
    except urllib.error.HTTPError as exc:  # 400/422/503 carry {"status": "error", "error": ...}
        try:
            body = json.load(exc)
        except ValueError:
            raise ServiceError(f"Prometheus {path}: HTTP {exc.code}") from exc
    except OSError as exc:
        raise ServiceError(f"Prometheus on port {port} unreachable: {exc}") from exc
    if body.get("status") != "success":
        raise ServiceError(f"Prometheus {path}: {body.get('errorType')}: {body.get('error')}")
    return body["data"]


def query(port: int, promql: str) -> list:
    """An instant query: the ``result`` list, e.g. ``[{"metric": {...}, "value": [ts, "1"]}]``.

    A scalar or string result comes back as one such entry with empty labels.
    """
    data = _api(port, "/api/v1/query", {"query": promql})
    if data["resultType"] in ("scalar", "string"):
        return [{"metric": {}, "value": data["result"]}]
    return list(data["result"])


def rules(port: int) -> list:
    """The loaded rule groups (``/api/v1/rules``)."""
    return list(_api(port, "/api/v1/rules")["groups"])


def targets(port: int) -> list:
    """The active scrape targets (``/api/v1/targets``)."""
    return list(_api(port, "/api/v1/targets", {"state": "active"})["activeTargets"])


def reload(port: int) -> None:
    """Re-read the configuration file and rules (needs ``--web.enable-lifecycle``)."""
    request = urllib.request.Request(_url(port, "/-/reload"), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10):
            pass
    except OSError as exc:
        raise ServiceError(f"Prometheus reload failed: {exc}") from exc
