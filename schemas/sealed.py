"""Sealed events: an event that only its subject's data key opens (crypto-shredding).

An event's *subject* is its ``user_id``, or its ``agent_id`` when it has no user.
Sealing keeps the envelope in clear — what routing, ordering and analytics need:
event id, type, agent, session, user, event time, and for a derived event its
``seq``/``idx`` — and encrypts the event's ordinary single-object bytes (envelope
and body) with AES-256-GCM under the subject's current data key. Destroying every
data key of a subject makes all of its sealed events unreadable for good, wherever
copies of the bytes live (topics, archives, backups), while the others' events open
as before.

Wire format: Avro single-object encoding (``C3 01``, fingerprint, binary body) of
the record :data:`SEALED_SCHEMA` (``schemas/avsc/wrappers/sealed.v1.avsc``). The
additional authenticated data binds the ciphertext to the clear envelope (event id, type, agent,
subject, key id), so it cannot be moved to another event or subject; the opened
event must also match the clear envelope field for field.

Contract of :meth:`Sealer.open`: it returns the event, or raises :class:`Shredded`
when the subject's key was destroyed (the event is gone for good: skip it),
:class:`UnknownKey` when the key is not known *yet* (a transient state: refresh the
keyring and try again) or :class:`~schemas.errors.BadEvent` for bytes that are not
a well-formed sealed event, do not authenticate, or do not match their envelope.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, NamedTuple, Protocol
from uuid import UUID

import fastavro
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from schemas.avro import (
    MAGIC,
    MAX_MILLIS,
    MIN_MILLIS,
    WriterSchema,
    epoch_millis,
    fingerprint,
    native_fields_writer,
    read_single_object,
    write_single_object,
)
from schemas.base import DerivedEvent, Event
from schemas.codec import DEFAULT_MAX_BYTES, Codec
from schemas.errors import BadEvent
from schemas.wire import (
    KIND_LONG,
    KIND_STRING,
    KIND_TIMESTAMP,
    SPEC_BYTES,
    SealedFields,
    inner_positions,
    read_sealed,
    read_sealed_key,
    read_sealed_type,
    sealed_aad,
    write_sealed_fields,
)

SEALED_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "engram.Sealed",
    "doc": "An engram event encrypted under its subject's data key; the envelope stays clear.",
    "fields": [
        {"name": "event_id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "type", "type": "string"},
        {"name": "agent_id", "type": "string"},
        {"name": "session_id", "type": ["null", "string"], "default": None},
        {"name": "user_id", "type": ["null", "string"], "default": None},
        {"name": "occurred_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "seq", "type": ["null", "long"], "default": None},
        {"name": "idx", "type": ["null", "long"], "default": None},
        {"name": "subject", "type": "string"},
        {"name": "key_id", "type": "string"},
        {"name": "nonce", "type": "bytes"},
        {"name": "ciphertext", "type": "bytes"},
    ],
}
_PARSED = fastavro.parse_schema(SEALED_SCHEMA)
SEALED_HEADER = MAGIC + fingerprint(SEALED_SCHEMA)
"""The first 10 bytes of every sealed event."""
_TEXT, _LONG = ("optional", KIND_STRING), ("optional", KIND_LONG)
SEALED_SPEC = (
    "record",
    tuple(field["name"] for field in SEALED_SCHEMA["fields"]),
    (
        *(KIND_STRING, KIND_STRING, KIND_STRING, _TEXT, _TEXT, KIND_TIMESTAMP, _LONG, _LONG),
        *(KIND_STRING, KIND_STRING, SPEC_BYTES, SPEC_BYTES),
    ),
)
""":data:`SEALED_SCHEMA` as the spec of a ``schemas._avro.Writer`` (see
:func:`schemas.wire.writer_spec`): the event id as its text."""
_SEAL_FIELDS: Final = native_fields_writer(SEALED_SPEC)
"""``write_sealed_fields`` in C, into one buffer (0.21–0.25 µs against 1.71–1.72 µs
compiled by mypyc for a ``working.updated``'s envelope, timeit, AMD EPYC), where the
extension is built."""

log = logging.getLogger("engram.sealed")

OVERHEAD = 1024
"""Bytes a sealed event may exceed the codec's size limit by (envelope, nonce, tag)."""

HANDOFFS = 65_536
"""How many recently sealed or opened events this process remembers by their sealed
bytes (:class:`Handoffs`). In a burst the worker's ingest hop seals far ahead of its
fold, which opens an event without decrypting or decoding it only while it is among
the last this many: at 8 192, a burst of 100 000 events cost the worker ~345 µs of CPU
an event, at 65 536 ~260 µs, for ~200 MiB more resident memory (BENCHMARKS.md)."""

HANDOFF_BYTES = 128 * 1024 * 1024
"""How many sealed bytes those may add up to (the events they hold take more memory
than their bytes, a few KiB each): a run of large tool results does not hold
gigabytes."""


class _Handoff(NamedTuple):
    event: Event
    subject: str
    key_id: str
    key: bytes
    inner_size: int


class Handoffs:
    """The events this process sealed (from the bytes they were decoded from) or
    opened lately, by their sealed bytes, so that opening them again in this process
    skips the decryption and the decoding: the ingest hop seals what the fold opens, and
    the embedding and the vector projection both open each new memory.

    Exact by construction: equal sealed bytes hold the same nonce, ciphertext and
    envelope, so under the same key they open to the same inner bytes, which decode to
    the same event. A remembered event is given only when the opener's keyring holds
    that very key (a destroyed or unknown key takes the full road, which raises as it
    must) and the opener's size limits pass it. Bounded: beyond ``capacity`` events or
    ``max_bytes`` sealed bytes, the oldest is forgotten first. Thread-safe."""

    def __init__(self, capacity: int = HANDOFFS, max_bytes: int = HANDOFF_BYTES) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        # popping the oldest of a plain dict scans its deleted slots: O(n) each time
        self._events: OrderedDict[bytes, _Handoff] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, raw: bytes, handoff: _Handoff) -> None:
        with self._lock:
            events = self._events
            if raw not in events:
                self._bytes += len(raw)
            events[raw] = handoff
            while len(events) > self.capacity or self._bytes > self.max_bytes:
                oldest, _ = events.popitem(last=False)
                self._bytes -= len(oldest)

    def get(self, raw: bytes) -> _Handoff | None:
        return self._events.get(raw)

    def clear(self) -> None:
        with self._lock:
            self._events.clear()
            self._bytes = 0

    @property
    def size(self) -> int:
        """The sealed bytes remembered."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._events)


RECENT = Handoffs()
"""This process's :class:`Handoffs`, shared by every :class:`Sealer`."""


