"""Model calls and prompt tokens that enrichment would spend per 1,000 turns of the scale workload
(issue 13: keep it <= 50), counted offline with the pipeline's own pure code, no Kafka, PostgreSQL
or model server:

- segmentation: `epistream.pipeline.segmenter.feed`/`close` with the settings' `segment_*` values
  (`segments.config_from`), each turn costed as `advance` costs it
  (`estimate_tokens(segments.turn_line(...))`), conversations fed in produce order;
- the idle close (`segment_idle_s`): the workload is taken as played in real time, so a
  conversation whose next turn comes more than `segment_idle_s` later has gone quiet and its open
  segment closes as "idle" before that turn (what the housekeeping tick's close request does),
  and every segment still open at the end closes as "idle";
- enrichment: one model call per closed segment (`epistream.pipeline.enrich`: a segment is never split; one
  too long for the context is cut by `fit_segment`, counted here), its prompt built by
  `build_messages` from the fitted turns and costed with `epistream.prompts.estimate_tokens`
  (four characters a token, the project's one token count: the server's tokenizer and its chat
  template differ, see `--locomo` for the ratio on a run that was measured).

Retries are not counted: a call is repeated only when the model's output fails validation
(`llm_max_retries` more at most), which only a model can tell; the LoCoMo run had none.

    python -m bench.scale.calls [--presets 10k,100k] [--locomo]   # -> bench/results/enrich-calls-scale.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from epistream.contracts import Segment, SegmentTurn, Turn
from epistream.pipeline.enrich import build_messages, fit_segment
from epistream.pipeline.prompts import ENRICH_PROMPT
from epistream.pipeline.segmenter import ClosedSegment, SegmenterConfig, SegmenterState, Step, close, feed
from epistream.pipeline.store import segments
from epistream.prompts import estimate_tokens
from epistream.settings import Settings

from ..report import write_results
from ..workload_scale import PRESETS, WorkloadSpec, turns

RESULT = Path("bench/results/enrich-calls-scale.json")
MANY, LONG = "many conversations", "one long conversation"


@dataclass
class Tally:
    """What enrichment of some closed segments costs."""

    turns: int = 0
    segments: int = 0
    model_calls: int = 0
    prompt_tokens: int = 0
    truncated_segments: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    prompt_tokens_per_call: list[int] = field(default_factory=list)

    def row(self) -> dict[str, object]:
        per_call = sorted(self.prompt_tokens_per_call)
        return {
            "turns": self.turns, "segments": self.segments, "model_calls": self.model_calls,
            "calls_per_1000_turns": round(1000 * self.model_calls / self.turns, 2) if self.turns else None,
            "prompt_tokens": self.prompt_tokens,
            "prompt_tokens_per_1000_turns": round(1000 * self.prompt_tokens / self.turns) if self.turns else None,
            "prompt_tokens_per_call": {
                "p50": statistics.median(per_call), "max": per_call[-1],
            } if per_call else None,
            "truncated_segments": self.truncated_segments,
            "by_close_reason": dict(sorted(self.reasons.items())),
        }


@dataclass
class _Conversation:
    state: SegmenterState = field(default_factory=SegmenterState)
    #: the turns of the open segment (the prompt needs their text), by id
    open_turns: dict[str, SegmentTurn] = field(default_factory=dict)
    last_ts: datetime | None = None


@dataclass(frozen=True)
class Call:
    """One enrichment call: the segment it enriches and what its prompt costs."""

    tenant: str
    conversation_id: str
    segment: ClosedSegment
    prompt_tokens: int
    truncated_chars: int


def prompt_cost(segment: Segment, settings: Settings) -> tuple[int, int]:
    """(estimated prompt tokens, characters cut) of the one call `epistream.pipeline.enrich` makes for `segment`."""
    fitted = fit_segment(segment, settings)
    messages = build_messages(segment.model_copy(update={"turns": fitted.turns}))
    return sum(estimate_tokens(m["content"]) for m in messages), fitted.truncated_chars


class CallCounter:
    """Feeds turns (in produce order) to one segmenter per conversation, as the indexer does, and
    turns every closed segment into the enrichment call it causes."""

    def __init__(self, settings: Settings, *, idle: bool = True) -> None:
        self.settings = settings
        self.config: SegmenterConfig = segments.config_from(settings)
        self.idle_after = timedelta(seconds=settings.segment_idle_s) if idle else None
        self._conversations: dict[tuple[str, str], _Conversation] = {}

    def add(self, turn: Turn) -> list[Call]:
        key = (turn.tenant, turn.conversation_id)
        conv = self._conversations.setdefault(key, _Conversation())
        calls: list[Call] = []
        if self.idle_after is not None and conv.last_ts is not None and turn.ts - conv.last_ts > self.idle_after:
            calls += self._closed(key, conv, close(conv.state, "idle", self.config))
        conv.open_turns[turn.turn_id] = SegmentTurn(turn_id=turn.turn_id, speaker=turn.speaker, text=turn.text,
                                                    ts=turn.ts)
        step = feed(conv.state, turn_id=turn.turn_id,
                    tokens=estimate_tokens(segments.turn_line(turn.speaker, turn.text, turn.ts)),
                    ts=turn.ts, session_id=turn.session_id, config=self.config)
        conv.last_ts = turn.ts if conv.last_ts is None else max(conv.last_ts, turn.ts)
        calls += self._closed(key, conv, step)
        return calls

    def finish(self) -> list[Call]:
        """Every conversation goes quiet at the end: what is still open closes as idle."""
        calls: list[Call] = []
        for key, conv in self._conversations.items():
            calls += self._closed(key, conv, close(conv.state, "idle", self.config))
        return calls

    def _closed(self, key: tuple[str, str], conv: _Conversation, step: Step) -> list[Call]:
        calls = []
        for closed in step.closed:
            segment = Segment(
                tenant=key[0], conversation_id=key[1], segment_id=segments.segment_id(key[1], closed.seq),
                seq=closed.seq, close_reason=closed.reason, overlap_turns=closed.overlap_turns,
                token_estimate=closed.token_estimate, turns=[conv.open_turns[t] for t in closed.turn_ids],
            )
            tokens, cut = prompt_cost(segment, self.settings)
            calls.append(Call(key[0], key[1], closed, tokens, cut))
        conv.state = step.state
        keep = {t.turn_id for t in conv.state.open}
        conv.open_turns = {k: v for k, v in conv.open_turns.items() if k in keep}
        return calls


def count(stream: Iterable[Turn], settings: Settings, kind_of: Callable[[str, str], str]) -> dict[str, Tally]:
    """Tallies per kind (`kind_of(tenant, conversation_id)`) and "all" for a produce-ordered stream."""
    tallies: dict[str, Tally] = {"all": Tally()}
    counter = CallCounter(settings)

    def book(calls: list[Call]) -> None:
        for call in calls:
            for name in ("all", kind_of(call.tenant, call.conversation_id)):
                tally = tallies.setdefault(name, Tally())
                tally.segments += 1
                tally.model_calls += 1  # one call per segment (retries on invalid output are not knowable here)
                tally.prompt_tokens += call.prompt_tokens
                tally.prompt_tokens_per_call.append(call.prompt_tokens)
                tally.truncated_segments += call.truncated_chars > 0
                tally.reasons[call.segment.reason] += 1

    for turn in stream:
        tallies["all"].turns += 1
        tallies.setdefault(kind_of(turn.tenant, turn.conversation_id), Tally()).turns += 1
        book(counter.add(turn))
    book(counter.finish())
    return tallies


def measure_preset(name: str, spec: WorkloadSpec, settings: Settings) -> dict[str, object]:
    started = time.perf_counter()
    long = spec.long_conversation
    tallies = count(turns(spec), settings, lambda tenant, conv: LONG if (tenant, conv) == long else MANY)
    row: dict[str, object] = {"preset": name, **tallies["all"].row()}
    row["by_kind"] = [{"kind": kind, **tallies[kind].row()} for kind in (MANY, LONG) if kind in tallies]
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


#: Recorded live runs of `bench.run --only enrich` (LoCoMo dev split): their file, conversations, turns of each.
LIVE_RUNS = (("bench/results/enrich.json", None, None), ("bench/results/enrich-quick.json", 2, 100))


def measure_locomo(settings: Settings, measured_path: Path, conversations: int | None,
                   turns_per_conversation: int | None) -> dict[str, object] | None:
    """The same count over the LoCoMo turns a recorded `bench.run --only enrich` streamed, beside what
    that run measured from the workers' metrics: segments, calls, and the server's prompt tokens."""
    from ..workload import enrich_workload  # only here: LoCoMo is optional

    if not measured_path.exists():
        return None
    measured = json.loads(measured_path.read_text())
    # The run's own id: the turn ids in the prompt carry it, so the text is the very one it sent.
    run_id = measured["workload"]["tenant"].removeprefix("bench-").removesuffix("-enrich")
    workload = enrich_workload(Path.cwd(), run_id=run_id, conversations=conversations,
                               turns_per_conversation=turns_per_conversation)
    if workload.source != "locomo-dev":
        return None
    # Those runs streamed at 20 turns/s and closed idle segments after 20 s of wall time: only the
    # last one of each conversation, which the end of the stream closes here.
    tallies = count(workload.turns, settings.with_overrides(segment_idle_s=1e12), lambda *_: "locomo")
    calls = measured["model_calls"]
    row: dict[str, object] = {"preset": f"locomo-dev ({measured_path.name})", **tallies["all"].row()}
    row["measured"] = {
        "source": str(measured_path), "timestamp": measured["machine"]["timestamp"],
        "turns": measured["workload"]["turns"], "segments_closed": measured["segments"]["closed"],
        "by_close_reason": measured["segments"]["by_close_reason"], "model_calls": calls["total"],
        "calls_per_1000_turns": calls["per_1000_turns"], "prompt_tokens_server": calls["prompt_tokens"],
    }
    if calls["total"] == measured["segments"]["closed"]:  # a clean count (the quick run's metric deltas are not)
        row["server_tokens_per_estimated_token"] = round(calls["prompt_tokens"] / tallies["all"].prompt_tokens, 3)
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="10k,100k", help="comma-separated bench.workload_scale presets")
    parser.add_argument("--locomo", action="store_true",
                        help="also count the LoCoMo turns of the recorded live enrichment runs (LIVE_RUNS) and "
                        "compare with what they measured")
    parser.add_argument("--out", type=Path, default=RESULT)
    args = parser.parse_args(argv)
    settings = Settings()  # the defaults (EPISTREAM_* variables apply, as in the workers)
    rows = []
    for name in args.presets.split(","):
        row = measure_preset(name, PRESETS[name], settings)
        print(json.dumps({k: v for k, v in row.items() if k != "by_kind"}), flush=True)
        rows.append(row)
    report: dict[str, object] = {
        "command": "python -m bench.scale.calls " + " ".join(sys.argv[1:] if argv is None else argv),
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "settings": {k: getattr(settings, k) for k in (
            "segment_max_tokens", "segment_overlap", "segment_max_gap_s", "segment_idle_s", "model_ctx",
            "extractor_max_tokens", "llm_max_retries")},
        "system_prompt_tokens": estimate_tokens(ENRICH_PROMPT.template),  # in every call
        "method": {
            "segmentation": "epistream.pipeline.segmenter.feed/close over each conversation in produce order (no database)",
            "idle_close": "workload played in real time: a gap over segment_idle_s between a conversation's turns, "
                          "and the end of the stream, close the open segment as 'idle'",
            "calls": "one per closed segment (epistream.pipeline.enrich never splits one; fit_segment cuts a long one)",
            "prompt_tokens": "epistream.prompts.estimate_tokens (4 chars/token) over build_messages of the fitted "
                             "segment: system + user message, no chat template",
            "not_counted": "retries after invalid model output (at most llm_max_retries per segment)",
        },
        "results": rows,
    }
    if args.locomo:
        checks = [measure_locomo(settings, Path(path), n, per) for path, n, per in LIVE_RUNS]
        report["live_run_checks"] = [c for c in checks if c is not None]
        for check in report["live_run_checks"]:
            print(json.dumps(check), flush=True)
    write_results(args.out, report)


if __name__ == "__main__":
    main()
