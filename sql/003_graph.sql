-- The AGE graph that mirrors gists, entities and facts for Cypher traversal.
-- create_graph is not idempotent, so look first; it resolves AGE's operator
-- classes through search_path, hence ag_catalog first for this transaction.
SET LOCAL search_path = ag_catalog, "$user", public;
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM ag_catalog.ag_graph WHERE name = 'memory_graph') THEN
    PERFORM ag_catalog.create_graph('memory_graph');
  END IF;
END $$;
