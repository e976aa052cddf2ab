"""Which offset a partition of `memory.questions` may commit while its questions finish out of order.

The answer worker answers a partition's questions concurrently, and publishes each reply as soon as it
is ready, in a transaction that also commits the group's offset. The offset a transaction commits is
the partition's first question not yet published (Kafka's offset says "everything before this is
done"); the questions after it that were already published ride along in the commit's metadata (the
`done` set), written in the same transaction as their replies. A new owner of the partition (after a
crash or a rebalance) starts at the committed offset and skips the offsets in `done`: each question's
reply is committed exactly once, and a fast read never waits for a slow question before it
(docs/design.md#the-answer-worker).

Pure bookkeeping, one instance per owned partition; no I/O here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

#: Marks the metadata as this format (another writer's metadata, or none, reads as an empty `done`).
METADATA_PREFIX = "epistream-done:"

#: The most offsets a partition may have between its commit point and the newest one read: the `done`
#: set must fit a commit's metadata (the broker's offset.metadata.max.bytes, 4,096 bytes by default),
#: each offset written as its distance from the commit point, at most four characters with its comma.
MAX_SPAN = 800

T = TypeVar("T")


def encode_done(commit_offset: int, done: Iterable[int]) -> str:
    """The commit's metadata: the offsets past `commit_offset` already published."""
    return METADATA_PREFIX + ",".join(str(o - commit_offset) for o in sorted(done) if o > commit_offset)


def decode_done(commit_offset: int, metadata: str | None) -> set[int]:
    """The offsets past `commit_offset` that a commit's metadata names as published (empty for metadata
    in another format, or damaged: the questions are then answered again, never lost)."""
    if not metadata or not metadata.startswith(METADATA_PREFIX):
        return set()
    try:
        gaps = [int(part) for part in metadata[len(METADATA_PREFIX):].split(",") if part]
    except ValueError:
        return set()
    return {commit_offset + g for g in gaps if g > 0}


@dataclass
class Batch(Generic[T]):
    """What one transaction publishes: finished items, the offset to commit and its metadata."""

    items: list[tuple[int, T]]
    commit_offset: int
    metadata: str


@dataclass
class CommitWindow(Generic[T]):
    """One partition's questions between its commit point and the newest offset read.

    `start` is the committed offset the partition was taken over at, `done` the offsets past it that
    the commit's metadata names as already published."""

    start: int
    done: set[int] = field(default_factory=set)
    _open: set[int] = field(default_factory=set)  # being answered
    _ready: dict[int, T] = field(default_factory=dict)  # answered, not yet in a transaction
    _publishing: set[int] = field(default_factory=set)  # in a transaction not yet committed
    _next: int = -1  # the offset after the newest one read

    def __post_init__(self) -> None:
        self._next = self.start
        self.done = {o for o in self.done if o >= self.start}

    def skips(self, offset: int) -> bool:
        """Whether the record at `offset` needs no answer: before the commit point, or already published."""
        return offset < self.start or offset in self.done

    def seen(self, offset: int) -> None:
        """A record read that needs no answer (see `skips`): the commit point may pass it."""
        self._next = max(self._next, offset + 1)

    def begin(self, offset: int) -> None:
        self._open.add(offset)
        self._next = max(self._next, offset + 1)

    def finish(self, offset: int, item: T) -> None:
        self._open.discard(offset)
        self._ready[offset] = item

    @property
    def in_flight(self) -> int:
        """Questions read and not yet published (open, ready or in a transaction)."""
        return len(self._open) + len(self._ready) + len(self._publishing)

    @property
    def span(self) -> int:
        """How many offsets lie between the commit point and the newest read (bounded by MAX_SPAN)."""
        return self._next - self.start

    def has_ready(self) -> bool:
        return bool(self._ready)

    def take(self) -> Batch[T] | None:
        """The ready items as one transaction's batch, or None when none is ready. The commit point is
        the first offset still open; everything published past it goes in the metadata."""
        if not self._ready:
            return None
        items = sorted(self._ready.items())
        self._publishing.update(self._ready)
        self._ready.clear()
        commit = min(self._open, default=self._next)
        done = {o for o in self.done | self._publishing if o >= commit}
        return Batch(items, commit, encode_done(commit, done))

    def committed(self, batch: Batch[T]) -> None:
        """`batch`'s transaction committed: its offsets are published, the commit point moved."""
        offsets = {o for o, _ in batch.items}
        self._publishing -= offsets
        self.done |= offsets
        self.start = max(self.start, self._commit_point())
        self.done = {o for o in self.done if o >= self.start}

    def _commit_point(self) -> int:
        return min(self._open | set(self._ready) | self._publishing, default=self._next)
