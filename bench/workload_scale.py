"""The scale benchmark's workload: a deterministic, seeded stream of LoCoMo-like chat turns at any size.

Many tenants, each with many conversations, plus one tenant holding one very long conversation;
dated sessions days apart; two or three speakers per conversation with stable names; turns of
10-40 words (median about 20) filled from templates with recurring entities (homes, employers,
pets, places, hobbies) that change over time, and relative time expressions ("two days ago",
"last Monday", "in March") whose day follows from the session's date. Questions with known
answers and evidence turns come from the same plan (below).

Everything is lazy: `turns` yields in produce order (each conversation in time order, all of them
interleaved by time as live agents would send them) and keeps only each conversation's state.
Each conversation draws from two `random.Random` instances of its own, seeded with text: one for
the plan (who says what fact when, timestamps), one for wording, so `questions` can replay the plan
without writing any text, and the same spec gives the same bytes on every run and machine.

The known answers: what each conversation established, and the questions it can answer. A `Ledger`
records, while a conversation is generated, every fact that a question may ask about (where each
speaker lived and worked, the pets they adopted, the places they went to) together with the turn
that says it. Questions are drawn from it once the conversation ends, so every answer and its
evidence come from the same plan as the turns. `mention` picks the relative time expression a fact
is told with and computes, by plain calendar arithmetic, the day it stands for: the answer of a
temporal question.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from string import Formatter
from typing import Literal, TypeVar

from epistream.contracts.questions import Mode, Question
from epistream.contracts.turns import Turn

# --- the known answers ----------------------------------------------------------------------------

Precision = Literal["day", "week", "month"]
QuestionKind = Literal["temporal", "counting", "current", "previous"]
KINDS: tuple[QuestionKind, ...] = ("temporal", "counting", "current", "previous")


@dataclass(frozen=True)
class TimeMention:
    """A relative time expression as a turn says it, and the day it stands for said that day.

    `day` is computed here from the session's date, independently of epistream.core.dates, so a test can
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


# --- the turns ------------------------------------------------------------------------------------

#: Every conversation starts within WINDOW_DAYS of this day (at a random day that lets it end in time).
WINDOW_START = date(2023, 1, 2)
#: A conversation's sessions are at most this many days apart, fewer when it has many sessions
#: (a very long conversation is a daily chat instead of one spanning centuries).
MAX_GAP_DAYS = 14
#: Every conversation spans at most about this many days, so all of them overlap in time: a prefix of
#: the produce-ordered stream (a memory at an earlier moment) holds every tenant in proportion. A very
#: long conversation has several sessions a day instead (an agent's all-day chat with one user).
SPAN_TARGET_DAYS = 540
#: The days all conversations share (the long one spans nearly all of it).
WINDOW_DAYS = 500
#: The part of a day a conversation's sessions share when there are several a day.
ACTIVE_DAY_S = 14 * 3600
#: Tenants' UTC offsets in minutes (dates are the speakers' local ones), taken in turn.
TENANT_OFFSETS_MIN = (0, 60, -300, 330, 540, -480)
TEXT_WORDS_MIN, TEXT_WORDS_MODE, TEXT_WORDS_MAX = 8, 8, 40

NAMES = ("Alex Sam Priya Jonas Mei Omar Lena Diego Aisha Tomas Yuki Noah Freya Malik Ines Ravi Hana Lucas Zara "
         "Felix Amara Leo Sofia Kenji Nadia Oscar Maya Emil Chloe Idris Greta Arjun Lucia Bram Selin Tariq Elena "
         "Milo Ada Rafael Nora Kofi Vera Hugo Layla Anton Iris Mateo June Caleb Rosa Dev Elif Pablo Thea").split()
PET_NAMES = ("Biscuit Mochi Rex Luna Nugget Pickles Ziggy Clover Waffles Pretzel Juniper Noodle Pumpkin Socks "
             "Bruno Cosmo Dotty Gizmo Kiwi Loki Marble Nacho Peanut Quincy Rolo Sprout Tango Velvet Zuko Chester "
             "Daisy Fudge Hopper Inky Jasper Kipper Lentil Muffin Oreo Pippin Rascal Scout Truffle Whiskers").split()
