"""Interop smoke test: the MCP Inspector's CLI (@modelcontextprotocol/inspector, pinned in the Makefile),
a client written by others in another language, drives `epistream mcp` over stdio on the real stack:
tools/list, remember, recall sees it, the conversation's resources listed and read (docs/mcp.md,
"Conformance and interop")."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import ROOT
from .mcp_servers import server_command
from .node_tools import node_env, node_tool

pytestmark = [pytest.mark.integration]


async def _inspect(inspector: Path, tenant: str, catalog: Path, *request: str) -> Any:
    """One Inspector CLI request to a stdio `epistream mcp` it starts for `tenant`: its JSON answer."""
    settings = [f"-e{key}={value}" for key, value in os.environ.items() if key.startswith("EPISTREAM_")]
    command = [str(inspector), "--cli", *request, *settings, f"-ePYTHONPATH={ROOT}", "--cwd", str(ROOT),
               "--", sys.executable, *server_command(tenant)[1:]]
    done = await asyncio.to_thread(subprocess.run, command, env=node_env() | {"MCP_CATALOG_PATH": str(catalog)},
                                   capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (request, done.stdout[-2000:], done.stderr[-2000:])
    return json.loads(done.stdout)


async def test_the_inspector_cli_lists_calls_and_reads_over_stdio(stack, unique, tmp_path):
    inspector = node_tool("mcp-inspector")
    tenant, conversation = unique("mcp-inspector"), unique("conv")
    catalog = tmp_path / "catalog.json"  # the Inspector's own list of servers, kept out of $HOME

    listed = await _inspect(inspector, tenant, catalog, "--method", "tools/list")
    assert {"remember", "recall", "ask", "forget", "events"} <= {tool["name"] for tool in listed["tools"]}

    turns = [{"speaker": "Ana", "text": "My kayak is called Pelican."}]
    remembered = await _inspect(inspector, tenant, catalog, "--method", "tools/call", "--tool-name", "remember",
                                "--tool-arg", f"conversation_id={conversation}", f"turns={json.dumps(turns)}")
    assert not remembered["isError"] and remembered["structuredContent"]["produced"] == 1, remembered

    deadline = time.monotonic() + 60  # each call is a new server: no read-your-own-writes across them
    while True:
        recalled = await _inspect(inspector, tenant, catalog, "--method", "tools/call", "--tool-name", "recall",
                                  "--tool-arg", "question=what is the kayak called",
                                  f"conversation_ids={json.dumps([conversation])}")
        assert not recalled["isError"], recalled
        if "Pelican" in recalled["content"][0]["text"]:
            break
        assert time.monotonic() < deadline, recalled
        await asyncio.sleep(1)

    resources = await _inspect(inspector, tenant, catalog, "--method", "resources/list")
    uris = {resource["uri"] for resource in resources["resources"]}
    timeline = f"epistream://conversations/{conversation}/timeline"
    assert {timeline, f"epistream://conversations/{conversation}/facts"} <= uris, uris
    read = await _inspect(inspector, tenant, catalog, "--method", "resources/read", "--uri", timeline)
    assert read["contents"][0]["uri"] == timeline and read["contents"][0]["mimeType"] == "text/plain", read
