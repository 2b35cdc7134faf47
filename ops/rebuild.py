"""Blue/green rebuilds of the projections from ``engram.memory``.

``engram rebuild clickhouse`` rebuilds ``memory_changes`` (what the ``memories``,
``episodes``, ``facts`` and ``persona`` views read); ``engram rebuild vectors``
rebuilds the vector collection of the embedding model. Both read the derived log
from the beginning into a new version, swap it in atomically once caught up, and
drop the previous version unless asked to keep it.

Where it runs: inside ``engram up``. chdb and Qdrant Edge each allow one process
per data directory, so the process that owns them does the work: the CLI asks the
running stack over HTTP (``POST /v1/admin/rebuilds``), polls its progress
(``GET /v1/admin/rebuilds/{target}``) for the progress bar, and cancels it on
Ctrl-C (``DELETE``). The same path works unchanged when ClickHouse and Qdrant are
servers. Each rebuild runs on a thread of its own with its own event loop; its
ClickHouse calls go through the history's executor (one thread, shared with the
fold and the SQL reads, which therefore keep working, a batch apart).

How, for both targets:

1. Clean up: drop what an interrupted rebuild left (a version above the live one;
   for ClickHouse also a previous live table whose swap was interrupted).
2. Create version ``n + 1``: the table ``memory_changes_v{n+1}`` (structure of the
   live table), or the collection ``memories_<model>_v{n+1}`` (Edge: a directory).
3. Read ``engram.memory`` from the first offset of every partition with a consumer
   of its own (assigned partitions, no group to join, nothing committed: a rerun
   starts over) and apply every event in log order: rows for ClickHouse
   (``memory.embedded`` is the vector store's business and is skipped: it shares
   its creation's ``seq``/``idx``), the idempotent vector operations of
   :mod:`streams.vectors` for Qdrant (``memory.embedded`` carries the vector, and
   since its version 2 the BM25 weights of the text: no model is called, no text
   tokenised again; a batch's operations are coalesced into one call per kind,
   see :func:`coalesce`). One batch is written while the next is read and
   decoded; an Edge version is written by a process of its own
   (:class:`VectorProjection`). Passes repeat until the lag is small; each pass reads up to the end
   offsets and then on until a fetch brings nothing (Tansu reports an end offset
   short of a partition's last batch).
4. Swap. Vectors: the live projection's writes are held at a gate
   (:class:`GatedIndex`) while a last pass reads up to the end offsets taken
   under the gate and the pointer (Edge ``live.json``) or alias (Qdrant) moves;
   the live agent then re-applies its held batch to the new version, and
   re-applying a suffix of the log in order converges. ClickHouse: one
   ``EXCHANGE TABLES``; the fold writes a group's rows and publishes its derived
   events side by side, so rows written to the old table just before the swap
   may reach the log just after it: the rebuild keeps reading into the new live
   table (inserts are idempotent) until no agent's newest change in the old
   table is newer than in the new one (per agent, groups are flushed in order,
   so the log then holds everything the old table got), for at most
   ``settle_s`` seconds; past that the status says how many agents are behind.
5. Drop the previous version, unless ``keep``.

Interrupted at any point before the swap (killed, cancelled, failed), the live
projection is untouched and the new version is an orphan that the next run drops
(or, on cancel or failure, that this run drops). The swap itself is one atomic
step (``EXCHANGE TABLES``; an atomic file replace; one alias request).

Not rebuilt: ``events`` (the archive of the raw log: on the embedded broker it is
where the log is restored from, not a view of it) and ``agent_states`` (the
fold's checkpoints, written by the fold).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

import httpx
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as ProgressBar

from engram.service import Problem, problem
from schemas import (
    BadEvent,
    Codec,
    DerivedEvent,
    MemoryCreated,
    MemoryEmbedded,
    SubjectErased,
)
from schemas.avro import MAGIC
from schemas.sealed import is_sealed, sealed_kind
from sinks.clickhouse import (
    CHANGES,
    FAST_TYPES,
    ClickHouseHistory,
    change_row,
    native_coders,
    record_row,
    version_table,
)
from sinks.clients import offset_probe, partitions_of
from sinks.embedding import Embedder
from sinks.keys import OpenEvent, Unsealing
from sinks.transcode import Transcoder
from sinks.vectors import (
    Hit,
    LendsVersions,
    Point,
    Scope,
    SparseVector,
    VectorIndex,
    VectorWriter,
    canonical_id,
)
from streams.logwriter import LogWriter, Record
from streams.vectors import (
    VECTOR_TYPES,
    Creation,
    Op,
    PlainRecords,
    Recorded,
    Terms,
    apply_operations,
    creation_of,
    creation_of_record,
    embedded_and_weighed,
    embedded_event,
    header_kind,
    millis,
    operations,
)

log = logging.getLogger("engram.rebuild")

Target = Literal["clickhouse", "vectors"]
State = Literal["running", "swapping", "settling", "done", "failed", "cancelled"]

NATIVE_FLUSH_RECORDS = 100_000
"""Records of the native road gathered before they are handed to ClickHouse: each
insert plans its ``SELECT`` once per schema (10-60 ms on chdb), so batches are large."""


class Cancelled(Exception):
    """The rebuild was asked to stop before its swap."""


# --------------------------------------------------------------------------- status


class JobView(BaseModel):
    """What the status of every long admin job says (a rebuild's, a reprocess's):
    ``done`` of ``total`` offsets read, the rate and ETA, what was cleaned up first."""

    model_config = ConfigDict(extra="forbid")

    phase: str
    done: int = 0
    total: int = 0
    rate: float = 0.0
    eta_s: float | None = None
    keep: bool = False
    cleaned: list[str] = []
    started_at: datetime
    finished_at: datetime | None = None
    error: str | None = None


class RebuildStatus(JobView):
    """Where a rebuild is: offsets of ``engram.memory`` read (``done`` of ``total``,
    the end offsets of the last pass), events applied, rate and versions."""

    target: Target
    state: State
    applied: int = 0
    live: int | None = None
    building: int | None = None
    previous: int | None = None


@dataclass(kw_only=True)
class Run:
    """The mutable side of a long admin job's status, updated by its thread."""

    phase: str = "starting"
    done: int = 0
    total: int = 0
    cleaned: list[str] = field(default_factory=list)
    error: str | None = None
    started: float = field(default_factory=time.monotonic)
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    finished_at: datetime | None = None
    ended: float | None = None
    cancel: threading.Event = field(default_factory=threading.Event)

    def view(self, running: bool) -> dict[str, Any]:
        """The :class:`JobView` fields as of now (an ETA only while ``running``)."""
        rate, eta = pace(self.done, self.total, self.started, self.ended, running)
        return {
            "phase": self.phase,
            "done": self.done,
            "total": self.total,
            "rate": rate,
            "eta_s": eta,
            "cleaned": list(self.cleaned),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "error": self.error,
        }

    def end(self, phase: str, error: str | None) -> None:
        self.phase, self.error = phase, error
        self.finished_at, self.ended = datetime.now(UTC), time.monotonic()


