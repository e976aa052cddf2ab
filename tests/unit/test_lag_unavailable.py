"""Consumer lag that cannot be read is counted every time and said (rate-limited), never swallowed:
without it the stall guard and the stale-mark check are off (issue 39)."""

from __future__ import annotations

import asyncio
import logging

from epistream.core.metrics import Metrics, sample_sum
from epistream.messaging import kafka_io
from epistream.settings.processes import Settings


def test_an_unreadable_lag_is_counted_each_time_and_warned_about_once_in_a_while(monkeypatch, caplog):
    async def refused(settings, group, topics):  # type: ignore[no-untyped-def]
        raise PermissionError("GROUP_AUTHORIZATION_FAILED")

    monkeypatch.setattr(kafka_io, "partition_lag", refused)
    monkeypatch.setattr(kafka_io, "_lag_warned", {})
    metrics = Metrics.create()
    with caplog.at_level(logging.WARNING, logger=kafka_io.__name__):
        for _ in range(3):
            assert asyncio.run(kafka_io.report_lag(Settings(), metrics, "g", ["t"])) is None
    samples = [s for family in metrics.registry.collect() for s in family.samples]
    assert sample_sum(samples, "epistream_task_failures_total", task="consumer_lag",
                      error_class="PermissionError") == 3
    warnings = [r for r in caplog.records if "consumer lag of g unavailable" in r.getMessage()]
    assert len(warnings) == 1 and "stall guard" in warnings[0].getMessage()