PET_KINDS = ("puppy", "kitten", "rescue dog", "cat", "parrot", "rabbit", "hamster", "tortoise", "guinea pig")
CITIES = ("Lisbon Porto Valencia Lyon Utrecht Ghent Bergen Tampere Krakow Brno Ljubljana Trieste Bologna Seville "
          "Bilbao Marseille Leipzig Aarhus Gdansk Tallinn Riga Vilnius Galway Cork Edinburgh Leeds Bristol Halifax "
          "Boulder Asheville Portland Tucson Savannah Madison Duluth Hobart Wellington Dunedin").split()
_FIRMS = ("Northwind Bluepeak Copperleaf Fernhill Greystone Harborview Ironwood Kestrel Lumen Meridian Nimbus "
          "Oakridge Pinecrest Redfern Silverline Tidewater Vantage Wildrose").split()
_FIRM_KINDS = ("Labs", "Logistics", "Health", "Studio", "Foods", "Energy", "Analytics", "Robotics", "Press", "Bank")
EMPLOYERS = tuple(f"{a} {b}" for a in _FIRMS for b in _FIRM_KINDS)
ROLES = ("a nurse", "a data analyst", "a teacher", "a sous-chef", "an architect", "a product designer",
         "an accountant", "a mechanic", "a librarian", "a paramedic", "a copywriter", "a lab technician",
         "a project manager", "a carpenter")
_AREAS = ("Riverside", "Old Town", "Harbor", "Hilltop", "Northside", "Elm Road", "Station", "Canal", "Market Square")
_VENUES = ("climbing gym", "farmers market", "bakery", "yoga studio", "public library", "swimming pool", "bookshop",
           "jazz bar", "community garden", "pottery studio", "cinema", "running track", "food hall", "art museum")
PLACES = tuple(f"the {a} {v}" for a in _AREAS for v in _VENUES)
HOBBIES = ("painting", "pottery", "rock climbing", "baking sourdough", "birdwatching", "chess", "knitting",
           "photography", "gardening", "playing guitar", "trail running", "woodworking", "salsa dancing",
           "board games", "journaling", "kayaking", "calligraphy", "cycling", "sketching", "learning Japanese")
FOODS = ("ramen", "dumplings", "paella", "tacos", "pho", "falafel", "risotto", "curry", "pierogi", "shakshuka")
BOOKS = ("The Overstory", "Piranesi", "Circe", "The Remains of the Day", "Project Hail Mary", "Station Eleven",
         "Pachinko", "The Left Hand of Darkness", "Educated", "Klara and the Sun")

# Wording. No template but a visit's says "went to" (the counting questions are recounted from the text),
# and none holds a relative time expression besides the fact's own {when}.
_VISIT = ("I went to {place} {when} and {detail}.", "{When} I went to {place} with {friend}, {detail}.",
          "I went to {place} again {when}, {detail}.")
_VISIT_DETAIL = ("it was packed", "we stayed for hours", "I met a few neighbours there", "the staff remembered me",
                 "it was quieter than usual", "I bumped into an old colleague")
_HOME_INTRO = ("I live in {value}, close to the old harbour, and I really like it there.",
               "Home for me is {value} at the moment, a small flat near a park.",
               "We have been living in {value} for a while and it suits us well.")
_HOME_MOVE = ("Big news: we moved from {old} to {value} {when}!",
              "{When} I finally moved out of {old}, so I live in {value} these days.",
              "We left {old} {when} and moved into a place in {value}.")
_JOB_INTRO = ("I work at {value} as {extra}, the team is great.", "These days I am {extra} at {value}.")
_JOB_CHANGE = ("I started a new job at {value} {when}, after my time at {old}.",
               "{When} I started at {value} as {extra}, so no more {old} for me.",
               "I left {old} and joined {value} {when}.")
_ADOPT = ("We adopted a {extra} {when} and named it {value}.",
          "{When} I brought home a {extra} from the shelter, {value} already rules the house.",
          "Meet {value}! I adopted this little {extra} {when}.")
