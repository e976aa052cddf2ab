"""The production compose file's broker, run as its `kafka` service runs it, without a container
engine: `epistream kafka-config` writes the configuration (as the `kafka-config` service does), then
the service's own command line runs through bash, with Kafka's launch scripts standing for the same
Kafka release's classes (what /opt/kafka/bin's scripts run) and the volume's path for a directory
of the test's. The broker must format its storage with the workers' SCRAM login, start, let the
workers in over TLS, and keep out a wrong password and a client without TLS or SASL."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from pydantic import SecretStr

from epistream.infra.kafka_broker import kafka_jars
from epistream.infra.process import wait_until
from epistream.messaging.kafka_io import create_producer
from epistream.messaging.topics import ensure_topics
from epistream.ops.readiness import port_open
from epistream.settings.processes import Settings

from .conftest import ROOT

pytestmark = pytest.mark.integration

COMPOSE = ROOT / "infra" / "deploy" / "compose.yaml"
VOLUME = "/etc/epistream/kafka"  # the kafka-config volume's path in both services
PASSWORD = "compose-workers-" + os.urandom(6).hex()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch_scripts(bin_dir: Path, jars: Path) -> None:
    """/opt/kafka/bin's two scripts the service calls, as the classes they run."""
    bin_dir.mkdir(parents=True)
    for script, main in (("kafka-storage.sh", "kafka.tools.StorageTool"), ("kafka-server-start.sh", "kafka.Kafka")):
        path = bin_dir / script
        path.write_text(f'#!/bin/bash\nexec java -Xmx384m -cp "{jars}/*" {main} "$@"\n')
        path.chmod(0o755)


def _service_command(bin_dir: Path, config_dir: Path) -> str:
    """The `kafka` service's command, as compose hands it to bash ($$ is compose's escaped $)."""
    service = yaml.safe_load(COMPOSE.read_text())["services"]["kafka"]
    assert service["entrypoint"] == ["/bin/bash", "-c"]
    (command,) = service["command"]
    return command.replace("$$", "$").replace("/opt/kafka/bin", str(bin_dir)).replace(VOLUME, str(config_dir))


@pytest.fixture(scope="module")
def deployed_broker(kafka: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    work = tmp_path_factory.mktemp("deployed-kafka")
    config_dir, bin_dir, data = work / "config", work / "bin", work / "data"
    port, controller = _free_port(), _free_port()
    workers = kafka.with_overrides(
        kafka_bootstrap=f"localhost:{port}", kafka_embedded=False, kafka_controller_port=controller,
        kafka_security_protocol="SASL_SSL", kafka_username="epistream", kafka_password=SecretStr(PASSWORD),
        kafka_ssl_cafile=config_dir / "ca.crt")
    env = os.environ | {f"EPISTREAM_{name.upper()}": str(value) for name, value in {
        "kafka_security_protocol": "SASL_SSL", "kafka_username": "epistream", "kafka_password": PASSWORD,
        "kafka_controller_port": controller}.items()}
    written = subprocess.run(
        [sys.executable, "-P", "-m", "epistream.apps.cli.main", "kafka-config", str(config_dir), "--advertise",
         f"localhost:{port}", "--log-dirs", str(data)], env=env, capture_output=True, text=True, check=False)
    assert written.returncode == 0, written.stderr
    _launch_scripts(bin_dir, kafka_jars(kafka))
    log = work / "kafka.log"
    with open(log, "wb") as out:
        broker = subprocess.Popen(
            ["/bin/bash", "-c", _service_command(bin_dir, config_dir)], stdout=out, stderr=subprocess.STDOUT,
            env=os.environ | {"CLUSTER_ID": "ZXBpc3RyZWFtLWtyYWZ0MQ", "KAFKA_PASSWORD": PASSWORD},
            start_new_session=True)
    try:
        wait_until(lambda: port_open("127.0.0.1", port), timeout=120, what="the deployed broker", log_file=log)
        yield workers
    finally:
        os.killpg(broker.pid, 15)
        broker.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)


async def _produce(settings: Settings) -> str:
    producer = create_producer(settings, request_timeout_ms=10_000)
    try:
        await producer.start()
        await producer.send_and_wait(settings.topic_turns, b"{}")
        return "written"
    except Exception as exc:  # refused at login, or at the TLS handshake
        return type(exc).__name__
    finally:
        await producer.stop()


def test_the_compose_broker_lets_the_workers_in_over_tls_and_no_one_else(deployed_broker: Settings):
    asyncio.run(ensure_topics(deployed_broker))
    assert asyncio.run(_produce(deployed_broker)) == "written"
    wrong = deployed_broker.with_overrides(kafka_password=SecretStr("not-" + PASSWORD))
    assert asyncio.run(_produce(wrong)) != "written"
    plain = Settings(kafka_bootstrap=deployed_broker.kafka_bootstrap, kafka_embedded=False)
    assert asyncio.run(_produce(plain)) != "written"
