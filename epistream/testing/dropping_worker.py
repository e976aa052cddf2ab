"""A Faust worker that drops records as Faust can around a rebalance (the first delivery of each record
is neither handled nor acknowledged), guarded as the workers are (pipeline/redelivery.py). The test of
the guard runs it as a process, on the real broker, and expects every record handled once sought back.

    python -m epistream.testing.dropping_worker BOOTSTRAP TOPIC GROUP HANDLED_FILE STALL_S STATE_DIR [always|never]

Each handled record's value is appended as a line to HANDLED_FILE; each verdict but "ok" is logged.
With `always`, every delivery is dropped: a consumer the seek cannot help, which must end its process;
with `never`, none is: a plain guarded worker.
"""

from __future__ import annotations

import functools
import logging
import sys
from pathlib import Path
from typing import cast

import faust

from epistream.core.metrics import Metrics
from epistream.messaging.kafka_io import faust_broker_options, faust_datadir, records_between, report_lag
from epistream.pipeline.redelivery import StallGuard, seek_back_if_stalled
from epistream.settings.processes import Settings

log = logging.getLogger("dropping_worker")


def create_app(settings: Settings, topic: str, group: str, handled: Path, stall_s: float, *,
               always: bool = False, never: bool = False) -> faust.App:
    app = faust.App(group, **faust_broker_options(settings), store="memory://", web_enabled=False,
                    autodiscover=False, consumer_auto_offset_reset="earliest", topic_allow_declare=False,
                    topic_disable_leader=True, datadir=faust_datadir(settings, group))
    source = app.topic(topic, key_serializer="raw", value_serializer="raw")
    guard = StallGuard(stall_s=stall_s)
    metrics = Metrics.create()
    dropped: set[tuple[int, int]] = set()

    @app.agent(source)
    async def handle(stream: faust.StreamT[bytes]) -> None:
        manual = cast("faust.Stream[bytes]", stream).noack()
        async for event in manual.events():
            where = (event.message.partition, event.message.offset)
            if always or (not never and where not in dropped):
                dropped.add(where)  # neither handled nor acknowledged, and not in flight
                continue
            with guard.handling([(event.message.topic, event.message.partition)]):
                with handled.open("a") as out:
                    out.write(bytes(event.value).decode() + "\n")
                await manual.ack(event)

    @app.timer(interval=1.0)
    async def watch() -> None:
        lag = await report_lag(settings, metrics, group, [topic])
        verdict = await seek_back_if_stalled(
            app, guard, lag, metrics, functools.partial(records_between, settings))
        if verdict != "ok":
            log.warning("verdict: %s", verdict)

    return app


def main(argv: list[str]) -> None:
    bootstrap, topic, group, handled, stall_s, state_dir = argv[:6]
    settings = Settings().with_overrides(kafka_bootstrap=bootstrap, home=Path(state_dir))
    app = create_app(settings, topic, group, Path(handled), float(stall_s), always=argv[6:] == ["always"],
                     never=argv[6:] == ["never"])
    faust.Worker(app, loglevel="INFO", quiet=True).execute_from_commandline()


if __name__ == "__main__":
    main(sys.argv[1:])
