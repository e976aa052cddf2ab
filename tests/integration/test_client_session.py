"""The long-lived client (epistream/client/session.py) against a real answer worker: many concurrent
reads through one client each get their own reply, a client reads replies on more than one reply topic
at once, and a client that gave up on a call or was closed leaves nothing behind that grows. The
answer worker runs as a process on its own topics and database; its model endpoint must receive nothing."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator

import pytest
from aiokafka.admin import NewTopic

from epistream.client.replies import ClientClosed
from epistream.client.session import EpistreamClient
from epistream.contracts.positions import Position
from epistream.contracts.replies import MemoryContext
from epistream.errors import ReplyTimeout
from epistream.messaging.kafka_io import create_admin

from .scripted_worker import Scripted, no_model_call, scripted_worker

pytestmark = pytest.mark.integration

METRICS_PORT = int(os.environ.get("EPISTREAM_SUPERVISOR_METRICS_PORT", "29103")) + 90  # beside the test stack's ports
READ_AFTER_S = 4.0  # how long the worker waits for positions never stored before it replies `incomplete`


@pytest.fixture(scope="module")
def workers(kafka) -> Iterator[Scripted]:
    with scripted_worker(kafka, no_model_call, metrics_port=METRICS_PORT, name="session", workers=("answer",),
                         overrides={"read_after_timeout_s": READ_AFTER_S}) as running:
        yield running


@pytest.fixture
def tenant() -> str:
    return f"session-{uuid.uuid4().hex[:8]}"


def _never_stored() -> list[Position]:
    """A position no turn will reach: the worker holds the read for READ_AFTER_S, then replies `incomplete`."""
    return [Position(conversation_id="nowhere", partition=0, offset=10**12)]


def _spy_on_routing(client: EpistreamClient, monkeypatch: pytest.MonkeyPatch) -> dict[bytes, asyncio.Future[bytes]]:
    """The future each question id was registered with, to check each call got its own question's reply."""
    router = client._router
    registered: dict[bytes, asyncio.Future[bytes]] = {}
    expect = router.expect

    def spying(key: bytes) -> asyncio.Future[bytes]:
        registered[key] = expect(key)
        return registered[key]

    monkeypatch.setattr(router, "expect", spying)
    return registered


async def test_200_concurrent_reads_through_one_client_each_get_their_own_reply(workers, tenant, monkeypatch):
    async with EpistreamClient(workers.settings) as client:
        registered = _spy_on_routing(client, monkeypatch)
        replies = await asyncio.gather(*(
            client.context(tenant=tenant, question=f"what did we say about topic number {n}?", budget_tokens=100,
                           timeout_s=180) for n in range(200)))
        assert client.waiting == 0
    assert all(isinstance(r, MemoryContext) and r.error is None for r in replies)
    assert len(registered) == 200 and len({r.question_id for r in replies}) == 200
    for key, future in registered.items():  # the reply handed to each call is its own question's
        assert MemoryContext.from_bytes(future.result()).question_id == key.decode()
    assert {r.question_id.encode() for r in replies} == set(registered)


async def test_one_client_reads_replies_of_several_reply_topics_at_once(workers, tenant):
    """A topic added while calls on the first are in flight: the first topic's replies are not lost
    when the consumer's assignment grows."""
    settings = workers.settings
    other = f"{settings.topic_answers}.{uuid.uuid4().hex[:8]}"
    admin = create_admin(settings)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(other, num_partitions=3, replication_factor=1)])
    finally:
        await admin.close()
    async with EpistreamClient(settings) as client:
        slow = asyncio.create_task(client.context(tenant=tenant, question="held on the shared topic",
                                                  after=_never_stored(), timeout_s=120))
        first = [client.context(tenant=tenant, question=f"shared {n}", timeout_s=120) for n in range(20)]
        second = [client.context(tenant=tenant, question=f"own {n}", reply_topic=other, timeout_s=120)
                  for n in range(20)]
        replies = await asyncio.gather(*first, *second)
        held = await slow  # its reply came on the first topic after the second was added
        assert set(client._reading) == {settings.topic_answers, other}
    assert held.incomplete and len({r.question_id for r in replies}) == 40


async def test_a_client_that_gave_up_or_closed_leaves_nothing_behind(workers, tenant):
    settings = workers.settings
    client = EpistreamClient(settings)
    first = await client.context(tenant=tenant, question="a first read starts both Kafka clients", timeout_s=120)
    assert first.error is None
    with pytest.raises(ReplyTimeout):  # the worker holds this one past the call's timeout
        await client.context(tenant=tenant, question="held too long", after=_never_stored(), timeout_s=1)
    assert client.waiting == 0  # its future went with the timeout
    await asyncio.sleep(READ_AFTER_S + 1)  # its late reply came, and was dropped
    assert client.waiting == 0
    again = await client.context(tenant=tenant, question="the client still reads", timeout_s=120)
    assert again.error is None and again.question_id != first.question_id

    held = asyncio.create_task(client.context(tenant=tenant, question="waiting when the client closes",
                                              after=_never_stored(), timeout_s=120))
    while client.waiting == 0:
        await asyncio.sleep(0.01)
    reader, producer, consumer = client._reader, client._producer, client._consumer
    await client.close()
    with pytest.raises(ClientClosed, match="closed"):
        await held
    assert reader is not None and reader.done()
    assert producer is not None and producer._closed and consumer is not None and consumer._closed
    assert client.waiting == 0
    with pytest.raises(ClientClosed, match="closed"):
        await client.context(tenant=tenant, question="after close", timeout_s=5)
    await client.close()  # closing twice is harmless
