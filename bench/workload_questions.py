"""The scale workload's known answers: what each conversation established, and the questions it can answer.

A `Ledger` records, while a conversation is generated, every fact that a question may ask about
(where each speaker lived and worked, the pets they adopted, the places they went to) together with
the turn that says it. Questions are drawn from it once the conversation ends, so every answer and
its evidence come from the same plan as the turns (:mod:`bench.workload_scale`). `mention` picks the
relative time expression a fact is told with and computes, by plain calendar arithmetic, the day it
stands for: the answer of a temporal question.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Literal

from epistream.contracts import Mode, Question

Precision = Literal["day", "week", "month"]
QuestionKind = Literal["temporal", "counting", "current", "previous"]
KINDS: tuple[QuestionKind, ...] = ("temporal", "counting", "current", "previous")


@dataclass(frozen=True)
class TimeMention:
    """A relative time expression as a turn says it, and the day it stands for said that day.

    `day` is computed here from the session's date, independently of epistream.dates, so a test can
    check the resolver against it: week precision is the day a week (or N weeks) back, month
    precision the first of the month.
    """

    phrase: str
    day: date
    precision: Precision

    def answer(self) -> str:
        return f"{self.day:%Y-%m}" if self.precision == "month" else self.day.isoformat()


@dataclass(frozen=True)
class KnownQuestion:
    """A question about one conversation with its known answer, asked after the conversation's last turn.

    `entity` is what every evidence turn names (the pet, place, city or employer asked about);
    `superseded` is the answer that held before the current one ("current" questions); `precision`
    is the answer's for "temporal" questions (answer: YYYY-MM-DD, or YYYY-MM at month precision).
    """

    tenant: str
    conversation_id: str
    question: str
    asked_at: datetime
    answer: str
    evidence_turn_ids: tuple[str, ...]
    kind: QuestionKind
    entity: str
    superseded: str | None = None
    precision: Precision | None = None

    def as_contract(self, question_id: str, mode: Mode = Mode.AUTO) -> Question:
        """The `memory.questions` message that asks it, scoped to its conversation."""
        return Question(
            question_id=question_id, tenant=self.tenant, question=self.question,
            conversation_ids=[self.conversation_id], asked_at=self.asked_at, mode=mode,
        )


@dataclass(frozen=True)
class Stated:
    """A value a speaker stated (a home, an employer, a pet), the turn saying it, and when it began."""

    value: str
    turn_id: str
    when: TimeMention | None  # None: introduced as already true ("I live in Lyon")


@dataclass
class Ledger:
    """What one conversation has established so far, per speaker, in the order it was said."""

    homes: dict[str, list[Stated]] = field(default_factory=dict)
    jobs: dict[str, list[Stated]] = field(default_factory=dict)
    pets: dict[str, list[Stated]] = field(default_factory=dict)
    #: (speaker, place) -> the turns saying the speaker went there, one visit each
    visits: dict[tuple[str, str], list[str]] = field(default_factory=dict)

    def home(self, speaker: str) -> str:
        return self.homes[speaker][-1].value

    def job(self, speaker: str) -> str:
        return self.jobs[speaker][-1].value

    def pet_names(self, speaker: str) -> list[str]:
        return [p.value for p in self.pets.get(speaker, [])]

    def questions(self, tenant: str, conversation_id: str, asked_at: datetime, *, limit: int,
                  rng: random.Random) -> list[KnownQuestion]:
        """Up to `limit` questions, the kinds taken in turn so each is represented, drawn with `rng`."""
        candidates = {kind: self._candidates(kind, tenant, conversation_id, asked_at) for kind in KINDS}
        for pool in candidates.values():
            rng.shuffle(pool)
        chosen: list[KnownQuestion] = []
        while len(chosen) < limit and any(candidates.values()):
            for kind in KINDS:
                if candidates[kind] and len(chosen) < limit:
                    chosen.append(candidates[kind].pop())
        return chosen

    def _candidates(self, kind: QuestionKind, tenant: str, conversation_id: str,
                    asked_at: datetime) -> list[KnownQuestion]:
        def ask(question: str, answer: str, evidence: Sequence[str], entity: str, **extra: object) -> KnownQuestion:
            return KnownQuestion(tenant=tenant, conversation_id=conversation_id, question=question,
                                 asked_at=asked_at, answer=answer, evidence_turn_ids=tuple(evidence), kind=kind,
                                 entity=entity, **extra)  # type: ignore[arg-type]

        found: list[KnownQuestion] = []
        if kind == "temporal":
            for speaker, pets in self.pets.items():
                found += [ask(f"When did {speaker} adopt {p.value}?", p.when.answer(), [p.turn_id], p.value,
                              precision=p.when.precision) for p in pets if p.when]
            for speaker, homes in self.homes.items():
                found += [ask(f"When did {speaker} move to {h.value}?", h.when.answer(), [h.turn_id], h.value,
                              precision=h.when.precision) for h in _once(homes) if h.when]
            for speaker, jobs in self.jobs.items():
                found += [ask(f"When did {speaker} start working at {j.value}?", j.when.answer(), [j.turn_id],
                              j.value, precision=j.when.precision) for j in _once(jobs) if j.when]
        elif kind == "counting":
            for (speaker, place), turns in self.visits.items():
                found.append(ask(f"How many times did {speaker} go to {place}?", str(len(turns)), turns, place))
        elif kind == "current":
            for speaker, homes in self.homes.items():
                found.append(ask(f"Where does {speaker} live now?", homes[-1].value, [homes[-1].turn_id],
                                 homes[-1].value, superseded=homes[-2].value if len(homes) > 1 else None))
            for speaker, jobs in self.jobs.items():
                found.append(ask(f"Where does {speaker} work now?", jobs[-1].value, [jobs[-1].turn_id],
                                 jobs[-1].value, superseded=jobs[-2].value if len(jobs) > 1 else None))
        else:  # previous: the value before one that was taken up only once (else "before X" is ambiguous)
            for speaker, homes in self.homes.items():
                found += [ask(f"Where did {speaker} live before {new.value}?", old.value, [new.turn_id], old.value)
                          for old, new in _successions(homes)]
            for speaker, jobs in self.jobs.items():
                found += [ask(f"Where did {speaker} work before {new.value}?", old.value, [new.turn_id], old.value)
                          for old, new in _successions(jobs)]
        return found


def _once(history: list[Stated]) -> list[Stated]:
    """The entries whose value occurs only once in the history (a city moved back to has two dates)."""
    values = [s.value for s in history]
    return [s for s in history if values.count(s.value) == 1]


def _successions(history: list[Stated]) -> list[tuple[Stated, Stated]]:
    unique = {s.value for s in _once(history)}
    return [(old, new) for old, new in zip(history, history[1:], strict=False) if new.value in unique]


# --- relative time expressions, with the day each stands for ---------------------------------------

_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")
_DAY_PHRASES: tuple[tuple[int, str, Precision], ...] = (
    (1, "yesterday", "day"), (2, "the day before yesterday", "day"), (2, "a couple of days ago", "day"),
    *((k, f"{_NUMBER_WORDS[k]} days ago", "day") for k in range(2, 7)))
_WEEK_PHRASES: tuple[tuple[int, str, Precision], ...] = (
    (7, "last week", "week"), (7, "a week ago", "week"), (14, "two weeks ago", "week"),
    (21, "three weeks ago", "week"))


def mention(rng: random.Random, day: date, within_days: int, *, coarse: bool = True) -> TimeMention:
    """A relative expression for a day 1..`within_days` before `day` (at least yesterday), said on `day`.

    `coarse` admits week and month precision ("last week", "in March"); a visit takes day precision
    only, so no two mentions of one place can be read as the same visit.
    """
    limit = max(1, within_days)
    options = [o for o in _DAY_PHRASES if o[0] <= limit]
    options += [(k, f"last {_WEEKDAYS[(day.weekday() - k) % 7]}", "day") for k in range(1, min(7, limit) + 1)]
    if coarse:
        options += [o for o in _WEEK_PHRASES if o[0] <= limit]
        if day.weekday() + 2 <= limit:
            options.append((day.weekday() + 2, "last weekend", "week"))  # the Saturday of last week
        for k in range(1, 6):  # "in <month>": the latest such month before this one, from its first day
            year, month = divmod(day.year * 12 + day.month - 1 - k, 12)
            first = date(year, month + 1, 1)
            if (day - first).days <= limit:
                options.append(((day - first).days, f"in {_MONTHS[month]}", "month"))
    back, phrase, precision = options[int(rng.random() * len(options))]
    return TimeMention(phrase, day - timedelta(days=back), precision)