@dataclass
class Progress(Run):
    """A rebuild's :class:`Run`."""

    target: Target
    keep: bool
    state: State = "running"
    applied: int = 0
    live: int | None = None
    building: int | None = None
    previous: int | None = None

    def status(self) -> RebuildStatus:
        return RebuildStatus(
            **self.view(self.state == "running"),
            target=self.target,
            state=self.state,
            applied=self.applied,
            live=self.live,
            building=self.building,
            previous=self.previous,
            keep=self.keep,
        )

    def finish(self, state: State, phase: str, error: str | None = None) -> None:
        self.state = state
        self.end(phase, error)


# --------------------------------------------------------------------------- the log


class LogReader:
    """Reads ``topic`` from its first offsets, pass after pass, in log order per
    partition. ``max_rate`` (records/s) throttles it, so a rebuild need not starve
    the live pipeline.

    End offsets are asked by a client of their own (``probe``, no partitions): a
    broker answers a connection's requests in order, so on the reading consumer's
    connection a ``ListOffsets`` waits behind the fetch in flight, which once the
    reader is caught up is a long poll of ``fetch_max_wait_ms`` (500 ms), twice
    per rebuild, once with the live projection held."""

    def __init__(self, bootstrap: str, topic: str, *, max_rate: float | None = None) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.max_rate = max_rate
        self.consumer: AIOKafkaConsumer | None = None
        self.probe: AIOKafkaConsumer | None = None
        self.partitions: list[TopicPartition] = []
        self.positions: dict[TopicPartition, int] = {}
        self.first: dict[TopicPartition, int] = {}

    async def start(self) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=8 * 1024 * 1024,
            fetch_max_bytes=64 * 1024 * 1024,
        )
        await consumer.start()
        self.consumer = consumer
        self.probe = await offset_probe(self.bootstrap)
        self.partitions = await partitions_of(consumer, self.topic, TOPIC_PATIENCE_S)
        if not self.partitions:
            raise LookupError(f"topic {self.topic!r} does not exist on {self.bootstrap}")
        consumer.assign(self.partitions)
        self.first = await consumer.beginning_offsets(self.partitions)
        await consumer.seek_to_beginning(*self.partitions)
        self.positions = dict(self.first)

    async def stop(self) -> None:
        consumer, probe, self.consumer, self.probe = self.consumer, self.probe, None, None
        try:
            if consumer is not None:
                await consumer.stop()
        finally:
            if probe is not None:
                await probe.stop()

    async def ends(self) -> dict[TopicPartition, int]:
        assert self.probe is not None
        ends: dict[TopicPartition, int] = await self.probe.end_offsets(self.partitions)
        return ends

    def done(self) -> int:
        return sum(self.positions[tp] - self.first[tp] for tp in self.partitions)

    def total(self, ends: dict[TopicPartition, int]) -> int:
        return sum(ends[tp] - self.first[tp] for tp in self.partitions)

    def lag(self, ends: dict[TopicPartition, int]) -> int:
        return sum(max(ends[tp] - self.positions[tp], 0) for tp in self.partitions)

    async def read_to(
        self,
        ends: dict[TopicPartition, int],
        apply: Callable[[list[bytes]], Awaitable[None]],
        check: Callable[[], None],
    ) -> None:
        """Read every partition up to ``ends``, then on until a fetch brings nothing
        (or ``TAIL`` more records), handing each fetch's values to ``apply`` in order;
        ``check`` runs between fetches (it may raise). The tail is read because an end
        offset may lag the log: Tansu's ``ListOffsets`` answers a few records short of
        the last one of a partition."""

        async def values(records: list[ConsumerRecord[Any, Any]]) -> None:
            await apply([r.value or b"" for r in records])

        await self.read_records_to(ends, values, check)

    async def read_records_to(
        self,
        ends: dict[TopicPartition, int],
        apply: Callable[[list[ConsumerRecord[Any, Any]]], Awaitable[None]],
        check: Callable[[], None],
    ) -> None:
        """:meth:`read_to`, handing the whole records (partition, offset, key, value)."""
        assert self.consumer is not None
        started, read, tail = time.monotonic(), 0, 0
        most = 5000 if not self.max_rate else max(1, min(5000, int(self.max_rate / 4)))
        while tail < TAIL:
            check()
            behind = [tp for tp in self.partitions if self.positions[tp] < ends[tp]]
            fetched = await self.consumer.getmany(
                *(behind or self.partitions), timeout_ms=500 if behind else 200, max_records=most
            )
            batch: list[ConsumerRecord[Any, Any]] = []
            for tp, records in fetched.items():
                if records:
                    batch += records
                    self.positions[tp] = records[-1].offset + 1
            if batch:
                await apply(batch)
                read += len(batch)
                tail += 0 if behind else len(batch)
            elif not behind:
                return
            if self.max_rate:
                ahead = read / self.max_rate - (time.monotonic() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)


TAIL = 2_000
"""Records read past the end offsets before a pass ends even if more keep coming."""

TOPIC_PATIENCE_S = 5.0
"""How long :func:`partitions_of` asks again for a topic the broker does not list yet."""


# --------------------------------------------------------------------------- targets


class Projection(Protocol):
    """One rebuildable projection: versions, a writer for the new one, a swap."""

    settle_s: float
    """Longest wait after the swap for what the old version got just before it."""

    async def settled(self, progress: Progress) -> int:
        """After the swap: how many agents may still miss changes (0: none)."""
        ...

    async def prepare(self, progress: Progress) -> None: ...
    async def apply(self, events: list[DerivedEvent]) -> int: ...
    async def complete(self, progress: Progress) -> None:
        """Before the swap, once caught up: what the log alone did not give."""
        ...

    def barrier(self) -> contextlib.AbstractContextManager[Any]: ...
    async def swap(self, progress: Progress) -> None: ...
    async def finish(self, progress: Progress) -> None: ...
    async def abort(self, progress: Progress) -> None: ...


@runtime_checkable
class ReadsBytes(Protocol):
    """A projection that reads the log's bytes itself (a faster road than the typed
    events of :func:`decode_derived`): :meth:`read` runs on the rebuild's loop while
    the previous batch is written, :meth:`write` is what :meth:`Projection.apply`
    does with the events."""

    def read(self, values: Sequence[bytes], codec: Codec, open_event: OpenEvent | None) -> Any: ...
    async def write(self, batch: Any) -> int: ...


