"""What the shell prints: service rows, probes, answers, and the loud failure that names what is unhealthy."""

from __future__ import annotations

import asyncio
import sys

from ..settings import Settings


def print_rows(rows, file=None) -> None:  # type: ignore[no-untyped-def]
    """Service rows (infra) or probes (epistream.health): state, name, detail, and a crashed one's log lines."""
    for row in rows:
        name = getattr(row, "name", None) or row.service
        print(f"  {str(row.state):<8} {name:<15} {row.detail}", file=file)
        for line in getattr(row, "log_tail", []):
            print(f"           | {line}", file=file)


def print_answer(answer, question: str) -> None:  # type: ignore[no-untyped-def]
    print(f"\nQ: {question}")
    flag = " (abstained)" if answer.abstained else ""
    print(f"A: {answer.answer}{flag}")
    for ev in answer.evidence:
        print(f"   - [{ev.time:%Y-%m-%d %H:%M}] {ev.conversation_id}/{','.join(ev.turn_ids)} {ev.speaker}: {ev.quote[:160]}")
    tokens = ", ".join(f"{role} {t.prompt}+{t.completion}" for role, t in answer.tokens.items() if t.calls)
    print(f"   mode {answer.mode.value}, {answer.latency_ms:.0f} ms, tokens {tokens or 'none'}")
    if answer.error:
        print(f"   error: {answer.error}")


def unhealthy(settings: Settings, only: set[str] | None = None) -> list:  # type: ignore[type-arg]
    """The probes that failed (an empty list: everything asked about is healthy)."""
    from ..health import probe_all

    return [p for p in asyncio.run(probe_all(settings, only=only)) if not p.healthy]


def fail_loudly(settings: Settings, what: str, only: set[str] | None = None, *, bad: list | None = None) -> int:  # type: ignore[type-arg]
    """Print why `what` failed, naming each unhealthy service (probed now unless `bad` already says);
    the exit status to return."""
    bad = unhealthy(settings, only) if bad is None else bad
    print(f"\nepistream: {what}", file=sys.stderr)
    if bad:
        print("unhealthy: " + ", ".join(p.service for p in bad), file=sys.stderr)
        print_rows(bad, file=sys.stderr)
    else:
        print("every service answers its health probe; see the worker logs under "
              f"{settings.state_dir / 'logs'}", file=sys.stderr)
    return 1
