"""The `events` tool's cursor: where to read next in each partition of the tenant's events topic, as an
opaque string the caller passes back (`after`), bound to the topic and tenant it was made for.

Opaque so that a model copies it rather than edits it; checked whole on the way back, since it arrives
from a model: anything that is not a cursor this server made for its events is refused with the reason
(a tool error), never read from a guessed position."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping

from epistream.errors import PermanentError

PREFIX = "ev1."
#: Longer than any cursor of a topic with a few thousand partitions; a longer string is not read at all.
MAX_LENGTH = 65_536


class CursorError(PermanentError, ValueError):
    """A string that is not a cursor of this server's events, with the reason."""


def _scope(topic: str, tenant: str) -> str:
    """A short fingerprint of what the cursor's offsets mean: one topic, read for one tenant."""
    return hashlib.sha256(f"{topic}\0{tenant}".encode()).hexdigest()[:16]


def encode(offsets: Mapping[int, int], *, topic: str, tenant: str) -> str:
    """The cursor of `offsets` (partition -> the next offset to read) on `topic` for `tenant`."""
    body = {"s": _scope(topic, tenant), "o": {str(p): o for p, o in sorted(offsets.items())}}
    raw = json.dumps(body, separators=(",", ":")).encode()
    return PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(cursor: str, *, topic: str, tenant: str) -> dict[int, int]:
    """The offsets of a cursor `encode` made for this topic and tenant, or a CursorError saying why not."""
    if len(cursor) > MAX_LENGTH or not cursor.startswith(PREFIX):
        raise CursorError("not a cursor of the events tool: pass the `cursor` an earlier call returned, or none")
    payload = cursor[len(PREFIX):]
    try:
        body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (binascii.Error, ValueError):
        raise CursorError("a damaged cursor: pass the `cursor` an earlier call returned, unchanged") from None
    if not isinstance(body, dict) or set(body) != {"s", "o"} or not isinstance(body["o"], dict):
        raise CursorError("a damaged cursor: pass the `cursor` an earlier call returned, unchanged")
    if body["s"] != _scope(topic, tenant):
        raise CursorError("a cursor of another tenant's or another deployment's events: call without one to "
                          "start from now")
    offsets: dict[int, int] = {}
    for partition, offset in body["o"].items():
        if not (partition.isascii() and partition.isdigit() and type(offset) is int and offset >= 0):
            raise CursorError("a damaged cursor: pass the `cursor` an earlier call returned, unchanged")
        offsets[int(partition)] = offset
    return offsets
