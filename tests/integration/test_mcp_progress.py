"""`ask`'s progress and cancellation through the MCP SDK's own client, on real ingest and answer workers
(a deployment of their own) whose models are a scripted server: exact replies, and a master that holds
its answer until the test lets it, so the test knows where the worker is without timing anything.

A deep ask with a progress callback gets a notification for each step (the mode, memory found, each
assistant read, the master's call), values 1, 2, ..., before its result; an ask without a token gets
its answer as before and the worker sends no progress record for it; with tenant claims checked the
progress comes on the tenant's own reply topic; a cancelled ask ends at once, the server says so with
nothing left waiting, the worker stops answering it (the client withdrew it), and the server keeps answering."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

import pytest
from mcp import Client
from mcp.client.stdio import stdio_client
from pydantic import SecretStr

from epistream.consumers.prompts import ASSISTANT_PROMPT
from epistream.contracts.replies import Answer, Progress, is_progress, progress_key
from epistream.core.claims import tenant_key
from epistream.messaging.tenant_topics import tenant_reply_topic
from epistream.testing.scripted_llm import Reply, ScriptedLLM

from .conftest import read_topic
from .deployments import BASE_PORT, Deployment, deployments
from .test_mcp import CALL_TIMEOUT_S, SECRET, _http, _ok, _params, _remembered, _stdio, _until

pytestmark = [pytest.mark.integration]

PHRASE = "a tortoise named Quasimodo"
SAID = f"I keep {PHRASE} in my garden in Braga."
ANSWER = "In her garden in Braga."
#: A question holding this waits for the test's `release` before the master answers.
HOLD = "[hold]"
#: The longest a held master waits (the test releases it within seconds; a failing test fails sooner).
HOLD_S = 60.0


class Models:
    """The scripted models: an assistant quotes the turn that says PHRASE (else finds nothing); the
    master answers from quote [1], first waiting for `release` when the question says HOLD."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __call__(self, body: dict) -> Reply:
        prompt = body["messages"][-1]["content"]
        if ASSISTANT_PROMPT.template in body["messages"][0]["content"]:
            found = re.search(r"\(([^()]+)\) Ines: " + re.escape(SAID), prompt)
            evidence = [{"turn_id": found.group(1), "quote": SAID}] if found else []
            return 200, json.dumps({"relevant": bool(found), "evidence": evidence})
        if HOLD in prompt and not self.release.wait(timeout=HOLD_S):
            return 500, "the test never released the master"
        return 200, json.dumps({"answer": ANSWER, "abstain": False, "evidence": [1]})


@pytest.fixture(scope="module")
def memory(kafka) -> Iterator[tuple[Deployment, Models]]:
    """A deployment with its ingest and answer workers, the scripted models serving every role."""
    models = Models()
    with ScriptedLLM(models) as llm, deployments(kafka, 1, name="mcpprog", llm_base_url=llm.base_url,
                                                 assistant_base_urls=llm.base_url, llm_max_retries=0) as made:
        deployment = made[0]
        ingest, answer = deployment.run("ingest", BASE_PORT + 24), deployment.run("answer", BASE_PORT + 25)
        try:
            yield deployment, models
        finally:
            models.release.set()  # a master still holding lets go, so the worker stops at once
            ingest.stop()
            answer.stop()


@asynccontextmanager
async def _remembering(deployment: Deployment, transport: str) -> AsyncIterator[tuple[Client, str]]:
    """A server of a tenant of its own on `deployment` over `transport`, that has remembered SAID."""
    tenant, conversation = f"mcp-prog-{uuid.uuid4().hex[:8]}", f"conv-{uuid.uuid4().hex[:8]}"
    opened = _stdio(tenant, deployment.env) if transport == "stdio" else _http(tenant, deployment.env)
    async with opened as client:
        await _remembered(client, conversation, PHRASE, [{"speaker": "Ines", "text": SAID},
                                                         {"speaker": "Sam", "text": "How old is the tortoise?"}])
        yield client, conversation


