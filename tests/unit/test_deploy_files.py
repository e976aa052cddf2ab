"""The deployment files, checked offline: compose, Prometheus config and rules,
the Grafana dashboard, against the settings and metrics the code defines."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from epistream.core.metrics import Metrics, SupervisorMetrics
from epistream.infra import prometheus_server
from epistream.settings.processes import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "infra" / "deploy"
PROMETHEUS = ROOT / "infra" / "prometheus"
GRAFANA = ROOT / "infra" / "grafana"
COMPOSE = DEPLOY / "compose.yaml"
DASHBOARD = GRAFANA / "epistream-dashboard.json"
ALERTS = PROMETHEUS / "alerts.yml"

SERVICES = {"kafka-config", "kafka", "postgres", "assistant-1", "assistant-2", "init", "indexer", "answerer", "prometheus", "grafana"}
WORKERS = {"indexer": ["worker", "ingest"], "answerer": ["worker", "answer"]}
SETTING_VARS = {f"EPISTREAM_{name.upper()}" for name in Settings.model_fields}
METRIC_NAME = re.compile(r"\bepistream_[a-z0-9_]+\b")
SETTING_VAR = re.compile(r"\bEPISTREAM_[A-Z0-9_]+\b")
PROMTOOL = shutil.which("promtool")


def _load_yaml(path: Path):
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def compose() -> dict:
    return _load_yaml(COMPOSE)


def _environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # the KEY=VALUE list form
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def _interpolate(value: str) -> str:
    """Compose's ${VAR:-default} / ${VAR-default} / ${VAR:?error} / ${VAR}, with nothing set."""

    def one(match: re.Match) -> str:
        operator, rest = match.group(2) or "", match.group(3) or ""
        if operator.endswith("?"):
            return "x" * 40  # required: any value (long enough for a secret)
        return rest if operator.endswith("-") else ""

    return re.sub(r"\$\{(\w+)(:?[-?])?([^}]*)\}", one, value)


def metric_names() -> set[str]:
    """Every series name the registry can expose, with the suffixes Prometheus sees."""
    names = set()
    families = [*Metrics.create().registry.collect(), *SupervisorMetrics.create().registry.collect()]
    for family in families:
        if family.type == "counter":
            names |= {f"{family.name}_total", f"{family.name}_created"}
        elif family.type == "histogram":
            names |= {family.name + s for s in ("_bucket", "_sum", "_count", "_created")}
        else:
            names.add(family.name)
    return names


# --- compose ---------------------------------------------------------------


def test_compose_declares_the_services(compose):
    assert SERVICES <= set(compose["services"])


def test_compose_passes_only_real_settings(compose):
    passed = set()
    for name, service in compose["services"].items():
        for key in _environment(service):
            if key.startswith("EPISTREAM_"):
                passed.add(key)
                assert key in SETTING_VARS, f"{name}: {key} is not a field of epistream.settings.Settings"
    assert "EPISTREAM_DATABASE_URL" in passed and "EPISTREAM_KAFKA_BOOTSTRAP" in passed


def test_every_epistream_variable_named_in_deploy_files_exists():
    files = [*DEPLOY.rglob("*"), *PROMETHEUS.glob("*.yml")]
    for path in (p for p in files if p.is_file()):
        for var in SETTING_VAR.findall(path.read_text()):
            assert var in SETTING_VARS, f"{path.relative_to(ROOT)} names {var}, which is not a setting"


