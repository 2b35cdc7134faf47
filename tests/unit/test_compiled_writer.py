"""The compiled Avro writer (``schemas.avro.compile_writer``) writes byte for byte what
fastavro writes for ``event.model_dump()``, for every event type, and falls back to
fastavro for whatever it does not cover."""

from __future__ import annotations

import io
import struct
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import AwareDatetime, BaseModel, field_serializer

import schemas
from schemas import Codec, Event, Turn, WorkingBody, WorkingUpdated
from schemas.avro import _avro, compile_writer, native_writer, write_long
from schemas.derived import EmbeddedBody, MemoryEmbedded
from schemas.uuids import of_int, with_text
from tests.unit.test_schemas_roundtrip import TYPES, aware_datetimes, model_strategy

CODEC = Codec()
SAME = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
INT64 = (-(2**63), 2**63 - 1)


def test_every_type_has_a_compiled_writer() -> None:
    """None of today's types falls back to fastavro for want of a writer."""
    missing = [t.TYPE for t in schemas.ALL_TYPES if CODEC.avro[t.TYPE].write is None]
    assert not missing


@TYPES
@SAME
@given(data=st.data())
def test_compiled_bytes_are_fastavros(event_type: type[Event], data: st.DataObject) -> None:
    event = data.draw(model_strategy(event_type))
    avro = CODEC.avro[event_type.TYPE]
    expected = avro.encode_fastavro(event)
    assert avro.encode_compiled(event) == expected
    assert avro.encode_tree(event) == expected
    assert CODEC.encode(event) == expected


def _working(**body: Any) -> WorkingUpdated:
    return WorkingUpdated(
        event_id=UUID(int=1),
        agent_id="agent-记忆",
        session_id="s-🧠",
        occurred_at=datetime(1969, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC),
        source_event_id=UUID(int=2**128 - 1),
        seq=INT64[1],
        idx=0,
        config_version="",
        body=WorkingBody(size=0, tokens=INT64[1], **body),
    )


TURN = Turn(
    event_id="e",
    role="user",
    content="用户喜欢喝绿茶 🍵",
    occurred_at=datetime(1, 1, 1, tzinfo=UTC),
    tokens=INT64[1],
    offloaded=True,
)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"added": [TURN], "prepended": [TURN, TURN], "evicted": INT64[1]},
        {"variables": {"": "", "键": "值 🧠", "k": "v" * 300}, "task": "", "scratchpad": "x"},
        {"expired": ["a", "会话"], "cleared": True},
    ],
)
def test_working_updated_at_the_edges(body: dict[str, Any]) -> None:
    """Empty and multi-item arrays and maps, a named record met twice, the largest
    longs, a timestamp just before the epoch and one in year 1."""
    event = _working(**body)
    avro = CODEC.avro[WorkingUpdated.TYPE]
    assert avro.encode_compiled(event) == avro.encode_fastavro(event)
    assert avro.encode_tree(event) == avro.encode_fastavro(event)


class Stamps(BaseModel):
    at: AwareDatetime
    maybe: AwareDatetime | None = None
    many: list[AwareDatetime] = []
    number: int = 0


MILLIS = {"type": "long", "logicalType": "timestamp-millis"}


def record(name: str, **fields: Any) -> dict[str, Any]:
    """An Avro record schema of ``fields`` (name: type)."""
    return {
        "type": "record",
        "name": name,
        "fields": [{"name": n, "type": t} for n, t in fields.items()],
    }


STAMPS = record(
    "t.Stamps",
    at=MILLIS,
    maybe=["null", MILLIS],
    many={"type": "array", "items": MILLIS},
    number="long",
)
WRITE_STAMPS = compile_writer(Stamps, STAMPS)


@SAME
@given(
    at=aware_datetimes,
    maybe=st.none() | aware_datetimes,
    many=st.lists(aware_datetimes, max_size=3),
    number=st.integers(*INT64),
)
def test_timestamps_in_any_zone(
    at: datetime, maybe: datetime | None, many: list[datetime], number: int
) -> None:
    """Unlike the events' (UTC, whole milliseconds), these keep their zone and their
    microseconds: the millisecond is truncated as fastavro does, either side of the
    epoch."""
    stamps = Stamps(at=at, maybe=maybe, many=many, number=number)
    assert WRITE_STAMPS is not None
    out: list[bytes] = []
    WRITE_STAMPS(stamps, out)
    expected = _fastavro(STAMPS, stamps.model_dump())
    assert b"".join(out) == expected
    if NATIVE_STAMPS is not None:
        assert NATIVE_STAMPS.encode(stamps, b"") == expected


