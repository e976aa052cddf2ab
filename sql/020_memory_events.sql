-- The memory-event outbox (epistream.contracts.events, pipeline/event_relay.py). A writer adds a row in the
-- same transaction as the change it announces (turns stored, a segment closed or enriched, a fact
-- superseded, a conversation forgotten), so an event exists exactly when its change committed. The
-- relay sends unpublished rows to Kafka in `seq` order and marks each published after the broker
-- acknowledged it; published rows are pruned after a while. Rows hold ids and counts, never user text,
-- and a forget deletes none of them: the row announcing a forget must outlive what it deleted.
CREATE TABLE IF NOT EXISTS memory.event_outbox (
    seq              bigserial   PRIMARY KEY,   -- the relay's order
    tenant           text        NOT NULL,
    event_id         text        NOT NULL,      -- the same change (a replay) gives the same id
    conversation_id  text        NOT NULL,      -- the Kafka key; '' for a whole-tenant event
    payload          jsonb       NOT NULL,      -- the MemoryEvent as published
    created_at       timestamptz NOT NULL DEFAULT now(),
    published_at     timestamptz,
    UNIQUE (tenant, event_id)
);
CREATE INDEX IF NOT EXISTS event_outbox_unpublished_idx ON memory.event_outbox (seq) WHERE published_at IS NULL;
CREATE INDEX IF NOT EXISTS event_outbox_published_idx ON memory.event_outbox (published_at)
    WHERE published_at IS NOT NULL;
ALTER TABLE memory.event_outbox ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory.event_outbox FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON memory.event_outbox;
CREATE POLICY tenant_isolation ON memory.event_outbox
    USING (tenant = memory.current_tenant()) WITH CHECK (tenant = memory.current_tenant());
GRANT SELECT, INSERT, UPDATE ON memory.event_outbox TO epistream_app;
-- Rows leave only through the prune below: a worker's own statements cannot delete an event.
REVOKE DELETE ON memory.event_outbox FROM epistream_app;
GRANT USAGE ON SEQUENCE memory.event_outbox_seq_seq TO epistream_app;

-- The relay looks across tenants only through these, owned by the housekeeper (sql/017): the first
-- returns ids and nothing else, the second deletes published rows older than `keep`.
GRANT SELECT (seq, tenant, published_at, created_at) ON memory.event_outbox TO epistream_housekeeper;
GRANT DELETE ON memory.event_outbox TO epistream_housekeeper;

-- `skip`: tenants whose events cannot go out yet (no topic of their own), so they hold up no one else.
CREATE OR REPLACE FUNCTION memory.unpublished_events(max_rows integer, skip text[])
RETURNS TABLE (tenant text, seq bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT e.tenant, e.seq FROM memory.event_outbox e
  WHERE e.published_at IS NULL AND NOT (e.tenant = ANY(skip))
  ORDER BY e.seq LIMIT max_rows
$$;

CREATE OR REPLACE FUNCTION memory.prune_published_events(keep interval)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  WITH gone AS (
    DELETE FROM memory.event_outbox e
    WHERE e.published_at IS NOT NULL AND e.published_at < pg_catalog.now() - keep
    RETURNING 1
  )
  SELECT pg_catalog.count(*) FROM gone
$$;

ALTER FUNCTION memory.unpublished_events(integer, text[]) OWNER TO epistream_housekeeper;
ALTER FUNCTION memory.prune_published_events(interval) OWNER TO epistream_housekeeper;
REVOKE ALL ON FUNCTION memory.unpublished_events(integer, text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION memory.prune_published_events(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION memory.unpublished_events(integer, text[]) TO epistream_app;
GRANT EXECUTE ON FUNCTION memory.prune_published_events(interval) TO epistream_app;