class ClickHouseProjection:
    """``memory_changes``: rows of every derived event but ``memory.embedded``.

    Erasures: a ``subject.erased`` purges its subject from the table being written as
    the live sink did from the live one (the log still holds, sealed under *other*
    subjects' keys, documents the erased subject had shaped: another user's persona
    version, the ``previous_value`` of a shared fact; crypto-shredding cannot reach
    them, the purge's rewrite does). Only that table: the live purge did the rest and
    wrote the receipts when the erasure was folded. The purges are deferred and run
    together (:meth:`ClickHouseHistory.purge_rebuilt`): once ``purge_every`` wait, in
    :meth:`complete` (before the last pass), and before the swap; after it (settling
    into the live table) at once. Deferring changes nothing: a purge only concerns its
    agent's rows before the erasure, all written when the erasure is read. That is the
    road of :func:`rebuild` (:meth:`read`, :meth:`write`); :meth:`apply` keeps the
    live sink's purge for callers that swap by themselves."""

    def __init__(
        self,
        history: ClickHouseHistory,
        *,
        settle_s: float = 30.0,
        purge_every: int = 4096,
        native: bool = True,
        flush_records: int = NATIVE_FLUSH_RECORDS,
    ) -> None:
        self.history = history
        self.settle_s = settle_s
        self.purge_every = purge_every
        self.native = native
        self.flush_records = flush_records
        self.table = CHANGES
        self.version: int | None = None
        self.swapped = False
        self.pending: list[SubjectErased] = []
        """Erasures read whose purge of ``table`` has not run yet."""
        self.excluded: str | None = None
        """Before the swap, where the purges name the rows they take out of the new
        version (copied without them once, at the swap: :meth:`ClickHouseHistory.
        keep_unexcluded`); after it, the purges of the live table delete."""
        self.coders: dict[bytes, Transcoder] = {}
        """Per fingerprint, the native road of a current derived schema (while a new
        version is written; empty on the Python road and once swapped)."""
        self.bodies: dict[bytes, list[bytes]] = {}
        """Bodies read for the native road and not handed to ClickHouse yet."""
        self.rows: list[list[Any]] = []
        """Rows of the Python road waiting with them."""
        self.buffered = 0
        self.flushing: asyncio.Future[None] | None = None
        self.codec = Codec()

    async def prepare(self, progress: Progress) -> None:
        h = self.history
        progress.cleaned = [*progress.cleaned, *await h.call(h.clean_versions)]
        progress.live = await h.call(h.live_version)
        self.version = progress.building = await h.call(h.create_version)
        self.table = version_table(self.version)
        version = self.version
        self.excluded = await h.call(lambda: h.exclusions(version))
        if self.native:
            self.coders = native_coders(self.codec)

    async def apply(self, events: list[DerivedEvent]) -> int:
        """Write the batch's rows and purge its erasures at once as the live sink does
        (:meth:`ClickHouseHistory.erase_many`: every table, receipts): the road of a
        caller that drives the projection and swaps by itself (a reprocess), where
        nothing says when deferred purges would be due. :func:`rebuild` takes
        :meth:`read` and :meth:`write`, whose purges are deferred (see the class)."""
        changes = [e for e in events if not isinstance(e, MemoryEmbedded)]
        await self.history.write_changes(self.table, changes)
        erasures = [e for e in changes if isinstance(e, SubjectErased)]
        if erasures:
            h = self.history
            await h.call(lambda: h.erase_many(erasures))
        return len(changes)

    def read(
        self, values: Sequence[bytes], codec: Codec, open_event: OpenEvent | None = None
    ) -> Changes:
        """:func:`change_rows`: the rows :meth:`apply` would write for these bytes,
        the bodies of the native road set apart."""
        self.codec = codec
        return change_rows(codec, values, open_event, self.coders)

    async def write(self, batch: Changes) -> int:
        """Insert the rows into ``table``; the bodies join the native road's buffer,
        handed to ClickHouse once ``flush_records`` wait (one batch at a time, while
        the log is read on); the erasures join the pending purges."""
        if not self.coders:  # the Python road: rows go in batch by batch
            rows, table, h = batch.rows, self.table, self.history
            if rows:
                await h.call(lambda: h.insert_change_rows(table, rows))
        else:  # the native road: the rows wait with the bodies (an insert costs ~50 ms)
            self.rows += batch.rows
            self.buffered += len(batch.rows)
        for fp, bodies in batch.bodies.items():
            self.bodies.setdefault(fp, []).extend(bodies)
            self.buffered += len(bodies)
        if self.buffered >= self.flush_records:
            await self.flush()
        self.pending += batch.erasures
        if self.pending and (self.swapped or len(self.pending) >= self.purge_every):
            await self.purge()
        return len(batch.rows) + sum(len(b) for b in batch.bodies.values())

    async def flush(self) -> None:
        """Hand the buffered bodies to ClickHouse after the batch before them is in."""
        await self.flushed()
        rows, groups, table = self.rows, self.bodies, self.table
        self.rows, self.bodies, self.buffered = [], {}, 0
        if rows or groups:
            h = self.history
            self.flushing = asyncio.ensure_future(
                h.call(lambda: self.insert_native(table, rows, groups))
            )

    async def flushed(self) -> None:
        """Wait until the batch handed to ClickHouse is in (raising what it raised)."""
        flushing, self.flushing = self.flushing, None
        if flushing is not None:
            await flushing

    def insert_native(
        self, table: str, rows: list[list[Any]], groups: dict[bytes, list[bytes]]
    ) -> None:
        """Insert the rows, then the groups through their transcoders, all in one
        insert; if ClickHouse refuses it (bytes that do not read), group by group, and
        a group it refuses takes the Python road, whose reader logs and skips what does
        not decode as a rebuild always did (what a refused insert wrote before failing
        is written again alike: the table keeps one of each)."""
        h = self.history
        h.insert_change_rows(table, rows)
        coded = [(self.coders[fp], bodies) for fp, bodies in groups.items()]
        try:
            h.insert_bodies(table, coded)
            return
        except Exception as error:
            if len(coded) == 1:
                self.python_road(table, *coded[0], error)
                return
        for coder, bodies in coded:
            try:
                h.insert_bodies(table, [(coder, bodies)])
            except Exception as error:
                self.python_road(table, coder, bodies, error)

    def python_road(
        self, table: str, coder: Transcoder, bodies: list[bytes], error: Exception
    ) -> None:
        """Write ``bodies`` by :func:`change_rows` after ClickHouse refused them."""
        log.warning(
            "ClickHouse did not read %d %s records (%s): taking the Python road",
            len(bodies),
            coder.event_type,
            str(error).splitlines()[0][:200],
        )
        header = MAGIC + coder.fingerprint
        values = [header + body for body in bodies]
        self.history.insert_change_rows(table, change_rows(self.codec, values).rows)

    async def purge(self) -> None:
        """Run the pending purges on ``table``, once every row read before them is in."""
        pending, table, h, excluded = self.pending, self.table, self.history, self.excluded
        self.pending = []
        if pending:
            await self.flush()
            await self.flushed()
            await h.call(lambda: h.purge_rebuilt(table, pending, excluded))

    def barrier(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    async def complete(self, progress: Progress) -> None:
        """Every row comes from the log; the purges pending so far run here, before
        the last pass, so that few are left for the swap."""
        await self.flush()
        await self.purge()

    async def swap(self, progress: Progress) -> None:
        version, h = self.version, self.history
        assert version is not None
        await self.flush()
        await self.flushed()
        await self.purge()
        await h.call(lambda: h.keep_unexcluded(version))
        progress.previous = await h.call(lambda: h.swap_version(version))
        progress.live, progress.building = version, None
        self.table, self.swapped = CHANGES, True  # settle reads into the live table
        self.excluded = None  # ... whose purges delete
        self.coders = {}  # ... by the Python road: a few records at a time

    async def settled(self, progress: Progress) -> int:
        previous, h = progress.previous, self.history
        return 0 if previous is None else await h.call(lambda: h.agents_ahead(previous))

    async def finish(self, progress: Progress) -> None:
        await self.purge()
        previous, h = progress.previous, self.history
        if not progress.keep and previous is not None:
            await h.call(lambda: h.drop_version(previous))

    async def abort(self, progress: Progress) -> None:
        version, h = self.version, self.history
        self.pending = []  # the version they concern is dropped
        self.rows, self.bodies, self.buffered = [], {}, 0
        with contextlib.suppress(Exception):
            await self.flushed()
        if version is not None and not self.swapped:
            await h.call(lambda: h.drop_version(version))
            progress.building = None


@dataclass(frozen=True)
class Waiting:
    """A memory waiting for its vector of the model: whose it is, and its creation (the
    event, or its plain bytes, decoded only if it has to be embedded)."""

    agent_id: str
    user_id: str | None
    created: MemoryCreated | bytes


class EmbeddingStage:
    """The embedding stage of a vector rebuild: the ``memory.created`` whose log holds a
    ``memory.embedded`` of another model but none of this one (the stack's model was
    changed: the live ``engram.embed`` agent never goes back to them) are embedded and
    their vectors published to the derived log (so the next rebuild replays them), as
    the live agent does. A creation with no vector at all is the live agent's, still
    on its way (it embeds behind the fold): left to it, not embedded twice. What an
    erasure removed is not embedded."""

    def __init__(
        self,
        embedder: Embedder,
        topic: str,
        make_writer: Callable[[], Awaitable[tuple[LogWriter, Codec]]],
        batch: int = 256,
    ) -> None:
        self.embedder = embedder
        self.topic = topic
        self.make_writer = make_writer
        self.batch = batch
        self.pending: dict[str, Waiting] = {}  # creations with no vector of the model met
        self.embedded: set[str] = set()  # memories with a vector of the model
        self.stale: set[str] = set()  # memories with a vector of another model

    def wait(self, memory_id: str, agent_id: str, user_id: str | None, raw: bytes) -> None:
        """A creation read from its plain bytes waits for its vector of the model, as
        :meth:`note` of its event would have it wait."""
        self.pending[memory_id] = Waiting(agent_id, user_id, raw)

    def vector(self, memory_id: str, model: str) -> None:
        """A recorded vector of ``memory_id`` by ``model``, met in the log (before or
        after its creation: a reprocess records reused vectors in its own order)."""
        if model == self.embedder.name:
            self.embedded.add(memory_id)
            self.pending.pop(memory_id, None)
        else:
            self.stale.add(memory_id)

    def due(self) -> dict[str, Waiting]:
        """The memories to embed here: created, with another model's vector and none
        of this one."""
        return {m: w for m, w in self.pending.items() if m in self.stale and m not in self.embedded}

    def note(self, events: Sequence[DerivedEvent]) -> None:
        """Follow the log: creations wait for their vector of the model."""
        for event in events:
            if isinstance(event, MemoryCreated):
                self.pending[event.body.memory_id] = Waiting(event.agent_id, event.user_id, event)
            elif isinstance(event, MemoryEmbedded):
                self.vector(event.body.memory_id, event.body.model)
            elif isinstance(event, SubjectErased):
                owners = (
                    {event.body.subject, None}
                    if event.body.subject == event.agent_id
                    else {event.body.subject}
                )
                for memory_id, waiting in list(self.pending.items()):
                    if waiting.agent_id == event.agent_id and waiting.user_id in owners:
                        del self.pending[memory_id]

    async def run(self) -> list[MemoryEmbedded]:
        """Embed and publish every :meth:`due` memory, in batches; return the records."""
        writer, codec = await self.make_writer()
        out: list[MemoryEmbedded] = []
        loop = asyncio.get_running_loop()
        try:
            todo = creations(codec, self.due().values())
            for start in range(0, len(todo), self.batch):
                created = todo[start : start + self.batch]
                texts = [e.body.text for e in created]
                vectors, weights = await loop.run_in_executor(
                    None, embedded_and_weighed, self.embedder, texts
                )
                embedded = [
                    embedded_event(e, self.embedder, v, t)
                    for e, v, t in zip(created, vectors, weights, strict=True)
                ]
                records = [
                    Record(e.agent_id.encode(), codec.encode(e), millis(e)) for e in embedded
                ]
                await writer.send(self.topic, records)
                out += embedded
            self.pending.clear()
            return out
        finally:
            await writer.stop()


def creations(codec: Codec, waiting: Iterable[Waiting]) -> list[MemoryCreated]:
    """The creations of the ``waiting`` memories, their plain bytes decoded."""
    out: list[MemoryCreated] = []
    for created in (w.created for w in waiting):
        event = created if isinstance(created, MemoryCreated) else codec.decode(created)
        if isinstance(event, MemoryCreated):
            out.append(event)
    return out


class VectorProjection:
    """The vector collection of one embedding model (``model``'s vectors only).

    On an index that lends versions (:class:`sinks.vectors.LendsVersions`: Edge), the
    version being built is written by a writer process from :meth:`prepare` until
    :meth:`complete` takes it back, so Edge's writes (which hold the interpreter lock)
    run beside the reading and decoding instead of between them; the last pass and
    the swap then run in this process, under the live projection's gate as before."""

    settle_s = 0.0

    async def settled(self, progress: Progress) -> int:
        return 0  # the last pass and the swap ran with the live projection held

    def __init__(
        self,
        index: VectorIndex,
        model: str,
        gate: threading.Lock | None = None,
        embedding: EmbeddingStage | None = None,
    ) -> None:
        self.index = index
        self.model = model
        self.gate = gate
        self.embedding = embedding
        self.version: int | None = None
        self.writer: VectorWriter | None = None
        self.lent = False
        self.swapped = False
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="engram-rebuild-vectors")
        self.plain: tuple[Codec, PlainRecords] | None = None

    async def prepare(self, progress: Progress) -> None:
        live = progress.live = self.index.live_version()
        for version in self.index.versions():
            if version > live:
                self.index.drop_version(version)
                progress.cleaned = [*progress.cleaned, f"vectors v{version}"]
        self.version = progress.building = self.index.create_version()
        if isinstance(self.index, LendsVersions):
            self.writer, self.lent = self.index.lend(self.version), True
        else:
            self.writer = self.index.pinned(self.version)

    async def apply(self, events: list[DerivedEvent]) -> int:
        if self.embedding is not None:
            self.embedding.note(events)
        return await self.write(operations(events, self.model))

    def read(
        self, values: Sequence[bytes], codec: Codec, open_event: OpenEvent | None = None
    ) -> list[Op]:
        """The store operations of ``values``, in log order, as :meth:`apply` makes
        them of :func:`decode_derived`'s events. Recorded vectors and creations in plain
        current-schema Avro (sealed ones once ``open_event``, an
        :class:`~sinks.keys.Unsealing` opener, unsealed them) are read without pydantic
        (:class:`PlainRecords`: the fold and the embedding agent validated what they
        wrote), the others of the types the
        projection acts on take the typed road, and the rest is skipped by its header
        (working memory, episodes … : most of the log). A creation takes the BM25
        weights recorded beside a vector of it in the same batch (``memory.embedded``'s
        ``terms``, where :func:`recorded_terms` vouches for them: the weights its text
        gives today), else they are computed from its text."""
        plain = self.plain_records(codec)
        read = BatchRead()
        unseal = open_event.unseal if isinstance(open_event, Unsealing) else None
        for value in values:
            kind = header_kind(codec, value)
            if kind is not None and kind not in VECTOR_TYPES:
                continue  # read from the header alone: no decoding
            if unseal is not None and kind in PLAIN_KINDS and is_sealed(value):
                value = unseal(value) or value  # its clear bytes read as plain ones
            recorded = plain.vector(value) if kind == EMBEDDED else None
            record = plain.creation(value) if kind == CREATED else None
            if recorded is not None:
                self.take_vector(recorded, read)
            elif record is None or not self.take_creation(record, value, read):
                self.take_events(decode_derived(codec, [value], open_event), read)
        return read.operations()

    def plain_records(self, codec: Codec) -> PlainRecords:
        """The plain reader of ``codec``'s schemas (made once per codec)."""
        if self.plain is None or self.plain[0] is not codec:
            self.plain = codec, PlainRecords(codec)
        return self.plain[1]

    def take_vector(self, recorded: Recorded, read: BatchRead) -> None:
        """A recorded vector: its weights for its creation, its vector if of the model."""
        read.note(recorded)
        if self.embedding is not None:
            self.embedding.vector(recorded.memory_id, recorded.model)
        if recorded.model == self.model:
            read.items.append(Op("dense", (recorded.memory_id, recorded.vector)))

    def take_creation(self, record: dict[str, Any], value: bytes, read: BatchRead) -> bool:
        """A plain creation; False when its record makes no point (the typed road)."""
        try:
            creation = creation_of_record(record)
        except (KeyError, TypeError, ValueError):
            return False
        if self.embedding is not None:
            payload = creation.bare.payload
            memory_id = record["body"]["memory_id"]
            self.embedding.wait(memory_id, payload["agent_id"], payload["user_id"], value)
        read.items.append(creation)
        return True

    def take_events(self, events: list[DerivedEvent], read: BatchRead) -> None:
        """Typed events: as :func:`operations`, creations and vectors as above."""
        if self.embedding is not None:
            self.embedding.note(events)
        for event in events:
            if isinstance(event, MemoryCreated):
                read.items.append(creation_of(event))
                continue
            if isinstance(event, MemoryEmbedded):
                read.note(Recorded.of(event))
            read.items += operations([event], self.model)

    async def write(self, changes: list[Op]) -> int:
        """Apply ``changes`` (coalesced) to the version being built; return how many."""
        ops, writer = coalesce(changes), self.writer
        assert writer is not None
        if ops:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self.pool, lambda: apply_operations(writer, ops))
        return len(changes)

    async def complete(self, progress: Progress) -> None:
        """Take the version back from its writer process (the writes in flight are
        drained: :func:`rebuild` calls this between passes), then embed the memories
        the log has no vector of this model for (the model was changed): the embedding
        stage alone, recorded on the log like the live one's."""
        if self.lent and isinstance(self.index, LendsVersions) and self.version is not None:
            version, index = self.version, self.index
            await asyncio.get_running_loop().run_in_executor(
                self.pool, lambda: index.reclaim(version)
            )
            self.writer, self.lent = self.index.pinned(version), False
        due = self.embedding.due() if self.embedding is not None else {}
        if self.embedding is None or not due:
            return
        progress.phase = f"embedding {len(due)} memories with {self.model}"
        embedded = await self.embedding.run()
        progress.applied += await self.apply(list(embedded))

    def barrier(self) -> contextlib.AbstractContextManager[Any]:
        return self.gate if self.gate is not None else contextlib.nullcontext()

    async def swap(self, progress: Progress) -> None:
        assert self.version is not None
        progress.previous = self.index.live_version()
        self.index.swap(self.version)
        progress.live, progress.building, self.swapped = self.version, None, True

    async def finish(self, progress: Progress) -> None:
        self.pool.shutdown(wait=True)
        if not progress.keep and progress.previous is not None:
            self.index.drop_version(progress.previous)

    async def abort(self, progress: Progress) -> None:
        self.pool.shutdown(wait=True)
        if self.version is not None and not self.swapped:
            self.index.drop_version(self.version)
            progress.building = None


