"""``engram reprocess``: derive the memory again from ``engram.events`` with new processor
parameters, next to the live derivation, and swap it in.

A reprocess makes generation ``n + 1`` of the derivation (see :mod:`sinks.derivations`):

1. **Prepare.** A new derived topic ``<engram.memory>.g<n+1>-<nonce>``, the changelog of
   a new state table ``agent_state-g<n+1>-<nonce>``, a new version of
   ``memory_changes`` and a new vector collection (what interrupted rebuilds or
   reprocesses left is dropped first).
2. **Derive.** ``engram.events`` is read from its first offsets, in log order per
   partition, and folded by the same :class:`~streams.pipeline.Folder` the worker runs,
   with the new :class:`~processors.MemoryConfig`. What it derives is published to the
   new topic (sealed like the live fold's), written to the new ``memory_changes``
   version, embedded (the stack's model: the texts of a new derivation are new
   memories) and projected into the new collection; the agent states and per-partition
   marks go to the new changelog after every pass. Passes repeat until the lag is small.
   The live system keeps folding and serving the old derivation meanwhile.
3. **Swap.** The stack's worker is stopped (its last flush finishes), the derivation
   reads the rest of ``engram.events``, and, in this order: a ``swapping`` row is
   recorded (with where the new topic's partitions end: the worker's embedding and
   vector agents pass over what comes before, which the reprocess embedded and
   projected), the agent states are written as the
   history's checkpoints, ``EXCHANGE TABLES`` and the vector pointer move, and a
   ``live`` row is recorded. The worker restarts on the new derivation: its state
   table's changelog holds every agent's state and every partition's mark, so it folds
   on from exactly where the reprocess stopped. A stack that dies mid-swap finishes it
   when it starts again (:func:`recover`).
4. **Finish.** The previous ``memory_changes`` version and collection are dropped unless
   ``keep``. The previous derived topic and changelog stay: the log is never edited.

Cancelled or failed before the swap, nothing live changed: the new versions and topics
are dropped and the worker (if it was stopped) restarts on the live derivation.

What a reprocess cannot change: ``dedupe_window`` (it decides each event's sequence
number, which the archive and every reference to a position hold).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import signal
import threading
import time
import tomllib
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import httpx
import numpy as np
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.console import Console

from engram.service import Problem, problem
from ops.rebuild import (
    CAUGHT_UP,
    Cancelled,
    ClickHouseProjection,
    JobView,
    LogReader,
    Progress,
    Run,
    VectorProjection,
    follow,
    status_or_raise,
)
from ops.topics import KEEP_FOREVER, TopicSpec, ensure_topics
from processors import MemoryConfig
from schemas import Codec, DerivedEvent, MemoryCreated, MemoryEmbedded
from schemas.sealed import SealingCodec
from sinks.clickhouse import ClickHouseHistory, SequencedEvent
from sinks.clients import partitions_of
from sinks.derivations import Derivation, Derivations
from sinks.embedding import Embedder
from sinks.vectors import VectorIndex
from streams.logwriter import LogWriter, Record
from streams.pipeline import (
    STATE_CHANGELOG,
    DeadLetter,
    Folder,
    FoldResult,
    dead_letter_records,
    derived_records,
    past_reader,
    raw_codec,
)
from streams.summariser import Summariser
from streams.vectors import decode_all, embedded_event

CACHED = frozenset({MemoryCreated.TYPE, MemoryEmbedded.TYPE})

if TYPE_CHECKING:
    from streams.ingest import WorkerKeys

log = logging.getLogger("engram.reprocess")

State = Literal["running", "swapping", "done", "failed", "cancelled"]


class Refused(ValueError):
    """A reprocess the stack will not start, with why."""


class Busy(Exception):
    """A reprocess is running already."""


# --------------------------------------------------------------------------- status


class ReprocessStatus(JobView):
    """Where a reprocess is: offsets of ``engram.events`` read (``done`` of ``total``),
    events derived, the generation it makes and the projection versions."""

    state: State
    generation: int
    version: str
    previous_version: str
    memory_topic: str
    derived: int = 0
    embedded: int = 0
    reused: int = 0
    """Of ``embedded``: vectors the live derivation had for the same text (no model call)."""
    clickhouse: int | None = None
    vectors: int | None = None
    previous_clickhouse: int | None = None
    previous_vectors: int | None = None


@dataclass
class Job(Run):
    """A reprocess's :class:`Run`."""

    plan: Derivation
    previous: Derivation
    keep: bool
    state: State = "running"
    derived: int = 0
    embedded: int = 0
    reused: int = 0
    clickhouse: Progress = field(default_factory=lambda: Progress("clickhouse", False))
    vectors: Progress = field(default_factory=lambda: Progress("vectors", False))

    def status(self) -> ReprocessStatus:
        done = self.state == "done"
        view = self.view(self.state == "running")
        view["cleaned"] += [*self.clickhouse.cleaned, *self.vectors.cleaned]
        return ReprocessStatus(
            **view,
            state=self.state,
            generation=self.plan.generation,
            version=self.plan.version,
            previous_version=self.previous.version,
            memory_topic=self.plan.memory_topic,
            derived=self.derived,
            embedded=self.embedded,
            reused=self.reused,
            clickhouse=self.clickhouse.live if done else self.clickhouse.building,
            vectors=self.vectors.live if done else self.vectors.building,
            previous_clickhouse=self.clickhouse.previous,
            previous_vectors=self.vectors.previous,
            keep=self.keep,
        )

    def finish(self, state: State, phase: str, error: str | None = None) -> None:
        self.state = state
        self.end(phase, error)

    def check(self) -> None:
        if self.cancel.is_set():
            raise Cancelled


