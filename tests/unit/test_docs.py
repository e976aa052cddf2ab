"""The documentation stays true: the generated configuration equals its render, every link lands on
a file of the repository, and every guarantee names a test that exists."""

from __future__ import annotations

import os
import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

from epistream.infra.env_example import render, render_markdown
from epistream.settings.processes import Settings

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
GUARANTEES = ROOT / "docs" / "guarantees.md"

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.DOTALL)
_INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
_AUTOLINK = re.compile(r"<([a-zA-Z][a-zA-Z0-9+.-]*:[^>\s]*)>")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
_TEST_REF = re.compile(r"^((?:bench/)?tests/[\w/]+\.py)?(?:::(\w+))?$")


def test_env_example_is_rendered_from_the_settings():
    example = (ROOT / ".env.example").read_text()
    assert example == render(), "regenerate: python -m epistream.infra.env_example > .env.example"


def test_the_configuration_page_is_rendered_from_the_settings():
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == render_markdown(), (
        "regenerate: python -m epistream.infra.env_example --markdown > docs/configuration.md")


def test_every_setting_is_on_the_configuration_page():
    # A settings class left out of GROUPS would drop its variables from both generated files.
    page = render_markdown()
    missing = [f"EPISTREAM_{name.upper()}" for name in Settings.model_fields
               if f"`EPISTREAM_{name.upper()}`" not in page]
    assert not missing, f"not in epistream.settings.GROUPS' tables: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_link_lands_on_a_file_of_the_repository(page: Path):
    broken = []
    for target in _links(page.read_text()):
        if _SCHEME.match(target) or target.startswith("//"):
            broken.append(f"{target}: points outside the repository (tell it here, or cite it by title)")
            continue
        path, _, anchor = target.partition("#")
        if not path:
            linked = page
        else:
            relative = Path(os.path.normpath(page.parent.relative_to(ROOT) / path))
            if relative.parts[:1] == ("..",) or path.startswith("/"):
                broken.append(f"{target}: outside the repository")
                continue
            if not _in_repository(relative):
                broken.append(f"{target}: no such file in the repository")
                continue
            linked = ROOT / relative
        if anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}:\n  " + "\n  ".join(broken)


def test_every_guarantee_names_a_test_that_exists():
    sections = re.split(r"^## ", _prose(GUARANTEES.read_text()), flags=re.MULTILINE)[1:]
    assert sections, "docs/guarantees.md has no '## ' sections"
    problems = []
    for section in sections:
        title = section.splitlines()[0]
        references = _test_references(section)
        if not references:
            problems.append(f"{title!r}: names no test (`tests/...py` or `tests/...py::test_name`)")
        for path, function in references:
            source = ROOT / path
            if not source.is_file():
                problems.append(f"{title!r}: {path} does not exist")
            elif function and not re.search(rf"^\s*(?:async\s+)?def {function}\(", source.read_text(), re.MULTILINE):
                problems.append(f"{title!r}: {path} defines no {function}")
    assert not problems, "docs/guarantees.md:\n  " + "\n  ".join(problems)


def test_the_readme_is_read_in_ten_minutes():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250, "the rest belongs in docs/"


def _links(markdown: str) -> list[str]:
    text = _CODE_SPAN.sub("", _FENCE.sub("", markdown))
    return [*_INLINE_LINK.findall(text), *_REFERENCE.findall(text), *_AUTOLINK.findall(text)]


def _prose(markdown: str) -> str:
    """Without fenced blocks, whose lines may look like headings."""
    return _FENCE.sub("", markdown)


def _test_references(section: str) -> list[tuple[str, str | None]]:
    """The tests a section names, in order: `tests/x.py`, `tests/x.py::test_y`, and `::test_z` for
    another test of the last file named."""
    references: list[tuple[str, str | None]] = []
    last_path = None
    for span in re.findall(r"`([^`]+)`", section):
        match = _TEST_REF.match(span.strip())
        if not match or not (match.group(1) or match.group(2)):
            continue
        path = match.group(1) or last_path
        if path is None:
            references.append((f"(no file before {span})", None))
            continue
        last_path = path
        references.append((path, match.group(2)))
    return references


