"""Which derivation is live: the processor parameters, the derived topic and the fold's
state table that the worker uses, recorded in ClickHouse.

A *derivation* is one way of folding ``engram.events``: a :class:`MemoryConfig`, the
derived topic it publishes to and the faust table its agent states live in.
Generation 0 is the one a deployment starts with (the default parameters,
``engram.memory``, ``agent_state``); ``engram reprocess`` derives generation ``n + 1``
next to the live one and makes it live with a swap (:mod:`ops.reprocess`).

The table ``derivations`` holds one row per step of a swap: ``swapping`` before the
projections move, ``live`` after. A stack that starts on a ``swapping`` row finishes
the swap (its versions were complete before it began) before it folds anything.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from processors import MemoryConfig
from sinks.clickhouse import ClickHouseHistory
from sinks.clickhouse_erasure import insert_rows

TABLE = "derivations"
DDL = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} ("
    " generation UInt32, step LowCardinality(String), version String, config String,"
    " memory_topic String, state_table String, clickhouse_version UInt32,"
    " vectors_version UInt32, memory_starts String, at DateTime64(3, 'UTC')"
    ") ENGINE = MergeTree ORDER BY (generation, at)"
)
COLUMNS = [
    "generation",
    "step",
    "version",
    "config",
    "memory_topic",
    "state_table",
    "clickhouse_version",
    "vectors_version",
    "memory_starts",
    "at",
]
Step = Literal["swapping", "live"]
STATE_TABLE = "agent_state"


class Derivation(BaseModel):
    """One derivation: its generation, parameters, derived topic, state table and the
    projection versions it was swapped in with (0: never swapped, generation 0)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    generation: int = 0
    step: Step = "live"
    config: MemoryConfig = MemoryConfig()
    memory_topic: str
    state_table: str = STATE_TABLE
    clickhouse_version: int = 0
    vectors_version: int = 0
    memory_starts: dict[int, int] = {}
    """Per partition of ``memory_topic``: where the worker's projection agents start
    while the group has committed nothing there (the reprocess projected the rest)."""

    @property
    def version(self) -> str:
        return self.config.version


def first(memory_topic: str) -> Derivation:
    """Generation 0: default parameters on the deployment's own derived topic."""
    return Derivation(memory_topic=memory_topic)


class Derivations:
    """Reads and records derivations in the history's database (calls are blocking:
    run them where the history's calls run)."""

    def __init__(self, history: ClickHouseHistory, memory_topic: str) -> None:
        self.history = history
        self.memory_topic = memory_topic

    def ensure(self) -> None:
        self.history.client.command(DDL)

    def latest(self) -> Derivation:
        """The newest row: the live derivation, or one whose swap did not finish
        (``step == "swapping"``); generation 0 when none was ever recorded."""
        result = self.history.client.query(
            f"SELECT {', '.join(COLUMNS)} FROM {TABLE} ORDER BY generation DESC, at DESC LIMIT 1"
        )
        if not result.result_rows:
            return first(self.memory_topic)
        row = dict(zip(COLUMNS, result.result_rows[0], strict=True))
        return _derivation(row)

    def record(self, derivation: Derivation, step: Step) -> Derivation:
        """Append ``derivation`` at ``step``; one insert, atomic."""
        done = derivation.model_copy(update={"step": step})
        row = [
            done.generation,
            step,
            done.version,
            done.config.model_dump_json(),
            done.memory_topic,
            done.state_table,
            done.clickhouse_version,
            done.vectors_version,
            json.dumps({str(p): o for p, o in sorted(done.memory_starts.items())}),
            datetime.now(UTC),
        ]
        insert_rows(self.history.client, TABLE, [row], COLUMNS)
        return done

    def all(self) -> list[Derivation]:
        """Every generation's last row, oldest first."""
        result = self.history.client.query(
            f"SELECT {', '.join(COLUMNS)} FROM {TABLE} ORDER BY generation, at"
        )
        latest: dict[int, Derivation] = {}
        for values in result.result_rows:
            row = dict(zip(COLUMNS, values, strict=True))
            latest[int(row["generation"])] = _derivation(row)
        return [latest[g] for g in sorted(latest)]


def _derivation(row: dict[str, Any]) -> Derivation:
    return Derivation(
        generation=int(row["generation"]),
        step=row["step"],
        config=MemoryConfig.model_validate_json(row["config"]),
        memory_topic=str(row["memory_topic"]),
        state_table=str(row["state_table"]),
        clickhouse_version=int(row["clickhouse_version"]),
        vectors_version=int(row["vectors_version"]),
        memory_starts={int(p): int(o) for p, o in json.loads(row["memory_starts"]).items()},
    )


def live_config(history: ClickHouseHistory) -> MemoryConfig:
    """The parameters of the live derivation (what a replay must fold with); the
    defaults for a history that never recorded one (no ``derivations`` table yet)."""
    exists = history.client.query(
        "SELECT count() FROM system.tables WHERE database = currentDatabase()"
        " AND name = {t:String}",
        parameters={"t": TABLE},
    ).result_rows[0][0]
    if not exists:
        return MemoryConfig()
    return Derivations(history, "").latest().config
