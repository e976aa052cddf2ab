"""What the supervisor needs to know to run one service: a plain description, built by
infra/stack.py from the settings."""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ServiceSpec:
    """How to run one child: its command, when it is ready, and what to do once it is."""

    name: str
    argv: Sequence[str]
    ready: Callable[[], bool]
    env: Mapping[str, str] | None = None
    user: str | None = None
    stop_signal: int = signal.SIGTERM
    stop_timeout_s: float = 20.0
    start_timeout_s: float = 120.0
    #: idempotent set-up that needs the service running (topics, migrations); failing counts as a failed start;
    #: what it returns is not used
    after_ready: Callable[[], object] | None = None
    #: services that must be running before this one is (re)started
    requires: tuple[str, ...] = ()
