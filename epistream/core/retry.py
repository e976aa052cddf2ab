"""One backoff policy and one retry loop for every worker: exponential waits with jitter
under a cap, for a bounded number of attempts, until a deadline, or until it works.

The callers keep their own numbers (the ingest store and the answer worker wait up to 30 s
and never give up; a model call tries `max_retries + 1` times) as parameters of the policy.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from epistream.errors import is_transient

T = TypeVar("T")

Sleep = Callable[[float], Awaitable[None]]
#: Told of each failure that will be retried: the error, the attempt that failed (1-based), the wait.
OnRetry = Callable[[BaseException, int, float], None]


@dataclass(frozen=True)
class Backoff:
    """The wait after failed attempt n: ``min(cap_s, first_s * 2**(n-1)) * jitter`` with the
    jitter drawn uniformly from ``[jitter_low, jitter_high)`` (equal bounds: no jitter)."""

    first_s: float
    cap_s: float = math.inf
    jitter_low: float = 0.5
    jitter_high: float = 1.0
    # Past this many doublings the cap has long won; stopping here keeps 2**n a small number.
    max_doublings: int = 30

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        grown = min(self.cap_s, self.first_s * 2 ** min(max(attempt - 1, 0), self.max_doublings))
        return grown * (self.jitter_low + (self.jitter_high - self.jitter_low) * rand())

    async def wait(self, attempt: int, sleep: Sleep = asyncio.sleep) -> None:
        await sleep(self.delay(attempt))


#: The ingest store and the answer worker: never skip a record; wait 1 s, 2 s, 4 s ... up to 30 s,
#: each wait shortened by up to half (jitter) so blocked partitions do not retry in step.
BLOCKING = Backoff(first_s=1.0, cap_s=30.0, jitter_low=0.5, jitter_high=1.0, max_doublings=5)


async def retry(
    operation: Callable[[], Awaitable[T]],
    *,
    backoff: Backoff,
    retry_on: Callable[[BaseException], bool] = is_transient,
    attempts: int | None = None,
    within_s: float | None = None,
    stop: Callable[[], bool] | None = None,
    on_retry: OnRetry | None = None,
    sleep: Sleep = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
    rand: Callable[[], float] = random.random,
) -> T:
    """Run ``operation`` until it returns, retrying the failures ``retry_on`` accepts.

    Gives up (re-raising the last failure) after ``attempts`` tries when given, when the next wait
    would end past ``within_s`` from the start when given, or when ``stop()`` turns true
    (checked after ``on_retry`` has been told, before the wait). Other failures propagate at once.
    """
    deadline = None if within_s is None else clock() + within_s
    attempt = 0
    while True:
        attempt += 1
        try:
            return await operation()
        except Exception as exc:
            if not retry_on(exc) or (attempts is not None and attempt >= attempts):
                raise
            delay = backoff.delay(attempt, rand)
            if deadline is not None and clock() + delay > deadline:
                raise
            if on_retry is not None:
                on_retry(exc, attempt, delay)
            if stop is not None and stop():
                raise
            await sleep(delay)
