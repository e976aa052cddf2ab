"""Benchmarks of epistream, each a command that writes its JSON and PNG to bench/results/ (one page each
in docs/benchmarks/; finished experiments are told in docs/experiments.md, their code kept by git):

  python -m bench.run            ingest (end to end, beside the embedding model alone and a plain COPY of
                                 the same rows), then enrichment (LoCoMo streamed at a steady rate, beside
                                 the model server's own speed on the same request)
  python -m bench.faults         the fault-injection suite: every turn stored once, nothing lost, after each fault
  python -m bench.budget_recall  evidence recall of each retrieval system at equal token budgets
  python -m bench.locomo_eval    the LoCoMo evaluation: answers, router recall, baselines
  python -m bench.scale          one memory grown to 10K-1M turns: load rate, disk, read latency and recall

Ratios measured side by side in one run are the figures to trust: absolute times on a shared 2-core
machine are noisy. Their tests are in bench/tests; what they share with tests/ is in epistream.testing.
"""