_REPLY = {
    "home": ("How are you settling into {value}, {name}? Moving is so stressful.",
             "Oh nice, I have heard good things about {value}."),
    "job": ("Good luck at {value}! What is the team like?", "That is great news, {name}. Do you like {value} so far?"),
    "pet": ("Congratulations on {value}! Please send me photos.", "A {extra}? {value} sounds adorable, {name}."),
    "visit": ("I have never been to {value}, is it worth it?", "Sounds like {value} is becoming your spot, {name}."),
}
_FILLER = ("I have been getting back into {hobby} and it really helps me switch off after work.",
           "The weather in {city} has been all over the place, sunny one hour and pouring the next.",
           "Work at {employer} has been hectic, we are finishing a big project for a client.",
           "My friend {friend} talked me into trying {hobby}, I was terrible but it was fun.",
           "Have you tried {food}? There is a great spot near my place that does it really well.",
           "I finished reading {book} and I cannot stop thinking about the ending.",
           "How is {hobby} going for you, {name}?", "That sounds lovely, {name}. What did you enjoy most?",
           "Honestly I needed a quiet evening, so I cooked {food} and watched a film.",
           "{friend} and I are planning a trip away from {city} once things calm down.")
_PET_FILLER = ("{pet} keeps stealing my socks, honestly it is the funniest thing.",
               "I took {pet} to the vet for a checkup and everything is fine.")
_MORE = ("It was exhausting but worth it.", "I want to do that more often.", "My partner thinks I am obsessed.",
         "Anyway, enough about me.", "I took a ton of photos.", "We should plan something together soon.",
         "I could talk about it for hours.", "It reminded me of when we were kids.", "What about you?",
         "I am still smiling about it.", "It was not perfect, but I learned a lot.")


@dataclass(frozen=True)
class WorkloadSpec:
    """The size and seed of a workload. `long_conversation_sessions` > 0 adds one more tenant that
    holds a single conversation of that many sessions (the "one large conversation" case)."""

    tenants: int
    conversations_per_tenant: int
    sessions_per_conversation: int
    turns_per_session: int
    questions_per_conversation: int = 6
    long_conversation_sessions: int = 0
    seed: int = 13
    prefix: str = "scale"  # the start of every tenant id (a run id keeps runs apart)

    def __post_init__(self) -> None:
        if self.turns_per_session < 6:
            raise ValueError("a session needs at least 6 turns (three speakers each introduce a home and a job)")
        if min(self.tenants, self.conversations_per_tenant, self.sessions_per_conversation) < 0:
            raise ValueError("sizes are not negative")

    @property
    def conversations(self) -> int:
        return self.tenants * self.conversations_per_tenant + (1 if self.long_conversation_sessions else 0)

    @property
    def turns(self) -> int:
        sessions = self.tenants * self.conversations_per_tenant * self.sessions_per_conversation
        return (sessions + self.long_conversation_sessions) * self.turns_per_session

    def conversation_ids(self) -> list[tuple[str, str]]:
        """(tenant, conversation id) of every conversation, the long one last."""
        return [self.conversation(index)[:2] for index in range(self.conversations)]

    def conversation(self, index: int) -> tuple[str, str, int, int]:
        """The `index`th conversation's tenant, id, tenant number and sessions."""
        regular = self.tenants * self.conversations_per_tenant
        if index < regular:
            tenant, number = divmod(index, self.conversations_per_tenant)
            sessions = self.sessions_per_conversation
        else:
            tenant, number, sessions = self.tenants, 0, self.long_conversation_sessions
        return self._tenant(tenant), f"{self._tenant(tenant)}-c{number:04d}", tenant, sessions

    @property
    def busy_tenant(self) -> str | None:
        """A tenant with many conversations (the first)."""
        return self._tenant(0) if self.tenants and self.conversations_per_tenant else None

    @property
    def long_conversation(self) -> tuple[str, str] | None:
        return self.conversation_ids()[-1] if self.long_conversation_sessions else None

    def _tenant(self, index: int) -> str:
        return f"{self.prefix}-t{index:03d}"


def spec_for_turns(turns: int, *, seed: int = 13, prefix: str = "scale", turns_per_session: int = 20,
                   sessions_per_conversation: int = 25, long_share: float = 0.1) -> WorkloadSpec:
    """A spec of about `turns` turns (within half a session): about sqrt(turns)/50 tenants of equal
    conversations, and one long conversation of `long_share` of the turns, at least four regular ones."""
    sessions = round(turns / turns_per_session)
    long_sessions = max(round(long_share * sessions), 4 * sessions_per_conversation)
    tenants = max(2, round(math.sqrt(turns) / 50))
    per_tenant = max(2, round((sessions - long_sessions) / (tenants * sessions_per_conversation)))
    long_sessions = sessions - tenants * per_tenant * sessions_per_conversation
    if long_sessions < 4 * sessions_per_conversation:
        raise ValueError(f"{turns} turns are too few for {tenants} tenants of {per_tenant} conversations "
                         f"and a long one; use a WorkloadSpec")
    return WorkloadSpec(tenants=tenants, conversations_per_tenant=per_tenant,
                        sessions_per_conversation=sessions_per_conversation, turns_per_session=turns_per_session,
                        long_conversation_sessions=long_sessions, seed=seed, prefix=prefix)


