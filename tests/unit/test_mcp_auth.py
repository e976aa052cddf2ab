"""The MCP HTTP endpoint's login (epistream/apps/mcp/auth.py): which addresses need a token, how the
bearer header is read and checked, and what the middleware answers without it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import SecretStr

from epistream.apps.mcp.auth import BearerAuth, bearer_of, challenge, exposure_error, is_loopback
from epistream.errors import SettingsError
from epistream.settings.mcp import McpSettings
from epistream.settings.processes import load_settings

TOKEN = b"0123456789abcdef-token"


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("LocalHost", True), ("0.0.0.0", False), ("::", False), ("192.168.1.4", False), ("example.org", False),
])
def test_loopback_is_127_8_and_ipv6_1_and_localhost(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_only_an_address_off_loopback_without_a_token_is_refused() -> None:
    assert exposure_error("127.0.0.1", has_token=False) is None
    assert exposure_error("0.0.0.0", has_token=True) is None
    refusal = exposure_error("0.0.0.0", has_token=False)
    assert refusal is not None and "EPISTREAM_MCP_TOKEN" in refusal and "0.0.0.0" in refusal


@pytest.mark.parametrize(("header", "credentials"), [
    (None, None), (b"Bearer abc", b"abc"), (b"bearer  abc ", b"abc"), (b"BEARER abc", b"abc"),
    (b"Basic abc", None), (b"Bearer", None), (b"Bearer   ", None), (b"", None), (b"abc", None),
])
def test_the_bearer_credentials_of_a_header(header: bytes | None, credentials: bytes | None) -> None:
    assert bearer_of(header) == credentials


def test_the_right_token_passes_and_anything_else_gets_a_bearer_challenge() -> None:
    assert challenge(b"Bearer " + TOKEN, TOKEN) is None
    assert challenge(None, TOKEN) == 'Bearer realm="epistream"'  # no credentials: no error code (RFC 6750 3.1)
    for wrong in (b"Bearer " + TOKEN[:-1], b"Bearer " + TOKEN + b"x", b"Basic " + TOKEN, TOKEN, b""):
        refusal = challenge(wrong, TOKEN)
        assert refusal is not None and refusal.startswith('Bearer realm="epistream", error="invalid_token"')
        assert TOKEN.decode() not in refusal


def _request(middleware: BearerAuth, headers: list[tuple[bytes, bytes]], kind: str = "http") -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    asyncio.run(middleware({"type": kind, "headers": headers}, receive, send))
    return sent


def _served(passed: list[str]) -> BearerAuth:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        passed.append(scope["type"])

    return BearerAuth(app, TOKEN.decode())


def test_the_middleware_passes_the_token_and_lifespan_and_answers_401_otherwise() -> None:
    passed: list[str] = []
    middleware = _served(passed)
    assert _request(middleware, [(b"authorization", b"Bearer " + TOKEN)]) == []
    assert _request(middleware, [], kind="lifespan") == []
    assert passed == ["http", "lifespan"]
    for headers in ([], [(b"authorization", b"Bearer nope")],
                    [(b"authorization", b"Bearer " + TOKEN), (b"authorization", b"Bearer " + TOKEN)]):
        start, body = _request(middleware, headers)
        assert start["status"] == 401 and dict(start["headers"])[b"www-authenticate"].startswith(b"Bearer realm=")
        assert TOKEN not in body["body"]
    assert passed == ["http", "lifespan"]
    # A websocket, even one carrying the token, never reaches the SDK's app: the endpoint serves none.
    assert _request(middleware, [(b"authorization", b"Bearer " + TOKEN)], kind="websocket") == [
        {"type": "websocket.close", "code": 1008}]
    assert passed == ["http", "lifespan"]


def test_the_token_setting_is_a_secret_of_16_printable_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPISTREAM_MCP_TOKEN", TOKEN.decode())
    settings = load_settings(McpSettings)
    assert isinstance(settings.mcp_token, SecretStr) and TOKEN.decode() not in repr(settings)
    for bad in ("short", "has a space in it okay", "x" * 15):
        monkeypatch.setenv("EPISTREAM_MCP_TOKEN", bad)
        with pytest.raises(SettingsError, match="EPISTREAM_MCP_TOKEN") as refused:
            load_settings(McpSettings)
        assert bad not in str(refused.value)  # a secret, even a bad one, is never echoed
