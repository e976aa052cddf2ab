"""The CA and broker certificate epistream.ops.tls writes: a TLS client that trusts only ca.crt completes
a handshake with a server serving broker.pem under a name the certificate lists, and refuses one under
a name it does not; keys are private to their owner; re-issuing keeps the CA."""

from __future__ import annotations

import socket
import ssl
import stat
import threading

import pytest

from epistream.ops.tls import BrokerCertificates, covers, issue_broker_certificates


def _handshake(certificates: BrokerCertificates, server_hostname: str) -> str:
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(certificates.broker)  # key and chain in one PEM file, as Kafka reads it
    client = ssl.create_default_context(cafile=str(certificates.ca))
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        connection, _ = listener.accept()
        try:
            with server.wrap_socket(connection, server_side=True) as tls:
                tls.sendall(b"ok")
        except (ssl.SSLError, OSError):
            pass  # the client refused us: its side raises

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with socket.create_connection(("127.0.0.1", port)) as raw, \
                client.wrap_socket(raw, server_hostname=server_hostname) as tls:
            return tls.recv(2).decode()
    finally:
        thread.join(timeout=5)
        listener.close()


def test_a_client_trusting_the_ca_accepts_the_broker_under_its_names(tmp_path):
    certificates = issue_broker_certificates(tmp_path, ["kafka", "127.0.0.1"])
    assert _handshake(certificates, "kafka") == "ok"
    assert _handshake(certificates, "127.0.0.1") == "ok"


def test_a_name_the_certificate_does_not_list_is_refused(tmp_path):
    certificates = issue_broker_certificates(tmp_path, ["kafka"])
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(certificates, "elsewhere")


def test_keys_are_readable_by_their_owner_only(tmp_path):
    certificates = issue_broker_certificates(tmp_path, ["kafka"])
    for private in (certificates.broker, tmp_path / "ca.key"):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600


def test_reissuing_for_a_new_host_keeps_the_ca(tmp_path):
    first = issue_broker_certificates(tmp_path, ["kafka"])
    ca = first.ca.read_bytes()
    assert covers(first, "kafka") and not covers(first, "kafka-2")
    second = issue_broker_certificates(tmp_path, ["kafka-2"])
    assert second.ca.read_bytes() == ca and covers(second, "kafka-2")
    assert _handshake(second, "kafka-2") == "ok"


def test_a_certificate_near_its_end_is_not_taken_as_covering(tmp_path):
    certificates = issue_broker_certificates(tmp_path, ["kafka"])
    assert not covers(certificates, "kafka", for_days=10_000)


def test_no_host_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="at least one host"):
        issue_broker_certificates(tmp_path, [])
