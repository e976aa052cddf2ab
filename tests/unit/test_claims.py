"""Tenant claims: a tenant's key signs only for that tenant, a signature binds the exact bytes, and
without a secret nothing is checked (pure logic; the workers' use of it is tested on the real stack
in tests/integration/test_tenant_claims.py)."""

from __future__ import annotations

import pytest

from epistream.core.claims import HEADER, ClaimCheck, ClaimRejected, header_pairs, signed_headers, tenant_key

SECRET = b"s" * 32
VALUE = b'{"tenant": "acme", "text": "hello"}'


def test_a_tenants_own_signature_is_accepted():
    ClaimCheck(SECRET).verify("acme", VALUE, signed_headers(tenant_key(SECRET, "acme"), VALUE))


@pytest.mark.parametrize(("headers", "why"), [
    ([], "has no epistream-sig header"),
    (signed_headers(tenant_key(SECRET, "globex"), VALUE), "is not 'acme''s signature"),  # another tenant's key
    (signed_headers(tenant_key(b"t" * 32, "acme"), VALUE), "is not 'acme''s signature"),  # another deployment's
    (signed_headers(tenant_key(SECRET, "acme"), VALUE + b" "), "is not 'acme''s signature"),  # other bytes
    ([(HEADER, b"v1=" + b"0" * 64)], "is not 'acme''s signature"),
    ([(HEADER, b"garbage")], "is not 'acme''s signature"),
])
def test_a_claim_not_proven_is_rejected_with_the_reason(headers, why):
    with pytest.raises(ClaimRejected, match=why):
        ClaimCheck(SECRET).verify("acme", VALUE, headers)


def test_keys_differ_per_tenant_and_names_cannot_be_spliced():
    assert tenant_key(SECRET, "acme") != tenant_key(SECRET, "acme2")
    assert len({tenant_key(SECRET, t) for t in ("a", "b", "ab", "a\x00b")}) == 4


def test_without_a_secret_claims_are_trusted_and_the_workers_sign_nothing():
    check = ClaimCheck(None)
    check.verify("acme", VALUE, [])
    assert not check.enforced and check.headers_for("acme", VALUE) == []
    with pytest.raises(ClaimRejected, match="EPISTREAM_TENANT_KEY_SECRET"):
        check.key("acme")


def test_headers_read_the_same_from_pairs_and_from_a_mapping():
    assert header_pairs([("a", b"1"), ("b", None)]) == (("a", b"1"),)
    assert header_pairs({"a": b"1"}) == (("a", b"1"),)
    assert header_pairs(None) == ()


def test_a_tenants_reply_topic_is_its_name_when_kafka_takes_it_and_a_hash_otherwise():
    from epistream.contracts.questions import Question
    from epistream.messaging.tenant_topics import ForeignReplyTopic, check_own_reply_topic, tenant_reply_topic

    assert tenant_reply_topic("memory.answers", "acme-eu_1") == "memory.answers.acme-eu_1"
    for unsafe in ("a b", "ü", "..", "a..b", ".x", "x" * 200, "acme.eu", "_x"):
        topic = tenant_reply_topic("memory.answers", unsafe)
        assert topic.startswith("memory.answers._") and len(topic) == len("memory.answers._") + 32
        Question(question_id="q", tenant="t", question="?", reply_topic=topic)  # a name Kafka takes
    # No tenant's topic lies under another's: "acme.eu" (a dotted name) is hashed, not acme's sub-topic.
    assert not tenant_reply_topic("memory.answers", "acme.eu").startswith(tenant_reply_topic("memory.answers", "acme") + ".")
    own = tenant_reply_topic("memory.answers", "acme")
    check_own_reply_topic(None, own)
    check_own_reply_topic(own, own)
    check_own_reply_topic(own + ".agent-7", own)
    for foreign in ("memory.answers", "memory.answers.acme2", "memory.answers.acme-x", "other.acme"):
        with pytest.raises(ForeignReplyTopic, match="is not the tenant's"):
            check_own_reply_topic(foreign, own)


def test_the_client_signs_with_a_tenants_own_key_else_for_the_tenant_the_value_names():
    from epistream.client.api import claim_headers

    own = signed_headers(tenant_key(SECRET, "acme"), VALUE)
    assert claim_headers(ClaimCheck(None), VALUE, tenant_key(SECRET, "acme")) == own  # a tenant's backend
    assert claim_headers(ClaimCheck(SECRET), VALUE) == own  # the operator's tools: the value's tenant
    assert claim_headers(ClaimCheck(None), VALUE) == []  # nothing to sign with
    assert claim_headers(ClaimCheck(SECRET), b"not json") == [] and claim_headers(ClaimCheck(SECRET), b"{}") == []
