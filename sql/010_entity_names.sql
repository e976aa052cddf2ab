-- Every name an entity was given, with the segment that gave it. An entity's
-- name, normalized_name, embedding, first_seen and aliases are derived from
-- these rows (the earliest surviving name wins), so forgetting a conversation
-- (its segments cascade here) takes away exactly the names it gave, and the
-- entity is re-derived from what the surviving conversations called it.
CREATE TABLE IF NOT EXISTS memory.entity_names (
    tenant           text        NOT NULL,
    entity_id        text        NOT NULL,
    segment_id       text        NOT NULL,
    surface          text        NOT NULL,
    normalized_name  text,                  -- NULL only for aliases recorded before this table
    embedding        vector(384),           -- likewise
    seen_at          timestamptz NOT NULL,  -- when the segment that gave it begins
    seq              bigint      GENERATED ALWAYS AS IDENTITY,  -- the order names were given in
    PRIMARY KEY (tenant, entity_id, segment_id, surface),
    FOREIGN KEY (tenant, segment_id) REFERENCES memory.segments (tenant, segment_id) ON DELETE CASCADE,
    FOREIGN KEY (tenant, entity_id) REFERENCES memory.entities (tenant, entity_id) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS entity_names_segment_idx ON memory.entity_names (tenant, segment_id);

ALTER TABLE memory.entity_names ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory.entity_names FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON memory.entity_names;
CREATE POLICY tenant_isolation ON memory.entity_names
    USING (tenant = memory.current_tenant()) WITH CHECK (tenant = memory.current_tenant());
GRANT SELECT, INSERT, UPDATE, DELETE ON memory.entity_names TO epistream_app;
DO $$
BEGIN
  EXECUTE format('GRANT USAGE ON SEQUENCE %s TO epistream_app',
                 pg_get_serial_sequence('memory.entity_names', 'seq'));
END $$;

-- Entities stored before this table: attribute each of their names to the segments that refer
-- to the entity (mentions, facts) and contain that name; a name no such segment contains goes to
-- all of them (kept while any survives). Only the entity's own name has its embedding.
WITH refs AS (
    SELECT m.tenant, m.entity_id, s.segment_id, s.raw_text, s.start_ts
    FROM memory.gist_mentions m
    JOIN memory.gists g ON g.tenant = m.tenant AND g.gist_id = m.gist_id
    JOIN memory.segments s ON s.tenant = g.tenant AND s.segment_id = g.segment_id
    UNION
    SELECT f.tenant, x.entity_id, s.segment_id, s.raw_text, s.start_ts
    FROM memory.facts f
    CROSS JOIN LATERAL (VALUES (f.subject_id), (f.object_id)) AS x(entity_id)
    JOIN memory.segments s ON s.tenant = f.tenant AND s.segment_id = f.segment_id
), names AS (
    SELECT tenant, entity_id, name AS surface, normalized_name, embedding, 0 AS rank FROM memory.entities
    UNION ALL
    SELECT tenant, entity_id, unnest(aliases), NULL, NULL, 1 FROM memory.entities
)
INSERT INTO memory.entity_names (tenant, entity_id, segment_id, surface, normalized_name, embedding, seen_at)
SELECT n.tenant, n.entity_id, r.segment_id, n.surface, n.normalized_name, n.embedding, r.start_ts
FROM names n JOIN refs r ON r.tenant = n.tenant AND r.entity_id = n.entity_id
WHERE strpos(lower(r.raw_text), lower(n.surface)) > 0
   OR NOT EXISTS (SELECT 1 FROM refs o WHERE o.tenant = n.tenant AND o.entity_id = n.entity_id
                  AND strpos(lower(o.raw_text), lower(n.surface)) > 0)
ORDER BY n.rank, r.start_ts
ON CONFLICT DO NOTHING;