class Nonces:
    """Random 12-byte AES-GCM nonces, read from the operating system ``batch`` at a
    time; safe from any thread, and a forked child never reuses its parent's.

    Each nonce is as random as ``os.urandom(12)``: only the number of calls changes.
    ``os.urandom`` lets go of the GIL for its system call, and in a busy worker
    getting it back waits behind the other threads: one call per sealed event cost
    about 45 µs there (py-spy, ``ops/bench/ingest.py --modes sealed``) against
    0.4 µs in an idle process."""

    def __init__(self, batch: int = 4096) -> None:
        self.batch = batch
        self._lock = threading.Lock()
        self._pool = b""
        self._at = 0
        os.register_at_fork(after_in_child=self._forget)

    def __call__(self) -> bytes:
        with self._lock:
            if self._at >= len(self._pool):
                self._pool, self._at = os.urandom(12 * self.batch), 0
            pool, at = self._pool, self._at
            self._at = at + 12
        return pool[at : at + 12]

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._pool, self._at = b"", 0


new_nonce = Nonces()
"""The process's source of AES-GCM nonces (sealed events and dead letters)."""


AEADS = 4096
"""How many data keys' AES-GCM contexts this process keeps made (:func:`aead`)."""

_AEADS: dict[bytes, AESGCM] = {}