@dataclass
class BatchRead:
    """A batch of the log as the vector rebuild reads it: operations in log order,
    creations waiting for their weights (:class:`Creation`), and the weights recorded
    in the batch by the id of the creation they belong to."""

    items: list[Op | Creation] = field(default_factory=list)
    terms: dict[str, Terms] = field(default_factory=dict)

    def note(self, recorded: Recorded) -> None:
        """Keep the weights a recorded vector brings (any model's) for its creation."""
        if recorded.terms is not None:
            self.terms[recorded.created_by] = recorded.terms

    def operations(self) -> list[Op]:
        """The batch's operations; each creation an upsert with its recorded weights,
        or with weights computed from its text."""
        terms = self.terms
        return [
            item if isinstance(item, Op) else Op("upsert", item.point(terms.get(item.event_id)))
            for item in self.items
        ]


def coalesce(ops: list[Op]) -> list[Op]:
    """The same end state in fewer store calls: a dense vector set after its point's
    upsert in the same batch rides on the upsert, then all upserts, all vectors and
    all payload changes go as one run each, each kept in log order. A batch with an
    erasure (deletes by agent and user, which must follow what they delete) is left
    as it is.

    Valid because upserts replace whole points and come first per point (a memory
    is created before it is embedded or changed), while vectors and payload fields
    are disjoint, so a point's vector and payload changes commute. A batch with an
    upsert after another change of the same point is left as it is."""
    if any(op.kind == "erase" for op in ops):
        return ops
    touched: set[str] = set()
    upserted: dict[str, int] = {}
    for position, op in enumerate(ops):
        point_id = op.item.id if op.kind == "upsert" else canonical_id(op.item[0])
        if op.kind == "upsert":
            if point_id in touched:
                return ops
            upserted[point_id] = position
        else:
            touched.add(point_id)
    points = {position: ops[position].item for position in upserted.values()}
    dense, payload = [], []
    for op in ops:
        at = upserted.get(canonical_id(op.item[0])) if op.kind == "dense" else None
        if at is not None:
            point = points[at]  # a new Point, not dataclasses.replace: a tenth of the cost
            points[at] = Point(point.id, op.item[1], point.sparse, point.payload)
        elif op.kind == "dense":
            dense.append(op)
        elif op.kind == "payload":
            payload.append(op)
    upserts = [Op("upsert", points[at]) for at in sorted(points)]
    return upserts + dense + payload