# --------------------------------------------------------------------------- the worker


class WorkerControl:
    """How a reprocess stops the stack's worker for its swap and has it start again.

    The stack runs the worker in its main thread (:meth:`run` per life); a reprocess
    thread calls :meth:`stop_for_swap` and waits for :attr:`stopped`, then
    :meth:`resume`s it on the derivation that is live after the swap (the old one
    if the swap did not happen)."""

    def __init__(self) -> None:
        self.worker: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.swap_wanted = threading.Event()
        self.stopped = threading.Event()
        self.resumed = threading.Event()
        self.next: Derivation | None = None
        self.lock = threading.Lock()

    def attach(self, worker: Any, loop: asyncio.AbstractEventLoop) -> None:
        """The worker now running (called by the stack before it runs one)."""
        with self.lock:
            self.worker, self.loop = worker, loop
            self.stopped.clear()

    def stop_for_swap(self) -> None:
        """Ask the running worker to stop (as on SIGTERM: its last flush finishes)."""
        with self.lock:
            self.resumed.clear()
            self.swap_wanted.set()
            worker, loop = self.worker, self.loop
        if worker is None or loop is None or loop.is_closed():
            self.stopped.set()  # no worker runs: nothing to stop
            return
        loop.call_soon_threadsafe(worker._on_sigterm)  # mode's own stop-on-signal path

    def worker_ended(self) -> bool:
        """The stack's worker returned: True if it stopped for a swap (the stack then
        waits for :meth:`next_derivation`), False if the stack should exit."""
        with self.lock:
            self.worker = self.loop = None
            wanted = self.swap_wanted.is_set()
        self.stopped.set()
        return wanted

    def resume(self, derivation: Derivation | None) -> None:
        """Let the stack start its worker again, on ``derivation`` (None: unchanged)."""
        with self.lock:
            self.next = derivation
            self.swap_wanted.clear()
        self.resumed.set()

    def next_derivation(self, timeout: float | None = None) -> Derivation | None:
        """Block until :meth:`resume`; the derivation to run (None: the same)."""
        while not self.resumed.wait(timeout or 0.5):
            if timeout is not None:
                raise TimeoutError("no reprocess resumed the worker")
        return self.next

    def wait_resumed(self) -> bool:
        """Block until :meth:`resume` (True) or until SIGTERM or SIGINT comes (False:
        the stack should stop). The worker's own handlers are gone while it is
        stopped, so these signals are caught here (main thread only), and the
        handlers before are put back."""
        stop = threading.Event()
        signals = (signal.SIGTERM, signal.SIGINT)
        before = {s: signal.signal(s, lambda *_: stop.set()) for s in signals}
        try:
            while not self.resumed.wait(0.2):
                if stop.is_set():
                    return False
            return True
        finally:
            for s, handler in before.items():
                signal.signal(s, handler)


# --------------------------------------------------------------------------- deriving


