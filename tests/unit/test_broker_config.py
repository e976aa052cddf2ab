"""The secured broker's files for the production compose file (`epistream kafka-config`), rendered by
the same code as the embedded broker's (whose enforcement tests/integration/test_kafka_acls.py checks
on a real broker): what they say, and that the private ones are private."""

from __future__ import annotations

import stat

import pytest

from epistream.errors import ServiceError
from epistream.infra.kafka_broker import write_broker_config
from epistream.settings.processes import Settings

LOGIN = {"kafka_username": "epistream", "kafka_password": "workers-pw", "kafka_controller_port": 9093}


def _properties(path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)  # a later key wins, as in Kafka


def test_the_deployed_broker_listens_everywhere_speaks_sasl_ssl_and_refuses_what_no_acl_allows(tmp_path):
    settings = Settings(kafka_security_protocol="SASL_SSL", **LOGIN)
    written = write_broker_config(settings, tmp_path, advertised_host="kafka", port=9092,
                                  log_dirs=tmp_path / "data")
    server = _properties(tmp_path / "server.properties")
    assert server["listeners"] == "SASL_SSL://0.0.0.0:9092,CONTROLLER://127.0.0.1:9093"
    assert server["advertised.listeners"] == "SASL_SSL://kafka:9092"
    assert server["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert server["allow.everyone.if.no.acl.found"] == "false"
    assert server["super.users"] == "User:epistream;User:ANONYMOUS"
    assert server["ssl.keystore.location"] == str(tmp_path / "broker.pem")
    client = _properties(tmp_path / "client.properties")
    assert client["security.protocol"] == "SASL_SSL" and 'password="workers-pw"' in client["sasl.jaas.config"]
    for private in (tmp_path / "server.properties", tmp_path / "client.properties", tmp_path / "broker.pem"):
        assert private in written and stat.S_IMODE(private.stat().st_mode) == 0o600


def test_a_deployed_broker_is_never_left_unauthenticated(tmp_path):
    with pytest.raises(ServiceError, match="SASL_SSL"):
        write_broker_config(Settings(), tmp_path, advertised_host="kafka", port=9092, log_dirs=tmp_path)


def test_a_password_that_would_break_out_of_its_quotes_is_refused(tmp_path):
    settings = Settings(kafka_security_protocol="SASL_SSL", **(LOGIN | {"kafka_password": 'x" evil="y'}))
    with pytest.raises(ServiceError, match="double quote"):
        write_broker_config(settings, tmp_path, advertised_host="kafka", port=9092, log_dirs=tmp_path)


def test_an_embedded_broker_formatted_without_the_workers_login_says_how_to_proceed(tmp_path):
    from epistream.infra.kafka_broker import FORMATTED_LOGIN, _check_login_formatted

    secured = Settings(kafka_security_protocol="SASL_SSL", **LOGIN)
    (tmp_path / FORMATTED_LOGIN).write_text("")  # formatted PLAINTEXT
    with pytest.raises(ServiceError, match=r"formatted without a SCRAM login for 'epistream'.*remove"):
        _check_login_formatted(tmp_path, secured)
    _check_login_formatted(tmp_path, Settings())  # PLAINTEXT needs none
    (tmp_path / FORMATTED_LOGIN).write_text("epistream")
    _check_login_formatted(tmp_path, secured)


def test_rewriting_a_file_once_readable_by_others_makes_it_private(tmp_path):
    (tmp_path / "server.properties").write_text("old")
    (tmp_path / "server.properties").chmod(0o644)
    settings = Settings(kafka_security_protocol="SASL_SSL", **LOGIN)
    write_broker_config(settings, tmp_path, advertised_host="kafka", port=9092, log_dirs=tmp_path / "data")
    assert stat.S_IMODE((tmp_path / "server.properties").stat().st_mode) == 0o600
