"""Wiring: engram.events -> processors -> engram.memory, with the ClickHouse history.

The ``fold`` agent reads raw bytes from ``engram.events`` (through a
:class:`~streams.app.DirectFeed` unless the worker turns it off); decodes (bad bytes go
to the dead-letter topic with the reason), skips what it has already applied,
drops duplicate ``event_id``s, assigns the per-agent sequence and runs the
processors. What the folds produce is flushed in groups by a :class:`Flusher`, one
group at a time and in order, while the next batches are folded (group commit):
the raw events and their memory changes are written to ClickHouse and the derived
events published to ``engram.memory`` (the derived log that other projections and
rebuilds consume); then the agents' states due at this close (see
:data:`STATE_SAVE_EVERY`), as they were when the group closed, are written to the
state table's changelog with the partitions' marks; only then are the group's
messages acked. An event is durable once its group is: what the states saved do not
hold yet is folded again from the marks after a crash. With a
:class:`~streams.summariser.Summariser` (an LLM, when configured) a group's episode
summaries are rewritten before the history write and the publish, so both hold the
same record.

Redelivery is harmless: each agent's stored state records the last offset it
applied per source partition, so a batch delivered again after a crash is
skipped event by event, exactly, whatever its size; what was written before the
crash is rewritten with the same rows and the same derived ids (idempotent).

Nothing is skipped either: the fold does not trust the consumer group's committed
offset (faust can commit past messages it never delivered, see
:class:`streams.app.Transport`). With the states it saves, per partition, the offset
of the last message it processed (a *mark*); a message past the mark means a hole,
and the partition is read again from the mark; a partition without a mark is read
from the start of its log. A stopping worker finishes its last flush first.

Rollbacks and forks (``memory.rolled_back``, ``memory.forked``) fold a past the
processors cannot read: the first time the fold meets one, it holds it (and what
follows on its partition) like a message past a hole; the batch is flushed, the
past is read from the archive (:mod:`streams.past`, retried in place while
ClickHouse fails), and the partition is read again from the request, which then
folds with its past. A request the fold refuses (a rollback beyond the agent's
log, a fork onto an agent with events) goes to the dead-letter topic with why.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, cast
from uuid import UUID, uuid5

import faust
from faust.types import TP

from processors import AgentMemory, AgentState, MemoryConfig, Step
from processors.erasure import ERASURE_AGENT
from processors.memory import DUPLICATE
from processors.rebase import Past
from schemas import (
    RAW_TYPE_NAMES,
    BadEvent,
    ClockTicked,
    Codec,
    DerivedEvent,
    Event,
    MemoryForked,
    MemoryRolledBack,
    Model,
    SubjectErasureRequested,
)
from schemas.letters import keep_sealed
from schemas.sealed import SealedEnvelope, SealingCodec
from sinks.clickhouse import (
    CHECKPOINT_EVERY,
    ArchivedEvent,
    Checkpoint,
    ClickHouseHistory,
    SequencedEvent,
)
from streams import faults
from streams.app import Topics, ack_messages, agent_batches, direct_feed
from streams.logwriter import LogWriter, Record
from streams.ordered import Holes, holes_of
from streams.past import history_rows, read_past
from streams.retry import retry_in_place
from streams.summariser import Summariser

if TYPE_CHECKING:
    from streams.ingest import WorkerKeys

log = logging.getLogger("engram.streams")
REASON_HEADER = "engram.reason"
SOURCE_HEADER = "engram.source"


class StoredState(Model):
    """What the state table holds per agent: its memory and, per source
    partition, the offset of the last message applied to it."""

    memory: AgentState
    positions: dict[int, int] = {}


@dataclass(frozen=True)
class DeadLetter:
    """Bytes the pipeline could not use, with why and where they came from."""

    key: bytes | None
    raw: bytes
    reason: str
    source: str


MARK_PREFIX = b"\x00processed:"
"""State-table keys of the per-partition marks: the offset of the last message of the
partition that the fold has processed (applied, dead-lettered, or found applied
before), saved with the agents' states. Agent ids cannot start with NUL."""


PastReader = Callable[[str, int], Awaitable[Past]]
"""``(agent_id, upto)`` to that agent's past up to sequence ``upto``."""


STATE_CHANGELOG = {
    "max.compaction.lag.ms": str(3600 * 1000),
    "segment.ms": str(3600 * 1000),
    "min.cleanable.dirty.ratio": "0.01",
}
"""Topic configs of the agent-state changelog (compacted by faust): a superseded state
is compacted away within about an hour (plus the log cleaner's own delay), so the
states an erasure replaced, which still hold the erased subject, do not outlive it on
the log for Kafka's default seven days. (The embedded broker keeps nothing across a
restart, and never compacts.)"""


def mark_key(partition: int) -> bytes:
    return MARK_PREFIX + str(partition).encode()


