"""What one enrichment run left in PostgreSQL: per-conversation counts, per-segment and per-turn timings,
failures, and whether other tenants used the same worker meanwhile."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import psycopg
from psycopg.rows import dict_row

PER_CONVERSATION = """
SELECT t.conversation_id,
       (SELECT count(*) FROM memory.turns x WHERE x.tenant = t.tenant AND x.conversation_id = t.conversation_id) AS turns,
       count(s.*) AS segments,
       count(s.*) FILTER (WHERE s.status = 'enriched') AS enriched,
       count(s.*) FILTER (WHERE s.status = 'failed') AS failed,
       count(s.*) FILTER (WHERE s.status = 'pending') AS pending,
       coalesce(sum(s.attempts), 0) AS attempts,
       (SELECT count(*) FROM memory.gists g WHERE g.tenant = t.tenant AND g.conversation_id = t.conversation_id) AS gists,
       (SELECT count(*) FROM memory.facts f WHERE f.tenant = t.tenant AND f.conversation_id = t.conversation_id) AS facts
FROM (SELECT DISTINCT tenant, conversation_id FROM memory.turns WHERE tenant = %(t)s) t
LEFT JOIN memory.segments s ON s.tenant = t.tenant AND s.conversation_id = t.conversation_id
GROUP BY t.tenant, t.conversation_id ORDER BY t.conversation_id
"""
SEGMENTS = """
SELECT segment_id, conversation_id, close_reason, token_estimate, cardinality(turn_ids) AS turns, status, attempts,
       error, produced_at, closed_at, published_at, enriched_at,
       (SELECT count(*) FROM memory.gists g WHERE g.tenant = s.tenant AND g.segment_id = s.segment_id) AS gists,
       (SELECT count(*) FROM memory.facts f WHERE f.tenant = s.tenant AND f.segment_id = s.segment_id) AS facts
FROM memory.segments s WHERE tenant = %(t)s ORDER BY closed_at
"""
TURN_LATENCIES = """
SELECT extract(epoch FROM stored_at - produced_at)::float8 FROM memory.turns
WHERE tenant = %(t)s AND produced_at IS NOT NULL
"""
ENTITIES = "SELECT count(*) FROM memory.entities WHERE tenant = %(t)s"
# Another tenant's segments closed or enriched in the window went through the same enrich agent and model.
NEIGHBOURS = """
SELECT tenant, count(*) FILTER (WHERE closed_at BETWEEN %(a)s AND %(b)s) AS closed,
       count(*) FILTER (WHERE enriched_at BETWEEN %(a)s AND %(b)s) AS enriched
FROM memory.segments WHERE tenant <> %(t)s
  AND (closed_at BETWEEN %(a)s AND %(b)s OR enriched_at BETWEEN %(a)s AND %(b)s)
GROUP BY tenant
"""


@dataclass(frozen=True)
class RunRows:
    conversations: list[dict[str, Any]]
    segments: list[dict[str, Any]]
    turn_latencies_s: np.ndarray
    entities: int
    neighbours: dict[str, dict[str, int]]


def read_run(url: str, tenant: str, window: tuple[datetime, datetime]) -> RunRows:
    params = {"t": tenant, "a": window[0], "b": window[1]}
    with psycopg.connect(url) as conn:
        cur = conn.cursor(row_factory=dict_row)
        conversations = cur.execute(PER_CONVERSATION, params).fetchall()
        segments = cur.execute(SEGMENTS, params).fetchall()
        latencies = np.array([r[0] for r in conn.execute(TURN_LATENCIES, params).fetchall()], dtype=np.float64)
        entities = int(conn.execute(ENTITIES, params).fetchone()[0])  # type: ignore[index]
        neighbours = {
            r[0]: {"closed": int(r[1]), "enriched": int(r[2])} for r in conn.execute(NEIGHBOURS, params).fetchall()
        }
    return RunRows(conversations, segments, latencies, entities, neighbours)


def percentiles(values: np.ndarray | list[float]) -> dict[str, float | None]:
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return {"n": 0, "p50": None, "p95": None, "max": None}
    p50, p95 = np.percentile(a, [50, 95])
    return {"n": int(a.size), "p50": round(float(p50), 2), "p95": round(float(p95), 2), "max": round(float(a.max()), 2)}


def segment_timings(rows: RunRows, seen_done_at: dict[str, float]) -> dict[str, Any]:
    """Where a segment's time went, from its own timestamps:

    produced_at (newest turn's Kafka time) -> closed_at (the segmenter closed it: at once for a session
    change, after the idle timeout for a conversation's last segment) -> enriched_at (the store
    transaction began: queue + model call(s) + embedding done) -> seen by the bench (committed, +- 1 poll).
    """
    enriched = [s for s in rows.segments if s["status"] == "enriched" and s["produced_at"] is not None]

    def secs(items: list[dict[str, Any]], a: str, b: str) -> list[float]:
        return [(s[b] - s[a]).total_seconds() for s in items if s[a] is not None and s[b] is not None]

    seen = [
        seen_done_at[s["segment_id"]] - s["produced_at"].timestamp()
        for s in enriched if s["segment_id"] in seen_done_at
    ]
    by_reason: dict[str, Any] = {}
    for reason in sorted({s["close_reason"] for s in enriched}):
        group = [s for s in enriched if s["close_reason"] == reason]
        by_reason[reason] = percentiles(secs(group, "produced_at", "enriched_at"))
    return {
        "produce_to_facts_s": percentiles(secs(enriched, "produced_at", "enriched_at")),
        "produce_to_facts_seen_s": percentiles(seen),
        "produce_to_close_s": percentiles(secs(enriched, "produced_at", "closed_at")),
        "close_to_facts_s": percentiles(secs(enriched, "closed_at", "enriched_at")),
        "produce_to_facts_by_close_reason_s": by_reason,
    }


def failures(rows: RunRows) -> dict[str, Any]:
    """Failed segments by error class, with one message each (the error column is '<class>: <message>')."""
    found: dict[str, dict[str, Any]] = {}
    for s in rows.segments:
        if s["status"] != "failed":
            continue
        cls, _, message = (s["error"] or "unknown").partition(": ")
        entry = found.setdefault(cls, {"segments": 0, "example": message[:300]})
        entry["segments"] += 1
    return found
