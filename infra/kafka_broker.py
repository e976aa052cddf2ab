"""The embedded Kafka broker, prepared and described: its jars (Maven Central, cached),
its rendered ``server.properties``, its formatted KRaft storage and the command line
that runs it in the foreground. Starting, watching and stopping that command is the
caller's job.

Two release lines are supported, chosen by ``settings.kafka_version``:

* 4.x (the default): logs through log4j2, configured by ``kafka/log4j2.properties``.
* 3.x: logs through reload4j, configured by ``kafka/log4j.properties``.

Both run as one KRaft node in combined mode (broker and controller) on loopback, with a
static single-voter quorum, so storage is formatted the same way for both.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from epistream.errors import ServiceError
from epistream.models.maven import run_maven, tail
from epistream.ops.tls import BrokerCertificates, covers, embedded_tls_dir, issue_broker_certificates, write_private
from epistream.settings.processes import Settings

log = logging.getLogger(__name__)

KAFKA_DIR = Path(__file__).resolve().parent / "kafka"
POM = KAFKA_DIR / "pom.xml"
TEMPLATE = KAFKA_DIR / "server.properties.template"
LOG4J2_CONFIG = KAFKA_DIR / "log4j2.properties"  # Kafka 4.x
LOG4J_CONFIG = KAFKA_DIR / "log4j.properties"  # Kafka 3.x

# Written beside the data directory once it is formatted: storage formatted by a newer
# Kafka cannot be read by an older one, and the broker's own error says little.
FORMATTED_BY = "formatted-by"
# And the SCRAM login written into it at format time, the only time the first one can be written.
FORMATTED_LOGIN = "formatted-with-login"


@dataclass(frozen=True)
class BrokerLaunch:
    """How to run the prepared broker: ``argv`` runs it in the foreground until killed."""

    argv: list[str]
    host: str
    port: int
    log_dirs: Path


def _version_tuple(version: str) -> tuple[int, ...]:
    # "4.4.0" -> (4, 4, 0); "4.1.0-rc1" -> (4, 1, 0)
    parts: list[int] = []
    for part in version.strip().split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        parts.append(int(digits.group()))
    if not parts:
        raise ServiceError(f"kafka_version {version!r} is not a Kafka release number such as 4.4.0")
    return tuple(parts)


def kafka_line(version: str) -> int:
    """The major release of ``version``: 3 or 4."""
    major = _version_tuple(version)[0]
    if major not in (3, 4):
        raise ServiceError(f"kafka_version {version!r}: the embedded broker supports Kafka 3.x and 4.x")
    return major


def is_kafka_4(version: str) -> bool:
    return kafka_line(version) >= 4


def _split_host_port(bootstrap: str) -> tuple[str, int]:
    first = bootstrap.split(",")[0]
    host, _, port = first.rpartition(":")
    return host or "127.0.0.1", int(port)


def kafka_jars(settings: Settings) -> Path:
    """Resolve the broker's jars from Maven Central once, into the cache."""
    version = settings.kafka_version
    line = kafka_line(version)
    target = settings.state_dir / "cache" / f"kafka-{version}"
    marker = target / ".complete"
    if marker.exists():
        return target
    # A run that stopped half way leaves jars but no marker: start it over.
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    log.info("resolving Kafka %s jars from Maven Central", version)
    try:
        run_maven(["-f", str(POM), "dependency:copy-dependencies", "-DincludeScope=runtime",
                   f"-DoutputDirectory={target}", f"-Dkafka.version={version}", f"-Dkafka.line={line}"],
                  what=f"Kafka {version}")
    except ServiceError:
        shutil.rmtree(target, ignore_errors=True)
        raise
    if not any(target.glob("kafka_2.13-*.jar")):
        raise ServiceError(f"mvn resolved no kafka_2.13 jar for Kafka {version} into {target}")
    marker.touch()
    return target


def _cluster_id() -> str:
    # Kafka's own form: a random UUID as unpadded URL-safe base64 (22 characters), never
    # starting with '-' (it would read as an option on the command line).
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def _logging_property(version: str) -> str:
    if is_kafka_4(version):
        return f"-Dlog4j2.configurationFile={LOG4J2_CONFIG.as_uri()}"
    return f"-Dlog4j.configuration={LOG4J_CONFIG.as_uri()}"


def _check_formatted_by(kafka_dir: Path, version: str) -> None:
    stamp = kafka_dir / FORMATTED_BY
    try:
        formatted_by = stamp.read_text().strip()
    except OSError:
        return  # formatted before the stamp existed: nothing to compare
    if formatted_by and _version_tuple(formatted_by)[:2] > _version_tuple(version)[:2]:
        raise ServiceError(
            f"{kafka_dir / 'data'} was formatted by Kafka {formatted_by}, which Kafka {version} cannot read; "
            f"set kafka_version back to {formatted_by} or remove {kafka_dir} (its topics are lost)"
        )


