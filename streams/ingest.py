"""Sealing at ingest: ``engram.ingest`` -> sealed -> ``engram.events``.

Producers without a master key (agents through :class:`engram.Memory`, JSON producers
in any language) publish clear events to ``engram.ingest``; the worker deletes them
there as soon as their sealed copies are acknowledged (the topic's retention, a day,
is only the backstop for a broker that cannot delete records). The ``engram.ingest``
agent decodes each one (bad bytes go to the dead-letter topic with the reason, as in
the fold), seals it under its subject's data key (made and written to ``engram.keys``
first when the subject has none) and produces it to ``engram.events`` keyed by
``agent_id``; the batch is acked only once every sealed
event is acknowledged, so nothing clear reaches a topic that keeps it, and its offsets
are committed at once (:func:`streams.ordered.commit_acted`), not at faust's commit
interval: a crash republishes at most the batch it interrupted, and the fold drops
those repeated event ids. That holds because a batch is no longer than the fold's
per-agent window of event ids (``MemoryConfig.dedupe_window``; the stack caps
``batch_size`` there) and an agent's events share one ingest partition (producers key
them by ``agent_id``). Records of one ingest partition
are sealed and produced strictly in their offset order (:class:`streams.ordered.InOrder`:
a record faust delivers past a hole waits for the hole to be read again), and an
agent's events share a partition on both topics (the same key, the same murmur2
partitioner): per-agent order holds, across crashes and rebalances too.

``engram up`` runs this agent in a process of its own by default, in a consumer group
of its own (:mod:`ops.ingest_child`, ``ENGRAM_INGEST_PROCESS``), or in the worker.

:class:`WorkerKeys` is the worker's keyring, shared by this agent, the fold and the
vector agents; :class:`KeyedWriter` writes the keys it made before the events sealed
with them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import faust
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.errors import KafkaError, KafkaTimeoutError

from processors.erasure import ERASURE_AGENT
from schemas.errors import BadEvent
from schemas.sealed import SealingCodec
from sinks.clients import close_quietly, started
from sinks.keys import KafkaKeyring, cover
from streams import faults
from streams.app import agent_batches, direct_feed
from streams.logwriter import LogWriter, Record
from streams.ordered import InOrder, commit_acted, in_order
from streams.pipeline import DeadLetter, dead_letter_records
from streams.retry import retry_in_place

log = logging.getLogger("engram.ingest")


class WorkerKeys:
    """The worker's :class:`KafkaKeyring` (None: sealing is off), started on first
    use in the worker's loop."""

    def __init__(self, ring: KafkaKeyring | None) -> None:
        self.ring = ring
        self._started = False
        self._lock = asyncio.Lock()

    async def ready(self) -> None:
        async with self._lock:
            if self.ring is not None and not self._started:
                await self.ring.start()
                self._started = True

    async def cover(self, codec: SealingCodec, raws: Sequence[bytes | None]) -> None:
        """Return once every sealed event of ``raws`` opens or is known shredded."""
        if self.ring is None:
            return
        await self.ready()
        await cover(codec, self.ring, raws)

    async def flush(self) -> None:
        """Write the keys made since the last flush."""
        if self.ring is not None and self.ring.pending:
            await self.ready()
            await self.ring.flush()

    async def close(self) -> None:
        """Stop the keyring, if it was started."""
        async with self._lock:
            if self.ring is not None and self._started:
                await self.ring.stop()
                self._started = False

    def writer(self, bootstrap: str, *, owns_keys: bool = False) -> LogWriter:
        """A writer that writes the keys made before the records; ``owns_keys``: its
        :meth:`~LogWriter.stop` closes these keys too."""
        return KeyedWriter(bootstrap, self, owns_keys=owns_keys)


class KeyedWriter(LogWriter):
    """A :class:`LogWriter` whose :meth:`send` first writes the keys made since the
    last send (so no sealed event is ever published before its key)."""

    def __init__(self, bootstrap: str, keys: WorkerKeys, *, owns_keys: bool = False) -> None:
        super().__init__(bootstrap)
        self.keys = keys
        self.owns_keys = owns_keys

    async def stop(self) -> None:
        await super().stop()
        if self.owns_keys:
            await self.keys.close()

    async def send(
        self, topic: str, records: Sequence[Record], *, one_per_batch: bool = False
    ) -> dict[int, int]:
        await self.keys.flush()
        return await super().send(topic, records, one_per_batch=one_per_batch)


def seal_one(codec: SealingCodec, message: Any) -> Record | DeadLetter | None:
    """The record ``engram.events`` gets for one ingest message, its dead letter, or
    None (sealed under a destroyed key: the subject is erased, nothing to keep).
    Sealed bytes pass as they are once they open; clear ones are sealed."""
    raw: bytes = message.value or b""
    try:
        event = codec.open(raw)
        if event is None:
            return None
        value = codec.reseal(event, raw)
    except BadEvent as bad:
        return DeadLetter(message.key, raw, bad.reason, _source(message))
    return Record(event.agent_id.encode(), value, int(event.occurred_at.timestamp() * 1000))


