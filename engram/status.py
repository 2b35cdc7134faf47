"""``engram status``: how far behind the log the worker is, what went to the dead-letter
topic, and which version of each projection is live.

The running ``engram up`` answers ``GET /v1/status`` (it owns the projections); the
CLI renders it. Lag is per partition of ``engram.events`` (the fold) and
``engram.memory`` (the vector agents), for the worker's consumer group: the end of
the partition minus the group's committed offset. A partition the group has never
committed counts from its start. The embedded broker (Tansu) reports an end offset
from the start of the last record batch, so its lag can read up to one batch low.

Erasures: *pending* are the ``subject.erasure_requested`` still ahead of the fold on
some partition of ``engram.events`` (read from the broker); *completed* are the
others that left receipts in the history's ``erasures`` table, summed over agents.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from fastapi import APIRouter, HTTPException
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from schemas import BadEvent, Codec, SubjectErasureRequested
from sinks.clickhouse import ErasureReceipt
from sinks.clients import offset_probe, partitions_of, started

STATUS_TIMEOUT_S = 20.0
"""The longest ``GET /v1/status`` waits for the broker's answers (``engram status``
waits 30 s for the endpoint)."""
REASON_HEADER = "engram.reason"
"""The dead letter's reason header (``streams.pipeline.REASON_HEADER``)."""
SOURCE_HEADER = "engram.source"
"""The dead letter's source header (``streams.pipeline.SOURCE_HEADER``)."""


class PartitionLag(BaseModel):
    topic: str
    partition: int
    committed: int | None
    end: int
    lag: int
    group: str | None = None
    """The group whose commits these are, when not the status's own (the ingest
    hop's, when it runs in a process of its own)."""


class DeadLetters(BaseModel):
    topic: str
    count: int
    last_reason: str | None = None


class Projections(BaseModel):
    clickhouse_memory_changes: int | None = None
    vectors_live: int | None = None
    vectors_versions: list[int] = []


class PendingErasure(BaseModel):
    """A request in the log that the fold has not yet applied on every partition."""

    request_id: UUID
    subject: str
    requested_at: datetime | None
    partitions: list[int]


class CompletedErasure(BaseModel):
    """A request every partition has applied, with its receipts summed over agents:
    ``fold`` what the agents dropped, ``rows`` the history rows deleted per table."""

    request_id: UUID
    subject: str
    requested_at: datetime | None
    erased_at: datetime
    agents: int
    fold: dict[str, int]
    rows: dict[str, int]


class Erasures(BaseModel):
    pending: list[PendingErasure] = []
    completed: list[CompletedErasure] = []


class Status(BaseModel):
    """What ``GET /v1/status`` answers."""

    group: str
    lag: list[PartitionLag]
    total_lag: int
    dead_letters: DeadLetters
    projections: Projections
    checked_at: datetime
    erasures: Erasures = Erasures()


async def partition_bounds(
    bootstrap: str, topics: Sequence[str]
) -> tuple[list[TopicPartition], dict[TopicPartition, int], dict[TopicPartition, int]]:
    """Every partition of ``topics`` with its log start and end offsets, read by a
    consumer without a group (see :func:`~sinks.clients.offset_probe`)."""
    probe = await offset_probe(bootstrap)
    try:
        partitions = [tp for topic in topics for tp in await partitions_of(probe, topic)]
        if not partitions:
            return [], {}, {}
        starts = await probe.beginning_offsets(partitions)
        ends = await probe.end_offsets(partitions)
    finally:
        await probe.stop()
    return partitions, starts, ends


async def consumer_lag(
    bootstrap: str,
    group: str,
    topics: Sequence[str],
    topic_groups: Mapping[str, str] | None = None,
) -> list[PartitionLag]:
    """Per partition of ``topics``: the group's committed offset, the end, the lag
    (``topic_groups``: topics another group reads, with that group's commits).

    :func:`partition_bounds` learns the partitions and their ends; a consumer of the
    group, assigned the partitions, reads the commits without joining (the worker is
    not rebalanced)."""
    partitions, starts, ends = await partition_bounds(bootstrap, topics)
    others = topic_groups or {}
    committed: dict[TopicPartition, int | None] = {}
    for reader in sorted({group, *others.values()}):
        mine = [tp for tp in partitions if others.get(tp.topic, group) == reader]
        committed.update(await _committed(bootstrap, reader, mine))
    out = []
    for tp in partitions:
        offset = committed[tp]
        out.append(
            PartitionLag(
                topic=tp.topic,
                partition=tp.partition,
                committed=offset,
                end=ends[tp],
                lag=max(ends[tp] - (starts[tp] if offset is None else offset), 0),
                group=others.get(tp.topic),
            )
        )
    return out


