-- Views for people who query the memory with SQL. Each is documented in the
-- README ("Operating epistream") and exercised by sql/examples/.

-- Gists in the order things happened, per conversation.
CREATE OR REPLACE VIEW memory.gist_timeline AS
SELECT g.tenant, g.conversation_id, g.event_date, g.date_precision, g.text,
       g.segment_id, g.turn_ids, g.said_at, g.gist_id
FROM memory.gists g;

-- Every fact with readable names, when it held, when it was said, and whether it is still current.
CREATE OR REPLACE VIEW memory.fact_history AS
SELECT f.tenant, f.conversation_id, s.name AS subject, f.predicate, o.name AS object,
       f.point_in_time, f.start_time, f.end_time, f.said_at, f.turn_ids, f.segment_id, f.fact_id,
       EXISTS (SELECT 1 FROM memory.current_facts c WHERE c.tenant = f.tenant AND c.fact_id = f.fact_id) AS is_current
FROM memory.facts f
JOIN memory.entities s ON s.tenant = f.tenant AND s.entity_id = f.subject_id
JOIN memory.entities o ON o.tenant = f.tenant AND o.entity_id = f.object_id;

-- Segments with their summaries and enrichment state.
CREATE OR REPLACE VIEW memory.segment_summaries AS
SELECT s.tenant, s.conversation_id, s.segment_id, s.seq, s.start_ts, s.end_ts,
       cardinality(s.turn_ids) AS turns, s.overlap_turns, s.token_estimate, s.close_reason,
       s.status, s.summary, s.error, s.closed_at, s.enriched_at
FROM memory.segments s;

-- One row per conversation: how much memory it has and how fresh it is.
CREATE OR REPLACE VIEW memory.conversation_stats AS
SELECT t.tenant, t.conversation_id,
       count(*) AS turns,
       count(DISTINCT t.speaker) AS speakers,
       min(t.ts) AS first_turn_at,
       max(t.ts) AS last_turn_at,
       max(t.stored_at) AS last_stored_at,
       (SELECT count(*) FROM memory.segments s
        WHERE s.tenant = t.tenant AND s.conversation_id = t.conversation_id) AS segments,
       (SELECT count(*) FROM memory.segments s
        WHERE s.tenant = t.tenant AND s.conversation_id = t.conversation_id AND s.status = 'enriched') AS segments_enriched,
       (SELECT count(*) FROM memory.segments s
        WHERE s.tenant = t.tenant AND s.conversation_id = t.conversation_id AND s.status = 'failed') AS segments_failed,
       (SELECT count(*) FROM memory.gists g
        WHERE g.tenant = t.tenant AND g.conversation_id = t.conversation_id) AS gists,
       (SELECT count(*) FROM memory.facts f
        WHERE f.tenant = t.tenant AND f.conversation_id = t.conversation_id) AS facts
FROM memory.turns t
GROUP BY t.tenant, t.conversation_id;