def seal_batch(
    codec: SealingCodec, messages: Sequence[Any]
) -> tuple[list[Record], list[DeadLetter]]:
    """:func:`seal_one` over a batch, in its order."""
    records: list[Record] = []
    dead: list[DeadLetter] = []
    for message in messages:
        out = seal_one(codec, message)
        if isinstance(out, Record):
            records.append(out)
        elif isinstance(out, DeadLetter):
            dead.append(out)
    return records, dead


BROADCAST_KEY = ERASURE_AGENT.encode()
"""The key of a broadcast erasure request (agent :data:`ERASURE_AGENT`)."""


def fan_out(records: Sequence[Record], partitions: int) -> list[Record]:
    """``records`` with each broadcast erasure request copied to every partition (in
    place of the one its key hashes to), as ``engram erase`` publishes it: a Kafka
    producer sends the request once to ``engram.ingest``, and every agent on every
    partition of ``engram.events`` must meet it."""
    out: list[Record] = []
    for record in records:
        if record.key == BROADCAST_KEY and record.partition is None:
            out += [replace(record, partition=p) for p in range(partitions)]
        else:
            out.append(record)
    return out


async def seal_and_publish(
    codec: SealingCodec,
    keys: WorkerKeys,
    writer: LogWriter,
    messages: Sequence[Any],
    route: tuple[str, str],
) -> None:
    """Seal ``messages`` and publish them to ``route[0]`` (their dead letters to
    ``route[1]``); every step retried in place, so it returns only when all is
    acknowledged and never raises (but cancellation)."""
    events_topic, dead_letter_topic = route
    raws = [m.value for m in messages]
    await retry_in_place(lambda: keys.cover(codec, raws), what="read data keys")
    records, dead = seal_batch(codec, messages)
    if any(r.key == BROADCAST_KEY for r in records):
        count = await retry_in_place(
            lambda: writer.partitions(events_topic), what="read the partitions"
        )
        records = fan_out(records, count)
    letters = dead_letter_records(dead, codec)
    await retry_in_place(lambda: writer.send(events_topic, records), what="publish sealed")
    await retry_in_place(lambda: writer.send(dead_letter_topic, letters), what="dead letters")


SWEEP_RETRY_S = 1.0
"""The wait before sweeping again after a failed sweep; it doubles at each failure in
a row, up to :data:`SWEEP_RETRY_MAX_S`."""

SWEEP_RETRY_MAX_S = 300.0
"""The longest wait between two sweeps that fail (a broker that keeps failing is asked
this often, as the embedded Tansu is: it closes the connection on DeleteRecords)."""