# --------------------------------------------------------------------------- the run


EMBEDDED = MemoryEmbedded.TYPE
CREATED = MemoryCreated.TYPE

PLAIN_KINDS = frozenset({EMBEDDED, CREATED})
"""The types :meth:`VectorProjection.read` reads as plain records (sealed ones once
unsealed)."""

CAUGHT_UP = 2_000
"""Lag (records) below which a rebuild stops its open passes and swaps."""


def decode_derived(
    codec: Codec, values: Sequence[bytes], open_event: OpenEvent | None = None
) -> list[DerivedEvent]:
    """The derived events among ``values``; undecodable bytes are logged and skipped
    (the fold wrote them, so that is a bug, not input). ``open_event`` (see
    :func:`sinks.keys.open_waiting`) reads sealed ones too; what it finds shredded
    (None: an erased subject) is skipped."""
    read = open_event or codec.decode
    out: list[DerivedEvent] = []
    for value in values:
        try:
            event = read(value)
        except BadEvent as bad:
            log.error("undecodable record on the derived log: %s", bad.reason)
            continue
        if isinstance(event, DerivedEvent):
            out.append(event)
    return out


@dataclass(frozen=True)
class Changes:
    """A batch of the derived log as rows of ``memory_changes`` (in log order), its
    erasures, and the bodies of the records left to the native road."""

    rows: list[list[Any]]
    erasures: list[SubjectErased]
    bodies: dict[bytes, list[bytes]] = field(default_factory=dict)
    """Per writer fingerprint (a key of the ``native`` given to :func:`change_rows`),
    the Avro bodies of those records, in log order."""


