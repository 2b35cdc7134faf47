"""The one read path of event bytes (:class:`SealingCodec`, :func:`open_waiting`) and
the ingest sealer: clear or sealed in, an event (or a skip) out; no I/O."""

from __future__ import annotations

import base64
import json
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from uuid import UUID

import pytest

from engram.settings import Settings, SettingsError
from schemas import (
    RAW_TYPE_NAMES,
    BadEvent,
    ClockTicked,
    Codec,
    InteractionRecorded,
    MemoryCreated,
    WorkingUpdated,
)
from schemas.sealed import SealingCodec, UnknownKey, is_sealed
from schemas.wire import read_sealed_key
from sinks.keys import KafkaKeyring, KeyBook, KeyFile, MasterKey, open_waiting
from streams.ingest import seal_batch, seal_one
from streams.pipeline import raw_codec
from streams.vectors import VECTOR_TYPES, decode_all

AT = datetime(2026, 11, 2, 9, 30, tzinfo=UTC)
SECRET = "我对花生过敏 — allergic to peanuts"


def book(*subjects: str) -> KeyBook:
    keys = KeyBook()
    for subject in subjects:
        keys.keys[subject] = {secrets.token_hex(8): secrets.token_bytes(32)}
    return keys


def said(user: str | None = "mei", i: int = 1, agent: str = "travel-bot") -> InteractionRecorded:
    return InteractionRecorded(
        event_id=UUID(int=i),
        agent_id=agent,
        session_id="s1",
        user_id=user,
        occurred_at=AT,
        body={"role": "user", "content": f"{SECRET} {i}"},
    )


def created(user: str | None = "mei", i: int = 7) -> MemoryCreated:
    return MemoryCreated.model_validate(
        {
            "event_id": str(UUID(int=i)),
            "agent_id": "travel-bot",
            "user_id": user,
            "occurred_at": AT,
            "source_event_id": str(UUID(int=1)),
            "seq": 3,
            "idx": 0,
            "config_version": "v1",
            "body": {
                "memory_id": str(UUID(int=99)),
                "layer": "L2",
                "kind": "episode",
                "text": SECRET,
                "importance": 5.0,
                "sentiment": 0.0,
                "confidence": 0.5,
                "strength": 1.0,
            },
        }
    )


def tick() -> ClockTicked:
    return ClockTicked.model_validate(
        {
            "event_id": str(UUID(int=5)),
            "agent_id": "__clock__",
            "occurred_at": AT,
            "body": {"partition": 0, "interval_s": 60.0},
        }
    )


def test_what_the_codec_encodes_is_sealed_and_opens_to_itself() -> None:
    codec = SealingCodec(book("mei"))
    raw = codec.encode(said())
    assert is_sealed(raw) and SECRET.encode() not in raw
    assert codec.open(raw) == said()
    assert codec.kind(raw) == "interaction.recorded"


def test_clock_ticks_stay_clear_and_without_keys_nothing_is_sealed() -> None:
    codec = SealingCodec(book())
    assert not is_sealed(codec.encode(tick()))
    clear = SealingCodec(None)
    raw = clear.encode(said())
    assert not is_sealed(raw) and raw == Codec().encode(said())
    assert clear.open(raw) == said()


def test_clear_avro_and_json_open_as_before() -> None:
    codec = SealingCodec(book("mei"))
    assert codec.open(Codec().encode(said())) == said()
    assert codec.open(Codec().encode_json(said())) == said()
    assert codec.kind(Codec().encode(said())) == "interaction.recorded"
    assert codec.kind(Codec().encode_json(said())) is None


def test_a_shredded_event_is_skipped_and_counted() -> None:
    keys = book("mei", "travel-bot")
    codec = SealingCodec(keys)
    mine, other = codec.encode(said("mei")), codec.encode(said(None, i=2))
    keys.keys["mei"] = dict.fromkeys(keys.keys["mei"])  # destroyed
    assert codec.open(mine) is None
    assert codec.open(other) == said(None, i=2)
    assert codec.shredded == 1
    assert codec.unknown([mine, other]) == []  # destroyed is known: no waiting


