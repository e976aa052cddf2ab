"""The speakers a question names ("What did Caroline research?").

In LoCoMo 97% of the evidence turns of a question that names one speaker were said by that
speaker, and the name itself is noise to both pathways: every one of the speaker's turns holds it
(the lexical pathway) and it pulls the question's embedding towards the speaker rather than the
topic (the dense one). So the context read looks the question's words up among the tenant's
speakers, searches with the names taken out (``without_names``) and gives the named speakers'
turns a bonus (TurnRecipe.speaker_bonus). Measured on the pick split in bench.budget_recall.
"""

from __future__ import annotations

import re

from psycopg import AsyncConnection, sql

from .execute import rows
from .fragments import conversations, in_conversations

_WORD = re.compile(r"[^\W\d_][\w.\-]*", re.UNICODE)
_POSSESSIVE = re.compile(r"['’]s$")
#: Longest speaker name looked up, in words ("Mary Ann Smith").
MAX_NAME_WORDS = 3
#: Words looked up per question (a question is short; this bounds a hostile one).
MAX_CANDIDATES = 64

NAMED_SPEAKERS = sql.SQL("""
SELECT n.name
FROM unnest(%(names)s::text[]) AS n(name)
WHERE EXISTS (SELECT 1 FROM memory.turns t
              WHERE t.tenant = %(tenant)s AND t.speaker_key = n.name AND {conversations})  -- lower(speaker), sql/016
""").format(conversations=in_conversations("t"))


def _words(question: str) -> list[str]:
    return [_POSSESSIVE.sub("", w).strip(".-").lower() for w in _WORD.findall(question)]


def candidate_names(question: str) -> list[str]:
    """Every run of one to MAX_NAME_WORDS words of the question, case-folded, without a possessive 's."""
    words = [w for w in _words(question) if w]
    found: dict[str, None] = {}
    for size in range(1, MAX_NAME_WORDS + 1):
        for start in range(len(words) - size + 1):
            found[" ".join(words[start:start + size])] = None
    return list(found)[:MAX_CANDIDATES]


async def named_speakers(conn: AsyncConnection, *, tenant: str, question: str,
                         conversation_ids: list[str] | None) -> list[str]:
    """The tenant's speakers (case-folded) the question names, within its conversations. Run
    inside ``tenant_scope(conn, tenant)``."""
    names = candidate_names(question)
    if not names:
        return []
    found = await rows(conn, NAMED_SPEAKERS, {"tenant": tenant, "names": names,
                                              "conversations": conversations(conversation_ids)})
    return [r["name"] for r in found]


def without_names(question: str, names: list[str]) -> str:
    """The question with the named speakers (and their possessive 's) taken out; the question
    itself when nothing else would be left."""
    if not names:
        return question
    pattern = "|".join(re.escape(n).replace(r"\ ", r"\s+") for n in sorted(names, key=len, reverse=True))
    stripped = re.sub(rf"(?<!\w)(?:{pattern})(?:['’]s)?(?!\w)", " ", question, flags=re.IGNORECASE)
    stripped = " ".join(stripped.split())
    return stripped if _words(stripped) else question