class MemoryTable:
    """The reprocess fold's states and marks (written to its changelog by the job)."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}


@dataclass
class _Item:
    """A record as a stream event: what :meth:`Folder.fold` reads (``.message``)."""

    message: ConsumerRecord[Any, Any]


@dataclass
class Derived:
    """What one fetch of ``engram.events`` derived."""

    sequenced: list[SequencedEvent] = field(default_factory=list)
    derived: list[DerivedEvent] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)

    def absorb(self, result: FoldResult) -> None:
        self.sequenced += result.sequenced
        self.derived += result.derived
        self.dead += result.dead


class Deriver:
    """The fold of a reprocess: a :class:`Folder` with the new parameters over a
    :class:`MemoryTable`, fed records in log order per partition."""

    def __init__(
        self,
        config: MemoryConfig,
        codec: Codec,
        history: ClickHouseHistory,
        keys: WorkerKeys | None,
    ) -> None:
        self.codec = raw_codec(codec)
        self.keys = keys
        self.history = history
        self.table = MemoryTable()
        self.folder = Folder(self.table, self.codec, config)
        self.folder.read_past = past_reader(history, self.codec, keys)
        self.touched: dict[str, int] = {}

    def start(self, firsts: dict[TopicPartition, int]) -> None:
        for tp, offset in firsts.items():
            self.folder.start(tp.partition, offset)

    async def fold(self, records: list[ConsumerRecord[Any, Any]]) -> Derived:
        """Fold one fetch; rollbacks and forks read their past from the archive (what
        this fetch folded before them is archived first)."""
        if self.keys is not None and isinstance(self.codec, SealingCodec):
            await self.keys.cover(self.codec, [r.value for r in records])
        out = Derived()
        items: Sequence[Any] = [_Item(r) for r in records]
        while items:
            result = self.folder.fold(items)
            out.absorb(result)
            for agent_id, partition in result.touched.items():
                self.touched.setdefault(agent_id, partition)
            if not result.held:
                break
            if not result.wanted:
                raise RuntimeError(f"engram.events read with a hole at {result.gaps}")
            await self.history.write(out.sequenced, [])
            await self.folder.fetch_pasts(result.wanted)
            items = [_Item(m) for m in result.held]
        return out

    def states(self, everyone: bool = False) -> tuple[list[Record], list[Any]]:
        """Changelog records of the agents touched since the last call (of every agent,
        with ``everyone``) and of the marks, and the same states as checkpoints."""
        touched = dict(self.touched)
        if everyone:
            for agent_id, live in self.folder.live.items():
                touched.setdefault(agent_id, max(live.positions, default=0))
        self.touched.clear()
        return self.folder.state_records(touched)


# --------------------------------------------------------------------------- vectors


CACHE_LIMIT = 100_000
"""Most vectors a reprocess keeps from the live derivation (8 bytes per dimension each:
about 400 MiB at 512 d); the memories past it are embedded again."""


class VectorCache:
    """The live derivation's vectors of one model version, by the text they embed: a
    memory the new derivation makes with the same text gets the same vector without a
    model call (an embedder is a pure function of its text, see :mod:`sinks.embedding`).
    Only vectors recorded under the running embedder's ``version`` are reused: the
    record made of a reused vector names that version, which must be how it was made."""

    def __init__(self, model: str, version: str, limit: int = CACHE_LIMIT) -> None:
        self.model = model
        self.version = version
        self.limit = limit
        self.vectors: dict[bytes, bytes] = {}
        self.texts: dict[str, bytes] = {}  # memory id -> digest of its text, while loading
        self.hits = 0

    @staticmethod
    def digest(text: str) -> bytes:
        return hashlib.blake2b(text.encode(), digest_size=16).digest()

    def note(self, events: Sequence[DerivedEvent]) -> None:
        """Follow the live derived log: creations name texts, embeddings vectors."""
        for event in events:
            if isinstance(event, MemoryCreated):
                self.texts[event.body.memory_id] = self.digest(event.body.text)
            elif isinstance(event, MemoryEmbedded) and (
                event.body.model == self.model and event.body.model_version == self.version
            ):
                text = self.texts.pop(event.body.memory_id, None)
                if text is not None and len(self.vectors) < self.limit:
                    self.vectors[text] = np.asarray(event.body.vector, dtype=np.float64).tobytes()

    def get(self, text: str) -> list[float] | None:
        found = self.vectors.get(self.digest(text))
        if found is None:
            return None
        self.hits += 1
        vector: list[float] = np.frombuffer(found, dtype=np.float64).tolist()
        return vector


# --------------------------------------------------------------------------- the job


FAUST_SESSION_TIMEOUT_S = 60.0
"""faust's consumer session timeout, where ``ENGRAM_SESSION_TIMEOUT_S`` sets none."""

MEMBER_MARGIN_S = 5.0


def member_patience(session_timeout_s: float | None) -> float:
    """How long a reprocess waits for its worker group to come down to one member: a
    worker that died (or this stack's previous life) stays a member until its session
    times out, so the group's session timeout (faust's when none is set) and a margin."""
    return (session_timeout_s or FAUST_SESSION_TIMEOUT_S) + MEMBER_MARGIN_S