class Sweeper:
    """Deletes the clear records of ``engram.ingest`` once their sealed copies are
    acknowledged (Kafka's DeleteRecords), so they do not wait for the topic's
    retention (a day, :data:`ops.topics.SHORT_LIVED`).

    ``committed()`` gives the group's committed offset of each partition. Never raises
    (but cancellation). A sweep that fails for a reason that may pass (the broker
    restarting or away, a timeout, a connection closed) keeps what it did not delete
    and tries again at a later sweep, after a wait that doubles from ``retry_s`` to
    ``retry_max_s``: every partition it was to sweep is swept then, even one no later
    batch reads. A broker that refuses for good (a Kafka error that is not retriable:
    the request unsupported or not authorised, a policy) is asked no more, and the
    retention is the backstop. Apache Kafka checkpoints a partition's new start offset
    about once a minute, so a broker crash may bring back records deleted since: every
    sweep asks again for every partition swept before (a no-op where nothing came
    back), so the next one deletes them again, on a partition no batch reads too."""

    def __init__(
        self,
        bootstrap: str,
        committed: Callable[[], Mapping[TopicPartition, int | None]],
        *,
        clock: Callable[[], float] = time.monotonic,
        retry_s: float = SWEEP_RETRY_S,
        retry_max_s: float = SWEEP_RETRY_MAX_S,
    ) -> None:
        self.bootstrap = bootstrap
        self.committed = committed
        self.clock = clock
        self.retry_s = retry_s
        self.retry_max_s = retry_max_s
        self.admin: AIOKafkaAdminClient | None = None
        self.pending: dict[TopicPartition, int] = {}
        """Per partition, the offset before which records are to be deleted."""
        self.swept: dict[TopicPartition, int] = {}
        """Per partition, the offset before which records were deleted: asked again with
        every sweep, so that what a broker crash brought back goes at the next one."""
        self.refused = False
        self.failures = 0
        """Sweeps failed in a row."""
        self.next_try = 0.0

    async def sweep(self, messages: Sequence[Any]) -> None:
        """Delete what lies before both ``messages``' ends and the group's committed
        offset (with what earlier failed sweeps left), unless a failed sweep's wait is
        still running: the worker never reads again below its committed offset, so it
        never seeks into what was deleted."""
        if self.refused:
            return
        self.gather(messages)
        if not self.pending or self.clock() < self.next_try:
            return
        ends = self.swept | self.pending  # gather keeps a pending end past the swept one
        try:
            if self.admin is None:
                self.admin = await started(AIOKafkaAdminClient(bootstrap_servers=self.bootstrap))
            await self.admin.delete_records(
                {tp: RecordsToDelete(before_offset=end) for tp, end in ends.items()},
                timeout_ms=10_000,
            )
        except Exception as error:  # the sealed copies are safe: only the sweep waits
            await self._failed(error)
            return
        self.swept, self.pending = ends, {}  # every pending end was in the request
        if self.failures:
            log.info("deleting swept ingest records again, after %d failed sweeps", self.failures)
        self.failures, self.next_try = 0, 0.0

    def gather(self, messages: Sequence[Any]) -> None:
        """Add the ends of ``messages`` (each bounded by its partition's committed
        offset) to :attr:`pending`, where they are past what is pending or swept."""
        last: dict[tuple[str, int], int] = {}  # one TopicPartition a partition, not a message
        for m in messages:
            key = (m.topic, m.partition)
            if m.offset > last.get(key, -1):
                last[key] = m.offset
        committed = self.committed()
        for (topic, partition), offset in last.items():
            tp = TopicPartition(topic, partition)
            done = committed.get(tp)
            end = min(offset + 1, done) if done is not None else 0
            if end > max(self.pending.get(tp, 0), self.swept.get(tp, 0)):
                self.pending[tp] = end

    async def _failed(self, error: Exception) -> None:
        admin, self.admin = self.admin, None
        if admin is not None:  # a new client at the next try: nothing stale kept
            await close_quietly(admin)
        if not gives_way(error):
            self.refused = True
            self.pending.clear()
            log.warning(
                "the broker refuses to delete swept ingest records (%r): not asked again;"
                " the topic's retention removes them",
                error,
            )
            return
        self.failures += 1
        wait = min(self.retry_s * 2 ** (self.failures - 1), self.retry_max_s)
        self.next_try = self.clock() + wait
        log.log(
            logging.WARNING if self.failures == 1 else logging.DEBUG,
            "cannot delete swept ingest records (%r, %d failed in a row): trying again in"
            " %.0f s; the topic's retention removes them meanwhile",
            error,
            self.failures,
            wait,
        )

    async def stop(self) -> None:
        """Close the admin client (a later sweep starts another)."""
        admin, self.admin = self.admin, None
        if admin is not None:
            await admin.close()


def gives_way(error: Exception) -> bool:
    """Whether a failed DeleteRecords may succeed later: anything but a Kafka error
    that is not retriable (aiokafka's own timeout is not marked retriable, but is)."""
    if isinstance(error, KafkaTimeoutError):
        return True
    return not isinstance(error, KafkaError) or error.retriable


def committed_offsets(app: Any) -> Mapping[TopicPartition, int | None]:
    """The offsets ``app``'s consumer last committed, by partition."""
    committed: Mapping[TopicPartition, int | None] = app.consumer._committed_offset
    return committed


def _source(message: Any) -> str:
    return f"{message.topic}:{message.partition}:{message.offset}"


def register_ingest(
    app: faust.App,
    *,
    ingest: faust.TopicT,
    events_topic: str,
    dead_letter_topic: str,
    codec: SealingCodec,
    keys: WorkerKeys,
    bootstrap: str,
    batch_size: int = 1000,
    within: float = 0.2,
    direct: bool = False,
) -> faust.types.AgentT[bytes]:
    """Declare the ``engram.ingest`` agent on ``app`` (``codec`` accepts the raw types
    and seals with ``keys``); return it. With ``direct``, the agent takes the ingest
    topic's messages from a :class:`~streams.app.DirectFeed` (batches of at most
    ``batch_size``, as soon as one message waits) instead of its faust stream
    (``batch_size`` within ``within`` seconds)."""

    route = (events_topic, dead_letter_topic)
    feed = direct_feed(app, ingest.get_topic_name()) if direct else None

    guard = InOrder(app)

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # faust stub wants positional-only
    async def forget(sender: Any, *_: Any, signal: Any, **__: Any) -> None:
        guard.forget()

    @app.agent(ingest, name="engram.ingest")
    async def seal(stream: faust.StreamT[bytes]) -> None:
        writer = keys.writer(bootstrap)
        sweeper = Sweeper(bootstrap, lambda: committed_offsets(app))
        try:
            async for batch in agent_batches(stream, feed, batch_size, within):
                acted = await in_order(
                    batch,
                    guard,
                    lambda ready: seal_and_publish(codec, keys, writer, ready, route),
                )
                faults.reached("ingest.published", len(acted))
                await commit_acted(app.consumer, acted)
                await sweeper.sweep([item.message for item in batch])
        finally:
            await writer.stop()
            await sweeper.stop()

    return seal
