"""Tenant claims, proven. A record on `memory.turns` or `memory.questions` names its tenant; Kafka
does not tell a consumer who produced it, so the proof travels with the record: a header
``epistream-sig: v1=<hex>``, the HMAC-SHA256 of the record's value under the tenant's key.

A tenant's key is derived from one operator secret (``EPISTREAM_TENANT_KEY_SECRET``) and its name,
so the workers need no key store: ``epistream tenant-key T`` prints it once for T's backend, which
signs with it (``epistream.client.api`` does when given a key). A backend holding A's key can sign only
as A; a record claiming B without B's signature is dead-lettered with the reason. Without the
secret, claims are not checked (a single-tenant or trusted deployment; see the trust model in docs/operations.md)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence

from epistream.errors import PermanentError
from epistream.settings.security import SecuritySettings

HEADER = "epistream-sig"
_VERSION = b"v1="
_KEY_CONTEXT = b"epistream tenant key v1\x00"

Headers = Sequence[tuple[str, bytes]]


class ClaimRejected(PermanentError):
    """A record whose tenant claim is not proven by its signature."""


def tenant_key(secret: bytes, tenant: str) -> bytes:
    """Tenant `tenant`'s signing key: an HMAC of its name under the operator's secret (one-way, so a
    tenant's key tells nothing of the secret or of another tenant's key)."""
    return hmac.new(secret, _KEY_CONTEXT + tenant.encode(), hashlib.sha256).digest()


def signature(key: bytes, value: bytes) -> bytes:
    return _VERSION + hmac.new(key, value, hashlib.sha256).hexdigest().encode()


def signed_headers(key: bytes, value: bytes) -> list[tuple[str, bytes]]:
    """The header a producer adds to `value` to prove its tenant claim."""
    return [(HEADER, signature(key, value))]


#: Headers as a Kafka client gives them: (name, value) pairs, or a mapping.
ClientHeaders = Mapping[str, bytes | None] | Iterable[tuple[str, bytes | None]]


def header_pairs(headers: ClientHeaders | None) -> tuple[tuple[str, bytes], ...]:
    """Kafka headers as (name, value) pairs, whether a client gives them as pairs or as a mapping."""
    if not headers:
        return ()
    items = headers.items() if isinstance(headers, Mapping) else headers
    return tuple((str(name), bytes(value)) for name, value in items if value is not None)


def _signatures(headers: Iterable[tuple[str, bytes]] | None) -> list[bytes]:
    return [bytes(v) for k, v in headers or () if k == HEADER and v is not None]


class ClaimCheck:
    """Verifies tenant claims when the deployment has a tenant-key secret; otherwise accepts them."""

    def __init__(self, secret: bytes | None) -> None:
        self._secret = secret

    @classmethod
    def from_settings(cls, settings: SecuritySettings) -> ClaimCheck:
        secret = settings.tenant_key_secret
        return cls(secret.get_secret_value().encode() if secret is not None else None)

    @property
    def enforced(self) -> bool:
        return self._secret is not None

    def key(self, tenant: str) -> bytes:
        """A tenant's key, for the workers' own records (they hold the secret)."""
        if self._secret is None:
            raise ClaimRejected("no tenant-key secret is configured (EPISTREAM_TENANT_KEY_SECRET)")
        return tenant_key(self._secret, tenant)

    def headers_for(self, tenant: str, value: bytes) -> list[tuple[str, bytes]]:
        """The signature header of a record the workers produce themselves (none when not enforced)."""
        return signed_headers(self.key(tenant), value) if self.enforced else []

    def verify(self, tenant: str, value: bytes, headers: Iterable[tuple[str, bytes]] | None) -> None:
        """Raise ClaimRejected, saying why, unless `value` carries `tenant`'s signature."""
        if self._secret is None:
            return
        found = _signatures(headers)
        if not found:
            raise ClaimRejected(f"tenant claim {tenant!r} not proven: the record has no {HEADER} header")
        expected = signature(tenant_key(self._secret, tenant), value)
        if not any(hmac.compare_digest(expected, sig) for sig in found):
            raise ClaimRejected(f"tenant claim {tenant!r} not proven: the {HEADER} header is not "
                                f"{tenant!r}'s signature of this record")
