-- Runs once, on an empty data directory, as the bootstrap superuser, in POSTGRES_DB.
-- epistream's own migration (sql/001_extensions.sql) then finds them present.
CREATE EXTENSION IF NOT EXISTS vector;
CREATE EXTENSION IF NOT EXISTS age;
