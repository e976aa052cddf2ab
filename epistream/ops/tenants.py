"""Onboarding and offboarding a tenant's backend on a secured Kafka (SASL): its own login, the ACLs
that let that login write only turns and questions and read only its own replies, its reply topic,
and its signing key (epistream.core.claims). Everything is derived from the operator's secret, so adding
a tenant again prints the same credentials and changes nothing.

The ACLs, for tenant T (principal ``User:tenant.<slug>``, slug from epistream.messaging.tenant_topics):

* WRITE on ``memory.turns`` and ``memory.questions`` (literal): what it may produce. What it claims
  inside those records is proven by its signature, which the workers check.
* READ on ``<answers>.<slug>`` (literal) and on every topic under ``<answers>.<slug>.`` (prefixed):
  its replies. A slug has no dot, so no other tenant's topic matches either pattern.
* READ on ``<events>.<slug>`` (literal): its memory events (epistream.contracts.events).
* READ on consumer groups named ``tenant.<slug>.*`` (prefixed): its replicas may share its replies.
* Nothing else: the broker refuses what no ACL allows (``allow.everyone.if.no.acl.found=false``), so
  the shared topics (segments, answers, DLQ, forgotten) stay closed to it."""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass
from typing import cast

from epistream.core.claims import ClaimCheck
from epistream.errors import PermanentError
from epistream.messaging.kafka_io import admin_results, create_librdkafka_admin, trusted_cafile
from epistream.messaging.tenant_topics import tenant_events_topic, tenant_reply_topic, tenant_slug
from epistream.messaging.topics import retention_ms
from epistream.settings.processes import Settings

_LOGIN_CONTEXT = b"epistream kafka login v1\x00"
_ITERATIONS = 8192  # SCRAM's salted-hash rounds: Kafka's bound is 4096..16384
_TIMEOUT_S = 30.0


class TenantAdminError(PermanentError):
    """Onboarding cannot be done as asked (no secret, an unsecured broker, a broker that refused)."""


def _wait(futures: dict, what: str, *, tolerate: tuple[str, ...] = ()) -> None:
    admin_results(futures, what, error=TenantAdminError, tolerate=tolerate, timeout_s=_TIMEOUT_S)


@dataclass(frozen=True)
class TenantCredentials:
    """What a tenant's backend is given: its Kafka login, its reply topic and its signing key."""

    tenant: str
    username: str
    password: str
    reply_topic: str
    signing_key: bytes
    events_topic: str

    @property
    def consumer_group_prefix(self) -> str:
        """Consumer groups the backend may use to share its replies among its replicas: ``<username>.*``."""
        return self.username + "."

    def as_environment(self, settings: Settings) -> list[str]:
        """The backend's settings, as the lines of an environment file."""
        cafile = trusted_cafile(settings) if settings.kafka_security_protocol == "SASL_SSL" else None
        tls = ["# the broker's CA: a copy of this file where the backend runs",
               f"EPISTREAM_KAFKA_SSL_CAFILE={cafile}"] if cafile else []
        login = [f"EPISTREAM_KAFKA_SASL_MECHANISM={settings.kafka_sasl_mechanism}",
                 f"EPISTREAM_KAFKA_USERNAME={self.username}", f"EPISTREAM_KAFKA_PASSWORD={self.password}",
                 ] if authenticates(settings) else []
        return [f"EPISTREAM_KAFKA_BOOTSTRAP={settings.kafka_bootstrap}", "EPISTREAM_KAFKA_EMBEDDED=false", *tls,
                f"EPISTREAM_KAFKA_SECURITY_PROTOCOL={settings.kafka_security_protocol}", *login,
                f"# signing key (epistream.client.api: tenant_key=bytes.fromhex(...)): {self.signing_key.hex()}",
                f"# replies: {self.reply_topic} (consumer groups: {self.consumer_group_prefix}*)",
                f"# memory events: {self.events_topic}"]


def kafka_username(tenant: str) -> str:
    return f"tenant.{tenant_slug(tenant)}"