@dataclass
class Parts:
    """What a reprocess runs with: the stack's stores, keys and worker."""

    bootstrap: str
    events_topic: str
    base_topic: str
    """The derived topic of generation 0; later generations' are named after it."""
    dead_letter_topic: str
    group: str
    history: ClickHouseHistory
    derivations: Derivations
    index: VectorIndex | None
    embedder: Embedder | None
    codec: Codec
    """Reads and writes events when ``make_keys`` is None (sealing off)."""
    control: WorkerControl
    make_keys: Callable[[], tuple[WorkerKeys, Codec]] | None = None
    """Keys of the reprocess's own (they start in its thread's loop) and the sealing
    codec over them."""
    summariser: Summariser | None = None
    """The stack's LLM summariser of episodes (``ENGRAM_LLM_URL``), or None: the new
    derivation's episodes get its summaries as the live ones do (recorded ones of the
    same turns reused, see :mod:`streams.summariser`)."""
    on_swapped: Callable[[Derivation], None] = lambda _: None
    stop_timeout_s: float = 60.0
    member_patience_s: float = member_patience(None)
    """How long a reprocess waits for the worker group to come down to one member."""


def plan(previous: Derivation, config: MemoryConfig, base_topic: str) -> Derivation:
    """The next generation's derivation for ``config``; refuses what cannot be one."""
    if previous.step != "live":
        raise Refused(f"generation {previous.generation}'s swap is unfinished: restart the stack")
    if config.version == previous.version:
        raise Refused(f"{config.version} is the live derivation already")
    if config.dedupe_window != previous.config.dedupe_window:
        raise Refused(
            "dedupe_window cannot change in a reprocess: it decides every event's sequence"
            f" number (live: {previous.config.dedupe_window})"
        )
    generation = previous.generation + 1
    nonce = uuid.uuid4().hex[:6]
    return Derivation(
        generation=generation,
        step="swapping",
        config=config,
        memory_topic=f"{base_topic}.g{generation}-{nonce}",
        state_table=f"agent_state-g{generation}-{nonce}",
    )


def changelog_of(group: str, state_table: str) -> str:
    """The topic faust keeps a table's changelog in."""
    return f"{group}-{state_table}-changelog"


