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


def pipeline_topics(events: str, memory: str, dlq: str, partitions: int) -> list[TopicSpec]:
    """``engram.events`` and ``engram.memory`` (``partitions`` each, kept forever) and
    the dead-letter topic (one partition)."""
    return [
        TopicSpec(events, partitions, KEEP_FOREVER),
        TopicSpec(memory, partitions, KEEP_FOREVER),
        TopicSpec(dlq, 1, KEEP_FOREVER),
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