@cache
def _repository_files() -> frozenset[str] | None:
    """What a clone holds (committed, or new and not ignored); None outside a git checkout."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                                capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return frozenset(name for name in listed.decode().split("\0") if name)


def _in_repository(relative: Path) -> bool:
    files = _repository_files()
    if files is None:
        return (ROOT / relative).exists()
    name = relative.as_posix()
    return name in files or any(f.startswith(name.rstrip("/") + "/") for f in files)


@cache
def _anchors(page: Path) -> frozenset[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens,
    a repeated heading numbered."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in _HEADING.findall(_prose(page.read_text())):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return frozenset(anchors)


#: A repository path as the pages write it: a top-level folder of the project, then a path (in backticks
#: or plain text). Globs, placeholders and paths outside the checkout (../shared/...) are not paths to check.
_REPO_PATH = re.compile(
    r"(?<![\w./-])((?:epistream|pipeline|consumers|infra|sql|tests|bench|docs|\.ci)/[\w./-]*[\w/])(?:::\w+)?")
_NOT_A_PATH = re.compile(r"[*<>{}]|\.\.\.")


def _named_paths(page: Path) -> set[str]:
    text = page.read_text()
    named = set()
    for match in _REPO_PATH.finditer(text):
        path = match.group(1).rstrip(".")
        before, after = text[max(0, match.start() - 3):match.start()], text[match.end():match.end() + 1]
        if not _NOT_A_PATH.search(path) and not before.endswith(("../", "://")) and after not in ("*", "{", "<"):
            named.add(path)
    return named


def _exists(path: str) -> bool:
    if re.fullmatch(r"sql/\d{3}", path):  # a migration by its number
        return any((ROOT / "sql").glob(f"{path.removeprefix('sql/')}_*.sql"))
    return (ROOT / path).exists()


def _retired_at(page: Path) -> str | None:
    """The commit a page of finished experiments says its retired files are whole at."""
    found = re.search(r"every file below is whole at commit `([0-9a-f]{7,40})`", page.read_text())
    return found.group(1) if found else None


@cache
def _tree_at(commit: str) -> frozenset[str] | None:
    """Every file and folder of the repository at `commit` (one git call), or None where this clone lacks it."""
    listed = subprocess.run(["git", "ls-tree", "-r", "-t", "--name-only", commit], cwd=ROOT, capture_output=True,
                            text=True)
    return frozenset(listed.stdout.split()) if listed.returncode == 0 else None


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_path_a_page_names_exists(page):
    missing = sorted(path for path in _named_paths(page) if not _exists(path))
    retired_at = _retired_at(page)
    if retired_at and missing:
        tree = _tree_at(retired_at)
        if tree is None:
            pytest.skip(f"this clone lacks commit {retired_at}, where the page's retired files are")
        missing = [path for path in missing if path.rstrip("/") not in tree]
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


def _code_map() -> str:
    design = (ROOT / "docs" / "design.md").read_text()
    section = design[design.index("## Code map"):]
    return section[section.index("```"):section.index("```", section.index("```") + 3)]


def test_the_code_map_names_every_package_and_top_level_module():
    code_map = _code_map()
    roots = [ROOT / "epistream", ROOT / "pipeline", ROOT / "consumers", ROOT / "infra"]
    packages = {init.parent for root in roots for init in root.rglob("__init__.py")
                if not any(part.is_symlink() for part in [init.parent, *init.parent.parents] if part != ROOT)}
    unnamed = [str(package.relative_to(ROOT)) for package in sorted(packages)
               if package not in roots and not re.search(rf"(?<![\w-]){re.escape(package.name)}/", code_map)]
    modules = [path for root in roots for path in sorted(root.glob("*.py"))
               if not path.is_symlink() and path.name != "__init__.py"]
    unnamed += [str(path.relative_to(ROOT)) for path in modules
                if not re.search(rf"(?<![\w-]){re.escape(path.name)}(?![\w])", code_map)]
    assert not unnamed, f"docs/design.md's code map does not name: {unnamed}"
