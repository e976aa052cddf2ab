"""A tenant's credentials and ACLs (epistream.ops.tenants), as pure logic: derived from the operator's
secret alone, distinct per tenant and per purpose, and granting no pattern another tenant's names fall
under. Their enforcement by a real broker: tests/integration/test_kafka_acls.py."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from epistream.ops.tenants import TenantAdminError, _bindings, add_tenant, credentials, remove_tenant
from epistream.settings.processes import Settings

SECRET = SecretStr("tenants-unit-secret-" + "z" * 32)


def _settings(**values: object) -> Settings:
    return Settings(**{"kafka_security_protocol": "SASL_SSL", "kafka_username": "workers",
                       "kafka_password": "pw", "kafka_embedded": False, "tenant_key_secret": SECRET, **values})


def test_credentials_are_derived_again_the_same_and_differ_per_tenant_and_purpose():
    settings = _settings()
    acme, again, other = credentials(settings, "acme"), credentials(settings, "acme"), credentials(settings, "other")
    assert acme == again
    assert acme.username == "tenant.acme" and acme.reply_topic == "memory.answers.acme"
    assert acme.events_topic == "memory.events.acme"
    assert acme.password != other.password and acme.signing_key != other.signing_key
    assert acme.password not in (acme.signing_key.hex(), SECRET.get_secret_value())
    assert credentials(_settings(tenant_key_secret=SecretStr("another-secret-" + "q" * 32)), "acme").password != acme.password


def test_the_acls_write_the_inputs_and_read_only_the_tenants_own_names():
    from confluent_kafka.admin import AclOperation, ResourcePatternType, ResourceType

    settings = _settings()
    creds = credentials(settings, "acme")
    granted = {(b.restype, b.name, b.resource_pattern_type, b.operation) for b in _bindings(settings, creds)}
    assert granted == {
        (ResourceType.TOPIC, "memory.turns", ResourcePatternType.LITERAL, AclOperation.WRITE),
        (ResourceType.TOPIC, "memory.questions", ResourcePatternType.LITERAL, AclOperation.WRITE),
        (ResourceType.TOPIC, "memory.answers.acme", ResourcePatternType.LITERAL, AclOperation.READ),
        (ResourceType.TOPIC, "memory.answers.acme.", ResourcePatternType.PREFIXED, AclOperation.READ),
        (ResourceType.GROUP, "tenant.acme.", ResourcePatternType.PREFIXED, AclOperation.READ),
        (ResourceType.TOPIC, "memory.events.acme", ResourcePatternType.LITERAL, AclOperation.READ),
    }
    assert {b.principal for b in _bindings(settings, creds)} == {"User:tenant.acme"}
    # No other tenant's reply topic or login falls under acme's prefixes (slugs have no dot).
    for other in ("acme2", "acme-eu", "acme.eu", "acme."):
        theirs = credentials(settings, other)
        assert not theirs.reply_topic.startswith("memory.answers.acme.")
        assert not theirs.username.startswith("tenant.acme.")


def test_onboarding_is_refused_without_a_secret_and_gives_no_login_where_the_broker_checks_none():
    with pytest.raises(TenantAdminError, match="EPISTREAM_TENANT_KEY_SECRET"):
        credentials(_settings(tenant_key_secret=None), "acme")
    plaintext = Settings(tenant_key_secret=SECRET)
    lines = credentials(plaintext, "acme").as_environment(plaintext)
    assert not any(line.startswith(("EPISTREAM_KAFKA_USERNAME", "EPISTREAM_KAFKA_PASSWORD")) for line in lines)
    with pytest.raises(TenantAdminError, match="no login to revoke"):
        remove_tenant(plaintext, "acme")
    with pytest.raises(TenantAdminError, match="SCRAM"):
        add_tenant(_settings(kafka_sasl_mechanism="PLAIN"), "acme")


def test_the_printed_environment_names_the_login_and_the_ca():
    settings = _settings(kafka_ssl_cafile="/etc/epistream/kafka-ca.crt")
    lines = credentials(settings, "acme").as_environment(settings)
    assert "EPISTREAM_KAFKA_USERNAME=tenant.acme" in lines
    assert "EPISTREAM_KAFKA_SSL_CAFILE=/etc/epistream/kafka-ca.crt" in lines
    assert not any(SECRET.get_secret_value() in line for line in lines)