@dataclass(frozen=True)
class BrokerLayout:
    """Where a single-node broker listens and keeps its data: the embedded one on loopback, or the
    production compose file's (`epistream kafka-config`) on every interface, advertised by name."""

    listen_host: str
    advertised_host: str
    port: int
    controller_port: int
    log_dirs: Path
    tls_dir: Path  # its CA and certificate, with SASL_SSL

    @property
    def controller_host(self) -> str:
        # The controller listener never leaves loopback: one node, and no SASL on it.
        return "127.0.0.1" if self.listen_host in ("0.0.0.0", "::") else self.listen_host


def _check_login_formatted(kafka_dir: Path, settings: Settings) -> None:
    """A broker turned to SASL after its storage was formatted has no login for the workers: say so
    and how to proceed, rather than let every client fail authentication."""
    if not _sasl(settings):
        return
    stamp = kafka_dir / FORMATTED_LOGIN
    written = stamp.read_text().strip() if stamp.exists() else ""
    if written != settings.kafka_username:
        raise ServiceError(
            f"{kafka_dir / 'data'} was formatted without a SCRAM login for {settings.kafka_username!r} "
            f"({'none' if not written else repr(written)} was written), and Kafka adds the first login only "
            f"when storage is formatted: remove {kafka_dir} (its topics are lost) to start the broker afresh "
            f"with EPISTREAM_KAFKA_SECURITY_PROTOCOL={settings.kafka_security_protocol}, or use another "
            "EPISTREAM_HOME"
        )


def _sasl(settings: Settings) -> bool:
    return settings.kafka_security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")


def _tls_properties(layout: BrokerLayout) -> list[str]:
    """SASL_SSL: the client listener serves a certificate signed by its own CA (epistream.ops.tls),
    re-issued when the broker's address changes or it nears expiry; clients trust that CA."""
    certificates = BrokerCertificates(layout.tls_dir)
    if not covers(certificates, layout.advertised_host):
        certificates = issue_broker_certificates(certificates.directory, [layout.advertised_host, "localhost"])
    # The broker also dials itself on this listener (inter-broker), so it trusts the same CA.
    return ["ssl.keystore.type=PEM", f"ssl.keystore.location={certificates.broker}",
            "ssl.truststore.type=PEM", f"ssl.truststore.location={certificates.ca}"]