def _question(conversation: str, text: str, mode: str = "deep") -> dict[str, Any]:
    return {"question": text, "mode": mode, "conversation_ids": [conversation]}


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_deep_ask_reports_its_steps_before_its_answer_and_one_without_a_token_none(memory, transport):
    deployment, models = memory
    models.release.clear()
    seen: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((value, message))
        if message == "deep: the master model answers":
            models.release.set()  # the master answers only once this reached the client: it came first

    async def drive() -> tuple[dict[str, Any], dict[str, Any]]:
        async with _remembering(deployment, transport) as (client, conversation):
            asked = await client.call_tool("ask", _question(conversation, f"Where does Ines keep her tortoise? {HOLD}"),
                                           progress_callback=on_progress)
            assert not asked.is_error, asked.content[0].text
            plain = await _ok(client, "ask", _question(conversation, "Where does Ines keep her tortoise?"))
            return asked.structured_content, plain

    with_progress, plain = asyncio.run(drive())
    assert with_progress["answer"] == plain["answer"] == ANSWER
    assert [e["quote"] for e in with_progress["evidence"]] == [SAID]

    # Every step, in order, counted 1, 2, ...: the mode, what was found, each read as it ended, the master.
    messages = [message for _, message in seen]
    found = re.fullmatch(r"deep: (\d+) item\(s\) of memory found", messages[1] or "")
    assert found and int(found.group(1)) >= 1, messages
    reads = int(found.group(1))
    assert messages == ["answering in deep mode", messages[1],
                        *[f"deep: assistant read {n}/{reads}" for n in range(1, reads + 1)],
                        "deep: the master model answers"]
    assert [value for value, _ in seen] == list(range(1, len(seen) + 1))
    assert not any(word in " ".join(messages) for word in ("Quasimodo", "Braga", "tortoise"))  # never the text

    # On the reply topic: the progress records of the ask that asked, all before its reply; none of the other.
    topic = deployment.settings.topic_answers
    wanted = {with_progress["question_id"].encode(), plain["question_id"].encode(),
              progress_key(with_progress["question_id"]), progress_key(plain["question_id"])}
    records = asyncio.run(read_topic(deployment.settings, topic, lambda k, v: k in wanted, want=len(seen) + 2,
                                     timeout=30))
    progress = [r for r in records if is_progress(r.headers)]
    replies = {Answer.from_bytes(r.value).question_id: r for r in records if not is_progress(r.headers)}
    assert set(replies) == {with_progress["question_id"], plain["question_id"]}
    assert {r.key for r in progress} == {progress_key(with_progress["question_id"])}
    assert [Progress.from_bytes(r.value).seq for r in progress] == list(range(1, len(seen) + 1))
    reply = replies[with_progress["question_id"]]
    assert all((r.partition, r.offset < reply.offset) == (reply.partition, True) for r in progress)


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_cancelled_ask_ends_at_once_and_the_server_stops_waiting(memory, tmp_path: Path, transport: str):
    """Over stdio the SDK's client sends notifications/cancelled, over streamable HTTP it closes the call's
    stream: either way the call ends at once, the server stops waiting (stdio: its log says so, nothing
    left waiting) and withdraws the question, so the worker replies "withdrawn" while its master still
    holds; the next ask is answered."""
    deployment, models = memory
    models.release.clear()
    errlog = tmp_path / "server.stderr"
    tenant, conversation = f"mcp-cancel-{uuid.uuid4().hex[:8]}", f"conv-{uuid.uuid4().hex[:8]}"

    def connected(stderr: TextIO) -> AbstractAsyncContextManager[Client]:
        if transport == "http":
            return _http(tenant, deployment.env)
        return Client(stdio_client(_params(tenant, deployment.env), errlog=stderr), read_timeout_seconds=CALL_TIMEOUT_S)

    async def drive() -> float:
        master_called = asyncio.Event()

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            if message == "deep: the master model answers":
                master_called.set()

        with errlog.open("w") as stderr:
            async with connected(stderr) as client:
                await _remembered(client, conversation, PHRASE, [{"speaker": "Ines", "text": SAID}])
                call = asyncio.create_task(client.call_tool(
                    "ask", _question(conversation, f"Where does Ines keep her tortoise? {HOLD}"),
                    progress_callback=on_progress))
                await asyncio.wait_for(master_called.wait(), CALL_TIMEOUT_S)  # the server waits on the answer now
                cancelled_at = time.monotonic()
                call.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await call
                ended_in = time.monotonic() - cancelled_at

                if transport == "stdio":
                    async def said_so() -> bool:
                        return "cancelled by its client" in errlog.read_text()
                    await _until(said_so, what="the server logs the cancellation")
                # The server withdrew the question: the worker stops answering it while its master still holds
                # (never released yet), and replies that it was withdrawn, so its partition's commit moves on.
                withdrawn = await read_topic(deployment.settings, deployment.settings.topic_answers,
                                             lambda k, v: b"withdrawn by its asker" in (v or b"")
                                             and tenant.encode() in (v or b""), timeout=30)
                assert len(withdrawn) == 1 and not models.release.is_set()
                assert Answer.from_bytes(withdrawn[0].value).error.startswith("Withdrawn: withdrawn by its asker")
                models.release.set()
                after = await _ok(client, "ask", _question(conversation, "Where does Ines keep her tortoise?", "fast"))
                assert after["answer"] == ANSWER
                return ended_in

    ended_in = asyncio.run(drive())
    assert ended_in < 5.0, f"the cancelled call took {ended_in:.1f}s to end"
    if transport == "stdio":
        line = next(line for line in errlog.read_text().splitlines() if "cancelled by its client" in line)
        assert "stopped waiting for the answer (0 call(s) still waiting, 0 listening to progress)" in line, line


