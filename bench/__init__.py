"""Benchmarks of the ingest path (``python -m bench.run``).

Measures, on the same texts and in the same run, the end-to-end ingest rate
(Kafka -> Faust worker -> ONNX embedding -> PostgreSQL upsert), the embedding
model's own rate and a plain COPY of the finished rows, and reports ratios:
absolute numbers on a shared 2-core machine are noisy, ratios much less so.
"""
