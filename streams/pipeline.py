"""Wiring: engram.events -> processors -> engram.memory, with the ClickHouse history.

The ``fold`` agent reads raw bytes from ``engram.events``; decodes (bad bytes go
to the dead-letter topic with the reason), drops duplicate ``event_id``s, assigns
the per-agent sequence and runs the processors. Then, in this order: the raw
events and their memory changes are written to ClickHouse (one flush), the
derived events are published to ``engram.memory`` (the derived log that other
projections and rebuilds consume), and the per-agent state is saved in a
changelogged table. Only then does the batch end, so offsets are committed after
everything it produced is durable; a crash before that replays the batch, which
yields the same rows and the same derived ids (idempotent downstream).

No exception escapes a batch loop (faust would ack and skip the batch): data
errors become dead letters, infrastructure errors are retried in place.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import faust
from aiokafka import AIOKafkaProducer

from processors import AgentMemory, AgentState, MemoryConfig
from schemas import BadEvent, Codec, DerivedEvent, Event
from sinks.clickhouse import ClickHouseHistory, SequencedEvent
from streams.app import Topics
from streams.retry import retry_in_place

log = logging.getLogger("engram.streams")
REASON_HEADER = "engram.reason"
SOURCE_HEADER = "engram.source"


class AgentStateTable(faust.Table[bytes, bytes]):
    """The per-agent state table; each key's changelog goes to the partition its
    agent's events come from (so recovery of a partition restores its agents)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.partition_of: dict[bytes, int] = {}

    def partition_for_key(self, key: Any) -> int | None:
        return self.partition_of[key]

    def put(self, key: bytes, value: bytes, partition: int) -> None:
        self.partition_of[key] = partition
        self[key] = value


@dataclass(frozen=True)
class DeadLetter:
    """Bytes the pipeline could not use, with why and where they came from."""

    key: bytes | None
    raw: bytes
    reason: str
    source: str


@dataclass
class FoldResult:
    """What one batch of raw events produced."""

    sequenced: list[SequencedEvent] = field(default_factory=list)
    derived: list[DerivedEvent] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    touched: dict[str, int] = field(default_factory=dict)


class Folder:
    """Holds the live per-agent memories of this worker between batches.

    The cache is only an accelerator for the changelogged table: it is dropped
    when partitions are revoked and whenever the agent restarts.
    """

    def __init__(self, table: AgentStateTable, codec: Codec, config: MemoryConfig) -> None:
        self.table = table
        self.codec = codec
        self.config = config
        self.live: dict[str, AgentMemory] = {}

    def memory(self, agent_id: str) -> AgentMemory:
        live = self.live.get(agent_id)
        if live is None:
            saved = self.table.get(agent_id.encode())
            state = (
                AgentState.model_validate_json(saved)
                if saved is not None
                else AgentState(agent_id=agent_id)
            )
            live = self.live[agent_id] = AgentMemory(state, self.config)
        return live

    def fold(self, batch: Sequence[faust.EventT[bytes]]) -> FoldResult:
        result = FoldResult()
        for item in batch:
            message = item.message
            raw: bytes = message.value or b""
            try:
                event = self.codec.decode(raw)
                payload = raw if raw[:2] == b"\xc3\x01" else self.codec.encode(event)
            except BadEvent as bad:
                source = f"{message.topic}:{message.partition}:{message.offset}"
                result.dead.append(DeadLetter(message.key, raw, bad.reason, source))
                continue
            memory = self.memory(event.agent_id)
            try:
                step = memory.apply(event)
            except Exception as error:  # a processor bug: keep the line moving, visibly
                source = f"{message.topic}:{message.partition}:{message.offset}"
                reason = f"processor failed on {event.type}: {error!r}"
                result.dead.append(DeadLetter(message.key, raw, reason, source))
                continue
            result.touched[event.agent_id] = message.partition
            if step.seq is None:
                continue
            result.sequenced.append(SequencedEvent(event, step.seq, payload))
            result.derived.extend(step.derived)
        return result

    async def save(self, agents: dict[str, int]) -> None:
        """Write the touched agents' states to the changelogged table."""
        for agent_id, partition in sorted(agents.items()):
            state = self.live[agent_id].state().model_dump_json().encode()
            self.table.put(agent_id.encode(), state, partition)


