"""The rebuild's fast road from bytes to ``memory_changes`` rows gives exactly what
the typed road gives: for every derived type, ``record_row(read_record(bytes))`` is
``change_row(decode(bytes))`` value for value and type for type (the body's JSON byte
for byte); whatever is not plain current-schema Avro takes the typed road.

Events are drawn from the models themselves (``model_strategy`` of the round-trip
tests), so a new derived type or field is covered without touching this file."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any, cast
from uuid import UUID, uuid4

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ops.rebuild import FAST_TYPES, VectorProjection, change_rows, decode_derived, native_coders
from schemas import (
    DERIVED_TYPES,
    Codec,
    DerivedEvent,
    Event,
    FactSet,
    MemoryEmbedded,
    SubjectErased,
    WorkingUpdated,
)
from schemas.avro import AVSC_DIR, MAGIC, AvroType, fingerprint, write_single_object
from schemas.sealed import CLEAR_TYPES, Sealer, SealingCodec, subject_of
from sinks.clickhouse import change_row, record_row
from sinks.keys import KeyBook
from streams.vectors import operations
from tests.unit.test_schemas_roundtrip import model_strategy

CODEC = Codec()
DERIVED = pytest.mark.parametrize("event_type", DERIVED_TYPES, ids=lambda t: t.TYPE)


def typed(row: list[Any]) -> list[tuple[type, Any]]:
    """A row with each value's type: equal rows of other types are not the same row."""
    return [(type(v), v) for v in row]


