"""The one error policy: how a topic value is decoded (and why it is refused), which failures are
retried, on what schedule, and how a record is dead-lettered."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import httpx
import openai
import psycopg
import pytest
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError, NodeNotReadyError, RecordTooLargeError

from epistream.consumers.prompts import AssistantReply
from epistream.contracts.dead_letters import DeadLetter
from epistream.contracts.decoding import decode
from epistream.contracts.questions import Question
from epistream.contracts.segments import Segment
from epistream.contracts.turns import SegmentCloseRequest, Turn
from epistream.core.metrics import Metrics
from epistream.core.retry import BLOCKING, Backoff, retry
from epistream.errors import ContractError, ModelOutputError, ModelUnavailable, is_transient
from epistream.messaging.dead_letters import dead_letter
from epistream.models.llm import ModelClient
from epistream.pipeline.records import RawRecord
from epistream.settings.models import JsonMode

TURN = {"tenant": "t", "conversation_id": "c", "turn_id": "t1", "speaker": "Alice", "text": "hi",
        "ts": "2024-01-01T10:00:00+00:00"}
CLOSE = {"kind": "segment_close", "tenant": "t", "conversation_id": "c", "after_turn_id": "t1"}
TURNS = (Turn, SegmentCloseRequest)


def reason(raw: bytes | None, model=TURNS, what: str = "memory.turns event") -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(ContractError) as caught:
        decode(raw, model, what=what)
    return str(caught.value)


# --- decode ---

def test_decode_reads_a_turn_or_a_close_request_by_its_kind():
    assert isinstance(decode(json.dumps(TURN).encode(), TURNS, what="memory.turns event"), Turn)
    assert isinstance(decode(json.dumps(CLOSE).encode(), TURNS, what="memory.turns event"), SegmentCloseRequest)
    question = decode(b'{"question_id": "q", "tenant": "t", "question": "when?"}', Question, what="q")
    assert question.question_id == "q"


def test_decode_says_where_the_json_breaks():
    text = reason(b'{"tenant": "t",\n "text": }')
    assert text.startswith("not a valid memory.turns event: invalid JSON:")
    assert "line 2 column 10" in text


def test_decode_names_each_failing_field():
    missing = reason(json.dumps({k: v for k, v in TURN.items() if k != "text"}).encode())
    assert "text: Field required" in missing
    naive = reason(json.dumps({**TURN, "ts": "2024-01-01T10:00:00"}).encode())
    assert naive.startswith("not a valid memory.turns event: ts:") and "timezone" in naive
    segment = {"tenant": "t", "conversation_id": "c", "segment_id": "s", "seq": 0, "close_reason": "gap",
               "overlap_turns": 0, "token_estimate": 9, "turns": [{**TURN, "turn_id": 1}]}
    for field in ("tenant", "conversation_id", "text"):
        segment["turns"][0].pop(field)
    nested = reason(json.dumps(segment).encode(), Segment, "memory.segments event")
    assert "turns.0.turn_id" in nested and nested.startswith("not a valid memory.segments event:")


def test_decode_refuses_empty_values_non_objects_and_bytes_that_are_not_text():
    assert reason(None) == "not a valid memory.turns event: empty message value"
    assert "value: Input should be a valid dictionary" in reason(b"[1, 2]")
    assert "'utf-8' codec can't decode byte 0x80 in position 0" in reason(b"\x80abc")


def test_an_unknown_kind_is_read_as_a_turn_and_refused_as_one():
    text = reason(json.dumps({**TURN, "kind": "rewind"}).encode())
    assert "kind: Extra inputs are not permitted" in text
    close_without_fields = reason(b'{"kind": "segment_close"}')
    assert "after_turn_id: Field required" in close_without_fields and "speaker" not in close_without_fields


def test_decode_keeps_the_pydantic_error_as_the_cause():
    with pytest.raises(ContractError) as caught:
        decode(b'{"question_id": "q"}', Question, what="memory.questions event")
    assert "tenant: Field required" in str(caught.value)
    assert caught.value.__cause__ is not None


# --- is_transient ---

REQUEST = httpx.Request("POST", "http://model/v1/chat/completions")


def status_error(code: int) -> openai.APIStatusError:
    return openai.APIStatusError("status", response=httpx.Response(code, request=REQUEST), body=None)


@pytest.mark.parametrize("exc", [
    psycopg.OperationalError("server closed the connection"),
    psycopg.errors.SerializationFailure("could not serialize"),
    psycopg.errors.DeadlockDetected("deadlock"),
    KafkaConnectionError("no broker"),
    NodeNotReadyError("rebalancing"),
    openai.APITimeoutError(request=REQUEST),
    openai.APIConnectionError(request=REQUEST),
    openai.RateLimitError("busy", response=httpx.Response(429, request=REQUEST), body=None),
    status_error(500),
    status_error(503),
    # No record can cause these: the deployment lacks a table, a column, an extension or a right.
    # Waiting for the operator beats dead-lettering every record that meets them.
    psycopg.errors.UndefinedTable('relation "memory.turns" does not exist'),
    psycopg.errors.UndefinedColumn("column does not exist"),
    psycopg.errors.UndefinedFunction("function ag_catalog.cypher does not exist"),
    psycopg.errors.UndefinedObject('type "vector" does not exist'),
    psycopg.errors.InvalidSchemaName('schema "memory" does not exist'),
    psycopg.errors.InsufficientPrivilege("permission denied for table turns"),
    psycopg.errors.InvalidPassword("password authentication failed"),
])
def test_what_waiting_can_fix_is_transient(exc):
    assert is_transient(exc)


@pytest.mark.parametrize("exc", [
    ValueError("bad"),
    ContractError("not a valid event"),
    ModelOutputError("invalid output"),
    ModelUnavailable("gave up"),  # already retried inside the model client: the caller decides
    psycopg.DataError("bad value"),
    psycopg.IntegrityError("duplicate"),
    status_error(400),
    status_error(404),
    psycopg.errors.SyntaxError("syntax error"),  # our own SQL is wrong: retrying cannot fix it
    MessageSizeTooLargeError(),  # this message will never fit, however long the worker waits
    RecordTooLargeError(),
])
def test_what_the_same_input_fails_again_is_not(exc):
    assert not is_transient(exc)


# --- backoff and retry ---

def test_the_blocking_schedule_doubles_from_one_second_up_to_thirty():
    assert [BLOCKING.delay(n, rand=lambda: 1.0) for n in range(1, 9)] == [1, 2, 4, 8, 16, 30, 30, 30]
    # jitter shortens a wait by up to half
    assert [BLOCKING.delay(n, rand=lambda: 0.0) for n in (1, 6)] == [0.5, 15.0]
    assert BLOCKING.delay(10_000, rand=lambda: 1.0) == 30.0, "a long outage never overflows the schedule"


def test_the_schedule_matches_the_formulas_it_replaced():
    for n in range(1, 12):
        for r in (0.0, 0.3, 0.99):
            # the ingest store and the answer worker, before
            assert BLOCKING.delay(n, rand=lambda r=r: r) == min(30.0, 0.5 * 2 ** min(n, 6)) * (0.5 + r / 2)
            # a model call between attempts, before
            between = Backoff(first_s=0.5, jitter_low=0.5, jitter_high=1.5)
            assert between.delay(n, rand=lambda r=r: r) == 0.5 * (2 ** (n - 1)) * (0.5 + r)


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def failing(times: int, exc: Exception, calls: list[int]):  # type: ignore[no-untyped-def]
    async def operation() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise exc
        return "done"
    return operation


def test_retry_waits_by_the_schedule_until_it_works():
    fake, calls, told = FakeTime(), [], []
    result = asyncio.run(retry(
        failing(4, psycopg.OperationalError("down"), calls), backoff=BLOCKING, sleep=fake.sleep,
        rand=lambda: 1.0, on_retry=lambda exc, n, delay: told.append((type(exc).__name__, n, delay)),
    ))
    assert result == "done" and len(calls) == 5
    assert fake.slept == [1.0, 2.0, 4.0, 8.0]
    assert told == [("OperationalError", n, d) for n, d in zip(range(1, 5), fake.slept)]


def test_retry_raises_at_once_what_is_not_transient():
    fake, calls = FakeTime(), []
    with pytest.raises(psycopg.DataError):
        asyncio.run(retry(failing(3, psycopg.DataError("bad"), calls), backoff=BLOCKING, sleep=fake.sleep))
    assert len(calls) == 1 and fake.slept == []


def test_retry_gives_up_after_its_attempts():
    fake, calls = FakeTime(), []
    with pytest.raises(KafkaConnectionError):
        asyncio.run(retry(failing(9, KafkaConnectionError("no"), calls), backoff=Backoff(first_s=0.5),
                          attempts=3, sleep=fake.sleep, rand=lambda: 0.0))
    assert len(calls) == 3 and fake.slept == [0.25, 0.5]


def test_retry_stops_before_a_wait_that_would_end_past_its_deadline():
    fake, calls = FakeTime(), []
    restart = Backoff(first_s=1.0, cap_s=5.0, jitter_low=1.0, jitter_high=1.0)
    with pytest.raises(ConnectionRefusedError):
        asyncio.run(retry(failing(99, ConnectionRefusedError(), calls), backoff=restart,
                          retry_on=lambda exc: isinstance(exc, ConnectionRefusedError), within_s=20.0,
                          sleep=fake.sleep, clock=fake.clock))
    # 1 + 2 + 4 + 5 = 12 s waited; the next 5 s wait would end at 17 s... then 22 s > 20 s
    assert fake.slept == [1.0, 2.0, 4.0, 5.0, 5.0] and len(calls) == 6


def test_retry_gives_up_when_told_to_stop_after_reporting_the_failure():
    fake, calls, told = FakeTime(), [], []
    with pytest.raises(psycopg.OperationalError):
        asyncio.run(retry(failing(9, psycopg.OperationalError("down"), calls), backoff=BLOCKING,
                          stop=lambda: len(calls) >= 2, on_retry=lambda *a: told.append(a), sleep=fake.sleep))
    assert len(calls) == 2 and len(fake.slept) == 1 and len(told) == 2


# --- dead letters ---

def test_dead_letter_builds_counts_and_sends_the_record_keyed_as_it_was():
    metrics, sent = Metrics.create(), []

    async def send(key: bytes | None, value: bytes) -> None:
        sent.append((key, value))

    record = RawRecord(topic="memory.turns", partition=3, offset=17, key=b"c1", value=b"{oops")
    error = ContractError("not a valid memory.turns event: invalid JSON")
    letter = asyncio.run(dead_letter(send, metrics, record, stage="ingest", error=error, attempts=2))
    assert len(sent) == 1 and sent[0][0] == b"c1"
    again = DeadLetter.model_validate_json(sent[0][1])
    assert again == letter
    assert (again.topic, again.partition, again.offset, again.stage, again.attempts) == ("memory.turns", 3, 17, "ingest", 2)
    assert again.error_class == "ContractError" and again.error_message == str(error)
    assert again.original_value() == b"{oops" and again.original_key() == b"c1"
    counted = metrics.registry.get_sample_value(
        "epistream_dlq_messages_total", {"stage": "ingest", "error_class": "ContractError"})
    assert counted == 1.0


# --- the model client's two waits ---

class RefusingCompletions:
    """A chat endpoint that refuses `refusals` connections, then replies with `reply`."""

    def __init__(self, refusals: int, reply: str) -> None:
        self.refusals, self.reply, self.calls = refusals, reply, 0

    async def create(self, **_request):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls <= self.refusals:
            raise openai.APIConnectionError(request=REQUEST)
        message = SimpleNamespace(content=self.reply, tool_calls=None)
        return SimpleNamespace(choices=[SimpleNamespace(message=message)], usage=None)


def model_client(completions: RefusingCompletions, *, restart_wait_s: float, max_retries: int = 0):  # type: ignore[no-untyped-def]
    client = SimpleNamespace(chat=SimpleNamespace(completions=completions))
    return ModelClient(client, role="master", model="m", json_mode=JsonMode.LLAMA_CPP, metrics=Metrics.create(),
                       max_retries=max_retries, backoff_s=0.01, endpoint_label="model:1",
                       restart_wait_s=restart_wait_s)


def test_the_model_client_waits_out_a_restarting_server_within_one_attempt():
    completions = RefusingCompletions(3, '{"relevant": false}')
    result = asyncio.run(model_client(completions, restart_wait_s=5.0).complete_json([], AssistantReply, max_tokens=8))
    assert completions.calls == 4 and result.attempts == 1 and result.value.relevant is False


def test_without_a_restart_wait_a_refusal_is_a_failed_attempt():
    completions = RefusingCompletions(9, "{}")
    with pytest.raises(ModelUnavailable, match="APIConnectionError"):
        asyncio.run(model_client(completions, restart_wait_s=0.0, max_retries=1).complete_json(
            [], AssistantReply, max_tokens=8))
    assert completions.calls == 2, "one call per attempt: nothing waited for a restart"
