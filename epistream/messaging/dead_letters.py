"""Dead letters: the one way a record is given up on. A letter keeps where the record came from, its
bytes (cut to fit one Kafka message, with the whole original's size and SHA-256) and why it could
not be used; it is counted, logged and sent keyed as the record was."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from epistream.contracts.dead_letters import DeadLetter

if TYPE_CHECKING:  # the metrics are the workers'
    from epistream.core.metrics import Metrics

log = logging.getLogger(__name__)


class SourceRecord(Protocol):
    """Where a record came from and its bytes: a Faust event's message as `epistream.pipeline.records.RawRecord`,
    or an aiokafka `ConsumerRecord`, as they are."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...


#: Sends one dead letter (its key, its bytes) to the dead-letter topic: a Faust topic's `send`,
#: or an aiokafka producer's `send_and_wait` bound to the topic.
DeadLetterSend = Callable[[bytes | None, bytes], Awaitable[object]]


#: The producers' request limit unless told otherwise: Faust's default (aiokafka's is 1 MiB), the smaller.
DEFAULT_MAX_REQUEST_SIZE = 1_000_000
#: A letter's Kafka key is the original key up to this size, else the key's SHA-256 (hex).
LETTER_KEY_MAX = 16_384


def letter_key(key: bytes | None) -> bytes | None:
    """The Kafka key a letter is sent with: the record's own, unless it is too big to repeat."""
    if key is None or len(key) <= LETTER_KEY_MAX:
        return key
    return hashlib.sha256(key).hexdigest().encode()


def record_size(key: bytes | None, value: bytes) -> int:
    """A message's size as the producer estimates it, the one it checks against max_request_size."""
    return DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, [])


def _prefix_fitting(raw: bytes, room: int) -> bytes:
    """The longest prefix of `raw` whose base64 takes at most `room` characters."""
    return raw[: max(0, room) // 4 * 3]


def build_dead_letter(
    *,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    stage: str,
    error: BaseException,
    attempts: int = 1,
    max_request_size: int = DEFAULT_MAX_REQUEST_SIZE,
) -> DeadLetter:
    """The letter for a record, cut to fit one message under `max_request_size`: the value (then the
    key) is shortened to a prefix, and the size and SHA-256 of the whole original are kept."""
    letter = DeadLetter(
        topic=topic,
        partition=partition,
        offset=offset,
        key_b64=DeadLetter.encode(key),
        value_b64=DeadLetter.encode(value),
        stage=stage,
        error_class=type(error).__name__,
        error_message=str(error)[:2000],
        attempts=attempts,
        failed_at=datetime.now(UTC),
        **_fingerprint("value", value),
        **_fingerprint("key", key),
    )
    sent_key = letter_key(key)
    if record_size(sent_key, letter.to_bytes()) <= max_request_size:
        return letter
    # Too big: measure the letter without the original bytes, then give them what room is left.
    for part, raw in (("value", value), ("key", key)):
        if raw is None:
            continue
        bare = letter.model_copy(update={f"{part}_b64": "", f"{part}_truncated": True})
        room = max_request_size - record_size(sent_key, bare.to_bytes())
        letter = bare.model_copy(update={f"{part}_b64": DeadLetter.encode(_prefix_fitting(raw, room))})
        if record_size(sent_key, letter.to_bytes()) <= max_request_size:
            return letter
    return letter


def _fingerprint(part: str, raw: bytes | None) -> dict[str, object]:
    if raw is None:
        return {}
    return {f"{part}_size": len(raw), f"{part}_sha256": hashlib.sha256(raw).hexdigest()}


async def dead_letter(
    send: DeadLetterSend,
    metrics: Metrics,
    record: SourceRecord,
    *,
    stage: str,
    error: BaseException,
    attempts: int = 1,
    max_request_size: int = DEFAULT_MAX_REQUEST_SIZE,
) -> DeadLetter:
    """The one way a record is given up on: its dead letter is built (cut to fit one message under the
    producer's `max_request_size`), counted, logged and sent (keyed as the record was, so the
    dead-letter topic keeps each key's letters together)."""
    letter = build_dead_letter(
        topic=record.topic, partition=record.partition, offset=record.offset, key=record.key, value=record.value,
        stage=stage, error=error, attempts=attempts, max_request_size=max_request_size,
    )
    metrics.dead_letters.labels(letter.stage, letter.error_class).inc()
    log.warning(
        "dead-lettered %s[%d]@%d at %s: %s", letter.topic, letter.partition, letter.offset, letter.stage, letter.error_class
    )
    await send(letter_key(record.key), letter.to_bytes())
    return letter
