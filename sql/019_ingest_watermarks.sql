-- Read-your-own-writes (docs/read-your-writes.md): per partition of memory.turns, the offset the
-- ingest side has stored it through. Written by the ingest worker in the same transaction as the
-- chunk of turns it covers, only ever raised (greatest()), so a replayed or late batch of a previous
-- partition owner never lowers it; read by the answer worker with one primary-key lookup.
-- It holds offsets, no tenant's content, so it has no tenant column and no row-level security; the
-- readers' role (people, through `epistream sql`) has no business with it and may not read it.
CREATE TABLE IF NOT EXISTS memory.ingest_watermarks (
    topic           text    NOT NULL,
    kafka_partition integer NOT NULL CHECK (kafka_partition >= 0),
    stored_through  bigint  NOT NULL CHECK (stored_through >= 0),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, kafka_partition)
);

GRANT SELECT, INSERT, UPDATE ON memory.ingest_watermarks TO epistream_app;
REVOKE DELETE ON memory.ingest_watermarks FROM epistream_app;
REVOKE ALL ON memory.ingest_watermarks FROM epistream_reader;
