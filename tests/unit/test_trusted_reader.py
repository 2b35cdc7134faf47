"""The trusted reader (``schemas.reader``, ``Codec.decode_trusted``) gives for bytes
engram encoded exactly the event ``Codec.decode`` gives: equal values of the same
types (a ``UUID`` where validation makes one, the same ``tzinfo``), the same
``model_fields_set``, the same JSON; and leaves to ``decode`` what it does not cover.
(fastavro is the reference through ``decode``, which reads with it or with the
record reader that ``test_record_reader.py`` holds to it.)"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import schemas
from schemas import BadEvent, Codec, Event, InteractionBody, InteractionRecorded
from schemas.avro import AVSC_DIR, MAGIC, MAX_MILLIS, MIN_MILLIS, write_long
from schemas.reader import compile_reader
from schemas.wire import _EXACT, read_timestamp_millis, read_uuid
from tests.unit.test_schema_evolution import older_schema, record, single_object
from tests.unit.test_schemas_roundtrip import TYPES, model_strategy

CODEC = Codec()
SAME = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def same(a: Any, b: Any, where: str = "event") -> None:
    """``a`` and ``b`` hold equal values of identical types, all the way down (a
    :class:`~schemas.uuids.TextUUID` is a ``UUID`` spelt alike)."""
    if isinstance(a, UUID) or isinstance(b, UUID):
        assert isinstance(a, UUID) and isinstance(b, UUID), where
        assert a == b and str(a) == str(b) and repr(a) == repr(b), f"{where}: {a!r} vs {b!r}"
        return
    assert type(a) is type(b), f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, BaseModel):
        assert a.model_fields_set == b.model_fields_set, where
        assert a.__pydantic_extra__ == b.__pydantic_extra__, where
        assert a.__pydantic_private__ == b.__pydantic_private__, where
        assert list(a.__dict__) == list(b.__dict__), where
        for name, value in a.__dict__.items():
            same(value, b.__dict__[name], f"{where}.{name}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key, value in a.items():
            same(value, b[key], f"{where}[{key!r}]")
    elif isinstance(a, datetime):
        assert a == b and a.tzinfo is b.tzinfo, f"{where}: {a!r} vs {b!r}"
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def test_every_current_schema_has_a_trusted_reader_and_a_record_reader() -> None:
    """(The record reader, which ``decode`` reads with: ``test_record_reader.py``.)"""
    writers = [CODEC.writers[CODEC.avro[t.TYPE].header[2:]] for t in schemas.ALL_TYPES]
    assert [w.reader.event_type.TYPE for w in writers if w.trusted is None] == []
    assert [w.reader.event_type.TYPE for w in writers if w.records is None] == []


@TYPES
@SAME
@given(data=st.data())
def test_trusted_reading_gives_what_validation_gives(
    event_type: type[Event], data: st.DataObject
) -> None:
    raw = CODEC.encode(data.draw(model_strategy(event_type)))
    trusted = CODEC.decode_trusted(raw)
    same(trusted, CODEC.decode(raw))
    assert trusted.model_dump_json() == CODEC.decode(raw).model_dump_json()
    assert CODEC.encode(trusted) == raw


def _millis(value: int) -> bytes:
    return write_long(value)


@given(st.integers(min_value=MIN_MILLIS, max_value=MAX_MILLIS))
@settings(max_examples=500, deadline=None)
def test_timestamps_read_as_fastavro_reads_them(millis: int) -> None:
    expected = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=millis * 1000)
    value, end = read_timestamp_millis(_millis(millis), 0)
    assert (value, value.tzinfo, end) == (expected, UTC, len(_millis(millis)))


@pytest.mark.parametrize(
    "millis",
    [0, 1, 999, 1_000, _EXACT - 1, _EXACT, _EXACT + 1, -1, MIN_MILLIS, MAX_MILLIS],
)
def test_timestamps_at_the_edges_of_the_fast_road(millis: int) -> None:
    expected = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=millis)
    assert read_timestamp_millis(_millis(millis), 0)[0] == expected


def test_the_fast_road_is_exact_for_every_millisecond_of_its_last_seconds() -> None:
    """Where float rounding would show first: the top of the fast road's range."""
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    for millis in range(_EXACT - 20_000, _EXACT):
        expected = epoch + timedelta(milliseconds=millis)
        assert read_timestamp_millis(_millis(millis), 0)[0] == expected


@pytest.mark.parametrize(
    "text",
    [
        "12345678-1234-5678-1234-567812345678",
        "{12345678-1234-5678-1234-567812345678}",
        "12345678123456781234567812345678",
        "urn:uuid:12345678-1234-5678-1234-567812345678",
        "ABCDEF12-1234-5678-1234-567812345678",
    ],
)
def test_uuids_read_as_uuid_reads_them(text: str) -> None:
    data = text.encode()
    value, end = read_uuid(write_long(len(data)) + data, 0)
    assert (value, value.is_safe, end) == (UUID(text), UUID(text).is_safe, len(data) + 1)
    assert str(value) == str(UUID(text))


def test_what_it_does_not_cover_goes_to_decode() -> None:
    """Older writer schemas (resolved by fastavro), JSON, cut and lengthened bytes:
    ``decode_trusted`` gives what ``decode`` gives, or raises what it raises."""
    event = InteractionRecorded(
        event_id=UUID(int=7),
        agent_id="a",
        occurred_at=datetime(2026, 11, 1, tzinfo=UTC),
        body=InteractionBody(role="user", content="你好"),
    )
    raw = CODEC.encode(event)
    assert CODEC.decode_trusted(CODEC.encode_json(event)) == event
    for bad in (raw[:-1], raw + b"\x00", raw[:10], b"", MAGIC + b"\x00" * 8 + raw[10:]):
        with pytest.raises(BadEvent) as expected:
            CODEC.decode(bad)
        with pytest.raises(BadEvent) as got:
            CODEC.decode_trusted(bad)
        assert got.value.reason == expected.value.reason
    small = Codec(max_bytes=len(raw) - 1)
    with pytest.raises(BadEvent, match="over the limit"):
        small.decode_trusted(raw)
    only_derived = Codec(accept=frozenset({"working.updated"}))
    with pytest.raises(BadEvent, match="not accepted"):
        only_derived.decode_trusted(raw)


def test_an_older_writer_schema_is_resolved_by_decode(tmp_path: Path) -> None:
    for path in AVSC_DIR.glob("*.avsc"):
        (tmp_path / path.name).write_text(path.read_text())
    (tmp_path / "interaction.recorded.v0.avsc").write_text(json.dumps(older_schema()))
    codec = Codec(avsc_dir=tmp_path)
    raw = single_object(older_schema(), record(entities=["乌龙茶"]))
    assert codec.writers[raw[2:10]].trusted is None
    same(codec.decode_trusted(raw), codec.decode(raw))


def test_a_schema_it_does_not_cover_has_no_reader() -> None:
    class Odd(BaseModel):
        x: int

    def schema(name: str, kind: str) -> dict[str, Any]:
        return {"type": "record", "name": "Odd", "fields": [{"name": name, "type": kind}]}

    assert compile_reader(Odd, schema("x", "long")) is not None
    assert compile_reader(Odd, schema("x", "float")) is None  # no reader for float
    assert compile_reader(Odd, schema("y", "long")) is None  # not the model's fields
