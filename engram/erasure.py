"""Erasure requests (issue 7): forget a subject — a user, or an agent without users —
everywhere.

A request is one ``subject.erasure_requested`` event, published in clear (it carries
no content) to *every* partition of ``engram.events`` with the agent id
:data:`~processors.erasure.ERASURE_AGENT`, like the ticker's ticks: a user's events
span many agents, and so many partitions. Its ``event_id`` is the request id the
caller follows the erasure by (``engram status``, the ``erasures`` table). The
worker destroys the subject's data keys before it folds the request, then each
agent of the partition purges the subject and every projection follows
(:class:`~sinks.clickhouse.ClickHouseHistory`, the vector index), each leaving a
receipt per agent in ``erasures``.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from uuid import uuid4

from aiokafka import AIOKafkaProducer

from processors.erasure import ERASURE_AGENT
from schemas import Codec, ErasureBody, SubjectErasureRequested

BROADCAST_ONLY = "subject.erasure_requested"
"""The raw type the publish paths refuse (``POST /v1/events``, ``Memory.publish``): a
request must reach every partition, so it goes through :func:`broadcast` (``POST
/v1/erasures``, ``Memory.erase``, ``engram erase``). One that a Kafka producer sends
to ``engram.ingest`` is broadcast by the ingest agent."""


def erasure_request(subject: str, reason: str | None = None) -> SubjectErasureRequested:
    """A new request to erase ``subject`` (a fresh id: each request is a new fact);
    ValueError (pydantic's) for a subject that is not an identifier."""
    now = datetime.now(UTC)
    return SubjectErasureRequested(
        event_id=uuid4(),
        agent_id=ERASURE_AGENT,
        occurred_at=now,
        body=ErasureBody(subject=subject, reason=reason, requested_at=now),
    )


async def broadcast(
    producer: AIOKafkaProducer,
    topic: str,
    codec: Codec,
    request: SubjectErasureRequested,
    wait_s: float,
) -> int:
    """Publish ``request`` to every partition of ``topic`` (clear Avro); return how
    many partitions, once every copy is acknowledged (TimeoutError after ``wait_s``)."""
    partitions = sorted(await producer.partitions_for(topic))
    value = codec.encode(request)
    at = int(request.occurred_at.timestamp() * 1000)
    key = ERASURE_AGENT.encode()
    sends = [
        await producer.send(topic, value, key, partition=p, timestamp_ms=at) for p in partitions
    ]
    await asyncio.wait_for(asyncio.gather(*sends), wait_s)
    return len(partitions)
