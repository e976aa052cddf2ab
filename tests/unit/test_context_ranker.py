"""The context read's learned ranker: its features, how it reorders the candidates, the shipped file
against its card, and the setting that refuses a missing or corrupt file (the trainer: bench/tests)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from datetime import UTC, date, datetime

import numpy as np
import pytest

from epistream.consumers.packing import gist_candidate, neighbour_candidate, turn_candidate
from epistream.consumers.ranking import Asked, features, reorder, self_statement
from epistream.consumers.retrieval import (
    FEATURES,
    LinearRanker,
    NearGist,
    RankerFileError,
    RetrievedTurn,
    from_settings,
)
from epistream.errors import SettingsError
from epistream.settings import ranker_cards
from epistream.settings.processes import Settings, load_settings


def _turn(i: int, text: str, *, score: float, speaker: str = "Ana", dense: int | None = None,
          lexical: int | None = None, minute: int | None = None) -> RetrievedTurn:
    return RetrievedTurn(conversation_id="c", turn_id=f"t{i}", speaker=speaker, text=text,
                         ts=datetime(2024, 3, 18, 20, i if minute is None else minute, tzinfo=UTC), session_id=None,
                         score=score, dense_rank=dense, lexical_rank=lexical, segment_id="c#0")


def _row(rows: np.ndarray, n: int) -> dict[str, float]:
    return dict(zip(FEATURES, rows[n].tolist(), strict=True))


ASKED = Asked.of("What does Ana love about Paris?", "What does love about Paris?", ["ana"])


def test_features_read_the_pathways_the_speaker_and_the_words():
    seed = turn_candidate(_turn(1, "I love Paris in the spring, always have", score=0.06, dense=1, lexical=2))
    other = turn_candidate(_turn(2, "Nice. What about you?", score=0.03, speaker="Bo", dense=5))
    after = neighbour_candidate(_turn(3, "We went there last week", score=0.0), seed, 1, 0.8)
    rows = features([seed, other, after], ASKED)
    assert rows.shape == (3, len(FEATURES))
    first, second, third = _row(rows, 0), _row(rows, 1), _row(rows, 2)
    assert first["fused_share"] == 1.0 and first["dense_rr"] == pytest.approx(1 / 31)
    assert first["in_lexical"] == 1.0 and second["in_lexical"] == 0.0
    assert first["speaker_named"] == 1.0 and second["other_speaker"] == 1.0
    assert first["entity_overlap"] == 1.0 and first["word_overlap"] == 1.0  # "love" and "Paris"
    assert first["self_statement"] == first["self_named"] == first["self_preference"] == 1.0
    assert second["asks"] == 1.0 and second["self_statement"] == 0.0
    assert third["neighbour"] == 1.0 and third["neighbour_after"] == 1.0 and third["has_date"] == 1.0
    assert third["fused"] == pytest.approx(0.048)


def test_self_statements_are_first_person_preferences():
    assert self_statement("My favourite book is Dune")
    assert self_statement("I've always wanted to paint")
    assert not self_statement("The weather was nice")


def _ranker(**weights: float) -> LinearRanker:
    return LinearRanker(name="t", means=(0.0,) * len(FEATURES), scales=(1.0,) * len(FEATURES),
                        coefficients=tuple(weights.get(f, 0.0) for f in FEATURES), intercept=0.0)


def test_the_ranker_reorders_turns_and_keeps_the_period_first_and_gists_after_turns():
    a = turn_candidate(_turn(1, "short", score=0.06))
    b = turn_candidate(_turn(2, "a much longer turn with many more words in it", score=0.05))
    about = turn_candidate(_turn(3, "a bit longer", score=0.01)).plus("period", 1.0)
    gist = gist_candidate(NearGist(gist_id="g", conversation_id="c", segment_id="c#0", text="2024-03-18: x",
                                   event_date=date(2024, 3, 18), date_precision="day", turn_ids=["t1"],
                                   said_at=datetime(2024, 3, 18, 20, 0, tzinfo=UTC), first_day=None,
                                   last_day=None, distance=0.1), 1, 30)
    ranked = [about, a, gist, b]
    order = [c.key[-1] for c in reorder(_ranker(log_words=1.0), ranked, ASKED)]
    assert order == ["t3", "t2", "t1", gist.key[-1]]
    unordered = replace(_ranker(log_words=1.0), period_first=False)
    assert [c.key[-1] for c in reorder(unordered, ranked, ASKED)][:3] == ["t2", "t3", "t1"]


def test_a_file_of_other_features_is_refused():
    good = json.loads(ranker_cards.BUILTIN.path.read_text())
    assert LinearRanker.from_json(good).name == ranker_cards.BUILTIN.name
    with pytest.raises(RankerFileError, match="features"):
        LinearRanker.from_json({**good, "features": good["features"][:-1]})
    with pytest.raises(RankerFileError, match="scale"):
        LinearRanker.from_json({**good, "scales": [0.0] * len(FEATURES)})


def test_the_shipped_file_has_its_cards_sha256():
    card = ranker_cards.BUILTIN
    assert hashlib.sha256(card.path.read_bytes()).hexdigest() == card.sha256
    assert json.loads(card.path.read_text())["training"]["split"] == "pick"


def test_the_builtin_ranker_loads_into_the_read():
    assert from_settings(Settings(context_ranker="builtin")).context.ranker is not None
    assert from_settings(Settings(context_ranker="none")).context.ranker is None


@pytest.mark.parametrize("content", [None, b'{"name": "tampered"}'])
def test_a_missing_or_corrupt_builtin_file_stops_start_up_naming_the_setting(tmp_path, monkeypatch, content):
    path = tmp_path / "context-ranker-v1.json"
    if content is not None:
        path.write_bytes(content)
    monkeypatch.setattr(ranker_cards, "BUILTIN", replace(ranker_cards.BUILTIN, file=str(path)))
    monkeypatch.setenv("EPISTREAM_CONTEXT_RANKER", "builtin")
    with pytest.raises(SettingsError, match="EPISTREAM_CONTEXT_RANKER.*(missing|corrupt)"):
        load_settings()


def test_a_ranker_path_that_is_no_file_stops_start_up(tmp_path, monkeypatch):
    monkeypatch.setenv("EPISTREAM_CONTEXT_RANKER", str(tmp_path / "absent.json"))
    with pytest.raises(SettingsError, match="EPISTREAM_CONTEXT_RANKER"):
        load_settings()


def test_a_ranker_file_of_the_wrong_shape_stops_the_read_naming_the_setting(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text('{"features": ["x"]}')
    with pytest.raises(RankerFileError, match="EPISTREAM_CONTEXT_RANKER"):
        from_settings(Settings(context_ranker=str(path)))
