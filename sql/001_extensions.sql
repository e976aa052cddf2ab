-- Extensions the memory needs. pg_textsearch (BM25) is optional: used where installed.
CREATE EXTENSION IF NOT EXISTS vector;
CREATE EXTENSION IF NOT EXISTS age;
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_textsearch') THEN
    BEGIN
      CREATE EXTENSION IF NOT EXISTS pg_textsearch;
    EXCEPTION WHEN OTHERS THEN
      -- It must be in shared_preload_libraries; without it, full-text search still works.
      RAISE NOTICE 'pg_textsearch not enabled: %', SQLERRM;
    END;
  END IF;
END $$;