class Reprocess:
    """One reprocess run; :meth:`run` on a thread of its own (its own event loop)."""

    def __init__(self, parts: Parts, job: Job, max_rate: float | None) -> None:
        self.parts = parts
        self.job = job
        self.max_rate = max_rate
        self.changelog = changelog_of(parts.group, job.plan.state_table)
        self.clickhouse = ClickHouseProjection(parts.history, settle_s=0.0)
        self.vectors = (
            VectorProjection(parts.index, parts.embedder.name)
            if parts.index is not None and parts.embedder is not None
            else None
        )
        self.writer: LogWriter | None = None
        self.keys: WorkerKeys | None = None
        self.codec = parts.codec
        self.deriver: Deriver | None = None
        self.reader = LogReader(parts.bootstrap, parts.events_topic, max_rate=max_rate)
        self.pending_dead: list[tuple[int, int, DeadLetter]] = []
        self.partitions = 0
        self.stopped_worker = False
        self.swapped = False
        self.resumed = False
        self.ends: dict[int, int] = {}
        embedder = parts.embedder
        self.cache = VectorCache(
            embedder.name if embedder is not None else "",
            embedder.version if embedder is not None else "",
        )  # per partition of the new topic: after the last written

    # -- the run -------------------------------------------------------------
    async def run(self) -> None:
        job = self.job
        try:
            await self._prepare()
            job.phase = "deriving"
            await self._pass()
            while self.reader.lag(await self.reader.ends()) >= CAUGHT_UP:
                await self._pass()
            job.state, job.phase = "swapping", "stopping the worker"
            await self._stop_worker()
            job.phase = "last pass"
            await self._pass(last=True)
            job.phase = "swapping"
            await self._swap()
            job.phase = "dropping the previous versions"
            await self.clickhouse.finish(job.clickhouse)
            if self.vectors is not None:
                await self.vectors.finish(job.vectors)
            job.finish("done", "done")
        except Cancelled:
            await self._abort()
            job.finish("cancelled", "cancelled: the live derivation is unchanged")
        except Exception as error:
            log.exception("reprocess to generation %d failed", job.plan.generation)
            if not self.swapped:
                await self._abort()
            job.finish("failed", "failed", repr(error))
        finally:
            if self.stopped_worker and not self.resumed:
                await self._resume_after_failure()
            await self._close()

    async def _prepare(self) -> None:
        job, parts = self.job, self.parts
        job.phase = "preparing"
        await self.reader.start()
        self.partitions = len(self.reader.partitions)
        job.cleaned += await drop_leftovers(parts)
        specs = [
            TopicSpec(job.plan.memory_topic, self.partitions, KEEP_FOREVER),
            TopicSpec(
                self.changelog,
                self.partitions,
                {"cleanup.policy": "compact", **STATE_CHANGELOG},
            ),
        ]
        await ensure_topics(parts.bootstrap, specs)
        await self.clickhouse.prepare(job.clickhouse)
        if self.vectors is not None:
            await self.vectors.prepare(job.vectors)
        if parts.make_keys is not None:
            self.keys, self.codec = parts.make_keys()
        keys = self.keys
        self.writer = (
            keys.writer(parts.bootstrap) if keys is not None else LogWriter(parts.bootstrap)
        )
        self.deriver = Deriver(job.plan.config, self.codec, parts.history, keys)
        self.deriver.start(self.reader.first)
        await self._load_cache()

    async def _pass(self, *, last: bool = False) -> None:
        """Read ``engram.events`` to its end offsets (and the tail), then save states."""
        job, reader = self.job, self.reader
        ends = await reader.ends()
        job.total = max(reader.total(ends), reader.done())

        def check() -> None:
            job.done = reader.done()
            if not last:
                job.check()

        await reader.read_records_to(ends, self._derive, check)
        job.done = reader.done()
        await self._save_states()

    async def _derive(self, records: list[ConsumerRecord[Any, Any]]) -> None:
        assert self.deriver is not None and self.writer is not None
        out = await self.deriver.fold(records)
        if self.parts.summariser is not None:  # as the worker's flush does, before all else
            out.derived = await self.parts.summariser.rewrite(out.derived, out.sequenced)
        embedded = await self._embed(out.derived)
        derived = [*out.derived, *embedded]
        codec, topic = self.codec, self.job.plan.memory_topic
        _, ends = await asyncio.gather(
            self.parts.history.write(out.sequenced, []),
            self.writer.send(topic, derived_records(codec, out.derived)),
        )
        if embedded:  # after their creations, on the same partitions
            ends = await self.writer.send(topic, derived_records(codec, embedded))
        for partition, end in ends.items():
            self.ends[partition] = max(end, self.ends.get(partition, end))
        await self.clickhouse.apply(out.derived)
        if self.vectors is not None:
            await self.vectors.apply(derived)
        for dead in out.dead:
            partition, offset = _position(dead.source)
            self.pending_dead.append((partition, offset, dead))
        self.job.derived += len(out.derived)
        self.job.embedded += len(embedded)
        self.job.reused = self.cache.hits
        self.job.done = self.reader.done()
        self.job.total = max(self.job.total, self.job.done)

    async def _embed(self, derived: Sequence[DerivedEvent]) -> list[DerivedEvent]:
        """The ``memory.embedded`` records of the new memories (the stack's model): the
        live derivation's vector of the same text, else the model's."""
        embedder = self.parts.embedder
        created = [e for e in derived if isinstance(e, MemoryCreated)]
        if embedder is None or not created:
            return []
        found = {e.event_id: self.cache.get(e.body.text) for e in created}
        texts = [e.body.text for e in created if found[e.event_id] is None]
        if texts:
            made = iter(
                await asyncio.get_running_loop().run_in_executor(
                    None, embedder.embed_passages, texts
                )
            )
            found = {k: v if v is not None else next(made) for k, v in found.items()}
        return [embedded_event(e, embedder, found[e.event_id] or []) for e in created]

    async def _load_cache(self) -> None:
        """Read the live derivation's vectors (its derived log, once) into the cache."""
        if self.parts.embedder is None:
            return
        self.job.phase = "reading the live vectors"
        reader = LogReader(self.parts.bootstrap, self.job.previous.memory_topic)
        codec, keys, cache = self.codec, self.keys, self.cache

        async def note(values: list[bytes]) -> None:
            if keys is not None and isinstance(codec, SealingCodec):
                await keys.cover(codec, values)
            cache.note(decode_all(codec, values, CACHED))

        try:
            await reader.start()
            await reader.read_to(await reader.ends(), note, self.job.check)
        finally:
            await reader.stop()
        cache.texts.clear()

    async def _save_states(self, everyone: bool = False) -> list[Any]:
        assert self.deriver is not None and self.writer is not None
        records, checkpoints = self.deriver.states(everyone)
        await self.writer.send(self.changelog, records, one_per_batch=True)
        return checkpoints

    async def _stop_worker(self) -> None:
        control = self.parts.control
        control.stop_for_swap()
        self.stopped_worker = True
        stopped = await asyncio.get_running_loop().run_in_executor(
            None, lambda: control.stopped.wait(self.parts.stop_timeout_s)
        )
        if not stopped:
            raise RuntimeError(f"the worker did not stop within {self.parts.stop_timeout_s:.0f}s")

    async def _swap(self) -> None:
        """Dead letters of what only this fold saw, checkpoints, the swap steps in
        order, the worker group's offsets on the new topic; then the worker resumes."""
        job, parts = self.job, self.parts
        assert self.writer is not None
        committed = await committed_offsets(parts.bootstrap, parts.group, parts.events_topic)
        dead = [d for p, o, d in self.pending_dead if o >= committed.get(p, 0)]
        await self.writer.send(parts.dead_letter_topic, dead_letter_records(dead, self.codec))
        checkpoints = await self._save_states(everyone=True)
        plan = job.plan.model_copy(
            update={
                "clickhouse_version": job.clickhouse.building or 0,
                "vectors_version": job.vectors.building or 0,
                "memory_starts": dict(self.ends),
            }
        )
        history, index = parts.history, parts.index
        building = job.clickhouse.building
        if building:  # rows its exclusions name leave it (none: the reprocess purges at
            # once), and the exclusions table with them: nothing of it outlives the swap
            await history.call(lambda: history.keep_unexcluded(building))
        # what finish() drops (unless keep): the versions the swap takes out of service
        job.clickhouse.previous = await history.call(history.live_version)
        if index is not None and job.vectors.building:
            job.vectors.previous = index.live_version()
        await history.call(lambda: parts.derivations.record(plan, "swapping"))
        self.swapped = True  # from here on the stack finishes the swap if this dies
        await history.write([], [], checkpoints)
        live = await finish_swap(parts, plan)
        if job.clickhouse.building:  # what the status names live from now on
            job.clickhouse.live, job.clickhouse.building = job.clickhouse.building, None
        if job.vectors.building:
            job.vectors.live, job.vectors.building = job.vectors.building, None
        job.plan = live
        parts.on_swapped(live)
        parts.control.resume(live)
        self.resumed = True

    async def _resume_after_failure(self) -> None:
        """Restart the worker after a failure: on the live derivation, or, past the
        ``swapping`` row, on the new one once the swap is finished (retried until it
        is: the worker must not start on a half-swapped pair)."""
        live: Derivation | None = None
        while self.swapped:
            try:
                live = await recover(self.parts)
                self.parts.on_swapped(live)
                break
            except Exception:
                log.exception("finishing the swap failed; trying again")
                await asyncio.sleep(2.0)
        self.parts.control.resume(live)
        self.resumed = True

    async def _abort(self) -> None:
        with contextlib.suppress(Exception):
            await self.clickhouse.abort(self.job.clickhouse)
        if self.vectors is not None:
            with contextlib.suppress(Exception):
                await self.vectors.abort(self.job.vectors)
        with contextlib.suppress(Exception):
            await delete_topics(self.parts.bootstrap, [self.job.plan.memory_topic, self.changelog])

    async def _close(self) -> None:
        with contextlib.suppress(Exception):
            await self.reader.stop()
        if self.writer is not None:
            with contextlib.suppress(Exception):
                await self.writer.stop()
        if self.keys is not None:
            with contextlib.suppress(Exception):
                await self.keys.close()


