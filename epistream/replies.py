"""Where a tenant hears back. Where tenant claims are checked (epistream.claims), each tenant's
replies go to its own topic, ``<answers topic>.<tenant>``, which only that tenant's principal may read
(ACLs); a question may name a reply topic only under it. Elsewhere replies go to the shared answers
topic, or to the question's reply topic."""

from __future__ import annotations

import hashlib
import re

from .errors import PermanentError

#: What Kafka takes in a topic name (contracts.TopicName); a tenant name outside it is hashed.
_TOPIC_SAFE = re.compile(r"[A-Za-z0-9._-]{1,120}")


class ForeignReplyTopic(PermanentError):
    """A question names a reply topic that is not its tenant's."""


def tenant_reply_topic(answers_topic: str, tenant: str) -> str:
    """Tenant `tenant`'s reply topic: its name when Kafka takes it (and it has no '..' that could climb
    out), else a hash of it, which the operator's onboarding prints."""
    if _TOPIC_SAFE.fullmatch(tenant) and not tenant.startswith(".") and ".." not in tenant:
        return f"{answers_topic}.{tenant}"
    return f"{answers_topic}.t-{hashlib.sha256(tenant.encode()).hexdigest()[:32]}"


def check_own_reply_topic(reply_topic: str | None, own: str) -> None:
    """Raise ForeignReplyTopic unless `reply_topic` is unset, the tenant's own topic, or one under it."""
    if reply_topic is not None and reply_topic != own and not reply_topic.startswith(own + "."):
        raise ForeignReplyTopic(f"reply_topic {reply_topic!r} is not the tenant's: its replies go to {own!r} "
                                "or a topic under it")
