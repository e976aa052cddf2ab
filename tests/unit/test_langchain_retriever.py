"""The LangChain retriever's pure parts (epistream/integrations/langchain.py): a context read's item as a
Document (its text, its ids, conversation, times and score as metadata), a failed read raised, an
incomplete one marked; and the base install without LangChain: epistream imports, the integration says
which extra it needs. Its reads on the real stack: tests/integration/test_frameworks.py."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, date, datetime

import pytest
from pydantic import ValidationError

from epistream.contracts.replies import MemoryContext, MemoryItem
from epistream.errors import ServiceError
from epistream.integrations.langchain import EpistreamRetriever, _documents, item_document
from epistream.settings.processes import ClientSettings

SAID = datetime(2024, 5, 2, 10, 0, tzinfo=UTC)


def _item(kind: str, **fields) -> MemoryItem:
    return MemoryItem.model_validate({
        "kind": kind, "rank": 1, "conversation_id": "chat-42", "turn_ids": ["t1"], "text": "Ana lives in Lisbon.",
        "time": SAID, "scores": {"rrf": 0.03, "dense": 0.8}, "line": "[1] 10:00 Ana: Ana lives in Lisbon.",
        "tokens": 12} | fields)


def test_a_turn_is_its_own_words_with_its_ids_conversation_time_and_score():
    document = item_document(_item("turn", turn_id="t1", segment_id="s1", speaker="Ana"))
    assert document.page_content == "Ana lives in Lisbon." and document.id == "t1"
    assert document.metadata == {
        "kind": "turn", "rank": 1, "conversation_id": "chat-42", "segment_id": "s1", "turn_id": "t1",
        "turn_ids": ["t1"], "speaker": "Ana", "time": "2024-05-02T10:00:00Z", "scores": {"rrf": 0.03, "dense": 0.8},
        "score": 0.03}


def test_a_gist_and_a_fact_carry_their_own_ids_and_dates():
    gist = item_document(_item("gist", gist_id="g1", text="Ana moved to Lisbon.", event_date=date(2024, 4, 28),
                               date_precision="week"))
    assert gist.id == "g1" and gist.page_content == "Ana moved to Lisbon."
    assert gist.metadata["event_date"] == "2024-04-28" and gist.metadata["date_precision"] == "week"
    fact = item_document(_item("fact", fact_id="f1", text="Ana lives_in Lisbon", start_time=date(2024, 4, 28),
                               current=True, scores={"rrf": 0.02, "entity_rank": 1.0}))
    assert fact.id == "f1" and fact.metadata["current"] is True and fact.metadata["start_time"] == "2024-04-28"
    assert fact.metadata["score"] == 0.02 and "line" not in fact.metadata and "tokens" not in fact.metadata


def _reply(**fields) -> MemoryContext:
    return MemoryContext.model_validate({
        "question_id": "c-1", "tenant": "acme", "asked_at": SAID, "items": [_item("turn", turn_id="t1")],
        "text": "", "budget_tokens": 100, "used_tokens": 12, "latency_ms": 3.0} | fields)


def test_a_failed_read_raises_and_an_incomplete_one_marks_every_document():
    with pytest.raises(ServiceError, match="could not read memory: OperationalError"):
        _documents(_reply(error="OperationalError: the database is down"))
    marked = _documents(_reply(incomplete="partition 0 not stored through offset 7 within 10 s"))
    assert [d.metadata["incomplete"] for d in marked] == ["partition 0 not stored through offset 7 within 10 s"]
    assert "incomplete" not in _documents(_reply())[0].metadata


def test_the_budget_is_checked_where_the_retriever_is_made():
    with pytest.raises(ValidationError, match="budget_tokens"):
        EpistreamRetriever(settings=ClientSettings(), tenant="acme", budget_tokens=10)
    key = b"the-tenant-key"
    assert key.decode() not in repr(EpistreamRetriever(settings=ClientSettings(), tenant="acme", tenant_key=key))


def test_without_langchain_epistream_imports_and_the_integration_names_its_extra():
    # A process where LangChain is absent (None in sys.modules: every import of it fails), as in the base install.
    script = ("import sys; sys.modules['langchain_core'] = None\n"
              "import epistream\n"
              "try:\n    import epistream.integrations.langchain\n"
              "except ImportError as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert "pip install 'epistream[langchain]'" in done.stdout, done.stdout + done.stderr
