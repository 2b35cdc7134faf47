"""Restore the raw log from the ClickHouse archive into an empty embedded broker.

The embedded broker keeps its log in memory, so the ``events`` table doubles as
the archive: on a start with an empty ``engram.events`` and a non-empty archive,
every archived event is published again, per agent in sequence order, keyed by
agent (so each agent's events land in one partition, in order) and stamped with
its event time. Folding the restored log assigns the same sequence numbers again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from sinks.clickhouse import ClickHouseHistory

Progress = Callable[[int, int], None]


async def topic_is_empty(bootstrap: str, topic: str) -> bool:
    # Subscribed, the consumer waits for the topic's metadata when it starts; ``topics()``
    # would fetch it without keeping it, and no partition would count as empty.
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        if not partitions:
            raise RuntimeError(f"no partitions known for {topic!r}: cannot tell if it is empty")
        tps = [TopicPartition(topic, p) for p in partitions]
        ends = await consumer.end_offsets(tps) if tps else {}
        return all(offset == 0 for offset in ends.values())
    finally:
        await consumer.stop()


async def restore_log(
    bootstrap: str, topic: str, history: ClickHouseHistory, progress: Progress | None = None
) -> int:
    """Publish the archive into ``topic`` if it is empty; return how many events."""
    total = history.count_events()
    if total == 0 or not await topic_is_empty(bootstrap, topic):
        return 0
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    done = 0
    pending: list[asyncio.Future[object]] = []
    try:
        for row in history.archive():
            pending.append(
                await producer.send(
                    topic,
                    key=row.agent_id.encode(),
                    value=row.payload,
                    timestamp_ms=int(row.occurred_at.timestamp() * 1000),
                )
            )
            done += 1
            if len(pending) >= 5000:
                await asyncio.gather(*pending)
                pending.clear()
                if progress:
                    progress(done, total)
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    if progress:
        progress(done, total)
    return done
