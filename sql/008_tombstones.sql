-- Forgotten conversations (conversation_id '' = the whole tenant). Kafka keeps
-- the turns, so a replay of memory.turns must not bring them back: the ingest
-- agent skips any turn a tombstone covers.
CREATE TABLE IF NOT EXISTS memory.tombstones (
    tenant           text        NOT NULL,
    conversation_id  text        NOT NULL DEFAULT '',
    deleted_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, conversation_id)
);
ALTER TABLE memory.tombstones ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory.tombstones FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON memory.tombstones;
CREATE POLICY tenant_isolation ON memory.tombstones
    USING (tenant = memory.current_tenant()) WITH CHECK (tenant = memory.current_tenant());
GRANT SELECT, INSERT, UPDATE, DELETE ON memory.tombstones TO epistream_app;