def _position(source: str) -> tuple[int, int]:
    """``topic:partition:offset`` to (partition, offset)."""
    _, partition, offset = source.rsplit(":", 2)
    return int(partition), int(offset)


async def finish_swap(parts: Parts, plan: Derivation) -> Derivation:
    """The swap steps after the ``swapping`` row, each done only if not done yet (so
    a stack that starts on that row can run them again): the projections' live
    versions, then the ``live`` row."""
    history = parts.history
    if (
        plan.clickhouse_version
        and await history.call(history.live_version) != plan.clickhouse_version
    ):
        await history.call(lambda: history.swap_version(plan.clickhouse_version))
    index = parts.index
    if index is not None and plan.vectors_version and index.live_version() != plan.vectors_version:
        index.swap(plan.vectors_version)
    return await history.call(lambda: parts.derivations.record(plan, "live"))


async def recover(parts: Parts) -> Derivation:
    """The live derivation at a stack's start, finishing a swap that was cut short."""
    latest = await parts.history.call(parts.derivations.latest)
    if latest.step == "swapping":
        log.warning("finishing the swap to generation %d, cut short", latest.generation)
        latest = await finish_swap(parts, latest)
    return latest


# --------------------------------------------------------------------------- Kafka bits


async def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The offsets ``group`` committed on ``topic``'s partitions (absent: none)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        out: dict[int, int] = {}
        for tp in await partitions_of(consumer, topic):
            offset = await consumer.committed(tp)
            if offset is not None:
                out[tp.partition] = offset
        return out
    finally:
        await consumer.stop()


async def group_members(bootstrap: str, group: str, tries: int = 3) -> int | None:
    """How many members ``group`` has (None: the broker did not say, after ``tries``)."""
    for attempt in range(tries):
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
        try:
            await admin.start()
            for response in await admin.describe_consumer_groups([group]):
                for described in response.groups:
                    if described[1] == group:
                        return len(described[5])
            return 0
        except Exception as error:  # a flaky describe must not stop an operator
            log.warning("describing group %s failed (%r), try %d", group, error, attempt + 1)
            await asyncio.sleep(0.5)
        finally:
            await admin.close()
    return None


