"""The LoCoMo evaluation's scoring: normalisation, F1, BLEU-1, abstention, recall@k, sampling."""

from __future__ import annotations

import math
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from bench.eval_baselines import Line, context_budget_chars, excerpt, newest_that_fit, shrunk_count
from bench.eval_metrics import (
    abstention_stats,
    bleu1,
    f1_score,
    normalize_answer,
    predicted_abstention,
    recall_at_k,
    sample_by_category,
    says_abstain,
    score_answer,
)
from bench.eval_report import markdown, summarise_system
from bench.worker_metrics import parse_model_requests, request_delta


def test_normalisation_lowers_drops_punctuation_articles_and_extra_spaces():
    assert normalize_answer("The  Cat, an apple & A dog!") == "cat apple dog"
    assert normalize_answer("  7 May  2023. ") == "7 may 2023"
    # Articles go only as whole words.
    assert normalize_answer("Theatre and Anna") == "theatre and anna"
    assert normalize_answer("") == ""


def test_f1_over_token_multisets():
    assert f1_score("the cat sat", "A cat sat.") == 1.0
    # pred {cat, sat, down}, gold {cat, sat}: P 2/3, R 1, F1 0.8
    assert f1_score("cat sat down", "cat sat") == pytest.approx(0.8)
    # Multisets: a repeated token matches only as often as the gold has it.
    # pred [dog dog dog], gold [dog cat]: common 1, P 1/3, R 1/2, F1 0.4
    assert f1_score("dog dog dog", "dog cat") == pytest.approx(0.4)
    assert f1_score("nothing shared", "cat") == 0.0
    assert f1_score("", "cat") == 0.0
    assert f1_score("the", "cat") == 0.0  # only an article: empty after normalising


def test_bleu1_is_clipped_unigram_precision_with_brevity_penalty():
    # Longer than the reference: no penalty. hyp [cat sat on mat] vs ref [cat sat]: 2/4.
    assert bleu1("the cat sat on the mat", "the cat sat") == pytest.approx(0.5)
    # Clipping: hyp [dog dog dog] vs ref [dog cat]: min(3, 1) = 1 of 3; c 3 > r 2, no penalty.
    assert bleu1("dog dog dog", "dog cat") == pytest.approx(1 / 3)
    # Shorter than the reference: hyp [paris] vs ref [paris france 2023]: p 1, BP exp(1 - 3/1).
    assert bleu1("Paris", "Paris, France 2023") == pytest.approx(math.exp(-2))
    # hyp [cat sat] vs ref [cat sat mat on]: p 1, BP exp(1 - 4/2) = exp(-1).
    assert bleu1("cat sat", "cat sat on mat") == pytest.approx(math.exp(-1))
    # Equal lengths: BP = exp(0) = 1.
    assert bleu1("red blue", "blue red") == 1.0
    assert bleu1("", "cat") == 0.0
    assert bleu1("dog", "cat") == 0.0


def test_bleu1_matches_nltk_when_installed():
    nltk_bleu = pytest.importorskip("nltk.translate.bleu_score")
    for hyp, ref in [("cat sat on mat", "cat sat"), ("paris", "paris france 2023"), ("a b c d", "d c e")]:
        expected = nltk_bleu.sentence_bleu([ref.split()], hyp.split(), weights=(1, 0, 0, 0))
        assert bleu1(hyp, ref) == pytest.approx(expected)


@pytest.mark.parametrize("text", [
    "I don't know", "I do not know.", "I don’t know: nothing in this memory is about that.",
    "This is not mentioned in the conversation.", "No information available",
    "The conversation does not mention it", "It cannot be answered from memory", "Unknown",
])
def test_abstention_phrases(text):
    assert says_abstain(text)


@pytest.mark.parametrize("text", ["Paris", "7 May 2023", "She knows how to paint", "a nothing burger", ""])
def test_answers_are_not_abstentions(text):
    assert not says_abstain(text)


def test_predicted_abstention_takes_the_flag_or_the_text():
    assert predicted_abstention("Paris", abstained_flag=True)
    assert predicted_abstention("not mentioned", abstained_flag=False)
    assert not predicted_abstention("Paris", abstained_flag=False)


def test_adversarial_questions_score_the_abstention():
    assert score_answer("I don't know", None, 5).f1 == 1.0
    assert score_answer("self-care is important", None, 5).f1 == 0.0
    assert score_answer("anything", None, 5, abstained_flag=True).bleu1 == 1.0
    answered = score_answer("the cat sat", "cat sat", 4)
    assert answered.f1 == 1.0 and not answered.abstained


def test_abstention_precision_and_recall():
    # (predicted, gold): TP 2, FP 1, FN 1.
    stats = abstention_stats([(True, True), (True, True), (True, False), (False, True), (False, False)])
    assert stats.precision == pytest.approx(2 / 3)
    assert stats.recall == pytest.approx(2 / 3)
    assert (stats.predicted, stats.gold, stats.true_positive) == (3, 3, 2)
    empty = abstention_stats([(False, False)])
    assert empty.precision is None and empty.recall is None


def test_recall_at_k_of_the_evidence():
    assert recall_at_k(["D1:2", "D2:8"], ["D1:1", "D1:2"]) == 0.5
    # Duplicated gold ids count once; no gold means no figure.
    assert recall_at_k(["D3:4", "D3:4", "D9:9"], ["D3:4"]) == 0.5
    assert recall_at_k([], ["D1:1"]) is None


