"""Every Kafka client's connection options come from the settings, one builder (no broker needed)."""

from __future__ import annotations

import ssl
from pathlib import Path

import faust
import pytest
from faust.types.auth import AuthProtocol, SASLMechanism
from pydantic import ValidationError

from epistream.errors import SettingsError
from epistream.messaging import kafka_io
from epistream.messaging.kafka_io import faust_broker_options, kafka_options
from epistream.ops.tls import embedded_tls_dir
from epistream.settings.processes import Settings, load_settings

SECRET = "pw-never-shown"
SASL_KEYS = {"sasl_mechanism", "sasl_plain_username", "sasl_plain_password"}


@pytest.fixture(autouse=True)
def _no_kafka_security_from_the_environment(monkeypatch):
    for name in ("SECURITY_PROTOCOL", "SASL_MECHANISM", "USERNAME", "PASSWORD", "SSL_CAFILE", "BOOTSTRAP"):
        monkeypatch.delenv(f"EPISTREAM_KAFKA_{name}", raising=False)


def _sasl(protocol: str = "SASL_PLAINTEXT", **values: object) -> Settings:
    """An external broker's client settings."""
    return Settings(**{"kafka_bootstrap": "broker:9093", "kafka_security_protocol": protocol,
                       "kafka_username": "indexer", "kafka_password": SECRET, "kafka_embedded": False, **values})


def test_plaintext_gives_only_the_bootstrap_servers():
    assert kafka_options(Settings(kafka_bootstrap="broker:9092")) == {"bootstrap_servers": "broker:9092"}


def test_sasl_plaintext_gives_the_login_with_the_passwords_secret_value():
    options = kafka_options(_sasl(kafka_sasl_mechanism="SCRAM-SHA-256"))
    assert options == {
        "bootstrap_servers": "broker:9093",
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "indexer",
        "sasl_plain_password": SECRET,
    }


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
@pytest.mark.parametrize("login", [{}, {"kafka_username": "indexer"}, {"kafka_password": SECRET},
                                   {"kafka_username": "indexer", "kafka_password": ""}])
def test_sasl_without_a_username_and_password_is_refused_naming_the_variables(protocol, login):
    with pytest.raises(ValidationError, match="EPISTREAM_KAFKA_USERNAME and EPISTREAM_KAFKA_PASSWORD"):
        Settings(kafka_security_protocol=protocol, **login)


def test_sasl_without_a_login_stops_load_settings_with_the_variables_named(monkeypatch):
    monkeypatch.setenv("EPISTREAM_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("EPISTREAM_KAFKA_USERNAME", "indexer")
    with pytest.raises(SettingsError, match="EPISTREAM_KAFKA_SECURITY_PROTOCOL=SASL_SSL needs EPISTREAM_KAFKA_USERNAME"):
        load_settings()


def test_sasl_ssl_adds_a_tls_context():
    options = kafka_options(_sasl("SASL_SSL", kafka_ssl_cafile=None))
    assert options["security_protocol"] == "SASL_SSL" and SASL_KEYS <= options.keys()
    assert isinstance(options["ssl_context"], ssl.SSLContext)


def test_ssl_alone_has_a_tls_context_and_no_login():
    options = kafka_options(Settings(kafka_security_protocol="SSL", kafka_embedded=False))
    assert options["security_protocol"] == "SSL" and isinstance(options["ssl_context"], ssl.SSLContext)
    assert not SASL_KEYS & options.keys()


def test_the_ca_file_reaches_the_tls_context(monkeypatch):
    seen: list[object] = []
    monkeypatch.setattr(kafka_io, "create_ssl_context", lambda *, cafile: seen.append(cafile) or ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
    kafka_options(Settings(kafka_security_protocol="SSL", kafka_ssl_cafile=Path("/etc/kafka/ca.pem")))
    assert seen == ["/etc/kafka/ca.pem"]


def test_faust_gets_the_same_login_as_sasl_credentials():
    options = faust_broker_options(_sasl(kafka_sasl_mechanism="SCRAM-SHA-512"))
    assert options["broker"] == "kafka://broker:9093"
    credentials = options["broker_credentials"]
    assert isinstance(credentials, faust.SASLCredentials)
    assert credentials.mechanism is SASLMechanism.SCRAM_SHA_512
    assert credentials.protocol is AuthProtocol.SASL_PLAINTEXT and credentials.ssl_context is None
    assert (credentials.username, credentials.password) == ("indexer", SECRET)


def test_faust_over_tls():
    sasl = faust_broker_options(_sasl("SASL_SSL"))["broker_credentials"]
    assert sasl.protocol is AuthProtocol.SASL_SSL and isinstance(sasl.ssl_context, ssl.SSLContext)
    tls = faust_broker_options(Settings(kafka_security_protocol="SSL", kafka_embedded=False))["broker_credentials"]
    assert isinstance(tls, faust.SSLCredentials) and tls.protocol is AuthProtocol.SSL


def test_faust_plaintext_gives_only_the_broker():
    assert faust_broker_options(Settings(kafka_bootstrap="broker:9092")) == {"broker": "kafka://broker:9092"}


def test_the_password_never_appears_in_repr():
    settings = _sasl("SASL_SSL")
    assert SECRET not in repr(settings) and SECRET not in str(settings)
    assert SECRET not in repr(faust_broker_options(settings)["broker_credentials"])


def test_an_embedded_broker_is_trusted_through_its_own_ca(monkeypatch, tmp_path):
    seen: list[object] = []
    monkeypatch.setattr(kafka_io, "create_ssl_context", lambda *, cafile: seen.append(cafile) or ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
    embedded = _sasl("SASL_SSL", home=tmp_path, kafka_embedded=True)
    kafka_options(embedded)
    assert seen == [str(embedded_tls_dir(embedded) / "ca.crt")]
