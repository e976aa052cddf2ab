"""The relay's bound on a delivery: a producer that never acknowledges a send (as one can after a broker
restart) costs a round its timeout, never the advisory lock and the connection for good."""

from __future__ import annotations

import asyncio

import pytest

from epistream.core.metrics import Metrics
from epistream.pipeline.event_relay import EventRelay, _settled
from epistream.settings.processes import Settings


async def test_settled_keeps_the_order_and_reads_a_delivery_left_open_as_a_timeout():
    loop = asyncio.get_running_loop()
    done, failed, never = loop.create_future(), loop.create_future(), loop.create_future()
    done.set_result("ack")
    failed.set_exception(ConnectionError("broker away"))
    outcomes = await _settled([done, never, failed], timeout_s=0.05)
    assert outcomes[0] == "ack"
    assert isinstance(outcomes[1], TimeoutError) and never.cancelled()
    assert isinstance(outcomes[2], ConnectionError)


async def test_a_delivery_never_acknowledged_fails_the_round_in_bounded_time_and_drops_the_producer():
    never: list[asyncio.Future[object]] = []

    async def enqueue(topic: str, key: bytes, value: bytes) -> asyncio.Future[object]:
        never.append(asyncio.get_running_loop().create_future())
        return never[-1]

    relay = EventRelay(Settings(), lambda: None, Metrics.create(), enqueue=enqueue)
    relay.delivery_timeout_s = 0.05
    closed: list[bool] = []

    async def close() -> None:
        closed.append(True)

    relay.close = close  # type: ignore[method-assign]
    with pytest.raises(TimeoutError):
        # Nothing acknowledged: nothing to mark, so no connection is touched.
        await asyncio.wait_for(relay._deliver(None, "t", "memory.events",  # type: ignore[arg-type]
                                              [(1, "c", {"kind": "turns_stored"})]), timeout=5)
    assert closed == [True] and all(f.cancelled() for f in never)
