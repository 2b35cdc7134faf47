"""Starting aiokafka clients without leaving half-started ones behind.

An aiokafka producer, consumer or admin client whose ``start`` fails (the broker is
away) keeps what it opened and, once garbage, logs ``Unclosed AIOKafkaProducer`` (or
consumer) at ERROR level with its repr on standard output. The worker retries in place
every ~2 s while a broker is away, so each retry left one more of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Protocol, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition


class _Client(Protocol):
    async def start(self) -> None: ...


C = TypeVar("C", bound=_Client)


async def started(client: C) -> C:
    """``client`` once started. If it does not start, it is closed (``stop``, or
    ``close`` for an admin client) and the error of ``start`` propagates."""
    try:
        await client.start()
    except BaseException:
        await close_quietly(client)
        raise
    return client


async def close_quietly(client: object) -> None:
    """Stop ``client`` (an admin client closes), never raising but cancellation: the
    caller is already handling a failure (a start, a request), which is the one to tell."""
    end = getattr(client, "stop", None) or getattr(client, "close", None)
    if end is None:
        return
    with contextlib.suppress(Exception):
        await end()


async def offset_probe(bootstrap: str) -> AIOKafkaConsumer:
    """A started consumer without a group or partitions (learn them with
    :func:`partitions_of`): it fetches nothing, so its offset requests are answered at
    once. A broker answers a connection's requests in order: on a consumer that
    fetches, each waited behind a long poll of ``fetch_max_wait_ms`` (500 ms) once
    nothing new came."""
    return await started(AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False))


async def partitions_of(
    consumer: AIOKafkaConsumer, topic: str, patience_s: float = 0.0
) -> list[TopicPartition]:
    """The partitions of ``topic``, in order, from a full metadata fetch, asked again for
    ``patience_s`` while the broker does not list it (Apache Kafka may answer a fresh
    client before a just-made topic's metadata is everywhere); empty: no such topic.

    Not ``consumer.partitions_for_topic``: that reads the consumer's own cluster view,
    which holds only the topics it subscribed to or was assigned (Apache Kafka answers
    the bootstrap's metadata request with no topic; Tansu with all of them), and
    ``consumer.topics()`` fetches a view it does not keep."""
    deadline = time.monotonic() + patience_s
    while True:
        cluster = await consumer._client.fetch_all_metadata()
        found: set[int] | None = cluster.partitions_for_topic(topic)
        if found or time.monotonic() > deadline:
            return [TopicPartition(topic, p) for p in sorted(found or ())]
        await asyncio.sleep(0.2)
