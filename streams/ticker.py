"""The ticker: ``clock.tick`` on every partition of ``engram.events``, so that
forgetting and idle cut-offs are decided by the log, not by the clock of whoever
replays it. Only the group's leader ticks (one tick per interval per partition),
and not while a clock hold is active (:mod:`streams.holds`: an import is running)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import faust

from schemas import ClockTicked, Codec, TickBody
from streams.holds import Hold, active, read_holds
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
    app: faust.App,
    *,
    topic: str,
    bootstrap: str,
    interval_s: float,
    codec: Codec,
    holds_topic: str | None = None,
) -> None:
    """Publish a tick to every partition of ``topic`` every ``interval_s`` seconds
    (a short-lived producer per tick: ticks are rare), but none while a hold of
    ``holds_topic`` is active; a tick held back is not made up later."""
    told: set[str] = set()

    def held(holds: list[Hold]) -> None:
        for hold in holds:
            if hold.hold_id not in told:
                log.info("clock held by %s: no clock.tick until it is released", hold.by)
        if told and not holds:
            log.info("clock holds released: ticking again")
        told.clear()
        told.update(hold.hold_id for hold in holds)

    @app.timer(interval_s, on_leader=True)  # type: ignore[untyped-decorator]  # faust: untyped
    async def tick() -> None:
        try:
            await publish_ticks(bootstrap, topic, interval_s, codec, holds_topic, held)
        except Exception as error:  # the next tick comes anyway; say why this one did not
            log.warning("clock.tick not published: %r", error)


async def publish_ticks(
    bootstrap: str,
    topic: str,
    interval_s: float,
    codec: Codec,
    holds_topic: str | None = None,
    on_holds: Callable[[list[Hold]], None] | None = None,
) -> bool:
    """One tick now on every partition of ``topic``, as the ticker publishes it each
    ``interval_s`` (with a producer of its own), unless a hold of ``holds_topic`` is
    active (``on_holds`` is told the active ones, none included); return whether it
    ticked. Raises if the ticks are not acknowledged, or the holds cannot be read.

    The holds are read last, once the producer is ready, so that a tick is sent within
    one produce request of reading that no hold was active: an import that takes a
    hold waits a settle (:data:`engram.clock.SETTLE_S`) for such a tick to land
    before it sends its first event."""
    writer = LogWriter(bootstrap)
    try:
        producer = await writer.start()
        count = len(await producer.partitions_for(topic))
        holds = [] if holds_topic is None else await read_holds(bootstrap, holds_topic)
        now = active(holds, time.time())
        if on_holds is not None:
            on_holds(now)
        if now:
            return False
        records = [
            Record(None, codec.encode(t), partition=t.body.partition)
            for t in ticks(count, interval_s, datetime.now(UTC))
        ]
        await writer.send(topic, records)
        return True
    finally:
        await writer.stop()