@DERIVED
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_record_row_is_the_change_row(
    event_type: type[DerivedEvent], data: st.DataObject
) -> None:
    encoded = CODEC.encode(data.draw(model_strategy(event_type)))
    found = CODEC.read_record(encoded)
    assert found is not None and found[0] is event_type
    assert typed(record_row(found[1])) == typed(change_row(CODEC.decode(encoded)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    events=st.lists(
        st.sampled_from(DERIVED_TYPES).flatmap(model_strategy), min_size=1, max_size=12
    ),
    json_at=st.sets(st.integers(0, 11)),
)
def test_change_rows_are_the_typed_roads_rows(
    events: list[DerivedEvent], json_at: set[int]
) -> None:
    """A batch of Avro and JSON bytes, erasures and embeddings among them: the rows
    and erasures of the typed road, in log order."""
    values = [
        CODEC.encode_json(e) if i in json_at else CODEC.encode(e) for i, e in enumerate(events)
    ]
    decoded = [e for e in decode_derived(CODEC, values) if not isinstance(e, MemoryEmbedded)]
    batch = change_rows(CODEC, values)
    assert [typed(r) for r in batch.rows] == [typed(change_row(e)) for e in decoded]
    assert batch.erasures == [e for e in decoded if isinstance(e, SubjectErased)]


def test_every_derived_type_but_erasures_and_embeddings_takes_the_fast_road() -> None:
    assert set(DERIVED_TYPES) - {SubjectErased, MemoryEmbedded} == FAST_TYPES


def fact() -> FactSet:
    return FactSet(
        event_id=uuid4(),
        agent_id="agent-记忆",
        user_id="u",
        occurred_at=datetime(2026, 5, 4, 8, 0, 0, 123_000, tzinfo=UTC),
        source_event_id=uuid4(),
        seq=3,
        config_version="default@1",
        body={
            "namespace": "n",
            "key": "k",
            "value": "v",
            "valid_from": datetime(2026, 5, 4, tzinfo=UTC),
        },
    )


def test_anything_but_plain_current_avro_is_not_read_as_a_record() -> None:
    encoded = CODEC.encode(fact())
    assert CODEC.read_record(encoded) is not None
    not_records = {
        "json": CODEC.encode_json(fact()),
        "trailing bytes": encoded + b"\x00",
        "truncated": encoded[:-3],
        "unknown fingerprint": MAGIC + b"\x00" * 8 + encoded[10:],
        "empty": b"",
        "oversize": encoded + b"\x00" * CODEC.max_bytes,
        "not accepted": Codec(accept=frozenset({"memory.created"})).encode(fact()),
    }
    for name, raw in not_records.items():
        reader = Codec(accept=frozenset({"memory.created"})) if name == "not accepted" else CODEC
        assert reader.read_record(raw) is None, name


def test_an_older_writer_schema_takes_the_typed_road() -> None:
    """``working.updated`` v1 bytes (before ``scratchpad``): no record, and the row is
    the typed road's (the scratchpad defaulted)."""
    v1 = json.loads((AVSC_DIR / "working.updated.v1.avsc").read_text(encoding="utf-8"))
    event = WorkingUpdated(
        event_id=uuid4(),
        agent_id="a",
        occurred_at=datetime(2026, 5, 4, tzinfo=UTC),
        source_event_id=uuid4(),
        seq=1,
        config_version="c",
        body={"size": 0, "tokens": 0},
    )
    record = event.model_dump()
    record["body"].pop("scratchpad")
    raw = write_single_object(MAGIC + fingerprint(v1), fastavro.parse_schema(v1), record)
    assert raw[:10] != AvroType(WorkingUpdated).header and CODEC.read_record(raw) is None
    batch = change_rows(CODEC, [raw])
    assert batch.rows == [change_row(CODEC.decode(raw))]
    assert json.loads(batch.rows[0][-1])["scratchpad"] is None


def test_bad_bytes_are_skipped_and_logged_as_the_typed_road_does(
    caplog: pytest.LogCaptureFixture,
) -> None:
    good = CODEC.encode(fact())
    with caplog.at_level(logging.ERROR, logger="engram.rebuild"):
        batch = change_rows(CODEC, [good, b"\xc3\x01garbage", good[:-2], good])
    assert batch.rows == [change_row(fact_of(good))] * 2
    assert len([r for r in caplog.records if "undecodable" in r.getMessage()]) == 2


def fact_of(raw: bytes) -> DerivedEvent:
    event = CODEC.decode(raw)
    assert isinstance(event, DerivedEvent)
    return event


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    events=st.lists(
        st.sampled_from(DERIVED_TYPES).flatmap(model_strategy), min_size=1, max_size=12
    ),
    model_of=st.lists(st.sampled_from(["m", "other"]), min_size=12, max_size=12),
)
def test_the_vector_rebuild_reads_recorded_vectors_as_the_typed_road_does(
    events: list[DerivedEvent], model_of: list[str]
) -> None:
    """The vector projection's bytes road (recorded vectors without pydantic) makes the
    operations :func:`streams.vectors.operations` makes of the typed events, in order;
    vectors of another model than the index's are not its business."""
    events = [with_point(e, i, model_of[i]) for i, e in enumerate(events)]
    values = [CODEC.encode(e) for e in events]
    projection = VectorProjection(cast(Any, None), "m")  # read() never touches the index
    try:
        assert projection.read(values, CODEC) == operations(decode_derived(CODEC, values), "m")
    finally:
        projection.pool.shutdown()


def with_point(event: DerivedEvent, at: int, model: str) -> DerivedEvent:
    """``event`` naming a memory by a UUID (point ids are UUIDs), three memories in
    turn; a recorded vector of ``model``."""
    body = getattr(event, "body", None)
    if body is None or not hasattr(body, "memory_id"):
        return event
    update: dict[str, Any] = {"memory_id": str(UUID(int=at % 3 + 1))}
    if isinstance(event, MemoryEmbedded):
        update["model"] = model
    return event.model_copy(update={"body": body.model_copy(update=update)})


# -- a sealed log: unsealed by hand, the same rows, bodies and points as clear ---------


class BookOpener:
    """What a rebuild's :class:`~sinks.keys.KeyedOpener` is, over a key book in memory
    (no key topic): opening, and unsealing by hand."""

    def __init__(self, keys: KeyBook) -> None:
        self.codec = SealingCodec(keys)

    def __call__(self, raw: bytes) -> Event | None:
        return self.codec.open(raw)

    def unseal(self, raw: bytes) -> bytes | None:
        assert self.codec.sealer is not None
        return self.codec.sealer.inner(raw)


