"""The integration tests' fixtures and tiers come from the plugin epistream.testing.stack_fixtures (loaded
for the whole session by pyproject's pytest addopts, so bench/tests shares them); its helpers are here
under the names the tests import."""

from epistream.testing.databases import drop_database, own_database  # noqa: F401 (imported from here by the tests)
from epistream.testing.stack_fixtures import ROOT, count_turns, read_topic, wait_for  # noqa: F401
