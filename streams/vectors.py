"""Embedding and the vector projection, both fed by ``engram.memory``.

Two faust agents on the derived log:

* ``engram.embed`` embeds the text of every ``memory.created`` in batches (on one
  thread of its own, off the event loop) and records each vector, with the BM25
  weights of the text, as a ``memory.embedded`` event on ``engram.memory`` (same
  key, so it follows the creation in the agent's partition). Rebuilding the vector
  store replays these records: it never embeds again, and tokenises a text again
  only when its weights were not recorded (or not by this tokenizer). The agent reads each
  partition strictly in offset order too (its own :class:`streams.ordered.InOrder`):
  a message faust never handed to it (a hole, whatever the other agent on the topic
  acked) is read again, not skipped.
* ``engram.vectors`` projects the derived log into the :class:`VectorIndex`, one
  idempotent operation per change, in log order: a creation upserts the point
  (payload and BM25 term weights, no dense vector yet), ``memory.embedded`` of
  the index's model adds the dense vector, reinforcement, weakening, promotion
  and forgetting set payload fields to absolute values, and ``subject.erased``
  deletes the agent's points of the erased subject (in every version of the index).
  Redelivering any suffix of the log therefore converges to the same points, and
  the agent applies each partition strictly in offset order from the group's
  committed offset (:class:`streams.ordered.InOrder`), so a re-read that faust
  delivers with a hole never leaves an older change last.

Both agents retry a failing store in place (backoff, forever): nothing is acked
before it is written, nothing escapes the batch loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import operator
import struct
import threading
from base64 import b64decode, b64encode
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any
from uuid import uuid5

import fastavro
import faust

from processors.memo import Memo
from processors.recall import TOKENIZER, document_sparse
from schemas import (
    BadEvent,
    Codec,
    DerivedEvent,
    MemoryCreated,
    MemoryEmbedded,
    MemoryForgotten,
    MemoryPromoted,
    MemoryReinforced,
    MemoryWeakened,
    SubjectErased,
    TermWeights,
)
from schemas.avro import MAX_MILLIS, MIN_MILLIS, DoublesTail, read_single_object
from schemas.sealed import SealingCodec, sealed_kind
from sinks.embed_process import ProcessEmbedder
from sinks.embedding import Embedder
from sinks.vectors import Point, SparseVector, VectorIndex, VectorWriter, canonical_id
from streams import faults
from streams.app import agent_batches, direct_feed
from streams.logwriter import LogWriter, Record
from streams.ordered import InOrder, in_order
from streams.retry import retry_in_place

if TYPE_CHECKING:
    from streams.ingest import WorkerKeys

log = logging.getLogger("engram.vectors")


def millis(event: DerivedEvent) -> int:
    return int(event.occurred_at.timestamp() * 1000)


Terms = tuple[list[int], list[float]]
"""BM25 document weights: term indices (ascending) and their weights."""


_TERMS: Memo[Terms] = Memo(1_024, 4_000_000, 200_000)
_TERMS_LOCK = threading.Lock()


def text_terms(text: str) -> Terms:
    """:func:`~processors.recall.document_sparse` of ``text`` (not to be changed by the
    caller), remembered for recent texts: a new memory's text is weighed for its point
    when it is created and again for its recorded vector when it is embedded, moments
    apart in the same worker (~80 µs each). The weights are a pure function of the
    text, so what is remembered never changes them."""
    with _TERMS_LOCK:
        terms = _TERMS.get(text)
    if terms is None:
        terms = document_sparse(text)
        with _TERMS_LOCK:
            _TERMS.put(text, terms)
    return terms


def point_of(event: MemoryCreated, terms: Terms | None = None) -> Point:
    """The point a ``memory.created`` makes: payload and sparse terms (``terms``, the
    weights recorded for its text, or else computed from it), no vector yet."""
    return creation_of(event).point(terms)


def point_of_record(record: dict[str, Any], terms: Terms | None = None) -> Point:
    """:func:`point_of` of the ``memory.created`` whose plain record this is (read
    without Avro's logical types, see :class:`PlainRecords`): the same point for every
    valid event (a property test holds it). KeyError, TypeError or ValueError for a
    record that is not one."""
    return creation_of_record(record).point(terms)


@dataclass(frozen=True)
class Creation:
    """A memory's point before its sparse terms (``bare.sparse`` is None), its text,
    and the id of the event that created it (what its recorded vector names as its
    source)."""

    bare: Point
    text: str
    event_id: str

    def point(self, terms: Terms | None = None) -> Point:
        """The whole point: with ``terms`` (:func:`recorded_terms` vouched for them),
        or the weights computed from the text."""
        indices, values = terms if terms is not None else text_terms(self.text)
        bare = self.bare  # a new Point, not dataclasses.replace: a tenth of the cost
        return Point(bare.id, None, SparseVector.vouched(indices, values), bare.payload)


def creation_of(event: MemoryCreated) -> Creation:
    """The :class:`Creation` of a ``memory.created``."""
    body = event.body
    # the forgetting clock starts when the memory formed (its episode's last turn, say),
    # as in the fold; version-1 events did not say, and their own time stands in
    formed = body.formed_at
    at = millis(event) if formed is None else int(formed.timestamp() * 1000)
    head = {
        "agent_id": event.agent_id,
        "user_id": event.user_id,
        "session_id": event.session_id,
        "layer": body.layer,
        "kind": body.kind,
        "importance": body.importance,
        "sentiment": body.sentiment,
        "confidence": body.confidence,
        "strength": body.strength,
    }
    tail = (list(body.entities), list(body.sources), str(event.source_event_id))
    bare = memory_point(body.memory_id, body.text, at, head, tail)
    return Creation(bare, body.text, str(event.event_id))


def creation_of_record(record: dict[str, Any]) -> Creation:
    """:func:`creation_of` the ``memory.created`` whose plain record this is; KeyError,
    TypeError or ValueError for a record that is not one."""
    body = record["body"]
    formed = body["formed_at"]
    at = wire_millis(record["occurred_at"] if formed is None else formed)
    head = {
        "agent_id": record["agent_id"],
        "user_id": record["user_id"],
        "session_id": record["session_id"],
        "layer": body["layer"],
        "kind": body["kind"],
        "importance": body["importance"],
        "sentiment": body["sentiment"],
        "confidence": body["confidence"],
        "strength": body["strength"],
    }
    tail = (body["entities"], body["sources"], canonical_id(record["source_event_id"]))
    bare = memory_point(body["memory_id"], body["text"], at, head, tail)
    return Creation(bare, body["text"], canonical_id(record["event_id"]))


def memory_point(
    memory_id: str,
    text: str,
    at: int,
    head: dict[str, Any],
    tail: tuple[list[str], list[str], str],
) -> Point:
    """A new memory's point without sparse terms: ``head`` (envelope and body fields, in
    payload order), the state of a memory never reinforced since ``at`` (epoch ms),
    ``text`` and ``tail`` (entities, sources, source event id)."""
    entities, sources, source_event_id = tail
    return Point(
        id=memory_id,
        dense=None,
        sparse=None,
        payload={
            **head,
            "reinforcements": 0,
            "last_reinforced_at": at,
            "last_review_at": at,
            "created_at": at,
            "forgotten": False,
            "invalidated": False,
            "promoted": head["layer"] == "L3",
            "text": text,
            "entities": entities,
            "sources": sources,
            "source_event_id": source_event_id,
        },
    )


def document_terms(text: str, terms: Terms | None = None) -> TermWeights:
    """The BM25 weights of ``text`` as ``memory.embedded`` records them (packed):
    ``terms`` when the caller has them (:func:`document_sparse` of ``text``, weighed
    elsewhere), else :func:`text_terms`."""
    indices, values = terms if terms is not None else text_terms(text)
    return TermWeights(
        tokenizer=TOKENIZER,
        indices=b64encode(struct.pack(f"<{len(indices)}I", *indices)).decode(),
        values=b64encode(struct.pack(f"<{len(values)}d", *values)).decode(),
    )


def recorded_terms(tokenizer: str, indices: str, values: str) -> Terms | None:
    """Recorded weights (packed as :class:`~schemas.TermWeights` says) that
    :func:`document_sparse` would give today: made by this
    :data:`~processors.recall.TOKENIZER`, one finite weight per index, indices
    ascending; None otherwise (compute them again)."""
    if tokenizer != TOKENIZER:
        return None
    try:
        packed_indices, packed_values = (
            b64decode(indices, validate=True),
            b64decode(values, validate=True),
        )
    except ValueError:
        return None
    count = len(packed_indices) // 4
    if len(packed_indices) != 4 * count or len(packed_values) != 8 * count:
        return None
    terms = list(struct.unpack(f"<{count}I", packed_indices))
    weights = list(struct.unpack(f"<{count}d", packed_values))
    ascending = all(map(operator.lt, terms, islice(terms, 1, None)))
    if not ascending or not all(map(math.isfinite, weights)):
        return None
    return terms, weights


def wire_millis(ms: int) -> int:
    """What :func:`millis` gives for the time an Avro ``timestamp-millis`` of ``ms``
    decodes to: ``int(datetime.timestamp() * 1000)``, whose float road can land one
    below ``ms``; ``timestamp()`` divides the microseconds by 10**6 exactly rounded,
    as ``ms / 1000`` is. ValueError outside a datetime's range."""
    if type(ms) is not int or not MIN_MILLIS <= ms <= MAX_MILLIS:
        raise ValueError(f"not a timestamp-millis: {ms!r}")
    return int(ms / 1000 * 1000)


