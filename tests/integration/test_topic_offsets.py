"""The readers of a topic's offsets outside the worker (``engram status``, ``engram
dead-letters``) on the session broker, Tansu or Apache Kafka: they learn the topic's
partitions from a full metadata fetch (Apache Kafka answers a fresh client's bootstrap
with no topic, so the consumer's own view knew none and the dead letters listed
nothing there), and ask the offsets on a consumer that fetches nothing."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from engram.letters import Opener, read_dead_letters
from engram.status import REASON_HEADER, dead_letters, partition_bounds
from ops.reprocess import committed_offsets
from ops.topics import TopicSpec, ensure_topics, read_to_end

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


def test_a_whole_read_and_a_groups_commits_see_every_partition(broker: str) -> None:
    """``read_to_end`` (reprocess checks, tests) and ``committed_offsets`` (which dead
    letters a reprocess writes again): on Apache Kafka both found no partition."""

    async def scenario() -> None:
        topic = await letters_topic(broker, [f"r{n}" for n in range(5)])
        records: list[object] = []
        assert await read_to_end(broker, topic, records.extend) == 5 == len(records)
        group = f"engram-test-{uuid.uuid4().hex[:8]}"
        assert await committed_offsets(broker, group, topic) == {}
        member = AIOKafkaConsumer(
            topic,
            bootstrap_servers=broker,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await member.start()
        try:
            seen = 0
            for _ in range(100):
                batch = await member.getmany(timeout_ms=500)
                seen += sum(len(rs) for rs in batch.values())
                if seen == 5:
                    break
            await member.commit()
        finally:
            await member.stop()
        assert await committed_offsets(broker, group, topic) == {0: 2, 1: 2, 2: 1}

    asyncio.run(scenario())