def aead(key: bytes) -> AESGCM:
    """The AES-GCM context of ``key``, made once while it is among the last
    :data:`AEADS` keys used: making one costs ~2.4 µs, about what the encryption of a
    whole event costs. It holds no more than the keyring already holds (the key), and
    a destroyed key is never asked for again (the keyring no longer gives it)."""
    context = _AEADS.get(key)
    if context is None:
        if len(_AEADS) >= AEADS:
            _AEADS.clear()
        context = _AEADS[key] = AESGCM(key)
    return context


def subject_of(event: Event) -> str:
    """Whose data key seals ``event``: its user, else its agent."""
    return event.user_id or event.agent_id


def is_sealed(raw: bytes) -> bool:
    return raw[:10] == SEALED_HEADER


def sealed_kind(raw: bytes) -> str | None:
    """The type the clear envelope of sealed bytes names (no key needed); None for
    bytes that are not sealed or whose envelope does not read."""
    return read_sealed_type(raw) if is_sealed(raw) else None


@dataclass(frozen=True)
class SealedEnvelope:
    """The clear part of a sealed event: readable without any key."""

    event_id: UUID
    type: str
    agent_id: str
    session_id: str | None
    user_id: str | None
    occurred_at: datetime
    seq: int | None
    idx: int | None
    subject: str
    key_id: str


class Shredded(Exception):
    """The subject's data key was destroyed: the event can never be opened again."""

    def __init__(self, envelope: SealedEnvelope) -> None:
        super().__init__(
            f"{envelope.type} {envelope.event_id}: subject {envelope.subject!r} erased"
        )
        self.envelope = envelope


class UnknownKey(Exception):
    """The data key is not in the keyring (yet): refresh it and try again."""

    def __init__(self, envelope: SealedEnvelope) -> None:
        super().__init__(
            f"{envelope.type} {envelope.event_id}: no data key {envelope.key_id!r}"
            f" for subject {envelope.subject!r}"
        )
        self.envelope = envelope


class Keyring(Protocol):
    """Where data keys come from. ``data_key`` returns the subject's current key
    (making one if it has none); ``find`` a given key, or None when it is unknown or
    destroyed; ``destroyed`` tells the two apart."""

    def data_key(self, subject: str) -> tuple[str, bytes]: ...

    def find(self, subject: str, key_id: str) -> bytes | None: ...

    def destroyed(self, subject: str, key_id: str) -> bool: ...


