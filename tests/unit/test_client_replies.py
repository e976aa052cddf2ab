"""The long-lived client's routing of replies (epistream/client/replies.py): each reply reaches the call
waiting for its question id, a reply nobody waits for is dropped, and nothing stays registered once a
call returned, timed out, was cancelled or the client closed."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from epistream.client.replies import ClientClosed, ReplyRouter, pick_partition


async def test_each_reply_reaches_its_own_call():
    router = ReplyRouter()
    futures = {f"q{n}".encode(): router.expect(f"q{n}".encode()) for n in range(50)}
    for key in reversed(list(futures)):  # replies come in any order
        assert router.deliver(key, b"reply to " + key)
    assert all(future.result() == b"reply to " + key for key, future in futures.items())
    assert len(router) == 0


async def test_a_reply_nobody_waits_for_is_dropped():
    router = ReplyRouter()
    waiting = router.expect(b"mine")
    assert not router.deliver(b"another client's", b"{}")
    assert not router.deliver(None, b"{}") and not router.deliver(b"mine", None)  # keyless, or a tombstone
    assert not waiting.done() and len(router) == 1


async def test_a_call_that_gave_up_leaves_nothing_and_its_late_reply_is_dropped():
    router = ReplyRouter()
    future = router.expect(b"q")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(future, 0.01)  # cancels the future, as a caller's timeout does
    router.discard(b"q", future)
    assert len(router) == 0
    assert not router.deliver(b"q", b"late")


async def test_a_cancelled_future_is_skipped_by_delivery():
    router = ReplyRouter()
    future = router.expect(b"q")
    future.cancel()
    assert not router.deliver(b"q", b"{}") and len(router) == 0


async def test_discard_removes_only_the_future_it_names():
    router = ReplyRouter()
    first = router.expect(b"q")
    router.deliver(b"q", b"1")
    second = router.expect(b"q")  # the id asked again once the first call had its reply
    router.discard(b"q", first)  # the first call's cleanup, late
    assert len(router) == 1 and router.deliver(b"q", b"2") and second.result() == b"2"


async def test_two_calls_cannot_wait_on_one_question_id():
    router = ReplyRouter()
    router.expect(b"q")
    with pytest.raises(ValueError, match="already waits"):
        router.expect(b"q")


async def test_failing_all_empties_the_router():
    router = ReplyRouter()
    futures = [router.expect(f"q{n}".encode()) for n in range(3)]
    router.fail_all(ConnectionError("broker gone"))
    assert len(router) == 0
    for future in futures:
        with pytest.raises(ConnectionError):
            future.result()


async def test_closing_fails_the_waiting_calls_and_refuses_new_ones():
    router = ReplyRouter()
    waiting = router.expect(b"q")
    router.close("the EpistreamClient was closed")
    with pytest.raises(ClientClosed, match="closed"):
        await waiting
    with pytest.raises(ClientClosed, match="closed"):
        router.expect(b"later")
    assert len(router) == 0


def test_the_reply_partition_is_any_of_the_topics_partitions():
    picks = Counter(pick_partition(range(12)) for _ in range(1200))
    assert set(picks) == set(range(12))  # every partition is picked (each with chance 1/12 a draw)
    assert pick_partition([0]) == 0  # a tenant's reply topic has one
    with pytest.raises(ValueError):
        pick_partition([])
