"""The development data is found in one place: the file LOCOMO_DEV names, else the shared copy."""

from __future__ import annotations

from pathlib import Path

from epistream.testing.datasets import SHARED_LOCOMO_DEV, locomo_dev

ROOT = Path(__file__).resolve().parents[2]


def test_locomo_dev_names_another_copy():
    assert locomo_dev({"LOCOMO_DEV": "/data/locomo.json"}) == Path("/data/locomo.json")


def test_the_default_is_the_shared_copy_beside_the_checkout():
    assert locomo_dev({}) == locomo_dev({"LOCOMO_DEV": ""}) == SHARED_LOCOMO_DEV
    assert SHARED_LOCOMO_DEV == ROOT.parent / "shared" / "data" / "locomo" / "locomo-dev.json"
