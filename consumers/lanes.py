"""The answer worker's two lanes: questions that call no model (`context` reads, listings) and those
that do, each with its own bound, so a burst of deep questions cannot take the slots a read needs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Literal

from epistream.contracts.questions import Mode, Question
from epistream.core.metrics import Metrics

Lane = Literal["read", "model"]


def lane_of(question: Question) -> Lane:
    return "read" if question.listing is not None or question.mode is Mode.CONTEXT else "model"


class Lanes:
    """One semaphore per lane; `slot(question)` holds one of its lane's while the question is read or answered."""

    def __init__(self, *, reads: int, model: int, metrics: Metrics) -> None:
        self._bounds: dict[Lane, asyncio.Semaphore] = {"read": asyncio.Semaphore(reads),
                                                       "model": asyncio.Semaphore(model)}
        self._metrics = metrics

    @asynccontextmanager
    async def slot(self, question: Question) -> AsyncIterator[None]:
        lane = lane_of(question)
        asked = time.perf_counter()
        async with self._bounds[lane]:
            self._metrics.answer_slot_wait_seconds.labels(lane).observe(time.perf_counter() - asked)
            in_flight = self._metrics.answer_in_flight.labels(lane)
            in_flight.inc()
            try:
                yield
            finally:
                in_flight.dec()
