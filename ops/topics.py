"""Create the pipeline's topics, or check the ones that exist."""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewTopic


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
}
"""The key topic: the last record of each key is kept (a key, or its destroyed marker)."""

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


def pipeline_topics(
    events: str,
    memory: str,
    dlq: str,
    partitions: int,
    *,
    ingest: str = "engram.ingest",
    keys: str = "engram.keys",
) -> list[TopicSpec]:
    """``engram.events`` and ``engram.memory`` (``partitions`` each, kept forever), the
    dead-letter topic (one partition), ``engram.ingest`` (``partitions``, a day's
    retention as a backstop: the clear events a producer without keys sends, sealed by the worker
    onto ``engram.events``) and ``engram.keys`` (one partition, compacted: the data keys)."""
    return [
        TopicSpec(events, partitions, KEEP_FOREVER),
        TopicSpec(memory, partitions, KEEP_FOREVER),
        TopicSpec(dlq, 1, KEEP_FOREVER),
        TopicSpec(ingest, partitions, SHORT_LIVED),
        TopicSpec(keys, 1, COMPACTED),
    ]


async def ensure_topics(bootstrap: str, specs: list[TopicSpec]) -> list[str]:
    """Create the missing topics; return the names created."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [s for s in specs if s.name not in existing]
        if missing:
            await admin.create_topics(
                [NewTopic(s.name, s.partitions, 1, topic_configs=s.config) for s in missing]
            )
        return [s.name for s in missing]
    finally:
        await admin.close()