def change_rows(
    codec: Codec,
    values: Sequence[bytes],
    open_event: OpenEvent | None = None,
    native: Mapping[bytes, Transcoder] | None = None,
) -> Changes:
    """The rows of :func:`sinks.clickhouse.change_row` of :func:`decode_derived`'s
    events among ``values`` but ``memory.embedded``, equal value for value, and the
    erasures among them. Plain Avro of a current derived schema is read without
    pydantic (:meth:`Codec.read_record`, :func:`sinks.clickhouse.record_row`): the fold
    validated what it wrote; so are the clear bytes of a sealed derived event that
    ``open_event`` (:class:`~sinks.keys.Unsealing`) unseals without decoding;
    anything else (an older writer schema, JSON, bad bytes, erasures, sealed bytes it
    does not unseal) takes :func:`decode_derived`'s road. Plain Avro within the size
    limit whose fingerprint is a key of ``native`` is not read at all: its body goes
    to :attr:`Changes.bodies`, for ClickHouse to read (:mod:`sinks.transcode`)."""
    rows: list[list[Any]] = []
    erasures: list[SubjectErased] = []
    bodies: dict[bytes, list[bytes]] = {}
    native = native or {}
    limit = codec.max_bytes
    embedded = {fp for fp, w in codec.writers.items() if w.reader.event_type is MemoryEmbedded}
    unseal = open_event.unseal if isinstance(open_event, Unsealing) else None
    for value in values:
        if unseal is not None and is_sealed(value):
            if sealed_kind(value) == EMBEDDED:  # skipped by its clear envelope
                continue
            value = unseal(value) or value  # the clear bytes take the roads below
        fp = value[2:10]
        if fp in native and value[:2] == MAGIC and len(value) <= limit:
            group = bodies.get(fp)
            if group is None:
                group = bodies[fp] = []
            group.append(value[10:])
            continue
        if fp in embedded and value[:2] == MAGIC:  # skipped by header
            continue
        found = codec.read_record(value)
        kind = found[0] if found is not None else None
        if kind is MemoryEmbedded:
            continue
        if found is not None and kind in FAST_TYPES:
            rows.append(record_row(found[1]))
            continue
        for event in decode_derived(codec, [value], open_event):
            if isinstance(event, MemoryEmbedded):
                continue
            rows.append(change_row(event))
            if isinstance(event, SubjectErased):
                erasures.append(event)
    return Changes(rows, erasures, bodies)


