"""The MCP server's arguments: what the contracts refuse is refused before anything is sent, with the
reason; the SDK's own client (in process) sees every refusal as a tool error, never a crash."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime

import pytest

from epistream.apps.mcp.arguments import (
    MAX_TURNS,
    ArgumentError,
    TurnArgument,
    ask_question,
    confirmed_forget,
    recall_question,
    served_tenant,
    turns_for,
)
from epistream.apps.mcp.memory import Written
from epistream.contracts.positions import Position
from epistream.contracts.questions import Mode
from epistream.settings.processes import McpServerSettings

NOW = datetime(2024, 3, 27, 12, 0, tzinfo=UTC)


def test_turns_become_turn_records_of_the_served_tenant():
    turns = turns_for("acme", "c1", [TurnArgument(speaker="Ann", text="I moved to Porto.", turn_id="t1",
                                                  time=datetime(2024, 3, 1, 9, 30)),
                                     TurnArgument(speaker="Bob", text="Nice!")], now=NOW)
    assert [(t.tenant, t.conversation_id, t.speaker) for t in turns] == [("acme", "c1", "Ann"), ("acme", "c1", "Bob")]
    assert turns[0].turn_id == "t1" and turns[0].ts == datetime(2024, 3, 1, 9, 30, tzinfo=UTC)  # no offset: UTC
    assert turns[1].ts == NOW and turns[1].turn_id.startswith("mcp-")


@pytest.mark.parametrize(("turns", "reason"), [
    ([], "at least one turn"),
    ([TurnArgument(speaker="Ann", text="")], "turn 1: text"),
    ([TurnArgument(speaker="Ann", text="ok"), TurnArgument(speaker="Ann", text="nul \x00")], "turn 2: text"),
    ([TurnArgument(speaker="", text="hi")], "turn 1: speaker"),
    ([TurnArgument(speaker="Ann", text="hi", time=datetime(1, 1, 1, tzinfo=UTC))], "turn 1: ts"),
    ([TurnArgument(speaker="Ann", text="hi")] * (MAX_TURNS + 1), f"at most {MAX_TURNS} turns"),
])
def test_bad_turns_are_refused_with_the_reason(turns, reason):
    with pytest.raises(ArgumentError, match=reason):
        turns_for("acme", "c1", turns, now=NOW)


def test_a_blank_conversation_id_is_refused():
    with pytest.raises(ArgumentError, match="conversation_id"):
        turns_for("acme", "  ", [TurnArgument(speaker="Ann", text="hi")], now=NOW)


def test_recall_is_a_context_question_within_the_budget_and_range():
    q = recall_question("acme", "Where does Ann live?", budget_tokens=500, since=datetime(2024, 1, 1),
                        until=None, conversation_ids=["c1"], now=NOW)
    assert q.mode is Mode.CONTEXT and q.budget_tokens == 500 and q.conversation_ids == ["c1"]
    assert q.time_range is not None and q.time_range.start == datetime(2024, 1, 1, tzinfo=UTC)
    for kwargs, reason in [({"budget_tokens": 10}, "50 to 32000"),
                           ({"since": datetime(2024, 2, 1), "until": datetime(2024, 1, 1)}, "starts"),
                           ({"question": ""}, "question")]:
        args = {"question": "Where?", "budget_tokens": 500, "since": None, "until": None} | kwargs
        with pytest.raises(ArgumentError, match=reason):
            recall_question("acme", args.pop("question"), conversation_ids=None, now=NOW, **args)


def test_ask_takes_the_answer_modes_only():
    assert ask_question("acme", "Where?", mode="fast", conversation_ids=[], now=NOW).conversation_ids is None
    with pytest.raises(ArgumentError, match="recall"):
        ask_question("acme", "Where?", mode="context", conversation_ids=None, now=NOW)
    with pytest.raises(ArgumentError, match="question"):
        ask_question("acme", "x" * 4001, mode="auto", conversation_ids=None, now=NOW)


def test_forget_needs_the_id_repeated():
    assert confirmed_forget("c1", "c1") == "c1"
    for confirm in (None, "", "yes", "C1"):
        with pytest.raises(ArgumentError, match="confirm"):
            confirmed_forget("c1", confirm)


def test_a_served_tenant_must_be_a_tenant_name():
    assert served_tenant(" acme ") == "acme"
    with pytest.raises(ArgumentError):
        served_tenant("nul\x00")


def test_written_positions_keep_the_latest_per_conversation_and_a_read_waits_for_one_a_partition():
    def at(conversation: str, partition: int, offset: int) -> Position:
        return Position(conversation_id=conversation, partition=partition, offset=offset)

    written = Written()
    written.note({"a": at("a", 1, 10), "b": at("b", 2, 5)})
    written.note({"a": at("a", 1, 7)})  # an older acknowledgement arriving late lowers nothing
    written.note({"b": at("b", 2, 9)})
    assert written.after(["a", "c"]) == [at("a", 1, 10)]
    assert written.after(None) == [at("a", 1, 10), at("b", 2, 9)]
    # One position a partition: the latest covers the earlier ones, however many conversations there are.
    written.note({f"c{n}": at(f"c{n}", 1, n) for n in range(2_000)})
    assert written.after(None) == [at("c1999", 1, 1999), at("b", 2, 9)]
    assert written.after(["a", "c5"]) == [at("a", 1, 10)]


def test_written_positions_stay_bounded_and_a_folded_conversation_still_waits_for_its_write():
    def at(conversation: str, partition: int, offset: int) -> Position:
        return Position(conversation_id=conversation, partition=partition, offset=offset)

    written = Written(max_conversations=100)
    for n in range(10_000):
        written.note({f"c{n}": at(f"c{n}", n % 3, n)})
    assert len(written) <= 100 + 3  # the conversations kept, and one floor a partition
    # c5 was folded long ago: a read of it waits for its partition's floor, an offset past its own.
    (floor,) = [p for p in written.after(["c5"]) if p.partition == 5 % 3]
    assert floor.offset >= 5
    assert written.after(["c9999"]) == [at("c9999", 0, 9999)]  # kept: its own position alone


def test_the_tenant_key_setting_must_be_hex(monkeypatch):
    monkeypatch.setenv("EPISTREAM_MCP_TENANT_KEY", "ab01")
    assert McpServerSettings().mcp_key == b"\xab\x01"
    monkeypatch.setenv("EPISTREAM_MCP_TENANT_KEY", "not hex")
    with pytest.raises(ValueError, match="MCP_TENANT_KEY|mcp_tenant_key"):
        McpServerSettings()


async def test_the_sdk_client_sees_bad_arguments_as_tool_errors():
    from mcp import Client

    from epistream.apps.mcp.server import build_server

    server = build_server(McpServerSettings(kafka_bootstrap="127.0.0.1:9"), "acme")  # never reached: refused first
    async with Client(server) as client:
        calls = [("remember", {"conversation_id": "c", "turns": [{"speaker": "a", "txt": "typo"}]}, "text"),
                 ("remember", {"conversation_id": "c", "turns": [{"speaker": "a", "text": ""}]}, "turn 1: text"),
                 ("recall", {"question": "q", "budget_tokens": 40_000}, "50 to 32000"),
                 ("ask", {"question": "q", "mode": "context"}, "mode"),
                 ("forget", {"conversation_id": "c"}, "confirm"),
                 ("nonesuch", {}, "nonesuch")]
        for name, arguments, reason in calls:
            result = await client.call_tool(name, arguments)
            assert result.is_error, name
            assert reason in result.content[0].text, result.content[0].text


def test_the_base_install_imports_without_the_sdk():
    # `mcp` made unimportable: the package, its plain modules and the CLI still import, and the verb says why not.
    code = ("import sys; sys.modules['mcp'] = None\n"
            "import epistream.apps.mcp.arguments, epistream.apps.mcp.memory\n"
            "from epistream.apps.cli.main import main\n"
            "sys.exit(main(['mcp']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "pip install 'epistream[mcp]'" in done.stderr
