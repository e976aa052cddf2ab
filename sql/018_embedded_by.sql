-- Which embedding model made each stored vector (epistream/settings/embedder_cards.py). Everything stored
-- before this migration was embedded by all-MiniLM-L6-v2 int8. A worker started with another model
-- re-embeds older rows in place, in small batches (pipeline/reembed.py); until then dense reads skip
-- them (they compare only vectors of the configured model: `embedded_by = current_setting(
-- 'epistream.embedder')`, set on every pooled connection) and they are found lexically.
-- After the backfill, a row records the model of the connection that wrote it (set on every pooled
-- connection, epistream/storage/db.py); a row written by a connection that names none is 'unknown', which is
-- never the configured model: dense reads skip it and the indexer re-embeds it.
ALTER TABLE memory.turns ADD COLUMN IF NOT EXISTS embedded_by text NOT NULL DEFAULT 'all-minilm-l6-v2-int8';
ALTER TABLE memory.turns ALTER COLUMN embedded_by SET DEFAULT coalesce(current_setting('epistream.embedder', true), 'unknown');
ALTER TABLE memory.gists ADD COLUMN IF NOT EXISTS embedded_by text NOT NULL DEFAULT 'all-minilm-l6-v2-int8';
ALTER TABLE memory.gists ALTER COLUMN embedded_by SET DEFAULT coalesce(current_setting('epistream.embedder', true), 'unknown');
ALTER TABLE memory.entities ADD COLUMN IF NOT EXISTS embedded_by text NOT NULL DEFAULT 'all-minilm-l6-v2-int8';
ALTER TABLE memory.entities ALTER COLUMN embedded_by SET DEFAULT coalesce(current_setting('epistream.embedder', true), 'unknown');
-- A segment's and an entity name's vector may be missing (not enriched yet; names from before sql/010).
ALTER TABLE memory.segments ADD COLUMN IF NOT EXISTS embedded_by text;
UPDATE memory.segments SET embedded_by = 'all-minilm-l6-v2-int8' WHERE summary_embedding IS NOT NULL;
ALTER TABLE memory.segments ALTER COLUMN embedded_by SET DEFAULT coalesce(current_setting('epistream.embedder', true), 'unknown');
ALTER TABLE memory.entity_names ADD COLUMN IF NOT EXISTS embedded_by text;
UPDATE memory.entity_names SET embedded_by = 'all-minilm-l6-v2-int8' WHERE embedding IS NOT NULL;
ALTER TABLE memory.entity_names ALTER COLUMN embedded_by SET DEFAULT coalesce(current_setting('epistream.embedder', true), 'unknown');

CREATE INDEX IF NOT EXISTS turns_embedded_by_idx ON memory.turns (embedded_by, tenant);
CREATE INDEX IF NOT EXISTS gists_embedded_by_idx ON memory.gists (embedded_by, tenant);
CREATE INDEX IF NOT EXISTS segments_embedded_by_idx ON memory.segments (embedded_by, tenant);
CREATE INDEX IF NOT EXISTS entities_embedded_by_idx ON memory.entities (embedded_by, tenant);
CREATE INDEX IF NOT EXISTS entity_names_embedded_by_idx ON memory.entity_names (embedded_by, tenant);

GRANT SELECT (tenant, embedded_by) ON memory.turns, memory.gists, memory.entities TO epistream_housekeeper;
GRANT SELECT (tenant, embedded_by, summary_embedding) ON memory.segments TO epistream_housekeeper;
GRANT SELECT (tenant, embedded_by, embedding) ON memory.entity_names TO epistream_housekeeper;

-- Like the other housekeeping functions (sql/017): tenant names only, across tenants, for the
-- re-embedding rounds, which then work inside each tenant's own scope. `<` or `>`, not `<>`: btree
-- range scans of the embedded_by indexes, so a finished switch costs nothing to confirm. Per table, how many vectors
-- another model (or an older turn text) made: the progress `status` shows and the metric exports.
CREATE OR REPLACE FUNCTION memory.vectors_to_reembed(model text, turn_version smallint)
RETURNS TABLE (kind text, tenant text, rows bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT 'turns', t.tenant, count(*) FROM memory.turns t
    WHERE (t.embedded_by < model OR t.embedded_by > model) OR t.embedded_as < turn_version GROUP BY t.tenant
  UNION ALL SELECT 'gists', g.tenant, count(*) FROM memory.gists g WHERE (g.embedded_by < model OR g.embedded_by > model) GROUP BY g.tenant
  UNION ALL SELECT 'segments', s.tenant, count(*) FROM memory.segments s
    WHERE (s.embedded_by < model OR s.embedded_by > model) AND s.summary_embedding IS NOT NULL GROUP BY s.tenant
  UNION ALL SELECT 'entities', e.tenant, count(*) FROM memory.entities e WHERE (e.embedded_by < model OR e.embedded_by > model) GROUP BY e.tenant
  UNION ALL SELECT 'entity_names', n.tenant, count(*) FROM memory.entity_names n
    WHERE (n.embedded_by < model OR n.embedded_by > model) AND n.embedding IS NOT NULL GROUP BY n.tenant
$$;
ALTER FUNCTION memory.vectors_to_reembed(text, smallint) OWNER TO epistream_housekeeper;
REVOKE ALL ON FUNCTION memory.vectors_to_reembed(text, smallint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION memory.vectors_to_reembed(text, smallint) TO epistream_app;
-- Replaced by vectors_to_reembed (turns of an older text are one of its cases).
DROP FUNCTION IF EXISTS memory.turns_embedded_before(smallint, integer);