class Sealer:
    """Seals and opens events with the keys of ``keyring``; ``codec`` encodes and
    decodes the events inside (its size limit applies to them)."""

    def __init__(self, codec: Codec, keyring: Keyring, *, remember: bool = True) -> None:
        self.codec = codec
        self.keyring = keyring
        self.remember = remember
        """Whether what this sealer seals from given bytes, or opens, goes to
        :data:`RECENT` for a later open in this process (see :class:`Handoffs`): off
        where no one will (~6 µs an event, and the memory the events hold)."""

    def seal(self, event: Event, inner: bytes | None = None, *, remember: bool = True) -> bytes:
        """The sealed bytes of ``event`` under its subject's current data key.
        ``inner``: the event's Avro single-object bytes when the caller has them (the
        bytes it was decoded from, whatever writer schema), to save encoding it again;
        with ``remember`` (and :attr:`remember`), the sealed bytes then open to
        ``event`` from :data:`RECENT`."""
        given = inner is not None
        if inner is None:
            inner = self.codec.encode(event)
        subject = subject_of(event)
        key_id, key = self.keyring.data_key(subject)
        nonce = new_nonce()
        event_id = str(event.event_id)
        seq = idx = None
        if isinstance(event, DerivedEvent):
            seq, idx = event.seq, event.idx
        raw = (write_sealed_fields if _SEAL_FIELDS is None else _SEAL_FIELDS)(
            SEALED_HEADER,
            event_id,
            event.type,
            event.agent_id,
            event.session_id,
            event.user_id,
            event.occurred_at,
            seq,
            idx,
            subject,
            key_id,
            nonce,
            aead(key).encrypt(
                nonce, inner, sealed_aad(event_id, event.type, event.agent_id, subject, key_id)
            ),
        )
        if given and remember and self.remember:  # opening ``raw`` gives ``event`` back
            RECENT.put(raw, _Handoff(event, subject, key_id, key, len(inner)))
        return raw

    def envelope(self, raw: bytes) -> SealedEnvelope:
        """The clear envelope of sealed bytes; BadEvent if they are not well formed."""
        return _envelope(self._record(raw))

    def open(self, raw: bytes) -> Event:
        """The event inside ``raw`` (see the module's contract)."""
        return self.open_clear(raw)[0]

    def open_clear(self, raw: bytes) -> tuple[Event, bytes | None]:
        """:meth:`open`'s event and the clear bytes it was sealed from: the event's
        single-object bytes as its sealer encoded them (Avro, of whatever writer
        schema), authenticated and matched to the envelope; None for the bytes when the
        event came from :data:`RECENT` (nothing was decrypted). Raises as :meth:`open`."""
        handoff = RECENT.get(raw)
        if (
            handoff is not None
            and handoff.inner_size <= self.codec.max_bytes
            and len(raw) <= self.codec.max_bytes + OVERHEAD
            and self.keyring.find(handoff.subject, handoff.key_id) == handoff.key
        ):
            return handoff.event, None
        opened = self._open_read_by_hand(raw)
        if opened is not None:
            return opened
        record = self._record(raw)
        envelope = _envelope(record)
        key = self.keyring.find(envelope.subject, envelope.key_id)
        if key is None:
            if self.keyring.destroyed(envelope.subject, envelope.key_id):
                raise Shredded(envelope)
            raise UnknownKey(envelope)
        aad = sealed_aad(
            str(envelope.event_id),
            envelope.type,
            envelope.agent_id,
            envelope.subject,
            envelope.key_id,
        )
        try:
            inner = aead(key).decrypt(record["nonce"], record["ciphertext"], aad)
        except (InvalidTag, ValueError):
            raise BadEvent(f"sealed {envelope.type} does not authenticate", raw) from None
        event = self.codec.decode(inner)
        if _envelope_of(event, envelope.key_id) != envelope:
            raise BadEvent(f"sealed {envelope.type} does not match its clear envelope", raw)
        if self.remember:
            RECENT.put(raw, _Handoff(event, envelope.subject, envelope.key_id, key, len(inner)))
        return event, inner

    def _open_read_by_hand(self, raw: bytes) -> tuple[Event, bytes] | None:
        """:meth:`open_clear`'s result when the envelope, read by :func:`_sealed_fields`, is
        well formed, its key known, the ciphertext authentic and the event inside
        matches the envelope field for field (its id in canonical form); else None, and
        the caller takes fastavro's road, which raises what is wrong. When this gives an
        event, that road gives the same one (a property test holds the two equal):
        only the cost differs (~13 µs of an open's ~45 went into fastavro's reading of
        the envelope and the two envelope models compared)."""
        if len(raw) > self.codec.max_bytes + OVERHEAD or not is_sealed(raw):
            return None
        fields = _sealed_fields(raw)
        if fields is None:
            return None
        event_id, kind, agent, session, user, millis, seq, idx, subject, key_id, nonce, sealed = (
            fields
        )
        key = self.keyring.find(subject, key_id)
        if key is None or len(nonce) != 12:
            return None
        try:
            inner = aead(key).decrypt(
                nonce, sealed, sealed_aad(event_id, kind, agent, subject, key_id)
            )
            event = self.codec.decode_trusted(inner)  # authentic: engram sealed a valid event
        except (InvalidTag, ValueError, BadEvent):  # fastavro's road says what is wrong
            return None
        at = event.occurred_at
        if (
            event.type != kind
            or event.agent_id != agent
            or event.session_id != session
            or event.user_id != user
            or subject_of(event) != subject
            or at.microsecond % 1000
            or epoch_millis(at) != millis
            or str(event.event_id) != event_id
            or (
                (event.seq, event.idx) != (seq, idx)
                if isinstance(event, DerivedEvent)
                else seq is not None or idx is not None
            )
        ):
            return None
        if self.remember:
            RECENT.put(raw, _Handoff(event, subject, key_id, key, len(inner)))
        return event, inner

    def inner(self, raw: bytes) -> bytes | None:
        """The clear bytes inside sealed ``raw``, authenticated and matched to the
        envelope without decoding them: when this gives bytes, :meth:`open` gives the
        event ``codec.decode`` reads from them (or raises what it raises); None when
        it cannot say so by hand (the caller takes :meth:`open`, which tells why). For
        readers that trust what the fold validated before sealing (a rebuild), only
        for derived events whose writer schema opens with the envelope fields in the
        order of :data:`DERIVED_HEAD` (a property test holds the two roads equal)."""
        if len(raw) > self.codec.max_bytes + OVERHEAD or not is_sealed(raw):
            return None
        read = read_sealed(raw)
        if read is None:
            return None
        head, (event_id, kind, agent, _, user, millis, seq, idx, subject, key_id, nonce, sealed) = (
            read
        )
        if seq is None or idx is None or subject != (user or agent) or len(nonce) != 12:
            return None
        key = self.keyring.find(subject, key_id)
        if key is None or not _CANONICAL_UUID.fullmatch(event_id):
            return None
        if not MIN_MILLIS <= millis <= MAX_MILLIS:  # a datetime reads it
            return None
        try:
            inner = aead(key).decrypt(
                nonce, sealed, sealed_aad(event_id, kind, agent, subject, key_id)
            )
        except InvalidTag:
            return None
        if len(inner) > self.codec.max_bytes or inner[:2] != MAGIC:
            return None
        fp = inner[2:10]
        writer = self.codec.writers.get(fp)
        if writer is None or kind != writer.reader.event_type.TYPE or not _derived_head(fp, writer):
            return None
        # event_id … occurred_at are written alike in both records: their bytes agree
        if inner[10:head] != raw[10:head] or inner_positions(inner, head) != (seq, idx):
            return None
        return inner

    def _record(self, raw: bytes) -> dict[str, Any]:
        if not is_sealed(raw):
            raise BadEvent("not a sealed event (header)", raw)
        if len(raw) > self.codec.max_bytes + OVERHEAD:
            raise BadEvent(f"sealed event of {len(raw)} bytes is over the size limit", raw)
        record = read_single_object(raw, _PARSED, "sealed event")
        if len(record["nonce"]) != 12:
            raise BadEvent("malformed sealed event: nonce is not 12 bytes", raw)
        return record


