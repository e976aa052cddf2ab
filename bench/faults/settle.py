"""Waiting until the system has settled after a fault (readiness waits, with deadlines and stall
limits), and putting the stack back as it was whatever a scenario left behind."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass

from epistream.infra import services, supervisor
from epistream.ops.readiness import WaitTimeout, poll, wait_for_turns
from epistream.settings.processes import Settings

from ..store_state import wait_for_enrichment
from .observe import Offsets, letters, read_since


@dataclass(frozen=True)
class Limits:
    healthy_s: float = 600.0
    turns_stall_s: float = 240.0
    enrich_stall_s: float = 420.0  # one model call may take minutes on a shared CPU
    answers_s: float = 600.0


def unhealthy(settings: Settings) -> list[str]:
    return [f"{r.name} {r.state}: {r.detail[:120]}" for r in services.status(settings) if not r.running]


def wait_healthy(settings: Settings, *, timeout_s: float) -> list[str]:
    """Until every service and worker passes its probe; what is still unhealthy at the deadline ([] if none)."""
    try:
        poll(lambda: unhealthy(settings), lambda bad: not bad, what="every service healthy", timeout_s=timeout_s,
             interval_s=2.0, progress=lambda bad: len(bad))
        return []
    except WaitTimeout as exc:
        return list(exc.last or [])  # type: ignore[call-overload]


def restore(settings: Settings) -> list[str]:
    """Undo what an interrupted scenario may have left: thaw every service, run every held-down one again."""
    done = []
    state = supervisor.read_state(settings.state_dir)
    for name, info in state.get("services", {}).items():
        if info.get("pid"):
            try:
                services.resume_service(settings, name)
            except Exception:  # noqa: S112 (gone meanwhile: nothing to thaw)
                continue
        if info.get("state") == "stopped" and name not in state.get("wanted", []):
            services.bring_back(settings, name, timeout_s=300)
            done.append(f"brought {name} back")
    return done


def turns_stored(url: str, tenant: str, turn_ids: list[str], limits: Limits) -> str | None:
    """Until every one of these turns is stored; None, or why the wait ended early."""
    try:
        wait_for_turns(url, tenant, len(turn_ids), turn_ids=turn_ids, stall_s=limits.turns_stall_s, interval_s=0.5)
        return None
    except WaitTimeout as exc:
        return str(exc)


def enrichment_done(url: str, tenant: str, expected_turns: int, limits: Limits) -> str | None:
    try:
        wait_for_enrichment(url, tenant, expected_turns=expected_turns, stall_s=limits.enrich_stall_s,
                            interval_s=2.0)
        return None
    except WaitTimeout as exc:
        return str(exc)


def answers_in(settings: Settings, start: Offsets, question_ids: Collection[str], limits: Limits) -> str | None:
    """Until every question has an answer (committed) or a dead letter."""
    keys = {q.encode() for q in question_ids}

    def seen() -> int:
        answered = asyncio.run(read_since(settings, settings.topic_answers, start[settings.topic_answers], keys=keys))
        dead = letters(asyncio.run(read_since(settings, settings.topic_dlq, start[settings.topic_dlq], keys=keys)))
        return len({r.key for r in answered} | {d.original_key() for d in dead})

    try:
        poll(seen, lambda n: n >= len(keys), what="every question answered", timeout_s=limits.answers_s,
             interval_s=3.0)
        return None
    except WaitTimeout as exc:
        return str(exc)
