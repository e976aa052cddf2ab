"""The integration tests' fixtures and tiers come from the plugin epistream.testing.stack_fixtures (loaded
for the whole session by pyproject's pytest addopts, so bench/tests shares them); its helpers are here
under the names the tests import."""

from epistream.testing.stack_fixtures import (  # noqa: F401 (imported from here by the tests)
    ROOT,
    count_turns,
    drop_database,
    own_database,
    read_topic,
    wait_for,
)