_TEXTS = ("event_id", "type", "agent_id", "subject", "key_id")
_OPTIONAL_TEXTS = ("session_id", "user_id")


def write_sealed(record: dict[str, Any]) -> bytes:
    """The single-object bytes of a sealed ``record`` (:data:`SEALED_SCHEMA`'s fields),
    byte for byte what ``write_single_object(SEALED_HEADER, …)`` writes (a property
    test holds them equal), written field by field: fastavro's writer costs ~7 µs a
    call here, most of it resolving the schema. Strings must be ``str``, and
    ``occurred_at`` an aware datetime (anything else takes fastavro's road)."""
    at = record["occurred_at"]
    if (
        not isinstance(at, datetime)
        or at.tzinfo is None
        or not all(type(record[k]) is str for k in _TEXTS)
        or not all(record[k] is None or type(record[k]) is str for k in _OPTIONAL_TEXTS)
    ):
        return write_single_object(SEALED_HEADER, _PARSED, record)
    return write_sealed_fields(SEALED_HEADER, *(record[name] for name in _FIELDS))


_FIELDS = tuple(field["name"] for field in SEALED_SCHEMA["fields"])


def _envelope(record: dict[str, Any]) -> SealedEnvelope:
    try:
        event_id = UUID(str(record["event_id"]))
    except ValueError:
        raise BadEvent(f"malformed sealed event: event_id {record['event_id']!r}") from None
    return SealedEnvelope(
        event_id=event_id,
        type=record["type"],
        agent_id=record["agent_id"],
        session_id=record["session_id"],
        user_id=record["user_id"],
        occurred_at=record["occurred_at"],
        seq=record["seq"],
        idx=record["idx"],
        subject=record["subject"],
        key_id=record["key_id"],
    )


