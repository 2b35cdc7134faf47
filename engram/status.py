"""``engram status``: how far behind the log the worker is, what went to the dead-letter
topic, and which version of each projection is live.

The running ``engram up`` answers ``GET /v1/status`` (it owns the projections); the
CLI renders it. Lag is per partition of ``engram.events`` (the fold) and
``engram.memory`` (the vector agents), for the worker's consumer group: the end of
the partition minus the group's committed offset. A partition the group has never
committed counts from its start. The embedded broker (Tansu) reports an end offset
from the start of the last record batch, so its lag can read up to one batch low.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from fastapi import APIRouter
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

REASON_HEADER = "engram.reason"
"""The dead letter's reason header (``streams.pipeline.REASON_HEADER``)."""


class PartitionLag(BaseModel):
    topic: str
    partition: int
    committed: int | None
    end: int
    lag: int


class DeadLetters(BaseModel):
    topic: str
    count: int
    last_reason: str | None = None


class Projections(BaseModel):
    clickhouse_memory_changes: int | None = None
    vectors_live: int | None = None
    vectors_versions: list[int] = []


class Status(BaseModel):
    """What ``GET /v1/status`` answers."""

    group: str
    lag: list[PartitionLag]
    total_lag: int
    dead_letters: DeadLetters
    projections: Projections
    checked_at: datetime


async def consumer_lag(bootstrap: str, group: str, topics: Sequence[str]) -> list[PartitionLag]:
    """Per partition of ``topics``: the group's committed offset, the end, the lag.

    A consumer without a group learns the partitions and their ends (subscribed, it
    waits for the topics' metadata as it starts); one of the group, assigned the
    partitions, reads the commits without joining (the worker is not rebalanced)."""
    probe = AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap, enable_auto_commit=False)
    await probe.start()
    try:
        partitions = [
            TopicPartition(topic, p)
            for topic in topics
            for p in sorted(probe.partitions_for_topic(topic) or ())
        ]
        if not partitions:
            return []
        ends = await probe.end_offsets(partitions)
        starts = await probe.beginning_offsets(partitions)
    finally:
        await probe.stop()
    member = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await member.start()
    try:
        member.assign(partitions)
        out = []
        for tp in partitions:
            offset = await member.committed(tp)
            lag = ends[tp] - (offset if offset is not None else starts[tp])
            out.append(
                PartitionLag(
                    topic=tp.topic,
                    partition=tp.partition,
                    committed=offset,
                    end=ends[tp],
                    lag=max(lag, 0),
                )
            )
        return out
    finally:
        await member.stop()


async def dead_letters(bootstrap: str, topic: str) -> DeadLetters:
    """How many records the dead-letter topic holds, and the newest one's reason."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        if not partitions:
            return DeadLetters(topic=topic, count=0)
        ends = await consumer.end_offsets(partitions)
        starts = await consumer.beginning_offsets(partitions)
        count = sum(ends[tp] - starts[tp] for tp in partitions)
        reason = None
        newest = max(partitions, key=lambda tp: ends[tp])
        if ends[newest] > starts[newest]:
            consumer.unsubscribe()
            consumer.assign([newest])
            consumer.seek(newest, ends[newest] - 1)
            batch = await consumer.getmany(newest, timeout_ms=2000)
            for record in batch.get(newest, [])[-1:]:
                for key, value in record.headers or ():
                    if key == REASON_HEADER:
                        reason = value.decode(errors="replace")
        return DeadLetters(topic=topic, count=count, last_reason=reason)
    finally:
        await consumer.stop()


async def gather_status(
    *,
    bootstrap: str,
    group: str,
    topics: Sequence[str],
    dead_letter_topic: str,
    projections: Projections,
) -> Status:
    lag = await consumer_lag(bootstrap, group, topics)
    return Status(
        group=group,
        lag=lag,
        total_lag=sum(p.lag for p in lag),
        dead_letters=await dead_letters(bootstrap, dead_letter_topic),
        projections=projections,
        checked_at=datetime.now(UTC),
    )


def render(console: Console, status: Status) -> None:
    table = Table(title=f"consumer group {status.group}: lag {status.total_lag}")
    for column in ("topic", "partition", "committed", "end", "lag"):
        table.add_column(column, justify="left" if column == "topic" else "right")
    for p in status.lag:
        committed = "-" if p.committed is None else str(p.committed)
        table.add_row(p.topic, str(p.partition), committed, str(p.end), str(p.lag))
    console.print(table)
    dead = status.dead_letters
    line = f"dead letters ({dead.topic}): {dead.count}"
    if dead.last_reason:
        line += f"; newest: {dead.last_reason}"
    console.print(line)
    proj = status.projections
    versions = ", ".join(map(str, proj.vectors_versions)) or "-"
    console.print(
        f"projections: memory_changes v{proj.clickhouse_memory_changes},"
        f" vectors v{proj.vectors_live} (versions on disk: {versions})"
    )


def status_of(payload: Any) -> Status:
    return Status.model_validate(payload)


def status_router(
    *,
    bootstrap: str,
    group: str,
    topics: Sequence[str],
    dead_letter_topic: str,
    projections: Callable[[], Projections],
) -> APIRouter:
    """``GET /v1/status``; ``projections`` reads the live versions (it may block)."""
    router = APIRouter(tags=["operations"])

    @router.get("/v1/status", response_model=Status, summary="Lag, dead letters, projections")
    async def status() -> Status:
        versions = await asyncio.get_running_loop().run_in_executor(None, projections)
        return await gather_status(
            bootstrap=bootstrap,
            group=group,
            topics=topics,
            dead_letter_topic=dead_letter_topic,
            projections=versions,
        )

    return router
