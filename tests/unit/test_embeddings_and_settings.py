from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from epistream.errors import SettingsError
from epistream.models.embeddings import DIMENSIONS, Embedder
from epistream.settings.models import JsonMode
from epistream.settings.processes import Settings, load_settings
from epistream.storage.db import migration_files


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder.from_settings(Settings())


def test_embeddings_are_unit_vectors_of_the_right_size(embedder):
    vectors = embedder.embed(["A man is eating food.", "A man is eating a piece of bread.", "The girl carries a baby."])
    assert vectors.shape == (3, DIMENSIONS) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    sims = vectors @ vectors.T
    assert sims[0, 1] > sims[0, 2] + 0.1


def test_batching_does_not_change_vectors(embedder):
    texts = [f"sentence number {i} about {'cats' if i % 2 else 'trains'}" for i in range(70)]
    together = embedder.embed(texts)
    alone = np.vstack([embedder.embed([t])[0] for t in texts[:3]])
    # The quantised models quantise activations per batch: a text's vector moves by < 0.01 cosine with its batch.
    assert (together[:3] * alone).sum(axis=1).min() > 0.99
    assert embedder.embed([]).shape == (0, DIMENSIONS)


def test_length_sorted_batching_restores_the_callers_order(embedder):
    texts = ["a considerably longer sentence about mountains, rivers and a long walk home", "hi", "cats purr"]
    together = embedder.embed(texts)
    alone = np.vstack([embedder.embed([t])[0] for t in texts])
    assert (together * alone).sum(axis=1).min() > 0.99


def test_settings_come_from_prefixed_environment(monkeypatch):
    monkeypatch.setenv("EPISTREAM_KAFKA_BOOTSTRAP", "broker:9092")
    monkeypatch.setenv("EPISTREAM_LLM_JSON_MODE", "json_schema")
    monkeypatch.setenv("EPISTREAM_DATABASE_URL", "postgresql://u:pw-never-shown@db/x")
    settings = Settings()
    assert settings.kafka_bootstrap == "broker:9092" and settings.llm_json_mode is JsonMode.JSON_SCHEMA
    assert "pw-never-shown" not in repr(settings)


def test_lists_and_choices_are_parsed_and_checked_at_start_up(monkeypatch):
    monkeypatch.setenv("EPISTREAM_ROUTER_WEIGHTS", "0.2, 0.5,0.3")
    monkeypatch.setenv("EPISTREAM_ASSISTANT_BASE_URLS", "http://a:8000/v1, http://b:8000/v1")
    monkeypatch.setenv("EPISTREAM_ROUTER_FUSION", "rrf")
    settings = load_settings()
    assert settings.pathway_weights == (0.2, 0.5, 0.3) and settings.router_fusion == "rrf"
    assert settings.assistant_urls == ["http://a:8000/v1", "http://b:8000/v1"]
    monkeypatch.delenv("EPISTREAM_ASSISTANT_BASE_URLS")
    assert load_settings().assistant_urls == [load_settings().llm_base_url]


@pytest.mark.parametrize(("variable", "value"), [
    ("EPISTREAM_ROUTER_FUSION", "weighted"),  # once silently read as minmax
    ("EPISTREAM_ROUTER_WEIGHTS", "0.3,0.4"),
    ("EPISTREAM_ROUTER_WEIGHTS", "0.3,abc,0.3"),
    ("EPISTREAM_ROUTER_WEIGHTS", "0,0,0"),
    ("EPISTREAM_ASSISTANT_BASE_URLS", "http://a:8000/v1,b:8000"),
    ("EPISTREAM_LLM_BASE_URL", "localhost:8080"),
    # Several servers: the read-after mark and the read could come from two standbys (docs/operations.md).
    ("EPISTREAM_DATABASE_READ_URL", "postgresql://epistream_worker@standby-1,standby-2/epistream"),
    ("EPISTREAM_DATABASE_READ_URL", "host=standby-1 hostaddr=10.0.0.1,10.0.0.2 dbname=epistream"),
    ("EPISTREAM_DATABASE_READ_URL", "standby-1:5432"),  # not a connection string
])
def test_a_bad_setting_fails_at_start_up_naming_its_variable(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError, match=variable):
        load_settings()


def test_migrations_are_numbered_uniquely_and_in_order():
    files = migration_files()
    versions = [v for v, _ in files]
    assert versions == sorted(versions) == list(range(1, len(files) + 1))
    assert all(isinstance(p, Path) and p.suffix == ".sql" for _, p in files)


def test_settings_are_the_union_of_disjoint_groups_each_loadable_alone(monkeypatch):
    from epistream import settings as config

    groups = [config.KafkaSettings, config.PostgresSettings, config.ModelSettings, config.SegmentSettings,
              config.RetrievalSettings, config.WorkerSettings, config.AnswerSettings, config.TracingSettings,
              config.SecuritySettings, config.SupervisionSettings,
              config.EventSettings]
    names = [name for group in groups for name in group.model_fields]
    assert len(names) == len(set(names)), "a setting belongs to one group"
    assert set(names) == set(config.Settings.model_fields)
    monkeypatch.setenv("EPISTREAM_ROUTER_TOP_K", "7")
    monkeypatch.setenv("EPISTREAM_ROUTER_WEIGHTS", "1,1,2")
    retrieval = config.RetrievalSettings()
    assert (retrieval.router_top_k, retrieval.router_weights) == (7, (1.0, 1.0, 2.0))
    monkeypatch.setenv("EPISTREAM_ROUTER_WEIGHTS", "1,-1,2")
    with pytest.raises(ValueError, match="none negative"):
        config.RetrievalSettings()
