"""``ClickHouseHistory.insert`` against the real engine (chdb): the column types are
read once per table and columns, a failed insert forgets them, and a migration run
forgets them all; the layout of the tables and the columns ClickHouse reads for road 2."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import uuid4

import clickhouse_connect
import pytest
from clickhouse_connect.driver.client import Client

from engram.events import make_event
from schemas import Codec
from sinks.clickhouse import (
    CHANGES,
    MIGRATIONS,
    READ_COLUMNS_VERSION,
    ClickHouseHistory,
    SequencedEvent,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def history(tmp_path: Path) -> Iterator[ClickHouseHistory]:
    client = clickhouse_connect.get_client(dsn=f"chdb://{tmp_path}/ch")
    client.command(
        "CREATE TABLE t (id UInt32, name String, at DateTime64(3, 'UTC'), note Nullable(String))"
        " ENGINE = MergeTree ORDER BY id"
    )
    yield ClickHouseHistory(client)
    client.close()


def rows(client: Client) -> list[tuple[object, ...]]:
    return [tuple(r) for r in client.query("SELECT id, name, note FROM t ORDER BY id").result_rows]


def test_types_are_read_once_and_the_rows_land(history: ClickHouseHistory) -> None:
    history.insert("t", [[1, "一", None], [2, "two", "n"]], ["id", "name", "note"])
    assert history._types[("t", ("id", "name", "note"))] == ["UInt32", "String", "Nullable(String)"]
    history.insert("t", [[3, "three", None]], ["id", "name", "note"])
    assert rows(history.client) == [(1, "一", None), (2, "two", "n"), (3, "three", None)]


def test_an_insert_leaves_no_cycle_for_the_collector(history: ClickHouseHistory) -> None:
    """The worker collects cycles once a minute (ops.worker.tune_gc): an insert's rows
    must not wait for it inside clickhouse-connect's self-referring insert context."""
    history.insert("t", [[0, "warm", None]], ["id", "name", "note"])  # types read, caches made
    gc.collect()
    gc.disable()
    try:
        for start in (1, 3):  # the second insert reuses nothing of the first
            history.insert("t", [[start, "a", None], [start + 1, "b", "n"]], ["id", "name", "note"])
        found = gc.collect()
    finally:
        gc.enable()
    assert found == 0
    assert len(rows(history.client)) == 5


def test_a_failed_insert_forgets_the_types_and_the_next_reads_them_again(
    history: ClickHouseHistory,
) -> None:
    history.insert("t", [[1, "a", None]], ["id", "name", "note"])
    with pytest.raises(Exception):  # noqa: B017  # whichever error the driver raises
        history.insert("t", [[2, "b"]], ["id", "name", "note"])  # a value short
    assert ("t", ("id", "name", "note")) not in history._types
    history.insert("t", [[3, "c", None]], ["id", "name", "note"])
    assert history._types[("t", ("id", "name", "note"))] == ["UInt32", "String", "Nullable(String)"]
    assert rows(history.client) == [(1, "a", None), (3, "c", None)]


def test_a_migration_run_forgets_every_type(history: ClickHouseHistory) -> None:
    history.insert("t", [[1, "a", None]], ["id", "name", "note"])
    history.ensure_schema()
    assert history._types == {}


def monthly(statement: str) -> str:
    """A table's DDL as a history made before the partitions went had it."""
    return statement.replace("PARTITION BY tuple()", "PARTITION BY toYYYYMM(occurred_at)")


def partition_keys(client: Client) -> dict[str, str]:
    found = client.query(
        "SELECT name, partition_key FROM system.tables WHERE database = currentDatabase()"
    )
    return {str(name): str(key) for name, key in found.result_rows}


def test_a_batch_spanning_more_than_a_hundred_months_lands(tmp_path: Path) -> None:
    """A history made when the tables were partitioned by month keeps them so; a
    backfill of years in one batch is written (ClickHouse's default refuses more than
    100 partitions per insert)."""
    client = clickhouse_connect.get_client(dsn=f"chdb://{tmp_path}/months")
    for statement in MIGRATIONS[0][1]:
        client.command(monthly(statement))
    history = ClickHouseHistory(client)
    history.ensure_schema()
    assert partition_keys(client)["events"] == "toYYYYMM(occurred_at)"
    start = datetime(2010, 1, 15, tzinfo=UTC)
    events = [
        make_event(
            "interaction.recorded",
            agent_id="a",
            session_id="s",
            occurred_at=start + timedelta(days=31 * month),
            body={"role": "user", "content": f"month {month}"},
        )
        for month in range(150)
    ]
    codec = Codec()
    history.write_sync([SequencedEvent(e, i, codec.encode(e)) for i, e in enumerate(events)], [])
    months = client.query("SELECT uniqExact(toYYYYMM(occurred_at)), count() FROM events")
    assert tuple(months.result_rows[0]) == (150, 150)
    client.close()


