"""Tool results as JSON: plain values (ISO dates, rounded scores, capped strings),
a dict cut to a size (``fit``, for ``call_tool``), and a bounded observation
text (``bounded_json``, for a model's context).

``bounded_json`` never slices a JSON text: it leaves out whole list items, in a
given order, and says how many (``"omitted": {"results": 3}``); only when every
such list is empty and the rest is still too long does it shorten long strings
(marked ``…[truncated]``), and at the very last it answers the smallest object
that fits. Whatever it returns parses as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, is_dataclass
from datetime import date, datetime
from typing import Any

from .limits import MAX_RAW_TEXT_CHARS, MAX_RESULT_CHARS, MAX_TEXT_CHARS

TRUNCATED = " …[truncated]"


def plain(value: Any, key: str = "") -> Any:
    """``value`` as JSON-ready data: dataclasses as dicts, dates as ISO text, floats to 4 places,
    strings capped (a segment's ``raw_text`` at MAX_RAW_TEXT_CHARS, any other at MAX_TEXT_CHARS)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name), f.name) for f in fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v, key) for v in value]
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, str):
        cap = MAX_RAW_TEXT_CHARS if key == "raw_text" else MAX_TEXT_CHARS
        return value if len(value) <= cap else value[:cap] + TRUNCATED
    return value


def shallow(value: Any) -> dict[str, Any]:
    """A dataclass's fields as a dict, values untouched."""
    return {f.name: getattr(value, f.name) for f in fields(value)}


def _lists(value: Any) -> list[list[Any]]:
    found: list[list[Any]] = []
    if isinstance(value, dict):
        for item in value.values():
            found.extend(_lists(item))
    elif isinstance(value, list):
        if value and isinstance(value[0], dict):
            found.append(value)
        for item in value:
            found.extend(_lists(item))
    return found


def fit(payload: dict[str, Any], max_chars: int = MAX_RESULT_CHARS) -> dict[str, Any]:
    """Drop trailing items of the biggest result lists until the JSON fits ``max_chars``."""
    while len(json.dumps(payload, ensure_ascii=False)) > max_chars:
        candidates = [lst for lst in _lists(payload) if lst]
        if not candidates:
            break
        biggest = max(candidates, key=lambda lst: len(json.dumps(lst, ensure_ascii=False)))
        biggest.pop()
        payload["truncated"] = True
    return payload


# --------------------------------------------------------------------------- bounded observations
@dataclass(frozen=True)
class Cut:
    """A list in a payload whose items may be left out: ``path`` from the top, e.g. ("segment", "turns")."""

    path: tuple[str, ...]
    keep_last: bool = False  # leave out from the front (a list oldest first whose last items matter most)

    @property
    def name(self) -> str:
        return ".".join(self.path)

    def get(self, payload: dict[str, Any]) -> Any:
        value: Any = payload
        for key in self.path:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    def replaced(self, payload: dict[str, Any], items: list[Any]) -> dict[str, Any]:
        """A copy of ``payload`` with the list at ``path`` replaced (copies along the path only)."""
        def down(node: dict[str, Any], depth: int) -> dict[str, Any]:
            key = self.path[depth]
            child = items if depth == len(self.path) - 1 else down(node[key], depth + 1)
            return {**node, key: child}
        return down(payload, 0)


def _render(payload: dict[str, Any], omitted: dict[str, int]) -> str:
    return json.dumps({**payload, "omitted": omitted} if omitted else payload)


def _capped(value: Any, cap: int) -> Any:
    """Strings longer than ``cap`` plus the marker, cut to ``cap`` and marked (never made longer)."""
    if isinstance(value, dict):
        return {k: _capped(v, cap) for k, v in value.items()}
    if isinstance(value, list):
        return [_capped(v, cap) for v in value]
    if isinstance(value, str) and len(value) > cap + len(TRUNCATED):
        return value[:cap] + TRUNCATED
    return value


def _longest_string(value: Any) -> int:
    if isinstance(value, dict):
        return max((_longest_string(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return max((_longest_string(v) for v in value), default=0)
    return len(value) if isinstance(value, str) else 0


def _largest(fits: Callable[[int], bool], low: int, high: int) -> int | None:
    """The largest n in [low, high] with fits(n) (fits is monotone: true up to some n), or None."""
    if not fits(low):
        return None
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _keep(base: dict[str, Any], omitted: dict[str, int], cut: Cut, items: list[Any],
          kept: int) -> tuple[dict[str, Any], dict[str, int]]:
    """``base`` with ``kept`` items of the cut list, and what is then left out."""
    total = len(items)
    chosen = items[total - kept:] if cut.keep_last else items[:kept]
    return cut.replaced(base, chosen), ({**omitted, cut.name: total - kept} if kept < total else omitted)


def _cut(base: dict[str, Any], omitted: dict[str, int], cut: Cut,
         max_chars: int) -> tuple[dict[str, Any], dict[str, int], bool]:
    """The most items of the cut list that fit (all of them left out when none does), and whether it fits."""
    items = cut.get(base)
    if not isinstance(items, list) or not items:
        return base, omitted, False

    def fits(kept: int) -> bool:
        return len(_render(*_keep(base, omitted, cut, items, kept))) <= max_chars

    kept = _largest(fits, 0, len(items) - 1)  # all of them is what does not fit
    return (*_keep(base, omitted, cut, items, kept or 0), kept is not None)


def bounded_json(payload: dict[str, Any], cuts: Sequence[Cut], max_chars: int) -> str:
    """``payload`` as JSON text of at most ``max_chars`` characters (at least 2: ``{}``).

    Leaves out whole items of the ``cuts`` lists, the first cut emptied before the next
    is touched, trailing items first (leading ones for ``keep_last``), and reports them
    under ``"omitted"`` by list name.
    """
    if max_chars < 2:
        raise ValueError(f"no JSON object fits in {max_chars} characters")
    text = _render(payload, {})
    if len(text) <= max_chars:
        return text
    current: dict[str, Any] = payload
    omitted: dict[str, int] = {}
    for cut in cuts:
        current, omitted, fits = _cut(current, omitted, cut, max_chars)
        if fits:
            return _render(current, omitted)
    # Every list is empty and the rest is still too long: shorten the longest strings.
    longest = _longest_string(current)
    cap = _largest(lambda n: len(_render(_capped(current, n), omitted)) <= max_chars, 0, longest)
    if cap is not None:
        return _render(_capped(current, cap), omitted)
    smallest: list[dict[str, Any]] = [{"omitted": omitted}] if omitted else []
    if "tool" in payload:
        smallest.insert(0, {"tool": payload["tool"], "omitted": omitted} if omitted else {"tool": payload["tool"]})
    for candidate in smallest:
        if len(text := json.dumps(candidate)) <= max_chars:
            return text
    return "{}"
