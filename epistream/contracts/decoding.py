"""Bytes to contracts: one decode for every topic, whose errors name what failed (ContractError)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar, get_args, overload

from pydantic import (
    ValidationError,
)

from epistream.errors import ContractError

from .base import Contract

C = TypeVar("C", bound=Contract)
D = TypeVar("D", bound=Contract)


@overload
def decode(raw: bytes | None, model: type[C], *, what: str) -> C: ...


@overload
def decode(raw: bytes | None, model: tuple[type[C], type[D]], *, what: str) -> C | D: ...


@overload
def decode(raw: bytes | None, model: Sequence[type[Contract]], *, what: str) -> Contract: ...


def decode(raw: bytes | None, model: type[Contract] | Sequence[type[Contract]], *, what: str) -> Contract:
    """A topic value as its contract, or a ContractError that says why not: where the JSON
    breaks, or which fields fail and how. ``what`` names the event in the reason
    ("memory.turns event"). Given several contracts, the value's ``kind`` picks the one whose
    ``kind`` literal names it; any other value is read as the one without a ``kind`` field."""
    try:
        if raw is None:
            raise ValueError("empty message value")
        # UTF-8 only (json.loads would guess UTF-16 or -32 from the bytes); a UTF-8 BOM is tolerated.
        data = json.loads(raw.decode("utf-8").removeprefix("\ufeff"))
        chosen = model if isinstance(model, type) else _by_kind(model, data)
        return chosen.model_validate(data)
    except (ValidationError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ContractError(f"not a valid {what}: {_reason(exc)}") from exc
    except RecursionError as exc:  # the parser's own limit, long before any contract looks at the value
        raise ContractError(f"not a valid {what}: JSON nested too deeply to read") from exc


def validated(model: type[C], *, what: str, **fields: Any) -> C:
    """A contract built from fields, or a ContractError that says which fail and how (as decode does)."""
    try:
        return model(**fields)
    except ValidationError as exc:
        raise ContractError(f"not a valid {what}: {_reason(exc)}") from exc


def _kinds(model: type[Contract]) -> tuple[Any, ...]:
    field = model.model_fields.get("kind")
    return () if field is None else get_args(field.annotation)


def _by_kind(models: Sequence[type[C]], data: Any) -> type[C]:
    kind = data.get("kind") if isinstance(data, dict) else None
    tagged = [m for m in models if kind is not None and kind in _kinds(m)]
    return tagged[0] if tagged else next(m for m in models if not _kinds(m))


def _reason(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors()[:5])
    if isinstance(exc, json.JSONDecodeError):
        return f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    return str(exc)[:500]