def test_with_claims_on_progress_comes_on_the_tenants_own_reply_topic(kafka):
    """Tenant claims checked: a server holding A's key gets A's progress, which the worker sends to A's own
    reply topic (where A's reply goes, readable with A's login), never to the shared one."""
    tenant, conversation = f"mcp-prog-claims-{uuid.uuid4().hex[:8]}", f"conv-{uuid.uuid4().hex[:8]}"
    models = Models()
    with ScriptedLLM(models) as llm, deployments(kafka, 1, name="mcpprogc", tenant_key_secret=SecretStr(SECRET),
                                                 llm_base_url=llm.base_url, assistant_base_urls=llm.base_url,
                                                 llm_max_retries=0) as made:
        guarded = made[0]
        assert guarded.cli("tenant", "add", tenant).returncode == 0  # A's reply topic
        backend = {k: v for k, v in guarded.env.items() if k != "EPISTREAM_TENANT_KEY_SECRET"} | {
            "EPISTREAM_MCP_TENANT_KEY": tenant_key(SECRET.encode(), tenant).hex()}
        ingest, answer = guarded.run("ingest", BASE_PORT + 26), guarded.run("answer", BASE_PORT + 27)
        seen: list[str | None] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            seen.append(message)
            if message == "deep: the master model answers":
                models.release.set()

        async def drive() -> dict[str, Any]:
            async with _stdio(tenant, backend) as client:
                await _remembered(client, conversation, PHRASE, [{"speaker": "Ines", "text": SAID}])
                asked = await client.call_tool("ask", _question(conversation, f"Where does Ines keep her tortoise? "
                                                                              f"{HOLD}"),
                                               progress_callback=on_progress)
                assert not asked.is_error, asked.content[0].text
                return asked.structured_content
        try:
            asked = asyncio.run(drive())
            own = tenant_reply_topic(guarded.settings.topic_answers, tenant)
            key = progress_key(asked["question_id"])
            on_own, on_shared = (asyncio.run(read_topic(guarded.settings, topic, lambda k, v: k == key,
                                                        want=want, timeout=timeout))
                                 for topic, want, timeout in [(own, len(seen), 30), (guarded.settings.topic_answers,
                                                                                     1, 3)])
        finally:
            models.release.set()
            ingest.stop()
            answer.stop()
    assert asked["answer"] == ANSWER and seen[0] == "answering in deep mode" and seen[-1] == "deep: the master model answers"
    assert [Progress.from_bytes(r.value).describe() for r in on_own] == seen and on_shared == []