async def rebuild(
    projection: Projection,
    reader: LogReader,
    progress: Progress,
    codec: Codec | None = None,
    open_event: OpenEvent | None = None,
) -> RebuildStatus:
    """Run one rebuild to its end (done, cancelled or failed); see the module doc.
    ``open_event`` opens sealed records (:func:`decode_derived`)."""
    codec = codec or Codec()
    swapped = False
    writing: asyncio.Future[int] | None = None  # one batch written while the next is read

    def check() -> None:
        progress.done = reader.done()
        if progress.cancel.is_set() and not swapped:
            raise Cancelled

    async def drain() -> None:
        nonlocal writing
        if writing is not None:
            write, writing = writing, None
            progress.applied += await write

    async def apply(values: list[bytes]) -> None:
        nonlocal writing
        if isinstance(projection, ReadsBytes):
            batch = projection.read(values, codec, open_event)
            await drain()
            writing = asyncio.ensure_future(projection.write(batch))
        else:
            events = decode_derived(codec, values, open_event)
            await drain()
            writing = asyncio.ensure_future(projection.apply(events))
        await asyncio.sleep(0)  # the write starts now, not when the next batch is read
        progress.done = reader.done()
        progress.total = max(progress.total, progress.done)  # records arrived meanwhile

    async def catch_up() -> None:
        ends = await reader.ends()
        progress.total = max(reader.total(ends), reader.done())
        await reader.read_to(ends, apply, check)
        await drain()

    try:
        await reader.start()
        progress.phase = "preparing"
        await projection.prepare(progress)
        progress.phase = "copying"
        await catch_up()
        while reader.lag(await reader.ends()) >= CAUGHT_UP:
            await catch_up()
        await projection.complete(progress)
        progress.state, progress.phase = "swapping", "last pass and swap"
        with projection.barrier():
            await catch_up()
            check()
            await projection.swap(progress)
            swapped = True
        if projection.settle_s:
            progress.state, progress.phase = "settling", "reading what arrived during the swap"
            deadline = time.monotonic() + projection.settle_s
            while behind := await projection.settled(progress):
                if time.monotonic() > deadline:
                    log.warning("%d agents still behind the previous version", behind)
                    progress.error = f"{behind} agents still behind the previous version"
                    break
                await asyncio.sleep(0.2)
                await catch_up()
        await projection.finish(progress)
        progress.done = reader.done()
        progress.finish("done", "done", progress.error)  # a settling warning stays
    except Cancelled:
        with contextlib.suppress(Exception):
            await drain()
        await projection.abort(progress)
        progress.finish("cancelled", "cancelled: the live version is unchanged")
    except Exception as error:
        log.exception("rebuild of %s failed", progress.target)
        if not swapped:
            with contextlib.suppress(Exception):
                await drain()
            with contextlib.suppress(Exception):
                await projection.abort(progress)
        progress.finish("failed", "failed", repr(error))
    finally:
        await reader.stop()
    return progress.status()


# --------------------------------------------------------------------------- in engram up


class GatedIndex:
    """The live vector projection's handle: writes pass a gate that a rebuild holds
    while it takes its last pass and swaps; reads and versions go straight through."""

    def __init__(self, inner: VectorIndex) -> None:
        self.inner = inner
        self.gate = threading.Lock()

    def ensure(self, dims: int) -> None:
        with self.gate:
            self.inner.ensure(dims)

    def upsert(self, points: Sequence[Point]) -> None:
        with self.gate:
            self.inner.upsert(points)

    def set_dense(self, items: Sequence[tuple[str, list[float]]]) -> None:
        with self.gate:
            self.inner.set_dense(items)

    def set_payload(self, items: Sequence[tuple[str, dict[str, Any]]]) -> None:
        with self.gate:
            self.inner.set_payload(items)

    def erase(self, agent_id: str, user_id: str | None) -> int:
        with self.gate:
            return self.inner.erase(agent_id, user_id)

    def search_dense(self, vector: list[float], scope: Scope, limit: int) -> list[Hit]:
        return self.inner.search_dense(vector, scope, limit)

    def search_sparse(self, vector: SparseVector, scope: Scope, limit: int) -> list[Hit]:
        return self.inner.search_sparse(vector, scope, limit)

    def get(self, ids: Sequence[str], scope: Scope) -> list[Hit]:
        return self.inner.get(ids, scope)

    def count(self, scope: Scope) -> int:
        return self.inner.count(scope)

    def optimize(self) -> None:
        self.inner.optimize()

    def live_version(self) -> int:
        return self.inner.live_version()

    def versions(self) -> list[int]:
        return self.inner.versions()

    def create_version(self, dims: int | None = None) -> int:
        return self.inner.create_version(dims)

    def use_version(self, version: int | None) -> None:
        self.inner.use_version(version)

    def swap(self, version: int) -> None:
        self.inner.swap(version)

    def drop_version(self, version: int) -> None:
        self.inner.drop_version(version)

    def pinned(self, version: int) -> VectorIndex:
        return self.inner.pinned(version)

    def points(self, version: int | None = None) -> list[Point]:
        return self.inner.points(version)

    def close(self) -> None:
        self.inner.close()


class Busy(Exception):
    """A rebuild of the same target is running already."""


