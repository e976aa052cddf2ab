"""`epistream mcp --transport http` off loopback, on the real stack: without EPISTREAM_MCP_TOKEN it refuses
to start; with it every request needs `Authorization: Bearer <token>` (401 and a Bearer challenge
otherwise), and the SDK's own client that sends it lists and calls the tools (docs/mcp.md, "Over HTTP")."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping

import httpx2
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from .conftest import ROOT
from .mcp_servers import free_port, http_server, server_command

pytestmark = [pytest.mark.integration]

TOKEN = "s3cret-token-for-the-auth-test"
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "auth-test", "version": "0"}}}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def _env(**settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "EPISTREAM_MCP_TOKEN"}
    return env | settings


def _client(url: str, headers: Mapping[str, str] | None = None) -> Client:
    """The SDK's client of `url`, its HTTP requests carrying `headers`."""
    http = httpx2.AsyncClient(headers=dict(headers or {}), timeout=httpx2.Timeout(30, read=300))  # as docs/mcp.md
    return Client(streamable_http_client(url, http_client=http), read_timeout_seconds=120)


def test_off_loopback_without_a_token_it_refuses_to_start(unique):
    done = subprocess.run(server_command(unique("mcp-auth"), "--transport", "http", "--host", "0.0.0.0",
                                         "--port", str(free_port())),
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "EPISTREAM_MCP_TOKEN" in done.stderr and "0.0.0.0" in done.stderr, done.stderr


async def test_with_a_token_only_its_bearer_is_served(stack, unique):
    tenant, conversation = unique("mcp-auth"), unique("conv")
    async with http_server(tenant, _env(EPISTREAM_MCP_TOKEN=TOKEN), host="0.0.0.0") as url:
        async with httpx2.AsyncClient(timeout=30) as http:
            for headers, challenge in [
                ({}, 'Bearer realm="epistream"'),
                ({"Authorization": "Bearer not-the-token"}, 'error="invalid_token"'),
                ({"Authorization": f"Basic {TOKEN}"}, 'error="invalid_token"'),
                ({"Authorization": f"Bearer {TOKEN}x"}, 'error="invalid_token"'),
            ]:
                refused = await http.post(url, json=INITIALIZE, headers=MCP_HEADERS | headers)
                assert refused.status_code == 401, (headers, refused.status_code)
                assert refused.headers["www-authenticate"].startswith('Bearer realm="epistream"')
                assert challenge in refused.headers["www-authenticate"], refused.headers["www-authenticate"]
                assert TOKEN not in refused.text
            served = await http.post(url, json=INITIALIZE, headers=MCP_HEADERS | {"Authorization": f"Bearer {TOKEN}"})
            assert served.status_code == 200, served.text

        for headers in ({}, {"Authorization": "Bearer not-the-token"}):
            with pytest.raises(ExceptionGroup) as refused_client:  # the SDK's transport error for the 401
                async with _client(url, headers) as client:
                    await client.list_tools()
            assert refused_client.group_contains(MCPError, match="error response", depth=None), refused_client.value

        async with _client(url, {"Authorization": f"Bearer {TOKEN}"}) as client:
            assert {"remember", "recall", "ask", "forget"} <= {tool.name for tool in (await client.list_tools()).tools}
            remembered = await client.call_tool("remember", {"conversation_id": conversation, "turns": [
                {"speaker": "Ana", "text": "My bicycle is called Hermes."}]})
            assert not remembered.is_error, remembered.content[0].text
            recalled = await client.call_tool("recall", {"question": "bicycle Hermes",
                                                         "conversation_ids": [conversation]})
            assert not recalled.is_error, recalled.content[0].text