NATIVE_STAMPS = native_writer(WRITE_STAMPS)


@SAME
@given(
    at=st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)),
    number=st.integers(*INT64),
)
def test_utc_timestamps_counted_in_c(at: datetime, number: int) -> None:
    """The writer in C counts a UTC timestamp's milliseconds itself (any other zone goes
    to ``epoch_millis``): fastavro's, from year 1 to 9999, either side of the epoch."""
    if NATIVE_STAMPS is None:
        pytest.skip("schemas._avro is not built (ENGRAM_PURE_PYTHON=1)")
    stamps = Stamps(at=at.replace(tzinfo=UTC), maybe=at.replace(tzinfo=UTC), number=number)
    assert stamps.at.tzinfo is UTC
    expected = _fastavro(STAMPS, stamps.model_dump())
    assert NATIVE_STAMPS.encode(stamps, b"head") == b"head" + expected


def test_every_type_has_a_writer_in_c() -> None:
    """Where the extension is built, every type's writer tree is written in C too."""
    if _avro is None:
        pytest.skip("schemas._avro is not built (ENGRAM_PURE_PYTHON=1)")
    missing = [t.TYPE for t in schemas.ALL_TYPES if CODEC.avro[t.TYPE].native is None]
    assert not missing


class Other(UUID):
    """A UUID of another class: its text is its ``str``, whatever that is."""

    def __str__(self) -> str:
        return super().__str__().upper()


@pytest.mark.parametrize(
    "event_id",
    [
        UUID(int=0),
        UUID(int=2**128 - 1),
        UUID("8c0fc917-d2d4-468b-8038-9d37d1cc4824"),
        of_int(2**127 + 12345),  # a TextUUID whose text is not made yet
        with_text(
            UUID("8c0fc917-d2d4-468b-8038-9d37d1cc4824").int, "8c0fc917-d2d4-468b-8038-9d37d1cc4824"
        ),
        Other(int=7),
    ],
)
def test_every_kind_of_uuid_is_written_as_its_text(event_id: UUID) -> None:
    """A plain UUID's text is formatted from its int in C, a TextUUID's is the text it
    keeps (or its ``str``), any other UUID's its ``str``: what fastavro writes."""
    event = _working().model_copy(update={"event_id": event_id, "source_event_id": event_id})
    avro = CODEC.avro[WorkingUpdated.TYPE]
    expected = avro.encode_fastavro(event)
    assert str(event_id).encode() in expected
    assert avro.encode_compiled(event) == expected
    assert avro.encode_tree(event) == expected


class Chain(BaseModel):
    name: str
    next: Chain | None = None


CHAIN = {
    "type": "record",
    "name": "t.Chain",
    "fields": [{"name": "name", "type": "string"}, {"name": "next", "type": ["null", "t.Chain"]}],
}


def test_a_record_inside_itself_is_written_by_the_tree() -> None:
    """A recursive schema has a writer tree (it names itself) but no writer in C."""
    write = compile_writer(Chain, CHAIN)
    assert write is not None
    assert native_writer(write) is None
    chain = Chain(name="a", next=Chain(name="记忆", next=Chain(name="")))
    out: list[bytes] = []
    write(chain, out)
    assert b"".join(out) == _fastavro(CHAIN, chain.model_dump())


def test_a_longer_long_is_refused() -> None:
    for n in INT64:
        assert write_long(n) == _fastavro("long", n)
    for n in (INT64[0] - 1, INT64[1] + 1, 2**64, -(2**70)):
        with pytest.raises(OverflowError):
            write_long(n)


def _fastavro(schema: Any, datum: Any) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(schema), datum)
    return buffer.getvalue()


# -- the roads back to fastavro ---------------------------------------------------