def test_memory_changes_are_one_partition_and_a_rebuild_drops_the_months(
    tmp_path: Path,
) -> None:
    """A new history's memory changes are one partition (a read of one agent opens
    fewer data parts), its archive of events is partitioned by month; a new version of
    ``memory_changes`` has the current layout, whatever the live table's, and the live
    table's read columns."""
    fresh = clickhouse_connect.get_client(dsn=f"chdb://{tmp_path}/fresh")
    ClickHouseHistory(fresh).ensure_schema()
    keys = partition_keys(fresh)
    assert keys[CHANGES] == "tuple()"
    assert keys["events"] == "toYYYYMM(occurred_at)"
    fresh.close()
    old = clickhouse_connect.get_client(dsn=f"chdb://{tmp_path}/old")
    for statement in MIGRATIONS[0][1]:
        old.command(monthly(statement))
    history = ClickHouseHistory(old)
    history.ensure_schema()
    version = history.create_version()
    keys = partition_keys(old)
    assert keys[CHANGES] == "toYYYYMM(occurred_at)"
    assert keys[f"{CHANGES}_v{version}"] == "tuple()"
    described = old.query(f"DESCRIBE TABLE {CHANGES}_v{version}").result_rows
    assert ("item", "MATERIALIZED") in {(str(row[0]), str(row[2])) for row in described}
    old.close()


def test_the_read_columns_reach_rows_written_before_and_every_version(tmp_path: Path) -> None:
    """A history made before the read columns gets them in its live table and in every
    version on disk (one may be swapped in later); rows written before have them
    computed when read, rows written after as they are written."""
    client = clickhouse_connect.get_client(dsn=f"chdb://{tmp_path}/read")
    client.command(
        "CREATE TABLE engram_ddl (version UInt32, applied_at DateTime64(3, 'UTC'))"
        " ENGINE = MergeTree ORDER BY version"
    )
    for version, statements in MIGRATIONS[: READ_COLUMNS_VERSION - 1]:
        for statement in statements:
            client.command(statement)
        client.insert("engram_ddl", [[version, datetime.now(UTC)]])
    history = ClickHouseHistory(client)
    kept = history.create_version()
    history.insert_change_rows(CHANGES, [change("m1", '"kind":"semantic","sources":["e1","e2"]')])
    assert history.ensure_schema() == MIGRATIONS[-1][0]
    history.insert_change_rows(CHANGES, [change("m2", '"kind":"turn","sources":[]')])
    for table in (CHANGES, f"{CHANGES}_v{kept}"):
        described = client.query(f"DESCRIBE TABLE {table}").result_rows
        assert {"item", "strength", "anchor", "expired"} <= {str(row[0]) for row in described}
    read = client.query(f"SELECT item, strength, anchor FROM {CHANGES} ORDER BY seq")
    assert [tuple(row) for row in read.result_rows] == [("m1", "2.5", "e1"), ("m2", "2.5", "m2")]
    client.close()


def change(memory_id: str, fields: str) -> list[object]:
    """A ``memory.created`` row of ``memory_changes`` whose body holds ``fields``."""
    seq = int(memory_id[1:])
    body = f'{{"memory_id":"{memory_id}",{fields},"strength":2.5}}'
    at = datetime(2026, 3, 2, tzinfo=UTC)
    return ["a", seq, 0, uuid4(), "memory.created", uuid4(), None, None, at, "c1", memory_id, body]


