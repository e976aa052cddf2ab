"""The Faust streaming indexer: turns in, searchable memory out."""
