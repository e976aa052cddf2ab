"""Readers that turn input files into `Turn` objects (pure logic, no Kafka).

Two inputs are supported: the LoCoMo benchmark JSON (a list of samples, each
with a `conversation` and `qa`) and JSON Lines where every line is one `Turn`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any, Literal

from epistream.contracts.turns import Turn

__all__ = [
    "LocomoQA",
    "LocomoSample",
    "detect_format",
    "load_locomo",
    "parse_locomo_datetime",
    "read_turns_jsonl",
]

# LoCoMo writes `1:56 pm on 8 May, 2023`; the variants cover abbreviated months
# and a missing comma so a hand-edited file does not fail on trivia.
_LOCOMO_TIME_FORMATS = (
    "%I:%M %p on %d %B, %Y",
    "%I:%M %p on %d %b, %Y",
    "%I:%M %p on %d %B %Y",
    "%I:%M %p on %d %b %Y",
)
_SESSION_KEY = re.compile(r"^session_(\d+)$")
_TURN_ID = re.compile(r"^D\d+:\d+$")
_EVIDENCE_SPLIT = re.compile(r"[;,\s]+")


@dataclass(frozen=True)
class LocomoQA:
    """One LoCoMo question with its gold answer and evidence turn ids."""

    question: str
    answer: str | None
    adversarial_answer: str | None
    category: int
    evidence: list[str]


@dataclass(frozen=True)
class LocomoSample:
    """One LoCoMo conversation as `Turn`s, plus its QA pairs.

    `skipped_turns` counts dialogue entries dropped for empty text;
    `malformed_evidence` lists evidence fragments that were not turn ids.
    """

    sample_id: str
    conversation_id: str
    turns: list[Turn]
    qa: list[LocomoQA]
    skipped_turns: int = 0
    malformed_evidence: list[str] = field(default_factory=list)


def parse_locomo_datetime(text: str, tz: tzinfo = UTC) -> datetime:
    """Parse a LoCoMo session time such as `1:56 pm on 8 May, 2023`.

    The source gives no zone, so the wall-clock time is read in `tz` (a fixed
    offset or a zoneinfo zone; not a pytz zone, whose offsets need localize()).
    """
    cleaned = " ".join(text.split())
    # Tolerate `1:56pm` by putting the space strptime's %p expects.
    cleaned = re.sub(r"(?i)(\d)([ap]m)\b", r"\1 \2", cleaned)
    for fmt in _LOCOMO_TIME_FORMATS:
        try:
            naive = datetime.strptime(cleaned, fmt)
        except ValueError:
            continue
        return naive.replace(tzinfo=tz)
    raise ValueError(f"unrecognised LoCoMo date-time {text!r}; expected e.g. '1:56 pm on 8 May, 2023'")


def parse_evidence(raw: Any) -> tuple[list[str], list[str]]:
    """Split LoCoMo evidence into (valid turn ids, rejected fragments).

    The original data has entries like `D8:6; D9:17`, `D` and `D:11:26`.
    """
    items = raw if isinstance(raw, list) else [raw] if raw is not None else []
    valid: list[str] = []
    rejected: list[str] = []
    for item in items:
        for part in _EVIDENCE_SPLIT.split(str(item)):
            if not part:
                continue
            (valid if _TURN_ID.match(part) else rejected).append(part)
    return valid, rejected


def _optional_str(value: Any) -> str | None:
    # Some gold answers are JSON ints (years, counts); metrics compare text.
    return None if value is None else str(value)


def _parse_qa(raw: dict[str, Any]) -> tuple[LocomoQA, list[str]]:
    evidence, rejected = parse_evidence(raw.get("evidence"))
    qa = LocomoQA(
        question=str(raw["question"]),
        answer=_optional_str(raw.get("answer")),
        adversarial_answer=_optional_str(raw.get("adversarial_answer")),
        category=int(raw["category"]),
        evidence=evidence,
    )
    return qa, rejected


def _session_numbers(conversation: dict[str, Any]) -> list[int]:
    """Session numbers present, ascending numerically (session_10 after session_2)."""
    found = (_SESSION_KEY.match(key) for key in conversation)
    return sorted(int(m.group(1)) for m in found if m and isinstance(conversation[m.group(0)], list))


def _turn_text(entry: dict[str, Any]) -> str:
    text = str(entry.get("text") or "").strip()
    caption = str(entry.get("blip_caption") or "").strip()
    if text and caption:
        # The image itself is not kept; its caption is what a reader could know.
        text = f"{text} [shares an image: {caption}]"
    return text


def _session_turns(
    conversation: dict[str, Any],
    number: int,
    *,
    tenant: str,
    conversation_id: str,
    sample_id: str,
    tz: tzinfo,
) -> tuple[list[Turn], int]:
    """Turns of one session and the count of entries skipped for empty text."""
    stamp = conversation.get(f"session_{number}_date_time")
    if not stamp:
        raise ValueError(f"{sample_id}: session_{number} has no session_{number}_date_time")
    start = parse_locomo_datetime(str(stamp), tz)
    turns: list[Turn] = []
    skipped = 0
    for index, entry in enumerate(conversation[f"session_{number}"]):
        text = _turn_text(entry)
        if not text:
            skipped += 1
            continue
        turns.append(
            Turn(
                tenant=tenant,
                conversation_id=conversation_id,
                turn_id=str(entry["dia_id"]),
                speaker=str(entry["speaker"]),
                text=text,
                # LoCoMo gives one time per session; adding i ms keeps turn order
                # strictly increasing, so sorting or windowing by ts never
                # reorders a session, while staying far below any resolution
                # a question could ask about.
                ts=start + timedelta(milliseconds=index),
                session_id=f"session_{number}",
                metadata={"source": "locomo", "sample_id": sample_id},
            )
        )
    return turns, skipped


def _parse_sample(raw: dict[str, Any], *, tenant: str, conversation_prefix: str, tz: tzinfo) -> LocomoSample:
    sample_id = str(raw["sample_id"])
    conversation_id = f"{conversation_prefix}{sample_id}"
    conversation = raw["conversation"]
    turns: list[Turn] = []
    skipped = 0
    for number in _session_numbers(conversation):
        session, dropped = _session_turns(
            conversation, number, tenant=tenant, conversation_id=conversation_id, sample_id=sample_id, tz=tz
        )
        turns.extend(session)
        skipped += dropped
    qa: list[LocomoQA] = []
    malformed: list[str] = []
    for item in raw.get("qa", []):
        parsed, rejected = _parse_qa(item)
        qa.append(parsed)
        malformed.extend(rejected)
    return LocomoSample(sample_id, conversation_id, turns, qa, skipped, malformed)


def load_locomo(
    path: str | Path,
    *,
    tenant: str = "locomo",
    conversation_prefix: str = "",
    tz: tzinfo = UTC,
) -> list[LocomoSample]:
    """Load a LoCoMo JSON file (e.g. locomo10.json) into samples of `Turn`s."""
    with Path(path).open(encoding="utf-8") as handle:
        data = json.load(handle)
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of LoCoMo samples")
    return [_parse_sample(raw, tenant=tenant, conversation_prefix=conversation_prefix, tz=tz) for raw in data]


def _parse_json_line(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return None, f"invalid UTF-8: {exc}"
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON: {exc}"
    if not isinstance(value, dict):
        return None, f"expected a JSON object, got {type(value).__name__}"
    return value, None


def read_turns_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any] | None, str | None]]:
    """Yield (line number, object or None, error or None) for each non-blank line.

    Bad lines are reported, not raised, so the caller can dead-letter them and
    go on; lines are decoded one by one so a bad byte spoils only its line.
    """
    with Path(path).open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if number == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")  # tolerate a UTF-8 BOM
            if not raw.strip():
                continue
            value, error = _parse_json_line(raw)
            yield number, value, error


def detect_format(path: str | Path) -> Literal["locomo", "jsonl"]:
    """`locomo` for a .json list of objects with a `conversation` key, else `jsonl`."""
    path = Path(path)
    if path.suffix.lower() != ".json":
        return "jsonl"
    try:
        with path.open(encoding="utf-8-sig") as handle:
            data = json.load(handle)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return "jsonl"
    is_locomo = (
        isinstance(data, list)
        and bool(data)
        and all(isinstance(item, dict) and "conversation" in item for item in data)
    )
    return "locomo" if is_locomo else "jsonl"
