"""epistream from the agent frameworks people use, on the real stack (docs/mcp.md, "From agent frameworks"):
LangChain/LangGraph's MCP client (langchain-mcp-adapters) and the OpenAI Agents SDK's (MCPServerStdio,
MCPServerStreamableHttp) load epistream's MCP tools and call `remember`, then `recall`, over stdio and
streamable HTTP; the LangChain retriever (epistream.integrations.langchain) returns what was remembered
with its metadata, sync and async. No model: a deployment of its own with real ingest and answer workers,
whose model endpoint must receive nothing (recall and the context read make no model call)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from agents.mcp import MCPServer, MCPServerStdio, MCPServerStreamableHttp
from langchain_core.documents import Document

from epistream.client.session import EpistreamClient
from epistream.contracts.turns import Turn
from epistream.integrations.langchain import EpistreamRetriever

from .conftest import ROOT
from .mcp_servers import http_server, server_command
from .scripted_worker import Scripted, no_model_call, scripted_worker

pytestmark = pytest.mark.integration

METRICS_PORT = int(os.environ.get("EPISTREAM_SUPERVISOR_METRICS_PORT", "29103")) + 110  # beside the other tests' ports
#: langchain-mcp-adapters needs mcp<2, the server mcp 2: the Makefile gives it a venv of its own beside this one.
LANGCHAIN_MCP_PYTHON = Path(sys.prefix + "-langchain-mcp") / "bin" / "python"
LANGCHAIN_MCP_CLIENT = Path(__file__).with_name("langchain_mcp_client.py")
CALL_TIMEOUT_S = 120.0
SAID = datetime(2024, 5, 2, 9, 0, tzinfo=UTC)
TOOLS = {"remember", "recall", "ask", "forget", "events"}


@pytest.fixture(scope="module")
def workers(kafka) -> Iterator[Scripted]:
    with scripted_worker(kafka, no_model_call, metrics_port=METRICS_PORT, name="frameworks",
                         workers=("ingest", "answer")) as running:
        yield running


def _phrase() -> str:
    return f"a {uuid.uuid4().hex[:6]} kayak"  # words of its own: only this test's turn says them


def _calls(conversation: str, phrase: str) -> list[tuple[str, dict[str, Any]]]:
    """`remember` a turn that says `phrase`, then `recall` it at once (the read waits for the write)."""
    return [("remember", {"conversation_id": conversation, "turns": [
                {"speaker": "Ines", "text": f"I paddle {phrase} on the Douro.", "time": SAID.isoformat(),
                 "turn_id": "t1"}]}),
            ("recall", {"question": f"Who paddles {phrase}?", "budget_tokens": 300,
                        "conversation_ids": [conversation]})]


def _remembered_and_recalled(results: list[dict[str, Any] | None], conversation: str, phrase: str) -> None:
    remembered, recalled = results
    assert remembered is not None and remembered["produced"] == 1 and remembered["turn_ids"] == ["t1"], remembered
    assert recalled is not None and "incomplete" not in recalled, recalled
    assert [(i["conversation_id"], i["turn_id"]) for i in recalled["items"] if phrase in i["text"]] == [
        (conversation, "t1")], recalled


# -- LangChain / LangGraph: langchain-mcp-adapters, in its own venv --

async def _langchain_mcp(connection: dict[str, Any], calls: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    assert LANGCHAIN_MCP_PYTHON.exists(), f"no {LANGCHAIN_MCP_PYTHON}: `make setup` makes it"
    done = await asyncio.to_thread(
        subprocess.run, [str(LANGCHAIN_MCP_PYTHON), str(LANGCHAIN_MCP_CLIENT)], cwd=ROOT, capture_output=True,
        text=True, timeout=CALL_TIMEOUT_S * 2, input=json.dumps({"connection": connection, "calls": calls}))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _langchain_stdio(workers: Scripted, tenant: str) -> dict[str, Any]:
    command, *args = server_command(tenant)
    assert workers.deployment is not None
    return {"transport": "stdio", "command": command, "args": args, "env": workers.deployment.env, "cwd": str(ROOT)}


async def test_langchain_mcp_adapters_over_stdio_remember_then_recall(workers, unique):
    tenant, conversation, phrase = unique("lc-stdio"), unique("conv"), _phrase()
    ran = await _langchain_mcp(_langchain_stdio(workers, tenant), _calls(conversation, phrase))
    assert TOOLS <= set(ran["tools"])
    _remembered_and_recalled([r["structured"] for r in ran["results"]], conversation, phrase)
    assert phrase in ran["results"][1]["text"]  # the prompt-ready block the model reads


async def test_langchain_mcp_adapters_over_streamable_http_remember_then_recall(workers, unique):
    tenant, conversation, phrase = unique("lc-http"), unique("conv"), _phrase()
    assert workers.deployment is not None
    async with http_server(tenant, workers.deployment.env) as url:
        ran = await _langchain_mcp({"transport": "streamable_http", "url": url}, _calls(conversation, phrase))
    assert TOOLS <= set(ran["tools"])
    _remembered_and_recalled([r["structured"] for r in ran["results"]], conversation, phrase)


# -- the OpenAI Agents SDK: its MCP server objects, no model --

async def _agents_sdk(server: MCPServer, conversation: str, phrase: str) -> None:
    async with server:
        assert TOOLS <= {tool.name for tool in await server.list_tools()}
        results = []
        for name, arguments in _calls(conversation, phrase):
            result = await server.call_tool(name, arguments)
            assert not result.is_error, result.content
            results.append(result.structured_content)
    _remembered_and_recalled(results, conversation, phrase)


async def test_openai_agents_mcp_server_stdio_lists_and_calls_the_tools(workers, unique):
    tenant, conversation, phrase = unique("oa-stdio"), unique("conv"), _phrase()
    command, *args = server_command(tenant)
    assert workers.deployment is not None
    server = MCPServerStdio({"command": command, "args": args, "env": workers.deployment.env, "cwd": str(ROOT)},
                            name="epistream", client_session_timeout_seconds=CALL_TIMEOUT_S)
    await _agents_sdk(server, conversation, phrase)


async def test_openai_agents_mcp_server_streamable_http_lists_and_calls_the_tools(workers, unique):
    tenant, conversation, phrase = unique("oa-http"), unique("conv"), _phrase()
    assert workers.deployment is not None
    async with http_server(tenant, workers.deployment.env) as url:
        server = MCPServerStreamableHttp({"url": url, "timeout": CALL_TIMEOUT_S}, name="epistream",
                                         client_session_timeout_seconds=CALL_TIMEOUT_S)
        await _agents_sdk(server, conversation, phrase)


# -- the LangChain retriever over the context read --

def _turn(tenant: str, conversation: str, phrase: str) -> Turn:
    return Turn(tenant=tenant, conversation_id=conversation, turn_id="t1", speaker="Ines",
                text=f"I paddle {phrase} on the Douro.", ts=SAID)


def _found(documents: list[Document], turn: Turn) -> None:
    """The turn is among the documents, verbatim, with its ids, conversation, time and score."""
    mine = [d for d in documents if d.metadata.get("turn_id") == turn.turn_id]
    assert len(mine) == 1 and mine[0].page_content == turn.text, documents
    metadata = mine[0].metadata
    assert (metadata["kind"], metadata["conversation_id"], metadata["turn_ids"], metadata["speaker"]) == (
        "turn", turn.conversation_id, [turn.turn_id], turn.speaker), metadata
    assert datetime.fromisoformat(metadata["time"]) == turn.ts and metadata["rank"] >= 1
    assert metadata["score"] > 0 and "incomplete" not in metadata and mine[0].id == turn.turn_id


def test_the_retriever_returns_what_was_remembered_sync(workers, unique):
    tenant, conversation, phrase = unique("lc-ret"), unique("conv"), _phrase()
    turn = _turn(tenant, conversation, phrase)

    async def remember() -> dict:
        async with EpistreamClient(workers.settings) as client:
            return await client.produce_turns([turn])

    retriever = EpistreamRetriever(settings=workers.settings, tenant=tenant, conversation_ids=[conversation],
                                   budget_tokens=300, after=asyncio.run(remember()))
    _found(retriever.invoke(f"Who paddles {phrase}?"), turn)


async def test_the_retriever_returns_what_was_remembered_async(workers, unique):
    tenant, conversation, phrase = unique("lc-aret"), unique("conv"), _phrase()
    turn = _turn(tenant, conversation, phrase)
    async with EpistreamClient(workers.settings) as client:
        retriever = EpistreamRetriever(settings=workers.settings, client=client, tenant=tenant,
                                       conversation_ids=[conversation], budget_tokens=300,
                                       after=await client.produce_turns([turn]))
        _found(await retriever.ainvoke(f"Who paddles {phrase}?"), turn)
    # Without a client of the caller's, a read has one of its own; another tenant's retriever finds nothing.
    mine = EpistreamRetriever(settings=workers.settings, tenant=tenant, conversation_ids=[conversation])
    _found(await mine.ainvoke(f"Who paddles {phrase}?"), turn)
    theirs = EpistreamRetriever(settings=workers.settings, tenant=unique("lc-other"), conversation_ids=[conversation])
    assert await theirs.ainvoke(f"Who paddles {phrase}?") == []
