"""A recorded vector is read by :class:`schemas.avro.DoublesTail` (fastavro up to the
array of doubles, the array unpacked whole): it must read exactly what fastavro reads
from the whole schema, refuse what fastavro refuses, and handle every block layout
the Avro spec allows (several blocks, negative counts with a byte size)."""

from __future__ import annotations

import io
import struct
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import BadEvent, Codec, MemoryEmbedded
from schemas.avro import AvroType, DoublesTail, _read_whole
from schemas.reader import read_doubles

CODEC = Codec()
EMBEDDED = AvroType(MemoryEmbedded)
TAIL = DoublesTail.of(EMBEDDED.schema)


def embedded(vector: list[float], memory_id: str = "m-1", user: str | None = "u") -> bytes:
    event = MemoryEmbedded(
        event_id=UUID(int=1),
        agent_id="bot",
        session_id=None,
        user_id=user,
        occurred_at=datetime(2026, 11, 2, tzinfo=UTC),
        source_event_id=UUID(int=2),
        seq=3,
        idx=1,
        config_version="c1",
        body={
            "memory_id": memory_id,
            "model": "usem3",
            "model_version": "v",
            "dims": len(vector),
            "vector": vector,
        },
    )
    return CODEC.encode(event)


def bits(record: dict[str, Any]) -> dict[str, Any]:
    """The record with its vector as raw bit patterns (NaN equals NaN)."""
    body = dict(record["body"])
    body["vector"] = [struct.pack("<d", v) for v in body["vector"]]
    return {**record, "body": body}


def test_the_current_schema_of_a_recorded_vector_takes_the_tail_road() -> None:
    assert TAIL is not None and TAIL.path == ("body", "vector")
    writer = CODEC.writers[EMBEDDED.header[2:]]
    assert writer.tail is not None


def record_bytes(vector: list[float], memory_id: str, user: str | None) -> bytes:
    """The Avro body of a ``memory.embedded`` written by fastavro itself (any doubles,
    NaN and infinities included: the reader must not care what the model allows)."""
    record = {
        "event_id": str(UUID(int=1)),
        "type": "memory.embedded",
        "agent_id": "bot",
        "session_id": None,
        "user_id": user,
        "occurred_at": datetime(2026, 11, 2, tzinfo=UTC),
        "schema_version": 1,
        "source_event_id": str(UUID(int=2)),
        "seq": 3,
        "idx": 1,
        "config_version": "c1",
        "body": {
            "memory_id": memory_id,
            "model": "usem3",
            "model_version": "v",
            "dims": len(vector),
            "vector": vector,
        },
    }
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, EMBEDDED.parsed, record)
    return buffer.getvalue()


@settings(max_examples=200)
@given(
    st.lists(st.floats(width=64), max_size=600),
    st.text(max_size=40),
    st.none() | st.text(max_size=10),
)
def test_the_tail_reads_what_fastavro_reads(
    vector: list[float], memory_id: str, user: str | None
) -> None:
    body = record_bytes(vector, memory_id, user)
    whole = _read_whole(body, EMBEDDED.parsed)
    assert TAIL is not None
    assert bits(TAIL.read(body)) == bits(whole)


@settings(max_examples=50)
@given(st.lists(st.floats(-1.0, 1.0), min_size=1, max_size=600))
def test_a_recorded_vector_decodes_to_the_event_it_was(vector: list[float]) -> None:
    raw = embedded(vector)
    assert CODEC.encode(CODEC.decode(raw)) == raw


def test_several_blocks_and_negative_counts_read_alike() -> None:
    """fastavro writes one block; another writer may cut the array into blocks, and
    give a block's count negated with its byte size (the spec allows both)."""
    values = [0.5, -1.25, 3.0, 1e300, -0.0]
    raw = embedded(values)
    one_block = b"\x0a" + struct.pack("<5d", *values) + b"\x00"  # zigzag(5) = 10
    assert raw.endswith(one_block)
    head = raw[10 : -len(one_block)]
    blocks = (
        b"\x04" + struct.pack("<2d", *values[:2])  # 2 items
        + b"\x05" + b"\x30" + struct.pack("<3d", *values[2:])  # -3 items, 24 bytes
        + b"\x00"
    )  # fmt: skip
    body = head + blocks
    assert fastavro.schemaless_reader(io.BytesIO(body), EMBEDDED.parsed, None) == (
        TAIL.read(body) if TAIL else None
    )
    assert read_doubles(blocks, 0) == (values, len(blocks))


@pytest.mark.parametrize("cut", [1, 8, 4097])
def test_a_truncated_vector_is_a_bad_event(cut: int) -> None:
    raw = embedded([0.25] * 512)
    with pytest.raises(BadEvent, match=r"malformed Avro body for memory\.embedded"):
        CODEC.decode(raw[:-cut])
    assert CODEC.read_record(raw[:-cut]) is None


def test_bytes_after_the_vector_are_refused() -> None:
    raw = embedded([0.25] * 4) + b"\x00"
    with pytest.raises(BadEvent, match="1 bytes after the end of the record"):
        CODEC.decode(raw)
