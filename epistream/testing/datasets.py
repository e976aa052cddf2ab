"""Where the development data lives. The LoCoMo development split is not in the repository (its
licence and size); the project's machines keep it beside the checkout, at ../shared/data/locomo/, and
`LOCOMO_DEV` names another copy. The tests, the benchmarks and the Makefile all ask here."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

#: The variable that names the LoCoMo development split's file.
LOCOMO_DEV_VARIABLE = "LOCOMO_DEV"
#: Its default: the shared folder beside the checkout (the same on every machine of the project and in CI).
SHARED_LOCOMO_DEV = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "locomo" / "locomo-dev.json"


def locomo_dev(environ: Mapping[str, str] = os.environ) -> Path:
    """The LoCoMo development split: `LOCOMO_DEV` where set, else the shared copy."""
    return Path(environ[LOCOMO_DEV_VARIABLE]) if environ.get(LOCOMO_DEV_VARIABLE) else SHARED_LOCOMO_DEV
