"""The scale benchmark (``python -m bench.scale``): one growing memory of the :mod:`bench.workload_scale`
1M-turn workload, measured as it passes each size (10K, 100K, 1M turns): bulk load rate and index
cost, disk bytes per turn, and the read latency and index recall of the context read's fused turn
search for a tenant of many conversations and for one large conversation.

The sizes are prefixes of one produce-ordered stream, so each point is the same memory at a later
moment, as a user's grows; its embeddings are computed once (:mod:`bench.scale.vectors`), resumably,
because embedding a million turns takes hours on two cores.
"""
