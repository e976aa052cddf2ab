"""The public API is pinned: `epistream.__all__` names exactly what docs/contracts.md documents, each
name is importable from `epistream`, and the project's own code imports from the modules, never
through the package faces (so a face can shrink without breaking the project)."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
from pathlib import Path

import epistream

ROOT = Path(__file__).resolve().parents[2]
#: Package faces kept for callers; the project itself imports from the modules behind them.
FACES = {"epistream", "epistream.settings", "epistream.contracts", "epistream.client"}
PRODUCT = ("epistream", "pipeline", "consumers", "infra")


def _documented() -> set[str]:
    """The names docs/contracts.md's Python API section documents: each backticked identifier (a call
    written with its arguments counts by its name) that `epistream` has."""
    page = (ROOT / "docs" / "contracts.md").read_text()
    section = page[page.index("## The Python API"):]
    names = {match.group(1) for match in re.finditer(r"`([A-Za-z_]\w*)(?:\(|`)", section)}
    return {name for name in names if hasattr(epistream, name) and not inspect.ismodule(getattr(epistream, name))}


def test_the_public_api_is_what_the_contracts_page_documents():
    """The pin: a name enters or leaves `epistream.__all__` only with its line in docs/contracts.md."""
    exported = set(epistream.__all__) - {"__version__"}
    assert len(epistream.__all__) == len(set(epistream.__all__)), "a name listed twice"
    assert exported == _documented(), (f"exported, not documented: {sorted(exported - _documented())}; "
                                       f"documented, not exported: {sorted(_documented() - exported)}")
    for name in epistream.__all__:
        assert getattr(epistream, name) is not None


def _imports_through_a_face(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in FACES
                and not all(importlib.util.find_spec(f"{node.module}.{alias.name}") for alias in node.names)):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} from {node.module} import ...")
    return found


def test_the_product_imports_from_modules_not_through_the_faces():
    faces = {"__init__.py"}
    # `from epistream.client import api` names a module, not a face's re-export: that is allowed.
    through = [hit for package in PRODUCT for path in sorted((ROOT / package).rglob("*.py"))
               if not path.is_symlink() and "testing" not in path.parts and path.name not in faces
               and not any(p.is_symlink() for p in path.relative_to(ROOT).parents if p != Path("."))
               for hit in _imports_through_a_face(path)]
    assert not through, "import from the module instead:\n" + "\n".join(through)
