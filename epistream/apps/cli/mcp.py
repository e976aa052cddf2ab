"""`epistream mcp`: the MCP server's verb (docs/mcp.md). The SDK is the `mcp` extra, imported only here,
when the verb runs."""

from __future__ import annotations

import argparse
import sys

from epistream.core import tracing
from epistream.settings.processes import load_settings


def cmd_mcp(args: argparse.Namespace) -> int:
    from epistream.apps.mcp.arguments import ArgumentError, served_tenant
    from epistream.apps.mcp.auth import exposure_error
    from epistream.settings.processes import McpServerSettings

    settings = load_settings(McpServerSettings)
    tracing.setup("epistream-mcp")  # what its tools produce carries their trace (docs/tracing.md)
    try:
        tenant = served_tenant(args.tenant or settings.mcp_tenant)
    except ArgumentError as exc:
        print(f"epistream mcp: {exc}", file=sys.stderr)
        return 2
    if args.transport == "http" and (refusal := exposure_error(args.host, settings.mcp_token is not None)):
        print(f"epistream mcp: {refusal}", file=sys.stderr)
        return 2
    try:
        from epistream.apps.mcp.server import serve
    except ImportError as exc:  # the base install has no SDK
        print(f"epistream mcp needs the MCP SDK ({exc.name}): pip install 'epistream[mcp]'", file=sys.stderr)
        return 2
    serve(settings, tenant=tenant, transport=args.transport, host=args.host, port=args.port)
    return 0


def add_mcp_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("mcp", help="an MCP server for agents (remember, recall, ask, forget) for one tenant, "
                                   "over stdio or streamable HTTP (docs/mcp.md)")
    p.add_argument("--tenant", help="the tenant it serves (default: EPISTREAM_MCP_TENANT)")
    p.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    p.add_argument("--host", default="127.0.0.1", help="HTTP: the address to listen on")
    p.add_argument("--port", type=int, default=8765, help="HTTP: the port (the endpoint is /mcp)")
    p.set_defaults(func=cmd_mcp)
