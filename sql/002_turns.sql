-- Schema `memory` and the turns table: the fast path's store, searchable by
-- full-text (tsvector, GIN) and by meaning (384-d MiniLM embeddings, HNSW).
CREATE SCHEMA IF NOT EXISTS memory;

CREATE TABLE IF NOT EXISTS memory.turns (
    tenant           text        NOT NULL,
    conversation_id  text        NOT NULL,
    turn_id          text        NOT NULL,
    speaker          text        NOT NULL,
    text             text        NOT NULL,
    ts               timestamptz NOT NULL,
    session_id       text,
    metadata         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    embedding        vector(384) NOT NULL,
    tsv              tsvector GENERATED ALWAYS AS (
                         to_tsvector('english', coalesce(speaker, '') || ' ' || text)
                     ) STORED,
    -- provenance: where in Kafka the current version came from, and when
    kafka_partition  integer,
    kafka_offset     bigint,
    produced_at      timestamptz,
    stored_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, conversation_id, turn_id)
);

CREATE INDEX IF NOT EXISTS turns_conversation_time_idx
    ON memory.turns (tenant, conversation_id, ts);
CREATE INDEX IF NOT EXISTS turns_tsv_idx
    ON memory.turns USING gin (tsv);
CREATE INDEX IF NOT EXISTS turns_embedding_idx
    ON memory.turns USING hnsw (embedding vector_cosine_ops);