def _envelope_of(event: Event, key_id: str) -> SealedEnvelope:
    """The clear envelope ``event`` sealed under ``key_id`` has: its subject is the
    event's own (:func:`subject_of`), whatever key sealed it."""
    seq = idx = None
    if isinstance(event, DerivedEvent):
        seq, idx = event.seq, event.idx
    return SealedEnvelope(
        event_id=event.event_id,
        type=event.type,
        agent_id=event.agent_id,
        session_id=event.session_id,
        user_id=event.user_id,
        occurred_at=event.occurred_at,
        seq=seq,
        idx=idx,
        subject=subject_of(event),
        key_id=key_id,
    )


CLEAR_TYPES = frozenset({"clock.tick", "subject.erasure_requested", "subject.erased"})
"""Types :class:`SealingCodec` never seals: they carry no content and no subject (the
ticker's ``clock.tick`` is broadcast to every agent of a partition)."""


class SealingCodec(Codec):
    """A :class:`Codec` that seals what it encodes and opens what it reads.

    ``encode`` seals every event (but :data:`CLEAR_TYPES`) under its subject's current
    key from ``keyring``; ``keyring=None`` turns sealing off (clear Avro, as
    :class:`Codec`). :meth:`open` is the one read path of every reader of event bytes,
    clear or sealed; ``decode`` stays :class:`Codec`'s (clear bytes only).
    ``remember``: see :attr:`Sealer.remember`.
    """

    def __init__(
        self,
        keyring: Keyring | None,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        accept: frozenset[str] | None = None,
        remember: bool = True,
    ) -> None:
        super().__init__(max_bytes=max_bytes, accept=accept)
        self.keyring = keyring
        self.remember = remember
        inner = Codec(max_bytes=max_bytes)  # what the sealed bytes hold: clear, any type
        self.sealer = Sealer(inner, keyring, remember=remember) if keyring is not None else None
        self._reader = Sealer(inner, _NO_KEYS)
        self.shredded = 0
        """How many events :meth:`open` found shredded (skipped)."""

    def encode_clear(self, event: Event) -> bytes:
        """The event's clear Avro single-object bytes (what the sealed bytes hold)."""
        return super().encode(event)

    def encode(self, event: Event) -> bytes:
        """Sealed bytes of ``event`` (clear ones when sealing is off or the type is
        in :data:`CLEAR_TYPES`); BadEvent if the clear event is over the size limit."""
        if self.sealer is None or event.type in CLEAR_TYPES:
            return self.encode_clear(event)
        return self.sealer.seal(event)

    def encode_with_clear(self, event: Event) -> tuple[bytes, bytes]:
        """The clear bytes of ``event`` and :meth:`encode`'s, which seals those very
        bytes (not remembered for a later open: see :attr:`Sealer.remember`)."""
        clear = self.encode_clear(event)
        if self.sealer is None or event.type in CLEAR_TYPES:
            return clear, clear
        return clear, self.sealer.seal(event, clear, remember=False)

    def reseal(self, event: Event, raw: bytes) -> bytes:
        """What :meth:`encode` gives for ``event`` decoded from the clear bytes ``raw``:
        Avro ``raw`` is sealed as it is (no second encoding), JSON is encoded first;
        sealed ``raw`` is returned unchanged."""
        if is_sealed(raw):
            return raw
        if self.sealer is None or event.type in CLEAR_TYPES:
            return raw if raw[:2] == MAGIC else self.encode_clear(event)
        return self.sealer.seal(event, raw if raw[:2] == MAGIC else None)

    def open(self, raw: bytes) -> Event | None:
        """The event in ``raw`` (clear Avro, JSON or sealed), or None when it is sealed
        under a destroyed key (counted in :attr:`shredded`: skip it). Raises
        :class:`UnknownKey` (refresh the keyring, try again) and BadEvent (the bytes
        are bad, or sealed and this codec has no keys)."""
        return self.open_clear(raw)[0]

    def open_clear(self, raw: bytes) -> tuple[Event | None, bytes | None]:
        """:meth:`open`'s event and, for sealed ``raw``, the clear bytes inside it when
        they were decrypted (:meth:`Sealer.open_clear`); None for the bytes of clear
        ``raw`` (they are ``raw``), of a shredded event and of one from :data:`RECENT`.
        Raises as :meth:`open`."""
        if not is_sealed(raw):
            return self.decode(raw), None
        if self.sealer is None:
            raise BadEvent("a sealed event, and this reader has no keys (ENGRAM_SEAL=off?)", raw)
        try:
            event, inner = self.sealer.open_clear(raw)
        except Shredded as gone:
            self.shredded += 1
            log.debug("skipped a shredded event: %s", gone)
            return None, None
        if event.type not in self.accept:
            raise BadEvent(f"event type {event.type!r} is not accepted here", raw)
        return event, inner

    def kind(self, raw: bytes) -> str | None:
        """The type of the event in ``raw`` read from its header alone (the clear
        envelope of sealed bytes, the writer schema of clear Avro); None when the
        header does not say (JSON, bad bytes)."""
        if is_sealed(raw):
            return read_sealed_type(raw)
        writer = self.writers.get(raw[2:10]) if raw[:2] == MAGIC else None
        return writer.reader.event_type.TYPE if writer is not None else None

    def envelope(self, raw: bytes) -> SealedEnvelope:
        """The clear envelope of sealed bytes; BadEvent if they are not well formed."""
        return self._reader.envelope(raw)

    def unknown(self, raws: Iterable[bytes | None]) -> list[SealedEnvelope]:
        """Envelopes of the sealed events among ``raws`` whose key is neither known nor
        destroyed: once this is empty, :meth:`open` raises no UnknownKey for them."""
        if self.keyring is None:
            return []
        missing = []
        for raw in raws:
            if raw is None or not is_sealed(raw):
                continue
            handoff = RECENT.get(raw)  # its envelope's subject and key id, already read
            key = (handoff.subject, handoff.key_id) if handoff is not None else read_sealed_key(raw)
            if key is None:
                continue  # not well formed: open() dead-letters it
            subject, key_id = key
            known = self.keyring.find(subject, key_id) is not None
            if not known and not self.keyring.destroyed(subject, key_id):
                missing.append(self.envelope(raw))
        return missing


