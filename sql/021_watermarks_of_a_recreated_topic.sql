-- Read-your-own-writes after a topic is deleted and created again (docs/read-your-writes.md): a mark
-- beyond its partition's end offset was made by the earlier incarnation, and would call this one's
-- unstored turns stored. The ingest worker sets such a mark to -1, "nothing stored yet"
-- (epistream/storage/watermarks.py); the next chunk it stores raises it again.
ALTER TABLE memory.ingest_watermarks
    DROP CONSTRAINT IF EXISTS ingest_watermarks_stored_through_check,
    ADD CONSTRAINT ingest_watermarks_stored_through_check CHECK (stored_through >= -1);
