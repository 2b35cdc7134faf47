"""Apache Kafka from Maven Central jars (``ops.kafka``): it starts and answers, keeps
what it acknowledged across a SIGKILL and a restart on the same directory, answers
``offsets_for_times`` by CreateTime and compacts. These run whichever broker the
session uses (``ENGRAM_TEST_BROKER``); they skip only where Kafka cannot run."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from ops.kafka import ApacheKafka, available
from ops.kafka import broker as kafka_broker
from ops.topics import ALIGNED, COMPACTED, TopicSpec, ensure_topics, pipeline_topics

UNAVAILABLE = available()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(UNAVAILABLE is not None, reason=UNAVAILABLE or ""),
]
Record = tuple[int, bytes | None, bytes | None, int]  # offset, key, value, CreateTime


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafka]:
    with ApacheKafka(tmp_path_factory.mktemp("apache-kafka")) as broker:
        yield broker


async def create_topic(
    bootstrap: str, name: str, partitions: int = 1, config: Mapping[str, str] | None = None
) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1, topic_configs=dict(config or {}))])
    finally:
        await admin.close()


async def produce(
    bootstrap: str, topic: str, records: Sequence[tuple[bytes, bytes, int | None]]
) -> None:
    """Send (key, value, CreateTime ms or None) in order with ``acks=all``."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for key, value, timestamp_ms in records:
            await producer.send_and_wait(topic, value, key=key, timestamp_ms=timestamp_ms)
    finally:
        await producer.stop()


async def read_all(bootstrap: str, topic: str) -> list[Record]:
    """Every record of partition 0 from the first to the end, without a group."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        records: list[Record] = []
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=1000)
            records += [(m.offset, m.key, m.value, m.timestamp) for m in batch.get(tp, [])]
        return records
    finally:
        await consumer.stop()


async def test_the_broker_answers_produce_and_a_group_consume(kafka: ApacheKafka) -> None:
    await create_topic(kafka.bootstrap, "smoke", partitions=3)
    sent = [(f"k{i % 3}".encode(), f"v{i}".encode(), None) for i in range(30)]
    await produce(kafka.bootstrap, "smoke", sent)
    consumer = AIOKafkaConsumer(
        "smoke", bootstrap_servers=kafka.bootstrap, group_id="smoke", auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < len(sent) and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=1000)
            got += [m.value for records in batch.values() for m in records if m.value]
    finally:
        await consumer.stop()
    assert sorted(got) == sorted(value for _, value, _ in sent)


async def test_a_restart_after_sigkill_keeps_every_acknowledged_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """And the ports: the controller port it picked, taken by someone else after its
    check and before Kafka binds it (the race a busy machine runs), is picked again
    at the first start; the restart keeps the ports it listened on."""
    sent = [(b"key", f"record {i}".encode(), None) for i in range(200)]
    first = ApacheKafka(tmp_path / "kafka")
    taken = first.controller_port
    with socket.socket() as squatter:
        squatter.bind((first.host, taken))
        squatter.listen()
        monkeypatch.setattr(kafka_broker, "bindable", lambda *_: True)  # the check passes
        first.start()
    assert first.controller_port != taken
    assert b"java.net.BindException" in first.log_path.read_bytes()
    try:
        await create_topic(first.bootstrap, "durable")
        await produce(first.bootstrap, "durable", sent)
    finally:
        first.kill()
    second = ApacheKafka(tmp_path / "kafka")  # same directory: same ports, same log
    assert second.bootstrap == first.bootstrap
    second.start()
    try:
        kept = await read_all(second.bootstrap, "durable")
    finally:
        assert second.stop() == 143, "a controlled shutdown: the JVM's exit code for SIGTERM"
    assert [value for _, _, value, _ in kept] == [value for _, value, _ in sent]


async def test_offsets_for_times_answers_by_the_producers_create_time(kafka: ApacheKafka) -> None:
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    stamps = [int((t0 + timedelta(days=i)).timestamp() * 1000) for i in range(5)]
    await create_topic(kafka.bootstrap, "create-time")
    await produce(kafka.bootstrap, "create-time", [(b"k", b"v", ms) for ms in stamps])
    assert [ms for _, _, _, ms in await read_all(kafka.bootstrap, "create-time")] == stamps
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap)
    await consumer.start()
    try:
        tp = TopicPartition("create-time", 0)
        found = await consumer.offsets_for_times({tp: stamps[2] - 1})
        after_all = await consumer.offsets_for_times({tp: stamps[-1] + 1})
    finally:
        await consumer.stop()
    assert found[tp] is not None
    assert (found[tp].offset, found[tp].timestamp) == (2, stamps[2])
    assert after_all[tp] is None, "nothing was written after the last CreateTime"


async def test_a_compacted_topic_keeps_the_last_value_of_each_key(kafka: ApacheKafka) -> None:
    """Segments roll every 100 ms and any dirt is worth cleaning, so the cleaner
    (backoff 1 s) compacts within seconds; the active segment is never cleaned, hence
    the last record that rolls the one before it."""
    topic = "compacted"
    await create_topic(
        kafka.bootstrap,
        topic,
        config={
            "cleanup.policy": "compact",
            "segment.ms": "100",
            "min.cleanable.dirty.ratio": "0.01",
        },
    )
    for round_ in range(4):
        batch = [(f"k{k}".encode(), f"v{round_}".encode(), None) for k in range(5)]
        await produce(kafka.bootstrap, topic, batch)
        await asyncio.sleep(0.2)
    await produce(kafka.bootstrap, topic, [(b"roll", b"the last segment", None)])

    last_round = [(15 + k, f"k{k}".encode(), b"v3") for k in range(5)]
    expected = [*last_round, (20, b"roll", b"the last segment")]
    deadline = time.monotonic() + 60
    while True:
        kept = [(o, key, value) for o, key, value, _ in await read_all(kafka.bootstrap, topic)]
        if kept == expected or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    assert kept == expected


async def topic_configs(bootstrap: str, name: str) -> dict[str, str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000)
    await admin.start()
    try:
        [response] = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])
    finally:
        await admin.close()
    [(error, _, _, _, entries)] = response.resources
    assert error == 0, response
    return {str(entry[0]): str(entry[1]) for entry in entries}


async def test_the_key_topic_is_compacted_within_the_hour_new_or_old(kafka: ApacheKafka) -> None:
    """An erasure's marker replaces a data key on the key topic; the key material must
    leave it within about an hour, not Kafka's default seven-day segment. A key topic
    created before the bounds existed is given them when the stack starts."""
    bounds = {key: COMPACTED[key] for key in ALIGNED}
    fresh, old = pipeline_topics("e", "m", "d", 1, ingest="i", keys="fresh.keys")[-1], "old.keys"
    await ensure_topics(kafka.bootstrap, [fresh])
    assert {
        k: v for k, v in (await topic_configs(kafka.bootstrap, fresh.name)).items() if k in bounds
    } == bounds
    await create_topic(kafka.bootstrap, old, config={"cleanup.policy": "compact"})
    before = await topic_configs(kafka.bootstrap, old)
    assert before["segment.ms"] == "604800000"  # Kafka's default: seven days
    await ensure_topics(kafka.bootstrap, [TopicSpec(old, 1, COMPACTED)])
    after = await topic_configs(kafka.bootstrap, old)
    assert {k: v for k, v in after.items() if k in bounds} == bounds
    assert after["cleanup.policy"] == "compact"
