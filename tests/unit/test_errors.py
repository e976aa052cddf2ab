"""The exception tree drawn in epistream/errors.py is the tree of the classes: every exception the
product defines is an EpistreamError, sits where the drawing puts it, and keeps the built-in base a
caller may catch it by."""

from __future__ import annotations

import importlib
import pkgutil
import re
from functools import cache

import pytest

import epistream
from epistream import errors
from epistream.errors import EpistreamError

#: What the product ships: every module of the package (the tests' support is not shipped).
SKIP = ("epistream.testing", "epistream.sql")
#: The built-in each of these is also, for callers that catch it by that.
BUILTIN_BASES = {"SettingsError": ValueError, "ArgumentError": ValueError, "CursorError": ValueError,
                 "EventCursorError": ValueError, "ToolArgumentError": ValueError, "ReplyTimeout": TimeoutError,
                 "WaitTimeout": TimeoutError}


def _product_modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(epistream.__path__, "epistream."):
        if not info.name.startswith(SKIP) and not info.name.endswith("__main__"):
            names.append(info.name)
    return names


@cache  # every product module imported once for all the tests here
def _product_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in _product_modules():
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, BaseException)
                    and value.__module__.startswith("epistream.") and not value.__module__.startswith(SKIP)):
                found[value.__name__] = value
    return found


def _drawn_tree() -> dict[str, str | None]:
    """Each class of the drawing and its parent (None for the root), read from the box-drawing lines."""
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    doc = (errors.__doc__ or "").splitlines()
    drawing = doc[next(i for i, line in enumerate(doc) if line.strip() == "EpistreamError"):]
    for line in drawing:
        match = re.match(r"^[\s│]*(?:[├└]── )?([A-Z]\w+)(?:\s|$)", line)
        if not match:
            continue
        depth = match.start(1) // 4  # each level of the drawing is four columns
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[match.group(1)] = stack[-1][1] if stack else None
        stack.append((depth, match.group(1)))
    return parents


def test_every_exception_of_the_product_is_an_epistream_error():
    strays = {name: cls.__module__ for name, cls in _product_exceptions().items() if not issubclass(cls, EpistreamError)}
    assert not strays, f"not under EpistreamError: {strays}"


def test_the_drawing_in_errors_py_is_the_tree_of_the_classes():
    drawn = _drawn_tree()
    classes = _product_exceptions()
    assert drawn.get("EpistreamError", "missing") is None
    assert set(drawn) == set(classes), (f"drawn but not defined: {sorted(set(drawn) - set(classes))}; "
                                        f"defined but not drawn: {sorted(set(classes) - set(drawn))}")
    for name, parent in drawn.items():
        if parent is not None:
            epistream_bases = [base.__name__ for base in classes[name].__bases__ if issubclass(base, EpistreamError)]
            assert epistream_bases == [parent], f"{name} is drawn under {parent}, defined under {epistream_bases}"


@pytest.mark.parametrize(("name", "builtin"), sorted(BUILTIN_BASES.items()))
def test_errors_a_caller_expects_as_builtins_are_those_too(name, builtin):
    assert issubclass(_product_exceptions()[name], builtin)
