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
import json
import os
import secrets
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

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


def _bound(subject: str, key_id: str) -> bytes:
    return f"engram.keys.v1{SEPARATOR}{subject}{SEPARATOR}{key_id}".encode()


@dataclass
class KeyBook:
    """Every data key read so far: subject -> key id -> key bytes, or None once
    destroyed. Keys of a subject keep the order they were read in; the newest live
    one seals. Implements :class:`schemas.sealed.Keyring` (``data_key`` only finds:
    :meth:`KafkaKeyring.ensure` makes missing keys)."""

    keys: dict[str, dict[str, bytes | None]] = field(default_factory=dict)

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
        else:
            raise KeyStoreError(
                f"key record of {subject!r}/{key_id!r} has state {doc.get('state')!r}"
            )


class KafkaKeyring(KeyBook):
    """A :class:`KeyBook` backed by the key topic (one partition, compacted: see
    :func:`ops.topics.pipeline_topics`). :meth:`start` reads the topic to
    its end; :meth:`refresh` reads what was written since; :meth:`ensure` creates
    the subjects' missing keys; :meth:`destroy` shreds a subject. Writes return once
    the broker has acknowledged them (``acks=all``)."""

    def __init__(self, bootstrap: str, topic: str, master: MasterKey) -> None:
        super().__init__()
        self.bootstrap = bootstrap
        self.topic = topic
        self.master = master
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
        )
        await consumer.start()
        consumer.assign([TopicPartition(self.topic, 0)])  # the key topic has one partition
        await consumer.seek_to_beginning()
        self._consumer = consumer
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        await producer.start()
        self._producer = producer
        await self.refresh()

    async def stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        producer, self._producer = self._producer, None
        if consumer is not None:
            await consumer.stop()
        if producer is not None:
            await producer.stop()

    async def refresh(self) -> None:
        """Read every record written up to now."""
        consumer = self._running_consumer()
        async with self._lock:
            assigned = list(consumer.assignment())
            ends = await consumer.end_offsets(assigned)
            while await _behind(consumer, ends):
                batches = await consumer.getmany(timeout_ms=500)
                for records in batches.values():
                    for record in records:
                        self.apply(record.key or b"", record.value, self.master)

    async def ensure(self, subjects: Iterable[str]) -> None:
        """Give every subject without a live key a new one."""
        missing = sorted({s for s in subjects if not self.live(s)})
        if not missing:
            return
        producer = self._running_producer()
        now = datetime.now(UTC).isoformat()
        made: list[tuple[str, str, bytes]] = []
        sends = []
        for subject in missing:
            key_id = secrets.token_hex(8)
            key = secrets.token_bytes(KEY_BYTES)
            wrapped = base64.b64encode(self.master.wrap(subject, key_id, key)).decode()
            value = {"v": 1, "state": "live", "wrapped": wrapped, "created_at": now}
            sends.append(
                await producer.send(self.topic, json.dumps(value).encode(), _key(subject, key_id))
            )
            made.append((subject, key_id, key))
        await asyncio.gather(*sends)
        for subject, key_id, key in made:
            self.keys.setdefault(subject, {}).setdefault(key_id, key)

    async def destroy(self, subject: str) -> list[str]:
        """Destroy every key of ``subject`` (refreshing first, so that keys other
        writers made are destroyed too); return the key ids destroyed."""
        await self.refresh()
        key_ids = self.live(subject)
        producer = self._running_producer()
        now = datetime.now(UTC).isoformat()
        value = json.dumps({"v": 1, "state": "destroyed", "destroyed_at": now}).encode()
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