def test_sampling_per_category_is_seeded_bounded_and_ordered():
    items = [(i, 1 + i % 5) for i in range(100)]  # 20 of each category
    picked = sample_by_category(items, lambda it: it[1], categories=[1, 2, 5], limit_per_category=4, seed=7)
    assert Counter(c for _, c in picked) == {1: 4, 2: 4, 5: 4}
    assert picked == sorted(picked)  # original order kept
    assert picked == sample_by_category(items, lambda it: it[1], categories=[1, 2, 5], limit_per_category=4, seed=7)
    assert picked != sample_by_category(items, lambda it: it[1], categories=[1, 2, 5], limit_per_category=4, seed=8)
    # Fewer than the limit: all of them; no limit: all of the wanted categories.
    assert len(sample_by_category(items, lambda it: it[1], limit_per_category=50)) == 100
    assert len(sample_by_category(items, lambda it: it[1], categories=[3])) == 20


def _line(i: int, text: str) -> Line:
    return Line(f"D1:{i}", "Ana", text, datetime(2023, 5, 8, 13, 56, tzinfo=UTC) + timedelta(milliseconds=i))


def test_full_context_keeps_the_newest_turns_that_fit():
    lines = [_line(i, "x" * 50) for i in range(1, 101)]
    size = len(excerpt(999, lines[0])) + 1
    kept = newest_that_fit(list(reversed(lines)), size * 10)
    assert [line.turn_id for line in kept] == [f"D1:{i}" for i in range(91, 101)]
    assert newest_that_fit(lines, 10**9) == lines
    assert context_budget_chars(8192, 256) == (8192 - 256 - 320) * 4


def test_an_overlong_window_shrinks_in_proportion_to_the_reported_tokens():
    error = ("master model call failed: BadRequestError: Error code: 400 - This model's maximum context length is "
             "8192 tokens. However, you requested 12047 tokens (12031 in the messages, 16 in the completion).")
    # (8192 - 256 - 64) / 12031 of 300 lines, with a 3% margin: 190.
    assert shrunk_count(300, error, 256) == int(300 * (8192 - 256 - 64) / 12031 * 0.97)
    assert shrunk_count(300, "BadRequestError: something else", 256) == 225  # no figures: keep 3/4
    assert shrunk_count(1, error, 256) == 1


def test_summaries_and_markdown_from_records():
    records = [
        {"category": 4, "systems": {"epistream": {"f1": 1.0, "bleu1": 1.0, "abstained": False, "latency_s": 2.0,
                                                  "tokens": {"master": {"prompt": 100, "completion": 10, "calls": 1}}},
                                    "dense_top_k": {"f1": 0.0, "bleu1": 0.0, "abstained": True, "latency_s": 1.0,
                                                    "tokens": {"master": {"prompt": 50, "completion": 5, "calls": 1}}}}},
        {"category": 5, "systems": {"epistream": {"f1": 1.0, "bleu1": 1.0, "abstained": True, "latency_s": 4.0,
                                                  "tokens": {"master": {"prompt": 300, "completion": 30, "calls": 1}}},
                                    "dense_top_k": {"f1": 0.0, "bleu1": 0.0, "abstained": False, "latency_s": 1.0,
                                                    "tokens": {"master": {"prompt": 50, "completion": 5, "calls": 1}}}}},
    ]
    ours = summarise_system(records, "epistream")
    assert ours["per_category"]["4"]["f1"] == 1.0
    assert ours["answerable_1_4"]["n"] == 1
    assert ours["abstention"] == {"precision": 1.0, "recall": 1.0, "predicted": 1, "gold": 1, "true_positive": 1}
    assert ours["tokens_per_query"]["master"] == {"prompt": 200.0, "completion": 20.0, "calls": 1.0}
    assert summarise_system(records, "full_context") is None
    text = markdown({"run_id": "r", "dataset": "x.json", "conversations": ["conv-1"], "mode": "deep",
                     "model": "m", "store": {}, "questions_asked": 2, "baseline_k": 10,
                     "systems": {"epistream": ours, "dense_top_k": summarise_system(records, "dense_top_k")}})
    assert "| 4 single-hop | 1 | 1.000 | 1.000 | 0.000 | 0.000 |" in text


def test_worker_model_requests_are_parsed_and_differenced():
    text = """# HELP epistream_model_requests_total Model requests
epistream_model_requests_total{endpoint="a:1",outcome="ok",role="assistant"} 53.0
epistream_model_requests_total{endpoint="b:2",outcome="ok",role="assistant"} 2.0
epistream_model_requests_total{endpoint="a:1",outcome="retry",role="assistant"} 32.0
epistream_model_requests_total{endpoint="a:1",outcome="ok",role="master"} 2.0
epistream_answer_questions_total{mode="deep",outcome="abstained"} 11.0
"""
    after = parse_model_requests(text)
    assert after == {"assistant": {"ok": 55.0, "retry": 32.0}, "master": {"ok": 2.0}}
    before = {"assistant": {"ok": 50.0, "retry": 32.0}}
    assert request_delta(before, after) == {"assistant": {"ok": 5.0}, "master": {"ok": 2.0}}
    assert request_delta(None, after) is None
