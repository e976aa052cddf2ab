"""PostgreSQL: the connection pool, migrations, and the ingest watermarks of read-your-own-writes."""
