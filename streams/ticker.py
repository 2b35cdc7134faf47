"""The ticker: ``clock.tick`` on every partition of ``engram.events``, so that
forgetting and idle cut-offs are decided by the log, not by the clock of whoever
replays it. Only the group's leader ticks (one tick per interval per partition)."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime

import faust

from schemas import ClockTicked, Codec, TickBody
from streams.logwriter import LogWriter, Record
from streams.pipeline import CLOCK_AGENT

log = logging.getLogger("engram.streams")


def ticks(partitions: int, interval_s: float, at: datetime) -> list[ClockTicked]:
    """One tick per partition at ``at`` (fresh ids: each tick is a new fact)."""
    return [
        ClockTicked(
            event_id=uuid.uuid4(),
            agent_id=CLOCK_AGENT,
            occurred_at=at,
            body=TickBody(partition=p, interval_s=interval_s),
        )
        for p in range(partitions)
    ]


def register_ticker(
    app: faust.App, *, topic: str, bootstrap: str, interval_s: float, codec: Codec
) -> None:
    """Publish a tick to every partition of ``topic`` every ``interval_s`` seconds
    (a short-lived producer per tick: ticks are rare)."""

    @app.timer(interval_s, on_leader=True)  # type: ignore[untyped-decorator]  # faust: untyped
    async def tick() -> None:
        try:
            await publish_ticks(bootstrap, topic, interval_s, codec)
        except Exception as error:  # the next tick comes anyway; say why this one did not
            log.warning("clock.tick not published: %r", error)


async def publish_ticks(bootstrap: str, topic: str, interval_s: float, codec: Codec) -> None:
    """One tick now on every partition of ``topic``, as the ticker publishes it each
    ``interval_s`` (with a producer of its own); raises if it is not acknowledged."""
    writer = LogWriter(bootstrap)
    try:
        producer = await writer.start()
        count = len(await producer.partitions_for(topic))
        records = [
            Record(None, codec.encode(t), partition=t.body.partition)
            for t in ticks(count, interval_s, datetime.now(UTC))
        ]
        await writer.send(topic, records)
    finally:
        await writer.stop()