def test_workers_are_configured_only_by_epistream_variables(compose):
    for name, argv in WORKERS.items():
        service = compose["services"][name]
        assert service["command"] == argv
        assert "env_file" not in service
        env = _environment(service)
        assert env and all(key.startswith("EPISTREAM_") for key in env), sorted(env)
        assert env["EPISTREAM_KAFKA_EMBEDDED"] == "false"
        assert env["EPISTREAM_MODEL_SERVER_EMBEDDED"] == "false"
        assert service["build"]["dockerfile"] == "infra/deploy/Dockerfile"
        assert (COMPOSE.parent / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
        # The defaults compose fills in are values the settings accept.
        values = {k.removeprefix("EPISTREAM_").lower(): _interpolate(v) for k, v in env.items()}
        settings = Settings(**values)
        assert settings.database_url is not None
        assert not settings.kafka_embedded and not settings.model_server_embedded


def test_every_long_running_service_restarts_and_workers_check_themselves_with_the_probes(compose):
    for name, service in compose["services"].items():
        if name not in ("init", "kafka-config"):  # the one-shot steps
            assert service.get("restart") == "unless-stopped", name
    for name, worker in (("indexer", "worker-ingest"), ("answerer", "worker-answer")):
        test = compose["services"][name]["healthcheck"]["test"]
        assert test[:3] == ["CMD", "epistream", "health"] and worker in test and "kafka" in test, test


def test_worker_image():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim", dockerfile, re.M)
    assert 'ENTRYPOINT ["epistream"]' in dockerfile
    assert "pip install" in dockerfile


def test_infrastructure_services(compose):
    services = compose["services"]
    assert services["kafka"]["image"] == "apache/kafka:4.4.0"
    assert "CLUSTER_ID" in _environment(services["kafka"])
    postgres_dockerfile = (COMPOSE.parent / services["postgres"]["build"] / "Dockerfile").read_text()
    assert "FROM ${AGE_IMAGE}" in postgres_dockerfile and "ARG AGE_IMAGE=apache/age:" in postgres_dockerfile
    assert "pgvector" in postgres_dockerfile
    for name in ("assistant-1", "assistant-2"):
        service = services[name]
        assert service["image"].startswith("vllm/vllm-openai:")
        assert "--enable-prefix-caching" in service["command"]
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert any("gpu" in d["capabilities"] for d in devices)
    assert services["assistant-1"]["deploy"] != services["assistant-2"]["deploy"], "one GPU per replica"


def test_bind_mounts_exist(compose):
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0] if isinstance(volume, str) else volume.get("source", "")
            if source.startswith("."):
                assert (COMPOSE.parent / source).exists(), f"{name} mounts missing {source}"


def test_compose_prometheus_uses_the_mounted_config(compose):
    command = compose["services"]["prometheus"]["command"]
    config = next(arg.split("=", 1)[1] for arg in command if arg.startswith("--config.file="))
    assert config == "/etc/prometheus/epistream/prometheus.compose.yml"
    assert (PROMETHEUS / "prometheus.compose.yml").is_file()


# --- Prometheus ------------------------------------------------------------


@pytest.mark.parametrize("name", ["prometheus.yml", "prometheus.compose.yml"])
def test_prometheus_config(name):
    config = _load_yaml(PROMETHEUS / name)
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert {"epistream-ingest", "epistream-answer"} <= jobs
    assert config["rule_files"] == ["alerts.yml"]
    if name == "prometheus.yml":
        assert config["global"]["scrape_interval"] == "5s"


def test_alert_rules_are_well_formed():
    rules = [rule for group in _load_yaml(ALERTS)["groups"] for rule in group["rules"]]
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    exprs = " ".join(rule["expr"] for rule in rules)
    for needed in ("deriv(epistream_consumer_lag_messages", "epistream_dlq_messages_total",
                   'outcome=~"failed|invalid_output"', "epistream_enrich_produce_to_facts_seconds_bucket",
                   "epistream_segments_closed_total", "up{"):
        assert needed in exprs


def test_alert_metrics_exist():
    known = metric_names()
    for group in _load_yaml(ALERTS)["groups"]:
        for rule in group["rules"]:
            for name in METRIC_NAME.findall(rule["expr"]):
                assert name in known, f"{rule['alert']} uses {name}, not defined in epistream/core/metrics.py"


