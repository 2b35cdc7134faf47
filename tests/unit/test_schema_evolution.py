"""Schema evolution: the reader resolves any writer schema it finds by fingerprint in
the ``.avsc`` folder, so bytes written by older and newer producers still decode
into the current models."""

from __future__ import annotations

import copy
import io
import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import fastavro
import pytest

import schemas
from schemas import (
    BadEvent,
    Codec,
    InteractionRecorded,
    MemoryEmbedded,
    MemoryForked,
    WorkingUpdated,
)
from schemas.avro import AVSC_DIR, MAGIC, avro_schema, fingerprint, load_writer_schemas

AT = datetime(2024, 3, 1, 9, 15, 0, 125_000, tzinfo=UTC)
EVENT_ID = UUID("0f6b1c8e-2d3a-4b5c-8d9e-aabbccddeeff")
CURRENT = avro_schema(InteractionRecorded)


def body_fields(schema: dict[str, Any]) -> list[dict[str, Any]]:
    (body,) = [f for f in schema["fields"] if f["name"] == "body"]
    fields: list[dict[str, Any]] = body["type"]["fields"]
    return fields


def older_schema() -> dict[str, Any]:
    """What an older producer wrote: the body had no ``intent`` yet."""
    old = copy.deepcopy(CURRENT)
    body = body_fields(old)
    body[:] = [f for f in body if f["name"] != "intent"]
    return old


def newer_schema() -> dict[str, Any]:
    """What a newer producer writes: an extra body field and an extra envelope field."""
    new = copy.deepcopy(CURRENT)
    body_fields(new).append({"name": "mood", "type": "string", "default": "neutral"})
    new["fields"].insert(3, {"name": "trace_id", "type": ["null", "string"], "default": None})
    return new


def without_content() -> dict[str, Any]:
    """A broken writer: the body lacks ``content``, which the reader requires."""
    bad = copy.deepcopy(CURRENT)
    body = body_fields(bad)
    body[:] = [f for f in body if f["name"] != "content"]
    return bad


def single_object(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    """Encode like a producer holding ``schema``: C3 01, its fingerprint, binary body."""
    buffer = io.BytesIO()
    buffer.write(MAGIC + fingerprint(schema))
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(schema), record)
    return buffer.getvalue()


def record(**body: Any) -> dict[str, Any]:
    return {
        "event_id": str(EVENT_ID),
        "type": "interaction.recorded",
        "agent_id": "agent-7",
        "session_id": "s-1",
        "user_id": None,
        "occurred_at": AT,
        "schema_version": 1,
        "body": {"role": "assistant", "content": "好的，我记住了：你喜欢乌龙茶。", **body},
    }


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """The committed contracts plus an older and a newer writer of interaction.recorded."""
    for path in AVSC_DIR.glob("*.avsc"):
        shutil.copy(path, tmp_path / path.name)
    for name, schema in [
        ("interaction.recorded.v0.avsc", older_schema()),
        ("interaction.recorded.v2.avsc", newer_schema()),
        ("interaction.recorded.v9.avsc", without_content()),
    ]:
        (tmp_path / name).write_text(json.dumps(schema, indent=2, ensure_ascii=False))
    return tmp_path


@pytest.fixture
def codec(folder: Path) -> Codec:
    return Codec(avsc_dir=folder)


def test_the_variants_really_differ() -> None:
    prints = {fingerprint(s) for s in (CURRENT, older_schema(), newer_schema(), without_content())}
    assert len(prints) == 4
    assert "intent" in [f["name"] for f in body_fields(CURRENT)]
    assert "intent" not in [f["name"] for f in body_fields(older_schema())]


def test_load_writer_schemas_keys_every_file_by_fingerprint(folder: Path, codec: Codec) -> None:
    writers = load_writer_schemas(codec.avro, folder=folder)
    for schema in (older_schema(), newer_schema(), CURRENT):
        assert writers[fingerprint(schema)].reader.event_type is InteractionRecorded
    current_prints = {codec.avro[t.TYPE].header[2:] for t in schemas.ALL_TYPES}
    assert current_prints <= set(writers)
    assert set(codec.writers) == set(writers)