def test_a_lone_surrogate_raises_as_before() -> None:
    event = _working(task="a\udc0fb")
    with pytest.raises(UnicodeEncodeError):
        CODEC.avro[WorkingUpdated.TYPE].encode_compiled(event)
    with pytest.raises(UnicodeEncodeError):
        CODEC.avro[WorkingUpdated.TYPE].encode(event)


EDGE_DOUBLES = [0.0, -0.0, 1.0, -1.5, 5e-324, 2.2250738585072014e-308, 8.98e307, 1e16, 0.1]
"""Finite (validation refuses the others), and finite when doubled."""


@pytest.mark.parametrize("size", [1, 12, 512, 1536])
def test_a_vector_is_written_whole_as_fastavro_writes_it_item_by_item(size: int) -> None:
    """``array<double>`` (a recorded vector) is packed in one call: fastavro's bytes for
    any length and the doubles at the edges (signed zero, subnormals, the largest)."""
    vector = [EDGE_DOUBLES[i % len(EDGE_DOUBLES)] * (1 + i / size) for i in range(size)]
    event = MemoryEmbedded(
        event_id=UUID(int=3),
        agent_id="a",
        occurred_at=datetime(2026, 11, 28, tzinfo=UTC),
        source_event_id=UUID(int=4),
        seq=1,
        idx=0,
        config_version="c",
        body=EmbeddedBody(
            memory_id="m", model="usem3", model_version="1", dims=size, vector=vector
        ),
    )
    avro = CODEC.avro[MemoryEmbedded.TYPE]
    assert avro.encode_compiled(event) == avro.encode_fastavro(event)
    with_text = event.model_copy(update={"body": event.body.model_copy(update={"vector": ["x"]})})
    with pytest.raises(struct.error):  # not a double: fastavro's road says what it is
        avro.encode_tree(with_text)
    with pytest.raises((struct.error, TypeError)):  # in C: TypeError
        avro.encode_compiled(with_text)


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")
@pytest.mark.parametrize(
    "changes",
    [
        {"seq": 2**63},  # out of range: fastavro refuses it too
        {"body": {"size": 0, "tokens": 0}},  # a dict for a record: fastavro writes it
        {"occurred_at": datetime(2024, 1, 1)},  # naive: fastavro's local-time road
        {"session_id": 7},
    ],
)
def test_unexpected_values_take_fastavros_road(changes: dict[str, Any]) -> None:
    """Values validation would not give (``model_copy`` skips it): the compiled
    writer raises, ``encode`` then gives whatever fastavro gives."""
    event = _working().model_copy(update=changes)
    avro = CODEC.avro[WorkingUpdated.TYPE]
    with pytest.raises((TypeError, AttributeError, OverflowError)):
        avro.encode_compiled(event)
    try:
        expected: bytes | type[Exception] = avro.encode_fastavro(event)
    except Exception as error:
        expected = type(error)
    if isinstance(expected, bytes):
        assert avro.encode(event) == expected
    else:
        with pytest.raises(expected):
            avro.encode(event)


class Dumped(BaseModel):
    text: str

    @field_serializer("text")
    def _upper(self, text: str) -> str:
        return text.upper()


class Odd(BaseModel):
    number: int | str


@pytest.mark.parametrize(
    ("model", "schema"),
    [
        (Dumped, record("t.Dumped", text="string")),
        (Odd, record("t.Odd", number=["long", "string"])),
        (Odd, record("t.Odd", other="long")),
        (Stamps, record("t.Stamps", at="long", maybe=["null", MILLIS], many=MILLIS, number="long")),
    ],
)
def test_what_it_does_not_cover_has_no_writer(model: type[BaseModel], schema: Any) -> None:
    """A serializer, a union other than Optional, fields that are not the model's, a
    schema that does not match the annotation: no compiled writer (fastavro's road)."""
    assert compile_writer(model, schema) is None


@settings(max_examples=500, deadline=None)
@given(
    n=st.integers(*INT64)
    | st.sampled_from([0, -1, 63, -64, 64, -65, 8191, 8192, -8193, 2**20, 2**27, -(2**41)])
)
def test_write_long_is_fastavros(n: int) -> None:
    assert write_long(n) == _fastavro("long", n)
