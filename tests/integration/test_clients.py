"""aiokafka clients that fail to start are not left behind (:mod:`sinks.clients`): real
aiokafka clients, pointed at a port where no broker listens, as while a broker is away.
And what engram's writers write, on the session broker: :class:`streams.logwriter.LogWriter`
and the client's direct mode (partitions, order, CreateTime).

A client left unclosed says so when it is collected (a ResourceWarning, and aiokafka's
``Unclosed AIOKafkaProducer`` at ERROR level): each test runs its attempts in an event
loop of its own and collects the garbage once the loop has ended."""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
import warnings
from collections.abc import Callable, Coroutine
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError
from aiokafka.partitioner import murmur2

from engram import Memory
from engram.settings import Settings
from ops.net import free_port
from ops.topics import KEEP_FOREVER, TopicSpec, ensure_topics, read_to_end
from schemas import Codec, InteractionBody, InteractionRecorded
from sinks.clients import started
from sinks.keys import KafkaKeyring, MasterKey
from streams.logwriter import LogWriter, Record

pytestmark = pytest.mark.integration


def nowhere() -> str:
    return f"127.0.0.1:{free_port()}"


def unclosed(attempts: Callable[[], Coroutine[Any, Any, None]]) -> list[str]:
    """The aiokafka clients ``attempts`` left unclosed, once its loop ended."""
    gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        asyncio.run(attempts())
        gc.collect()
    return [str(w.message)[:40] for w in caught if "Unclosed AIOKafka" in str(w.message)]


def test_a_client_that_does_not_start_is_closed() -> None:
    async def attempts() -> None:
        for client in (
            AIOKafkaProducer(bootstrap_servers=nowhere()),
            AIOKafkaConsumer(bootstrap_servers=nowhere()),
            AIOKafkaAdminClient(bootstrap_servers=nowhere()),
        ):
            with pytest.raises(KafkaConnectionError):
                await started(client)
            assert client._closed, type(client).__name__

    assert unclosed(attempts) == []


def test_a_writer_retried_while_the_broker_is_away_leaves_no_client() -> None:
    writer = LogWriter(nowhere())

    async def attempts() -> None:
        for _ in range(3):  # as the worker's retry in place calls it again
            with pytest.raises(KafkaConnectionError):
                await writer.start()

    assert unclosed(attempts) == []
    assert writer.producer is None


def test_a_keyring_that_does_not_start_keeps_no_client() -> None:
    ring = KafkaKeyring(nowhere(), "engram.keys", MasterKey(bytes(32)))

    async def attempts() -> None:
        for _ in range(2):
            with pytest.raises(KafkaConnectionError):
                await ring.start()

    assert unclosed(attempts) == []
    assert ring._consumer is None and ring._producer is None


@pytest.mark.parametrize("one_per_batch", [True, False])
def test_a_writer_writes_partitions_side_by_side_each_in_order(
    broker: str, one_per_batch: bool
) -> None:
    """Records of several partitions, several batches in each (one record a batch, as
    the state changelog is written, or batches filled to their limit): each partition
    holds its records in the order given, and ``send`` reports each partition's end."""
    topic = f"engram.test.writer.{uuid.uuid4().hex[:8]}"
    big = 400_000  # three of these fill aiokafka's 1 MiB batch: several batches a partition
    records = [
        Record(
            f"k{i}".encode(),
            f"{i}:".encode() + b"x" * (10 if one_per_batch else big),
            None,
            partition=i % 4,
        )
        for i in range(24)
    ]

    async def write_and_read() -> tuple[dict[int, int], dict[int, list[int]]]:
        await ensure_topics(broker, [TopicSpec(topic, 4, KEEP_FOREVER)])
        writer = LogWriter(broker)
        try:
            ends = await writer.send(topic, records, one_per_batch=one_per_batch)
        finally:
            await writer.stop()
        read: dict[int, list[int]] = {}

        def each(batch: list[Any]) -> None:
            for r in batch:
                read.setdefault(r.partition, []).append(int(r.value.split(b":")[0]))

        await read_to_end(broker, topic, each)
        return ends, read

    ends, read = asyncio.run(write_and_read())
    assert read == {p: list(range(p, 24, 4)) for p in range(4)}
    assert ends == {p: 6 for p in range(4)}


