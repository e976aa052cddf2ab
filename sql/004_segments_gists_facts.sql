-- The slow path's store: segments (raw turns kept whole, with their summary),
-- gists (one dated sentence each), entities (merged mentions), facts (temporal
-- triples, never overwritten: "current" is a view), and the segmenter's
-- per-conversation state, written in the same transaction as the turns.

CREATE TABLE IF NOT EXISTS memory.segmenter_state (
    tenant           text        NOT NULL,
    conversation_id  text        NOT NULL,
    next_seq         integer     NOT NULL DEFAULT 0,
    -- the open segment: its turns in arrival order, with their token estimates
    open_turn_ids    text[]      NOT NULL DEFAULT '{}',
    open_tokens      integer[]   NOT NULL DEFAULT '{}',
    carried          integer     NOT NULL DEFAULT 0,   -- leading open turns carried as overlap
    last_ts          timestamptz,
    last_session_id  text,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, conversation_id)
);
CREATE INDEX IF NOT EXISTS segmenter_state_idle_idx
    ON memory.segmenter_state (updated_at) WHERE cardinality(open_turn_ids) > carried;

CREATE TABLE IF NOT EXISTS memory.segments (
    tenant            text        NOT NULL,
    conversation_id   text        NOT NULL,
    segment_id        text        NOT NULL,
    seq               integer     NOT NULL,
    turn_ids          text[]      NOT NULL,
    overlap_turns     integer     NOT NULL DEFAULT 0,
    start_ts          timestamptz NOT NULL,
    end_ts            timestamptz NOT NULL,
    raw_text          text        NOT NULL,
    token_estimate    integer     NOT NULL,
    close_reason      text        NOT NULL CHECK (close_reason IN ('budget', 'session', 'gap', 'idle')),
    summary           text,
    summary_embedding vector(384),
    summary_tsv       tsvector GENERATED ALWAYS AS (to_tsvector('english', coalesce(summary, ''))) STORED,
    status            text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'enriched', 'failed')),
    attempts          integer     NOT NULL DEFAULT 0,
    error             text,
    prompt_version    text,
    produced_at       timestamptz,              -- newest Kafka timestamp among its turns
    closed_at         timestamptz NOT NULL DEFAULT now(),
    published_at      timestamptz,              -- outbox: sent to memory.segments
    enriched_at       timestamptz,
    PRIMARY KEY (tenant, segment_id)
);
CREATE UNIQUE INDEX IF NOT EXISTS segments_conversation_seq_idx ON memory.segments (tenant, conversation_id, seq);
CREATE INDEX IF NOT EXISTS segments_unpublished_idx ON memory.segments (closed_at) WHERE published_at IS NULL;
CREATE INDEX IF NOT EXISTS segments_time_idx ON memory.segments (tenant, conversation_id, start_ts, end_ts);
CREATE INDEX IF NOT EXISTS segments_turn_ids_idx ON memory.segments USING gin (turn_ids);
CREATE INDEX IF NOT EXISTS segments_summary_tsv_idx ON memory.segments USING gin (summary_tsv);
CREATE INDEX IF NOT EXISTS segments_summary_embedding_idx
    ON memory.segments USING hnsw (summary_embedding vector_cosine_ops);