def _security_properties(settings: Settings, layout: BrokerLayout) -> str:
    """With SASL_PLAINTEXT or SASL_SSL: the client listener speaks SASL (SCRAM), an authorizer checks
    every request against ACLs and refuses what none allows, and the workers' user is the super user.
    The controller listener stays on loopback without SASL (its principal, ANONYMOUS, is the broker
    itself)."""
    protocol = settings.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return ""
    if not _sasl(settings) or not settings.kafka_sasl_mechanism.startswith("SCRAM-"):
        raise ServiceError(f"EPISTREAM_KAFKA_SECURITY_PROTOCOL={protocol} with "
                           f"EPISTREAM_KAFKA_SASL_MECHANISM={settings.kafka_sasl_mechanism}: epistream's broker "
                           "serves PLAINTEXT, or SASL_PLAINTEXT or SASL_SSL with SCRAM")
    mechanism = settings.kafka_sasl_mechanism
    jaas = ("org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{settings.kafka_username}" password="{_password(settings)}";')
    return "\n".join([
        "", f"# Authentication and authorization (EPISTREAM_KAFKA_SECURITY_PROTOCOL={protocol}): these",
        "# override the PLAINTEXT listener above (a later key wins).",
        f"listeners={protocol}://{layout.listen_host}:{layout.port},"
        f"CONTROLLER://{layout.controller_host}:{layout.controller_port}",
        f"advertised.listeners={protocol}://{layout.advertised_host}:{layout.port}",
        f"inter.broker.listener.name={protocol}",
        f"listener.security.protocol.map={protocol}:{protocol},CONTROLLER:PLAINTEXT",
        f"sasl.enabled.mechanisms={mechanism}",
        f"sasl.mechanism.inter.broker.protocol={mechanism}",
        f"listener.name.{protocol.lower()}.{mechanism.lower()}.sasl.jaas.config={jaas}",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found=false",
        f"super.users=User:{settings.kafka_username};User:ANONYMOUS",
        *(_tls_properties(layout) if protocol == "SASL_SSL" else []),
        "",
    ])


def _password(settings: Settings) -> str:
    assert settings.kafka_password is not None  # the settings refuse SASL without a login
    password = settings.kafka_password.get_secret_value()
    if any(ch in password for ch in '"\\\n'):
        # It is quoted in the JAAS line and in kafka-storage's --add-scram: no quote or backslash.
        raise ServiceError("EPISTREAM_KAFKA_PASSWORD may not hold a double quote, a backslash or a newline")
    return password


def render_server_properties(settings: Settings, layout: BrokerLayout) -> str:
    """The broker's whole ``server.properties``: the template, then the security settings."""
    return TEMPLATE.read_text().format(
        host=layout.listen_host, advertised_host=layout.advertised_host, port=layout.port,
        controller_host=layout.controller_host,
        controller_port=layout.controller_port, log_dirs=layout.log_dirs,
    ) + _security_properties(settings, layout)


def write_broker_config(settings: Settings, directory: Path, *, advertised_host: str, port: int, log_dirs: Path,
                        owner: int | None = None) -> list[Path]:
    """A secured broker's files for a deployment that runs Kafka's own image (infra/deploy/compose.yaml):
    ``server.properties`` (listening on every interface, advertised as `advertised_host`), its CA and
    certificate, and ``client.properties`` (the workers' login, for the image's own tools). The
    broker's private files are given to `owner`, the image's user."""
    if settings.kafka_security_protocol != "SASL_SSL":
        raise ServiceError("a deployed broker is configured with EPISTREAM_KAFKA_SECURITY_PROTOCOL=SASL_SSL "
                           f"(not {settings.kafka_security_protocol}): clients log in, over TLS")
    layout = BrokerLayout(listen_host="0.0.0.0", advertised_host=advertised_host, port=port,
                          controller_port=settings.kafka_controller_port, log_dirs=log_dirs, tls_dir=directory)
    directory.mkdir(parents=True, exist_ok=True)
    server, client = directory / "server.properties", directory / "client.properties"
    write_private(server, render_server_properties(settings, layout))
    certificates = BrokerCertificates(directory)
    write_private(client, "\n".join([
        "security.protocol=SASL_SSL", f"sasl.mechanism={settings.kafka_sasl_mechanism}",
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{settings.kafka_username}" password="{_password(settings)}";',
        "ssl.truststore.type=PEM", f"ssl.truststore.location={certificates.ca}", ""]))
    private = [server, client, certificates.broker]
    if owner is not None:
        for path in private:
            os.chown(path, owner, -1)
    return [*private, certificates.ca]


def scram_at_format(settings: Settings) -> list[str]:
    """The workers' SCRAM credentials, written into the metadata when storage is formatted (KIP-900):
    the only way to create the first SCRAM user of a KRaft cluster."""
    if not _sasl(settings):
        return []
    return ["--add-scram", f'{settings.kafka_sasl_mechanism}=[name={settings.kafka_username},'
                           f'password="{_password(settings)}"]']


def prepare_broker(settings: Settings) -> BrokerLaunch:
    """Resolve the jars, render ``server.properties``, format storage on first use."""
    host, port = _split_host_port(settings.kafka_bootstrap)
    version = settings.kafka_version
    kafka_dir = settings.state_dir / "kafka"
    data_dir = kafka_dir / "data"
    formatted = (data_dir / "meta.properties").exists()
    if formatted:
        _check_formatted_by(kafka_dir, version)
        _check_login_formatted(kafka_dir, settings)

    jars = kafka_jars(settings)
    java = shutil.which("java") or "java"
    classpath = f"{jars}/*"
    logging_property = _logging_property(version)
    kafka_dir.mkdir(parents=True, exist_ok=True)
    config = kafka_dir / "server.properties"
    layout = BrokerLayout(listen_host=host, advertised_host=host, port=port,
                          controller_port=settings.kafka_controller_port, log_dirs=data_dir,
                          tls_dir=embedded_tls_dir(settings))
    write_private(config, render_server_properties(settings, layout))  # it may hold the workers' password

    if not formatted:
        result = subprocess.run(
            [
                java, logging_property, "-cp", classpath, "kafka.tools.StorageTool", "format",
                "-t", _cluster_id(), "-c", str(config), "--ignore-formatted", *scram_at_format(settings),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise ServiceError(f"formatting Kafka {version} storage in {data_dir} failed:\n" + tail(result.stdout))
        (kafka_dir / FORMATTED_BY).write_text(version + "\n")
        (kafka_dir / FORMATTED_LOGIN).write_text((settings.kafka_username or "") if _sasl(settings) else "")

    argv = [
        java, f"-Xmx{settings.kafka_heap}", f"-Xms{settings.kafka_heap}", "-XX:+UseG1GC",
        logging_property, "-cp", classpath, "kafka.Kafka", str(config),
    ]
    return BrokerLaunch(argv=argv, host=host, port=port, log_dirs=data_dir)
