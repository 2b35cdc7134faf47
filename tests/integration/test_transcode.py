"""The rebuild's native road (:mod:`sinks.transcode`): ClickHouse reading the derived
records' Avro bodies itself writes the rows the Python road writes, value for value
and the body byte for byte, on the real engine (chdb).

Events are drawn from the models (``model_strategy`` of the round-trip tests): any
string (control characters, astral and CJK text), any double a model accepts, any
aware datetime from year 1 to 9999. Each batch goes into two tables of the
``memory_changes`` structure: one through ``record_row`` and clickhouse-connect's
insert (the Python road), one through the transcoder; the tables must hold the same
rows. The JSON encoders are also held, expression by expression, to
``pydantic_core.to_json`` over values chosen to reach every branch."""

from __future__ import annotations

import io
import math
import struct
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import clickhouse_connect
import fastavro
import pytest
from clickhouse_connect.driver.client import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic_core import to_json

from engram.events import make_event
from ops.rebuild import FAST_TYPES, ClickHouseProjection, change_rows, native_coders
from schemas import Codec, DerivedEvent, ErasedBody, Event, FactSet, MemoryCreated, SubjectErased
from schemas.raw import RAW_TYPES
from schemas.sealed import SealingCodec, is_sealed, subject_of
from sinks.clickhouse import (
    CHANGE_COLUMNS,
    EVENT_COLUMNS,
    ClickHouseHistory,
    SequencedEvent,
    archive_coders,
    event_row,
    record_row,
)
from sinks.keys import KeyBook
from sinks.transcode import (
    Transcoder,
    Unsupported,
    archive_record,
    column_type,
    json_sql,
    literal,
    transcoder,
)
from tests.unit.test_schemas_roundtrip import model_strategy

CODEC = Codec()
CODERS = native_coders(CODEC)
BY_TYPE = {coder.event_type: coder for coder in CODERS.values()}
FAST_TYPES_BY_NAME = {t.TYPE: t for t in FAST_TYPES}
FAST = pytest.mark.parametrize("event_type", sorted(FAST_TYPES, key=lambda t: t.TYPE), ids=str)


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseHistory]:
    path: Path = tmp_path_factory.mktemp("transcode") / "clickhouse"
    client = clickhouse_connect.get_client(dsn=f"chdb://{path}")
    history = ClickHouseHistory(client)
    history.ensure_schema()
    for name in ("by_python", "by_clickhouse"):  # no merges: every row stays as written
        client.command(f"CREATE TABLE {name} AS memory_changes ENGINE = Memory")
    try:
        yield history
    finally:
        client.close()


def rows(client: Client, table: str) -> list[tuple[Any, ...]]:
    order = ", ".join(CHANGE_COLUMNS)
    return [tuple(r) for r in client.query(f"SELECT * FROM {table} ORDER BY {order}").result_rows]


def test_every_fast_type_has_a_native_road() -> None:
    """The derived schemas hold only nodes the transcoder knows: a type left to the
    Python road would be a silent loss of speed, so it is named here."""
    assert set(BY_TYPE) == {t.TYPE for t in FAST_TYPES}


def in_the_tables_domain(event_type: type[DerivedEvent]) -> st.SearchStrategy[DerivedEvent]:
    """Events whose envelope the ``memory_changes`` columns hold (``idx`` a UInt16,
    ``occurred_at`` a DateTime64 from 1900 to 2299), as the fold makes them; their
    bodies are left as drawn (any year there: it is JSON text in the table)."""
    return st.builds(
        lambda event, seq, idx, moment: event.model_copy(
            update={"seq": seq, "idx": idx, "occurred_at": moment}
        ),
        model_strategy(event_type),
        st.integers(0, 2**63 - 1),
        st.integers(0, 2**16 - 1),
        st.datetimes(datetime(1900, 1, 2), datetime(2299, 12, 30), timezones=st.just(UTC)),
    )


