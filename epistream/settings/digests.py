"""A file's sha256, as the cards pin it (embedder_cards.py, ranker_cards.py): the files the settings name
are checked against it at start."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_of(path: Path) -> str:
    """The file's sha256, read a megabyte at a time (a model file is tens of megabytes)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
