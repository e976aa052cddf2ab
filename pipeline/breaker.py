"""A circuit breaker for the extractor model: an outage pauses enrichment instead of failing
every segment closed during it.

closed     calls go through.
open       a call found the model unavailable: no call until the backoff has passed.
half-open  the backoff has passed: one call is let through as a probe; if the model answers
           the breaker closes, if not it opens again with a longer backoff.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from epistream.core.retry import Backoff

#: The first pause, doubled per failed probe up to five minutes, with jitter.
DEFAULT_BACKOFF = Backoff(first_s=5.0, cap_s=300.0, jitter_low=0.5, jitter_high=1.0)


class CircuitBreaker:
    def __init__(self, backoff: Backoff = DEFAULT_BACKOFF, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._backoff = backoff
        self._clock = clock
        self._failures = 0  # consecutive outages seen; 0: closed
        self._retry_at = 0.0
        self._probing = False

    @property
    def is_open(self) -> bool:
        return self._failures > 0

    def allows_call(self) -> bool:
        """Whether a model call may be made now (without claiming the probe)."""
        return not self.is_open or (not self._probing and self._clock() >= self._retry_at)

    def acquire(self) -> bool:
        """Claim the right to call: always while closed; once open, only the one probe after the backoff."""
        if not self.is_open:
            return True
        if self._probing or self._clock() < self._retry_at:
            return False
        self._probing = True
        return True

    def succeeded(self) -> None:
        """The model answered (even with output that failed validation): it is up."""
        self._failures, self._probing = 0, False

    def failed(self) -> None:
        """The model was unavailable: open (again), for a longer pause each time."""
        self._failures += 1
        self._probing = False
        self._retry_at = self._clock() + self._backoff.delay(self._failures)

    def abandoned(self) -> None:
        """A claimed call ended without telling (cancelled): let the next caller probe."""
        self._probing = False