@FAST
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_clickhouse_writes_the_rows_the_python_road_writes(
    history: ClickHouseHistory, event_type: type[DerivedEvent], data: st.DataObject
) -> None:
    events = data.draw(st.lists(in_the_tables_domain(event_type), min_size=1, max_size=25))
    values = [CODEC.encode(e) for e in events]
    client = history.client
    for table in ("by_python", "by_clickhouse"):
        client.command(f"TRUNCATE TABLE {table}")
    python_rows = []
    for value in values:
        found = CODEC.read_record(value)
        assert found is not None
        python_rows.append(record_row(found[1]))
    history.insert_change_rows("by_python", python_rows)
    coder = BY_TYPE[event_type.TYPE]
    assert all(v[2:10] == coder.fingerprint for v in values)
    history.insert_bodies("by_clickhouse", [(coder, [v[10:] for v in values])])
    assert rows(client, "by_clickhouse") == rows(client, "by_python")


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event=st.deferred(lambda: model_strategy(FAST_TYPES_BY_NAME["memory.created"])))
def test_a_body_cut_short_fails_the_batch_instead_of_shifting_it(
    history: ClickHouseHistory, event: DerivedEvent
) -> None:
    """Each record is a block of its own: a truncated body makes the insert fail (the
    rebuild then takes the Python road for that batch), it never reads the next
    record's bytes as the rest of this one."""
    body = CODEC.encode(event)[10:]
    history.client.command("TRUNCATE TABLE by_clickhouse")
    with pytest.raises(Exception):  # noqa: B017 - the engine's own error type
        history.insert_bodies(
            "by_clickhouse", [(BY_TYPE["memory.created"], [body[: len(body) // 2], body])]
        )
    assert rows(history.client, "by_clickhouse") == []


# -- the JSON encoders, expression by expression --------------------------------------


def evaluate(client: Client, node: Any, column_type: str, values: list[str]) -> list[str]:
    """``json_sql(node)`` over SQL literals ``values`` of ``column_type``, in order."""
    array = f"CAST([{', '.join(values)}], 'Array({column_type})')"
    sql = (
        f"SELECT {json_sql(node, 'v')} FROM"
        f" (SELECT arrayJoin(arrayEnumerate({array})) AS i, {array}[i] AS v) ORDER BY i"
    )
    return [str(r[0]) for r in client.query(sql).result_rows]


def float_literal(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"reinterpretAsFloat64(unhex('{struct.pack('<d', x).hex()}'))"


EDGE_DOUBLES = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.1,
    1e-5,
    9.999999999999999e-06,
    1e16,
    9999999999999998.0,
    1.5e300,
    -2.5e-300,
    5e-324,
    1.7976931348623157e308,
    123456789.125,
    float("nan"),
    float("inf"),
    float("-inf"),
]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(st.floats(), min_size=1, max_size=60))
def test_doubles_are_written_as_pydantic_writes_them(
    history: ClickHouseHistory, values: list[float]
) -> None:
    values = [*EDGE_DOUBLES, *values]
    found = evaluate(history.client, "double", "Float64", [float_literal(x) for x in values])
    assert found == [to_json(x, inf_nan_mode="constants").decode() for x in values]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(st.text(), min_size=1, max_size=40))
def test_strings_are_escaped_as_pydantic_escapes_them(
    history: ClickHouseHistory, values: list[str]
) -> None:
    values = ["", "\x00\x1f\x7f", '"\\/\b\f\n\r\t', "你好 🧠 é", *values]
    found = evaluate(history.client, "string", "String", [literal(v) for v in values])
    assert found == [to_json(v).decode() for v in values]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(st.datetimes(timezones=st.just(UTC)), min_size=1, max_size=40))
def test_timestamps_are_written_as_pydantic_writes_them(
    history: ClickHouseHistory, values: list[datetime]
) -> None:
    """Milliseconds, as Avro keeps them, from year 1 to 9999 (leap days, the epoch,
    the ends of 400-year cycles)."""
    edges = [
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
        datetime(2000, 2, 29, 12, tzinfo=UTC),
        datetime(1900, 3, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
        # the ends of the 400-year cycles the SQL moves a moment by
        datetime(1899, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
        datetime(1900, 1, 1, tzinfo=UTC),
        datetime(2299, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
        datetime(2300, 1, 1, tzinfo=UTC),
        datetime(1099, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
        datetime(8700, 1, 1, 0, 0, 0, 1000, tzinfo=UTC),
    ]
    moments = [m.replace(microsecond=m.microsecond // 1000 * 1000) for m in edges + values]
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    millis = [str((m - epoch) // timedelta(milliseconds=1)) for m in moments]
    node = {"type": "long", "logicalType": "timestamp-millis"}
    found = evaluate(history.client, node, "Int64", millis)
    assert found == [to_json(m).decode() for m in moments]


@pytest.mark.parametrize(
    "node",
    [
        "float",
        "bytes",
        {"type": "enum", "name": "E", "symbols": ["a"]},
        ["null", "string", "long"],
        ["string", "null"],
        {"type": "string", "logicalType": "date"},
        "no.such.Record",
    ],
    ids=str,
)
def test_nodes_without_a_native_road_are_refused(node: Any) -> None:
    with pytest.raises(Unsupported):
        column_type(node)


def test_a_schema_with_an_unknown_column_is_refused() -> None:
    """A ``memory_changes`` column the record has no field for keeps the Python road."""
    avro_type = CODEC.avro["fact.set"]
    with pytest.raises(Unsupported, match="no field for the column 'not_a_field'"):
        transcoder(avro_type, (*CHANGE_COLUMNS, "not_a_field"))


@settings(max_examples=20, deadline=None)
@given(events=st.lists(st.deferred(lambda: model_strategy(FAST_TYPES_BY_NAME["fact.set"]))))
def test_the_container_reads_back_record_for_record(events: list[DerivedEvent]) -> None:
    """The container file reads back, record for record, with fastavro too."""
    coder: Transcoder = BY_TYPE["fact.set"]
    values = [CODEC.encode(e) for e in events]
    read = list(fastavro.reader(io.BytesIO(coder.container([v[10:] for v in values]))))
    assert [CODEC.read_record(v)[1] for v in values] == read  # type: ignore[index]


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    created=st.lists(st.deferred(lambda: in_the_tables_domain(MemoryCreated)), min_size=2),
    facts=st.lists(st.deferred(lambda: in_the_tables_domain(FactSet)), min_size=1),
)
def test_a_group_clickhouse_refuses_takes_the_python_road_and_the_others_stay_native(
    history: ClickHouseHistory, created: list[DerivedEvent], facts: list[DerivedEvent]
) -> None:
    """One insert for every group of a flush; when a body in it does not read, the
    groups are tried one by one and the refused one is written by the Python road
    (which skips the record that does not decode): the table ends as the Python road
    alone would leave it."""
    projection = ClickHouseProjection(history)
    projection.coders = CODERS
    values = [CODEC.encode(e) for e in [*created, *facts]]
    values[0] = values[0][: 10 + (len(values[0]) - 10) // 2]  # a body cut short
    groups: dict[bytes, list[bytes]] = {}
    for value in values:
        groups.setdefault(value[2:10], []).append(value[10:])
    client = history.client
    for table in ("by_python", "by_clickhouse"):
        client.command(f"TRUNCATE TABLE {table}")
    projection.insert_native("by_clickhouse", [], groups)
    history.insert_change_rows("by_python", change_rows(CODEC, values).rows)
    assert rows(client, "by_clickhouse") == rows(client, "by_python")
    assert len(rows(client, "by_python")) == len(values) - 1


def folded(n: int) -> list[DerivedEvent]:
    """The derived events of folding ``n`` of the ingest bench's interactions (working
    memory, episodes, memories), and one drawn erasure, which no transcoder takes."""
    from ops.bench.ingest import make_payloads
    from processors import AgentMemory, MemoryConfig

    memories: dict[str, AgentMemory] = {}
    derived: list[DerivedEvent] = []
    for _, value in make_payloads(n, 7):
        event = CODEC.decode(value)
        memory = memories.setdefault(
            event.agent_id, AgentMemory.empty(event.agent_id, MemoryConfig())
        )
        derived += memory.apply(event).derived
    base = derived[0]
    erased = SubjectErased(
        event_id=uuid.uuid4(),
        agent_id=base.agent_id,
        user_id=base.user_id,
        occurred_at=base.occurred_at,
        source_event_id=base.source_event_id,
        seq=base.seq,
        idx=9,
        config_version=base.config_version,
        body=ErasedBody(subject=f"user:{base.user_id}", request_id=uuid.uuid4()),
    )
    return [*derived, erased]


def test_a_write_of_many_changes_has_clickhouse_build_their_rows_from_their_bodies(
    history: ClickHouseHistory,
) -> None:
    """The live flush hands the history its changes with their clear Avro bytes: from
    ``native_min`` changes on, ClickHouse builds the rows of the transcodable ones
    from those bytes (the same rows the Python road builds from the changes); fewer,
    and every change the transcoders do not take (an erasure), go by the Python road.
    Which road wrote a row is told by handing bytes of other content: a row built
    from the bytes says so."""
    changes = folded(300)
    kinds = {c.type for c in changes}
    assert {"working.updated", "memory.created", "subject.erased"} <= kinds
    bodies = [CODEC.encode(c) for c in changes]
    client = history.client
    for table in ("by_python", "by_clickhouse"):
        client.command(f"TRUNCATE TABLE {table}")
    history.native_min = len(changes)
    history.insert_changes("by_clickhouse", changes, bodies)
    history.insert_changes("by_python", changes)
    assert rows(client, "by_clickhouse") == rows(client, "by_python")
    assert len(rows(client, "by_python")) == len(changes)

    renamed = [
        c.model_copy(update={"agent_id": "elsewhere"}) if c.type != "subject.erased" else c
        for c in changes
    ]
    other = [CODEC.encode(c) for c in renamed]
    working = next(n for n, c in enumerate(changes) if c.type == "working.updated")
    created = next(n for n, c in enumerate(changes) if c.type == "memory.created")
    other[working] = other[created]  # another type's bytes: its row from the change
    client.command("TRUNCATE TABLE by_clickhouse")
    history.insert_changes("by_clickhouse", changes, other)  # rows from the bytes
    agents = dict(
        client.query(
            "SELECT type, groupArray(agent_id) FROM by_clickhouse GROUP BY type"
        ).result_rows
    )
    assert agents.pop("subject.erased") == [changes[-1].agent_id]  # the Python road
    assert set(agents) == kinds - {"subject.erased"}
    assert [a for found in agents.values() for a in found if a != "elsewhere"] == [
        changes[working].agent_id
    ]

    history.native_min = len(changes) + 1  # too few: every row from the changes
    client.command("TRUNCATE TABLE by_clickhouse")
    history.insert_changes("by_clickhouse", changes, other)
    assert rows(client, "by_clickhouse") == rows(client, "by_python")


def test_bodies_clickhouse_refuses_leave_the_write_to_the_python_road(
    history: ClickHouseHistory,
) -> None:
    """A body that does not read fails ClickHouse's whole insert; the changes it was
    for are then written from Python: nothing is lost, nothing written twice."""
    changes = folded(120)
    bodies = [CODEC.encode(c) for c in changes]
    bodies[3] = bodies[3][: 10 + (len(bodies[3]) - 10) // 2]  # cut short
    client = history.client
    for table in ("by_python", "by_clickhouse"):
        client.command(f"TRUNCATE TABLE {table}")
    history.native_min = 1
    history.insert_changes("by_clickhouse", changes, bodies)
    history.insert_changes("by_python", changes)
    assert rows(client, "by_clickhouse") == rows(client, "by_python")
    assert len(rows(client, "by_python")) == len(changes)


RAW_CODERS = archive_coders(CODEC)
RAW_BY_TYPE = {coder.event_type: coder for coder in RAW_CODERS.values()}
RAW = pytest.mark.parametrize("event_type", sorted(RAW_TYPES, key=lambda t: t.TYPE), ids=str)


@pytest.fixture(scope="module")
def archives(history: ClickHouseHistory) -> ClickHouseHistory:
    for name in ("archived_by_python", "archived_by_clickhouse"):
        history.client.command(f"CREATE TABLE IF NOT EXISTS {name} AS events ENGINE = Memory")
    return history


def archived(client: Client, table: str) -> list[tuple[Any, ...]]:
    order = ", ".join(EVENT_COLUMNS)
    return [tuple(r) for r in client.query(f"SELECT * FROM {table} ORDER BY {order}").result_rows]


def archive_by_python(archives: ClickHouseHistory, items: list[SequencedEvent]) -> None:
    """Write the Python road's rows of ``items`` (the reference) in ``archived_by_python``."""
    archives.client.command("TRUNCATE TABLE archived_by_python")
    archives.insert("archived_by_python", [event_row(i) for i in items], EVENT_COLUMNS)


def archive_events(
    archives: ClickHouseHistory, these: list[SequencedEvent]
) -> list[tuple[Any, ...]]:
    """The ``events`` rows :meth:`ClickHouseHistory.insert_events` writes of ``these``."""
    archives.client.command("TRUNCATE TABLE events")
    archives.insert_events(these)
    return archived(archives.client, "events")


def test_every_raw_type_has_a_native_road_to_the_archive() -> None:
    assert set(RAW_BY_TYPE) == {t.TYPE for t in RAW_TYPES}


def raw_in_the_tables_domain(event_type: type[Event]) -> st.SearchStrategy[Event]:
    """Raw events whose envelope the ``events`` columns hold (``occurred_at`` a
    DateTime64 from 1900 to 2299, ``schema_version`` a UInt16), bodies as drawn."""
    return st.builds(
        lambda event, moment, version: event.model_copy(
            update={"occurred_at": moment, "schema_version": version}
        ),
        model_strategy(event_type),
        st.datetimes(datetime(1900, 1, 2), datetime(2299, 12, 30), timezones=st.just(UTC)),
        st.integers(1, 2**16 - 1),
    )


@RAW
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(data=st.data())
def test_clickhouse_archives_the_rows_the_python_road_archives(
    archives: ClickHouseHistory, event_type: type[Event], data: st.DataObject
) -> None:
    """An archive record (sequence number, payload, the event's own record) becomes
    the ``events`` row :func:`event_row` builds from the decoded event, value for
    value and the body's JSON byte for byte."""
    events = data.draw(st.lists(raw_in_the_tables_domain(event_type), min_size=1, max_size=20))
    seqs = data.draw(
        st.lists(st.integers(0, 2**63 - 1), min_size=len(events), max_size=len(events))
    )
    items = [SequencedEvent(e, seq, CODEC.encode(e)) for e, seq in zip(events, seqs, strict=True)]
    client = archives.client
    for table in ("archived_by_python", "archived_by_clickhouse"):
        client.command(f"TRUNCATE TABLE {table}")
    archives.insert("archived_by_python", [event_row(i) for i in items], EVENT_COLUMNS)
    coder = RAW_BY_TYPE[event_type.TYPE]
    records = [archive_record(i.seq, i.payload) for i in items]
    archives.insert_bodies("archived_by_clickhouse", [(coder, records)], EVENT_COLUMNS)
    assert archived(client, "archived_by_clickhouse") == archived(client, "archived_by_python")


def test_a_write_of_many_events_has_clickhouse_archive_them_from_their_payloads(
    archives: ClickHouseHistory,
) -> None:
    """From ``native_min`` events on, the archive rows of the events whose payload is
    current Avro are built by ClickHouse from the payloads (told here by payloads of
    other content); a JSON payload, fewer events, or payloads ClickHouse refuses take
    the Python road, and the table holds every event once."""
    from ops.bench.ingest import make_payloads

    decoded = [CODEC.decode(value) for _, value in make_payloads(60, 5)]
    items = [SequencedEvent(e, n, CODEC.encode(e)) for n, e in enumerate(decoded)]
    items[7] = SequencedEvent(items[7].event, 7, CODEC.encode_json(items[7].event))
    started = make_event("session.started", agent_id="elsewhere", session_id="s")
    items[9] = SequencedEvent(items[9].event, 9, CODEC.encode(started))  # not its own bytes
    client = archives.client
    archive_by_python(archives, items)

    def archive(these: list[SequencedEvent]) -> list[tuple[Any, ...]]:
        return archive_events(archives, these)

    archives.native_min = len(items)
    assert archive(items) == archived(client, "archived_by_python")
    renamed = [
        SequencedEvent(
            i.event, i.seq, CODEC.encode(i.event.model_copy(update={"agent_id": "elsewhere"}))
        )
        if n not in (7, 9)
        else i
        for n, i in enumerate(items)
    ]
    agents = [row[0] for row in archive(renamed)]
    assert agents.count("elsewhere") == len(items) - 2  # JSON, another event's: from the event
    archives.native_min = len(items) + 1  # too few: every row from its event
    by_python = archived(client, "archived_by_python")
    assert [r[:-1] for r in archive(renamed)] == [r[:-1] for r in by_python]  # but the payload
    archives.native_min = 1
    cut = [*items]
    cut[3] = SequencedEvent(cut[3].event, 3, cut[3].payload[: len(cut[3].payload) // 2])
    assert len(archive(cut)) == len(items)  # refused: every row from the events
    assert [r for r in archive(cut) if r[1] != 3] == [
        r for r in archived(client, "archived_by_python") if r[1] != 3
    ]


def test_sealed_events_are_archived_by_clickhouse_from_the_clear_bytes_they_opened_to(
    archives: ClickHouseHistory,
) -> None:
    """A sealed payload with the clear bytes the fold opened it to (``clear``) is
    archived by ClickHouse from those bytes, the sealed payload kept as it is: the rows
    the Python road builds from the events. Told by clear bytes of other content, which
    the rows then show; a sealed payload without its clear bytes takes the Python road."""
    from ops.bench.ingest import make_payloads

    keys = KeyBook()
    decoded = [CODEC.decode(value) for _, value in make_payloads(40, 4)]
    for event in decoded:
        keys.keys.setdefault(subject_of(event), {"k1": bytes(range(32))})
    sealing = SealingCodec(keys)
    items = []
    for n, event in enumerate(decoded):
        clear, sealed = sealing.encode_with_clear(event)
        opened, inner = SealingCodec(keys).open_clear(sealed)
        assert (opened, inner) == (event, clear)
        items.append(SequencedEvent(event, n, sealed, inner))
    client = archives.client
    archive_by_python(archives, items)

    def archive(these: list[SequencedEvent]) -> list[tuple[Any, ...]]:
        return archive_events(archives, these)

    assert all(is_sealed(i.payload) and i.clear is not None for i in items)
    archives.native_min = len(items)
    assert archive(items) == archived(client, "archived_by_python")  # sealed payloads kept
    told = [
        SequencedEvent(
            i.event,
            i.seq,
            i.payload,
            CODEC.encode(i.event.model_copy(update={"agent_id": "elsewhere"})),
        )
        if n != 5
        else SequencedEvent(i.event, i.seq, i.payload)  # no clear bytes: from the event
        for n, i in enumerate(items)
    ]
    rows = archive(told)
    assert [r[0] for r in rows].count("elsewhere") == len(items) - 1
    assert sorted(r[-1] for r in rows) == sorted(
        r[-1] for r in archived(client, "archived_by_python")
    )