async def _committed(
    bootstrap: str, group: str, partitions: Sequence[TopicPartition]
) -> dict[TopicPartition, int | None]:
    """``group``'s committed offset of each of ``partitions`` (None: none yet)."""
    if not partitions:
        return {}
    member = await started(
        AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    )
    try:
        member.assign(list(partitions))
        return {tp: await member.committed(tp) for tp in partitions}
    finally:
        await member.stop()


async def dead_letters(bootstrap: str, topic: str) -> DeadLetters:
    """How many records the dead-letter topic holds, and the newest one's reason."""
    consumer = await offset_probe(bootstrap)
    try:
        partitions = await partitions_of(consumer, topic)
        if not partitions:
            return DeadLetters(topic=topic, count=0)
        ends = await consumer.end_offsets(partitions)
        starts = await consumer.beginning_offsets(partitions)
        count = sum(ends[tp] - starts[tp] for tp in partitions)
        reason = None
        newest = max(partitions, key=lambda tp: ends[tp])
        if ends[newest] > starts[newest]:
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


async def pending_erasures(
    bootstrap: str, events_topic: str, lag: Sequence[PartitionLag], codec: Codec
) -> list[PendingErasure]:
    """Erasure requests between the group's committed offset and the end of each
    partition of ``events_topic`` (read from the broker, the types told by their
    Avro header, at most :data:`PENDING_SCAN` records per partition)."""
    behind = [p for p in lag if p.topic == events_topic and p.lag > 0]
    if not behind:
        return []
    found: dict[UUID, PendingErasure] = {}
    consumer = await started(
        AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    )
    try:
        for part in behind:
            for request in await _requests_in(consumer, part, codec):
                entry = found.setdefault(
                    request.event_id,
                    PendingErasure(
                        request_id=request.event_id,
                        subject=request.body.subject,
                        requested_at=request.body.requested_at,
                        partitions=[],
                    ),
                )
                if part.partition not in entry.partitions:
                    entry.partitions.append(part.partition)
    finally:
        await consumer.stop()
    return list(found.values())


PENDING_SCAN = 100_000


async def _requests_in(
    consumer: AIOKafkaConsumer, part: PartitionLag, codec: Codec
) -> list[SubjectErasureRequested]:
    tp = TopicPartition(part.topic, part.partition)
    consumer.assign([tp])
    start = part.end - part.lag
    consumer.seek(tp, start)
    stop = min(part.end, start + PENDING_SCAN)
    out: list[SubjectErasureRequested] = []
    while await consumer.position(tp) < stop:
        batch = await consumer.getmany(tp, timeout_ms=2000, max_records=10_000)
        records = batch.get(tp, [])
        if not records:
            break
        for record in records:
            if record.offset < stop:
                out += _request_of(codec, record.value)
    return out


def _request_of(codec: Codec, raw: bytes | None) -> list[SubjectErasureRequested]:
    if raw is None:
        return []
    writer = codec.writers.get(raw[2:10])
    if writer is None or writer.reader.event_type is not SubjectErasureRequested:
        return []
    try:
        event = codec.decode(raw)
    except BadEvent:
        return []
    return [event] if isinstance(event, SubjectErasureRequested) else []


def completed_erasures(
    receipts: Sequence[ErasureReceipt], pending: Sequence[PendingErasure]
) -> list[CompletedErasure]:
    """The receipts summed per request, for the requests no longer pending."""
    waiting = {p.request_id for p in pending}
    done: dict[UUID, CompletedErasure] = {}
    for r in receipts:
        if r.request_id in waiting:
            continue
        entry = done.get(r.request_id)
        if entry is None:
            entry = done[r.request_id] = CompletedErasure(
                request_id=r.request_id,
                subject=r.subject,
                requested_at=r.requested_at,
                erased_at=r.erased_at,
                agents=0,
                fold={},
                rows={},
            )
        entry.agents += 1
        entry.erased_at = max(entry.erased_at, r.erased_at)
        _add(entry.fold, r.fold)
        _add(entry.rows, r.rows)
    return list(done.values())


def _add(total: dict[str, int], more: dict[str, int]) -> None:
    for key, value in more.items():
        total[key] = total.get(key, 0) + value


