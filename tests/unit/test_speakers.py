"""Which words of a question could name a speaker, and the question without the names."""

from __future__ import annotations

from epistream.consumers.retrieval.speakers import MAX_CANDIDATES, candidate_names, without_names


def test_candidates_are_case_folded_runs_of_up_to_three_words_without_possessives():
    names = candidate_names("What did Mary Ann's sister tell Jon?")
    assert "mary ann" in names and "jon" in names and "mary" in names and "ann" in names
    assert "what did mary" in names and "did mary ann sister" not in names
    assert all(name == name.lower() for name in names)


def test_a_hostile_question_is_looked_up_with_a_bounded_number_of_words():
    assert len(candidate_names("word " * 10_000)) <= MAX_CANDIDATES
    assert candidate_names("?? 123 !!") == []


def test_names_and_their_possessives_are_taken_out_of_the_question():
    assert without_names("What did Caroline research?", ["caroline"]) == "What did research?"
    assert without_names("Where is caroline's  school?", ["caroline"]) == "Where is school?"
    assert without_names("What did Mary Ann tell Jon?", ["mary ann", "jon"]) == "What did tell ?"


def test_a_name_inside_another_word_stays_and_a_question_of_names_only_is_kept():
    assert without_names("Did Jonathan meet Jon?", ["jon"]) == "Did Jonathan meet ?"
    assert without_names("Caroline?", ["caroline"]) == "Caroline?"
    assert without_names("What did Nate do?", []) == "What did Nate do?"


def test_a_name_that_looks_like_a_pattern_is_matched_as_text():
    assert without_names("What did A.J. (or a+b) say?", ["a.j.", "a+b"]) == "What did (or ) say?"