class PlainRecords:
    """``memory.created`` and ``memory.embedded`` in plain Avro of their current
    schema, read for a rebuild without pydantic and without Avro's logical types
    (UUIDs stay strings, times epoch milliseconds: fastavro builds their objects in
    Python, and the points want the strings and milliseconds anyway).

    Like :meth:`Codec.read_record`, for readers that trust the writer (the fold and
    the embedding agent validated what they wrote); each read answers None for
    anything else (sealed bytes, older writer schemas, JSON, bad bytes, records
    that make no point): those take the typed road, which says what is wrong."""

    def __init__(self, codec: Codec) -> None:
        self.max_bytes = codec.max_bytes
        created, embedded = codec.avro[MemoryCreated.TYPE], codec.avro[MemoryEmbedded.TYPE]
        self.created = created.header if MemoryCreated.TYPE in codec.accept else None
        self.embedded = embedded.header if MemoryEmbedded.TYPE in codec.accept else None
        self.created_schema = fastavro.parse_schema(plain_schema(created.schema))
        tail = DoublesTail.of(plain_schema(embedded.schema))
        if tail is None:
            raise TypeError("memory.embedded no longer ends with its vector")
        self.embedded_tail = tail

    def creation(self, raw: bytes) -> dict[str, Any] | None:
        """The plain record of a ``memory.created`` (:func:`point_of_record` makes its
        point), or None."""
        if raw[:10] != self.created or len(raw) > self.max_bytes:
            return None
        try:
            return read_single_object(raw, self.created_schema, MemoryCreated.TYPE)
        except BadEvent:
            return None

    def vector(self, raw: bytes) -> Recorded | None:
        """What a rebuild takes of a ``memory.embedded``, or None."""
        if raw[:10] != self.embedded or len(raw) > self.max_bytes:
            return None
        try:
            record = self.embedded_tail.read(raw[10:])
            body, terms = record["body"], record["body"]["terms"]
            return Recorded(
                body["memory_id"],
                body["model"],
                body["vector"],
                canonical_id(record["source_event_id"]),
                None
                if terms is None
                else recorded_terms(terms["tokenizer"], terms["indices"], terms["values"]),
            )
        except Exception:  # fastavro raises many types on bad bytes: decode() says why
            return None