def test_the_memories_view_of_a_history_from_before_shows_what_a_rollback_restored(
    tmp_path: Path,
) -> None:
    """A history made before the view knew rollbacks gets the new view when next
    opened: a memory forgotten, then created again (as a rollback restores one, with a
    strength change that carries its trace's reinforcements), is live, and counts the
    reinforcements of its restored trace and those after; a promotion before its
    latest creation (one a rollback undid) no longer makes it L3; a memory forgotten
    since its latest creation is forgotten."""
    client = clickhouse_connect.get_client(dsn=f"chdb://{tmp_path}/view")
    client.command(
        "CREATE TABLE engram_ddl (version UInt32, applied_at DateTime64(3, 'UTC'))"
        " ENGINE = MergeTree ORDER BY version"
    )
    for version, statements in MIGRATIONS[:READ_COLUMNS_VERSION]:
        for statement in statements:
            client.command(statement)
        client.insert("engram_ddl", [[version, datetime.now(UTC)]])
    history = ClickHouseHistory(client)
    t0 = datetime(2026, 3, 2, tzinfo=UTC)

    def row(seq: int, idx: int, kind: str, memory_id: str, fields: str) -> list[object]:
        body = f'{{"memory_id":"{memory_id}",{fields}}}'
        at = t0 + timedelta(hours=seq)
        return ["a", seq, idx, uuid4(), kind, uuid4(), None, None, at, "c1", memory_id, body]

    made = '"layer":"L2","kind":"turn","text":"Paris","strength":2.5'
    history.insert_change_rows(
        CHANGES,
        [
            row(1, 0, "memory.created", "back", made),
            row(1, 1, "memory.created", "gone", made),
            row(1, 2, "memory.created", "flat", made),
            row(1, 3, "memory.promoted", "flat", '"from_layer":"L2","to_layer":"L3"'),
            row(2, 0, "memory.reinforced", "back", '"strength":4.0,"reinforcements":1'),
            row(3, 0, "memory.reinforced", "back", '"strength":6.0,"reinforcements":2'),
            row(4, 0, "memory.forgotten", "back", '"retention":0.1'),
            row(4, 1, "memory.forgotten", "gone", '"retention":0.1'),
            row(5, 0, "memory.created", "back", made),  # a rollback to seq 2
            row(5, 1, "memory.reinforced", "back", '"strength":4.0,"reinforcements":1'),
            row(5, 2, "memory.created", "flat", made),  # its promotion is undone
            row(6, 0, "memory.reinforced", "back", '"strength":5.0,"reinforcements":2'),
        ],
    )
    view = "SELECT memory_id, forgotten, reinforcements, layer, strength FROM memories"
    old = {r[0]: tuple(r[1:]) for r in client.query(view).result_rows}
    assert old["back"] == (True, 4, "L2", 5.0) and old["flat"][2] == "L3"
    assert history.ensure_schema() == MIGRATIONS[-1][0]
    new = {r[0]: tuple(r[1:]) for r in client.query(view).result_rows}
    assert new == {
        "back": (False, 2, "L2", 5.0),
        "gone": (True, 0, "L2", 2.5),
        "flat": (False, 0, "L2", 2.5),
    }
    [moments] = client.query(
        "SELECT forgotten_at, last_reinforced_at FROM memories WHERE memory_id = 'gone'"
    ).result_rows
    assert [m.replace(tzinfo=UTC) for m in moments] == [t0 + timedelta(hours=h) for h in (4, 1)]
    client.close()


PANDAS_PROBE = """
import sys
import clickhouse_connect
from sinks.clickhouse_erasure import insert_rows, without_pandas
kept_out = {call}
client = clickhouse_connect.get_client(dsn="chdb://{path}")
client.command("CREATE TABLE t (id UInt32, name String) ENGINE = MergeTree ORDER BY id")
insert_rows(client, "t", [[1, "a"], [2, "b"]], ["id", "name"], ["UInt32", "String"])
rows = client.query("SELECT id, name FROM t ORDER BY id").result_rows
print(kept_out, "pandas" in sys.modules, rows)
"""


@pytest.mark.parametrize("call", ["without_pandas()", "None"])
def test_the_stack_s_inserts_need_no_pandas(tmp_path: Path, call: str) -> None:
    """The worker's process keeps clickhouse-connect from importing pandas (0.3 s, ~50
    MiB) for its first insert: in a fresh interpreter the rows land either way, and
    pandas is imported only without ``without_pandas`` (so the test would notice a
    clickhouse-connect that resolves pandas some other way)."""
    probe = PANDAS_PROBE.format(call=call, path=tmp_path / "ch")
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    kept_out, imported, rows = done.stdout.strip().split(" ", 2)
    assert rows == "[(1, 'a'), (2, 'b')]"
    assert (kept_out, imported) == (("True", "False") if call != "None" else ("None", "True"))


def test_pandas_already_imported_is_left_to_clickhouse_connect() -> None:
    import pandas  # noqa: F401  # imported by this test process first
    from clickhouse_connect.driver import options

    from sinks.clickhouse_erasure import without_pandas

    assert without_pandas() is False
    assert options.pd is not None
