"""Writes .env.example and docs/configuration.md from the settings classes, so neither can disagree
with them (tests/unit/test_docs.py checks both).

    python -m epistream.infra.env_example > .env.example
    python -m epistream.infra.env_example --markdown > docs/configuration.md
"""

from __future__ import annotations

import argparse
import inspect
import re
import types
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt, MinLen
from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from epistream.settings.base import ENV_PREFIX
from epistream.settings.processes import GROUPS

MARKDOWN_INTRO = """\
# Configuration

Every setting is an environment variable, and every one is optional: the defaults run the embedded
stack on one machine. A bad value stops the process at start-up, naming the variable (exit status 2).
Secrets are never shown in logs or in the settings' repr.

The settings live in `epistream/settings/`, one class per group below; `Settings` is their union,
built once per process by `load_settings()` and passed down (nothing else reads the environment).
This page and `.env.example` are generated from those classes; `tests/unit/test_docs.py` checks that
both are current. To change a setting, change its class, then regenerate:

```bash
python -m epistream.infra.env_example > .env.example
python -m epistream.infra.env_example --markdown > docs/configuration.md
```
"""


def render() -> str:
    """.env.example: every variable with its default, group by group."""
    lines = ["# epistream settings: every variable is optional; these are the defaults."]
    for group in GROUPS:
        lines += ["", f"# --- {_group_name(group)} " + "-" * 40]
        for name, field in group.model_fields.items():
            if field.description:
                lines.append(f"# {field.description}")
            lines.append(f"{_variable(name)}={_environment_value(field.default)}")
    return "\n".join(lines) + "\n"


def render_markdown() -> str:
    """docs/configuration.md: one table per settings class, with each variable's type, default and meaning."""
    lines = [MARKDOWN_INTRO]
    for group in GROUPS:
        lines += [f"## {_group_name(group)}", ""]
        lines.append(f"`{group.__name__}`" + (f": {summary}" if (summary := _summary(group)) else ""))
        lines += ["", "| variable | type | default | meaning |", "|---|---|---|---|"]
        for name, field in group.model_fields.items():
            cells = (f"`{_variable(name)}`", _type_text(field), _markdown_default(field.default),
                     field.description or "")
            lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _group_name(group: type[BaseSettings]) -> str:
    return group.__name__.removesuffix("Settings")


def _variable(name: str) -> str:
    return f"{ENV_PREFIX}{name.upper()}"


def _summary(group: type[BaseSettings]) -> str:
    """The class docstring's first paragraph, reST literals as markdown ones."""
    doc = inspect.getdoc(group) or ""
    if doc == inspect.getdoc(BaseSettings):  # no docstring of its own: getdoc inherits the base class's
        return ""
    return " ".join(doc.split("\n\n")[0].split()).replace("``", "`")


def _environment_value(default: Any) -> str:
    """A default as the environment writes it."""
    if default is None:
        return ""
    if isinstance(default, SecretStr):
        return default.get_secret_value()
    if isinstance(default, Enum):
        return str(default.value)
    if isinstance(default, tuple):
        return ",".join(str(v) for v in default)
    return str(default)


def _markdown_default(default: Any) -> str:
    if default is None:
        return "unset"
    if default == ():
        return "empty"
    return f"`{_environment_value(default)}`"


def _type_text(field: FieldInfo) -> str:
    text = _annotation_text(field.annotation)
    limits = []
    for item in field.metadata:
        if isinstance(item, Ge):
            limits.append(f"≥ {item.ge}")
        elif isinstance(item, Gt):
            limits.append(f"> {item.gt}")
        elif isinstance(item, Le):
            limits.append(f"≤ {item.le}")
        elif isinstance(item, Lt):
            limits.append(f"< {item.lt}")
        elif isinstance(item, MinLen):
            limits.append(f"at least {item.min_length} characters")
        elif pattern := getattr(item, "pattern", None):
            limits.append(f"matching `{pattern}`")
    if len(limits) == 2 and limits[0].startswith("≥ ") and limits[1].startswith("≤ "):
        limits = [f"{limits[0][2:]} to {limits[1][2:]}"]
    return ", ".join([text, *limits])


def _annotation_text(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (Union, types.UnionType):  # `X | None`: "unset" is its default, not its type
        return " or ".join(_annotation_text(arg) for arg in args if arg is not type(None))
    if origin is Literal:
        return "one of " + ", ".join(f"`{arg}`" for arg in args)
    if inspect.isclass(annotation) and issubclass(annotation, Enum):
        return "one of " + ", ".join(f"`{member.value}`" for member in annotation)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"comma-separated {_annotation_text(args[0])}s"
        return f"{len(args)} comma-separated {_annotation_text(args[0])}s"
    names = {bool: "boolean", int: "integer", float: "number", str: "string", Path: "path", SecretStr: "secret"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _cell(text: str) -> str:
    """A table cell: a pipe would end it, even inside a code span."""
    return re.sub(r"(?<!\\)\|", r"\\|", text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--markdown", action="store_true", help="print docs/configuration.md instead of .env.example")
    args = parser.parse_args(argv)
    print(render_markdown() if args.markdown else render(), end="")


if __name__ == "__main__":
    main()
