"""The `events` tool's cursor: what `encode` makes, `decode` gives back for the same topic and tenant;
anything else (edited, truncated, another tenant's or topic's, not a cursor at all) is refused with a reason."""

from __future__ import annotations

import base64
import json

import pytest

from epistream.apps.mcp.cursor import PREFIX, CursorError, decode, encode


def test_a_cursor_round_trips_its_offsets():
    offsets = {0: 17, 1: 0, 11: 123_456_789}
    made = encode(offsets, topic="memory.events", tenant="acme")
    assert made.startswith(PREFIX) and decode(made, topic="memory.events", tenant="acme") == offsets
    assert decode(encode({}, topic="t", tenant="a"), topic="t", tenant="a") == {}


@pytest.mark.parametrize(("topic", "tenant"), [("memory.events", "other"), ("memory.events.acme", "acme")])
def test_a_cursor_of_another_tenant_or_topic_is_refused(topic, tenant):
    made = encode({0: 5}, topic="memory.events", tenant="acme")
    with pytest.raises(CursorError, match="another"):
        decode(made, topic=topic, tenant=tenant)


def _forged(body: object) -> str:
    return PREFIX + base64.urlsafe_b64encode(json.dumps(body).encode()).decode()


@pytest.mark.parametrize("bad", [
    "", "17", "0:17", "ev2." + encode({0: 1}, topic="t", tenant="a")[4:], PREFIX + "!!!", PREFIX + "e30",
    encode({0: 1}, topic="t", tenant="a")[:-3], PREFIX + "x" * 70_000,
])
def test_what_is_no_cursor_is_refused(bad):
    with pytest.raises(CursorError):
        decode(bad, topic="t", tenant="a")


def test_edited_offsets_are_refused():
    scope = json.loads(base64.urlsafe_b64decode(encode({}, topic="t", tenant="a")[4:] + "==="))["s"]
    assert decode(_forged({"s": scope, "o": {"0": 3}}), topic="t", tenant="a") == {0: 3}  # the forger's baseline
    for offsets in ({"0": -1}, {"0": 1.5}, {"0": "3"}, {"0": True}, {"-1": 3}, {"²": 3}, {"p": 3}):
        with pytest.raises(CursorError, match="damaged"):
            decode(_forged({"s": scope, "o": offsets}), topic="t", tenant="a")
    with pytest.raises(CursorError, match="damaged"):
        decode(_forged({"s": scope, "o": {}, "extra": 1}), topic="t", tenant="a")
    with pytest.raises(CursorError, match="damaged"):
        decode(_forged([scope]), topic="t", tenant="a")


async def test_the_sdk_client_sees_a_bad_cursor_or_wait_as_a_tool_error():
    from mcp import Client

    from epistream.apps.mcp.server import build_server
    from epistream.settings.processes import McpServerSettings

    server = build_server(McpServerSettings(kafka_bootstrap="127.0.0.1:9"), "acme")  # never reached: refused first
    async with Client(server) as client:
        for arguments, reason in [({"after": "yesterday"}, "bad cursor"), ({"wait_s": 600}, "wait_s"),
                                  ({"limit": 0}, "limit"),
                                  ({"after": encode({0: 1}, topic="memory.events", tenant="other")}, "another")]:
            result = await client.call_tool("events", arguments)
            assert result.is_error and reason in result.content[0].text, result.content[0].text
