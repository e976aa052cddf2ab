"""Writes .env.example from the settings object, so the two never disagree.

    python -m epistream.infra.env_example > .env.example
"""

from __future__ import annotations

from epistream.settings import GROUPS


def render() -> str:
    lines = ["# epistream settings: every variable is optional; these are the defaults."]
    for group in GROUPS:
        lines += ["", f"# --- {group.__name__.removesuffix('Settings')} " + "-" * 40]
        lines += _variables(group)
    return "\n".join(lines) + "\n"


def _variables(group: type) -> list[str]:
    lines: list[str] = []
    for name, field in group.model_fields.items():
        default = field.default
        if default is None:
            default = ""
        elif hasattr(default, "get_secret_value"):
            default = default.get_secret_value()
        elif hasattr(default, "value"):
            default = default.value
        elif isinstance(default, tuple):
            default = ",".join(str(v) for v in default)  # as the environment writes it
        if field.description:
            lines.append(f"# {field.description}")
        lines.append(f"EPISTREAM_{name.upper()}={default}")
    return lines


if __name__ == "__main__":
    print(render(), end="")