def test_an_unknown_key_is_reported_until_the_keyring_has_it() -> None:
    writer_keys = book("mei")
    raw = SealingCodec(writer_keys).encode(said())
    reader_keys = KeyBook()
    reader = SealingCodec(reader_keys)
    with pytest.raises(UnknownKey):
        reader.open(raw)
    assert [e.subject for e in reader.unknown([raw, None, b"junk"])] == ["mei"]
    reader_keys.keys.update(writer_keys.keys)
    assert reader.unknown([raw]) == []
    assert reader.open(raw) == said()


def test_sealed_bytes_of_a_type_not_accepted_or_without_keys_are_bad() -> None:
    keys = book("mei")
    raw = SealingCodec(keys).encode(created())
    with pytest.raises(BadEvent, match="not accepted"):
        SealingCodec(keys, accept=RAW_TYPE_NAMES).open(raw)
    with pytest.raises(BadEvent, match="no keys"):
        SealingCodec(None).open(raw)
    with pytest.raises(BadEvent):
        SealingCodec(keys).open(raw[:-3])


def test_open_waiting_refreshes_until_the_key_arrives() -> None:
    writer_keys = book("mei")
    raw = SealingCodec(writer_keys).encode(said())
    reader_keys = KeyBook()
    codec = SealingCodec(reader_keys)
    calls = []

    def refresh() -> None:
        calls.append(1)
        if len(calls) == 2:  # the key arrives on the second read of the topic
            reader_keys.keys.update(writer_keys.keys)

    assert open_waiting(codec, raw, refresh) == said()
    assert len(calls) == 2
    with pytest.raises(UnknownKey):
        open_waiting(SealingCodec(KeyBook()), raw, None)


def test_the_vector_decoder_opens_sealed_records_and_skips_other_types() -> None:
    keys = book("mei", "travel-bot")
    codec = SealingCodec(keys)
    working = WorkingUpdated.model_validate(
        {
            "event_id": str(UUID(int=8)),
            "agent_id": "travel-bot",
            "occurred_at": AT,
            "source_event_id": str(UUID(int=1)),
            "seq": 3,
            "idx": 1,
            "config_version": "v1",
            "body": {"size": 0, "tokens": 0},
        }
    )
    values = [codec.encode(created()), codec.encode(working), None]
    assert decode_all(codec, values, VECTOR_TYPES) == [created()]
    keys.keys["mei"] = dict.fromkeys(keys.keys["mei"])
    assert decode_all(codec, values, VECTOR_TYPES) == []


def test_keys_a_kafka_keyring_makes_wait_to_be_flushed() -> None:
    ring = KafkaKeyring("127.0.0.1:1", "engram.keys", MasterKey(secrets.token_bytes(32)))
    first = ring.data_key("mei")
    assert ring.data_key("mei") == first and ring.pending == 1
    ring.data_key("travel-bot")
    assert ring.pending == 2
    with pytest.raises(ValueError, match="separator"):
        ring.data_key("a\x1fb")


@dataclass
class Message:
    value: bytes | None
    key: bytes | None = b"k"
    topic: str = "engram.ingest"
    partition: int = 0
    offset: int = 0


def test_ingest_seals_clear_events_passes_sealed_ones_and_dead_letters_bad_bytes() -> None:
    keys = book("mei")
    codec = SealingCodec(keys, accept=RAW_TYPE_NAMES)
    sealed_before = codec.encode(said(i=2))
    messages = [
        Message(Codec().encode_json(said(i=1)), offset=0),
        Message(b"\x00garbage", offset=1),
        Message(sealed_before, offset=2),
        Message(Codec().encode(created()), offset=3),
    ]
    records, dead = seal_batch(codec, messages)
    assert [codec.open(r.value) for r in records] == [said(i=1), said(i=2)]
    assert records[1].value == sealed_before
    assert all(r.key == b"travel-bot" and SECRET.encode() not in r.value for r in records)
    assert [d.source for d in dead] == ["engram.ingest:0:1", "engram.ingest:0:3"]
    keys.keys["mei"] = dict.fromkeys(keys.keys["mei"])
    assert seal_one(codec, Message(sealed_before)) is None


