"""Replies routed to the calls that wait for them: one future per question id, filled by the one reader
of a long-lived client (epistream/client/session.py). Pure bookkeeping, no Kafka: nothing here grows
past the calls waiting now, since a future leaves on its reply, its timeout or its cancellation."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence

from epistream.errors import PermanentError


class ClientClosed(PermanentError):
    """A call on a client that was closed, or that was waiting for its reply when it closed."""


def pick_partition(partitions: Sequence[int]) -> int:
    """The reply partition a client reads: any one, at random, so clients spread over the partitions."""
    if not partitions:
        raise ValueError("a topic without partitions")
    return secrets.choice(list(partitions))


class ReplyRouter:
    """The calls waiting for a reply, by their question id (a reply's key)."""

    def __init__(self) -> None:
        self._waiting: dict[bytes, asyncio.Future[bytes]] = {}
        self._closed_because: str | None = None

    def __len__(self) -> int:
        return len(self._waiting)

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
