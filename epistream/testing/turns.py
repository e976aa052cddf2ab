"""Turns made to order: one conversation's turns a minute apart, from (speaker, text) pairs."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from epistream.contracts.turns import Turn

T0 = datetime(2024, 5, 6, 9, 0, tzinfo=timezone(timedelta(hours=2)))


def make_turns(tenant: str, conversation_id: str, texts: list[tuple[str, str]], *, start: datetime = T0) -> list[Turn]:
    return [
        Turn(
            tenant=tenant, conversation_id=conversation_id, turn_id=f"t{i:03d}", speaker=speaker,
            text=text, ts=start + timedelta(minutes=i), session_id="session_1",
        )
        for i, (speaker, text) in enumerate(texts, start=1)
    ]