PRESETS: dict[str, WorkloadSpec] = {"10k": spec_for_turns(10_000), "100k": spec_for_turns(100_000),
                                    "1m": spec_for_turns(1_000_000)}


def turns(spec: WorkloadSpec) -> Iterator[Turn]:
    """Every turn of the workload, in produce order."""
    for turn, _ in annotated_turns(spec):
        yield turn


def annotated_turns(spec: WorkloadSpec) -> Iterator[tuple[Turn, TimeMention | None]]:
    """Every turn in produce order, with the time expression it contains (and the day it means), if any."""
    streams = [_Conversation(spec, index).stream(render=True) for index in range(spec.conversations)]
    for _, _, turn, said in heapq.merge(*streams):
        yield turn, said  # type: ignore[misc]


def questions(spec: WorkloadSpec) -> Iterator[KnownQuestion]:
    """The known questions of every conversation (replaying the plan, writing no text)."""
    for index in range(spec.conversations):
        yield from conversation_questions(spec, index)


def conversation_questions(spec: WorkloadSpec, index: int, *, limit: int | None = None) -> list[KnownQuestion]:
    """The `index`th conversation's known questions: `spec.questions_per_conversation`, or up to
    `limit` (a long conversation holds many more facts than that sample asks about)."""
    conversation = _Conversation(spec, index)
    for _ in conversation.stream(render=False):
        pass
    return conversation.questions(limit=limit)


T = TypeVar("T")
FactKind = Literal["home", "job", "pet", "visit"]


@dataclass(frozen=True)
class _Fact:
    kind: FactKind
    speaker: str
    value: str
    when: TimeMention | None = None
    old: str | None = None
    extra: str = ""  # a pet's kind, a new job's role


