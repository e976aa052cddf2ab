"""`epistream mcp` as a process, for the tests that drive it with an MCP client (the SDK's in test_mcp.py,
the agent frameworks' in test_frameworks.py): its command line, and a streamable-HTTP server on a free
port, waited for until it listens."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from .conftest import ROOT


def server_command(tenant: str, *extra: str) -> list[str]:
    """`epistream mcp --tenant T ...` with this interpreter (its venv has the `mcp` extra)."""
    return [sys.executable, "-m", "epistream.apps.cli.main", "mcp", "--tenant", tenant, *extra]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def http_server(tenant: str, env: Mapping[str, str] | None = None, *,
                      host: str = "127.0.0.1") -> AsyncIterator[str]:
    """`epistream mcp --transport http` for `tenant` (with `env`, else this process's environment) on a
    free port of `host`: its URL on loopback once it listens; terminated on leaving."""
    port = free_port()
    server = subprocess.Popen(server_command(tenant, "--transport", "http", "--host", host, "--port", str(port)),
                              cwd=ROOT, env=None if env is None else dict(env), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            if server.poll() is not None:
                raise AssertionError(f"the HTTP server exited: {server.communicate()[1].decode()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the HTTP server never listened"
                await asyncio.sleep(0.2)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.terminate()
        server.wait(timeout=30)