async def only_member(bootstrap: str, group: str, patience_s: float) -> int | None:
    """The members of ``group`` once it has at most one, or after ``patience_s``
    (None: the broker would not say)."""
    deadline = time.monotonic() + patience_s
    while True:
        members = await group_members(bootstrap, group)
        if members is None or members <= 1 or time.monotonic() > deadline:
            return members
        await asyncio.sleep(1.0)


async def delete_topics(bootstrap: str, names: Sequence[str]) -> list[str]:
    """Delete those of ``names`` that exist; return them."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        gone = [n for n in names if n in existing]
        if gone:
            await admin.delete_topics(gone)
        return gone
    finally:
        await admin.close()


async def drop_leftovers(parts: Parts) -> list[str]:
    """Delete the derived topics and changelogs of reprocesses that never swapped (no
    derivation names them): a stack killed mid-reprocess leaves them behind."""
    admin = AIOKafkaAdminClient(bootstrap_servers=parts.bootstrap, request_timeout_ms=15_000)
    await admin.start()
    try:
        existing = list(await admin.list_topics())
    finally:
        await admin.close()
    known: set[str] = set()
    for d in await parts.history.call(parts.derivations.all):
        known |= {d.memory_topic, changelog_of(parts.group, d.state_table)}
    prefixes = (f"{parts.base_topic}.g", f"{parts.group}-agent_state-g")
    orphans = [n for n in existing if n.startswith(prefixes) and n not in known]
    return await delete_topics(parts.bootstrap, orphans) if orphans else []


# --------------------------------------------------------------------------- in engram up


class Reprocesses:
    """The reprocesses of one ``engram up``: one at a time, on a thread of its own;
    the last one's status is kept for polling. ``busy`` says why another long job
    (a rebuild) forbids starting one now (None: it does not)."""

    def __init__(self, parts: Parts, busy: Callable[[], str | None] = lambda: None) -> None:
        self.parts = parts
        self.busy = busy
        self.job: tuple[Job, threading.Thread] | None = None
        self.lock = threading.Lock()

    def running(self) -> str | None:
        """Why a rebuild must wait (a reprocess runs), or None."""
        job = self.job
        if job is not None and job[1].is_alive():
            return f"a reprocess to generation {job[0].plan.generation} is running"
        return None

    def start(
        self, config: MemoryConfig, live: Derivation, *, keep: bool, max_rate: float | None
    ) -> ReprocessStatus:
        """Start a reprocess from ``live`` (the derivation recorded now) to ``config``."""
        with self.lock:
            if reason := self.running():
                raise Busy(reason)
            if reason := self.busy():
                raise Busy(reason)
            job = Job(plan(live, config, self.parts.base_topic), live, keep)
            run = Reprocess(self.parts, job, max_rate)
            thread = threading.Thread(
                target=lambda: asyncio.run(run.run()), name="engram-reprocess", daemon=True
            )
            self.job = (job, thread)
            thread.start()
            return job.status()

    def status(self) -> ReprocessStatus | None:
        return self.job[0].status() if self.job is not None else None

    def cancel(self) -> ReprocessStatus | None:
        if self.job is None:
            return None
        self.job[0].cancel.set()
        return self.job[0].status()

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel a running reprocess and wait a little for it (engram up stops)."""
        if self.job is not None:
            self.job[0].cancel.set()
            self.job[1].join(timeout)


class ReprocessRequest(BaseModel):
    """The new parameters; ``keep`` the previous projection versions; ``max_rate``
    caps the raw events read per second."""

    model_config = ConfigDict(extra="forbid")

    config: MemoryConfig
    keep: bool = False
    max_rate: float | None = Field(default=None, gt=0)


class DerivationView(BaseModel):
    """A derivation as the API shows it."""

    model_config = ConfigDict(extra="forbid")

    generation: int
    step: str
    version: str
    memory_topic: str
    state_table: str
    clickhouse_version: int
    vectors_version: int
    config: MemoryConfig

    @classmethod
    def of(cls, d: Derivation) -> DerivationView:
        return cls(
            generation=d.generation,
            step=d.step,
            version=d.version,
            memory_topic=d.memory_topic,
            state_table=d.state_table,
            clickhouse_version=d.clickhouse_version,
            vectors_version=d.vectors_version,
            config=d.config,
        )