class Rebuilds:
    """The rebuilds of one ``engram up``: at most one per target at a time, each on
    a thread of its own; the last status of each target is kept for polling."""

    def __init__(
        self,
        *,
        bootstrap: str,
        topic: str,
        history: ClickHouseHistory,
        vectors: GatedIndex | None,
        model: str | None,
        settle_s: float = 30.0,
        open_event: OpenEvent | None = None,
        busy: Callable[[], str | None] = lambda: None,
        embedder: Embedder | None = None,
        make_writer: Callable[[], Awaitable[tuple[LogWriter, Codec]]] | None = None,
    ) -> None:
        self.embedder = embedder
        self.make_writer = make_writer
        self.open_event = open_event
        self.busy = busy
        self.bootstrap = bootstrap
        self.topic = topic
        self.history = history
        self.vectors = vectors
        self.model = model
        self.settle_s = settle_s
        self.jobs: dict[str, tuple[Progress, threading.Thread]] = {}
        self.lock = threading.Lock()

    def projection(self, target: Target) -> Projection:
        if target == "clickhouse":
            return ClickHouseProjection(self.history, settle_s=self.settle_s)
        if self.vectors is None or self.model is None:
            raise LookupError("this stack has no vector store")
        stage = (
            EmbeddingStage(self.embedder, self.topic, self.make_writer)
            if self.embedder is not None and self.make_writer is not None
            else None
        )
        return VectorProjection(self.vectors.inner, self.model, self.vectors.gate, stage)

    def running(self) -> str | None:
        """Why a reprocess must wait (a rebuild runs), or None."""
        for target, (progress, thread) in self.jobs.items():
            if thread.is_alive():
                return f"a rebuild of {target} is running since {progress.started_at:%H:%M:%S}"
        return None

    def start(self, target: Target, *, keep: bool, max_rate: float | None) -> RebuildStatus:
        with self.lock:
            job = self.jobs.get(target)
            if job is not None and job[1].is_alive():
                raise Busy(f"a rebuild of {target} is running since {job[0].started_at:%H:%M:%S}")
            if reason := self.busy():
                raise Busy(reason)
            projection = self.projection(target)
            progress = Progress(target, keep)
            reader = LogReader(self.bootstrap, self.topic, max_rate=max_rate)
            thread = threading.Thread(
                target=lambda: asyncio.run(
                    rebuild(projection, reader, progress, open_event=self.open_event)
                ),
                name=f"engram-rebuild-{target}",
                daemon=True,
            )
            self.jobs[target] = (progress, thread)
            thread.start()
            return progress.status()

    def status(self, target: Target) -> RebuildStatus | None:
        job = self.jobs.get(target)
        return job[0].status() if job is not None else None

    def cancel(self, target: Target) -> RebuildStatus | None:
        job = self.jobs.get(target)
        if job is None:
            return None
        job[0].cancel.set()
        return job[0].status()

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel every running rebuild and wait a little for each (engram up stops)."""
        for progress, thread in list(self.jobs.values()):
            progress.cancel.set()
            thread.join(timeout)


class RebuildRequest(BaseModel):
    """``keep`` the previous version; ``max_rate`` caps the records read per second."""

    model_config = ConfigDict(extra="forbid")

    target: Target
    keep: bool = False
    max_rate: float | None = Field(default=None, gt=0)


def rebuild_router(rebuilds: Rebuilds) -> APIRouter:
    """``POST /v1/admin/rebuilds``, ``GET`` and ``DELETE /v1/admin/rebuilds/{target}``."""
    router = APIRouter(tags=["admin"])

    @router.post(
        "/v1/admin/rebuilds",
        status_code=202,
        response_model=RebuildStatus,
        summary="Start a blue/green rebuild of a projection",
        description=(
            "Reads `engram.memory` from the beginning into a new version of the target "
            "(`clickhouse`: the `memory_changes` table; `vectors`: the collection), swaps it "
            "in atomically once caught up, and drops the previous version unless `keep`."
        ),
        responses={409: {"model": Problem}, 503: {"model": Problem}},
    )
    async def start(request: RebuildRequest) -> RebuildStatus | JSONResponse:
        try:
            return rebuilds.start(request.target, keep=request.keep, max_rate=request.max_rate)
        except Busy as busy:
            return problem(409, "rebuild running", str(busy))
        except LookupError as missing:
            return problem(503, "cannot rebuild", str(missing))

    @router.get(
        "/v1/admin/rebuilds/{target}",
        response_model=RebuildStatus,
        summary="Progress of the latest rebuild of a target",
        responses={404: {"model": Problem}},
    )
    async def status(target: Target) -> RebuildStatus | JSONResponse:
        found = rebuilds.status(target)
        return found if found is not None else problem(404, "no rebuild", f"none of {target}")

    @router.delete(
        "/v1/admin/rebuilds/{target}",
        response_model=RebuildStatus,
        summary="Cancel a running rebuild (before its swap; the live version stays)",
        responses={404: {"model": Problem}},
    )
    async def cancel(target: Target) -> RebuildStatus | JSONResponse:
        found = rebuilds.cancel(target)
        return found if found is not None else problem(404, "no rebuild", f"none of {target}")

    return router


# --------------------------------------------------------------------------- the CLI side


class RebuildFailed(RuntimeError):
    """The stack refused the rebuild, or it ended failed."""


class JobStatus(Protocol):
    """What a long admin job's status tells the CLI that follows it."""

    @property
    def state(self) -> str: ...
    @property
    def phase(self) -> str: ...
    @property
    def done(self) -> int: ...
    @property
    def total(self) -> int: ...
    @property
    def rate(self) -> float: ...
    @property
    def eta_s(self) -> float | None: ...


S = TypeVar("S", bound=JobStatus)
UNDER_WAY = ("running", "swapping", "settling")
"""The states of a job that has not ended."""


def pace(
    done: int, total: int, started: float, ended: float | None, running: bool
) -> tuple[float, float | None]:
    """Rate (per second since ``started``) and, while ``running``, the ETA in seconds."""
    rate = done / max((ended or time.monotonic()) - started, 1e-6)
    left = max(total - done, 0)
    return round(rate, 1), (round(left / rate, 1) if running and rate > 0 else None)


def status_or_raise(
    response: httpx.Response, parse: Callable[[Any], S], failed: type[Exception]
) -> S:
    """The job status in ``response`` (``parse`` of its JSON); ``failed`` with the
    stack's reason on a refusal."""
    if response.status_code >= 400:
        try:
            reason = response.json().get("reason") or response.text
        except ValueError:
            reason = response.text
        raise failed(f"the stack refused: {reason}")
    return parse(response.json())


def follow(
    client: httpx.Client,
    path: str,
    status: S,
    read: Callable[[httpx.Response], S],
    *,
    title: str,
    unit: str,
    console: Console,
    poll_s: float,
) -> S:
    """Follow the job at ``path`` with a progress bar (``unit`` done of total, rate,
    ETA, phase) until it ends; Ctrl-C cancels it (``DELETE``) and waits for that."""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TextColumn("{task.fields[rate]}"),
        TextColumn("{task.fields[eta]}"),
        TimeElapsedColumn(),
        TextColumn("[dim]{task.fields[phase]}"),
    )
    with ProgressBar(*columns, console=console, transient=False) as bar:
        task = bar.add_task(title, total=None, rate="", eta="", phase="")
        try:
            while status.state in UNDER_WAY:
                time.sleep(poll_s)
                status = read(client.get(path))
                bar.update(
                    task,
                    completed=status.done,
                    total=status.total or None,
                    rate=f"{status.rate:,.0f} events/s",
                    eta=f"ETA {status.eta_s:,.0f}s" if status.eta_s is not None else "",
                    phase=status.phase,
                )
        except KeyboardInterrupt:
            bar.update(task, phase="cancelling…")
            status = read(client.delete(path))
            while status.state in UNDER_WAY:
                time.sleep(poll_s)
                status = read(client.get(path))
        bar.update(task, completed=status.done, total=status.total or 1, eta="")
    return status


def run_rebuild(
    http: str,
    target: Target,
    *,
    keep: bool,
    max_rate: float | None,
    console: Console,
    poll_s: float = 0.25,
) -> RebuildStatus:
    """Start a rebuild on the stack at ``http`` and follow it with a progress bar
    until it ends; Ctrl-C cancels it (before its swap) and waits for that."""
    body = {"target": target, "keep": keep, "max_rate": max_rate}

    def read(response: httpx.Response) -> RebuildStatus:
        return status_or_raise(response, RebuildStatus.model_validate, RebuildFailed)

    with httpx.Client(base_url=http, timeout=30) as client:
        status = read(client.post("/v1/admin/rebuilds", json=body))
        path = f"/v1/admin/rebuilds/{target}"
        title = f"rebuild {target}"
        return follow(
            client, path, status, read, title=title, unit="offsets", console=console, poll_s=poll_s
        )
