"""Clock holds: while one is active, the ticker publishes no ``clock.tick``.

``engram import`` takes a hold on the destination while it publishes an agent's log,
so that no tick of the destination's clock lands among the imported events (a tick
joins the log of every agent of its partition: see :mod:`streams.ticker`).

A hold is a record on the clock topic (``engram.clock``, one partition): key = the
hold's id, value = JSON ``{"until": epoch seconds, "by": "who holds it"}``; the last
record of a key is the hold. It is active while ``until`` is in the future (compared
with the reader's clock: the machines' clocks are taken to agree within seconds), so
a hold whose holder died lapses by itself; releasing it writes ``until`` 0. The
fold never reads this topic: ticks stay facts of the log, and a replay meets exactly
the ticks that were published.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer

from sinks.clients import partitions_of, started
from streams.logwriter import LogWriter, Record

CLOCK_TOPIC = "engram.clock"


@dataclass(frozen=True)
class Hold:
    """One hold: its id, until when (epoch seconds) and by whom."""

    hold_id: str
    until: float
    by: str


def encode_hold(hold: Hold) -> Record:
    value = json.dumps({"until": hold.until, "by": hold.by}).encode()
    return Record(hold.hold_id.encode(), value, partition=0)


def decode_hold(key: bytes | None, value: bytes | None) -> Hold | None:
    """The hold a record writes; None for bytes that are not one (a hold nobody can
    read must not stop the clock)."""
    try:
        data = json.loads(value or b"")
        return Hold((key or b"").decode(), float(data["until"]), str(data.get("by", "?")))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def active(holds: Iterable[Hold], now: float) -> list[Hold]:
    """The holds still in force at ``now``: the last record of each id, if its
    ``until`` is later than ``now``."""
    last = {hold.hold_id: hold for hold in holds}
    return [hold for hold in last.values() if hold.until > now]


async def read_holds(bootstrap: str, topic: str = CLOCK_TOPIC) -> list[Hold]:
    """Every hold record of ``topic``, in log order (none when the topic does not
    exist). Read from the start until a fetch brings nothing: the embedded broker's
    end offsets can stop at the last batch's first record, and a hold is one record."""
    consumer = await started(
        AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=100
        )
    )
    try:
        tps = await partitions_of(consumer, topic)
        if not tps:
            return []
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        holds: list[Hold] = []
        while fetched := await consumer.getmany(timeout_ms=500, max_records=10_000):
            for records in fetched.values():
                holds += filter(None, (decode_hold(r.key, r.value) for r in records))
        return holds
    finally:
        await consumer.stop()


async def write_hold(bootstrap: str, hold: Hold, topic: str = CLOCK_TOPIC) -> None:
    """Write ``hold`` (``until`` 0 releases it); raises if it is not acknowledged."""
    writer = LogWriter(bootstrap)
    try:
        await writer.send(topic, [encode_hold(hold)])
    finally:
        await writer.stop()
