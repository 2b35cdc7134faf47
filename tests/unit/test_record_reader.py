"""The compiled record reader (``schemas.reader.compile_record_reader``), which
``Codec.decode`` reads untrusted Avro with before it validates, reads what fastavro
reads, and nothing else: on valid bodies of every type the same record (values of the
same types), and on mutated ones, whenever it reads a body whole, fastavro reads that
same record; what it does not read, fastavro's answer or error decides."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ops.fuzz import mutant, seed_corpus
from schemas import BadEvent, Codec, Event
from schemas.avro import MAGIC, WriterSchema, _read_whole
from tests.unit.test_schemas_roundtrip import TYPES, model_strategy
from tests.unit.test_trusted_reader import same

CODEC = Codec(max_bytes=4096)
AVRO = [raw for raw in seed_corpus(CODEC) if raw[:2] == MAGIC]
SAME = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MUTANTS = settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def writer_of(raw: bytes) -> WriterSchema:
    return CODEC.writers[raw[2:10]]


def agrees_with_fastavro(raw: bytes) -> bool:
    """Whether the record reader reads ``raw``'s body whole; if it does, fastavro
    must read the same record from it (else the assertion fails)."""
    writer = writer_of(raw)
    assert writer.records is not None
    body = raw[10:]
    try:
        record, end = writer.records(body, 0)
    except Exception:
        return False
    if end != len(body):
        return False
    same(record, _read_whole(body, writer.parsed), "record")
    return True


@TYPES
@SAME
@given(data=st.data())
def test_valid_bodies_read_as_fastavro_reads_them(
    event_type: type[Event], data: st.DataObject
) -> None:
    raw = CODEC.encode(data.draw(model_strategy(event_type)))
    assert agrees_with_fastavro(raw)


@MUTANTS
@given(seed=st.integers(0, 2**64 - 1))
def test_a_mutated_body_it_reads_whole_is_what_fastavro_reads(seed: int) -> None:
    raw = mutant(random.Random(seed), AVRO)
    if raw[:2] == MAGIC and raw[2:10] in CODEC.writers and writer_of(raw).records:
        agrees_with_fastavro(raw)


@pytest.mark.parametrize("index", range(len(AVRO)))
def test_every_byte_changed_or_cut_reads_as_fastavro_or_not_at_all(index: int) -> None:
    raw = AVRO[index]
    read = 0
    for at in range(10, len(raw)):
        for value in {0x00, 0x01, 0x02, 0x03, 0x7F, 0x80, 0xFF, raw[at] ^ 1}:
            read += agrees_with_fastavro(raw[:at] + bytes([value]) + raw[at + 1 :])
        read += agrees_with_fastavro(raw[:at])
    assert read > 0  # some changes leave a readable body (a changed letter, say)


def test_a_negative_string_length_is_refused_by_both() -> None:
    raw = next(r for r in AVRO if CODEC.decode(r).type == "interaction.recorded")
    event = CODEC.decode(raw)
    text = event.agent_id.encode()
    at = raw.index(bytes([2 * len(text)]) + text)
    broken = raw[:at] + bytes([2 * len(text) + 1]) + raw[at + 1 :]  # zigzag: negative
    assert not agrees_with_fastavro(broken)
    with pytest.raises(BadEvent, match="malformed Avro body"):
        CODEC.decode(broken)
