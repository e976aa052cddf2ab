"""The shape of the code stays readable: no product module grows past a size one can hold in
mind (the layering itself is pyproject.toml's import contracts, run by `make test`)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("epistream", "pipeline", "consumers", "infra")
MAX_LINES = 450


def test_no_product_module_is_over_the_limit():
    too_long = {
        str(path.relative_to(ROOT)): lines
        for package in PRODUCT
        for path in (ROOT / package).rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not too_long, f"split these (over {MAX_LINES} lines): {too_long}"
