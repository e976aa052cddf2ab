"""The context read's learned ranker as shipped: its card (the weights file inside the package, the sha256
that file must have, how it was trained) and how EPISTREAM_CONTEXT_RANKER resolves to a file.

Pure data and a file check: the model itself is consumers/ranking.py's ``LinearRanker``. A missing file or
one whose sha256 is not the card's stops the process at start, naming the setting, as an embedder's does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .digests import sha256_of

#: The package's data folder (epistream/data), where the shipped weights are.
DATA_DIR = Path(__file__).resolve().parent.parent / "data"


@dataclass(frozen=True)
class RankerCard:
    name: str
    file: str  # within epistream/data
    sha256: str
    trained_on: str
    command: str
    #: Evidence recall of the read with it, at 250 / 500 / 1,000 / 2,000 / 4,000 tokens (without it in brackets).
    metrics: str

    @property
    def path(self) -> Path:
        return DATA_DIR / self.file


BUILTIN = RankerCard(
    name="context-ranker-v1",
    file="context-ranker-v1.json",
    sha256="f6819fefb1f506a2201a524bc713b3313f23da225f7ee7dfc2dc8816e4d4d170",
    trained_on="LoCoMo dev, pick split only (conv-26, conv-30, conv-41): the evidence turns of categories 1-4 "
               "among the read's candidates at 1,000 and 4,000 tokens",
    command="python -m bench.train_ranker",
    metrics="pick 0.685 / 0.800 / 0.870 / 0.916 / 0.960 (0.618 / 0.720 / 0.821 / 0.891 / 0.940); "
            "report 0.681 / 0.786 / 0.856 / 0.911 / 0.954 (0.641 / 0.715 / 0.806 / 0.869 / 0.940); "
            "docs/benchmarks/budget-recall.md",
)

#: EPISTREAM_CONTEXT_RANKER's words besides a path.
NO_RANKER, BUILTIN_RANKER = "none", "builtin"


def ranker_file(value: str) -> Path | None:
    """The file a setting of ``value`` names (None for "none"), checked: it exists, and the builtin one has
    its card's sha256. Raises ValueError saying what is wrong."""
    if value == NO_RANKER:
        return None
    if value == BUILTIN_RANKER:
        path = BUILTIN.path
        if not path.is_file():
            raise ValueError(f"the shipped ranker {BUILTIN.name} is missing ({path}): reinstall epistream, or set none")
        if sha256_of(path) != BUILTIN.sha256:
            raise ValueError(f"{path} is corrupt (its sha256 is not {BUILTIN.name}'s card's): reinstall epistream, "
                             f"or set none")
        return path
    path = Path(value)
    if not path.is_file():
        raise ValueError(f"{value!r} is neither none, builtin nor a ranker file")
    return path
