"""What the shell prints: service rows, probes, answers, and the loud failure that names what is unhealthy."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TextIO

from epistream.contracts.replies import Answer
from epistream.settings.processes import ClientSettings, Settings, load_settings

if TYPE_CHECKING:  # the probes need the worker extra; a client install has none
    from epistream.ops.health import Probe


def print_rows(rows: Iterable[Any], file: TextIO | None = None) -> None:
    """Service rows (infra) or probes (epistream.ops.health): state, name, detail, and a crashed one's log lines."""
    for row in rows:
        name = getattr(row, "name", None) or row.service
        print(f"  {str(row.state):<8} {name:<15} {row.detail}", file=file)
        for line in getattr(row, "log_tail", []):
            print(f"           | {line}", file=file)


def print_answer(answer: Answer, question: str | None = None) -> None:
    """The answer, its evidence and its cost; under a "Q:" line of its own when `question` is given."""
    if question is not None:
        print(f"\nQ: {question}")
    flag = " (abstained)" if answer.abstained else ""
    print(f"A: {answer.answer}{flag}")
    for ev in answer.evidence:
        print(f"   - [{ev.time:%Y-%m-%d %H:%M}] {ev.conversation_id}/{','.join(ev.turn_ids)} {ev.speaker}: {ev.quote[:160]}")
    tokens = ", ".join(f"{role} {t.prompt}+{t.completion}" for role, t in answer.tokens.items() if t.calls)
    print(f"   mode {answer.mode.value}, {answer.latency_ms:.0f} ms, tokens {tokens or 'none'}")
    if answer.error:
        print(f"   error: {answer.error}")


def can_probe() -> bool:
    """Whether this install has the health probes: a client install (no worker extra) has none, and
    its requests say themselves what failed (a timeout naming the question)."""
    return importlib.util.find_spec("psycopg") is not None and importlib.util.find_spec("openai") is not None


def unhealthy(settings: ClientSettings, only: set[str] | None = None) -> list[Probe]:
    """The probes that failed (an empty list: everything asked about is healthy, or nothing can be probed)."""
    if not can_probe():
        return []
    from epistream.ops.health import probe_all

    full = settings if isinstance(settings, Settings) else load_settings()  # the probes read the workers' ports
    return [p for p in asyncio.run(probe_all(full, only=only)) if not p.healthy]


def fail_loudly(settings: ClientSettings, what: str, only: set[str] | None = None, *, bad: list[Probe] | None = None) -> int:
    """Print why `what` failed, naming each unhealthy service (probed now unless `bad` already says);
    the exit status to return."""
    bad = unhealthy(settings, only) if bad is None else bad
    print(f"\nepistream: {what}", file=sys.stderr)
    if bad:
        print("unhealthy: " + ", ".join(p.service for p in bad), file=sys.stderr)
        print_rows(bad, file=sys.stderr)
    elif not can_probe():
        print("this client install cannot probe the services (`pip install 'epistream[worker]'` can)", file=sys.stderr)
    else:
        print("every service answers its health probe; see the worker logs under "
              f"{settings.state_dir / 'logs'}", file=sys.stderr)
    return 1
