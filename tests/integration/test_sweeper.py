"""The ingest sweeper (``streams.ingest.Sweeper``): clear records of ``engram.ingest``
are deleted once the group has committed past them. A sweep that fails for a reason
that may pass is tried again later, with what it did not delete; only a broker that
refuses for good is asked no more. Real aiokafka clients throughout: a port where
nothing listens, the session broker, and an Apache Kafka node killed and started
again."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaTimeoutError,
    NodeNotReadyError,
    PolicyViolationError,
    RequestTimedOutError,
    TopicAuthorizationFailedError,
    UnsupportedVersionError,
)

from ops.kafka import ApacheKafka, available
from ops.net import free_port
from streams.ingest import Sweeper, gives_way
from tests.support import broker_kind

pytestmark = pytest.mark.integration
NO_KAFKA = available()


class Sent(NamedTuple):
    """What the sweeper reads of a consumed message."""

    topic: str
    partition: int
    offset: int


class Clock:
    """A clock the test moves by hand: the sweeper's waits pass without sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_only_a_lasting_refusal_stops_the_sweeps() -> None:
    for passing in (
        KafkaConnectionError("Connection at 127.0.0.1:9092 closed"),
        KafkaTimeoutError(),
        RequestTimedOutError(),
        NodeNotReadyError(),
        ConnectionRefusedError(111, "refused"),
        TimeoutError(),
    ):
        assert gives_way(passing), passing
    for lasting in (
        UnsupportedVersionError(),
        TopicAuthorizationFailedError(),
        PolicyViolationError(),
    ):
        assert not gives_way(lasting), lasting


