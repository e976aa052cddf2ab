"""The embeddings of a workload's turns, computed once and kept on disk in produce order.

A million turns take about three hours to embed on two cores (about 94 turns/s), longer than one
sitting: vectors are written in chunks of `CHUNK` turns, each atomically (temp file + rename), so an
interrupted run resumes at the first missing chunk. A manifest pins what they were computed from
(workload spec, embedding model file, embedded text version); a mismatch is refused, never mixed.

    python -m bench.scale.vectors --size 1m     # nice it: it takes every core it is given
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np

from epistream.contracts.turns import Turn
from epistream.models.embeddings import DIMENSIONS, TURN_EMBEDDING_VERSION, Embedder, turn_embedding_text
from epistream.models.model_files import embedder_files
from epistream.settings.processes import load_settings

from ..workload_scale import PRESETS, WorkloadSpec, turns

CHUNK = 10_000
#: Outside the work tree: a checkout laid anew on the same machine still finds hours of vectors.
DEFAULT_DIR = Path(os.environ.get("EPISTREAM_SCALE_VECTORS", Path.home() / ".cache" / "epistream" / "scale-vectors"))


#: The generator's output is pinned by the first turns' embedded texts, not by its code.
FINGERPRINT_TURNS = 2_000


def embedded_texts(chunk: list[Turn]) -> list[str]:
    return [turn_embedding_text(t.speaker, t.text, t.ts) for t in chunk]


def manifest(spec: WorkloadSpec, chunk: int) -> dict:
    model = embedder_files(load_settings()).model
    first = embedded_texts(list(itertools.islice(turns(spec), FINGERPRINT_TURNS)))
    return {"spec": asdict(spec), "texts_sha256": hashlib.sha256("\n".join(first).encode()).hexdigest(),
            "model": model.name, "model_bytes": model.stat().st_size, "embedded_as": TURN_EMBEDDING_VERSION,
            "chunk": chunk, "dimensions": DIMENSIONS}


class VectorStore:
    """Chunk files ``chunk-00000.npy`` ... under `root`, one per `chunk` turns of the stream."""

    def __init__(self, root: Path, spec: WorkloadSpec, *, chunk: int = CHUNK) -> None:
        self.root, self.spec, self.chunk = root, spec, chunk
        root.mkdir(parents=True, exist_ok=True)
        expected = manifest(spec, chunk)
        path = root / "manifest.json"
        if path.exists():
            found = json.loads(path.read_text())
            if found != expected:
                raise SystemExit(f"{root} holds vectors of another workload or model: {found} != {expected}; "
                                 "remove it or pick another --vectors directory")
        else:
            path.write_text(json.dumps(expected, indent=1))

    def chunks(self) -> int:
        return -(-self.spec.turns // self.chunk)

    def _path(self, index: int) -> Path:
        return self.root / f"chunk-{index:05d}.npy"

    def have(self, index: int) -> bool:
        return self._path(index).exists()

    def ready(self, turns_needed: int) -> bool:
        return all(self.have(i) for i in range(-(-turns_needed // self.chunk)))

    def load(self, index: int) -> np.ndarray:
        return np.load(self._path(index))

    def save(self, index: int, vectors: np.ndarray) -> None:
        tmp = self._path(index).with_suffix(".tmp.npy")
        np.save(tmp, vectors.astype(np.float32, copy=False))
        os.replace(tmp, self._path(index))

    def chunked(self) -> Iterator[tuple[list[Turn], np.ndarray]]:
        """The stream's turns with their vectors, a chunk at a time, while chunks exist."""
        stream = turns(self.spec)
        for index in range(self.chunks()):
            if not self.have(index):
                return
            chunk = list(itertools.islice(stream, self.chunk))
            vectors = self.load(index)
            if len(vectors) != len(chunk):
                raise SystemExit(f"chunk {index} holds {len(vectors)} vectors for {len(chunk)} turns")
            yield chunk, vectors


def embed_missing(store: VectorStore, embedder: Embedder, upto: int) -> None:
    stream = turns(store.spec)
    for index in range(-(-upto // store.chunk)):
        chunk = list(itertools.islice(stream, store.chunk))
        if store.have(index):
            continue
        started = time.perf_counter()
        store.save(index, embedder.embed(embedded_texts(chunk)))
        elapsed = time.perf_counter() - started
        print(f"chunk {index + 1}/{store.chunks()}: {len(chunk)} turns in {elapsed:.0f} s "
              f"({len(chunk) / elapsed:.0f}/s)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(PRESETS), default="1m", help="the workload whose turns to embed")
    parser.add_argument("--upto", type=int, default=0, help="embed only the first N turns (default: all)")
    parser.add_argument("--vectors", type=Path, default=DEFAULT_DIR)
    args = parser.parse_args()
    spec = PRESETS[args.size]
    settings = load_settings()
    store = VectorStore(args.vectors / settings.embedding_model / args.size, spec)
    embedder = Embedder.from_settings(settings.with_overrides(embedding_batch=64))
    embed_missing(store, embedder, args.upto or spec.turns)


if __name__ == "__main__":
    main()