class _Conversation:
    """One conversation's plan and wording, generated session by session."""

    def __init__(self, spec: WorkloadSpec, index: int) -> None:
        self.spec, self.index = spec, index
        self.tenant, self.conversation_id, tenant_index, self.sessions = spec.conversation(index)
        self.tz = timezone(timedelta(minutes=TENANT_OFFSETS_MIN[tenant_index % len(TENANT_OFFSETS_MIN)]))
        self.plan = random.Random(f"{spec.seed}/{self.conversation_id}/plan")
        self.words = random.Random(f"{spec.seed}/{self.conversation_id}/text")
        plan = self.plan
        self.speakers = plan.sample(NAMES, 3 if plan.random() < 0.2 else 2)
        others = [n for n in NAMES if n not in self.speakers]
        self.friends = {s: plan.sample(others, 3) for s in self.speakers}
        self.hobbies = {s: plan.sample(HOBBIES, 2) for s in self.speakers}
        self.haunts = {s: plan.sample(PLACES, 3) for s in self.speakers}
        self.visited: set[tuple[str, str, date]] = set()
        self.ledger = Ledger()
        self.max_gap = max(1, min(MAX_GAP_DAYS, 2 * SPAN_TARGET_DAYS // max(1, self.sessions)))
        self.per_day = -(-self.sessions // SPAN_TARGET_DAYS)  # sessions a day, 1 unless very long
        self.last_ts: datetime | None = None

    def questions(self, *, limit: int | None = None) -> list[KnownQuestion]:
        assert self.last_ts is not None, "questions come after the conversation is generated"
        return self.ledger.questions(self.tenant, self.conversation_id, self.last_ts + timedelta(hours=1),
                                     limit=self.spec.questions_per_conversation if limit is None else limit,
                                     rng=self.plan)

    def stream(self, *, render: bool) -> Iterator[tuple[int, int, Turn | None, TimeMention | None]]:
        """(instant in seconds, conversation index, turn, its time expression), in time order."""
        plan, tps = self.plan, self.spec.turns_per_session
        days = self.sessions // self.per_day * (self.max_gap + 1) // 2  # the span it is expected to take
        day = WINDOW_START + timedelta(days=plan.randint(0, max(0, WINDOW_DAYS - days)))
        previous: date | None = None
        slot_s = ACTIVE_DAY_S // self.per_day  # each of a day's sessions has its own slot
        spacing = max(5, min(90, 8 * 3600 // tps, slot_s // (2 * tps)))  # a session stays inside its slot
        offset_s = int(self.tz.utcoffset(None).total_seconds())
        for session in range(self.sessions):
            slot = session % self.per_day
            if session and not slot:
                day += timedelta(days=plan.randint(1, self.max_gap))
            order = self._speaker_order(tps)
            placed = self._place(self._facts(session, day, previous), order, earliest=session == 0)
            if self.per_day == 1:
                second = 9 * 3600 + plan.randint(0, 4 * 3600)
            else:
                second = 8 * 3600 + slot * slot_s + plan.randint(0, slot_s - tps * spacing)
            midnight = datetime(day.year, day.month, day.day, tzinfo=self.tz)
            base = day.toordinal() * 86_400 - offset_s
            for position, speaker in enumerate(order):
                second += 5 + int(plan.random() * (spacing - 4))  # 5..spacing s (randint costs 5x more)
                turn_id = f"{self.conversation_id}:{session + 1}:{position + 1}"
                fact = placed.get(position)
                if fact is not None:
                    self._record(fact, turn_id)
                ts = midnight + timedelta(seconds=second)
                self.last_ts = ts
                if not render:
                    yield base + second, self.index, None, None
                    continue
                text = self._text(speaker, fact, placed.get(position - 1))
                turn = Turn(tenant=self.tenant, conversation_id=self.conversation_id, turn_id=turn_id,
                            speaker=speaker, text=text, ts=ts, session_id=f"session_{session + 1}")
                yield base + second, self.index, turn, fact.when if fact else None
            previous = day

    # --- the plan: speakers, facts and where they are said ---------------------------------------

    def _speaker_order(self, count: int) -> list[str]:
        plan, speakers = self.plan, self.speakers
        order = [_pick(plan, speakers)]
        while len(order) < count:  # never the same speaker twice in a row
            order.append(speakers[(speakers.index(order[-1]) + 1 + int(plan.random() * (len(speakers) - 1)))
                                  % len(speakers)])
        return order

    def _facts(self, session: int, day: date, previous: date | None) -> list[_Fact]:
        plan, ledger = self.plan, self.ledger
        if session == 0:
            return [f for s in self.speakers for f in (_Fact("home", s, plan.choice(CITIES)),
                    _Fact("job", s, plan.choice(EMPLOYERS), extra=plan.choice(ROLES)))]
        since = (day - previous).days if previous else 30
        facts: list[_Fact] = []
        for s in self.speakers:
            if plan.random() < 0.04:
                old = ledger.home(s)
                facts.append(_Fact("home", s, plan.choice([c for c in CITIES if c != old]), mention(plan, day, since),
                                   old))
            if plan.random() < 0.04:
                old = ledger.job(s)
                facts.append(_Fact("job", s, plan.choice([e for e in EMPLOYERS if e != old]),
                                   mention(plan, day, since), old, plan.choice(ROLES)))
            taken = {n for names in ledger.pets.values() for n in (p.value for p in names)}
            if plan.random() < 0.05 and len(taken) < len(PET_NAMES):
                # an adoption changes nothing asked before, so it may lie further back (up to months)
                facts.append(_Fact("pet", s, plan.choice([n for n in PET_NAMES if n not in taken]),
                                   mention(plan, day, 150, coarse=True), extra=plan.choice(PET_KINDS)))
            if plan.random() < 0.03:  # a new haunt replaces an old one
                self.haunts[s][plan.randrange(3)] = plan.choice([p for p in PLACES if p not in self.haunts[s]])
            for place in plan.sample(self.haunts[s], plan.choice((0, 0, 1, 1, 2))):
                when = mention(plan, day, since, coarse=False)
                if (s, place, when.day) not in self.visited:  # one mention per visit, so a recount is exact
                    self.visited.add((s, place, when.day))
                    facts.append(_Fact("visit", s, place, when))
        return facts

    def _place(self, facts: list[_Fact], order: list[str], *, earliest: bool) -> dict[int, _Fact]:
        """Each fact at a free turn of its speaker; one that finds none is not said (nor recorded).
        `earliest`: at the speaker's first free turn (introductions come before any small talk)."""
        placed: dict[int, _Fact] = {}
        for fact in facts:
            free = [i for i, s in enumerate(order) if s == fact.speaker and i not in placed]
            if free:
                placed[free[0] if earliest else self.plan.choice(free)] = fact
        return placed

    def _record(self, fact: _Fact, turn_id: str) -> None:
        ledger, stated = self.ledger, Stated(fact.value, turn_id, fact.when)
        if fact.kind == "visit":
            ledger.visits.setdefault((fact.speaker, fact.value), []).append(turn_id)
        else:
            history = {"home": ledger.homes, "job": ledger.jobs, "pet": ledger.pets}[fact.kind]
            history.setdefault(fact.speaker, []).append(stated)

    # --- the wording --------------------------------------------------------------------------------

    def _text(self, speaker: str, fact: _Fact | None, before: _Fact | None) -> str:
        words = self.words
        if fact is not None:
            first = self._fact_sentence(fact)
        elif before is not None and before.speaker != speaker and words.random() < 0.6:
            first = _pick(words, _REPLY[before.kind]).format(value=before.value, extra=before.extra,
                                                             name=before.speaker)
        else:
            pets = self.ledger.pets.get(speaker)
            template, slots = _pick(words, _FILLER_SLOTS + _PET_FILLER_SLOTS if pets else _FILLER_SLOTS)
            first = template.format(**{name: self._slot(name, speaker) for name in slots})
        target = round(words.triangular(TEXT_WORDS_MIN, TEXT_WORDS_MAX, TEXT_WORDS_MODE))
        sentences, count = [first], len(first.split())
        # distinct extra sentences (a stride through a prime number of them visits each once)
        at, stride = int(words.random() * len(_MORE)), 1 + int(words.random() * (len(_MORE) - 1))
        while count < target:
            more, more_count = _MORE[at], _MORE_COUNTS[at]
            if count + more_count > TEXT_WORDS_MAX:
                break
            sentences.append(more)
            count += more_count
            at = (at + stride) % len(_MORE)
        return " ".join(sentences)

    def _slot(self, name: str, speaker: str) -> str:
        words = self.words
        if name == "hobby":
            return _pick(words, self.hobbies[speaker])
        if name == "friend":
            return _pick(words, self.friends[speaker])
        if name == "name":
            return _pick(words, [s for s in self.speakers if s != speaker])
        if name == "city":
            return self.ledger.home(speaker)
        if name == "employer":
            return self.ledger.job(speaker)
        if name == "pet":
            return _pick(words, self.ledger.pets[speaker]).value
        return _pick(words, FOODS if name == "food" else BOOKS)

    def _fact_sentence(self, fact: _Fact) -> str:
        words = self.words
        if fact.kind == "visit":
            template, friend = _pick(words, _VISIT), _pick(words, self.friends[fact.speaker])
            return _fill(template, fact, place=fact.value, friend=friend, detail=_pick(words, _VISIT_DETAIL))
        templates = {"home": (_HOME_INTRO, _HOME_MOVE), "job": (_JOB_INTRO, _JOB_CHANGE), "pet": (_ADOPT, _ADOPT)}
        intro, change = templates[fact.kind]
        return _fill(_pick(words, change if fact.when else intro), fact, value=fact.value, old=fact.old or "",
                     extra=fact.extra)


def _pick(rng: random.Random, options: Sequence[T]) -> T:
    """`rng.choice`, at a third of its cost (most of the generator's time is drawing words)."""
    return options[int(rng.random() * len(options))]


def _slots(templates: tuple[str, ...]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return tuple((t, tuple(name for _, name, _, _ in Formatter().parse(t) if name)) for t in templates)


_FILLER_SLOTS, _PET_FILLER_SLOTS = _slots(_FILLER), _slots(_PET_FILLER)
_MORE_COUNTS = tuple(len(m.split()) for m in _MORE)


def _fill(template: str, fact: _Fact, **slots: str) -> str:
    phrase = fact.when.phrase if fact.when else ""
    return template.format(when=phrase, When=phrase[:1].upper() + phrase[1:], **slots)
