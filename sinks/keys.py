"""The data keys of crypto-shredding, kept on a compacted Kafka topic (``engram.keys``).

Each subject (a user, or an agent without users) has one or more 256-bit data keys;
:class:`~schemas.sealed.Sealer` seals the subject's events with its newest one.
A key is stored *wrapped* (AES-256-GCM under the master key, bound to its subject and
id), one record per key: the record key is ``subject`` + ``0x1f`` + ``key_id``, the
value JSON ``{"v": 1, "state": "live", "wrapped": <base64>, "created_at": ...}``.
Destroying a subject writes ``{"v": 1, "state": "destroyed", ...}`` over each of its
keys: compaction then keeps only the marker, so the key material is gone from the
topic, and every reader can still tell a destroyed key (the event is erased: skip
it) from one it has not read yet (wait for it). A null tombstone would not do: it is
itself removed after ``delete.retention.ms``, and a replay could no longer tell.

Two writers may create a key for the same subject at once: both keys are kept, the
subject's events open with either, and destruction covers all of them.

:class:`KeyBook` is the in-memory state (a :class:`~schemas.sealed.Keyring`);
:class:`KafkaKeyring` fills it from the topic and writes to it.
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import json
import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from schemas import DEFAULT_MAX_BYTES, Event
from schemas.sealed import SealingCodec, UnknownKey
from sinks.clients import started

log = logging.getLogger("engram.keys")
T = TypeVar("T")
OpenEvent = Callable[[bytes], Event | None]
"""A reader of stored event bytes, clear or sealed: the event, or None when it is
shredded (skip it); BadEvent for bad bytes (see :func:`open_waiting`)."""


@runtime_checkable
class Unsealing(Protocol):
    """An :data:`OpenEvent` that can also hand over a sealed derived event's clear
    bytes undecoded, or None where it does not vouch for them (then call it):
    :class:`KeyedOpener`."""

    def __call__(self, raw: bytes) -> Event | None: ...

    def unseal(self, raw: bytes) -> bytes | None: ...


SEPARATOR = "\x1f"
KEY_BYTES = 32


class KeyStoreError(Exception):
    """A key store problem that is not the caller's input: a wrong master key, a
    malformed record on the key topic."""


class MasterKey:
    """The key that wraps every data key: 32 bytes, from ``ENGRAM_MASTER_KEY`` (base64)
    or a file holding them (``ENGRAM_MASTER_KEY_FILE``)."""

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"the master key must be {KEY_BYTES} bytes, got {len(key)}")
        self._aead = AESGCM(key)

    @classmethod
    def from_base64(cls, text: str) -> MasterKey:
        try:
            return cls(base64.b64decode(text.strip(), validate=True))
        except ValueError as error:
            raise ValueError(f"the master key is not valid base64 of 32 bytes: {error}") from None

    @classmethod
    def from_file(cls, path: Path, *, create: bool = False) -> MasterKey:
        """The key in ``path`` (base64); with ``create``, a new one is written there
        first (mode 0600) when the file does not exist."""
        if create and not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
            with os.fdopen(fd, "w") as file:
                file.write(base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode() + "\n")
        return cls.from_base64(path.read_text())

    def wrap(self, subject: str, key_id: str, data_key: bytes) -> bytes:
        nonce = secrets.token_bytes(12)
        return nonce + self._aead.encrypt(nonce, data_key, _bound(subject, key_id))

    def unwrap(self, subject: str, key_id: str, wrapped: bytes) -> bytes:
        try:
            return self._aead.decrypt(wrapped[:12], wrapped[12:], _bound(subject, key_id))
        except (InvalidTag, ValueError):
            raise KeyStoreError(
                f"data key {key_id!r} of {subject!r} does not unwrap: another master key?"
            ) from None


class KeyFile:
    """A local copy of the key topic (``$ENGRAM_HOME/keys.jsonl``, mode 0600), for the
    embedded stack whose broker keeps its log in memory: restored into an empty key
    topic on start, as the events are restored from the archive.

    Every record is written here *before* it is published (so no event is ever sealed
    under a key the copy lacks); a live key is appended, a destroyed one makes the
    file rewritten whole without the key's material (atomically: temp file, fsync,
    rename), so destroying a key destroys it here too. One lock per path serialises
    the writers of a process, and a lock on ``<path>.lock`` (``flock``) those of the
    stack's processes (the worker, its ingest process)."""

    _locks: dict[Path, threading.Lock] = {}

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = KeyFile._locks.setdefault(path.resolve(), threading.Lock())

    def load(self) -> dict[bytes, bytes | None]:
        """Record key -> its last value (None: a null tombstone)."""
        out: dict[bytes, bytes | None] = {}
        if not self.path.exists():
            return out
        for line in self.path.read_text().splitlines():
            if line.strip():
                doc = json.loads(line)
                value = doc["v"]
                out[base64.b64decode(doc["k"])] = None if value is None else value.encode()
        return out

    def record(self, records: Sequence[tuple[bytes, bytes | None]]) -> None:
        """Keep ``records`` (key, value) durably; returns once they are on disk."""
        if not records:
            return
        with self._lock, _locked(self.path.with_name(self.path.name + ".lock")):
            held = self.load()
            fresh = [(k, v) for k, v in records if k not in held or held[k] != v]
            if not fresh:
                return
            if any(not _is_live(v) for _, v in fresh) or any(k in held for k, _ in fresh):
                held.update(fresh)
                self._rewrite(held)
            else:
                self._append(fresh)

    def _append(self, records: Sequence[tuple[bytes, bytes | None]]) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "w") as file:
            file.writelines(_line(k, v) for k, v in records)
            file.flush()
            os.fsync(file.fileno())

    def _rewrite(self, records: dict[bytes, bytes | None]) -> None:
        temp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as file:
            file.writelines(_line(k, v) for k, v in records.items())
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, self.path)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created, mode 0600) across processes."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _line(key: bytes, value: bytes | None) -> str:
    text = None if value is None else value.decode()
    return json.dumps({"k": base64.b64encode(key).decode(), "v": text}) + "\n"


