-- A turn is embedded with who said it and when (epistream.models.embeddings.turn_embedding_text), not its
-- bare text: `embedded_as` says which text a row's embedding came from (1 bare, 2 dated). Rows stored
-- before this migration keep 1 and are re-embedded by the indexer in small batches
-- (pipeline/reembed.py), so dense search improves without a stop or a replay. A writer that does not
-- name the version gets 1 and is re-embedded too: the safe default.
ALTER TABLE memory.turns ADD COLUMN IF NOT EXISTS embedded_as smallint NOT NULL DEFAULT 1;
CREATE INDEX IF NOT EXISTS turns_embedded_as_idx ON memory.turns (embedded_as) WHERE embedded_as < 2;

-- Like memory.waiting_segments (sql/009): ids across tenants, nothing else.
CREATE OR REPLACE FUNCTION memory.turns_embedded_before(version smallint, max_rows integer)
RETURNS TABLE (tenant text, conversation_id text, turn_id text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = memory, pg_catalog AS $$
  SELECT t.tenant, t.conversation_id, t.turn_id FROM memory.turns t
  WHERE t.embedded_as < version
  ORDER BY t.tenant, t.conversation_id, t.turn_id LIMIT max_rows
$$;
REVOKE ALL ON FUNCTION memory.turns_embedded_before(smallint, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION memory.turns_embedded_before(smallint, integer) TO epistream_app;
