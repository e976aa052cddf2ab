"""One question record becomes one outcome: its reply (fitted to a Kafka message) and, when answering
failed, its dead letter. Only transient errors (errors.is_transient: the database or the broker
hiccuped) are retried, the record left unanswered; anything else, ours or not, is a failed reply plus a
dead letter, so no question can stop the worker (consumers/worker.py publishes the outcome)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field

from aiokafka import ConsumerRecord

from epistream.contracts.decoding import decode
from epistream.contracts.questions import Mode, Question, Withdrawal
from epistream.contracts.replies import Answer, MemoryContext
from epistream.core import tracing
from epistream.core.claims import ClaimCheck, header_pairs
from epistream.core.retry import BLOCKING, retry
from epistream.errors import ContractError, PermanentError, is_transient
from epistream.messaging.dead_letters import DEFAULT_MAX_REQUEST_SIZE, dead_letter, record_size
from epistream.messaging.kafka_io import Outgoing, TopicDirectory
from epistream.messaging.tenant_topics import check_own_reply_topic, tenant_reply_topic

from .answer import answer_question, failed_answer
from .context import failed_context, read_context
from .deps import AnswerDeps
from .listing import read_listing
from .packing import render, used_tokens
from .progress import Steps
from .read_after import read_after
from .withdrawals import Withdrawable, Withdrawals, Withdrawn, unless_withdrawn

log = logging.getLogger(__name__)

STAGE = "answer"

class UnknownReplyTopic(PermanentError):
    """The question names a reply topic the broker does not have (topics are never auto-created)."""


Reply = Answer | MemoryContext


#: The slot a question's read or answer runs in, by its lane (consumers/lanes.py); the read-after wait
#: runs before it, holding none.
Slot = Callable[[Question], AbstractAsyncContextManager[object]]


@asynccontextmanager
async def no_slot(question: Question) -> AsyncIterator[None]:
    yield


@dataclass
class Outcome:
    """What one question becomes, published in one transaction: its reply, its dead letter if any."""

    messages: list[Outgoing] = field(default_factory=list)
    answer: Reply | None = None

    def letters_to(self, topic: str) -> Callable[[bytes | None, bytes], Awaitable[None]]:
        """Where messaging.dead_letters puts a dead letter of this record: among its messages, to `topic`."""
        async def letter(key: bytes | None, value: bytes) -> None:
            self.messages.append(Outgoing(topic, key, value))
        return letter


async def withdrawal_outcome(record: ConsumerRecord, withdrawals: Withdrawals, deps: AnswerDeps, *,
                             claims: ClaimCheck) -> Outcome:
    """A withdrawal record's outcome (consumers/withdrawals.py): nothing to publish, the question it names
    told if it is being answered here; a dead letter with the reason when it is no withdrawal, is not
    proven its tenant's (claims), or is keyed unlike its question (it would not follow it)."""
    outcome = Outcome()
    try:
        withdrawal = decode(record.value, Withdrawal, what="memory.questions withdrawal")
        claims.verify(withdrawal.tenant, record.value or b"", header_pairs(record.headers))
        if record.key != withdrawal.question_id.encode():
            raise ContractError(f"a withdrawal of question {withdrawal.question_id!r} must be keyed by that id "
                                "(it follows its question in its partition only so)")
    except Exception as exc:
        await dead_letter(outcome.letters_to(deps.settings.topic_dlq), deps.metrics, record, stage=STAGE, error=exc)
        return outcome
    found = withdrawals.withdraw(record.key, withdrawal.tenant)
    log.debug("withdrawal of %s: %s", withdrawal.question_id, "told its answer" if found else "already answered")
    return outcome