def test_older_writer_decodes_with_the_default_for_the_missing_field(codec: Codec) -> None:
    raw = single_object(older_schema(), record(entities=["乌龙茶"], importance=6.0))
    event = codec.decode(raw)
    assert isinstance(event, InteractionRecorded)
    assert event.body.intent is None
    assert event == InteractionRecorded(
        event_id=EVENT_ID,
        agent_id="agent-7",
        session_id="s-1",
        occurred_at=AT,
        body={
            "role": "assistant",
            "content": "好的，我记住了：你喜欢乌龙茶。",
            "entities": ["乌龙茶"],
            "importance": 6.0,
        },
    )


def test_newer_writer_decodes_and_the_extra_fields_are_ignored(codec: Codec) -> None:
    rec = record(intent="remember", mood="cheerful", sentiment=0.75)
    rec["trace_id"] = "trace-42"
    event = codec.decode(single_object(newer_schema(), rec))
    assert isinstance(event, InteractionRecorded)
    assert event.body.intent == "remember"
    assert event.body.sentiment == 0.75
    assert "mood" not in event.body.model_dump()
    assert "trace_id" not in event.model_dump()
    # and it is the event the current writer would have produced
    current = codec.decode(single_object(CURRENT, record(intent="remember", sentiment=0.75)))
    assert event == current


def test_the_current_codec_reencodes_an_old_event_with_the_current_schema(codec: Codec) -> None:
    event = codec.decode(single_object(older_schema(), record()))
    again = codec.encode(event)
    assert again[2:10] == fingerprint(CURRENT)
    assert Codec().decode(again) == event


def test_writer_lacking_a_required_field_is_a_bad_event(codec: Codec) -> None:
    rec = record()
    del rec["body"]["content"]
    raw = single_object(without_content(), rec)
    with pytest.raises(BadEvent, match=r"^malformed Avro body for interaction\.recorded: ") as bad:
        codec.decode(raw)
    assert bad.value.raw == raw


def test_without_the_old_contract_the_fingerprint_is_unknown() -> None:
    raw = single_object(older_schema(), record())
    with pytest.raises(BadEvent, match=f"unknown Avro schema fingerprint {raw[2:10].hex()}"):
        Codec().decode(raw)


def test_codec_with_a_folder_still_decodes_every_current_type(codec: Codec) -> None:
    event = InteractionRecorded(
        event_id=EVENT_ID, agent_id="a", occurred_at=AT, body={"role": "user", "content": "嗨"}
    )
    assert codec.decode(Codec().encode(event)) == event
    assert codec.decode(Codec().encode_json(event)) == event


def test_files_of_unknown_types_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "memory.dreamt.v1.avsc").write_text(json.dumps(older_schema()))
    codec = Codec(avsc_dir=tmp_path)
    assert fingerprint(older_schema()) not in codec.writers
    assert len(codec.writers) == len(schemas.ALL_TYPES)  # only the current schemas


def test_working_updated_v1_bytes_read_as_v2_without_a_scratchpad() -> None:
    """The committed v1 contract of ``working.updated`` (before ``scratchpad``) still
    decodes, with the new field at its default: derived events already on a topic
    survive the upgrade."""
    v1 = json.loads((AVSC_DIR / "working.updated.v1.avsc").read_text(encoding="utf-8"))
    assert "scratchpad" not in [f["name"] for f in body_fields(v1)]
    written = {
        "event_id": str(EVENT_ID),
        "type": "working.updated",
        "agent_id": "agent-7",
        "session_id": "s-1",
        "user_id": None,
        "occurred_at": AT,
        "schema_version": 1,
        "source_event_id": str(EVENT_ID),
        "seq": 4,
        "idx": 0,
        "config_version": "c1",
        "body": {
            "added": [],
            "evicted": 0,
            "prepended": [],
            "size": 0,
            "tokens": 0,
            "task": "订酒店",
            "variables": {"city": "Kyoto"},
            "cleared": False,
            "expired": [],
        },
    }
    event = Codec().decode(single_object(v1, written))
    assert isinstance(event, WorkingUpdated)
    assert event.schema_version == 1
    assert (event.body.task, event.body.variables, event.body.scratchpad) == (
        "订酒店",
        {"city": "Kyoto"},
        None,
    )


