-- Least privilege. Workers log in as epistream_worker and people read as epistream_reader: neither
-- is a superuser, neither bypasses row-level security, and each holds no more than its group role,
-- so a RESET ROLE (or any statement a worker runs) gains nothing. The superuser only migrates.
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'epistream_worker') THEN
    CREATE ROLE epistream_worker LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'epistream_reader') THEN
    CREATE ROLE epistream_reader LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
  END IF;
  -- Owns the cross-tenant housekeeping functions below: it may read the few columns they return
  -- and nothing else, so a definer function runs with no more than that.
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'epistream_housekeeper') THEN
    CREATE ROLE epistream_housekeeper NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION BYPASSRLS;
  END IF;
END $$;

GRANT epistream_app TO epistream_worker;
-- Cypher needs AGE loaded in the session; a non-superuser may not LOAD it, so the role loads it at login.
ALTER ROLE epistream_worker SET session_preload_libraries = 'age';
ALTER ROLE epistream_reader SET session_preload_libraries = 'age';
ALTER ROLE epistream_reader SET search_path = memory, ag_catalog, public;

-- The reader: SELECT only, under the same tenant policies.
GRANT USAGE ON SCHEMA memory, memory_graph, ag_catalog TO epistream_reader;
GRANT SELECT ON ALL TABLES IN SCHEMA memory TO epistream_reader;
GRANT SELECT ON ALL TABLES IN SCHEMA memory_graph TO epistream_reader;
GRANT SELECT ON ALL TABLES IN SCHEMA ag_catalog TO epistream_reader;
ALTER DEFAULT PRIVILEGES IN SCHEMA memory GRANT SELECT ON TABLES TO epistream_reader;

-- AGE draws graph ids with nextval (USAGE); setval (UPDATE) could make ids collide.
REVOKE UPDATE ON ALL SEQUENCES IN SCHEMA memory_graph FROM epistream_app;
-- A tombstone, once written, stays: forget only inserts.
REVOKE UPDATE, DELETE ON memory.tombstones FROM epistream_app;

-- The housekeeping functions: owned by epistream_housekeeper, a fixed search path (nothing a caller
-- puts first can shadow an operator or a table), every name qualified.
GRANT USAGE ON SCHEMA memory TO epistream_housekeeper;
GRANT SELECT (tenant, conversation_id, open_turn_ids, carried, updated_at) ON memory.segmenter_state
    TO epistream_housekeeper;
GRANT SELECT (tenant, segment_id, published_at, closed_at, status) ON memory.segments TO epistream_housekeeper;
GRANT SELECT (tenant, conversation_id, turn_id, embedded_as) ON memory.turns TO epistream_housekeeper;

CREATE OR REPLACE FUNCTION memory.idle_conversations(idle interval, max_rows integer)
RETURNS TABLE (tenant text, conversation_id text, last_turn_id text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT s.tenant, s.conversation_id, s.open_turn_ids[pg_catalog.cardinality(s.open_turn_ids)]
  FROM memory.segmenter_state s
  WHERE pg_catalog.cardinality(s.open_turn_ids) > s.carried AND s.updated_at < pg_catalog.now() - idle
  ORDER BY s.updated_at LIMIT max_rows
$$;

CREATE OR REPLACE FUNCTION memory.unpublished_segments(grace interval, max_rows integer)
RETURNS TABLE (tenant text, segment_id text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT s.tenant, s.segment_id FROM memory.segments s
  WHERE s.published_at IS NULL AND s.closed_at < pg_catalog.now() - grace
  ORDER BY s.closed_at LIMIT max_rows
$$;

CREATE OR REPLACE FUNCTION memory.waiting_segments(max_rows integer)
RETURNS TABLE (tenant text, segment_id text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT s.tenant, s.segment_id FROM memory.segments s
  WHERE s.status = 'waiting'
  ORDER BY s.closed_at LIMIT max_rows
$$;

CREATE OR REPLACE FUNCTION memory.turns_embedded_before(version smallint, max_rows integer)
RETURNS TABLE (tenant text, conversation_id text, turn_id text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT t.tenant, t.conversation_id, t.turn_id FROM memory.turns t
  WHERE t.embedded_as < version
  ORDER BY t.tenant, t.conversation_id, t.turn_id LIMIT max_rows
$$;

ALTER FUNCTION memory.idle_conversations(interval, integer) OWNER TO epistream_housekeeper;
ALTER FUNCTION memory.unpublished_segments(interval, integer) OWNER TO epistream_housekeeper;
ALTER FUNCTION memory.waiting_segments(integer) OWNER TO epistream_housekeeper;
ALTER FUNCTION memory.turns_embedded_before(smallint, integer) OWNER TO epistream_housekeeper;
