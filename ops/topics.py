"""Create the pipeline's topics, or check the ones that exist."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import IncompatibleBrokerVersion

from schemas.sealed import SealingCodec
from sinks.clients import partitions_of
from streams.holds import CLOCK_TOPIC

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]


KEEP_FOREVER = {
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "cleanup.policy": "delete",
    # The record timestamp is the event's occurred_at, the agent's clock: Kafka 4 refuses
    # records more than an hour ahead of the broker's clock by default; the log must not.
    "message.timestamp.after.max.ms": str(2**63 - 1),
}


COMPACTED = {
    "cleanup.policy": "compact",
    "message.timestamp.after.max.ms": str(2**63 - 1),
    "max.compaction.lag.ms": str(3600 * 1000),
    "segment.ms": str(3600 * 1000),
    "min.cleanable.dirty.ratio": "0.01",
}
"""The key topic: the last record of each key is kept (a key, or its destroyed marker).
An erasure's marker replaces the key's record: compaction must then remove the key
material within about an hour (plus the log cleaner's own delay), not after Kafka's
default seven-day segment, or the master key and a copy of the topic would still open
the erased subject's events. (The embedded broker never compacts: it keeps the
material in memory until it stops.)"""

ALIGNED = frozenset({"max.compaction.lag.ms", "segment.ms", "min.cleanable.dirty.ratio"})
"""Configs :func:`ensure_topics` sets again on a compacted topic that exists already
(one created by an engram before they were set)."""

SHORT_LIVED = {
    "cleanup.policy": "delete",
    "retention.ms": str(24 * 3600 * 1000),  # a backstop: the worker deletes what it sealed
    "segment.ms": str(3600 * 1000),
    # retention counts from when the broker appended a record, not from the event's
    # occurred_at (the producer's timestamp): an old event must not expire unread
    "message.timestamp.type": "LogAppendTime",
}
"""The ingest topic: clear events wait there only until the worker has sealed them
(it then deletes them); the retention outlasts a worker outage of up to a day, so an
event is never dropped unread."""

CLOCK_HOLDS = {
    "cleanup.policy": "delete",
    "retention.ms": str(24 * 3600 * 1000),
    "segment.ms": str(3600 * 1000),
    "message.timestamp.type": "LogAppendTime",
}
"""The clock topic (:mod:`streams.holds`): a hold matters for minutes (it lapses
unless its import renews it), so a day's retention keeps every one that can be in
force and the topic short for the ticker, which reads it whole before each tick."""


def pipeline_topics(
    events: str,
    memory: str,
    dlq: str,
    partitions: int,
    *,
    ingest: str = "engram.ingest",
    keys: str = "engram.keys",
    clock: str = CLOCK_TOPIC,
) -> list[TopicSpec]:
    """``engram.events`` and ``engram.memory`` (``partitions`` each, kept forever), the
    dead-letter topic (one partition), ``engram.ingest`` (``partitions``, a day's
    retention as a backstop: the clear events a producer without keys sends, sealed by the worker
    onto ``engram.events``), ``engram.clock`` (one partition, a day's retention: the
    clock holds of imports) and ``engram.keys`` (one partition, compacted: the data
    keys; last)."""
    return [
        TopicSpec(events, partitions, KEEP_FOREVER),
        TopicSpec(memory, partitions, KEEP_FOREVER),
        TopicSpec(dlq, 1, KEEP_FOREVER),
        TopicSpec(ingest, partitions, SHORT_LIVED),
        TopicSpec(clock, 1, CLOCK_HOLDS),
        TopicSpec(keys, 1, COMPACTED),
    ]


async def ensure_topics(bootstrap: str, specs: list[TopicSpec]) -> list[str]:
    """Create the missing topics, and give an existing compacted one its compaction
    bounds (:data:`ALIGNED`; a broker that refuses is left as it is, with a warning);
    return the names created."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [s for s in specs if s.name not in existing]
        if missing:
            await admin.create_topics(
                [NewTopic(s.name, s.partitions, 1, topic_configs=s.config) for s in missing]
            )
        for spec in specs:
            if spec.name in existing and spec.config.keys() >= ALIGNED:
                await _align(admin, spec)
        return [s.name for s in missing]
    finally:
        await admin.close()


async def _align(admin: AIOKafkaAdminClient, spec: TopicSpec) -> None:
    """Set ``spec``'s configs on its existing topic (the whole set: an alter replaces the
    topic's dynamic configs)."""
    resource = ConfigResource(ConfigResourceType.TOPIC, spec.name, dict(spec.config))
    try:
        [response] = await admin.alter_configs([resource])
        errors = [entry[0] for entry in response.resources if entry[0] != 0]
    except IncompatibleBrokerVersion:  # no such API (Tansu, which never compacts anyway)
        log.debug("the broker cannot set topic configs: %s left as it is", spec.name)
        return
    except Exception as error:
        errors = [repr(error)]
    if errors:
        log.warning("could not set the compaction bounds of %s: %s", spec.name, errors)


async def read_to_end(
    bootstrap: str,
    topic: str,
    each: Callable[[list[ConsumerRecord[Any, Any]]], None],
    *,
    stop_after: int | None = None,
) -> int:
    """Read every partition of ``topic`` from its start until a fetch brings nothing
    (Tansu's end offsets can fall short of the last records), or until ``stop_after``
    records were read, handing each fetch's records to ``each``; return how many were
    read."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        max_partition_fetch_bytes=8 * 1024 * 1024,
        fetch_max_bytes=64 * 1024 * 1024,
    )
    await consumer.start()
    try:
        tps = await partitions_of(consumer, topic)
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        read = 0
        while stop_after is None or read < stop_after:
            fetched = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            if not fetched:
                break
            for records in fetched.values():
                each(records)
                read += len(records)
        return read
    finally:
        await consumer.stop()


async def topic_kinds(bootstrap: str, topic: str) -> Counter[str]:
    """How many records of each event type ``topic`` holds (read from the headers:
    sealed records need no key; ``?`` for bytes that do not say)."""
    codec, kinds = SealingCodec(None), Counter[str]()
    await read_to_end(
        bootstrap, topic, lambda rs: kinds.update(codec.kind(r.value or b"") or "?" for r in rs)
    )
    return kinds
