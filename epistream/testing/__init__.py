"""What the tests and the benchmarks share, and the product never imports (an import-linter contract):
the test stack's pytest fixtures (:mod:`.stack_fixtures`, loaded with ``-p`` for the whole session), a
scripted OpenAI-compatible server (:mod:`.scripted_llm`), the hostile-input corpus (:mod:`.hostile`) and
turn makers (:mod:`.turns`). Not shipped in the wheel (pyproject's packages.find excludes it)."""