def test_rendered_config_for_given_targets(tmp_path):
    text = prometheus_server.render_config(
        {"epistream-ingest": ["127.0.0.1:29101"], "epistream-answer": ["127.0.0.1:29102"]}, scrape_interval="1s"
    )
    config = yaml.safe_load(text)
    assert config["global"]["scrape_interval"] == "1s"
    assert config["rule_files"] == [str(ALERTS)]
    assert {j["job_name"]: j["static_configs"][0]["targets"] for j in config["scrape_configs"]} == {
        "epistream-ingest": ["127.0.0.1:29101"], "epistream-answer": ["127.0.0.1:29102"]}
    plain = yaml.safe_load(prometheus_server.render_config(["localhost:9101"]))
    assert plain["scrape_configs"][0]["static_configs"][0]["targets"] == ["localhost:9101"]
    with pytest.raises(ValueError):
        prometheus_server.render_config(["no-port"])
    if PROMTOOL:
        path = tmp_path / "prometheus.yml"
        path.write_text(text)
        subprocess.run([PROMTOOL, "check", "config", str(path)], check=True, capture_output=True)


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is absent (Debian package `prometheus`; `make system-deps`)")
@pytest.mark.parametrize(
    "args",
    [
        ["check", "config", "prometheus.yml"],
        ["check", "config", "prometheus.compose.yml"],
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts_test.yml"],
    ],
    ids=lambda args: " ".join(args),
)
def test_promtool(args):
    result = subprocess.run([PROMTOOL, *args], cwd=PROMETHEUS, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# --- Grafana ---------------------------------------------------------------


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _panels(panels: list) -> list:
    out = []
    for panel in panels:
        out.append(panel)
        out.extend(_panels(panel.get("panels", [])))
    return out


def test_dashboard_panels(dashboard):
    panels = _panels(dashboard["panels"])
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert 36 <= dashboard["schemaVersion"] <= 41
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    titles = {p["title"] for p in panels}
    for wanted in ("Ingest turns/s by outcome", "Produce to searchable (p50 / p95)",
                   "Segments closed vs enriched (per second)", "Produce to facts (p50 / p95)",
                   "Dead letters/s by stage and error class", "Consumer lag by group and topic",
                   "Model requests/s by role, endpoint and outcome", "Tokens/s by role",
                   "Model latency p95 by role", "Answers/s by mode and outcome", "Answer latency p95 by mode"):
        assert wanted in titles
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs))


def test_dashboard_metrics_exist(dashboard):
    known = metric_names()
    used = set()
    for panel in _panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            for name in METRIC_NAME.findall(target["expr"]):
                used.add(name)
                assert name in known, f"panel {panel['title']!r} uses {name}, not defined in epistream/core/metrics.py"
    assert len(used) >= 10


def test_grafana_provisioning():
    datasources = _load_yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")
    assert datasources["datasources"][0]["type"] == "prometheus"
    providers = _load_yaml(GRAFANA / "provisioning" / "dashboards" / "epistream.yml")
    assert providers["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_the_model_server_is_built_portably_and_the_same_way_everywhere():
    """A native build emits AVX-512/AMX code that a VM's OS may not enable: it died with a general
    protection fault at the first completion. The Makefile and the image build the same baseline."""
    makefile = (ROOT / "Makefile").read_text()
    flags = re.search(r"^GGML_PORTABLE_FLAGS\s*=\s*(.+)$", makefile, re.M).group(1).split()
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    image_flags = re.search(r'CMAKE_ARGS="([^"]+)"', dockerfile).group(1).split()
    assert flags == image_flags
    assert "-DGGML_NATIVE=OFF" in flags
    assert not [f for f in flags if re.search(r"AVX512|AMX", f) and f.endswith("=ON")]
    assert {"-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"} <= set(flags)


def _properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


def test_brokers_never_create_topics_and_support_transactions(compose):
    """A question's reply_topic must never create a topic: both brokers refuse to auto-create, and the
    answer worker's transactions work on one broker (the transaction log needs one replica). Both run
    on the configuration rendered from one template (epistream.infra.kafka_broker)."""
    embedded = _properties((ROOT / "infra" / "kafka" / "server.properties.template").read_text())
    assert embedded["auto.create.topics.enable"] == "false"
    assert embedded["transaction.state.log.replication.factor"] == "1"
    assert embedded["transaction.state.log.min.isr"] == "1"
    services = compose["services"]
    assert services["kafka-config"]["command"][0] == "kafka-config"
    assert "kafka-server-start.sh /etc/epistream/kafka/server.properties" in services["kafka"]["command"][0]
    assert services["kafka"]["depends_on"]["kafka-config"]["condition"] == "service_completed_successfully"


def test_every_kafka_client_logs_in_over_tls(compose):
    """The deployed broker authenticates everyone: every epistream process logs in with SCRAM over TLS
    and trusts the broker's CA, and the workers' Kafka password is required, never defaulted."""
    for name, service in compose["services"].items():
        env = _environment(service)
        if not any(key.startswith("EPISTREAM_") for key in env):
            continue
        assert env["EPISTREAM_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL", name
        assert env["EPISTREAM_KAFKA_SSL_CAFILE"] == "/etc/epistream/kafka/ca.crt", name
        assert env["EPISTREAM_KAFKA_PASSWORD"].startswith("${KAFKA_PASSWORD:?"), name