def kafka_password(secret: bytes, tenant: str) -> str:
    """Tenant `tenant`'s Kafka password: one-way from the operator's secret, and unrelated to its
    signing key (a different derivation context), so the broker's copy proves nothing about the key."""
    digest = hmac.new(secret, _LOGIN_CONTEXT + tenant.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def credentials(settings: Settings, tenant: str) -> TenantCredentials:
    check = ClaimCheck.from_settings(settings)
    if not check.enforced or settings.tenant_key_secret is None:
        raise TenantAdminError("tenants are onboarded only where claims are checked: set EPISTREAM_TENANT_KEY_SECRET")
    secret = settings.tenant_key_secret.get_secret_value().encode()
    return TenantCredentials(tenant=tenant, username=kafka_username(tenant), password=kafka_password(secret, tenant),
                             reply_topic=tenant_reply_topic(settings.topic_answers, tenant),
                             signing_key=check.key(tenant), events_topic=tenant_events_topic(settings.topic_events, tenant))


def _bindings(settings: Settings, creds: TenantCredentials) -> list:
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    principal = f"User:{creds.username}"

    def allow(resource: ResourceType, name: str, operation: AclOperation, pattern: ResourcePatternType) -> AclBinding:
        return AclBinding(resource, name, pattern, principal, "*", operation, AclPermissionType.ALLOW)

    topic, group = ResourceType.TOPIC, ResourceType.GROUP
    return [
        allow(topic, settings.topic_turns, AclOperation.WRITE, ResourcePatternType.LITERAL),
        allow(topic, settings.topic_questions, AclOperation.WRITE, ResourcePatternType.LITERAL),
        allow(topic, creds.reply_topic, AclOperation.READ, ResourcePatternType.LITERAL),
        allow(topic, creds.reply_topic + ".", AclOperation.READ, ResourcePatternType.PREFIXED),
        allow(group, creds.consumer_group_prefix, AclOperation.READ, ResourcePatternType.PREFIXED),
        allow(topic, creds.events_topic, AclOperation.READ, ResourcePatternType.LITERAL),
    ]


def authenticates(settings: Settings) -> bool:
    """Whether the broker is reached with logins, so a tenant can get its own (SCRAM) and ACLs."""
    if not settings.kafka_security_protocol.startswith("SASL_"):
        return False
    if not settings.kafka_sasl_mechanism.startswith("SCRAM-"):
        raise TenantAdminError("tenant logins are SCRAM users: set EPISTREAM_KAFKA_SASL_MECHANISM to SCRAM-SHA-512")
    return True


def add_tenant(settings: Settings, tenant: str) -> TenantCredentials:
    """Create (or confirm) tenant `tenant`'s reply topic and, where the broker authenticates clients,
    its login and ACLs; return its credentials. (On a broker that authenticates no one there is no
    login to give: its claims are still checked, but anyone who reaches the broker reads every topic.)"""
    from confluent_kafka.admin import NewTopic, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    creds = credentials(settings, tenant)
    secured = authenticates(settings)
    admin = create_librdkafka_admin(settings)
    if secured:
        mechanism = ScramMechanism[settings.kafka_sasl_mechanism.replace("-", "_")]
        _wait(admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
            creds.username, ScramCredentialInfo(mechanism, _ITERATIONS), creds.password.encode())],
            request_timeout=_TIMEOUT_S), f"creating the login {creds.username}")
    topic = NewTopic(creds.reply_topic, num_partitions=1, replication_factor=1,
                     config={"retention.ms": retention_ms(settings.topic_retention_days)})
    _wait(admin.create_topics([topic], request_timeout=_TIMEOUT_S), f"creating {creds.reply_topic}",
          tolerate=("TOPIC_ALREADY_EXISTS",))
    # Keyed by conversation, as the shared events topic; the relay sends the tenant's events here.
    events = NewTopic(creds.events_topic, num_partitions=settings.turns_partitions, replication_factor=1,
                      config={"retention.ms": retention_ms(settings.topic_retention_days)})
    _wait(admin.create_topics([events], request_timeout=_TIMEOUT_S), f"creating {creds.events_topic}",
          tolerate=("TOPIC_ALREADY_EXISTS",))
    if secured:
        _wait(admin.create_acls(_bindings(settings, creds), request_timeout=_TIMEOUT_S),
              f"granting {creds.username} its topics")
    return creds


def remove_tenant(settings: Settings, tenant: str, *, keep_replies: bool = False) -> TenantCredentials:
    """Revoke tenant `tenant`'s access: its ACLs and its login go (its open connections are refused from
    their next request); its reply topic too, unless `keep_replies`. Its memory stays: `epistream
    forget --whole-tenant` erases that. Its key cannot be revoked alone: it derives from the secret."""
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
        ScramMechanism,
        UserScramCredentialDeletion,
    )

    creds = credentials(settings, tenant)
    if not authenticates(settings):
        raise TenantAdminError(
            f"the broker is reached over {settings.kafka_security_protocol}, which authenticates no one: there is "
            "no login to revoke (a tenant's key derives from EPISTREAM_TENANT_KEY_SECRET; rotating it rotates all)")
    admin = create_librdkafka_admin(settings)
    # None matches any name or host, as confluent_kafka documents, though its signature says str.
    any_value = cast(str, None)
    everything_of = AclBindingFilter(ResourceType.ANY, any_value, ResourcePatternType.ANY, f"User:{creds.username}",
                                     any_value, AclOperation.ANY, AclPermissionType.ANY)
    _wait(admin.delete_acls([everything_of], request_timeout=_TIMEOUT_S), f"revoking {creds.username}'s ACLs")
    mechanism = ScramMechanism[settings.kafka_sasl_mechanism.replace("-", "_")]
    _wait(admin.alter_user_scram_credentials([UserScramCredentialDeletion(creds.username, mechanism)],
                                             request_timeout=_TIMEOUT_S),
          f"deleting the login {creds.username}", tolerate=("RESOURCE_NOT_FOUND",))
    if not keep_replies:
        _wait(admin.delete_topics([creds.reply_topic, creds.events_topic], request_timeout=_TIMEOUT_S),
              f"deleting {creds.reply_topic} and {creds.events_topic}", tolerate=("UNKNOWN_TOPIC_OR_PART",))
    return creds
