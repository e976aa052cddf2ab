-- timestamptz keeps the instant, not the speaker's UTC offset; relative dates
-- ("yesterday") resolve against the speaker's local day, so keep the offset too.
ALTER TABLE memory.turns ADD COLUMN IF NOT EXISTS tz_offset_s integer NOT NULL DEFAULT 0;