async def outcome_of(record: ConsumerRecord, deps: AnswerDeps, topics: TopicDirectory, *, claims: ClaimCheck,
                     give_up: Callable[[], bool], slot: Slot = no_slot,
                     progress: Callable[[Outgoing], None] | None = None,
                     withdrawable: Withdrawable | None = None) -> Outcome | None:
    """Answer one question record in a `slot` of its lane, its tenant claim verified by `claims`; None only when a transient
    failure was still being retried and ``give_up()`` turned true (stopping, or the partition moved):
    the record stays uncommitted. A question that asked for progress has its steps handed to `progress`
    (consumers/progress.py), never to the outcome: they are not part of its transaction. A question its
    asker withdraws (`withdrawable`, consumers/withdrawals.py) stops being answered and gets a failed
    reply that says so, with no dead letter (nothing went wrong)."""
    settings = deps.settings
    outcome = Outcome()
    letter = outcome.letters_to(settings.topic_dlq)
    try:
        with tracing.span("decode question") as decoding:
            question = decode(record.value, Question, what="memory.questions event")
            tracing.set_attributes(decoding, {"epistream.question_id": question.question_id,
                                              "epistream.mode": question.mode.value})
            tracing.set_text(decoding, "epistream.question", question.question)
            # A claim not proven gets no answer at all: a failed one would still reach the claimed tenant.
            claims.verify(question.tenant, record.value or b"", header_pairs(record.headers))
            fallback = settings.topic_answers
            if claims.enforced:  # each tenant hears back on its own topic only
                fallback = tenant_reply_topic(settings.topic_answers, question.tenant)
                check_own_reply_topic(question.reply_topic, fallback)
                if not await topics.exists(fallback):
                    raise UnknownReplyTopic(f"tenant {question.tenant!r} has no reply topic {fallback!r}: "
                                            "onboard the tenant first")
    except Exception as exc:  # not a question, not proven its tenant's, or nowhere of its tenant's to reply
        await dead_letter(letter, deps.metrics, record, stage=STAGE, error=exc)
        return outcome
    if withdrawable is not None:
        withdrawable.asked_by(question.tenant)
    started = time.perf_counter()
    destination, partition = fallback, None
    steps = Steps.of(question, progress)

    async def attempt() -> Reply:
        nonlocal destination, partition
        destination, partition = fallback, None
        if question.reply_topic is not None:
            if not await topics.exists(question.reply_topic):
                raise UnknownReplyTopic(f"reply_topic {question.reply_topic!r} does not exist; "
                                        f"the failed answer went to {fallback}")
            destination = question.reply_topic
        if question.reply_partition is not None:
            if not await topics.has_partition(destination, question.reply_partition):
                raise UnknownReplyTopic(f"{destination} has no partition {question.reply_partition}; the failed "
                                        "answer went to the partition of the question id's hash")
            partition = question.reply_partition  # a failure from here on still reaches the asker's partition
        # Read-your-own-writes: never read before the asked positions are stored, or say so.
        incomplete = None if not question.after else await read_after(
            deps.read_pool, settings.topic_turns, question.after, timeout_s=settings.read_after_timeout_s,
            metrics=deps.metrics, log=deps.turns_log)
        steps.aim(destination, partition)
        reply: Reply
        async with slot(question):
            with tracing.span(f"{question.mode.value} question", attributes={"epistream.mode": question.mode.value}):
                if question.listing is not None:  # one conversation's gists or facts, or refused (consumers/listing.py)
                    reply = await read_listing(question, deps)
                elif question.mode is Mode.CONTEXT:
                    reply = await read_context(question, deps)
                else:
                    reply = await answer_question(question, deps, steps)
        return reply.model_copy(update={"incomplete": incomplete}) if incomplete else reply

    def waiting(exc: BaseException, attempt_no: int, delay: float) -> None:
        log.warning("question at %s[%d]@%d failed (%s), retry %d in %.1fs", record.topic, record.partition,
                    record.offset, type(exc).__name__, attempt_no, delay)

    try:
        reply = await unless_withdrawn(retry(attempt, backoff=BLOCKING, on_retry=waiting, stop=give_up), withdrawable)
    except Withdrawn as exc:
        log.info("question %s withdrawn by its asker: stopped answering it", question.question_id)
        reply = failed_reply(question, exc, started)
        deps.metrics.questions_answered.labels(mode_of(reply), "withdrawn").inc()
    except Exception as exc:
        if is_transient(exc):
            return None  # still retryable: only stopping or losing the partition ends the wait
        if not isinstance(exc, PermanentError):  # not an expected refusal: keep the traceback for a fix
            log.exception("question %s failed", question.question_id)
        reply = failed_reply(question, exc, started)
        deps.metrics.questions_answered.labels(mode_of(reply), "failed").inc()
        await dead_letter(letter, deps.metrics, record, stage=STAGE, error=exc)
    key = question.question_id.encode()
    fitted = fit_reply(reply, key)
    outcome.messages.insert(0, Outgoing(destination, key, fitted.to_bytes(), partition))
    outcome.answer = reply
    return outcome


def failed_reply(question: Question, error: BaseException, started: float) -> Reply:
    if question.mode is Mode.CONTEXT:
        return failed_context(question, error, started)
    return failed_answer(question, error, started)


def mode_of(reply: Reply) -> str:
    return Mode.CONTEXT.value if isinstance(reply, MemoryContext) else reply.mode.value


def _shrink_context(context: MemoryContext) -> MemoryContext | None:
    """A tenth fewer items (at least one), the lowest-ranked first: the reply stays a valid, smaller context."""
    if not context.items:
        return None
    kept = context.items[: max(0, len(context.items) - max(1, len(context.items) // 10))]
    return context.model_copy(update={"items": kept, "text": render(kept),
                                      "used_tokens": used_tokens(kept)})


def _shrink_answer(answer: Answer) -> Answer | None:
    """One evidence item fewer, from the end; with none left, the answer's text halved (with a mark)."""
    if answer.evidence:
        return answer.model_copy(update={"evidence": answer.evidence[:-1]})
    if len(answer.answer) > 64:
        return answer.model_copy(update={"answer": answer.answer[: len(answer.answer) // 2] + " [cut]"})
    return None


def _shrink(reply: Reply) -> Reply | None:
    return _shrink_context(reply) if isinstance(reply, MemoryContext) else _shrink_answer(reply)


def fit_reply(reply: Reply, key: bytes, limit: int = DEFAULT_MAX_REQUEST_SIZE) -> Reply:
    """The reply as one Kafka message carries it. A reply over the limit would fail its send on every
    retry, so it is shrunk (its least relevant parts first) until it fits, with a warning of how much went."""
    def size(candidate: Reply) -> int:
        return record_size(key, candidate.to_bytes())

    fitted = reply
    while size(fitted) > limit and (smaller := _shrink(fitted)) is not None:
        fitted = smaller
    if fitted is not reply:
        log.warning("reply to %s was %d bytes, over the %d-byte message limit: cut to %d bytes",
                    reply.question_id, size(reply), limit, size(fitted))
    return fitted


