"""Faust workers in one group on the real broker, while a second member joins and leaves (SIGTERM, then
SIGKILL) again and again (epistream.testing.rebalance_probe): with epistream's fix of Faust's commit
(epistream.messaging.faust_fixes), the group still commits its whole log, and commits past no record a
worker did not handle."""

from __future__ import annotations

import pytest

from epistream.testing.rebalance_probe import churn

pytestmark = pytest.mark.integration


def test_rebalances_commit_the_whole_log_and_never_past_a_record_no_worker_handled(kafka, tmp_path):
    finding = churn(kafka, tmp_path, patched=True, records=400, churn_s=18.0, up_s=4.0, down_s=2.0)
    assert finding.rebalances >= 4
    assert finding.lost == 0, finding
    assert finding.settled, finding
