"""One scenario from start to verdict: healthy stack, fresh tenant, stream + fault, settle, read back, check.

``recover_s`` is the time from the later of "fault over" and "last record sent" until every produced
valid turn is stored and every service passes its probe again.
"""

from __future__ import annotations

import asyncio
import random
import time
import traceback
from datetime import timedelta
from typing import Any

from epistream.pipeline.segmenter import SegmenterConfig
from epistream.settings.processes import Settings

from . import observe, settle, workload
from .inject import FaultLog
from .invariants import Observed, check_all
from .scenarios import Context, Durations, Scenario
from .stream import Stream


def segmenter_config(settings: Settings) -> SegmenterConfig:
    """The running workers' segmenter settings (as their supervisor records them), for the clean replay."""
    from bench.stack import worker_setting

    return SegmenterConfig(
        max_tokens=int(worker_setting(settings, "segment_max_tokens") or 4096),
        overlap_share=float(worker_setting(settings, "segment_overlap") or 0.1),
        max_gap=timedelta(seconds=float(worker_setting(settings, "segment_max_gap_s") or 21600)),
    )


def _topics(settings: Settings) -> list[str]:
    return [settings.topic_turns, settings.topic_questions, settings.topic_answers, settings.topic_dlq]


def run_scenario(settings: Settings, url: str, run_id: str, scenario: Scenario, size: workload.Size,
                 durations: Durations, limits: settle.Limits, *, seed: int = 11) -> dict[str, Any]:
    print(f"\n== {scenario.name}: {scenario.what}", flush=True)
    problems: list[str] = []
    if bad := settle.wait_healthy(settings, timeout_s=limits.healthy_s):
        problems.append("not healthy before the scenario: " + "; ".join(bad))
    load = workload.build(run_id, scenario.name, size, seed=seed, split_sessions=scenario.split_sessions)
    start = asyncio.run(observe.topic_ends(settings, _topics(settings)))
    stream = Stream(settings, load, size.rate_per_s)
    log = FaultLog()
    ctx = Context(settings, url, load, stream, log, durations, random.Random(f"{seed}-{scenario.name}"))
    stream.start()
    try:
        scenario.inject(ctx)
    except Exception as exc:
        problems.append(f"the fault could not be injected: {type(exc).__name__}: {exc}")
        traceback.print_exc()
    finally:
        for step in settle.restore(settings):
            log.note(step)
        log.end()
    stream.join(timeout=1800)
    if stream.log.error is not None:
        problems.append(f"the stream failed: {stream.log.error!r}")
    quiet_from = max(log.ended_at or 0.0, stream.log.finished_at or 0.0)

    valid = [t for t in load.turns if t.conversation_id != ctx.forgotten]
    if why := settle.turns_stored(url, load.tenant, [t.turn_id for t in valid], limits):
        problems.append(f"turns: {why}")
    if bad := settle.wait_healthy(settings, timeout_s=limits.healthy_s):
        problems.append("not healthy after the scenario: " + "; ".join(bad))
    recover_s = round(time.monotonic() - quiet_from, 1)
    log.note(f"recovered: turns stored and stack healthy ({recover_s}s after the fault and the stream)")
    if why := settle.enrichment_done(url, load.tenant, len(valid), limits):
        problems.append(f"enrichment: {why}")
    if why := settle.answers_in(settings, start, [q.question_id for q in load.questions], limits):
        problems.append(f"answers: {why}")
    log.note("settled")

    observed = _observe(settings, url, load, start, ctx.forgotten)
    counts, verdicts = check_all(load, ctx.forgotten, observed, segmenter_config(settings), ctx.reads_after)
    result = {
        "name": scenario.name, "what": scenario.what, "tenant": load.tenant,
        "produced": counts.produced, "stored": counts.stored, "lost": counts.lost,
        "duplicated": counts.duplicated, "dead_lettered": counts.dead_lettered, "recover_s": recover_s,
        "records_sent": stream.log.sent, "resent_by_producer": len(stream.log.resent),
        "questions": len(load.questions), "invalid_records": len(load.invalid),
        "segments": len([s for s in observed.segments if s.conversation_id != ctx.forgotten]),
        "forgotten_conversation": ctx.forgotten,
        "invariants": verdicts, "problems": problems,
        "events": [{"at_s": at, "what": what} for at, what in log.events],
    }
    _print(result)
    return result


def _observe(settings: Settings, url: str, load: workload.Workload, start: observe.Offsets,
             forgotten: str | None) -> Observed:
    conversation_keys = {c.encode() for c in load.conversations}
    question_keys = {q.question_id.encode() for q in load.questions}

    def read(topic: str, keys: set[bytes]) -> list:
        return observe.read_topic_sync(settings, topic, start[topic], keys)

    return Observed(
        turns=observe.turns_of(url, load.tenant),
        segments=observe.segments_of(url, load.tenant),
        letters=observe.letters(read(settings.topic_dlq, conversation_keys | question_keys)),
        answers=read(settings.topic_answers, question_keys),
        questions=read(settings.topic_questions, question_keys),
        turn_records=read(settings.topic_turns, conversation_keys),
        leftovers=observe.leftovers(url, load.tenant, forgotten) if forgotten else {},
    )


def _print(result: dict[str, Any]) -> None:
    print(f"   produced {result['produced']}, stored {result['stored']}, lost {result['lost']}, duplicated "
          f"{result['duplicated']}, dead-lettered {result['dead_lettered']}, recovered in {result['recover_s']}s")
    for name, verdict in result["invariants"].items():
        print(f"   {verdict['status']:<6} {name}: {verdict['detail']}")
    for problem in result["problems"]:
        print(f"   ! {problem}")