def test_memory_embedded_v1_bytes_read_as_v2_without_terms() -> None:
    """The committed v1 contract of ``memory.embedded`` (before ``terms``, the BM25
    weights recorded beside the vector) still decodes, with ``terms`` at None: the
    vectors already on a topic survive the upgrade (a rebuild computes their weights)."""
    v1 = json.loads((AVSC_DIR / "memory.embedded.v1.avsc").read_text(encoding="utf-8"))
    assert "terms" not in [f["name"] for f in body_fields(v1)]
    written = {
        "event_id": str(EVENT_ID),
        "type": "memory.embedded",
        "agent_id": "agent-7",
        "session_id": None,
        "user_id": "u-1",
        "occurred_at": AT,
        "schema_version": 1,
        "source_event_id": str(EVENT_ID),
        "seq": 4,
        "idx": 0,
        "config_version": "c1",
        "body": {
            "memory_id": "m-1",
            "model": "usem3",
            "model_version": "3",
            "dims": 3,
            "vector": [0.25, -0.5, 1e-300],
        },
    }
    event = Codec().decode(single_object(v1, written))
    assert isinstance(event, MemoryEmbedded)
    assert event.schema_version == 1
    assert (event.body.terms, event.body.vector) == (None, [0.25, -0.5, 1e-300])
    assert Codec().read_record(single_object(v1, written)) is None  # an older writer


def forked_record(**body: Any) -> dict[str, Any]:
    return {
        "event_id": str(EVENT_ID),
        "type": "memory.forked",
        "agent_id": "旅行助手-b",
        "session_id": None,
        "user_id": None,
        "occurred_at": AT,
        "schema_version": 1,
        "body": {"source_agent_id": "旅行助手", "at": AT, "source_seq": 41, **body},
    }


def test_memory_forked_v1_bytes_read_as_v2_without_a_source_event_id() -> None:
    """The committed v1 contract of ``memory.forked`` (before ``source_event_id``, the
    id of the source's event at the fork's position) still decodes, with the new field
    at None: forks made by an older engram stay readable, and an import checks their
    source by name and length only."""
    v1 = json.loads((AVSC_DIR / "memory.forked.v1.avsc").read_text(encoding="utf-8"))
    assert "source_event_id" not in [f["name"] for f in body_fields(v1)]
    event = Codec().decode(single_object(v1, forked_record()))
    assert isinstance(event, MemoryForked)
    assert event.schema_version == 1
    assert (event.body.source_agent_id, event.body.source_seq) == ("旅行助手", 41)
    assert event.body.source_event_id is None


def test_memory_forked_v2_carries_the_source_event_id_both_ways() -> None:
    """Version 2 is the current contract: the source's event id survives Avro and JSON,
    and the current writer's fingerprint is the committed v2 file's."""
    source = UUID("6d1f0c3a-9b8e-4f7a-a2c4-0123456789ab")
    v2 = json.loads((AVSC_DIR / "memory.forked.v2.avsc").read_text(encoding="utf-8"))
    assert MemoryForked.SCHEMA_VERSION == 2
    assert fingerprint(v2) == fingerprint(avro_schema(MemoryForked))
    written = forked_record(source_event_id=str(source))
    written["schema_version"] = 2
    event = Codec().decode(single_object(v2, written))
    assert isinstance(event, MemoryForked)
    assert event.body.source_event_id == source
    codec = Codec()
    assert codec.encode(event)[2:10] == fingerprint(v2)
    assert codec.decode(codec.encode(event)) == event
    assert codec.decode(codec.encode_json(event)) == event
