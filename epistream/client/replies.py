"""Replies routed to the calls that wait for them: one future per question id, filled by the one reader
of a long-lived client (epistream/client/session.py), and, for a call that asked for progress, a bounded
queue of its progress records. Pure bookkeeping, no Kafka: nothing here grows past the calls waiting
now, since a future and a queue leave on the reply, the timeout or the cancellation of their call."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Sequence

from epistream.errors import PermanentError


class ClientClosed(PermanentError):
    """A call on a client that was closed, or that was waiting for its reply when it closed."""


def pick_partition(partitions: Sequence[int]) -> int:
    """The reply partition a client reads: any one, at random, so clients spread over the partitions."""
    if not partitions:
        raise ValueError("a topic without partitions")
    return secrets.choice(list(partitions))


#: The progress records a call holds unread; past it, later ones are dropped (progress is best effort).
PROGRESS_BACKLOG = 100


async def reply_with_progress(future: asyncio.Future[bytes], updates: asyncio.Queue[bytes],
                              on_update: Callable[[bytes], Awaitable[None]]) -> bytes:
    """`future`'s reply; until it comes, each progress record of `updates` handed to `on_update` in the
    order they came, and those that came before the reply handed over before it is returned."""
    while not future.done():
        next_update = asyncio.ensure_future(updates.get())
        try:
            await asyncio.wait((future, next_update), return_when=asyncio.FIRST_COMPLETED)
        finally:
            next_update.cancel()  # a get cancelled before it took a record leaves it in the queue
        if next_update.done() and not next_update.cancelled():
            await on_update(next_update.result())
    while not updates.empty():
        await on_update(updates.get_nowait())
    return future.result()


class ReplyRouter:
    """The calls waiting for a reply, by their question id (a reply's key), and those listening to
    their progress, by its key (contracts.replies.progress_key)."""

    def __init__(self) -> None:
        self._waiting: dict[bytes, asyncio.Future[bytes]] = {}
        self._listening: dict[bytes, asyncio.Queue[bytes]] = {}
        self._closed_because: str | None = None

    def __len__(self) -> int:
        return len(self._waiting)

    @property
    def listening(self) -> int:
        """How many calls listen to their progress now."""
        return len(self._listening)

    def listen(self, key: bytes) -> asyncio.Queue[bytes]:
        """A queue for the progress records keyed `key`, registered before the question is sent."""
        if key in self._listening:
            raise ValueError(f"a call already listens to {key!r}")
        updates: asyncio.Queue[bytes] = asyncio.Queue(PROGRESS_BACKLOG)
        self._listening[key] = updates
        return updates

    def progress(self, key: bytes | None, value: bytes | None) -> bool:
        """Queue a progress record for the call listening to it; False (dropped) when none listens or its
        queue is full."""
        updates = self._listening.get(key) if key is not None else None
        if updates is None or value is None:
            return False
        try:
            updates.put_nowait(value)
        except asyncio.QueueFull:
            return False
        return True

    def unlisten(self, key: bytes, updates: asyncio.Queue[bytes]) -> None:
        """Forget `updates` (its call ended); only that queue, never a later call's under the same key."""
        if self._listening.get(key) is updates:
            del self._listening[key]

    def expect(self, key: bytes) -> asyncio.Future[bytes]:
        """A future for the reply keyed `key`, registered before its question is sent (a reply can be
        read before the send is acknowledged). Two calls may not wait on one id: the second is refused."""
        if self._closed_because is not None:
            raise ClientClosed(self._closed_because)
        if key in self._waiting:
            raise ValueError(f"a call already waits for the reply to {key.decode(errors='replace')!r}")
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiting[key] = future
        return future

    def deliver(self, key: bytes | None, value: bytes | None) -> bool:
        """Hand a reply to the call waiting for it; False (the reply is dropped) when none is: another
        client's reply on a shared partition, or one that came after its call gave up."""
        if key is None or value is None:
            return False
        future = self._waiting.pop(key, None)
        if future is None or future.done():
            return False
        future.set_result(value)
        return True

    def discard(self, key: bytes, future: asyncio.Future[bytes]) -> None:
        """Forget `future` (its call returned, timed out or was cancelled); only that one, never a later
        call's future under the same id."""
        if self._waiting.get(key) is future:
            del self._waiting[key]

    def fail_all(self, error: BaseException) -> None:
        """Fail every waiting call with `error` (the reader cannot read), leaving none registered."""
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(error)

    def close(self, reason: str) -> None:
        """Fail the waiting calls and refuse new ones, each with a ClientClosed saying `reason`."""
        self._closed_because = reason
        self.fail_all(ClientClosed(reason))