MAX_PENDING = 60_000
"""How many folded messages may wait for a flush before the fold waits for it (the
:class:`Flusher`'s backpressure). A flush writes its history in ClickHouse, which costs
~40 µs of chdb's CPU a raw event (its ``events`` and ``memory_changes`` rows, built from
their Avro off the interpreter lock) and goes one flush at a time. At 20 000 the fold of
the sealed ingest bench waited for flushes ~40 % of a run (5–10 s of ~22 s): it folds
20 000 events in ~2 s and a flush of them took ~2.5 s. At 60 000 it did not wait
(BENCHMARKS.md, "Stop 29"); a crash reads again at most what is pending and the flush
in progress, as before."""

STATE_SAVE_EVERY = 10
"""How many flushes the worker's fold lets an agent's saved state lag its live one.

An agent's state is saved whole (to the changelog and as a ClickHouse checkpoint), so
saving every touched agent at every flush costs in proportion to the states' size,
not to the events folded: at 100 000 events of 100 agents a state was ~230 KB and 2 ms
to serialise, and a flush of 1 000 events saved 23 MB. Each agent is saved at one
flush in ``STATE_SAVE_EVERY`` instead (its slot: a hash of its id), and at once when it
is new or folded an erasure, a rollback or a fork, or when its sequence enters a new
stretch of ``CHECKPOINT_EVERY`` (the checkpoints a replay as of T starts from), and at
every drain (a stop, a revocation), and once the fold has been quiet for :data:`SETTLE_S`.
While an agent is unsaved, the mark of its partition stays before its first unsaved
event, so a worker that crashes reads that partition again from there, and each agent
passes over what its saved state holds already (see :class:`Folder`)."""


@dataclass
class Unsaved:
    """An agent folded since its state was last saved: the offset of its partition
    that the partition's mark may not pass until it is saved (the offset before its
    first unsaved event)."""

    partition: int
    bound: int


@dataclass
class FoldResult:
    """What one batch of raw events produced; ``touched`` maps each agent whose
    state changed to the partition its state is kept in. ``held`` are messages
    not folded because an earlier offset of their partition is missing: ``gaps``
    maps each such partition to the offset to read again from."""

    sequenced: list[SequencedEvent] = field(default_factory=list)
    derived: list[DerivedEvent] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    touched: dict[str, int] = field(default_factory=dict)
    held: list[Any] = field(default_factory=list)
    gaps: dict[int, int] = field(default_factory=dict)
    wanted: dict[UUID, tuple[str, int]] = field(default_factory=dict)
    """Rollbacks and forks held for their past: request id -> (agent, last seq) to read."""
    waiting: set[int] = field(default_factory=set)
    """The partitions of ``gaps`` held at a rollback or fork (not at a hole)."""


@dataclass
class LiveAgent:
    memory: AgentMemory
    positions: dict[int, int]

    def stored(self) -> bytes:
        return (
            StoredState(memory=self.memory.state(), positions=self.positions)
            .model_dump_json()
            .encode()
        )


class StateTable(Protocol):
    """Where a :class:`Folder` keeps agent states and marks: the worker's faust table
    (its ``data``, changelogged by the flush), or a plain mapping for a fold that
    writes its changelog itself (a reprocess, :mod:`ops.reprocess`)."""

    @property
    def data(self) -> MutableMapping[bytes, bytes]: ...


class Delivery(Protocol):
    """What the fold takes of a delivered message: a faust event, or a
    :class:`~streams.app.Delivered` message of a direct feed."""

    @property
    def message(self) -> Any: ...


