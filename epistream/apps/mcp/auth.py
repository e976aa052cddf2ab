"""The streamable-HTTP endpoint's login: one static bearer token (EPISTREAM_MCP_TOKEN), checked in
constant time by an ASGI middleware around the SDK's app, and the rule that an address off loopback
needs one. A 401 carries the challenge of RFC 6750 that the MCP authorization spec asks for; there
is no OAuth authorization server behind it, so no `resource_metadata` (docs/mcp.md, "Over HTTP")."""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

REALM = "epistream"


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or a name to listen on) is reachable from this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # another name: it may resolve to anything
        return False


def exposure_error(host: str, has_token: bool) -> str | None:
    """Why the HTTP server must not start on `host`, or None."""
    if has_token or is_loopback(host):
        return None
    return (f"listening on {host} (not loopback) needs a login: set EPISTREAM_MCP_TOKEN to a secret of at least "
            "16 characters, which every client then sends as `Authorization: Bearer <token>`")


def bearer_of(authorization: bytes | None) -> bytes | None:
    """The credentials of an `Authorization: Bearer ...` header (the scheme in any case), or None."""
    if authorization is None:
        return None
    scheme, _, credentials = authorization.strip().partition(b" ")
    if scheme.lower() != b"bearer" or not credentials.strip():
        return None
    return credentials.strip()


def challenge(authorization: bytes | None, token: bytes) -> str | None:
    """None when the header carries `token`; else the WWW-Authenticate value of the 401. A request with no
    credentials gets no error code (RFC 6750 section 3.1), a wrong one `invalid_token`."""
    presented = bearer_of(authorization)
    if presented is not None and hmac.compare_digest(presented, token):
        return None
    if authorization is None:
        return f'Bearer realm="{REALM}"'
    return f'Bearer realm="{REALM}", error="invalid_token", error_description="the bearer token is not accepted"'


class BearerAuth:
    """ASGI middleware: every HTTP request carries the token or is answered 401 before the SDK sees it;
    lifespan events pass through (the SDK's session manager starts on them); a websocket is closed."""

    def __init__(self, app: App, token: str) -> None:
        self._app = app
        self._token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._app(scope, receive, send)
            return
        if scope["type"] != "http":  # a websocket: the endpoint serves none, and nothing passes unchecked
            await send({"type": "websocket.close", "code": 1008})
            return
        headers = [value for name, value in scope.get("headers", ()) if name == b"authorization"]
        refusal = challenge(headers[0] if len(headers) == 1 else b"" if headers else None, self._token)
        if refusal is None:
            await self._app(scope, receive, send)
            return
        body = json.dumps({"error": "invalid_token" if headers else "unauthorized",
                           "error_description": "this MCP endpoint needs `Authorization: Bearer <token>`"}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", refusal.encode())]})
        await send({"type": "http.response.body", "body": body})