def reprocess_router(reprocesses: Reprocesses) -> APIRouter:
    """``POST``, ``GET`` and ``DELETE /v1/admin/reprocess``; ``GET /v1/admin/derivations``."""
    router = APIRouter(tags=["admin"])
    parts = reprocesses.parts

    @router.post(
        "/v1/admin/reprocess",
        status_code=202,
        response_model=ReprocessStatus,
        summary="Derive the memory again with new parameters, then swap it in",
        description=(
            "Folds `engram.events` from the beginning with `config` into a new derived "
            "topic, a new `memory_changes` version and a new vector collection while the "
            "live derivation keeps serving; then stops the worker briefly, swaps, and "
            "restarts it on the new derivation. 409: one is running, or the config is the "
            "live one; 422: the config is invalid."
        ),
        responses={409: {"model": Problem}},
    )
    async def start(request: ReprocessRequest) -> ReprocessStatus | JSONResponse:
        members = await only_member(parts.bootstrap, parts.group, parts.member_patience_s)
        if members is not None and members > 1:
            return problem(
                409,
                "refused",
                f"the worker group {parts.group} has {members} members: a reprocess stops and"
                " restarts this stack's worker only; scale the workers to one first",
            )
        live = await parts.history.call(parts.derivations.latest)
        try:
            return reprocesses.start(
                request.config, live, keep=request.keep, max_rate=request.max_rate
            )
        except Busy as busy:
            return problem(409, "busy", str(busy))
        except Refused as refused:
            return problem(409, "refused", str(refused))

    @router.get(
        "/v1/admin/reprocess",
        response_model=ReprocessStatus,
        summary="Progress of the latest reprocess",
        responses={404: {"model": Problem}},
    )
    async def status() -> ReprocessStatus | JSONResponse:
        found = reprocesses.status()
        return found if found is not None else problem(404, "no reprocess", "none ran here")

    @router.delete(
        "/v1/admin/reprocess",
        response_model=ReprocessStatus,
        summary="Cancel a running reprocess (before its swap; the live derivation stays)",
        responses={404: {"model": Problem}},
    )
    async def cancel() -> ReprocessStatus | JSONResponse:
        found = reprocesses.cancel()
        return found if found is not None else problem(404, "no reprocess", "none ran here")

    @router.get(
        "/v1/admin/derivations",
        response_model=list[DerivationView],
        summary="Every derivation recorded, oldest first (the last is live)",
    )
    async def derivations() -> list[DerivationView]:
        found = await parts.history.call(parts.derivations.all)
        return [DerivationView.of(d) for d in found] or [
            DerivationView.of(await parts.history.call(parts.derivations.latest))
        ]

    return router


# --------------------------------------------------------------------------- the CLI side


class ReprocessFailed(RuntimeError):
    """The stack refused the reprocess, or it ended failed."""


def run_reprocess(
    http: str,
    config: MemoryConfig,
    *,
    keep: bool,
    max_rate: float | None,
    console: Console,
    poll_s: float = 0.25,
    patience_s: float = member_patience(None),
) -> ReprocessStatus:
    """Start a reprocess on the stack at ``http`` and follow it with a progress bar until
    it ends; Ctrl-C cancels it (before its swap) and waits for that. ``patience_s``: how
    long the stack may wait for its worker group to come down to one member."""
    body = {"config": config.model_dump(mode="json"), "keep": keep, "max_rate": max_rate}

    def read(response: httpx.Response) -> ReprocessStatus:
        return status_or_raise(response, ReprocessStatus.model_validate, ReprocessFailed)

    with httpx.Client(base_url=http, timeout=30) as client:
        started = client.post(  # may wait for the worker group to come down to one member
            "/v1/admin/reprocess", json=body, timeout=patience_s + 60
        )
        status = read(started)
        title = f"reprocess to generation {status.generation}"
        return follow(
            client,
            "/v1/admin/reprocess",
            status,
            read,
            title=title,
            unit="offsets of engram.events",
            console=console,
            poll_s=poll_s,
        )


CONFIG_SUFFIXES = {".json": "JSON", "": "JSON", ".toml": "TOML"}
"""How :func:`load_config` reads a file, by its suffix (in any case)."""


def load_config(path: str) -> MemoryConfig:
    """A :class:`MemoryConfig` from a JSON or TOML file (by its suffix, in any case:
    ``.json`` or none for JSON, ``.toml``). Raises ValueError with every problem found,
    each with its field's path; an empty file is refused (not taken for the defaults:
    write ``{}`` for those)."""
    file = Path(path)
    kind = CONFIG_SUFFIXES.get(file.suffix.lower())
    if kind is None:
        raise ValueError(f"{path}: a config is a .json or .toml file, not {file.suffix}")
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from error
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path} is not UTF-8 text: {error.reason} at byte {error.start}"
        ) from None
    if not text.strip():
        raise ValueError(f"{path} is empty (write {{}} for the default parameters)")
    try:
        data = tomllib.loads(text) if kind == "TOML" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not valid {kind}: {error}") from error
    try:
        return MemoryConfig.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in error.errors()
        )
        raise ValueError(f"{path} is not a valid memory config: {problems}") from error