async def gather_status(
    *,
    bootstrap: str,
    group: str,
    topics: Sequence[str],
    dead_letter_topic: str,
    projections: Projections,
    receipts: Sequence[ErasureReceipt] = (),
    topic_groups: Mapping[str, str] | None = None,
) -> Status:
    """The status; pending erasures are looked for on ``topics[0]`` (the raw log);
    ``topic_groups``: see :func:`consumer_lag`."""
    lag = await consumer_lag(bootstrap, group, topics, topic_groups)
    pending = await pending_erasures(bootstrap, topics[0], lag, Codec()) if topics else []
    return Status(
        group=group,
        lag=lag,
        total_lag=sum(p.lag for p in lag),
        dead_letters=await dead_letters(bootstrap, dead_letter_topic),
        projections=projections,
        checked_at=datetime.now(UTC),
        erasures=Erasures(pending=pending, completed=completed_erasures(receipts, pending)),
    )


def render(console: Console, status: Status) -> None:
    table = Table(title=f"consumer group {status.group}: lag {status.total_lag}")
    for column in ("topic", "partition", "committed", "end", "lag"):
        table.add_column(column, justify="left" if column == "topic" else "right")
    for p in status.lag:
        committed = "-" if p.committed is None else str(p.committed)
        topic = p.topic if p.group is None else f"{p.topic} ({p.group})"
        table.add_row(topic, str(p.partition), committed, str(p.end), str(p.lag))
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
    render_erasures(console, status.erasures)


def render_erasures(console: Console, erasures: Erasures) -> None:
    """Pending and completed erasures, one line each (counts only)."""
    console.print(f"erasures: {len(erasures.pending)} pending, {len(erasures.completed)} completed")
    for p in erasures.pending:
        where = ", ".join(map(str, sorted(p.partitions)))
        console.print(f"  pending   {p.request_id} {p.subject!r} (partitions {where})")
    for c in erasures.completed:
        fold = " ".join(f"{k}={v}" for k, v in sorted(c.fold.items()))
        console.print(
            f"  completed {c.request_id} {c.subject!r} at {c.erased_at:%Y-%m-%d %H:%M:%S}:"
            f" {c.agents} agents, {fold}, {erased_rows(c.rows)}"
        )


def erased_rows(rows: Mapping[str, int]) -> str:
    """A receipt's ``rows`` in words: history rows deleted, rows rewritten (``"<table>
    rewritten"``), vector points deleted (:data:`~sinks.clickhouse.VECTOR_POINTS`)."""
    from sinks.clickhouse import VECTOR_POINTS

    rewritten = sum(n for key, n in rows.items() if key.endswith(" rewritten"))
    points = rows.get(VECTOR_POINTS, 0)
    deleted = sum(rows.values()) - rewritten - points
    return f"{deleted} history rows deleted, {rewritten} rewritten, {points} vector points deleted"


def status_of(payload: Any) -> Status:
    return Status.model_validate(payload)


def status_router(
    *,
    bootstrap: str,
    group: str,
    topics: Sequence[str],
    dead_letter_topic: str,
    projections: Callable[[], Projections],
    erasures: Callable[[], Sequence[ErasureReceipt]] | None = None,
    topic_groups: Mapping[str, str] | None = None,
    timeout_s: float = STATUS_TIMEOUT_S,
) -> APIRouter:
    """``GET /v1/status``; ``projections`` reads the live versions and ``erasures``
    the erasure receipts (both may block); ``topic_groups``: see :func:`consumer_lag`.
    A broker that refuses, fails or does not answer within ``timeout_s`` gives a 503
    saying so (the lag cannot be known), never a request left hanging."""
    router = APIRouter(tags=["operations"])

    @router.get("/v1/status", response_model=Status, summary="Lag, dead letters, projections")
    async def status() -> Status:
        loop = asyncio.get_running_loop()
        versions = await loop.run_in_executor(None, projections)
        receipts = await loop.run_in_executor(None, erasures) if erasures is not None else ()
        asking = gather_status(
            bootstrap=bootstrap,
            group=group,
            topics=topics,
            dead_letter_topic=dead_letter_topic,
            projections=versions,
            receipts=receipts,
            topic_groups=topic_groups,
        )
        try:
            return await asyncio.wait_for(asking, timeout_s)
        except TimeoutError:
            why = f"did not answer within {timeout_s:g} s"
        except (KafkaError, OSError) as error:
            why = f"failed: {error!r}"
        raise HTTPException(503, f"the broker at {bootstrap} {why}: the lag is unknown")

    return router
