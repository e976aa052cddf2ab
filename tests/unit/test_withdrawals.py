"""A withdrawn question stops being answered: the bookkeeping that ties a withdrawal to the question it
names (either may be read first; only the question's own tenant counts) and the race between an answer
and its withdrawal (consumers/withdrawals.py)."""

from __future__ import annotations

import asyncio

import pytest

from epistream.consumers.withdrawals import Withdrawable, Withdrawals, Withdrawn, unless_withdrawn
from epistream.contracts.base import RECORD_HEADER
from epistream.contracts.questions import WITHDRAWAL_RECORD, Withdrawal, is_withdrawal


async def test_a_withdrawal_counts_for_the_questions_own_tenant_whichever_is_read_first():
    before = Withdrawable()
    before.withdraw("acme")  # read in the same fetch as its question, before the question's task decoded it
    assert not before.withdrawn.is_set()
    before.asked_by("acme")
    assert before.withdrawn.is_set()

    after = Withdrawable()
    after.asked_by("acme")
    after.withdraw("globex")  # another tenant, its own claim proven: not its question to withdraw
    assert not after.withdrawn.is_set()
    after.withdraw("acme")
    assert after.withdrawn.is_set()


async def test_a_partitions_questions_are_found_by_key_and_forgotten_only_by_their_own_answer():
    withdrawals = Withdrawals()
    first = withdrawals.open(b"q-1")
    again = withdrawals.open(b"q-1")  # the same id asked again (a producer retry): the later one is found
    withdrawals.close(b"q-1", first)
    assert len(withdrawals) == 1 and withdrawals.withdraw(b"q-1", "acme")
    withdrawals.close(b"q-1", again)
    assert len(withdrawals) == 0 and not withdrawals.withdraw(b"q-1", "acme")  # already answered
    withdrawals.close(None, withdrawals.open(None))  # a question without a key: nothing kept
    assert len(withdrawals) == 0


async def test_withdrawn_first_the_answer_is_cancelled_and_withdrawn_raised():
    withdrawable = Withdrawable()
    withdrawable.asked_by("acme")
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def answering() -> str:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    waiting = asyncio.create_task(unless_withdrawn(answering(), withdrawable))
    await started.wait()
    withdrawable.withdraw("acme")
    with pytest.raises(Withdrawn, match="withdrawn by its asker"):
        await waiting
    assert cancelled.is_set()


async def test_an_answer_ready_before_its_withdrawal_is_kept_and_none_is_just_awaited():
    withdrawable = Withdrawable()
    withdrawable.asked_by("acme")

    async def answered() -> str:
        withdrawable.withdraw("acme")  # the withdrawal comes as the answer is ready: both done at once
        return "the answer"

    assert await unless_withdrawn(answered(), withdrawable) == "the answer"
    assert await unless_withdrawn(asyncio.sleep(0, result="plain"), None) == "plain"


async def test_the_answer_itself_cancelled_cancels_the_work():
    cancelled = asyncio.Event()

    async def answering() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    waiting = asyncio.create_task(unless_withdrawn(answering(), Withdrawable()))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await asyncio.sleep(0)
    assert cancelled.is_set()


def test_a_withdrawal_is_told_apart_by_its_header_and_round_trips():
    record = Withdrawal(question_id="q-1", tenant="acme")
    assert Withdrawal.from_bytes(record.to_bytes()) == record
    assert is_withdrawal([("traceparent", b"00-x"), (RECORD_HEADER, WITHDRAWAL_RECORD)])
    assert not is_withdrawal(None) and not is_withdrawal([(RECORD_HEADER, b"progress")])