def test_a_broker_away_is_asked_again_with_growing_waits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing listens on the port: every sweep fails to connect. The sweeper keeps
    what it was to delete, waits 1, 2, 4, … s (at most ``retry_max_s``) between tries,
    and warns once, not at every batch."""
    clock = Clock()
    topic = "engram.ingest"
    committed = {TopicPartition(topic, 0): 5, TopicPartition(topic, 1): 2}
    sweeper = Sweeper(f"127.0.0.1:{free_port()}", lambda: committed, clock=clock, retry_max_s=4.0)

    async def scenario() -> list[tuple[int, float]]:
        seen = []
        try:
            await sweeper.sweep([Sent(topic, 0, 9), Sent(topic, 1, 0)])
            seen.append((sweeper.failures, sweeper.next_try - clock.now))
            for step in (0.5, 0.5, 1.0, 1.0, 2.0, 4.0, 4.0):
                clock.now += step
                await sweeper.sweep([Sent(topic, 1, 1)])
                seen.append((sweeper.failures, sweeper.next_try - clock.now))
        finally:
            await sweeper.stop()
        return seen

    with caplog.at_level(logging.DEBUG, logger="engram.ingest"):
        seen = asyncio.run(scenario())
    # tried at 0, 1, 3, 9 and 13 s (waits of 1, 2, 4, then the cap of 4); not between
    assert [failures for failures, _ in seen] == [1, 1, 2, 2, 3, 3, 4, 5]
    assert [left for _, left in seen] == [1.0, 0.5, 2.0, 1.0, 4.0, 2.0, 4.0, 4.0]
    assert not sweeper.refused
    # bounded by the committed offsets; the second partition's end moved on
    assert sweeper.pending == {TopicPartition(topic, 0): 5, TopicPartition(topic, 1): 2}
    ours = [r for r in caplog.records if r.name == "engram.ingest"]
    assert len(ours) == 5  # one line per try
    warnings = [r for r in ours if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "trying again in 1 s" in warnings[0].getMessage()
    assert "KafkaConnectionError" in warnings[0].getMessage()


def test_nothing_is_swept_beyond_the_committed_offsets() -> None:
    clock = Clock()
    a, b, c = (TopicPartition("engram.ingest", p) for p in range(3))
    committed: dict[TopicPartition, int | None] = {a: 3, b: None}
    sweeper = Sweeper(f"127.0.0.1:{free_port()}", lambda: committed, clock=clock)
    sweeper.gather([Sent(a.topic, 0, 7), Sent(b.topic, 1, 4), Sent(c.topic, 2, 1)])
    assert sweeper.pending == {a: 3}  # b: nothing committed yet; c: no offset known
    committed[a], committed[b] = 10, 2
    sweeper.gather([Sent(a.topic, 0, 1), Sent(b.topic, 1, 5)])
    assert sweeper.pending == {a: 3, b: 2}  # an earlier message never lowers an end


async def _produce(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for partition in range(partitions):
            for i in range(per_partition):
                await producer.send_and_wait(topic, b"clear %d" % i, partition=partition)
    finally:
        await producer.stop()


async def _first_offsets(bootstrap: str, topic: str, partitions: int) -> list[int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        first = await consumer.beginning_offsets(tps)
        return [first[tp] for tp in tps]
    finally:
        await consumer.stop()


def test_a_sweep_on_the_session_broker(broker: str, caplog: pytest.LogCaptureFixture) -> None:
    """Apache Kafka deletes what was committed; Tansu closes the connection on
    DeleteRecords, which the sweeper takes as a failure that may pass: it keeps the
    ends and asks again later, and nothing is deleted."""
    topic = f"sweep-{uuid.uuid4().hex[:8]}"
    clock = Clock()
    committed = {TopicPartition(topic, 0): 6, TopicPartition(topic, 1): 3}

    async def scenario() -> list[int]:
        await _produce(broker, topic, 2, 8)
        sweeper = Sweeper(broker, lambda: committed, clock=clock)
        try:
            await sweeper.sweep([Sent(topic, 0, 7), Sent(topic, 1, 2)])
        finally:
            await sweeper.stop()
        assert not sweeper.refused
        if broker_kind() == "kafka":
            assert sweeper.pending == {} and sweeper.failures == 0
        else:
            assert sweeper.failures == 1
            assert sweeper.pending == committed
        return await _first_offsets(broker, topic, 2)

    with caplog.at_level(logging.WARNING, logger="engram.ingest"):
        first = asyncio.run(scenario())
    assert first == ([6, 3] if broker_kind() == "kafka" else [0, 0])


@pytest.fixture
def kafka(tmp_path: Path) -> Iterator[ApacheKafka]:
    if NO_KAFKA is not None:
        pytest.skip(NO_KAFKA)
    with ApacheKafka(tmp_path / "kafka") as node:
        yield node


def test_a_sweep_failed_while_the_broker_was_down_is_done_once_it_is_back(
    kafka: ApacheKafka,
) -> None:
    """The broker is killed between two sweeps. The sweep while it is away fails
    without giving up; after the restart and the wait, the next sweep deletes both
    what it was given and what the failed one was to delete, on a partition no later
    batch reads. Kafka checkpoints a partition's start offset about once a minute, so
    the crash may bring back what the first sweep deleted: that sweep's end is asked
    again too, though no later batch reads that partition."""
    topic = "engram.ingest"
    clock = Clock()
    committed = {TopicPartition(topic, p): None for p in range(3)}
    sweeper = Sweeper(kafka.bootstrap, lambda: committed, clock=clock)

    async def scenario() -> list[int]:
        await _produce(kafka.bootstrap, topic, 3, 10)
        committed[TopicPartition(topic, 0)] = 4
        await sweeper.sweep([Sent(topic, 0, 3)])
        assert await _first_offsets(kafka.bootstrap, topic, 3) == [4, 0, 0]

        kafka.kill()  # from this (the main) thread: the broker dies with its thread
        committed[TopicPartition(topic, 1)] = 7
        await sweeper.sweep([Sent(topic, 1, 9)])
        assert (sweeper.failures, sweeper.refused) == (1, False)
        assert sweeper.pending == {TopicPartition(topic, 1): 7}

        kafka.start()
        clock.now = sweeper.next_try
        committed[TopicPartition(topic, 2)] = 5
        try:
            await sweeper.sweep([Sent(topic, 2, 4)])
        finally:
            await sweeper.stop()
        assert (sweeper.failures, sweeper.pending) == (0, {})
        assert sweeper.swept == {TopicPartition(topic, p): end for p, end in enumerate((4, 7, 5))}
        return await _first_offsets(kafka.bootstrap, topic, 3)

    assert asyncio.run(scenario()) == [4, 7, 5]
