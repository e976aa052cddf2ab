-- The speakers a question names are looked up per word (consumers/retrieval/speakers.py) on the
-- case-folded speaker. Under row-level security an index on lower(speaker) could not be used: lower()
-- is not LEAKPROOF, so PostgreSQL applies the tenant policy first and the lookup read every turn in
-- scope (bench.scale: 15-20 ms of a 50 ms context read over 19,600 turns, and growing with them). A
-- stored column compared with = (leakproof) is searched on its index; conversation_id in it lets the
-- lookup within some conversations stay in the index too.
ALTER TABLE memory.turns ADD COLUMN IF NOT EXISTS speaker_key text GENERATED ALWAYS AS (lower(speaker)) STORED;
DROP INDEX IF EXISTS memory.turns_speaker_idx;
CREATE INDEX turns_speaker_idx ON memory.turns (tenant, speaker_key, conversation_id);