class Folder:
    """Holds the live per-agent memories of this worker between batches.

    The cache is only an accelerator for the changelogged table: it is dropped
    when partitions are revoked and whenever the agent restarts.
    """

    def __init__(
        self,
        table: StateTable,
        codec: Codec,
        config: MemoryConfig,
        *,
        save_every: int = 1,
        checkpoint_every: int = CHECKPOINT_EVERY,
    ) -> None:
        if save_every < 1:
            raise ValueError("save_every must be 1 or more")
        self.table = table
        self.codec = codec
        self.config = config
        self.save_every = save_every
        self.checkpoint_every = checkpoint_every
        self.saved_seq: dict[str, int] = {}  # per agent: its sequence at its last save
        self.live: dict[str, LiveAgent] = {}
        self.homes: dict[int, set[str]] | None = None
        self.next: dict[int, int] = {}  # per partition: the offset to fold next
        self.processed: dict[int, int] = {}  # per partition: the last offset processed
        self.written: dict[int, int] = {}  # per partition: the last mark saved
        self.unsaved: dict[str, Unsaved] = {}  # agents folded since their last save
        self.urgent: set[str] = set()  # unsaved agents to save at the next close
        self.closes = 0
        self.pasts: dict[UUID, Past] = {}  # read for held rollbacks and forks
        self.read_past: PastReader | None = None

    def forget(self) -> None:
        """Drop what this worker holds between batches (partitions were revoked)."""
        self.live.clear()
        self.next.clear()
        self.processed.clear()
        self.written.clear()
        self.unsaved.clear()
        self.urgent.clear()
        self.homes = None

    def expected(self, partition: int) -> int | None:
        """The offset the next message of ``partition`` must have: one after the last
        processed (by this life, or saved by an earlier one); None if none ever was."""
        found = self.next.get(partition)
        if found is None:
            saved = self.table.data.get(mark_key(partition))
            if saved is not None:
                self.written.setdefault(partition, int(saved))
                found = self.next[partition] = int(saved) + 1
        return found

    def unmarked(self, partitions: Iterable[int]) -> list[int]:
        """Those of ``partitions`` whose next offset is not known: none of their
        messages was ever processed (or its mark was never saved)."""
        return sorted(p for p in set(partitions) if self.expected(p) is None)

    def start(self, partition: int, offset: int) -> None:
        """Fold ``partition`` from ``offset`` (its log start, when it has no mark)."""
        self.next[partition] = offset

    def agents_on(self, partition: int) -> list[str]:
        """Every agent whose events arrive on ``partition`` (live or in the table)."""
        if self.homes is None:
            self.homes = {}
            for key, value in self.table.data.items():
                if key.startswith(MARK_PREFIX):
                    continue
                for home in StoredState.model_validate_json(value).positions:
                    self.homes.setdefault(home, set()).add(key.decode())
        for agent_id, live in self.live.items():
            for home in live.positions:
                self.homes.setdefault(home, set()).add(agent_id)
        return sorted(self.homes.get(partition, ()))

    def agent(self, agent_id: str) -> LiveAgent:
        live = self.live.get(agent_id)
        if live is None:
            saved = self.table.data.get(agent_id.encode())
            stored = (
                StoredState.model_validate_json(saved)
                if saved is not None
                else StoredState(memory=AgentState(agent_id=agent_id))
            )
            memory = AgentMemory(stored.memory, self.config)
            live = self.live[agent_id] = LiveAgent(memory, dict(stored.positions))
        return live

    def fold(self, batch: Sequence[Delivery]) -> FoldResult:
        """Fold the batch's messages, each partition strictly in offset order from its
        mark: a message past a hole (an offset never delivered to the fold, whatever
        the consumer group committed) is held, and its partition read again from the
        hole; a message before the mark was processed already and is passed over."""
        result = FoldResult()
        for item in batch:
            message = item.message
            partition, offset = message.partition, message.offset
            if partition in result.gaps:
                result.held.append(message)
                continue
            expected = self.expected(partition)
            if expected is not None and offset > expected:
                result.gaps[partition] = expected
                result.held.append(message)
                continue
            if expected is not None and offset < expected:
                continue  # processed before: acked with the batch, nothing else
            if not self._fold_one(message, result):
                result.gaps[partition] = offset  # a rollback or fork waits for its past
                result.waiting.add(partition)
                result.held.append(message)
                continue
            self.next[partition] = offset + 1
            self.processed[partition] = offset
        return result

    def _fold_one(self, message: Any, result: FoldResult) -> bool:
        """Fold one message: clear or sealed bytes (sealed ones open with the keys the
        fold agent covered the batch with, so no UnknownKey here); a shredded event takes
        its agent's next sequence number and nothing else (nothing applied or archived):
        a replay after an erasure numbers the other events as the first fold did.
        False: a rollback or fork whose past must be read first (``result.wanted``)."""
        raw: bytes = message.value or b""
        source = f"{message.topic}:{message.partition}:{message.offset}"
        try:
            event, clear = _open_clear(self.codec, raw)
            if event is None:  # sealed under a destroyed key: the subject is erased
                assert isinstance(self.codec, SealingCodec)
                self._hold_place(self.codec.envelope(raw), message, result)
                return True
            payload = raw if raw[:2] == b"\xc3\x01" else _clear(self.codec, event)
        except BadEvent as bad:
            result.dead.append(DeadLetter(message.key, raw, bad.reason, source))
            return True
        if isinstance(event, ClockTicked) and event.agent_id == CLOCK_AGENT:
            for agent_id in self.agents_on(message.partition):
                tick = tick_for(event, agent_id)
                self._apply(tick, _clear(self.codec, tick), message, raw, source, result)
            return True
        if isinstance(event, SubjectErasureRequested) and event.agent_id == ERASURE_AGENT:
            for agent_id in self.agents_on(message.partition):
                erasure = erasure_for(event, agent_id)
                self._apply(erasure, _clear(self.codec, erasure), message, raw, source, result)
            return True
        return self._apply(event, payload, message, raw, source, result, clear)

    def _hold_place(self, envelope: SealedEnvelope, message: Any, result: FoldResult) -> None:
        """A shredded event's place in its agent's sequence (see :meth:`_fold_one`)."""
        live = self.agent(envelope.agent_id)
        if message.offset <= live.positions.get(message.partition, -1):
            return  # redelivered
        live.memory.take_place(envelope.event_id)
        live.positions[message.partition] = message.offset
        self._touch(envelope.agent_id, message, result)

    def _apply(
        self,
        event: Event,
        payload: bytes,
        message: Any,
        raw: bytes,
        source: str,
        result: FoldResult,
        clear: bytes | None = None,
    ) -> bool:
        """Fold ``event`` into its agent; False when it waits for its past. ``clear``:
        the clear bytes a sealed ``payload`` opened to (:class:`SequencedEvent`)."""
        live = self.agent(event.agent_id)
        if message.offset <= live.positions.get(message.partition, -1):
            return True  # applied before a crash or rebalance: redelivered, not new
        fold = self._stepper(live.memory, event, result)
        if fold is None:
            return False
        live.positions[message.partition] = message.offset
        urgent = isinstance(event, SubjectErasureRequested | MemoryRolledBack | MemoryForked)
        self._touch(event.agent_id, message, result, urgent=urgent)
        try:
            step = fold()
        except Exception as error:  # a processor bug or a refused request, visibly
            reason = f"processor failed on {event.type}: {error!r}"
            result.dead.append(DeadLetter(message.key, raw, reason, source))
            return True
        if step.seq is not None:
            result.sequenced.append(SequencedEvent(event, step.seq, payload, clear))
            result.derived.extend(step.derived)
        return True

    def _touch(self, agent_id: str, message: Any, result: FoldResult, urgent: bool = False) -> None:
        """Note that ``message`` changed ``agent_id``'s state (unsaved since then)."""
        result.touched.setdefault(agent_id, message.partition)
        if agent_id not in self.unsaved:
            self.unsaved[agent_id] = Unsaved(message.partition, message.offset - 1)
        if urgent:
            self.urgent.add(agent_id)

    def _stepper(
        self, memory: AgentMemory, event: Event, result: FoldResult
    ) -> Callable[[], Step] | None:
        """How to fold ``event``; None (and the past noted in ``result.wanted``) for a
        rollback or fork whose past has not been read yet."""
        if not isinstance(event, MemoryRolledBack | MemoryForked):
            return lambda: memory.apply(event)
        if memory.seen(event):
            return lambda: DUPLICATE
        past = self.pasts.pop(event.event_id, None)
        if isinstance(event, MemoryRolledBack):
            if past is None:
                result.wanted[event.event_id] = (event.agent_id, event.body.to_seq)
                return None
            return lambda: memory.roll_back(event, past)
        if past is None:
            result.wanted[event.event_id] = (event.body.source_agent_id, event.body.source_seq)
            return None
        return lambda: memory.fork(event, past)

    async def fetch_pasts(self, wanted: dict[UUID, tuple[str, int]]) -> None:
        """Read the pasts ``wanted`` (after a flush: the archive holds what was folded)."""
        if self.read_past is None:
            raise RuntimeError("this fold has no archive to read a past from")
        for request, (agent_id, upto) in wanted.items():
            self.pasts[request] = await self.read_past(agent_id, upto)

    def state_records(
        self, touched: dict[str, int], *, final: bool = False
    ) -> tuple[list[Record], list[Checkpoint]]:
        """Changelog records of the states saved at this close and of the partitions'
        marks (also set in the table), and the same states as history checkpoints.

        Saved: every agent in ``touched`` that was not folded since its last save
        (a reprocess names them all at its end) and every unsaved agent whose turn it
        is: all of them with ``save_every`` 1 or ``final``, else those that folded an
        erasure, a rollback or a fork, those never saved, and those whose slot this
        close is (one close in ``save_every``, by a hash of the id). A partition's
        mark is the last offset processed, held before the first unsaved event of any
        agent of that partition still unsaved; it is written when it moves."""
        self.closes += 1
        chosen = {a for a in touched if a not in self.unsaved}
        chosen |= {a for a in self.unsaved if final or self._due(a)}
        records, checkpoints = [], []
        for agent_id in sorted(chosen):
            live = self.live[agent_id]
            partition = touched.get(agent_id)
            if partition is None:
                partition = self.unsaved[agent_id].partition
            key, value = agent_id.encode(), live.stored()
            self.table.data[key] = value
            records.append(Record(key, value, partition=partition))
            checkpoints.append(Checkpoint(agent_id, live.memory.seq, value))
            self.saved_seq[agent_id] = live.memory.seq
            self.unsaved.pop(agent_id, None)
            self.urgent.discard(agent_id)
        for partition, offset in sorted(self.marks().items()):
            key, value = mark_key(partition), str(offset).encode()
            self.table.data[key] = value
            records.append(Record(key, value, partition=partition))
            self.written[partition] = offset
        return records, checkpoints

    def _due(self, agent_id: str) -> bool:
        """Whether an unsaved agent is saved at this close (see :meth:`state_records`)."""
        if self.save_every == 1 or agent_id in self.urgent:
            return True
        if agent_id.encode() not in self.table.data:
            return True  # a new agent's first state: small, and soon known to a restart
        if self._new_stretch(agent_id):
            return True  # the history keeps it: a replay as of a moment starts from it
        return (zlib.crc32(agent_id.encode()) + self.closes) % self.save_every == 0

    def _new_stretch(self, agent_id: str) -> bool:
        """Whether the agent's sequence entered a new stretch of ``checkpoint_every``
        since its last save (one this worker made: after a restart, from the first
        close on), so that the history keeps about one checkpoint per stretch
        (:meth:`~sinks.clickhouse.ClickHouseHistory.write`) whatever ``save_every``."""
        seq = self.live[agent_id].memory.seq
        last = self.saved_seq.setdefault(agent_id, seq)
        return seq // self.checkpoint_every > last // self.checkpoint_every

    def marks(self) -> dict[int, int]:
        """The marks that moved: per partition, the last offset processed, held before
        the first unsaved event of its unsaved agents (none below -1: a partition whose
        first message is unsaved has no mark, and is read from the start)."""
        bounds = dict(self.processed)
        for unsaved in self.unsaved.values():
            if unsaved.partition in bounds:
                bounds[unsaved.partition] = min(bounds[unsaved.partition], unsaved.bound)
        return {p: o for p, o in bounds.items() if o > self.written.get(p, -1)}


