"""Questions their askers withdrew: an asker that stops waiting (its call cancelled, or timed out) sends a
`Withdrawal` keyed like its question, so it follows the question in its partition; the worker stops
answering it (no more model calls for no one) and replies that it was withdrawn, so the partition's
commit moves on and a reader still sees one reply per question.

A withdrawal counts only for the question's own tenant: the worker verifies the withdrawal's claim as a
question's, and the question's tenant is known only once its task decoded it, which may come after the
withdrawal is read (both can arrive in one fetch), so each side waits for the other here. Pure
bookkeeping, no Kafka."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from epistream.errors import PermanentError

T = TypeVar("T")


class Withdrawn(PermanentError):
    """The asker withdrew the question before it was answered (the reply's error says so)."""


class Withdrawable:
    """One question being answered: its tenant once decoded, the tenants that withdrew it, and whether
    the two met."""

    def __init__(self) -> None:
        self._tenant: str | None = None
        self._withdrawn_by: set[str] = set()
        self.withdrawn = asyncio.Event()

    def asked_by(self, tenant: str) -> None:
        """The question, decoded and its claim verified, is `tenant`'s."""
        self._tenant = tenant
        if tenant in self._withdrawn_by:
            self.withdrawn.set()

    def withdraw(self, tenant: str) -> None:
        """`tenant` (its claim verified) withdrew the question: it counts if the question is `tenant`'s."""
        self._withdrawn_by.add(tenant)
        if self._tenant == tenant:
            self.withdrawn.set()


class Withdrawals:
    """A partition's questions being answered, by their record key (the question id)."""

    def __init__(self) -> None:
        self._answering: dict[bytes, Withdrawable] = {}

    def __len__(self) -> int:
        return len(self._answering)

    def open(self, key: bytes | None) -> Withdrawable:
        """The question keyed `key` is being answered (a question without a key cannot be withdrawn)."""
        withdrawable = Withdrawable()
        if key is not None:
            self._answering[key] = withdrawable
        return withdrawable

    def close(self, key: bytes | None, withdrawable: Withdrawable) -> None:
        """Its answer ended; only this one is forgotten, never a later question under the same key."""
        if key is not None and self._answering.get(key) is withdrawable:
            del self._answering[key]

    def withdraw(self, key: bytes, tenant: str) -> bool:
        """`tenant` withdrew the question keyed `key`; False when none is being answered (already
        answered, or answered by another worker before this one took the partition)."""
        withdrawable = self._answering.get(key)
        if withdrawable is None:
            return False
        withdrawable.withdraw(tenant)
        return True


async def unless_withdrawn(work: Awaitable[T], withdrawable: Withdrawable | None) -> T:
    """`work`'s result, or Withdrawn (the work cancelled) when the question is withdrawn first. An answer
    that is ready when the withdrawal comes is kept."""
    if withdrawable is None:
        return await work
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(withdrawable.withdrawn.wait())
    try:
        await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this answer itself cancelled (stopping, the partition lost): the work goes too
        task.cancel()
        raise
    finally:
        waiter.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise Withdrawn("withdrawn by its asker before it was answered (the call was cancelled or timed out)")
