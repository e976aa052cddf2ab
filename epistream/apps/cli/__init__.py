"""The shell: the `epistream` command line and the demo. It drives the whole project (the
embedded stack in infra/, the workers in pipeline/ and consumers/, the evaluation in bench/), so
it is the one package allowed to import upward; the rest of `epistream` imports nothing of them
(pyproject.toml's import contracts, checked by `make test`)."""