def _open(codec: Codec, raw: bytes) -> Event | None:
    """Clear or sealed bytes to an event (None: shredded); plain codecs read clear only."""
    return _open_clear(codec, raw)[0]


def _open_clear(codec: Codec, raw: bytes) -> tuple[Event | None, bytes | None]:
    """:func:`_open`'s event, and the clear bytes of sealed ``raw`` when the open
    decrypted them (:meth:`~schemas.sealed.SealingCodec.open_clear`); else None."""
    if isinstance(codec, SealingCodec):
        return codec.open_clear(raw)
    return codec.decode(raw), None


def _clear(codec: Codec, event: Event) -> bytes:
    """The clear Avro bytes of ``event`` (what clear events and ticks are archived as)."""
    return codec.encode_clear(event) if isinstance(codec, SealingCodec) else codec.encode(event)


CLOCK_AGENT = "__clock__"
"""The agent id of the ticker's ``clock.tick``: the fold applies such a tick to every
agent of the partition it arrives on, as one ``clock.tick`` per agent (archived in
that agent's log, so a per-agent replay meets the same ticks)."""


def tick_for(tick: ClockTicked, agent_id: str) -> ClockTicked:
    """The ticker's tick as seen by one agent (a ``uuid5`` id: the same on every replay)."""
    return tick.model_copy(
        update={"event_id": uuid5(tick.event_id, agent_id), "agent_id": agent_id}
    )