def test_a_writer_gives_each_record_its_timestamp_in_milliseconds(broker: str) -> None:
    """A record's ``timestamp_ms`` is its CreateTime as written: aiokafka's batch
    builder takes milliseconds (a float of seconds was written as that many
    milliseconds, a CreateTime in January 1970). No timestamp: the time of writing."""
    topic = f"engram.test.stamps.{uuid.uuid4().hex[:8]}"
    stamps = [1_761_955_200_123, 1, 253_402_300_799_999]  # 2025-11-01, the epoch's 1 ms, 9999

    async def write_and_read() -> list[tuple[bytes, int]]:
        await ensure_topics(broker, [TopicSpec(topic, 1, KEEP_FOREVER)])
        writer = LogWriter(broker)
        try:
            records = [Record(f"k{i}".encode(), b"v", at) for i, at in enumerate(stamps)]
            await writer.send(topic, [*records, Record(b"now", b"v")])
        finally:
            await writer.stop()
        read: list[tuple[bytes, int]] = []
        await read_to_end(
            broker, topic, lambda batch: read.extend((r.key, r.timestamp) for r in batch)
        )
        return read

    before = int(time.time() * 1000)
    read = asyncio.run(write_and_read())
    assert read[:3] == [(f"k{i}".encode(), at) for i, at in enumerate(stamps)]
    assert read[3][0] == b"now" and before <= read[3][1] <= int(time.time() * 1000)


def test_a_client_writes_each_event_to_its_agents_partition_in_order_at_its_time(
    broker: str, tmp_path: Path
) -> None:
    """``Memory.publish_many`` in direct mode writes record batches per partition: each
    event lands in the partition Kafka's default partitioner gives its agent id (as
    any Kafka client keyed by agent would put it), each agent's events in the order
    given, each with its ``occurred_at`` as CreateTime."""
    topic = f"engram.test.client.{uuid.uuid4().hex[:8]}"
    settings = replace(
        Settings.from_env({"ENGRAM_HOME": str(tmp_path), "ENGRAM_SEAL": "off"}),
        events_topic=topic,
    )
    start = datetime(2026, 11, 1, tzinfo=UTC)
    events = [
        InteractionRecorded(
            event_id=uuid.uuid4(),
            agent_id=f"agent-{i % 7}",
            session_id="s",
            occurred_at=start + timedelta(milliseconds=37 * i),
            body=InteractionBody(role="user", content=f"turn {i} " + "x" * (i % 300)),
        )
        for i in range(600)
    ]

    async def read() -> list[Any]:
        out: list[Any] = []
        await read_to_end(broker, topic, out.extend)
        return out

    asyncio.run(ensure_topics(broker, [TopicSpec(topic, 6, KEEP_FOREVER)]))
    with Memory(bootstrap=broker, settings=settings) as memory:
        memory.publish_many(events)
    records = asyncio.run(read())
    codec = Codec()
    position = {e.event_id: i for i, e in enumerate(events)}
    read_events = [codec.decode(r.value) for r in records]
    assert sorted(position[e.event_id] for e in read_events) == list(range(len(events)))
    assert all(e == events[position[e.event_id]] for e in read_events)
    for r, event in zip(records, read_events, strict=True):
        assert r.key == event.agent_id.encode()
        assert r.partition == (murmur2(r.key) & 0x7FFFFFFF) % 6
        assert r.timestamp == int(event.occurred_at.timestamp() * 1000)
    by_agent: dict[bytes, list[int]] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        by_agent.setdefault(r.key, []).append(position[codec.decode(r.value).event_id])
    assert len(by_agent) == 7
    assert all(order == sorted(order) for order in by_agent.values())
