"""What the indexer keeps in PostgreSQL, one module per table family: turns,
segments (with the segmenter's state and the outbox), memory (gists, facts,
entities), the AGE graph, tombstones, and forgetting."""
