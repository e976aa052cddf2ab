"""Where a tenant hears back, and where its memory events go. Where tenant claims are checked
(epistream.core.claims), each tenant's
replies go to its own topic, ``<answers topic>.<tenant>``, which only that tenant's principal may read
(ACLs); a question may name a reply topic only under it. Elsewhere replies go to the shared answers
topic, or to the question's reply topic. Memory events follow the same rule under the events topic."""

from __future__ import annotations

import hashlib
import re

from epistream.core.claims import ClaimCheck
from epistream.errors import PermanentError
from epistream.settings.processes import ClientSettings

#: A tenant name used as it is in topic and login names: what Kafka takes in a topic name, without dots
#: and starting with a letter or digit. No dot, so tenant A's topics (its own and those under "A.") can
#: never share a prefix with another tenant's; other names are hashed, under a leading "_" that no
#: name used as it is can have.
_NAME_AS_IS = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,119}")


class ForeignReplyTopic(PermanentError):
    """A question names a reply topic that is not its tenant's."""


def tenant_slug(tenant: str) -> str:
    """How tenant `tenant` is named in Kafka: its name when safe (see _NAME_AS_IS), else a hash of it."""
    if _NAME_AS_IS.fullmatch(tenant):
        return tenant
    return "_" + hashlib.sha256(tenant.encode()).hexdigest()[:32]


def tenant_reply_topic(answers_topic: str, tenant: str) -> str:
    """Tenant `tenant`'s reply topic, ``<answers topic>.<slug>``; `epistream tenant add` prints it."""
    return f"{answers_topic}.{tenant_slug(tenant)}"


def check_own_reply_topic(reply_topic: str | None, own: str) -> None:
    """Raise ForeignReplyTopic unless `reply_topic` is unset, the tenant's own topic, or one under it."""
    if reply_topic is not None and reply_topic != own and not reply_topic.startswith(own + "."):
        raise ForeignReplyTopic(f"reply_topic {reply_topic!r} is not the tenant's: its replies go to {own!r} "
                                "or a topic under it")


def tenant_events_topic(events_topic: str, tenant: str) -> str:
    """Tenant `tenant`'s own events topic, ``<events topic>.<slug>`` (as its reply topic)."""
    return f"{events_topic}.{tenant_slug(tenant)}"


def events_topic_for(settings: ClientSettings, tenant: str, *, own: bool | None = None) -> str:
    """Where `tenant`'s events go: its own topic where tenant claims are checked (or when `own`), else the
    shared one."""
    if own is None:
        own = ClaimCheck.from_settings(settings).enforced
    return tenant_events_topic(settings.topic_events, tenant) if own else settings.topic_events
