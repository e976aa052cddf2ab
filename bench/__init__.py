"""Benchmarks of epistream (``python -m bench.run``): ingest, then enrichment.

Ingest measures, on the same texts and in the same run, the end-to-end ingest
rate (Kafka -> Faust worker -> ONNX embedding -> PostgreSQL upsert), the
embedding model's own rate and a plain COPY of the finished rows. Enrichment
streams LoCoMo at a steady rate and measures segments, gists, facts, model
calls and latencies, next to the model server's own speed on the same request.
Both report ratios where they can: absolute numbers on a shared 2-core
machine are noisy, ratios much less so.
"""