def test_the_key_file_keeps_live_keys_and_forgets_destroyed_material(tmp_path: Path) -> None:
    file = KeyFile(tmp_path / "keys.jsonl")
    live = {"v": 1, "state": "live", "wrapped": "V1JBUFBFRA==", "created_at": "x"}
    a, b = b"mei\x1fk1", b"lin\x1fk2"
    file.record([(a, json.dumps(live).encode()), (b, json.dumps(live).encode())])
    file.record([(a, json.dumps(live).encode())])  # again: nothing changes
    assert len((tmp_path / "keys.jsonl").read_text().splitlines()) == 2
    destroyed = json.dumps({"v": 1, "state": "destroyed"}).encode()
    file.record([(a, destroyed)])
    text = (tmp_path / "keys.jsonl").read_text()
    assert text.count("V1JBUFBFRA==") == 1  # only lin's key material is left
    assert KeyFile(tmp_path / "keys.jsonl").load() == {a: destroyed, b: json.dumps(live).encode()}
    assert oct((tmp_path / "keys.jsonl").stat().st_mode & 0o777) == "0o600"


def test_settings_resolve_the_master_key_and_the_seal_switch(tmp_path: Path) -> None:
    key = base64.b64encode(secrets.token_bytes(32)).decode()
    home = {"ENGRAM_HOME": str(tmp_path)}
    assert Settings.from_env(home).master_key() is None  # an agent: publishes to ingest
    assert Settings.from_env({**home, "ENGRAM_MASTER_KEY": key}).master_key() is not None
    assert (
        Settings.from_env({**home, "ENGRAM_MASTER_KEY": key, "ENGRAM_SEAL": "off"}).sealing is False
    )
    with pytest.raises(SettingsError, match="ENGRAM_MASTER_KEY"):
        Settings.from_env({**home, "ENGRAM_MASTER_KEY": "c2hvcnQ="}).master_key()
    with pytest.raises(SettingsError, match="ENGRAM_SEAL"):
        Settings.from_env({**home, "ENGRAM_SEAL": "maybe"})
    stack = Settings.from_env(home).with_home_master_key()
    assert stack.master_key_file == tmp_path / "master.key" and stack.master_key() is not None
    assert oct((tmp_path / "master.key").stat().st_mode & 0o777) == "0o600"
    assert stack.key_file == tmp_path / "keys.jsonl"
    assert Settings.from_env({**home, "ENGRAM_SEAL": "off"}).with_home_master_key().sealing is False


def test_the_type_is_read_from_the_sealed_header_without_opening() -> None:
    codec = SealingCodec(book("mei", "travel-bot"))
    for event in (said(), created(), said(None, i=3)):
        raw = codec.encode(event)
        assert codec.kind(raw) == event.type == codec.envelope(raw).type
        assert codec.kind(raw[:12]) is None  # truncated: the header does not say
    assert SealingCodec(None).kind(codec.encode(created())) == "memory.created"


def test_reseal_seals_the_avro_bytes_as_they_are() -> None:
    codec = SealingCodec(book("mei"), accept=RAW_TYPE_NAMES)
    avro, text = Codec().encode(said()), Codec().encode_json(said())
    for raw in (avro, text):
        sealed = codec.reseal(said(), raw)
        assert is_sealed(sealed) and codec.open(sealed) == said()
    assert codec.reseal(said(), sealed) is sealed
    assert SealingCodec(None).reseal(said(), avro) is avro
    assert SealingCodec(None).reseal(said(), text) == avro


def test_the_key_of_sealed_bytes_is_read_without_parsing_the_record() -> None:
    codec = SealingCodec(book("mei", "travel-bot"))
    for event in (said(), said(None, i=2), created(), created(None)):
        raw = codec.encode(event)
        envelope = codec.envelope(raw)
        assert read_sealed_key(raw) == (envelope.subject, envelope.key_id)
        for cut in range(10, len(raw) - 40):  # truncated inside the envelope: None, no raise
            key = read_sealed_key(raw[:cut])
            assert key is None or key == (envelope.subject, envelope.key_id)


def test_the_folds_raw_codec_remembers_as_the_codec_it_is_made_from() -> None:
    # the stack gives the fold a codec that does not remember the raw events it opens
    for remember in (True, False):
        made = raw_codec(SealingCodec(book("mei"), remember=remember))
        assert isinstance(made, SealingCodec) and made.sealer is not None
        assert made.remember is remember and made.sealer.remember is remember
        assert made.accept == RAW_TYPE_NAMES
