"""Entity names: normalisation, first-person resolution, deterministic ids."""

from __future__ import annotations

import hashlib
import re

_ARTICLES = re.compile(r"^(the|a|an)\s+", re.IGNORECASE)
_POSSESSIVE = re.compile(r"['’]s$")
_NON_WORD = re.compile(r"[^\w\s-]+", re.UNICODE)
_SPACES = re.compile(r"\s+")
_PREDICATE_JUNK = re.compile(r"[^a-z0-9]+")
FIRST_PERSON = {"i", "me", "my", "myself", "mine"}


def normalize_name(name: str) -> str:
    """Case, punctuation, articles and possessives do not make a different entity."""
    text = _POSSESSIVE.sub("", name.strip().lower())
    text = _SPACES.sub(" ", _NON_WORD.sub(" ", text)).strip()
    return _ARTICLES.sub("", text)


def resolve_speaker(name: str, speaker: str) -> str:
    """A model that writes "I" means whoever said the line."""
    return speaker if normalize_name(name) in FIRST_PERSON else name.strip()


def entity_id(tenant: str, normalized: str) -> str:
    digest = hashlib.sha1(f"{tenant}\x1f{normalized}".encode()).hexdigest()[:16]
    return f"ent-{digest}"


def normalize_predicate(predicate: str) -> str:
    """`Lives In` and `lives-in` are the same predicate: `lives_in`."""
    return _PREDICATE_JUNK.sub("_", predicate.strip().lower()).strip("_")[:60]
