-- A segment whose enrichment found the model unavailable waits ('waiting') instead of
-- failing: the enrich worker retries it from here once the model answers again.
ALTER TABLE memory.segments DROP CONSTRAINT IF EXISTS segments_status_check;
ALTER TABLE memory.segments ADD CONSTRAINT segments_status_check
    CHECK (status IN ('pending', 'waiting', 'enriched', 'failed'));
CREATE INDEX IF NOT EXISTS segments_waiting_idx ON memory.segments (closed_at) WHERE status = 'waiting';

-- Like memory.unpublished_segments (sql/007): ids across tenants, nothing else.
CREATE OR REPLACE FUNCTION memory.waiting_segments(max_rows integer)
RETURNS TABLE (tenant text, segment_id text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = memory, pg_catalog AS $$
  SELECT s.tenant, s.segment_id FROM memory.segments s
  WHERE s.status = 'waiting'
  ORDER BY s.closed_at LIMIT max_rows
$$;
REVOKE ALL ON FUNCTION memory.waiting_segments(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION memory.waiting_segments(integer) TO epistream_app;