def erasure_for(request: SubjectErasureRequested, agent_id: str) -> SubjectErasureRequested:
    """The broadcast request as seen by one agent. It keeps the request's ``event_id``
    (what the caller follows the erasure by, and what ``subject.erased`` names): an
    agent's events all arrive on one partition, so each agent meets the id once and
    its dedupe drops a redelivered copy; ids are not unique across agents anyway."""
    return request.model_copy(update={"agent_id": agent_id})


def erasure_subjects(codec: Codec, raws: Sequence[bytes | None]) -> dict[str, datetime]:
    """The subjects the broadcast erasure requests among ``raws`` name (clear Avro or
    JSON: the requests carry no content and are never sealed), in order, once each,
    with when they were requested (the latest request's ``requested_at``, else its
    event time: the keys made by then are destroyed);
    bytes that do not decode are left to the fold (a dead letter). A per-agent request
    (an archived copy that a restore publishes again, or one aimed at one agent)
    purges its agent but destroys no key: a restore must not destroy the keys the
    subject was given after its erasure."""
    subjects: dict[str, datetime] = {}
    for raw in raws:
        if raw is None or not _is_erasure(codec, raw):
            continue
        try:
            event = codec.decode(raw)
        except BadEvent:
            continue
        if isinstance(event, SubjectErasureRequested) and event.agent_id == ERASURE_AGENT:
            when = event.body.requested_at or event.occurred_at
            subject = event.body.subject
            subjects[subject] = max(when, subjects.get(subject, when))
    return subjects


def _is_erasure(codec: Codec, raw: bytes) -> bool:
    writer = codec.writers.get(raw[2:10]) if raw[:2] == b"\xc3\x01" else None
    if writer is not None:
        return writer.reader.event_type is SubjectErasureRequested
    return raw.lstrip()[:1] == b"{" and SubjectErasureRequested.TYPE.encode() in raw


async def shred_requested(keys: WorkerKeys, codec: Codec, raws: Sequence[bytes | None]) -> None:
    """Destroy the data keys of every subject an erasure request in ``raws`` names,
    before the batch is folded (so the purge is never visible while the key lives).
    Idempotent: a subject without live keys writes nothing (a redelivered request)."""
    subjects = erasure_subjects(codec, raws)
    if not subjects or keys.ring is None:
        return
    await keys.ready()
    for subject, requested in subjects.items():
        destroyed = await keys.ring.destroy(subject, made_by=requested)
        log.info("erasure of %r: destroyed %d data keys", subject, len(destroyed))


def dead_letter_records(dead: Sequence[DeadLetter], codec: Codec | None = None) -> list[Record]:
    """The dead-letter topic's records of ``dead``: the reason and source in headers,
    the bytes sealed (:func:`schemas.letters.keep_sealed`) when ``codec`` seals, so
    that the topic keeps no clear content an erasure could not reach."""
    keyring = codec.keyring if isinstance(codec, SealingCodec) else None
    records = []
    for d in dead:
        log.warning("dead letter from %s: %s", d.source, d.reason)
        value = d.raw
        if keyring is not None and codec is not None:
            value = keep_sealed(keyring, d.raw, d.key, codec)
        headers = [(REASON_HEADER, d.reason.encode()), (SOURCE_HEADER, d.source.encode())]
        records.append(Record(d.key, value, headers=headers))
    return records