def sealed_log(
    events: list[DerivedEvent], older: set[int], shred: set[str]
) -> tuple[list[bytes], list[bytes], BookOpener]:
    """``events`` clear and sealed (``older`` positions written with a ``working.updated``
    v1 schema where they are one), and an opener whose keys of ``shred`` are destroyed
    after sealing (their events are left out on every road)."""
    keys = KeyBook()
    for subject in {subject_of(e) for e in events}:
        keys.keys[subject] = {"k1": bytes(32)}  # one key each: what the sealer needs
    sealer = Sealer(Codec(), keys, remember=False)
    clear = [
        working_v1(e) if i in older and isinstance(e, WorkingUpdated) else CODEC.encode(e)
        for i, e in enumerate(events)
    ]
    sealed = [
        raw if e.type in CLEAR_TYPES else sealer.seal(e, raw)
        for e, raw in zip(events, clear, strict=True)
    ]
    for subject in shred & set(keys.keys):
        keys.keys[subject] = dict.fromkeys(keys.keys[subject])
    gone = [e.type not in CLEAR_TYPES and subject_of(e) in shred for e in events]
    return [c for c, g in zip(clear, gone, strict=True) if not g], sealed, BookOpener(keys)


def working_v1(event: WorkingUpdated) -> bytes:
    """``event`` in ``working.updated`` v1 (before ``scratchpad``)."""
    v1 = json.loads((AVSC_DIR / "working.updated.v1.avsc").read_text(encoding="utf-8"))
    record = event.model_dump()
    record["body"].pop("scratchpad")
    return write_single_object(MAGIC + fingerprint(v1), fastavro.parse_schema(v1), record)


SEALED_LOGS = st.fixed_dictionaries(
    {
        "events": st.lists(
            st.sampled_from(DERIVED_TYPES).flatmap(model_strategy), min_size=1, max_size=12
        ),
        "older": st.sets(st.integers(0, 11)),
        "shred": st.sets(st.sampled_from(["", "0", "a"]), max_size=1),
    }
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log=SEALED_LOGS)
def test_a_sealed_log_gives_the_rows_and_bodies_of_the_same_log_in_clear(
    log: dict[str, Any],
) -> None:
    """Unsealed by hand, sealed records take the roads clear ones take: the same rows,
    the same bodies for ClickHouse to read, the same erasures; and the rows are the
    typed road's (a plain function as the opener: every record opened and decoded)."""
    clear, sealed, opener = sealed_log(log["events"], log["older"], log["shred"])
    native = native_coders(CODEC)
    by_hand = change_rows(CODEC, sealed, opener, native)
    assert by_hand == change_rows(CODEC, clear, None, native)
    read_by_clickhouse = [raw for raw in clear if raw[2:10] in native]
    assert sum(map(len, by_hand.bodies.values())) == len(read_by_clickhouse)
    typed_road = change_rows(CODEC, sealed, lambda raw: opener(raw))
    assert change_rows(CODEC, sealed, opener) == typed_road


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log=SEALED_LOGS, model_of=st.lists(st.sampled_from(["m", "other"]), min_size=12))
def test_a_sealed_log_gives_the_vector_operations_of_the_same_log_in_clear(
    log: dict[str, Any], model_of: list[str]
) -> None:
    events = [with_point(e, i, model_of[i]) for i, e in enumerate(log["events"])]
    clear, sealed, opener = sealed_log(events, log["older"], log["shred"])
    projection = VectorProjection(cast(Any, None), "m")  # read() never touches the index
    try:
        by_hand = projection.read(sealed, CODEC, opener)
        assert by_hand == projection.read(clear, CODEC)
        assert by_hand == projection.read(sealed, CODEC, lambda raw: opener(raw))
    finally:
        projection.pool.shutdown()
