"""Every setting is documented in the README and in .env.example."""

from __future__ import annotations

from pathlib import Path

from epistream.infra.env_example import render
from epistream.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_every_setting_is_documented():
    readme = (ROOT / "README.md").read_text()
    example = (ROOT / ".env.example").read_text()
    assert example == render(), "regenerate: python -m epistream.infra.env_example > .env.example"
    for name in Settings.model_fields:
        variable = f"EPISTREAM_{name.upper()}"
        assert f"`{variable}`" in readme, f"{variable} missing from README's configuration table"
        assert f"{variable}=" in example, f"{variable} missing from .env.example"