def derived_records(
    codec: Codec, derived: Sequence[Event], bodies: list[bytes] | None = None
) -> list[Record]:
    """The records that publish ``derived`` (sealed, by a sealing codec). With
    ``bodies``, each event's clear Avro single-object bytes are appended to it, in
    order (encoded once for both: the history's native road reads them). Without
    ``bodies``, each is :meth:`~schemas.Codec.encode`'d (a sealing codec's sealer then
    remembers it, as its ``remember`` says)."""
    records = []
    for e in derived:
        if bodies is None:
            value = codec.encode(e)
        else:
            clear, value = codec.encode_with_clear(e)
            bodies.append(clear)
        records.append(Record(e.agent_id.encode(), value, int(e.occurred_at.timestamp() * 1000)))
    return records


@dataclass
class Group:
    """What a run of folded batches produced, flushed together."""

    sequenced: list[SequencedEvent] = field(default_factory=list)
    derived: list[DerivedEvent] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    touched: dict[str, int] = field(default_factory=dict)
    messages: list[Any] = field(default_factory=list)
    states: list[Record] = field(default_factory=list)
    checkpoints: list[Checkpoint] = field(default_factory=list)

    def absorb(self, result: FoldResult, messages: Sequence[Any]) -> None:
        self.sequenced += result.sequenced
        self.derived += result.derived
        self.dead += result.dead
        for agent_id, partition in result.touched.items():
            self.touched.setdefault(agent_id, partition)
        self.messages += messages


@dataclass(frozen=True)
class Sinks:
    """Where a flush writes: the history and the three topics."""

    history: ClickHouseHistory
    writer: LogWriter
    codec: Codec
    memory_topic: str
    dead_letter_topic: str
    changelog_topic: str


class Flusher:
    """Flushes folded groups one at a time, in order, overlapping the next folds.

    :meth:`add` never waits unless ``max_pending`` messages are waiting for a
    flush (backpressure); :meth:`drain` returns when everything added is flushed
    and acked. A flush never raises: every write is retried in place, and the
    ``summariser``, when given, never raises either.
    """

    def __init__(
        self,
        folder: Folder,
        sinks: Sinks,
        consumer: Any,
        max_pending: int,
        summariser: Summariser | None = None,
    ) -> None:
        self.folder = folder
        self.sinks = sinks
        self.consumer = consumer
        self.max_pending = max_pending
        self.summariser = summariser
        self.pending = Group()
        self.task: asyncio.Future[None] | None = None
        self.last_add = time.monotonic()
        self.unacked: list[Any] = []  # flushed, waiting for their agents' states
        self.flushing = 0
        """The messages of the group being flushed (0 between flushes)."""

    async def add(self, result: FoldResult, messages: Sequence[Any]) -> None:
        self.last_add = time.monotonic()
        self.pending.absorb(result, messages)
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._flush_all())
        elif len(self.pending.messages) >= self.max_pending:
            await self.drain(save_all=False)

    @property
    def waiting(self) -> int:
        """Messages folded whose history is not written yet: pending, or being flushed."""
        return len(self.pending.messages) + self.flushing

    async def drain(self, *, save_all: bool = True) -> None:
        """Flush everything added; with ``save_all``, then save every agent state not
        saved yet (a stop or a revocation: the next owner starts from the saved ones)."""
        while self.pending.messages or (self.task is not None and not self.task.done()):
            if self.task is None or self.task.done():
                self.task = asyncio.ensure_future(self._flush_all())
            await asyncio.shield(self.task)
        if save_all and self.folder.unsaved:
            self.task = asyncio.ensure_future(self._save_all())
            await asyncio.shield(self.task)

    def settle(self, idle_s: float) -> bool:
        """Save every unsaved state if nothing was added for ``idle_s`` seconds and no
        flush runs (a quiet worker's checkpoints catch up with its states); True when
        a save was started. Never waits."""
        quiet = time.monotonic() - self.last_add >= idle_s
        idle = self.task is None or self.task.done()
        if not (quiet and idle and self.folder.unsaved and not self.pending.messages):
            return False
        self.task = asyncio.ensure_future(self._save_all())
        return True

    def _ack_saved(self, messages: Sequence[Any]) -> None:
        """Ack the messages that the saved marks cover; the others (an agent they went
        to is not saved yet) wait for a later save, so the committed offsets never pass
        the marks and a restart reads on from where the saved states end."""
        written, waiting = self.folder.written, [*self.unacked, *messages]
        self.unacked = []
        saved: list[Any] = []
        for message in waiting:
            if message.offset <= written.get(message.partition, -1):
                saved.append(message)
            else:
                self.unacked.append(message)
        ack_messages(self.consumer, saved)

    async def _save_all(self) -> None:
        """One flush that saves every unsaved state, then whatever was added meanwhile."""
        await self._flush(self._close(final=True))
        await self._flush_all()

    def _close(self, final: bool = False) -> Group:
        """Take the pending group, with the states saved at this close as of now
        (every unsaved one when ``final``)."""
        group, self.pending = self.pending, Group()
        group.states, group.checkpoints = self.folder.state_records(group.touched, final=final)
        return group

    async def _flush_all(self) -> None:
        while self.pending.messages:
            await self._flush(self._close())

    async def _flush(self, group: Group) -> None:
        self.flushing = len(group.messages)
        try:
            await self._write(group)
        finally:
            self.flushing = 0

    async def _write(self, group: Group) -> None:
        """Write ``group`` (history, derived events, dead letters, then the states) and
        ack what its saved states cover."""
        started = time.perf_counter()
        sinks = self.sinks
        if self.summariser is not None:
            group.derived = await self.summariser.rewrite(group.derived, group.sequenced)
        bodies: list[bytes] = []
        derived = derived_records(sinks.codec, group.derived, bodies)
        dead = dead_letter_records(group.dead, sinks.codec)
        await asyncio.gather(
            retry_in_place(
                lambda: faults.after(
                    "flush.history",
                    faults.guarded(
                        "clickhouse",
                        sinks.history.write(
                            group.sequenced, group.derived, group.checkpoints, bodies
                        ),
                    ),
                ),
                what="write history",
            ),
            retry_in_place(
                lambda: faults.after(
                    "flush.derived", sinks.writer.send(sinks.memory_topic, derived)
                ),
                what="publish derived",
            ),
            retry_in_place(
                lambda: sinks.writer.send(sinks.dead_letter_topic, dead), what="dead letters"
            ),
        )
        faults.reached("flush.written")
        written = time.perf_counter()
        await retry_in_place(
            lambda: sinks.writer.send(sinks.changelog_topic, group.states, one_per_batch=True),
            what="save agent state",
        )
        faults.reached("flush.saved")
        self._ack_saved(group.messages)
        log.debug(
            "flushed %d messages: history and derived %.3fs, state %.3fs",
            len(group.messages),
            written - started,
            time.perf_counter() - written,
        )


