-- Tenant isolation in the database. Workers and user sessions act as the role
-- epistream_app (no superuser, no BYPASSRLS) and name their tenant per
-- transaction with  SELECT set_config('epistream.tenant', $1, true).
-- Every memory table, and every label table of the graph, only shows and only
-- accepts rows of that tenant. Without a tenant set, nothing is visible.

DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'epistream_app') THEN
    CREATE ROLE epistream_app NOLOGIN NOSUPERUSER NOBYPASSRLS;
  END IF;
END $$;

GRANT USAGE ON SCHEMA memory TO epistream_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA memory TO epistream_app;
GRANT USAGE ON SCHEMA ag_catalog TO epistream_app;
GRANT SELECT ON ALL TABLES IN SCHEMA ag_catalog TO epistream_app;
GRANT USAGE ON SCHEMA memory_graph TO epistream_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA memory_graph TO epistream_app;
GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA memory_graph TO epistream_app;

CREATE OR REPLACE FUNCTION memory.current_tenant() RETURNS text
LANGUAGE sql STABLE AS $$ SELECT nullif(current_setting('epistream.tenant', true), '') $$;

DO $$
DECLARE
  t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['turns', 'segmenter_state', 'segments', 'gists', 'entities', 'gist_mentions', 'facts']
  LOOP
    EXECUTE format('ALTER TABLE memory.%I ENABLE ROW LEVEL SECURITY', t);
    EXECUTE format('ALTER TABLE memory.%I FORCE ROW LEVEL SECURITY', t);
    EXECUTE format('DROP POLICY IF EXISTS tenant_isolation ON memory.%I', t);
    EXECUTE format('CREATE POLICY tenant_isolation ON memory.%I USING (tenant = memory.current_tenant())'
                   ' WITH CHECK (tenant = memory.current_tenant())', t);
  END LOOP;
  -- The graph: vertices and edges carry their tenant as a property.
  FOREACH t IN ARRAY ARRAY['_ag_label_vertex', '_ag_label_edge', 'Gist', 'Entity', 'MENTIONS', 'FACT', 'SIMILAR']
  LOOP
    EXECUTE format('ALTER TABLE memory_graph.%I ENABLE ROW LEVEL SECURITY', t);
    EXECUTE format('ALTER TABLE memory_graph.%I FORCE ROW LEVEL SECURITY', t);
    EXECUTE format('DROP POLICY IF EXISTS tenant_isolation ON memory_graph.%I', t);
    -- agtype's text cast gives a string property unquoted.
    EXECUTE format('CREATE POLICY tenant_isolation ON memory_graph.%I'
                   ' USING (ag_catalog.agtype_access_operator(properties, %L::ag_catalog.agtype)::text'
                   '        = memory.current_tenant())'
                   ' WITH CHECK (ag_catalog.agtype_access_operator(properties, %L::ag_catalog.agtype)::text'
                   '        = memory.current_tenant())', t, '"tenant"', '"tenant"');
  END LOOP;
END $$;

-- Housekeeping looks across tenants, but only through these two narrow
-- functions, which return ids and nothing else.
CREATE OR REPLACE FUNCTION memory.idle_conversations(idle interval, max_rows integer)
RETURNS TABLE (tenant text, conversation_id text, last_turn_id text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = memory, pg_catalog AS $$
  SELECT s.tenant, s.conversation_id, s.open_turn_ids[cardinality(s.open_turn_ids)]
  FROM memory.segmenter_state s
  WHERE cardinality(s.open_turn_ids) > s.carried AND s.updated_at < now() - idle
  ORDER BY s.updated_at LIMIT max_rows
$$;

CREATE OR REPLACE FUNCTION memory.unpublished_segments(grace interval, max_rows integer)
RETURNS TABLE (tenant text, segment_id text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = memory, pg_catalog AS $$
  SELECT s.tenant, s.segment_id FROM memory.segments s
  WHERE s.published_at IS NULL AND s.closed_at < now() - grace
  ORDER BY s.closed_at LIMIT max_rows
$$;

REVOKE ALL ON FUNCTION memory.idle_conversations(interval, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION memory.unpublished_segments(interval, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION memory.idle_conversations(interval, integer) TO epistream_app;
GRANT EXECUTE ON FUNCTION memory.unpublished_segments(interval, integer) TO epistream_app;

-- Views read with the caller's rights, so row-level security applies through them too.
ALTER VIEW memory.current_facts SET (security_invoker = true);
ALTER VIEW memory.gist_timeline SET (security_invoker = true);
ALTER VIEW memory.fact_history SET (security_invoker = true);
ALTER VIEW memory.segment_summaries SET (security_invoker = true);
ALTER VIEW memory.conversation_stats SET (security_invoker = true);

-- Tables added by later migrations are granted the same way.
ALTER DEFAULT PRIVILEGES IN SCHEMA memory GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO epistream_app;