def _sealed_fields(raw: bytes) -> SealedFields | None:
    """The fields :func:`~schemas.wire.read_sealed` reads of sealed ``raw``, or None."""
    read = read_sealed(raw)
    return None if read is None else read[1]


DERIVED_HEAD = (
    ("event_id", "string"),
    ("type", "string"),
    ("agent_id", "string"),
    ("session_id", ("null", "string")),
    ("user_id", ("null", "string")),
    ("occurred_at", "timestamp-millis"),
    ("schema_version", "long"),
    ("source_event_id", "string"),
    ("seq", "long"),
    ("idx", "long"),
)
"""The fields a derived event's Avro record opens with, as :meth:`Sealer.inner`
reads them by hand: names and types (a logical type named for itself)."""

_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_HEADS: dict[bytes, bool] = {}


def _derived_head(fingerprint: bytes, writer: WriterSchema) -> bool:
    """Whether ``writer`` (the schema of ``fingerprint``) opens its record with
    :data:`DERIVED_HEAD`; remembered by fingerprint, which names the schema."""
    known = _HEADS.get(fingerprint)
    if known is None:
        fields = writer.parsed.get("fields", []) if isinstance(writer.parsed, dict) else []
        head = tuple((f["name"], _type_name(f["type"])) for f in fields[: len(DERIVED_HEAD)])
        known = _HEADS[fingerprint] = head == DERIVED_HEAD
    return known


def _type_name(kind: Any) -> Any:
    if isinstance(kind, list):
        return tuple(_type_name(k) for k in kind)
    if isinstance(kind, dict):
        kind = kind.get("logicalType") or kind.get("type")
    return "string" if kind == "uuid" else kind  # a uuid is written as its string


class _NoKeys:
    def data_key(self, subject: str) -> tuple[str, bytes]:
        raise LookupError(subject)

    def find(self, subject: str, key_id: str) -> bytes | None:
        return None

    def destroyed(self, subject: str, key_id: str) -> bool:
        return False


_NO_KEYS = _NoKeys()
