-- Who said a turn, case-folded, per tenant: the context read asks whether a word of the question
-- is one of the tenant's speakers (consumers/retrieval/speakers.py) with one index probe per word.
CREATE INDEX IF NOT EXISTS turns_speaker_idx ON memory.turns (tenant, lower(speaker));