def _is_live(value: bytes | None) -> bool:
    return value is not None and json.loads(value).get("state") == "live"


async def restore_keys(bootstrap: str, topic: str, keys: KeyFile) -> int:
    """Publish the key file into the key topic when the topic is empty (a broker that
    kept its log in memory restarted); return how many records."""
    records = keys.load()
    if not records:
        return 0
    consumer = await started(
        AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    )
    try:
        partition = TopicPartition(topic, 0)
        ends = await consumer.end_offsets([partition])
    finally:
        await consumer.stop()
    if ends[partition] > 0:
        return 0
    producer = await started(AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all"))
    try:
        sends = [await producer.send(topic, v, k, partition=0) for k, v in records.items()]
        await asyncio.gather(*sends)
    finally:
        await producer.stop()
    return len(records)


def _bound(subject: str, key_id: str) -> bytes:
    return f"engram.keys.v1{SEPARATOR}{subject}{SEPARATOR}{key_id}".encode()


@dataclass
class KeyBook:
    """Every data key read so far: subject -> key id -> key bytes, or None once
    destroyed. Keys of a subject keep the order they were read in; the newest live
    one seals. Implements :class:`schemas.sealed.Keyring` (``data_key`` only finds:
    :meth:`KafkaKeyring.ensure` makes missing keys)."""

    keys: dict[str, dict[str, bytes | None]] = field(default_factory=dict)
    created: dict[tuple[str, str], datetime] = field(default_factory=dict)
    """When each key was made (from its record), where known."""

    def data_key(self, subject: str) -> tuple[str, bytes]:
        for key_id, key in reversed(self.keys.get(subject, {}).items()):
            if key is not None:
                return key_id, key
        raise LookupError(f"no live data key for subject {subject!r}: ensure() it first")

    def find(self, subject: str, key_id: str) -> bytes | None:
        return self.keys.get(subject, {}).get(key_id)

    def destroyed(self, subject: str, key_id: str) -> bool:
        known = self.keys.get(subject, {})
        return key_id in known and known[key_id] is None

    def live(self, subject: str) -> list[str]:
        return [k for k, v in self.keys.get(subject, {}).items() if v is not None]

    def erased(self) -> list[str]:
        """Subjects whose every key is destroyed."""
        return sorted(
            s for s, ks in self.keys.items() if ks and all(v is None for v in ks.values())
        )

    def apply(self, record_key: bytes, value: bytes | None, master: MasterKey) -> None:
        """Fold one record of the key topic in."""
        try:
            subject, key_id = record_key.decode().split(SEPARATOR)
        except ValueError:
            raise KeyStoreError(f"malformed key record {record_key!r}") from None
        held = self.keys.setdefault(subject, {})
        if value is None:  # a null tombstone (not written by engram): the key is gone
            held[key_id] = None
            return
        doc = json.loads(value)
        if doc.get("state") == "destroyed":
            held[key_id] = None
        elif doc.get("state") == "live":
            if key_id in held and held[key_id] is None:
                return  # destroyed stays destroyed, whatever was read after
            held[key_id] = master.unwrap(subject, key_id, base64.b64decode(doc["wrapped"]))
            made = doc.get("created_at")
            if isinstance(made, str):
                self.created[subject, key_id] = datetime.fromisoformat(made)
        else:
            raise KeyStoreError(
                f"key record of {subject!r}/{key_id!r} has state {doc.get('state')!r}"
            )


KEY_FETCH_WAIT_MS = 100
"""The key consumer's long-poll wait while a refresh reads: a fetch still waiting at
the broker when a refresh ends delays the next refresh's end-offset request by at
most this much."""


class KafkaKeyring(KeyBook):
    """A :class:`KeyBook` backed by the key topic (one partition, compacted: see
    :func:`ops.topics.pipeline_topics`). :meth:`start` reads the topic to
    its end; :meth:`refresh` reads what was written since; :meth:`ensure` creates
    the subjects' missing keys; :meth:`destroy` shreds a subject. Writes return once
    the broker has acknowledged them (``acks=all``)."""

    def __init__(
        self, bootstrap: str, topic: str, master: MasterKey, archive: KeyFile | None = None
    ) -> None:
        super().__init__()
        self.bootstrap = bootstrap
        self.topic = topic
        self.master = master
        self.archive = archive
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()
        self._pending: list[tuple[str, str, bytes]] = []

    async def start(self) -> None:
        """Start the clients and read the topic to its end. On failure, nothing stays
        started (the caller may start again)."""
        self._consumer = await started(
            AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                fetch_max_wait_ms=KEY_FETCH_WAIT_MS,
            )
        )
        try:
            partition = TopicPartition(self.topic, 0)  # the topic's one partition
            self._consumer.assign([partition])
            self._consumer.pause(partition)  # fetched during a refresh only
            await self._consumer.seek_to_beginning()
            self._producer = await started(
                AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
            )
            await self.refresh()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        producer, self._producer = self._producer, None
        if consumer is not None:
            await consumer.stop()
        if producer is not None:
            await producer.stop()

    async def refresh(self) -> None:
        """Read every record written up to now.

        The partition stays paused between refreshes, so no fetch is waiting at the
        broker when this asks for the end offset: a broker answers a connection's
        requests in order, and the ``ListOffsets`` request would wait behind an idle
        long-poll fetch (``fetch_max_wait_ms``: 500 ms by default, and every refresh
        paid it)."""
        consumer = self._running_consumer()
        async with self._lock:
            assigned = list(consumer.assignment())
            ends = await consumer.end_offsets(assigned)
            read: list[tuple[bytes, bytes | None]] = []
            if await _behind(consumer, ends):
                consumer.resume(*assigned)
                try:
                    while await _behind(consumer, ends):
                        batches = await consumer.getmany(timeout_ms=500)
                        for records in batches.values():
                            for record in records:
                                self.apply(record.key or b"", record.value, self.master)
                                read.append((record.key or b"", record.value))
                finally:
                    consumer.pause(*assigned)
            if self.archive is not None:
                self.archive.record(read)

    def data_key(self, subject: str) -> tuple[str, bytes]:
        """The subject's newest live key; without one, a new key is made here and held
        as *pending*: :meth:`flush` writes it, and whoever seals with it must flush
        before the sealed bytes leave the process (see :meth:`ensure`)."""
        try:
            return super().data_key(subject)
        except LookupError:
            key_id, key = secrets.token_hex(8), secrets.token_bytes(KEY_BYTES)
            _key(subject, key_id)  # refuses a subject with the separator before anything
            self.keys.setdefault(subject, {})[key_id] = key
            self._pending.append((subject, key_id, key))
            self.created[subject, key_id] = datetime.now(UTC)
            return key_id, key

    @property
    def pending(self) -> int:
        """How many keys were made and are not written yet."""
        return len(self._pending)

    async def flush(self) -> None:
        """Write the pending keys; returns once the broker acknowledged them all. On
        failure they stay pending (the caller retries)."""
        if not self._pending:
            return
        producer = self._running_producer()
        now = datetime.now(UTC).isoformat()
        pending = list(self._pending)
        records = []
        for subject, key_id, key in pending:
            wrapped = base64.b64encode(self.master.wrap(subject, key_id, key)).decode()
            value = {"v": 1, "state": "live", "wrapped": wrapped, "created_at": now}
            records.append((_key(subject, key_id), json.dumps(value).encode()))
        if self.archive is not None:
            self.archive.record(records)
        sends = [await producer.send(self.topic, value, key) for key, value in records]
        await asyncio.gather(*sends)
        del self._pending[: len(pending)]

    async def ensure(self, subjects: Iterable[str]) -> None:
        """Give every subject without a live key a new one, written when this returns."""
        for subject in sorted(set(subjects)):
            self.data_key(subject)
        await self.flush()

    async def destroy(self, subject: str, *, made_by: datetime | None = None) -> list[str]:
        """Destroy every key of ``subject`` (refreshing first, so that keys other
        writers made are destroyed too) or, with ``made_by``, those made at or before
        it (an erasure request read again later must not destroy the keys the subject
        was given after it; a key of unknown age is destroyed); return the ids."""
        await self.refresh()
        key_ids = [
            k
            for k in self.live(subject)
            if made_by is None
            or (made := self.created.get((subject, k))) is None
            or made <= made_by
        ]
        producer = self._running_producer()
        now = datetime.now(UTC).isoformat()
        value = json.dumps({"v": 1, "state": "destroyed", "destroyed_at": now}).encode()
        if self.archive is not None:  # first: a crash in between must not revive the key
            self.archive.record([(_key(subject, k), value) for k in key_ids])
        sends = [await producer.send(self.topic, value, _key(subject, k)) for k in key_ids]
        await asyncio.gather(*sends)
        for key_id in key_ids:
            self.keys[subject][key_id] = None
        return key_ids

    def _running_consumer(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise RuntimeError("the keyring is not started")
        return self._consumer

    def _running_producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise RuntimeError("the keyring is not started")
        return self._producer


async def _behind(consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int]) -> bool:
    for partition, end in ends.items():
        if await consumer.position(partition) < end:
            return True
    return False


