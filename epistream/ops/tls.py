"""A private certificate authority and a Kafka broker certificate it signs, as PEM files: what the
embedded broker serves with EPISTREAM_KAFKA_SECURITY_PROTOCOL=SASL_SSL, and what `epistream
kafka-certs` writes for the production compose file. The clients trust the CA (ca.crt) and nothing
else; the broker reads broker.pem (its key, then its certificate chain: Kafka's PEM key store)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from epistream.settings.processes import Settings
from epistream.settings.supervision import KAFKA_CA_FILE

CA_FILE = KAFKA_CA_FILE
BROKER_FILE = "broker.pem"
_CA_KEY_FILE = "ca.key"  # kept beside, private: a new host name is signed by the same CA
_VALID_DAYS = 825  # the longest TLS clients accept for a server certificate


@dataclass(frozen=True)
class BrokerCertificates:
    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / CA_FILE

    @property
    def broker(self) -> Path:
        return self.directory / BROKER_FILE


def embedded_tls_dir(settings: Settings) -> Path:
    """Where the embedded broker keeps its CA and certificate; its clients trust this CA by default."""
    return settings.kafka_tls_dir


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "epistream"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def write_private(path: Path, data: bytes | str) -> None:
    """Write a file only its owner may read (a key, or a configuration holding a password)."""
    # 0600 from the start: never readable by others, even for a moment.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its old mode through O_CREAT
    with os.fdopen(fd, "wb") as out:
        out.write(data.encode() if isinstance(data, str) else data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    # Unencrypted PKCS#8: the form Kafka's PEM key store reads without ssl.key.password.
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _certificate_authority(directory: Path, now: dt.datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_file, key_file = directory / CA_FILE, directory / _CA_KEY_FILE
    if ca_file.exists() and key_file.exists():
        key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return x509.load_pem_x509_certificate(ca_file.read_bytes()), key
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name("epistream Kafka CA")
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    write_private(key_file, _key_pem(key))
    ca_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return certificate, key


def _subject_alternative_names(hosts: list[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def issue_broker_certificates(directory: Path, hosts: list[str]) -> BrokerCertificates:
    """Write ca.crt (creating the CA on first use) and broker.pem for `hosts` (names or IP addresses the
    clients dial) into `directory`. Re-issuing keeps the CA, so clients that trust it keep working."""
    if not hosts:
        raise ValueError("a broker certificate needs at least one host name or address")
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca, ca_key = _certificate_authority(directory, now)
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = (
        x509.CertificateBuilder().subject_name(_name(hosts[0])).issuer_name(ca.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=_VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_subject_alternative_names(hosts), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    chain = certificate.public_bytes(serialization.Encoding.PEM) + ca.public_bytes(serialization.Encoding.PEM)
    write_private(directory / BROKER_FILE, _key_pem(key) + chain)
    return BrokerCertificates(directory)


def covers(certificates: BrokerCertificates, host: str, *, for_days: int = 30) -> bool:
    """Whether the broker certificate in place names `host` and stays valid `for_days` more (a changed
    address, or one about to expire, needs a new one)."""
    if not certificates.broker.exists() or not certificates.ca.exists():
        return False
    certificate = x509.load_pem_x509_certificates(certificates.broker.read_bytes())[0]
    if certificate.not_valid_after_utc < dt.datetime.now(dt.UTC) + dt.timedelta(days=for_days):
        return False
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    try:
        return ipaddress.ip_address(host) in names.get_values_for_type(x509.IPAddress)
    except ValueError:
        return host in names.get_values_for_type(x509.DNSName)
