"""The hostile corpus through a real ingest worker (issue 11): produced on one partition, each case
interleaved with a good turn, every case ends stored verbatim or dead-lettered with its reason, every
good turn is stored, and the worker never restarts. Records over Kafka's limit are refused by the
producer, clearly."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os

import psycopg
import pytest
from aiokafka.errors import MessageSizeTooLargeError

from epistream.contracts.dead_letters import DeadLetter
from epistream.messaging.kafka_io import consumer_lag
from epistream.testing.hostile import PRODUCER_REJECTS, cases, expected_rows

from .conftest import read_topic, wait_for
from .helpers import make_turns, produce_bytes
from .scripted_worker import scripted_worker

pytestmark = pytest.mark.integration

METRICS_PORT = int(os.environ.get("EPISTREAM_SUPERVISOR_METRICS_PORT", "29103")) + 30  # beside the test stack's ports


def _script(body: dict) -> tuple[int, str]:
    # Enrichment is not under test here (whatever it makes of this reply, its letters are not ingest's).
    return 200, json.dumps({"summary": "A hostile conversation.", "gists": [], "facts": []})


@pytest.fixture(scope="module")
def worker(kafka):
    with scripted_worker(kafka, _script, metrics_port=METRICS_PORT, name="hostile") as running:
        yield running


def test_hostile_records_are_stored_verbatim_or_dead_lettered_and_the_partition_goes_on(worker, unique):
    settings = worker.settings
    tenant, conversation = unique("tenant"), unique("conv")
    corpus = cases(tenant, conversation)
    good = make_turns(tenant, conversation, [("Ana", f"good turn {i} after a hostile one") for i in range(len(corpus))])
    good = [g.model_copy(update={"turn_id": f"good-{i:03d}"}) for i, g in enumerate(good)]
    pid = worker.process.pid()
    records = []
    for case, turn in zip(corpus, good, strict=True):
        records += [(case.key, case.value), (conversation.encode(), turn.to_bytes())]
    produce_bytes(settings, records, topic=settings.topic_turns)

    def good_stored() -> bool:
        with psycopg.connect(worker.db_url) as conn:
            row = conn.execute("SELECT count(*) FROM memory.turns WHERE tenant = %s AND turn_id LIKE 'good-%%'",
                               (tenant,)).fetchone()
        return row is not None and row[0] == len(good)

    wait_for(good_stored, timeout=240, what="every good turn stored")

    # Stored verbatim: every column as the record said it.
    with psycopg.connect(worker.db_url) as conn:
        for key, row in expected_rows(corpus).items():
            got = conn.execute("SELECT speaker, text, ts, session_id, metadata FROM memory.turns"
                               " WHERE tenant = %s AND conversation_id = %s AND turn_id = %s", key).fetchone()
            assert got == (row.speaker, row.text, row.ts, row.session_id, row.metadata), key

    # Dead-lettered with the reason, found by the sha256 of the whole original (letters may be cut to fit).
    dead = {hashlib.sha256(c.value).hexdigest(): c for c in corpus if c.expect == "dead"}
    def ingest_letter(key: bytes | None, value: bytes | None) -> bool:
        return key == conversation.encode() and DeadLetter.model_validate_json(value or b"").stage == "ingest"

    found = asyncio.run(read_topic(settings, settings.topic_dlq, ingest_letter, want=len(dead) + 1, timeout=20))
    letters = {(letter := DeadLetter.model_validate_json(r.value)).value_sha256: letter for r in found}
    missing = [c.name for h, c in dead.items() if h not in letters]
    assert not missing, f"no letter for {missing}"
    for digest, case in dead.items():
        letter = letters[digest]
        assert case.reason is not None and case.reason in letter.error_message, (case.name, letter.error_message)
        assert letter.stage == "ingest" and letter.value_size == len(case.value)
        original = letter.original_value() or b""
        assert case.value.startswith(original) and (letter.value_truncated or original == case.value)
    assert len(found) == len(dead)  # each exactly once (the read waited for one more)

    # Acknowledged once stored or dead-lettered: the group's committed offsets reach the end of the log.
    wait_for(lambda: asyncio.run(consumer_lag(settings, settings.indexer_group, [settings.topic_turns]))
             == {settings.topic_turns: 0}, timeout=60, interval=1.0, what="every record acknowledged")

    # The worker never restarted: same process, no crashed agent in its log.
    assert worker.process.pid() == pid and pid is not None
    log = worker.process.log_file.read_text(errors="replace")
    assert "Crashed" not in log and "Traceback" not in log


@pytest.mark.parametrize("name, key, value", PRODUCER_REJECTS, ids=[r[0] for r in PRODUCER_REJECTS])
def test_records_over_the_kafka_limit_are_refused_by_the_producer(worker, name, key, value):
    with pytest.raises(MessageSizeTooLargeError, match="larger than the maximum request size"):
        produce_bytes(worker.settings, [(key, value)], topic=worker.settings.topic_turns)
