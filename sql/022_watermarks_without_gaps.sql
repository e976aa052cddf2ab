-- Read-your-own-writes with no gap under the mark (docs/read-your-writes.md): each chunk's transaction
-- adds the offset ranges it is done with to `stored`, and the mark is the end of the run of ranges
-- that holds it. A chunk stored after records its consumer never handed over (offsets C..X-1 skipped,
-- X onward stored) extends a later range and raises nothing, so a read waiting on C..X-1 says
-- `incomplete`, never complete without them. Below the mark the ranges are merged into one: the column
-- holds one range per gap above it, a handful at most.
ALTER TABLE memory.ingest_watermarks
    ADD COLUMN IF NOT EXISTS stored int8multirange NOT NULL DEFAULT '{}';

-- Marks written before: everything from the partition's start through the mark.
UPDATE memory.ingest_watermarks SET stored = int8multirange(int8range(0, stored_through + 1))
WHERE stored_through >= 0 AND isempty(stored);

-- The mark after `stored` grew: nothing stored yet (-1) starts at the lowest range (the first offset
-- the group read: the log's start, or where retention had moved it); otherwise the end of the range
-- that continues the mark, or the mark itself while the next offset is missing. Never lower.
CREATE OR REPLACE FUNCTION memory.watermark_after(stored int8multirange, through bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN isempty(stored) THEN through
        WHEN through < 0 THEN upper((SELECT r FROM unnest(stored) r ORDER BY r LIMIT 1)) - 1
        ELSE greatest(through, coalesce((SELECT upper(r) - 1 FROM unnest(stored) r WHERE r @> (through + 1)), through))
    END
$$;

-- `stored` with everything from its lowest offset through the mark made one range: the mark already
-- claims it all (a previous owner's late batch below the mark leaves no gap behind), so what remains
-- beyond the first range is exactly the gaps above the mark.
CREATE OR REPLACE FUNCTION memory.watermark_fill(stored int8multirange, through bigint) RETURNS int8multirange
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN isempty(stored) OR memory.watermark_after(stored, through) < lower(stored) THEN stored
        ELSE stored + int8multirange(int8range(lower(stored), memory.watermark_after(stored, through) + 1))
    END
$$;

REVOKE ALL ON FUNCTION memory.watermark_after(int8multirange, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION memory.watermark_fill(int8multirange, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION memory.watermark_after(int8multirange, bigint) TO epistream_app;
GRANT EXECUTE ON FUNCTION memory.watermark_fill(int8multirange, bigint) TO epistream_app;

-- The incarnation of the topic the marks were made on: the broker's topic id (a topic deleted and
-- created again gets a new one). NULL until the ingest worker's tick has read it; marks of another
-- incarnation are forgotten (epistream/storage/watermarks.py), whatever their offsets.
ALTER TABLE memory.ingest_watermarks ADD COLUMN IF NOT EXISTS topic_id text;