def fold_waiting(app: Any) -> int:
    """How many events the fold of ``app`` (:func:`register`) folded whose history is not
    written yet (:attr:`Flusher.waiting`): a few hundred at most while it keeps up, up
    to :data:`MAX_PENDING` and a flush's worth while the history is behind."""
    flushers: list[Flusher] = getattr(app, "_engram_flushers", [])
    return sum(flusher.waiting for flusher in flushers)


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
    max_pending: int = MAX_PENDING,
    summariser: Summariser | None = None,
    keys: WorkerKeys | None = None,
    state_table: str = "agent_state",
    save_every: int = STATE_SAVE_EVERY,
    direct: bool = False,
) -> faust.types.AgentT[bytes]:
    """Declare the state table (``state_table``, one per derivation: see
    :mod:`sinks.derivations`) and the fold agent on ``app``; return the agent.
    ``summariser`` (off by default) rewrites episode summaries before each flush.
    With ``keys`` and a :class:`~schemas.sealed.SealingCodec` as ``codec``, the fold
    opens sealed events (covering each batch's keys first) and seals the derived
    events it publishes, writing the keys it made before them. ``save_every``: see
    :data:`STATE_SAVE_EVERY`. With ``direct``, the fold takes the events topic's
    messages from a :class:`~streams.app.DirectFeed` instead of its faust stream."""
    table = cast(
        "faust.Table[bytes, bytes]",
        app.Table(
            state_table,
            default=None,
            key_type=bytes,  # bytes keys and values: faust reads the changelog raw
            value_type=bytes,
            partitions=topics.events.partitions or app.conf.topic_partitions,
            extra_topic_configs=STATE_CHANGELOG,
        ),
    )
    flushers: list[Flusher] = []
    setattr(app, "_engram_flushers", flushers)  # noqa: B010  # read by fold_waiting
    holes = holes_of(app)
    raw_only = raw_codec(codec)
    feed = direct_feed(app, topics.events.get_topic_name()) if direct else None

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # faust stub wants positional-only
    async def flush_and_forget(sender: Any, *_: Any, signal: Any, **__: Any) -> None:
        for flusher in flushers:
            await flusher.drain()
            flusher.folder.forget()

    @app.agent(topics.events, name="engram.fold")
    async def fold(stream: faust.StreamT[bytes]) -> None:
        writer = keys.writer(bootstrap) if keys is not None else LogWriter(bootstrap)
        sinks = Sinks(
            history,
            writer,
            codec,
            topics.memory.get_topic_name(),
            topics.dead_letters.get_topic_name(),
            table.changelog_topic.get_topic_name(),
        )
        folder = Folder(
            table,
            raw_only,
            config,
            save_every=save_every,
            checkpoint_every=history.checkpoint_every,
        )
        folder.read_past = past_reader(history, raw_only, keys)
        flusher = Flusher(folder, sinks, app.consumer, max_pending, summariser)
        flushers[:] = [flusher]
        settling = asyncio.ensure_future(settle_when_quiet(flusher))
        try:
            async for batch in agent_batches(stream, feed, batch_size, within):
                if keys is not None and isinstance(raw_only, SealingCodec):
                    raws = [item.message.value for item in batch]
                    await retry_in_place(
                        lambda: keys.cover(raw_only, raws),  # noqa: B023  # awaited here
                        what="read data keys",
                    )
                    await retry_in_place(
                        lambda: shred_requested(keys, raw_only, raws),  # noqa: B023
                        what="destroy erased subjects' keys",
                    )
                await fold_batch(flusher, batch, holes)
        finally:
            settling.cancel()
            await finish(flusher)
            await writer.stop()

    return fold


