"""Where a conversation's last produced turn landed on `memory.turns` (docs/read-your-writes.md)."""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

from .base import Identifier


class Position(BaseModel):
    """A conversation's last produced turn on `memory.turns` (docs/read-your-writes.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    conversation_id: Identifier
    partition: Annotated[int, Field(ge=0)]
    offset: Annotated[int, Field(ge=0)]