def _key(subject: str, key_id: str) -> bytes:
    if SEPARATOR in subject:
        raise ValueError("a subject cannot contain the unit separator (0x1f)")
    return f"{subject}{SEPARATOR}{key_id}".encode()


COVER_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
"""Waits between keyring refreshes while a sealed event's key is unknown (the last
one repeats: an unknown key is waited for, never given up on)."""


async def cover(codec: SealingCodec, keyring: KafkaKeyring, raws: Sequence[bytes | None]) -> None:
    """Refresh ``keyring`` until every sealed event among ``raws`` has a known or a
    destroyed key (backoff :data:`COVER_BACKOFF_S`, forever: the key was written before
    the event was, so it comes). Afterwards ``codec.open`` raises no UnknownKey on them."""
    attempt = 0
    while missing := codec.unknown(raws):
        if attempt == len(COVER_BACKOFF_S) * 2:
            log.warning("still waiting for the data key of %s", missing[0].subject)
        await keyring.refresh()
        if not codec.unknown(raws):
            return
        await asyncio.sleep(COVER_BACKOFF_S[min(attempt, len(COVER_BACKOFF_S) - 1)])
        attempt += 1


class BlockingKeyring:
    """A :class:`KafkaKeyring` on a private event-loop thread, for readers that are
    not coroutines (snapshots on an executor thread, exports, rebuild decoding): its
    ``book`` is the :class:`~schemas.sealed.Keyring`, :meth:`refresh` blocks the
    calling thread (never call it on the private loop itself)."""

    def __init__(
        self, bootstrap: str, topic: str, master: MasterKey, archive: KeyFile | None = None
    ) -> None:
        self.book = KafkaKeyring(bootstrap, topic, master, archive)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="engram-keyring", daemon=True
        )
        self._thread.start()
        self._follower: Future[None] | None = None
        self._run(self.book.start())
        self._read_at = time.monotonic()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def refresh(self) -> None:
        self._run(self.book.refresh())
        self._read_at = time.monotonic()

    def follow(self, every_s: float) -> None:
        """Read the key topic every ``every_s`` seconds from now on (so that the key
        file learns of keys made and destroyed elsewhere), until :meth:`close`."""
        self._follower = asyncio.run_coroutine_threadsafe(self._follow(every_s), self._loop)

    async def _follow(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.book.refresh()
            except Exception as error:  # the next round tries again
                log.warning("reading the key topic failed: %r", error)

    def opener(self, *, max_bytes: int = DEFAULT_MAX_BYTES, max_age_s: float = 1.0) -> KeyedOpener:
        """An :data:`OpenEvent` over these keys: unknown keys are refreshed and waited
        for, and the keys are read again when the last read is older than
        ``max_age_s`` (so a replay started after a key was destroyed skips its events)."""
        return KeyedOpener(self, SealingCodec(self.book, max_bytes=max_bytes), max_age_s)

    def fresh(self, max_age_s: float) -> None:
        """Read the keys again if the last read is older than ``max_age_s``."""
        if time.monotonic() - self._read_at > max_age_s:
            self.refresh()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        if self._follower is not None:
            self._follower.cancel()
        self._run(self.book.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()


class KeyedOpener:
    """:meth:`BlockingKeyring.opener`: an :data:`OpenEvent` (call it) that can also
    hand over a sealed derived event's clear bytes undecoded (:meth:`unseal`), for a
    rebuild that has ClickHouse read them."""

    def __init__(self, keys: BlockingKeyring, codec: SealingCodec, max_age_s: float) -> None:
        self.keys = keys
        self.codec = codec
        self.max_age_s = max_age_s

    def __call__(self, raw: bytes) -> Event | None:
        self.keys.fresh(self.max_age_s)
        return open_waiting(self.codec, raw, self.keys.refresh)

    def unseal(self, raw: bytes) -> bytes | None:
        """The clear bytes inside sealed ``raw`` when they can be had without decoding
        them (:meth:`schemas.sealed.Sealer.inner`: a derived event, its key known);
        None otherwise: call the opener, which waits for a key, skips what is
        shredded and says what is bad. Keys are as fresh as the opener's."""
        sealer = self.codec.sealer
        if sealer is None:
            return None
        self.keys.fresh(self.max_age_s)
        return sealer.inner(raw)


def open_waiting(
    codec: SealingCodec, raw: bytes, refresh: Callable[[], None] | None
) -> Event | None:
    """``codec.open(raw)``, refreshing the keys with ``refresh`` (blocking) and trying
    again with backoff while the key is unknown; None for a shredded event. Without
    ``refresh`` an unknown key raises UnknownKey. BadEvent as ``open``."""
    attempt = 0
    while True:
        try:
            return codec.open(raw)
        except UnknownKey:
            if refresh is None:
                raise
            if attempt == len(COVER_BACKOFF_S) * 2:
                log.warning("still waiting for a data key to open an event")
            refresh()
            try:
                return codec.open(raw)
            except UnknownKey:
                time.sleep(COVER_BACKOFF_S[min(attempt, len(COVER_BACKOFF_S) - 1)])
                attempt += 1