CREATE TABLE IF NOT EXISTS memory.gists (
    tenant           text        NOT NULL,
    gist_id          text        NOT NULL,
    conversation_id  text        NOT NULL,
    segment_id       text        NOT NULL,
    ordinal          integer     NOT NULL,
    text             text        NOT NULL,     -- begins with its absolute date
    event_date       date        NOT NULL,
    date_precision   text        NOT NULL CHECK (date_precision IN ('day', 'week', 'month', 'year')),
    turn_ids         text[]      NOT NULL,
    said_at          timestamptz NOT NULL,     -- time of the turn it was drawn from
    embedding        vector(384) NOT NULL,
    tsv              tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED,
    PRIMARY KEY (tenant, gist_id),
    FOREIGN KEY (tenant, segment_id) REFERENCES memory.segments (tenant, segment_id) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS gists_timeline_idx ON memory.gists (tenant, conversation_id, event_date);
CREATE INDEX IF NOT EXISTS gists_segment_idx ON memory.gists (tenant, segment_id);
CREATE INDEX IF NOT EXISTS gists_tsv_idx ON memory.gists USING gin (tsv);
CREATE INDEX IF NOT EXISTS gists_embedding_idx ON memory.gists USING hnsw (embedding vector_cosine_ops);

CREATE TABLE IF NOT EXISTS memory.entities (
    tenant           text        NOT NULL,
    entity_id        text        NOT NULL,
    name             text        NOT NULL,     -- first surface form seen
    normalized_name  text        NOT NULL,
    aliases          text[]      NOT NULL DEFAULT '{}',
    embedding        vector(384) NOT NULL,
    first_seen       timestamptz NOT NULL,
    PRIMARY KEY (tenant, entity_id)
);
CREATE UNIQUE INDEX IF NOT EXISTS entities_normalized_idx ON memory.entities (tenant, normalized_name);
CREATE INDEX IF NOT EXISTS entities_embedding_idx ON memory.entities USING hnsw (embedding vector_cosine_ops);

CREATE TABLE IF NOT EXISTS memory.gist_mentions (
    tenant     text NOT NULL,
    gist_id    text NOT NULL,
    entity_id  text NOT NULL,
    PRIMARY KEY (tenant, gist_id, entity_id),
    FOREIGN KEY (tenant, gist_id) REFERENCES memory.gists (tenant, gist_id) ON DELETE CASCADE,
    FOREIGN KEY (tenant, entity_id) REFERENCES memory.entities (tenant, entity_id) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS gist_mentions_entity_idx ON memory.gist_mentions (tenant, entity_id);

CREATE TABLE IF NOT EXISTS memory.facts (
    tenant             text        NOT NULL,
    fact_id            text        NOT NULL,
    conversation_id    text        NOT NULL,
    segment_id         text        NOT NULL,
    ordinal            integer     NOT NULL,
    subject_id         text        NOT NULL,
    predicate          text        NOT NULL,   -- normalised: lower case, words joined by '_'
    object_id          text        NOT NULL,
    point_in_time      date,
    start_time         date,
    end_time           date,
    turn_ids           text[]      NOT NULL,
    said_at            timestamptz NOT NULL,   -- when it was said: the order of "newer"
    PRIMARY KEY (tenant, fact_id),
    FOREIGN KEY (tenant, segment_id) REFERENCES memory.segments (tenant, segment_id) ON DELETE CASCADE,
    FOREIGN KEY (tenant, subject_id) REFERENCES memory.entities (tenant, entity_id),
    FOREIGN KEY (tenant, object_id) REFERENCES memory.entities (tenant, entity_id)
);
CREATE INDEX IF NOT EXISTS facts_subject_idx ON memory.facts (tenant, subject_id, predicate, said_at);
CREATE INDEX IF NOT EXISTS facts_object_idx ON memory.facts (tenant, object_id, predicate);
CREATE INDEX IF NOT EXISTS facts_predicate_idx ON memory.facts (tenant, predicate, said_at);
CREATE INDEX IF NOT EXISTS facts_time_idx
    ON memory.facts (tenant, (coalesce(point_in_time, start_time, end_time)));
CREATE INDEX IF NOT EXISTS facts_segment_idx ON memory.facts (tenant, segment_id);

-- A fact is current while no later statement gives the same subject a
-- different object for the same predicate. History stays in memory.facts.
CREATE OR REPLACE VIEW memory.current_facts AS
SELECT DISTINCT ON (f.tenant, f.subject_id, f.predicate) f.*
FROM memory.facts f
ORDER BY f.tenant, f.subject_id, f.predicate,
         coalesce(f.start_time, f.point_in_time, f.said_at::date) DESC, f.said_at DESC, f.fact_id DESC;

-- Graph labels exist up front (AGE creates a table per label; creating them
-- lazily from concurrent workers would race), with GIN indexes on properties
-- so MATCH on {id: ...} is an index lookup.
SET LOCAL search_path = ag_catalog, "$user", public;
DO $$
DECLARE
  label record;
BEGIN
  FOR label IN SELECT * FROM (VALUES ('Gist', 'v'), ('Entity', 'v'), ('MENTIONS', 'e'), ('FACT', 'e'), ('SIMILAR', 'e')) AS l(name, kind)
  LOOP
    IF NOT EXISTS (
      SELECT 1 FROM ag_catalog.ag_label l JOIN ag_catalog.ag_graph g ON g.graphid = l.graph
      WHERE g.name = 'memory_graph' AND l.name = label.name
    ) THEN
      IF label.kind = 'v' THEN
        PERFORM ag_catalog.create_vlabel('memory_graph'::cstring, label.name::cstring);
      ELSE
        PERFORM ag_catalog.create_elabel('memory_graph'::cstring, label.name::cstring);
      END IF;
    END IF;
  END LOOP;
END $$;
CREATE INDEX IF NOT EXISTS gist_properties_idx ON memory_graph."Gist" USING gin (properties);
CREATE INDEX IF NOT EXISTS entity_properties_idx ON memory_graph."Entity" USING gin (properties);
CREATE INDEX IF NOT EXISTS fact_properties_idx ON memory_graph."FACT" USING gin (properties);
CREATE INDEX IF NOT EXISTS mentions_properties_idx ON memory_graph."MENTIONS" USING gin (properties);
CREATE INDEX IF NOT EXISTS similar_properties_idx ON memory_graph."SIMILAR" USING gin (properties);
