"""The read-latency benchmark's own logic: the closed loop, the worker's profile, the goals."""

from __future__ import annotations

import asyncio

from bench.reads import closed_loop, goals, worker_profile


def test_the_closed_loop_runs_exactly_the_reads_asked_with_at_most_the_callers_at_once():
    running, most, asked = [0], [0], []

    async def read(text: str) -> float | None:
        running[0] += 1
        most[0] = max(most[0], running[0])
        asked.append(text)
        await asyncio.sleep(0.001)
        running[0] -= 1
        return 5.0

    timings = asyncio.run(closed_loop(read, ["a", "b", "c"], callers=4, reads=30))
    summary = timings.summary()
    assert len(asked) == 30 and most[0] == 4 and set(asked) == {"a", "b", "c"}
    assert summary["reads"] == 30 and summary["worker_p95_ms"] == 5.0 and summary["reads_per_s"] > 0


def test_the_worker_profile_is_the_mean_of_each_step_between_two_scrapes():
    before = {"slot_wait_read": (1.0, 10), "context_read": (2.0, 10), "publish_transaction": (0.5, 5)}
    after = {"slot_wait_read": (1.01, 20), "context_read": (2.2, 20), "publish_transaction": (0.55, 9)}
    profile = worker_profile(before, after)
    assert profile == {"slot_wait_read_mean_ms": 1.0, "context_read_mean_ms": 20.0,
                       "publish_transaction_mean_ms": 12.5, "transactions": 4}
    assert worker_profile(None, after) == {}


def _entry(p95: float, rate: float) -> dict:
    return {"p50_ms": p95 / 2, "p95_ms": p95, "reads_per_s": rate}


def test_the_goals_compare_the_caller_with_the_machines_own_capacity():
    result = {"in_process": {"concurrent_8": _entry(100, 80)},
              "caller": {"idle": _entry(40, 25), "concurrent_8": _entry(150, 64), "under_load": _entry(201, 10)},
              "mcp": {"concurrent_8": _entry(180, 54)}}
    met = goals(result)
    assert met["caller.idle p95 <= 40 ms"] and met["caller.concurrent_8 reads/s >= 0.8 x in_process"]
    assert met["caller.concurrent_8 p95 <= 1.5 x in_process"] and met["mcp.concurrent_8 within 1.2 x caller"]
    assert not met["caller.under_load p95 <= 200 ms"]


def test_a_profile_counts_each_sample_by_its_innermost_known_frame():
    from bench.py_spy import shares

    collapsed = "\n".join([
        "run (asyncio/base_events.py:1);getmany (aiokafka/consumer/consumer.py:2) 30",
        "run (asyncio/base_events.py:1);read_context (consumers/context.py:3);execute (psycopg/cursor.py:4) 50",
        "run (asyncio/base_events.py:1);read_context (consumers/context.py:3);pack (consumers/packing.py:5) 20",
        "garbage line",
    ])
    assert shares(collapsed) == {"PostgreSQL driver (psycopg)": 0.5, "Kafka client (aiokafka)": 0.3,
                                 "the read (consumers/)": 0.2}
