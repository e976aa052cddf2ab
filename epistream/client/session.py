"""`EpistreamClient`: one producer and one reply consumer for a process's lifetime, instead of a pair per
call. Every question names the reply partition this client reads (`Question.reply_partition`), one
partition of each reply topic, picked at random at the topic's first use; one reader task hands each
reply to the call waiting for it (`ReplyRouter`) and drops the rest. The cost is on docs/design.md
("The answer worker"): a client reads 1/N of the replies on the shared topic and leaves nothing on the
broker when it dies (no consumer group, no topic)."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import Self

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import RecordMetadata

from epistream.contracts.base import RECORD_HEADER
from epistream.contracts.decoding import decode, validated
from epistream.contracts.positions import Position
from epistream.contracts.questions import (
    CONTEXT_BUDGET_DEFAULT,
    WITHDRAWAL_RECORD,
    ConversationPage,
    Listing,
    Mode,
    Question,
    Withdrawal,
)
from epistream.contracts.replies import Answer, MemoryContext, Progress, is_progress, progress_key
from epistream.contracts.turns import ForgetRecord, Turn
from epistream.core import tracing
from epistream.core.claims import ClaimCheck, signed_headers
from epistream.errors import ContractError, PermanentError, ReplyTimeout
from epistream.messaging.erasure import publish_forgotten
from epistream.messaging.kafka_io import create_consumer, create_producer, partitions_of
from epistream.messaging.tenant_topics import tenant_reply_topic
from epistream.settings.processes import ClientSettings

from .replies import ClientClosed, ReplyRouter, pick_partition, reply_with_progress

log = logging.getLogger(__name__)

#: Kafka settings for a request and its reply, chosen by measurement (docs/design.md, "The answer worker"):
#: a question is sent alone and awaited, so the producer does not linger for a batch to fill...
PRODUCER_LINGER_MS = 0
#: ...and the reply consumer's fetch returns at the first byte; its wait bounds how long a fetch sent
#: before a partition was added holds the new partition's first fetch back.
REPLY_FETCH_MAX_WAIT_MS = 100
REPLY_FETCH_MIN_BYTES = 1
#: How long the reader's poll waits when no reply comes (any reply ends it at once).
READ_POLL_MS = 1_000

#: How long closing waits for the withdrawals of calls cancelled just before.
WITHDRAW_GRACE_S = 2.0
#: What the caller may pass as `after`: positions, or produce_turns' map of them.
After = Iterable[Position] | Mapping[str, Position]
#: What `ask(on_progress=)` takes: called with each step of answering, in order, before the answer returns.
OnProgress = Callable[[Progress], Awaitable[None]]


def claim_headers(check: ClaimCheck, value: bytes, tenant_key: bytes | None = None) -> list[tuple[str, bytes]]:
    """The signature proving a record's tenant claim: with `tenant_key` (a tenant's backend holds its
    own), or derived from the deployment's secret in `check` (the operator's tools hold it); none when
    neither is there, or for bytes that name no tenant (they cannot be signed for anyone)."""
    if tenant_key is not None:
        return signed_headers(tenant_key, value)
    if not check.enforced:
        return []
    try:
        tenant = json.loads(value)["tenant"]
    except (ValueError, TypeError, KeyError):
        return []
    return check.headers_for(str(tenant), value)


async def start_client(client: AIOKafkaProducer | AIOKafkaConsumer) -> None:
    """Start a client; one that cannot reach the broker is closed before the error goes up."""
    try:
        await client.start()
    except BaseException:
        await client.stop()
        raise


def _note_position(positions: dict[str, Position], key: bytes | None, meta: RecordMetadata) -> None:
    """Keep, per conversation (a turn's key), the position of its last record the broker acknowledged."""
    try:
        conversation = key.decode() if key is not None else None
        if conversation is None or (conversation in positions and positions[conversation].offset >= meta.offset):
            return
        positions[conversation] = Position(conversation_id=conversation, partition=meta.partition, offset=meta.offset)
    except ValueError:  # a key that is no conversation id (not UTF-8, too long): nothing to wait for
        return


def _positions(after: After | None) -> list[Position] | None:
    if after is None:
        return None
    return list(after.values()) if isinstance(after, Mapping) else list(after)


def _decoded(on_progress: OnProgress) -> Callable[[bytes], Awaitable[None]]:
    """`on_progress` for the raw records: each decoded; one that is no `Progress` skipped, and none passed
    on after the callback failed once (progress never fails its call)."""
    failed = False

    async def hand_over(raw: bytes) -> None:
        nonlocal failed
        if failed:
            return
        try:
            update = decode(raw, Progress, what="progress record")
        except ContractError as exc:
            log.debug("a progress record skipped: %s", exc)
            return
        try:
            await on_progress(update)
        except Exception as exc:
            failed = True
            log.warning("on_progress failed (%s: %s): no more progress for this call", type(exc).__name__, exc)
    return hand_over


class EpistreamClient:
    """A long-lived client: ``async with EpistreamClient(settings) as client: await client.context(...)``.
    Its Kafka clients start at first use (a server started before Kafka works once Kafka is up; a start
    that failed is tried again by the next call); `close` (or leaving the ``async with``) fails the calls
    still waiting with a ClientClosed and stops both. Calls may run concurrently."""

    def __init__(self, settings: ClientSettings, *, linger_ms: int = PRODUCER_LINGER_MS,
                 fetch_max_wait_ms: int = REPLY_FETCH_MAX_WAIT_MS) -> None:
        self._settings = settings
        self._linger_ms = linger_ms  # the defaults were measured (bench/client_latency.py); others, to compare
        self._fetch_max_wait_ms = fetch_max_wait_ms
        self._check = ClaimCheck.from_settings(settings)
        self._router = ReplyRouter()
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._reader: asyncio.Task[None] | None = None
        self._reading: dict[str, int] = {}  # reply topic -> the partition this client reads
        self._starting = asyncio.Lock()  # starting a Kafka client, or adding a reply topic: rare, serialised
        self._withdrawing: set[asyncio.Future[RecordMetadata]] = set()  # withdrawals being sent
        self._closed = False

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.close()

    @property
    def waiting(self) -> int:
        """How many calls wait for a reply now."""
        return len(self._router)

    @property
    def listening(self) -> int:
        """How many calls listen to their progress now (`ask(on_progress=)`)."""
        return self._router.listening

    # -- the Kafka clients, started at first use --

    def _open(self) -> None:
        if self._closed:
            raise ClientClosed("this EpistreamClient is closed")

    async def _sender(self) -> AIOKafkaProducer:
        self._open()
        if self._producer is None:
            async with self._starting:
                self._open()  # closed while this call waited for the lock
                if self._producer is None:
                    producer = create_producer(self._settings, linger_ms=self._linger_ms)
                    await start_client(producer)
                    self._producer = producer
        return self._producer

    async def _reply_partition(self, topic: str) -> int:
        """The partition of `topic` this client reads, assigned and positioned at its end at the topic's
        first use, before any question naming it is sent (so its reply cannot be missed)."""
        self._open()
        if topic in self._reading:
            return self._reading[topic]
        async with self._starting:
            self._open()
            if topic not in self._reading:
                numbers = await partitions_of(self._settings, topic)
                if not numbers:
                    raise PermanentError(f"reply topic {topic!r} does not exist (a tenant's is made by "
                                         "`epistream tenant add`)")
                await self._listen(TopicPartition(topic, pick_partition(numbers)))
        return self._reading[topic]

    async def _listen(self, added: TopicPartition) -> None:
        if self._consumer is None:
            # read_committed: a reply of an aborted transaction (its worker died or lost the question) is never seen.
            consumer = create_consumer(self._settings, group_id=None, enable_auto_commit=False,
                                       isolation_level="read_committed", fetch_max_wait_ms=self._fetch_max_wait_ms,
                                       fetch_min_bytes=REPLY_FETCH_MIN_BYTES)
            await start_client(consumer)
            self._consumer = consumer
        consumer = self._consumer
        # A new assignment resets every position: the partitions already read resume where they were.
        kept = {tp: await consumer.position(tp) for tp in consumer.assignment()}
        consumer.assign([*kept, added])
        for tp, offset in kept.items():
            consumer.seek(tp, offset)
        await consumer.seek_to_end(added)
        await consumer.position(added)  # the end is fixed here, before a question naming it is sent
        self._reading[added.topic] = added.partition
        if self._reader is None:
            self._reader = asyncio.create_task(self._read(consumer), name="epistream-client-replies")

    async def _read(self, consumer: AIOKafkaConsumer) -> None:
        """The one reader: every reply of the partitions read goes to its waiting call, or is dropped."""
        while True:
            try:
                batches = await consumer.getmany(timeout_ms=READ_POLL_MS)
            except Exception as exc:  # the waiting calls learn why now, not at their timeout
                log.warning("reading replies failed: %s", exc)
                self._router.fail_all(exc)
                await asyncio.sleep(1.0)
                continue
            for records in batches.values():
                for record in records:
                    if is_progress(record.headers):
                        self._router.progress(record.key, record.value)
                    else:
                        self._router.deliver(record.key, record.value)

    # -- asking --

    def _reply_topic(self, question: Question, tenant_key: bytes | None) -> str:
        if question.reply_topic is not None:
            return question.reply_topic
        if tenant_key is not None or self._check.enforced:
            return tenant_reply_topic(self._settings.topic_answers, question.tenant)  # where checked claims reply
        return self._settings.topic_answers

    async def _request(self, question: Question, timeout_s: float, tenant_key: bytes | None,
                       on_progress: OnProgress | None = None) -> bytes:
        """Produce a question naming this client's reply partition; the value of its reply (keyed by its id).
        With `on_progress`, the question asks for progress, and each record of it that comes before the
        reply is handed over, decoded, in order."""
        partition = await self._reply_partition(self._reply_topic(question, tenant_key))
        producer = await self._sender()
        question = question.model_copy(update={"reply_partition": partition} | (
            {"progress": True} if on_progress is not None else {}))
        key = question.question_id.encode()
        future = self._router.expect(key)
        listening, updates = progress_key(question.question_id), None
        try:
            if on_progress is not None:
                updates = self._router.listen(listening)
            value = question.to_bytes()
            topic = self._settings.topic_questions
            with tracing.span(f"send {topic}", kind="producer", attributes=tracing.messaging("send", "send", topic)):
                await producer.send_and_wait(topic, key=key, value=value,
                                             headers=tracing.inject(claim_headers(self._check, value, tenant_key)))
            waited = future if updates is None or on_progress is None else reply_with_progress(
                future, updates, _decoded(on_progress))
            try:
                return await asyncio.wait_for(waited, timeout_s)
            except TimeoutError:
                self._withdraw(question, tenant_key)
                raise ReplyTimeout(f"no reply to {question.question_id} within {timeout_s:.0f}s") from None
        except asyncio.CancelledError:  # the caller stopped waiting: the worker need not answer any more
            self._withdraw(question, tenant_key)
            raise
        finally:
            self._router.discard(key, future)
            if updates is not None:
                self._router.unlisten(listening, updates)

    def _withdraw(self, question: Question, tenant_key: bytes | None) -> None:
        """Tell the answer worker that no one waits for `question` any more (a `Withdrawal`, keyed like it,
        so it follows it: consumers/withdrawals.py), sent in the background, so a call being cancelled
        need not wait for it. Best effort: a lost withdrawal costs only the work of answering."""
        producer = self._producer
        if producer is None or self._closed:
            return
        value = Withdrawal(question_id=question.question_id, tenant=question.tenant).to_bytes()
        sending = asyncio.ensure_future(producer.send_and_wait(
            self._settings.topic_questions, key=question.question_id.encode(), value=value,
            headers=claim_headers(self._check, value, tenant_key) + [(RECORD_HEADER, WITHDRAWAL_RECORD)]))
        self._withdrawing.add(sending)
        sending.add_done_callback(self._withdrawn)

    def _withdrawn(self, sending: asyncio.Future[RecordMetadata]) -> None:
        self._withdrawing.discard(sending)
        if not sending.cancelled() and sending.exception() is not None:
            log.debug("a withdrawal was not sent: %s", sending.exception())

    async def ask(self, question: Question, *, timeout_s: float = 300.0, tenant_key: bytes | None = None,
                  after: After | None = None, on_progress: OnProgress | None = None) -> Answer:
        """Produce a question (signed for its tenant, see `claim_headers`) and wait for its answer; with
        `after` (positions from produce_turns), answered only from memory stored through them, or marked
        `incomplete`. With `on_progress`, the answer worker reports its steps (`Progress`: the mode,
        memory found, assistant reads, tool calls, the master's call) and each is awaited in order before
        the answer returns; best effort: a step may be missing, and a failing callback is not called again."""
        if after is not None:
            question = validated(Question, what="question", **(question.model_dump(exclude_none=True)
                                                                  | {"after": _positions(after)}))
        return decode(await self._request(question, timeout_s, tenant_key, on_progress), Answer, what="answer")

    async def context(
        self, *, tenant: str, question: str, budget_tokens: int = CONTEXT_BUDGET_DEFAULT,
        since: datetime | None = None, until: datetime | None = None, conversation_ids: list[str] | None = None,
        asked_at: datetime | None = None, reply_topic: str | None = None, timeout_s: float = 30.0,
        tenant_key: bytes | None = None, after: After | None = None,
        listing: Listing | None = None, page: ConversationPage | None = None,
    ) -> MemoryContext:
        """The best memory for ``question`` within ``budget_tokens``, for the caller's own model (no model
        call): a `context` question through memory.questions, its MemoryContext from the reply topic.
        ``since``/``until``: only memory of [since, until); ``asked_at`` (default now) anchors "last week";
        ``after`` (positions from produce_turns): read once ingest stored through them, else marked
        `incomplete`; ``listing``: instead, the one conversation's gists in time order ("timeline") or
        current facts, or (with ``page``, naming no conversation) a page of the tenant's conversations."""
        request = validated(
            Question, what="context request",
            question_id=f"c-{uuid.uuid4()}", tenant=tenant, question=question, conversation_ids=conversation_ids,
            asked_at=asked_at or datetime.now(UTC), mode=Mode.CONTEXT, reply_topic=reply_topic,
            budget_tokens=budget_tokens,
            time_range=None if since is None and until is None else {"start": since, "end": until},
            after=_positions(after), listing=listing, page=page,
        )
        return decode(await self._request(request, timeout_s, tenant_key), MemoryContext, what="context reply")

    # -- producing --

    async def produce_raw(self, records: Iterable[tuple[bytes | None, bytes]], *, topic: str | None = None,
                          progress=None, tenant_key: bytes | None = None,
                          positions: dict[str, Position] | None = None) -> int:
        """Send (key, value) pairs to `memory.turns` (or `topic`), each signed for its tenant (see
        `claim_headers`); return how many were sent. With `positions`, fill it with each conversation's
        (key's) last acknowledged position, what a read's `after` waits for."""
        destination = topic or self._settings.topic_turns
        producer = await self._sender()
        sent = 0
        pending: list[tuple[bytes | None, asyncio.Future[RecordMetadata]]] = []

        async def delivered() -> None:
            metas = await asyncio.gather(*(future for _, future in pending))
            if positions is not None:
                for (key, _), meta in zip(pending, metas, strict=True):
                    _note_position(positions, key, meta)
            pending.clear()

        # One send span for the call (a batch send, in the messaging conventions): every record carries its
        # context, or the caller's own span's where tracing is off here; no header at all without either.
        with tracing.span(f"send {destination}", kind="producer",
                          attributes=tracing.messaging("send", "send", destination)) as current:
            trace_headers = tracing.inject()
            for key, value in records:
                pending.append((key, await producer.send(destination, key=key, value=value,
                                                         headers=claim_headers(self._check, value, tenant_key)
                                                         + trace_headers)))
                sent += 1
                if progress is not None:
                    progress.update(1)
                if len(pending) >= 1000:
                    await delivered()
            await delivered()
            tracing.set_attributes(current, {"messaging.batch.message_count": sent})
        return sent

    async def produce_turns(self, turns: Iterable[Turn], *, tenant_key: bytes | None = None) -> dict[str, Position]:
        """Send turns to `memory.turns`, keyed by conversation and signed for their tenant; return, per
        conversation, the position of its last turn (pass them as a read's `after` to read your writes)."""
        positions: dict[str, Position] = {}
        await self.produce_raw(((t.conversation_id.encode(), t.to_bytes()) for t in turns), tenant_key=tenant_key,
                               positions=positions)
        return positions

    async def forget(self, *, tenant: str, conversation_id: str | None = None) -> ForgetRecord:
        """Forget a conversation (None: every conversation of the tenant) through Kafka: the erasure is
        written to the compacted memory.forgotten, which every ingest worker applies as it arrives and again
        on every start, so a database rebuilt from Kafka stays without it. Returns the record written once
        every in-sync replica holds it; the deletion itself follows within the ingest worker's reading."""
        record = ForgetRecord(tenant=tenant, conversation_id=conversation_id, forgotten_at=datetime.now(UTC))
        await publish_forgotten(await self._sender(), self._settings, record)
        return record

    # -- closing --

    async def close(self) -> None:
        """Stop reading, fail the calls still waiting (ClientClosed), stop both Kafka clients. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        self._router.close("the EpistreamClient was closed")
        if self._withdrawing:  # withdrawals of calls cancelled just now: a moment to leave before the producer stops
            await asyncio.wait(set(self._withdrawing), timeout=WITHDRAW_GRACE_S)
        async with self._starting:  # a start under way finishes first, then is stopped with the rest
            for client in (self._producer, self._consumer):
                if client is not None:
                    try:
                        await client.stop()
                    except Exception as exc:  # the other is stopped all the same
                        log.debug("stopping a Kafka client failed: %s", exc)