@dataclass(frozen=True)
class Recorded:
    """What a rebuild takes of a recorded vector: the memory, the model, the vector,
    the creation it embeds (``source_event_id``: the creation's event id) and the
    weights recorded for that creation's text, when :func:`recorded_terms` vouches."""

    memory_id: str
    model: str
    vector: list[float]
    created_by: str
    terms: Terms | None

    @classmethod
    def of(cls, event: MemoryEmbedded) -> Recorded:
        body, terms = event.body, event.body.terms
        return cls(
            body.memory_id,
            body.model,
            body.vector,
            str(event.source_event_id),
            None if terms is None else recorded_terms(terms.tokenizer, terms.indices, terms.values),
        )


def plain_schema(schema: Any) -> Any:
    """``schema`` without its logical types (a copy)."""
    if isinstance(schema, dict):
        return {k: plain_schema(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [plain_schema(item) for item in schema]
    return schema


def payload_change(event: DerivedEvent) -> tuple[str, dict[str, Any]] | None:
    """The payload fields a change sets, as absolute values (idempotent)."""
    if isinstance(event, MemoryReinforced):
        body = event.body
        return body.memory_id, {
            "strength": body.strength,
            "reinforcements": body.reinforcements,
            "invalidated": body.invalidated,
            "last_reinforced_at": millis(event),
            "last_review_at": millis(event),
        }
    if isinstance(event, MemoryWeakened):
        body = event.body
        return body.memory_id, {
            "strength": body.strength,
            "reinforcements": body.reinforcements,
            "invalidated": body.invalidated,
            "last_review_at": millis(event),  # FSRS counts from a lapse too
        }
    if isinstance(event, MemoryPromoted):
        return event.body.memory_id, {"layer": event.body.to_layer, "promoted": True}
    if isinstance(event, MemoryForgotten):
        return event.body.memory_id, {"forgotten": True, "forgotten_at": millis(event)}
    return None


@dataclass(frozen=True)
class Op:
    """One store operation: ``kind`` is upsert, dense, payload or erase."""

    kind: str
    item: Any


def erasures(event: SubjectErased) -> list[Op]:
    """The deletions a ``subject.erased`` makes: the agent's points of the subject as
    a user, and, when the subject is the agent itself, its points without a user."""
    subject, agent_id = event.body.subject, event.agent_id
    owners: list[str | None] = [subject, None] if subject == agent_id else [subject]
    return [Op("erase", (agent_id, owner)) for owner in owners]


def operations(events: Sequence[DerivedEvent], model: str) -> list[Op]:
    """What the vector projection does for ``events``, in their order; vectors of
    other models than ``model`` are not this index's business."""
    ops: list[Op] = []
    for event in events:
        if isinstance(event, SubjectErased):
            ops += erasures(event)
        elif isinstance(event, MemoryCreated):
            ops.append(Op("upsert", point_of(event)))
        elif isinstance(event, MemoryEmbedded):
            if event.body.model == model:
                ops.append(Op("dense", (event.body.memory_id, event.body.vector)))
        else:
            change = payload_change(event)
            if change is not None:
                ops.append(Op("payload", change))
    return ops


def apply_operations(index: VectorWriter, ops: Sequence[Op]) -> list[int]:
    """Apply ``ops`` in order, each run of one kind as one store call; return, for
    each ``erase`` operation in order, how many points it deleted."""
    run: list[Any] = []
    erased: list[int] = []
    for position, op in enumerate(ops):
        run.append(op.item)
        last = position + 1 == len(ops) or ops[position + 1].kind != op.kind
        if last:
            erased += _apply_run(index, op.kind, run)
            faults.reached("vectors.run")
            run = []
    return erased


def _apply_run(index: VectorWriter, kind: str, items: list[Any]) -> list[int]:
    faults.check("vectors")  # an injected outage or slowness of the store (ENGRAM_FAULT)
    if kind == "erase":
        counts = []
        for agent_id, user_id in items:
            erased = index.erase(agent_id, user_id)
            log.info("erased %d points of %r (user %r)", erased, agent_id, user_id)
            counts.append(erased)
        return counts
    if kind == "upsert":
        index.upsert(items)
    elif kind == "dense":
        index.set_dense(items)
    else:
        index.set_payload(items)
    return []


def erased_points(
    events: Sequence[DerivedEvent], counts: Sequence[int]
) -> list[tuple[SubjectErased, int]]:
    """Each ``subject.erased`` of ``events`` with the points its operations deleted
    (``counts``: what :func:`apply_operations` returned for ``operations(events)``)."""
    out, taken = [], 0
    for event in events:
        if isinstance(event, SubjectErased):
            mine = len(erasures(event))
            out.append((event, sum(counts[taken : taken + mine])))
            taken += mine
    return out


def embedded_and_weighed(
    embedder: Embedder, texts: Sequence[str]
) -> tuple[list[list[float]], Sequence[Terms | None]]:
    """The vectors of ``texts`` and, when ``embedder`` weighs them beside (a
    :class:`~sinks.embed_process.ProcessEmbedder`, in its child process), their BM25
    weights; else Nones (the caller weighs them)."""
    if isinstance(embedder, ProcessEmbedder):
        return embedder.embed_and_weigh(texts)
    return embedder.embed_passages(texts), [None] * len(texts)


def embedded_event(
    created: MemoryCreated, embedder: Embedder, vector: list[float], terms: Terms | None = None
) -> MemoryEmbedded:
    """The record of one vector; its id is a ``uuid5`` of the creation and the model,
    so re-embedding after a redelivery yields the same event. ``terms``: the text's
    :func:`document_sparse`, when the caller has it (else weighed here)."""
    return MemoryEmbedded(
        event_id=uuid5(created.event_id, f"embedded:{embedder.name}:{embedder.version}"),
        schema_version=MemoryEmbedded.SCHEMA_VERSION,
        agent_id=created.agent_id,
        session_id=created.session_id,
        user_id=created.user_id,
        occurred_at=created.occurred_at,
        source_event_id=created.event_id,
        seq=created.seq,
        idx=created.idx,
        config_version=created.config_version,
        body={
            "memory_id": created.body.memory_id,
            "model": embedder.name,
            "model_version": embedder.version,
            "dims": embedder.dims,
            "terms": document_terms(created.body.text, terms),
            "vector": vector,
        },
    )


VECTOR_TYPES = frozenset(
    kind.TYPE
    for kind in (
        MemoryCreated,
        MemoryEmbedded,
        MemoryReinforced,
        MemoryWeakened,
        MemoryPromoted,
        MemoryForgotten,
        SubjectErased,
    )
)
"""The derived types the vector projection reads; the others (working memory,
episodes, facts, …, most of the log) it skips without decoding them."""
CREATED = frozenset({MemoryCreated.TYPE})


def decode_all(
    codec: Codec, values: Iterable[bytes | None], types: frozenset[str] | None = None
) -> list[DerivedEvent]:
    """The derived events of a batch's values (only those of ``types``, when given: the type
    is read from the Avro fingerprint or the sealed envelope, so the others cost no
    decoding); bytes that do not decode are logged and skipped (the fold wrote them, so
    this is a bug, not user input). With a :class:`SealingCodec`, sealed events are
    opened (the caller covered their keys first) and shredded ones skipped."""
    out: list[DerivedEvent] = []
    for value in values if types is None else of_types(codec, values, types):
        raw = value or b""
        try:
            event = codec.open(raw) if isinstance(codec, SealingCodec) else codec.decode(raw)
        except BadEvent as bad:
            log.error("undecodable record on the derived log: %s", bad.reason)
            continue
        if isinstance(event, DerivedEvent):
            out.append(event)
    return out


def of_types(
    codec: Codec, raws: Iterable[bytes | None], types: frozenset[str]
) -> list[bytes | None]:
    """The values among ``raws`` whose type, read from the header alone, is one of
    ``types``, and those whose header does not say (:func:`decode_all` logs them if
    they do not decode): a batch's other records need neither a key nor decoding."""
    ignores = ignoring(codec, types)
    return [value for value in raws if not ignores(value)]


def ignoring(codec: Codec, types: frozenset[str]) -> Callable[[bytes | None], bool]:
    """Whether a value's header names a type outside ``types``: what :func:`of_types`
    leaves out of a batch, and a :class:`~streams.app.DirectFeed` passes over before
    it reaches one."""

    def ignores(value: bytes | None) -> bool:
        kind = kind_of(codec, value or b"")
        return kind is not None and kind not in types

    return ignores


def kind_of(codec: Codec, raw: bytes) -> str | None:
    """The event type of ``raw`` read from its header alone (the Avro fingerprint or the
    sealed envelope); None when the header does not say."""
    if isinstance(codec, SealingCodec):
        return codec.kind(raw)
    writer = codec.writers.get(raw[2:10])
    return writer.reader.event_type.TYPE if writer is not None else None


def header_kind(codec: Codec, raw: bytes) -> str | None:
    """:func:`kind_of`, and for sealed bytes the type their clear envelope names even
    when ``codec`` cannot open them (a rebuild's plain codec, with an opener beside it)."""
    kind = kind_of(codec, raw)
    return kind if kind is not None else sealed_kind(raw)


def values(batch: Sequence[Any]) -> list[bytes | None]:
    """The raw values of a batch of stream events (or of messages)."""
    return [getattr(item, "message", item).value for item in batch]


EMBED_FEED_MAXSIZE = 131_072
"""How many ``memory.created`` the embedding agent's :class:`~streams.app.DirectFeed`
holds (every other derived event is passed over, not queued; sealed, about 1 KB each):
the memories that wait while the fold goes first (:class:`FoldFirst`), which stops
waiting at half of it (65 536), about 36 s of a drawn-text ingest at 5 500 events/s (a
third of them make a memory: 35 709 for the ingest bench's 100 000). A full feed would
stop the worker's hand-over, the fold's events with it. At 65 536 the bench's burst
passed the half before its end, and its last batches were embedded beside the fold."""

YIELD_POLL_S = 0.05
"""How often a :class:`FoldFirst` asks again whether the fold is still behind."""


@dataclass
class FoldFirst:
    """Memories wait to be embedded while the fold is behind.

    On two cores the embedding model (in its child process) and what the worker then
    does with each vector took the CPU the fold and the history needed: on drawn texts,
    where a third of the events make a memory, the history fell behind by half and more
    in some runs (BENCHMARKS.md, "Stop 46" under Ingest). The fold reads the log first:
    working memory, episodes and the history follow it; the vectors follow the derived
    log, and catch up when the load eases. ``behind()`` says whether the fold is behind
    (:func:`streams.pipeline.fold_waiting` over a threshold, in ``engram up``). A batch
    waits at most ``longest_s``, so embedding goes on under a load that never eases, and
    not at all once ``crowded()`` (the embedding agent's queue is half full: see
    :data:`EMBED_FEED_MAXSIZE`)."""

    behind: Callable[[], bool]
    longest_s: float = 30.0
    crowded: Callable[[], bool] = lambda: False
    poll_s: float = YIELD_POLL_S
    waited_s: float = 0.0
    """Seconds waited so far, every batch together."""

    async def wait(self) -> float:
        """Wait while the fold is behind and the queue is not crowded, at most
        ``longest_s``; return the seconds waited (0.0 without waiting)."""
        if not self.behind() or self.crowded():
            return 0.0
        loop = asyncio.get_running_loop()
        started = loop.time()
        while (left := self.longest_s - (loop.time() - started)) > 0:
            await asyncio.sleep(min(self.poll_s, left))
            if not self.behind() or self.crowded():
                break
        waited = loop.time() - started
        self.waited_s += waited
        if waited >= 1.0:
            log.info("memories waited %.1f s to be embedded while the fold caught up", waited)
        return waited


def register_vectors(
    app: faust.App,
    *,
    memory_topic: faust.TopicT,
    index: VectorIndex,
    embedder: Embedder,
    codec: Codec,
    bootstrap: str,
    batch_size: int = 256,
    within: float = 0.2,
    keys: WorkerKeys | None = None,
    projected: dict[int, int] | None = None,
    on_erased: Callable[[Sequence[tuple[SubjectErased, int]]], Awaitable[None]] | None = None,
    direct: bool = False,
    fold_first: FoldFirst | None = None,
) -> None:
    """Declare the embedding and vector-projection agents on ``app``. With ``keys``
    and a :class:`SealingCodec`, each batch's keys are covered before it is opened,
    and the embeddings are sealed like the memories they embed. ``projected``: per
    partition of ``memory_topic``, the offset below which a reprocess embedded and
    projected everything already (:mod:`ops.reprocess`): both agents pass those
    records over (acked, not acted on). Not a seek: the embedded broker's end offsets
    count record batches, so a seek there may land past what it reports. ``on_erased``
    gets each ``subject.erased`` applied with the points it deleted (for the erasure's
    receipt), once they are deleted and before the batch is acked. With ``direct``,
    each agent takes the memory topic's messages from its own
    :class:`~streams.app.DirectFeed` (batches of ``batch_size`` within ``within``
    seconds, as from its faust stream). With ``fold_first`` and ``direct``, each batch of
    memories waits before it is embedded while the fold is behind (:class:`FoldFirst`,
    told when the agent's queue is crowded); without ``direct`` it is not used."""
    starts = dict(projected or {})

    def fresh(messages: Sequence[Any]) -> list[Any]:
        return [m for m in messages if m.offset >= starts.get(m.partition, 0)]

    embed_pool = ThreadPoolExecutor(1, thread_name_prefix="engram-embed")
    store_pool = ThreadPoolExecutor(1, thread_name_prefix="engram-vectors")
    topic_name = memory_topic.get_topic_name()
    embedding = InOrder(app)  # the embedding agent's own order: it acts on what it reads
    guard = InOrder(app)
    # most of the derived log is working memory, which neither agent reads: their feeds
    # pass it over (acked, counted by each agent's order guard) instead of queuing it
    embed_feed = (
        direct_feed(
            app, topic_name, EMBED_FEED_MAXSIZE, ignoring(codec, CREATED), embedding.pass_over
        )
        if direct
        else None
    )
    if fold_first is not None and embed_feed is not None:
        feed = embed_feed
        fold_first.crowded = lambda: 2 * len(feed.queued) >= feed.maxsize
    else:
        fold_first = None
    project_feed = (
        direct_feed(app, topic_name, ignores=ignoring(codec, VECTOR_TYPES), passed=guard.pass_over)
        if direct
        else None
    )

    async def off_loop(pool: ThreadPoolExecutor, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(pool, fn)

    async def covered(batch: Sequence[Any], types: frozenset[str]) -> list[bytes | None]:
        """The values of ``batch`` that may be of ``types`` (see :func:`of_types`), their
        keys covered."""
        raws = of_types(codec, values(batch), types)
        if keys is not None and isinstance(codec, SealingCodec):
            await retry_in_place(lambda: keys.cover(codec, raws), what="read data keys")
        return raws

    @app.agent(memory_topic, name="engram.embed")
    async def embed(stream: faust.StreamT[bytes]) -> None:
        writer = keys.writer(bootstrap) if keys is not None else LogWriter(bootstrap)

        async def embed_created(messages: list[Any]) -> None:
            todo = fresh(messages) if starts else messages
            created = [
                e
                for e in decode_all(codec, await covered(todo, CREATED))
                if isinstance(e, MemoryCreated)
            ]
            if not created:
                return
            if fold_first is not None:
                await fold_first.wait()
            texts = [e.body.text for e in created]
            vectors, weights = await retry_in_place(
                lambda: off_loop(embed_pool, lambda: embedded_and_weighed(embedder, texts)),
                what="embed memories",
            )
            records = [
                Record(
                    e.agent_id.encode(), codec.encode(embedded_event(e, embedder, v, t)), millis(e)
                )
                for e, v, t in zip(created, vectors, weights, strict=True)
            ]
            await retry_in_place(
                lambda: writer.send(topic_name, records), what="publish embeddings"
            )
            faults.reached("embed.published")

        try:
            async for batch in agent_batches(stream, embed_feed, batch_size, within, gather=True):
                await in_order(batch, embedding, embed_created)
        finally:
            await writer.stop()

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # faust stub wants positional-only
    async def forget(sender: Any, *_: Any, signal: Any, **__: Any) -> None:
        guard.forget()
        embedding.forget()

    async def apply(messages: list[Any]) -> None:
        raws = await covered(fresh(messages) if starts else messages, VECTOR_TYPES)
        events = decode_all(codec, raws)
        ops = operations(events, embedder.name)
        if not ops:
            return
        counts: list[int] = await retry_in_place(
            lambda: off_loop(store_pool, lambda: apply_operations(index, ops)),
            what="project vectors",
        )
        erased = erased_points(events, counts)
        if erased and on_erased is not None:
            await retry_in_place(lambda: on_erased(erased), what="record erased points")

    @app.agent(memory_topic, name="engram.vectors")
    async def project(stream: faust.StreamT[bytes]) -> None:
        async for batch in agent_batches(stream, project_feed, batch_size, within, gather=True):
            await in_order(batch, guard, apply)

    _ = (embed, project)
