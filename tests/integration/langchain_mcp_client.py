"""LangChain's MCP client (langchain-mcp-adapters) calling epistream's MCP tools, as an agent built on
LangChain or LangGraph does. Run by tests/integration/test_frameworks.py with the Python of a venv of its
own: every adapters release needs mcp<2 (pyproject's `langchain-mcp` extra), the server runs on mcp 2.

Reads JSON on stdin, {"connection": <a MultiServerMCPClient connection>, "calls": [[tool, arguments], ...]};
writes JSON on stdout, {"tools": [names], "results": [{"text", "structured"}, ...]}. A tool error fails
the run (the adapters raise it)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.tools import load_mcp_tools


async def main(request: dict[str, Any]) -> dict[str, Any]:
    client = MultiServerMCPClient({"epistream": request["connection"]})
    # One session for every call: the server keeps the positions `remember` wrote, which `recall` waits
    # for (read your own writes); client.get_tools() would start a session, and so a server, per call.
    async with client.session("epistream") as session:
        tools = {tool.name: tool for tool in await load_mcp_tools(session)}
        results = []
        for n, (name, arguments) in enumerate(request["calls"]):
            # A tool call (not bare arguments): the reply is a ToolMessage with the structured content too.
            message = await tools[name].ainvoke({"type": "tool_call", "id": f"call-{n}", "name": name,
                                                 "args": arguments})
            results.append({"text": message.text, "structured": (message.artifact or {}).get("structured_content")})
    return {"tools": sorted(tools), "results": results}


if __name__ == "__main__":
    json.dump(asyncio.run(main(json.load(sys.stdin))), sys.stdout)