SETTLE_S = 1.0
"""How long the fold is quiet (nothing folded) before it saves every unsaved state."""


async def settle_when_quiet(flusher: Flusher) -> None:
    """Until cancelled: save the unsaved states once the fold has been quiet for
    :data:`SETTLE_S` (see :meth:`Flusher.settle`)."""
    while True:
        await asyncio.sleep(SETTLE_S / 2)
        flusher.settle(SETTLE_S)


def raw_codec(codec: Codec) -> Codec:
    """``codec`` accepting raw types only: a derived type on ``engram.events`` is a
    dead letter (sealing codecs stay sealing, with the same keyring, remembering what
    they open or not alike)."""
    if isinstance(codec, SealingCodec):
        return SealingCodec(
            codec.keyring,
            max_bytes=codec.max_bytes,
            accept=RAW_TYPE_NAMES,
            remember=codec.remember,
        )
    return Codec(max_bytes=codec.max_bytes, accept=RAW_TYPE_NAMES)


def past_reader(history: ClickHouseHistory, codec: Codec, keys: WorkerKeys | None) -> PastReader:
    """Reads pasts from ``history``, opening sealed payloads with ``codec`` once
    ``keys`` covered them."""

    async def opener(rows: Sequence[ArchivedEvent]) -> Callable[[bytes], Event | None]:
        if keys is not None and isinstance(codec, SealingCodec):
            await keys.cover(codec, [row.payload for row in rows])
        return lambda payload: _open(codec, payload)

    rows = history_rows(history)
    return lambda agent_id, upto: read_past(rows, opener, agent_id, upto)


async def start_unmarked(flusher: Flusher, messages: Sequence[Any]) -> None:
    """A partition with no mark is folded from the start of its log: whatever offset
    the consumer group committed for it, nothing of it was ever processed here."""
    folder = flusher.folder
    for partition in folder.unmarked(m.partition for m in messages):
        tp = TP(messages[0].topic, partition)
        earliest = await flusher.consumer.earliest_offsets(tp)
        folder.start(partition, earliest[tp])


STOP_GRACE_S = 20.0
"""How long a stopping worker waits for its last flush before it gives it up."""


async def finish(flusher: Flusher) -> None:
    """Flush what was folded before the worker stops, so that the states and marks of
    everything written are saved with it; after :data:`STOP_GRACE_S` the flush is
    abandoned (its messages were not acked: they are delivered again)."""
    try:
        await asyncio.wait_for(flusher.drain(), STOP_GRACE_S)
    except (TimeoutError, asyncio.CancelledError):
        log.warning("stopping with a flush unfinished: its messages will be read again")
    finally:
        if flusher.task is not None:
            flusher.task.cancel()


async def fold_batch(
    flusher: Flusher, batch: Sequence[Delivery], holes: Holes | None = None
) -> None:
    """Fold a batch and hand it to the flusher; its messages are acked by the flush
    (one extra reference each keeps faust's stream, or the direct feed, from acking
    them when the batch ends). A partition with a hole is read again from it (and
    again, by ``holes``, while the hole stays)."""
    messages = [item.message for item in batch]
    for message in messages:
        message.incref()
    await start_unmarked(flusher, messages)
    started = time.perf_counter()
    result = flusher.folder.fold(batch)
    log.debug("folded %d messages in %.3fs", len(batch), time.perf_counter() - started)
    if result.held:
        # never acked, so never committed; the partition is read again from its hole
        held = {id(message) for message in result.held}
        messages = [message for message in messages if id(message) not in held]
        topic = result.held[0].topic
        for partition, offset in result.gaps.items():
            if holes is not None and holes.pending(TP(topic, partition), offset):
                continue  # sought there a moment ago: the re-read is on its way
            if partition in result.waiting:
                log.info(
                    "%s[%d]: offset %d (a rollback or fork) waits for its past;"
                    " reading again from there",
                    topic,
                    partition,
                    offset,
                )
            else:
                log.warning(
                    "%s[%d]: offset %d was never folded; reading again from there",
                    topic,
                    partition,
                    offset,
                )
            await flusher.consumer.seek(TP(topic, partition), offset)
            if holes is not None:
                holes.sought(
                    TP(topic, partition), offset, partial(flusher.folder.expected, partition)
                )
    await flusher.add(result, messages)
    if result.wanted:
        await flusher.drain()  # the past of a request includes what was just folded
        await retry_in_place(
            lambda: flusher.folder.fetch_pasts(result.wanted), what="read a rollback's past"
        )
