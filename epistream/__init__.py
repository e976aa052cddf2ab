"""epistream: streaming episodic memory for LLM agents (shared core).

`pipeline` (the Faust indexer) and `consumers` (the answer path) both import
this package; it never imports them.
"""

__version__ = "0.1.0"
