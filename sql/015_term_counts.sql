-- How many of a conversation's turns hold each lexeme: BM25's document frequencies, read with one index
-- probe per word of a question (consumers/retrieval/turns.py). Counted at query time they took a
-- bitmap heap scan per word, about 2 ms per thousand matching turns, so the read of a large
-- conversation grew with it (bench.scale: 22 of 30 ms for one question at 19,600 turns). The row
-- with lexeme '' counts the conversation's turns (BM25's N).
--
-- Kept by statement triggers on memory.turns, whichever writer it is (the ingest upsert, a forget, a
-- COPY): one aggregated change per statement. Lexemes are words of the conversation, so a row whose
-- count falls to zero is deleted with it: nothing of a forgotten conversation stays here.
CREATE TABLE IF NOT EXISTS memory.term_counts (
    tenant           text    NOT NULL,
    conversation_id  text    NOT NULL,
    lexeme           text    NOT NULL,
    turns            integer NOT NULL,
    PRIMARY KEY (tenant, lexeme, conversation_id)  -- a word across a tenant, or within its conversations
);
ALTER TABLE memory.term_counts ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory.term_counts FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON memory.term_counts;
CREATE POLICY tenant_isolation ON memory.term_counts
    USING (tenant = memory.current_tenant()) WITH CHECK (tenant = memory.current_tenant());
GRANT SELECT, INSERT, UPDATE, DELETE ON memory.term_counts TO epistream_app;

-- Each changed turn's tsvector with +1 (now held) or -1 (no longer held), applied at once.
CREATE OR REPLACE FUNCTION memory.apply_term_changes(tenants text[], conversation_ids text[], tsvs tsvector[],
                                                     signs integer[])
RETURNS void LANGUAGE sql AS $$
  INSERT INTO memory.term_counts AS c (tenant, conversation_id, lexeme, turns)
  SELECT r.tenant, r.conversation_id, w.lexeme, sum(r.sign)::integer
  FROM unnest(tenants, conversation_ids, tsvs, signs) AS r(tenant, conversation_id, tsv, sign)
  CROSS JOIN LATERAL (SELECT u.lexeme FROM unnest(r.tsv) AS u UNION ALL SELECT '') AS w
  GROUP BY r.tenant, r.conversation_id, w.lexeme
  HAVING sum(r.sign) <> 0
  ON CONFLICT (tenant, lexeme, conversation_id) DO UPDATE SET turns = c.turns + EXCLUDED.turns;
  DELETE FROM memory.term_counts c
  USING (SELECT DISTINCT t, k FROM unnest(tenants, conversation_ids, signs) AS s(t, k, sign) WHERE sign < 0) AS gone
  WHERE c.tenant = gone.t AND c.conversation_id = gone.k AND c.turns <= 0;
$$;

CREATE OR REPLACE FUNCTION memory.count_inserted_terms() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM memory.apply_term_changes(array_agg(n.tenant), array_agg(n.conversation_id), array_agg(n.tsv),
                                    array_agg(1)) FROM new_turns n HAVING count(*) > 0;
  RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION memory.count_deleted_terms() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM memory.apply_term_changes(array_agg(o.tenant), array_agg(o.conversation_id), array_agg(o.tsv),
                                    array_agg(-1)) FROM old_turns o HAVING count(*) > 0;
  RETURN NULL;
END $$;

-- An update counts only where the words changed (a re-embedding, or a replay of the same text, does not).
CREATE OR REPLACE FUNCTION memory.count_updated_terms() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM memory.apply_term_changes(array_agg(d.tenant), array_agg(d.conversation_id), array_agg(d.tsv),
                                    array_agg(d.sign))
  FROM (SELECT o.tenant, o.conversation_id, side.tsv, side.sign
        FROM old_turns o JOIN new_turns n USING (tenant, conversation_id, turn_id)
        CROSS JOIN LATERAL (VALUES (o.tsv, -1), (n.tsv, 1)) AS side(tsv, sign)
        WHERE o.tsv IS DISTINCT FROM n.tsv) d
  HAVING count(*) > 0;
  RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS turns_terms_inserted ON memory.turns;
DROP TRIGGER IF EXISTS turns_terms_deleted ON memory.turns;
DROP TRIGGER IF EXISTS turns_terms_updated ON memory.turns;
CREATE TRIGGER turns_terms_inserted AFTER INSERT ON memory.turns REFERENCING NEW TABLE AS new_turns
    FOR EACH STATEMENT EXECUTE FUNCTION memory.count_inserted_terms();
CREATE TRIGGER turns_terms_deleted AFTER DELETE ON memory.turns REFERENCING OLD TABLE AS old_turns
    FOR EACH STATEMENT EXECUTE FUNCTION memory.count_deleted_terms();
CREATE TRIGGER turns_terms_updated AFTER UPDATE ON memory.turns REFERENCING OLD TABLE AS old_turns NEW TABLE AS new_turns
    FOR EACH STATEMENT EXECUTE FUNCTION memory.count_updated_terms();

-- The turns already stored.
INSERT INTO memory.term_counts (tenant, conversation_id, lexeme, turns)
SELECT t.tenant, t.conversation_id, w.lexeme, count(*)::integer
FROM memory.turns t CROSS JOIN LATERAL (SELECT u.lexeme FROM unnest(t.tsv) AS u UNION ALL SELECT '') AS w
GROUP BY t.tenant, t.conversation_id, w.lexeme
ON CONFLICT (tenant, lexeme, conversation_id) DO NOTHING;
