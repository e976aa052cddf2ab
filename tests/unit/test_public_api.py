"""The public API is pinned: `epistream.__all__` names exactly what docs/contracts.md documents, each
name is importable from `epistream`, and the project's own code imports from the modules, never
through the package faces (so a face can shrink without breaking the project)."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import epistream

ROOT = Path(__file__).resolve().parents[2]
PINNED = {
    "ask", "context", "produce_turns", "produce_raw", "forget", "events", "events_after", "events_topic",
    "claim_headers", "After", "EventBatch",
    "Turn", "Question", "Mode", "TimeRange", "Position", "Answer", "Evidence", "MemoryContext", "MemoryItem",
    "ResolvedPeriod", "MemoryEvent", "ForgetRecord", "CONTEXT_BUDGET_DEFAULT", "CONTEXT_BUDGET_MIN",
    "CONTEXT_BUDGET_MAX",
    "ClientSettings", "load_settings",
    "EpistreamError", "RetryableError", "PermanentError", "ContractError", "SettingsError", "ServiceError",
    "ReplyTimeout", "EventCursorError",
    "__version__",
}
#: Package faces kept for callers; the project itself imports from the modules behind them.
FACES = {"epistream", "epistream.settings", "epistream.contracts", "epistream.client"}
PRODUCT = ("epistream", "pipeline", "consumers", "infra")


def test_the_public_api_is_pinned():
    assert set(epistream.__all__) == PINNED
    assert len(epistream.__all__) == len(PINNED), "a name listed twice"
    for name in epistream.__all__:
        assert getattr(epistream, name) is not None


def test_every_public_name_is_documented():
    page = (ROOT / "docs" / "contracts.md").read_text()
    section = page[page.index("## The Python API"):]
    missing = [name for name in PINNED - {"__version__"} if not re.search(rf"`{re.escape(name)}\b", section)]
    assert not missing, f"document in docs/contracts.md#the-python-api: {missing}"


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
