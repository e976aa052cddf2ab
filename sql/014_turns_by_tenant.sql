-- memory.turns hash-partitioned by tenant (16 partitions), each with its own HNSW graph, GIN and
-- B-trees. With one table, a tenant's nearest turns sat in one graph among every other tenant's
-- near-duplicates (the filtered HNSW scan visited thousands of other tenants' tuples, and recall fell)
-- and each word's GIN posting list held every tenant's turns: the read grew with the whole memory,
-- not with the tenant (bench.scale). Every read names its tenant, so the planner reads one partition.
--
-- The partitions live in their own schema, which epistream_app cannot use: row-level security is the
-- parent's, and a partition read directly would not apply it. Rows are moved in this transaction; on a
-- large memory, run it in a maintenance window (or restore into a fresh database, which is faster).
CREATE SCHEMA IF NOT EXISTS memory_parts;
REVOKE ALL ON SCHEMA memory_parts FROM PUBLIC;

DO $$
DECLARE
  views text[] := '{}';
  v record;
  statement text;
BEGIN
  IF (SELECT relkind FROM pg_class WHERE oid = 'memory.turns'::regclass) = 'p' THEN
    RETURN;
  END IF;
  -- Views over turns are rebuilt on the new table from their own definitions (sql/006 and any later).
  FOR v IN SELECT DISTINCT c.oid, c.relname, c.reloptions FROM pg_depend d
             JOIN pg_rewrite r ON r.oid = d.objid JOIN pg_class c ON c.oid = r.ev_class
           WHERE d.refobjid = 'memory.turns'::regclass AND c.oid <> 'memory.turns'::regclass
  LOOP
    views := views || format('CREATE VIEW memory.%I %s AS %s', v.relname,
                             CASE WHEN v.reloptions IS NULL THEN ''
                                  ELSE 'WITH (' || array_to_string(v.reloptions, ', ') || ')' END,
                             pg_get_viewdef(v.oid))
                   || format('GRANT SELECT ON memory.%I TO epistream_app', v.relname);
  END LOOP;

  ALTER TABLE memory.turns RENAME TO turns_unpartitioned;
  CREATE TABLE memory.turns (LIKE memory.turns_unpartitioned
      INCLUDING DEFAULTS INCLUDING GENERATED INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMPRESSION)
    PARTITION BY HASH (tenant);
  FOR i IN 0..15 LOOP
    EXECUTE format('CREATE TABLE memory_parts.%I PARTITION OF memory.turns FOR VALUES WITH (MODULUS 16, REMAINDER %s)',
                   'turns_' || lpad(i::text, 2, '0'), i);
  END LOOP;
  INSERT INTO memory.turns (tenant, conversation_id, turn_id, speaker, text, ts, session_id, metadata, embedding,
                            kafka_partition, kafka_offset, produced_at, stored_at, tz_offset_s, embedded_as)
  SELECT tenant, conversation_id, turn_id, speaker, text, ts, session_id, metadata, embedding,
         kafka_partition, kafka_offset, produced_at, stored_at, tz_offset_s, embedded_as
  FROM memory.turns_unpartitioned;
  DROP TABLE memory.turns_unpartitioned CASCADE;  -- its indexes and the views captured above
  -- The versions of a turn (1: as first stored): the ingest upsert tells an insert from a correction by
  -- it, since a partitioned table cannot return xmax.
  ALTER TABLE memory.turns ADD COLUMN revision integer NOT NULL DEFAULT 1;

  ALTER TABLE memory.turns ADD PRIMARY KEY (tenant, conversation_id, turn_id);
  CREATE INDEX turns_conversation_time_idx ON memory.turns (tenant, conversation_id, ts);
  CREATE INDEX turns_tsv_idx ON memory.turns USING gin (tsv);
  CREATE INDEX turns_embedding_idx ON memory.turns USING hnsw (embedding vector_cosine_ops);
  CREATE INDEX turns_embedded_as_idx ON memory.turns (embedded_as) WHERE embedded_as < 2;
  CREATE INDEX turns_speaker_idx ON memory.turns (tenant, lower(speaker));

  ALTER TABLE memory.turns ENABLE ROW LEVEL SECURITY;
  ALTER TABLE memory.turns FORCE ROW LEVEL SECURITY;
  CREATE POLICY tenant_isolation ON memory.turns
      USING (tenant = memory.current_tenant()) WITH CHECK (tenant = memory.current_tenant());
  GRANT SELECT, INSERT, UPDATE, DELETE ON memory.turns TO epistream_app;

  FOREACH statement IN ARRAY views LOOP  -- each view, then its grant
    EXECUTE statement;
  END LOOP;
END $$;