class LogWriter:
    """Writes derived events and dead letters with a plain aiokafka producer
    (``acks=all``); :meth:`send` returns once every record is acknowledged."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.producer: AIOKafkaProducer | None = None

    async def start(self) -> AIOKafkaProducer:
        if self.producer is None:
            producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap,
                acks="all",
                linger_ms=2,
                max_batch_size=1_048_576,
                max_request_size=8_388_608,
            )
            await producer.start()
            self.producer = producer
        return self.producer

    async def stop(self) -> None:
        producer, self.producer = self.producer, None
        if producer is not None:
            await producer.stop()

    async def send(self, topic: str, records: Sequence[Record]) -> None:
        producer = await self.start()
        futures = [
            await producer.send(
                topic, key=r.key, value=r.value, timestamp_ms=r.timestamp_ms, headers=r.headers
            )
            for r in records
        ]
        await asyncio.gather(*futures)


@dataclass(frozen=True)
class Record:
    key: bytes | None
    value: bytes
    timestamp_ms: int | None = None
    headers: list[tuple[str, bytes]] = field(default_factory=list)


def dead_letter_records(dead: Sequence[DeadLetter]) -> list[Record]:
    for d in dead:
        log.warning("dead letter from %s: %s", d.source, d.reason)
    return [
        Record(
            d.key,
            d.raw,
            None,
            [(REASON_HEADER, d.reason.encode()), (SOURCE_HEADER, d.source.encode())],
        )
        for d in dead
    ]


def derived_records(codec: Codec, derived: Sequence[Event]) -> list[Record]:
    return [
        Record(e.agent_id.encode(), codec.encode(e), int(e.occurred_at.timestamp() * 1000))
        for e in derived
    ]


def register(
    app: faust.App,
    *,
    topics: Topics,
    history: ClickHouseHistory,
    codec: Codec,
    config: MemoryConfig,
    bootstrap: str,
    batch_size: int = 1000,
    within: float = 0.2,
) -> faust.types.AgentT[bytes]:
    """Declare the state table and the fold agent on ``app``; return the agent."""
    table = AgentStateTable(
        app,
        name="agent_state",
        default=None,
        beacon=app.tables.beacon,
        key_type=bytes,
        value_type=bytes,
        partitions=topics.events.partitions or app.conf.topic_partitions,
    )
    app.tables.add(table)
    folders: list[Folder] = []

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # faust stub wants positional-only
    async def forget_live_state(sender: Any, *_: Any, signal: Any, **__: Any) -> None:
        for folder in folders:
            folder.live.clear()

    @app.agent(topics.events, name="engram.fold")
    async def fold(stream: faust.StreamT[bytes]) -> None:
        folder = Folder(table, codec, config)
        folders[:] = [folder]
        writer = LogWriter(bootstrap)
        try:
            async for batch in cast(faust.Stream[bytes], stream).take_events(
                batch_size, within=within
            ):
                await fold_batch(app, folder, batch, topics, history, codec, writer)
        finally:
            await writer.stop()

    return fold


async def fold_batch(
    app: faust.App,
    folder: Folder,
    batch: Sequence[faust.EventT[bytes]],
    topics: Topics,
    history: ClickHouseHistory,
    codec: Codec,
    writer: LogWriter,
) -> None:
    """Fold, archive, publish, save state — in that order; never raises."""
    started = time.perf_counter()
    result = folder.fold(batch)
    folded = time.perf_counter()
    if result.sequenced:
        await retry_in_place(
            lambda: history.write(result.sequenced, result.derived), what="write history"
        )
    archived = time.perf_counter()
    if result.derived:
        records = derived_records(codec, result.derived)
        await retry_in_place(
            lambda: writer.send(topics.memory.get_topic_name(), records), what="publish derived"
        )
    if result.dead:
        dead = dead_letter_records(result.dead)
        await retry_in_place(
            lambda: writer.send(topics.dead_letters.get_topic_name(), dead), what="dead letters"
        )
    published = time.perf_counter()
    if result.touched:
        await retry_in_place(lambda: folder.save(result.touched), what="save agent state")
        await retry_in_place(app.producer.flush, what="flush state changelog")
    log.debug(
        "fold batch of %d: fold %.3fs, archive %.3fs, publish %.3fs, state %.3fs",
        len(batch),
        folded - started,
        archived - folded,
        published - archived,
        time.perf_counter() - published,
    )
