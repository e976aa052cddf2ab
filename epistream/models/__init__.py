"""The models: structured calls to an OpenAI-compatible server, the prompt registry, the in-process
embedder, its model cards, and the files they come from (Maven Central)."""
