"""What an agent's process runs, with the base install alone (aiokafka and pydantic): produce turns,
ask, read context, forget, follow memory events (`api`), and read input files into turns (`sources`).

The client's functions are also in ``epistream`` itself, the pinned public API; this face keeps
``from epistream.client import ask`` working for those who wrote it that way."""

from __future__ import annotations

from . import api
from .api import *  # noqa: F403  (the face is exactly api.__all__)

__all__ = api.__all__
