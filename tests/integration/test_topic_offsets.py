"""The readers of a topic's offsets outside the worker (``engram status``, ``engram
dead-letters``) on the session broker, Tansu or Apache Kafka: they learn the topic's
partitions from a full metadata fetch (Apache Kafka answers a fresh client's bootstrap
with no topic, so the consumer's own view knew none and the dead letters listed
nothing there), and ask the offsets on a consumer that fetches nothing."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaProducer

from engram.letters import Opener, read_dead_letters
from engram.status import REASON_HEADER, dead_letters, partition_bounds
from ops.topics import TopicSpec, ensure_topics

pytestmark = pytest.mark.integration


async def letters_topic(broker: str, reasons: list[str]) -> str:
    """A fresh topic of three partitions holding one record per reason, in order."""
    topic = f"engram.test.letters-{uuid.uuid4().hex[:8]}"
    await ensure_topics(broker, [TopicSpec(topic, 3, {})])
    producer = AIOKafkaProducer(bootstrap_servers=broker, acks="all")
    await producer.start()
    try:
        for n, reason in enumerate(reasons):
            header = [(REASON_HEADER, reason.encode())]
            await producer.send_and_wait(topic, b"not an event", partition=n % 3, headers=header)
    finally:
        await producer.stop()
    return topic


def test_status_and_dead_letters_read_every_partition(broker: str) -> None:
    reasons = [f"reason {n}" for n in range(7)]

    async def scenario() -> None:
        topic = await letters_topic(broker, reasons)
        partitions, starts, ends = await partition_bounds(broker, [topic])
        assert sorted(tp.partition for tp in partitions) == [0, 1, 2]
        assert sum(ends[tp] - starts[tp] for tp in partitions) == 7
        summary = await dead_letters(broker, topic)
        assert summary.count == 7
        assert summary.last_reason in {"reason 4", "reason 5", "reason 6"}  # the newest
        letters = await read_dead_letters(broker, topic, Opener(None, None), limit=20)
        assert sorted(v.reason or "" for v in letters) == reasons
        assert {v.state for v in letters} == {"clear"}  # not sealed: read as they are
        newest = await read_dead_letters(broker, topic, Opener(None, None), limit=2)
        assert len(newest) == 2
        assert (
            await read_dead_letters(broker, "engram.test.no-such-topic", Opener(None, None)) == []
        )
        assert (await dead_letters(broker, "engram.test.no-such-topic")).count == 0

    asyncio.run(scenario())
