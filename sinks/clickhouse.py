"""ClickHouse history: the raw log archive (``events``) and every memory change
(``memory_changes``).

Guarantees:
- idempotent by table design: both tables are ReplacingMergeTree keyed by the
  agent and its per-agent sequence (``memory_changes`` adds the change's index),
  so re-delivering a batch changes nothing once merged (read with ``FINAL``);
- durable when ``write`` returns (the insert has been acknowledged);
- ordered per agent by ``seq``, which the processors assign in log order.

The DDL is created and versioned by the sink itself (table ``engram_ddl``): a
history made by an older version gets the new tables when it is next opened
(:meth:`ClickHouseHistory.ensure_schema`).

Checkpoints: every write carries the touched agents' fold states; the latest one per
agent is ``agent_states`` (what the latest snapshot starts from), and about one every
:data:`CHECKPOINT_EVERY` sequence numbers is also kept in ``agent_checkpoints`` with
the config version that made it (what a replay as of a moment starts from, see
:func:`engram.snapshot.replay_start`). A history from before them has none kept: its
replays start from the first event until the worker has written new ones.

Erasure: a ``subject.erased`` among the changes of a write purges the subject from
the agent's history before the write returns (:mod:`sinks.clickhouse_erasure`) and
records a receipt in ``erasures`` (one per request and agent, counts only); the view
``erased_subjects`` is what analysts see of an erased subject: counted, and empty.

Layout: ``events`` and ``memory_changes`` are ordered by agent and sequence. ``events``,
the raw log's archive, is partitioned by month (old months can be moved or dropped
whole); ``memory_changes`` is one partition (``PARTITION BY tuple()``): a read of one
agent (a snapshot, the second road of time travel) costs chdb a fixed amount for each
data part it opens, and a partition per month kept the parts of different months apart
(one agent's 8 months lay in 29 parts; the second road's query over all of them took
85 ms against 47 ms over one part). A ``memory_changes`` made before keeps its monthly
partitions (ClickHouse cannot change a partition key in place); ``engram rebuild
clickhouse`` writes its new version in the current layout (:data:`VERSION_ENGINES`).

Versions (blue/green rebuilds of ``memory_changes``): the live table keeps its name
(the views read it by name); a rebuild fills ``memory_changes_v{n}``, created empty
with the live table's structure, then swaps it in with one ``EXCHANGE TABLES``
statement (chdb's default database engine, Overlay, accepts it as the Atomic
engine does; readers see the old table or the new one, never neither). Each
table's version is written in its ``COMMENT`` (``engram version n``), so it travels
with the data through the exchange: the live table says which version it is, and a
``_v{n}`` table whose comment does not say ``n`` is the previous live table left
by an interrupted swap. A missing comment is version 1.
"""

from __future__ import annotations

import asyncio
import logging
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

from clickhouse_connect.driver.binding import quote_identifier
from clickhouse_connect.driver.client import Client
from pydantic_core import to_json

from schemas import DERIVED_TYPES, Codec, DerivedEvent, Event, MemoryEmbedded, SubjectErased
from schemas.avro import MAGIC, AvroType
from schemas.base import INT64_MAX
from schemas.raw import RAW_TYPES
from schemas.sealed import SEALED_HEADER
from sinks.clickhouse_erasure import (
    INSERT_SETTINGS,
    agent_waves,
    exclusion_ddl,
    insert_rows,
    kept_rows,
    purge,
    purge_rebuilt,
)
from sinks.transcode import (
    SOURCE,
    Transcoder,
    Unsupported,
    archive_record,
    archive_transcoder,
    literal,
    transcoder,
)

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger("engram.sinks.clickhouse")

READ_COLUMNS = (
    # the memory, episode, fact (namespace NUL key) or skill a change is about
    """item String MATERIALIZED multiIf(
        type = 'episode.closed', JSONExtractString(body, 'episode_id'),
        type = 'fact.set',
        concat(JSONExtractString(body, 'namespace'), char(0), JSONExtractString(body, 'key')),
        type = 'skill.updated', JSONExtractString(body, 'name'),
        memory_id)""",
    # a memory's strength (S) after its creation, reinforcement or weakening, as written
    """strength String MATERIALIZED if(
        type IN ('memory.created', 'memory.reinforced', 'memory.weakened'),
        JSONExtractRaw(body, 'strength'), '')""",
    """invalidated Bool MATERIALIZED
        type = 'memory.weakened' AND JSONExtractBool(body, 'invalidated')""",
    """episode_end String MATERIALIZED
        if(type = 'episode.closed', JSONExtractString(body, 'ended_at'), '')""",
    # the episode whose end dates a new memory: a semantic one's first source, else its own
    """anchor String MATERIALIZED if(type = 'memory.created',
        if(JSONExtractString(body, 'kind') = 'semantic',
           JSONExtractString(body, 'sources', 1), memory_id), '')""",
    # a working-memory delta's top-level flags (bodies are compact JSON, where these
    # substrings can only be the fields themselves) and the sessions a tick expired
    """cleared Bool MATERIALIZED
        type = 'working.updated' AND position(body, '"cleared":true') > 0""",
    """blank Bool MATERIALIZED
        type = 'working.updated' AND position(body, '"added":[]') > 0""",
    """expired Array(String) MATERIALIZED
        if(type = 'working.updated', JSONExtract(body, 'expired', 'Array(String)'), [])""",
)
"""Columns of ``memory_changes`` that ClickHouse computes from each row's ``body`` as the
row is written (``MATERIALIZED``: never inserted, left out of ``SELECT *``), so the
second road of time travel (:mod:`engram.history`) reads small columns instead of
parsing every body of an agent at each query. Every writer of the table (the sink, a
rebuild, an erasure's rewrite) gets them alike; rows written before the columns are
computed when read."""


def add_read_columns(table: str) -> str:
    """The statement that gives ``table`` (a version of ``memory_changes``) the
    :data:`READ_COLUMNS` it lacks."""
    return f"ALTER TABLE {table} " + ", ".join(
        f"ADD COLUMN IF NOT EXISTS {column}" for column in READ_COLUMNS
    )


READ_COLUMNS_VERSION = 8
"""The migration that adds :data:`READ_COLUMNS` (to the versions on disk too)."""

MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (
        1,
        (
            """CREATE TABLE IF NOT EXISTS events (
                agent_id String,
                seq UInt64,
                event_id UUID,
                type LowCardinality(String),
                session_id Nullable(String),
                user_id Nullable(String),
                occurred_at DateTime64(3, 'UTC'),
                schema_version UInt16,
                body String,
                payload String
            ) ENGINE = ReplacingMergeTree(seq)
            PARTITION BY toYYYYMM(occurred_at)
            ORDER BY (agent_id, seq)""",
            """CREATE TABLE IF NOT EXISTS memory_changes (
                agent_id String,
                seq UInt64,
                idx UInt16,
                event_id UUID,
                type LowCardinality(String),
                source_event_id UUID,
                session_id Nullable(String),
                user_id Nullable(String),
                occurred_at DateTime64(3, 'UTC'),
                config_version LowCardinality(String),
                memory_id String,
                body String
            ) ENGINE = ReplacingMergeTree(seq)
            PARTITION BY tuple()
            ORDER BY (agent_id, seq, idx)""",
        ),
    ),
    (
        2,
        (
            # Views over memory_changes: always consistent with it, nothing to rebuild.
            """CREATE VIEW IF NOT EXISTS memories AS
            SELECT
                agent_id,
                memory_id,
                argMaxIf(user_id, (seq, idx), type = 'memory.created') AS user_id,
                argMaxIf(session_id, (seq, idx), type = 'memory.created') AS session_id,
                argMaxIf(JSONExtractString(body, 'kind'), (seq, idx), type = 'memory.created')
                    AS kind,
                if(countIf(type = 'memory.promoted') > 0, 'L3',
                   argMaxIf(JSONExtractString(body, 'layer'), (seq, idx), type = 'memory.created'))
                    AS layer,
                argMaxIf(JSONExtractString(body, 'text'), (seq, idx), type = 'memory.created')
                    AS text,
                argMaxIf(JSONExtractFloat(body, 'importance'), (seq, idx),
                         type = 'memory.created') AS importance,
                argMaxIf(JSONExtractFloat(body, 'sentiment'), (seq, idx),
                         type = 'memory.created') AS sentiment,
                argMaxIf(JSONExtractFloat(body, 'strength'), (seq, idx),
                         type IN ('memory.created', 'memory.reinforced', 'memory.weakened'))
                    AS strength,
                countIf(type = 'memory.reinforced') AS reinforcements,
                maxIf(occurred_at, type IN ('memory.created', 'memory.reinforced'))
                    AS last_reinforced_at,
                countIf(type = 'memory.promoted') > 0 AS promoted,
                countIf(type = 'memory.forgotten') > 0 AS forgotten,
                minIf(occurred_at, type = 'memory.forgotten') AS forgotten_at,
                minIf(occurred_at, type = 'memory.created') AS created_at,
                argMaxIf(config_version, (seq, idx), type = 'memory.created') AS config_version
            FROM memory_changes FINAL
            WHERE memory_id != ''
            GROUP BY agent_id, memory_id""",
            """CREATE VIEW IF NOT EXISTS episodes AS
            SELECT
                agent_id,
                JSONExtractString(body, 'episode_id') AS episode_id,
                session_id,
                user_id,
                JSONExtractString(body, 'summary') AS summary,
                JSONExtractFloat(body, 'importance') AS importance,
                JSONExtractFloat(body, 'sentiment') AS sentiment,
                JSONExtractFloat(body, 'confidence') AS confidence,
                JSONExtract(body, 'entities', 'Array(String)') AS entities,
                JSONExtractUInt(body, 'turn_count') AS turn_count,
                parseDateTime64BestEffort(JSONExtractString(body, 'started_at'), 3, 'UTC')
                    AS started_at,
                parseDateTime64BestEffort(JSONExtractString(body, 'ended_at'), 3, 'UTC')
                    AS ended_at,
                JSONExtractString(body, 'cut') AS cut,
                nullIf(JSONExtractString(body, 'previous_episode_id'), '') AS previous_episode_id,
                JSONExtractString(body, 'summariser') AS summariser,
                seq,
                config_version
            FROM memory_changes FINAL
            WHERE type = 'episode.closed'""",
            """CREATE VIEW IF NOT EXISTS facts AS
            SELECT agent_id, namespace, key, value, valid_from, valid_to, seq, config_version
            FROM (
                SELECT
                    agent_id,
                    JSONExtractString(body, 'namespace') AS namespace,
                    JSONExtractString(body, 'key') AS key,
                    JSONExtract(body, 'value', 'Nullable(String)') AS value,
                    parseDateTime64BestEffort(JSONExtractString(body, 'valid_from'), 3, 'UTC')
                        AS valid_from,
                    leadInFrame(toNullable(valid_from)) OVER (
                        PARTITION BY agent_id, namespace, key ORDER BY seq, idx
                        ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING
                    ) AS valid_to,
                    seq,
                    config_version
                FROM memory_changes FINAL
                WHERE type = 'fact.set'
            )
            WHERE value IS NOT NULL""",
            """CREATE VIEW IF NOT EXISTS persona AS
            SELECT
                agent_id,
                JSONExtractUInt(body, 'version') AS version,
                JSONExtract(body, 'name', 'Nullable(String)') AS name,
                JSONExtract(body, 'description', 'Nullable(String)') AS description,
                JSONExtract(body, 'style', 'Nullable(String)') AS style,
                JSONExtract(body, 'preferences', 'Map(String, String)') AS preferences,
                occurred_at AS updated_at,
                seq
            FROM memory_changes FINAL
            WHERE type = 'persona.versioned'""",
        ),
    ),
    (
        3,
        (
            # A checkpoint of each agent's fold state, written when the fold saves it:
            # a snapshot loads it and folds only the events after it.
            """CREATE TABLE IF NOT EXISTS agent_states (
                agent_id String,
                seq Int64,
                state String CODEC(ZSTD(3))
            ) ENGINE = ReplacingMergeTree(seq)
            ORDER BY agent_id""",
        ),
    ),
    (
        4,
        (
            # memory.created v2 says when the memory's forgetting clock starts
            # (``formed_at``: its episode's last turn, say), as the fold counts it; the
            # event's own time stands in for version-1 events
            """CREATE OR REPLACE VIEW memories AS
            SELECT
                agent_id,
                memory_id,
                argMaxIf(user_id, (seq, idx), type = 'memory.created') AS user_id,
                argMaxIf(session_id, (seq, idx), type = 'memory.created') AS session_id,
                argMaxIf(JSONExtractString(body, 'kind'), (seq, idx), type = 'memory.created')
                    AS kind,
                if(countIf(type = 'memory.promoted') > 0, 'L3',
                   argMaxIf(JSONExtractString(body, 'layer'), (seq, idx), type = 'memory.created'))
                    AS layer,
                argMaxIf(JSONExtractString(body, 'text'), (seq, idx), type = 'memory.created')
                    AS text,
                argMaxIf(JSONExtractFloat(body, 'importance'), (seq, idx),
                         type = 'memory.created') AS importance,
                argMaxIf(JSONExtractFloat(body, 'sentiment'), (seq, idx),
                         type = 'memory.created') AS sentiment,
                argMaxIf(JSONExtractFloat(body, 'strength'), (seq, idx),
                         type IN ('memory.created', 'memory.reinforced', 'memory.weakened'))
                    AS strength,
                countIf(type = 'memory.reinforced') AS reinforcements,
                maxIf(clock_at, type IN ('memory.created', 'memory.reinforced'))
                    AS last_reinforced_at,
                countIf(type = 'memory.promoted') > 0 AS promoted,
                countIf(type = 'memory.forgotten') > 0 AS forgotten,
                minIf(occurred_at, type = 'memory.forgotten') AS forgotten_at,
                minIf(clock_at, type = 'memory.created') AS created_at,
                argMaxIf(config_version, (seq, idx), type = 'memory.created') AS config_version
            FROM (
                SELECT *,
                    if(type = 'memory.created',
                       coalesce(parseDateTime64BestEffortOrNull(
                           JSONExtractString(body, 'formed_at'), 3, 'UTC'), occurred_at),
                       occurred_at) AS clock_at
                FROM memory_changes FINAL
                WHERE memory_id != ''
            )
            GROUP BY agent_id, memory_id""",
        ),
    ),
    (
        5,
        (
            # One receipt per erasure request and agent (issue 7): who, when, what was
            # purged, counts only. ``rows``: rows deleted per table; the other counts:
            # what the fold dropped from the agent's memory.
            """CREATE TABLE IF NOT EXISTS erasures (
                request_id UUID,
                agent_id String,
                subject String,
                requested_at Nullable(DateTime64(3, 'UTC')),
                erased_at DateTime64(3, 'UTC'),
                seq UInt64,
                sessions UInt64,
                episodes UInt64,
                memories UInt64,
                facts UInt64,
                persona UInt64,
                rows Map(String, UInt64)
            ) ENGINE = ReplacingMergeTree
            ORDER BY (request_id, agent_id)""",
            # Erased subjects as analysts see them: counted, and empty.
            """CREATE VIEW IF NOT EXISTS erased_subjects AS
            SELECT
                subject,
                uniqExact(request_id) AS requests,
                uniqExact(agent_id) AS agents,
                sum(memories) AS memories,
                sum(facts) AS facts,
                sum(arraySum(mapValues(rows))) AS rows_deleted,
                min(requested_at) AS first_requested_at,
                max(erased_at) AS last_erased_at
            FROM erasures FINAL
            GROUP BY subject""",
        ),
    ),
    (
        6,
        (
            # Checkpoints of each agent's fold state kept by position (issue 5): about one
            # every ``checkpoint_every`` sequence numbers, with the parameters that made
            # them, so a replay as of T starts from the last one at or before T's cut.
            """CREATE TABLE IF NOT EXISTS agent_checkpoints (
                agent_id String,
                config_version LowCardinality(String),
                seq Int64,
                state String CODEC(ZSTD(3))
            ) ENGINE = ReplacingMergeTree
            ORDER BY (agent_id, config_version, seq)""",
        ),
    ),
    (
        7,
        (
            # The vector points an erasure deleted, per request and agent (issue 7): the
            # vector projection deletes them after the fold's purge; a redelivery deletes
            # nothing more, and the largest count stays.
            """CREATE TABLE IF NOT EXISTS erasure_vectors (
                request_id UUID,
                agent_id String,
                points UInt64,
                at DateTime64(3, 'UTC')
            ) ENGINE = ReplacingMergeTree(points)
            ORDER BY (request_id, agent_id)""",
        ),
    ),
    (READ_COLUMNS_VERSION, (add_read_columns("memory_changes"),)),
    (
        9,
        (
            # A memory is what its latest memory.created made of it (``current``: that
            # change and those after it): a rollback may forget it and a later one
            # create it again, with a reinforcement that sets its trace back whole. So
            # it is forgotten, promoted or reinforced only by changes since then, and
            # its reinforcements are what the latest strength change says (a rollback's
            # carries the count of the trace it restored; counting the changes would
            # count that one as one, and those it undid)
            """CREATE OR REPLACE VIEW memories AS
            SELECT
                agent_id,
                memory_id,
                argMaxIf(user_id, (seq, idx), type = 'memory.created') AS user_id,
                argMaxIf(session_id, (seq, idx), type = 'memory.created') AS session_id,
                argMaxIf(JSONExtractString(body, 'kind'), (seq, idx), type = 'memory.created')
                    AS kind,
                if(countIf(type = 'memory.promoted' AND current) > 0, 'L3',
                   argMaxIf(JSONExtractString(body, 'layer'), (seq, idx), type = 'memory.created'))
                    AS layer,
                argMaxIf(JSONExtractString(body, 'text'), (seq, idx), type = 'memory.created')
                    AS text,
                argMaxIf(JSONExtractFloat(body, 'importance'), (seq, idx),
                         type = 'memory.created') AS importance,
                argMaxIf(JSONExtractFloat(body, 'sentiment'), (seq, idx),
                         type = 'memory.created') AS sentiment,
                argMaxIf(JSONExtractFloat(body, 'strength'), (seq, idx),
                         type IN ('memory.created', 'memory.reinforced', 'memory.weakened'))
                    AS strength,
                argMaxIf(JSONExtractUInt(body, 'reinforcements'), (seq, idx),
                         type IN ('memory.reinforced', 'memory.weakened') AND current)
                    AS reinforcements,
                maxIf(clock_at, type IN ('memory.created', 'memory.reinforced') AND current)
                    AS last_reinforced_at,
                countIf(type = 'memory.promoted' AND current) > 0 AS promoted,
                countIf(type = 'memory.forgotten' AND current) > 0 AS forgotten,
                minIf(occurred_at, type = 'memory.forgotten' AND current) AS forgotten_at,
                minIf(clock_at, type = 'memory.created') AS created_at,
                argMaxIf(config_version, (seq, idx), type = 'memory.created') AS config_version
            FROM (
                SELECT *,
                    if(type = 'memory.created',
                       coalesce(parseDateTime64BestEffortOrNull(
                           JSONExtractString(body, 'formed_at'), 3, 'UTC'), occurred_at),
                       occurred_at) AS clock_at,
                    (seq, idx) >= max(if(type = 'memory.created', (seq, idx),
                                         (toUInt64(0), toUInt16(0))))
                        OVER (PARTITION BY agent_id, memory_id) AS current
                FROM memory_changes FINAL
                WHERE memory_id != ''
            )
            GROUP BY agent_id, memory_id""",
        ),
    ),
)

VECTOR_POINTS = "vector points"
"""The key of a receipt's ``rows`` that counts the vector points its erasure deleted
(absent until the vector projection has applied the erasure)."""

CHECKPOINT_EVERY = 500
"""How many sequence numbers apart the retained checkpoints of an agent are, at least."""

EVENT_COLUMNS = (
    "agent_id",
    "seq",
    "event_id",
    "type",
    "session_id",
    "user_id",
    "occurred_at",
    "schema_version",
    "body",
    "payload",
)
CHANGE_COLUMNS = (
    "agent_id",
    "seq",
    "idx",
    "event_id",
    "type",
    "source_event_id",
    "session_id",
    "user_id",
    "occurred_at",
    "config_version",
    "memory_id",
    "body",
)


ERASURE_COLUMNS = (
    "request_id",
    "agent_id",
    "subject",
    "requested_at",
    "erased_at",
    "seq",
    "sessions",
    "episodes",
    "memories",
    "facts",
    "persona",
    "rows",
)


@dataclass(frozen=True)
class ErasureReceipt:
    """What erasing ``subject`` from one agent purged: counts only, no content."""

    request_id: UUID
    agent_id: str
    subject: str
    requested_at: datetime | None
    erased_at: datetime
    seq: int
    fold: dict[str, int]
    rows: dict[str, int]


@dataclass(frozen=True)
class ArchivedEvent:
    """One row of the raw log archive, as needed to restore the log."""

    agent_id: str
    seq: int
    payload: bytes
    occurred_at: datetime


@dataclass(frozen=True)
class Checkpoint:
    """An agent's serialised fold state after the event with sequence ``seq``."""

    agent_id: str
    seq: int
    state: bytes


RETAINED = ("agent_id", "config_version", "seq", "state")
"""The columns of ``agent_checkpoints``."""


@dataclass(frozen=True)
class LogPrefix:
    """An agent's archived events with ``seq <= upto``, as a replay starting after them
    needs to know them: how many distinct sequences they hold (``upto + 1`` when none
    is missing), when the one at ``upto`` occurred, the type of the first one (a
    ``memory.forked`` folds another agent's past) and one sealed payload per subject (a
    reader that opens it holds that subject's key)."""

    agent_id: str
    upto: int
    events: int
    last_at: datetime | None
    first_type: str | None
    sealed: list[bytes]

    @property
    def whole(self) -> bool:
        """Whether every sequence from 0 to ``upto`` is in the archive."""
        return self.events == self.upto + 1


@dataclass(frozen=True)
class SequencedEvent:
    """A raw event with the per-agent sequence the processors gave it and its
    canonical Avro bytes (what a restore publishes again: sealed, if it came so).
    ``clear``: when ``payload`` is sealed, the clear single-object bytes the fold
    opened it to, if it has them (the archive's rows are then built by ClickHouse,
    :meth:`ClickHouseHistory.insert_events`); None otherwise."""

    event: Event
    seq: int
    payload: bytes
    clear: bytes | None = None


CHANGES = "memory_changes"
"""The live table of memory changes (the projection ``engram rebuild clickhouse`` rebuilds)."""
_VERSION_COMMENT = re.compile(r"^engram version ([1-9][0-9]*)$")


VERSION_ENGINES = {
    CHANGES: "ReplacingMergeTree(seq) PARTITION BY tuple() ORDER BY (agent_id, seq, idx)"
}
"""The engine of a new version of a versioned table: its current layout, whatever the
live table's (one made before the partitions went keeps them until it is rebuilt)."""


def version_table(version: int, table: str = CHANGES) -> str:
    """``{table}_v{n}``: where version ``n`` of ``table`` lives while it is not live."""
    if version < 1:
        raise ValueError(f"versions start at 1, got {version}")
    return f"{table}_v{version}"


def _transient(version: int, table: str, role: str) -> str:
    """``{table}_v{n}_{role}``: a table a rebuild of version ``n`` uses for a while."""
    return f"{version_table(version, table)}_{role}"


def version_comment(version: int) -> str:
    return f"engram version {version}"


def _comment_version(comment: str) -> int | None:
    match = _VERSION_COMMENT.match(comment.strip())
    return int(match.group(1)) if match else None


def event_row(item: SequencedEvent) -> list[Any]:
    e = item.event
    body = getattr(e, "body", None)
    return [
        e.agent_id,
        item.seq,
        e.event_id,
        e.type,
        e.session_id,
        e.user_id,
        e.occurred_at,
        e.schema_version,
        body.model_dump_json() if body is not None else "{}",
        item.payload,
    ]


def change_row(e: DerivedEvent) -> list[Any]:
    """The ``memory_changes`` row of ``e`` (:data:`CHANGE_COLUMNS`). Reads the models'
    ``__dict__`` (see :mod:`processors.build`): a body without ``memory_id`` would
    otherwise raise and catch an AttributeError in pydantic's ``__getattr__`` per row."""
    fields = e.__dict__
    body = fields.get("body")
    memory_id = body.__dict__.get("memory_id", "") if body is not None else ""
    return [
        fields["agent_id"],
        fields["seq"],
        fields["idx"],
        fields["event_id"],
        fields["type"],
        fields["source_event_id"],
        fields["session_id"],
        fields["user_id"],
        fields["occurred_at"],
        fields["config_version"],
        memory_id,
        body.model_dump_json() if body is not None else "{}",
    ]


def record_row(record: dict[str, Any]) -> list[Any]:
    """:func:`change_row` of a derived event read as a record by
    :meth:`schemas.Codec.read_record` (the current schema), without pydantic: the same
    values of the same types, the body serialised by the same serialiser (its fields
    in the schema's order, which is the model's). The record is taken as valid."""
    body = record["body"]
    return [
        record["agent_id"],
        record["seq"],
        record["idx"],
        record["event_id"],
        record["type"],
        record["source_event_id"],
        record["session_id"],
        record["user_id"],
        record["occurred_at"],
        record["config_version"],
        body.get("memory_id", ""),
        to_json(body).decode(),
    ]


FAST_TYPES = frozenset(DERIVED_TYPES) - {MemoryEmbedded, SubjectErased}
"""The derived types whose ``memory_changes`` rows can be written straight from their
Avro records (by :func:`record_row`, or by ClickHouse through a :class:`Transcoder`):
an erasure also purges, an embedding has no row."""


def native_coders(codec: Codec) -> dict[bytes, Transcoder]:
    """The native road to ``memory_changes`` of every :data:`FAST_TYPES` current
    schema it supports, by fingerprint (a schema it does not support keeps the
    Python road)."""
    return _coders(codec, FAST_TYPES, lambda avro: transcoder(avro, CHANGE_COLUMNS))


def archive_coders(codec: Codec) -> dict[bytes, Transcoder]:
    """The native road to ``events`` of every raw type's current schema it supports,
    by fingerprint (:func:`sinks.transcode.archive_transcoder`)."""
    return _coders(codec, RAW_TYPES, lambda avro: archive_transcoder(avro, EVENT_COLUMNS))


def _coders(
    codec: Codec, types: Iterable[type[Event]], make: Callable[[AvroType], Transcoder]
) -> dict[bytes, Transcoder]:
    coders: dict[bytes, Transcoder] = {}
    for kind in types:
        try:
            coder = make(codec.avro[kind.TYPE])
        except Unsupported as why:
            log.info("%s takes the Python road to ClickHouse: %s", kind.TYPE, why)
            continue
        coders[coder.fingerprint] = coder
    return coders


def _body(_: DerivedEvent, data: bytes) -> bytes:
    """The record of a derived event's bytes: its Avro body."""
    return data[10:]


def _archive_record(item: SequencedEvent, data: bytes) -> bytes:
    """The archive record of a raw event (:func:`sinks.transcode.archive_record`):
    its payload, and its fields read from ``data`` (the payload, or its clear bytes)."""
    return archive_record(item.seq, item.payload, data)


NATIVE_MIN_ROWS = 2_000
"""How many rows of a table one write needs before ClickHouse builds them from their
Avro bytes (:meth:`ClickHouseHistory.insert_changes`,
:meth:`ClickHouseHistory.insert_events`). Below it the Python road is quicker:
ClickHouse plans the transcoding query anew at each insert (~50 ms of CPU with chdb),
while building a row in Python costs ~6 µs, and ~3 µs more to write it in
clickhouse-connect's columns, all of it holding the interpreter lock."""


class ClickHouseHistory:
    """Writer and reader of the history tables over any clickhouse-connect client
    (chdb embedded or a server). Calls run on ``executor`` when given (chdb wants
    one thread), else on the default executor."""

    def __init__(
        self,
        client: Client,
        executor: Executor | None = None,
        *,
        checkpoint_every: int = CHECKPOINT_EVERY,
    ) -> None:
        if checkpoint_every < 1:
            raise ValueError("checkpoint_every must be 1 or more")
        self.client = client
        self.executor = executor
        self.checkpoint_every = checkpoint_every
        self._retained: dict[str, int] = {}
        """Per agent, the sequence of the last checkpoint this writer retained."""
        self._types: dict[tuple[str, tuple[str, ...]], list[str]] = {}
        """Per table and columns, the columns' type names (see :meth:`insert`)."""
        self.native_min = NATIVE_MIN_ROWS
        """The fewest rows of a table a write has ClickHouse build (:data:`NATIVE_MIN_ROWS`)."""
        self.purged: Callable[[str], None] | None = None
        """Called with each table's name as an erasure's purge finishes it (a hook
        for the crash tests; see :func:`sinks.clickhouse_erasure.purge`)."""

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn)

    async def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` where this history's calls run (its executor), from any event loop."""
        return await self._run(fn)

    def insert(self, table: str, rows: Sequence[Sequence[Any]], columns: Sequence[str]) -> None:
        """Insert ``rows`` into ``columns`` of ``table``, with the columns' types read once
        per table and columns: clickhouse-connect otherwise asks the server for them
        before every insert, a query that on chdb took about as long as the insert
        itself. A table's types are taken as fixed between migrations (engram's own
        versions of a table keep its structure); :meth:`ensure_schema` forgets them all,
        and a failed insert forgets its own (read again at the next one).

        Nothing of the insert outlives it (:func:`insert_rows`)."""
        key = (table, tuple(columns))
        types = self._types.get(key)
        if types is None:
            described = self.client.query(f"DESCRIBE TABLE {quote_identifier(table)}")
            known = {str(row[0]): str(row[1]) for row in described.result_rows}
            types = self._types[key] = [known[c] for c in columns]
        try:
            insert_rows(self.client, table, rows, columns, types)
        except Exception:
            self._types.pop(key, None)
            raise

    # -- DDL --------------------------------------------------------------
    def ensure_schema(self) -> int:
        """Apply every migration not yet applied; return the schema version."""
        self._types.clear()
        self.client.command(
            "CREATE TABLE IF NOT EXISTS engram_ddl"
            " (version UInt32, applied_at DateTime64(3, 'UTC')) ENGINE = MergeTree ORDER BY version"
        )
        rows = self.client.query("SELECT max(version) FROM engram_ddl").result_rows
        current = int(rows[0][0]) if rows else 0
        for version, statements in MIGRATIONS:
            if version <= current:
                continue
            for statement in statements:
                self.client.command(statement)
            if version == READ_COLUMNS_VERSION:  # a version may be swapped in later
                for kept in sorted(self.table_versions()):
                    self.client.command(add_read_columns(version_table(kept)))
            insert_rows(
                self.client, "engram_ddl", [[version, datetime.now(UTC)]], ["version", "applied_at"]
            )
            current = version
        return current

    # -- writes -----------------------------------------------------------
    async def write(
        self,
        events: Sequence[SequencedEvent],
        changes: Sequence[DerivedEvent],
        checkpoints: Sequence[Checkpoint] = (),
        bodies: Sequence[bytes] | None = None,
    ) -> None:
        """Insert a batch; returns once ClickHouse has acknowledged it. ``bodies``: see
        :meth:`insert_changes`."""
        await self._run(lambda: self.write_sync(events, changes, checkpoints, bodies))

    def write_sync(
        self,
        events: Sequence[SequencedEvent],
        changes: Sequence[DerivedEvent],
        checkpoints: Sequence[Checkpoint] = (),
        bodies: Sequence[bytes] | None = None,
    ) -> None:
        if events:
            self.insert_events(events)
        if changes:
            self.insert_changes(CHANGES, changes, bodies)
        if checkpoints:
            self.insert(
                "agent_states",
                [[c.agent_id, c.seq, c.state] for c in checkpoints],
                ["agent_id", "seq", "state"],
            )
            self._retain(checkpoints, changes)
        erasures = [c for c in changes if isinstance(c, SubjectErased)]
        if erasures:
            self.erase_many(erasures)

    def _retain(self, checkpoints: Sequence[Checkpoint], changes: Sequence[DerivedEvent]) -> None:
        """Keep, in ``agent_checkpoints``, each checkpoint that starts a new stretch of
        ``checkpoint_every`` sequence numbers for its agent (the first one this writer
        sees of an agent too), under the config version of the agent's changes in the
        same write. A checkpoint whose agent has no change in the write is not kept: the
        parameters that made it are unknown (a later one will be)."""
        versions = {c.agent_id: c.config_version for c in changes}
        every = self.checkpoint_every
        kept: dict[str, list[Any]] = {}
        for c in checkpoints:
            version = versions.get(c.agent_id)
            last = self._retained.get(c.agent_id)
            if version is None or (last is not None and c.seq // every <= last // every):
                continue
            kept[c.agent_id] = [c.agent_id, version, c.seq, c.state]
        if kept:
            self.insert("agent_checkpoints", list(kept.values()), RETAINED)
            self._retained |= {agent: int(row[2]) for agent, row in kept.items()}

    # -- erasure ----------------------------------------------------------
    def erase_sync(self, erased: SubjectErased) -> ErasureReceipt | None:
        """:meth:`erase_many` of one erasure."""
        return self.erase_many([erased])[0]

    def erase_many(self, erasures: Sequence[SubjectErased]) -> list[ErasureReceipt | None]:
        """Purge each erasure's subject from its agent's history (one DELETE per table
        for all of them), then write the receipts; return them, None for an erasure
        whose receipt exists already (a redelivery: the deletes ran again, changing
        nothing, and the first receipt stands).

        What goes, and how shared documents are re-derived: :mod:`sinks.clickhouse_erasure`.
        Two erasures of one agent go in separate purges, in log order (one statement
        for both could rewrite a row twice and delete it). Idempotent."""
        counts: list[dict[str, int]] = [{} for _ in erasures]
        tables = self._change_tables()
        for wave in agent_waves(erasures):
            done = purge(
                self.client, [erasures[i] for i in wave], tables, CHANGE_COLUMNS, self.purged
            )
            for at, rows in zip(wave, done, strict=True):
                counts[at] = rows
        receipts = [
            None if self._receipted(e) else _receipt(e, rows)
            for e, rows in zip(erasures, counts, strict=True)
        ]
        made = [_receipt_row(r) for r in receipts if r is not None]
        if made:
            insert_rows(self.client, "erasures", made, ERASURE_COLUMNS)
        return receipts

    def purge_rebuilt(
        self, table: str, erasures: Sequence[SubjectErased], excluded: str | None = None
    ) -> int:
        """Rebuild-only: purge ``erasures`` from ``table`` alone, a version being rebuilt
        from the log (:func:`sinks.clickhouse_erasure.purge_rebuilt`: no other table, no
        counts, no receipt; the live purge did those when the erasures were folded).
        With ``excluded`` (:meth:`exclusions`), the purged rows are named there rather
        than deleted, until :meth:`keep_unexcluded`. Returns the number of waves it
        took. Idempotent."""
        return purge_rebuilt(self.client, erasures, table, CHANGE_COLUMNS, excluded)

    def exclusions(self, version: int, table: str = CHANGES) -> str:
        """The (new or existing) table naming the rows of ``{table}_v{n}`` its rebuild's
        purges exclude; returns its name. It goes with :meth:`keep_unexcluded`, or with
        :meth:`drop_version`, or with :meth:`clean_versions` after a crash."""
        excluded = _transient(version, table, "excluded")
        self.client.command(exclusion_ddl(excluded))
        return excluded

    def keep_unexcluded(self, version: int, table: str = CHANGES) -> None:
        """Leave in ``{table}_v{n}`` only the rows its exclusions do not name (a copy
        without them, exchanged with it in one ``EXCHANGE TABLES``), then drop the
        exclusions. No copy when nothing is excluded. Interrupted, it leaves the version
        as it was or as it is meant to be, and leftovers :meth:`clean_versions` drops."""
        built = version_table(version, table)
        excluded, kept = _transient(version, table, "excluded"), _transient(version, table, "kept")
        if self._exists(excluded) and self._count(excluded):
            self.client.command(f"DROP TABLE IF EXISTS {kept} SYNC")
            self.client.command(
                f"CREATE TABLE {kept} AS {built} COMMENT '{version_comment(version)}'"
            )
            self.client.command(
                f"INSERT INTO {kept} {kept_rows(built, excluded)}", settings=INSERT_SETTINGS
            )
            self.client.command(f"EXCHANGE TABLES {kept} AND {built}")
            self.client.command(f"DROP TABLE {kept} SYNC")
        self.client.command(f"DROP TABLE IF EXISTS {excluded} SYNC")

    def _exists(self, table: str) -> bool:
        found = self.client.query("EXISTS TABLE {t:Identifier}", parameters={"t": table})
        return bool(found.result_rows[0][0])

    def _count(self, table: str) -> int:
        return int(self.client.query(f"SELECT count() FROM {table}").result_rows[0][0])

    def _change_tables(self) -> list[str]:
        """The live memory changes and every version of them on disk."""
        return [CHANGES, *(version_table(v) for v in sorted(self.table_versions()))]

    def _receipted(self, erased: SubjectErased) -> bool:
        found = self.client.query(
            "SELECT count() FROM erasures WHERE request_id = {r:UUID} AND agent_id = {a:String}",
            parameters={"r": erased.body.request_id, "a": erased.agent_id},
        )
        return int(found.result_rows[0][0]) > 0

    def erasures(self) -> list[ErasureReceipt]:
        """Every receipt, oldest erasure first; ``rows`` counts the vector points the
        erasure deleted too (:data:`VECTOR_POINTS`), once the vector projection did."""
        result = self.client.query(
            f"SELECT {', '.join(ERASURE_COLUMNS)} FROM erasures FINAL ORDER BY erased_at, agent_id"
        )
        points = {
            (str(request), str(agent)): int(n)
            for request, agent, n in self.client.query(
                "SELECT request_id, agent_id, max(points) FROM erasure_vectors"
                " GROUP BY request_id, agent_id"
            ).result_rows
        }
        receipts = [_receipt_of(row) for row in result.result_rows]
        for r in receipts:
            found = points.get((str(r.request_id), r.agent_id))
            if found is not None:
                r.rows[VECTOR_POINTS] = found
        return receipts

    def record_vector_erasures(self, erased: Sequence[tuple[SubjectErased, int]]) -> None:
        """Record the vector points each erasure deleted from its agent's points."""
        now = datetime.now(UTC)
        rows = [[e.body.request_id, e.agent_id, points, now] for e, points in erased]
        if rows:
            insert_rows(
                self.client, "erasure_vectors", rows, ["request_id", "agent_id", "points", "at"]
            )

    async def write_changes(self, table: str, changes: Sequence[DerivedEvent]) -> None:
        """Insert memory changes into ``table`` (a version being rebuilt, or the live one)."""
        if changes:
            rows = [change_row(c) for c in changes]
            await self._run(lambda: self.insert_change_rows(table, rows))

    def insert_changes(
        self, table: str, changes: Sequence[DerivedEvent], bodies: Sequence[bytes] | None = None
    ) -> None:
        """Insert the ``memory_changes`` rows of ``changes`` into ``table``.

        ``bodies``, when given, are the changes' clear Avro single-object bytes, one
        for each, in order (what the fold encoded to publish them). With at least
        :attr:`native_min` changes, those of :data:`FAST_TYPES` whose bytes are of a
        current schema go to ClickHouse as they are, and ClickHouse builds their rows
        (:meth:`insert_bodies`: the rows :func:`change_row` builds, value for value,
        ``tests/integration/test_transcode.py``), without holding the interpreter
        lock as the Python road does. Every other change, and all of them if
        ClickHouse refuses the bodies, takes the Python road (:func:`change_row`)."""
        python: list[DerivedEvent] = list(changes)
        if bodies is not None and len(changes) >= self.native_min:
            coded = zip(changes, (c.type for c in changes), bodies, strict=True)
            python = self._transcode(table, CHANGE_COLUMNS, self.change_coders, coded, _body)
        if python:
            self.insert(table, [change_row(c) for c in python], CHANGE_COLUMNS)

    def insert_events(self, events: Sequence[SequencedEvent]) -> None:
        """Insert the ``events`` archive rows of ``events``. With at least
        :attr:`native_min` of them, those whose clear bytes (``clear`` of a sealed
        payload, else the payload) are Avro of a current raw schema go to ClickHouse
        as archive records (:func:`~sinks.transcode.archive_record`), and ClickHouse
        builds their rows (the rows :func:`event_row` builds, value for value:
        ``tests/integration/test_transcode.py``); the others (JSON, an older schema,
        bytes of another type, a sealed payload without its clear bytes), and all of
        them if ClickHouse refuses the records, take the Python road
        (:func:`event_row`)."""
        python: list[SequencedEvent] = list(events)
        if len(events) >= self.native_min:
            coded = ((e, e.event.type, e.payload if e.clear is None else e.clear) for e in events)
            python = self._transcode(
                "events", EVENT_COLUMNS, self.event_coders, coded, _archive_record
            )
        if python:
            self.insert("events", [event_row(e) for e in python], EVENT_COLUMNS)

    def _transcode(
        self,
        table: str,
        columns: Sequence[str],
        coders: dict[bytes, Transcoder],
        items: Iterable[tuple[R, str, bytes]],
        record: Callable[[R, bytes], bytes],
    ) -> list[R]:
        """Have ClickHouse write the rows of the ``items`` (each with its event type
        and Avro single-object bytes) whose bytes one of ``coders`` reads as that type,
        from ``record(item, bytes)``; return the others, left to the Python road (all
        of them when ClickHouse refuses the records)."""
        groups: dict[bytes, list[bytes]] = {}
        native: list[R] = []
        python: list[R] = []
        for item, kind, data in items:
            coder = coders.get(data[2:10]) if data[:2] == MAGIC else None
            if coder is not None and coder.event_type == kind:
                groups.setdefault(coder.fingerprint, []).append(record(item, data))
                native.append(item)
            else:
                python.append(item)
        if groups:
            try:
                self.insert_bodies(table, [(coders[f], g) for f, g in groups.items()], columns)
            except Exception:
                log.warning(
                    "ClickHouse did not transcode %d rows of %s; they are built here",
                    len(native),
                    table,
                    exc_info=True,
                )
                python += native
        return python

    @cached_property
    def change_coders(self) -> dict[bytes, Transcoder]:
        """:func:`native_coders` of the current schemas, made on first use."""
        return native_coders(Codec())

    @cached_property
    def event_coders(self) -> dict[bytes, Transcoder]:
        """:func:`archive_coders` of the current schemas, made on first use."""
        return archive_coders(Codec())

    def insert_change_rows(self, table: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self.insert(table, rows, CHANGE_COLUMNS)

    def insert_bodies(
        self,
        table: str,
        groups: Sequence[tuple[Transcoder, Sequence[bytes]]],
        columns: Sequence[str] = CHANGE_COLUMNS,
    ) -> None:
        """Insert into ``columns`` of ``table`` (``memory_changes``' by default, or the
        ``events`` archive's) the rows of each group's ``bodies`` (Avro bodies of its
        transcoder's schema), transcoded by ClickHouse
        (:mod:`sinks.transcode`), each group from a container file of its own. chdb reads
        the files from temporary paths (``file()``), all groups in one ``INSERT …
        SELECT … UNION ALL …`` (one plan, one part per partition, the groups read in
        parallel); a server reads one file per insert from the request's body after the
        query (``input()``). Raises what the insert raised (a record that does not read
        fails its whole insert)."""
        groups = [(coder, bodies) for coder, bodies in groups if bodies]
        if not groups:
            return
        head = f"INSERT INTO {quote_identifier(table)} ({', '.join(columns)}) "
        if not type(self.client).__module__.endswith("_chdbclient"):
            for coder, bodies in groups:
                select = f"SELECT {', '.join(coder.select)} FROM input({literal(coder.structure)})"
                query = f"{head}{select} AS {SOURCE} FORMAT Avro\n"
                self.client.raw_insert("", insert_block=query.encode() + coder.container(bodies))
            return
        with tempfile.TemporaryDirectory(prefix="engram-") as folder:
            selects = []
            for n, (coder, bodies) in enumerate(groups):
                path = Path(folder) / f"{n}.avro"
                path.write_bytes(coder.container(bodies))
                source = f"file({literal(str(path))}, 'Avro', {literal(coder.structure)})"
                selects.append(f"SELECT {', '.join(coder.select)} FROM {source} AS {SOURCE}")
            self.client.command(head + " UNION ALL ".join(selects), settings=INSERT_SETTINGS)

    # -- versions (blue/green) ----------------------------------------------
    def _comments(self, table: str) -> dict[str, str]:
        """Name -> comment of ``table`` and every ``{table}_v{n}`` of this database."""
        result = self.client.query(
            "SELECT name, comment FROM system.tables WHERE database = currentDatabase()"
            " AND (name = {t:String} OR match(name, {p:String}))",
            parameters={"t": table, "p": f"^{re.escape(table)}_v[1-9][0-9]*$"},
        )
        return {str(name): str(comment) for name, comment in result.result_rows}

    def live_version(self, table: str = CHANGES) -> int:
        """The version of the live ``table`` (1 when it has never been rebuilt)."""
        comment = self._comments(table).get(table)
        if comment is None:
            raise LookupError(f"no table {table!r}: call ensure_schema() first")
        return _comment_version(comment) or 1

    def table_versions(self, table: str = CHANGES) -> dict[int, int | None]:
        """Every ``{table}_v{n}``: ``n`` -> the version its comment names (None if none)."""
        prefix = f"{table}_v"
        return {
            int(name[len(prefix) :]): _comment_version(comment)
            for name, comment in self._comments(table).items()
            if name != table
        }

    def clean_versions(self, table: str = CHANGES) -> list[str]:
        """Drop what interrupted rebuilds left behind; return the names dropped.

        A version above the live one is a rebuild that never swapped; a ``_v{n}``
        table whose comment names another version is the previous live table of a
        swap interrupted before it was renamed. Versions kept on purpose (below the
        live one, named after their own version) stay.
        """
        live = self.live_version(table)
        dropped = []
        for version, says in sorted(self.table_versions(table).items()):
            if version > live or says != version:
                self.drop_version(version, table)
                dropped.append(version_table(version, table))
        leftovers = self.client.query(
            "SELECT name FROM system.tables WHERE database = currentDatabase()"
            " AND match(name, {p:String}) ORDER BY name",
            parameters={"p": f"^{re.escape(table)}_v[1-9][0-9]*_(excluded|kept)$"},
        )
        for (name,) in leftovers.result_rows:
            self.client.command(f"DROP TABLE IF EXISTS {quote_identifier(name)} SYNC")
            dropped.append(str(name))
        return dropped

    def create_version(self, table: str = CHANGES) -> int:
        """A new, empty version of ``table`` with its columns, in the layout of
        :data:`VERSION_ENGINES`; returns its number. The live table is stamped with its
        version first, if it has none."""
        live = self.live_version(table)
        if _comment_version(self._comments(table)[table]) is None:
            self.client.command(f"ALTER TABLE {table} MODIFY COMMENT '{version_comment(live)}'")
        taken = [live, *self.table_versions(table)]
        version = max(taken) + 1
        engine = VERSION_ENGINES.get(table)
        self.client.command(
            f"CREATE TABLE {version_table(version, table)} AS {table}"
            + (f" ENGINE = {engine}" if engine else "")
            + f" COMMENT '{version_comment(version)}'"
        )
        return version

    def swap_version(self, version: int, table: str = CHANGES) -> int:
        """Make ``version`` live in one ``EXCHANGE TABLES``; the previous live table
        is renamed after its own version, which is returned."""
        previous = self.live_version(table)
        new = version_table(version, table)
        if self.table_versions(table).get(version) != version:
            raise LookupError(f"no table {new} holding version {version}")
        self.client.command(f"EXCHANGE TABLES {table} AND {new}")
        self.client.command(f"RENAME TABLE {new} TO {version_table(previous, table)}")
        return previous

    def agents_ahead(self, version: int, table: str = CHANGES) -> int:
        """How many agents have a newer change (a higher ``seq``) in ``{table}_v{n}``
        than in the live ``table``, or have changes there and none in ``table``."""
        old = version_table(version, table)
        result = self.client.query(
            f"SELECT count() FROM (SELECT agent_id, max(seq) AS s FROM {old}"
            " GROUP BY agent_id) AS o LEFT JOIN (SELECT agent_id, max(seq) AS s, 1 AS present"
            f" FROM {table} GROUP BY agent_id) AS n USING (agent_id)"
            " WHERE n.present = 0 OR o.s > n.s"
        )
        return int(result.result_rows[0][0])

    def drop_version(self, version: int, table: str = CHANGES) -> None:
        """Drop ``{table}_v{n}`` (never the live table) and what its rebuild used for a
        while; a missing one is a no-op."""
        self.client.command(f"DROP TABLE IF EXISTS {version_table(version, table)} SYNC")
        for role in ("excluded", "kept"):
            self.client.command(f"DROP TABLE IF EXISTS {_transient(version, table, role)} SYNC")

    # -- reads ------------------------------------------------------------
    def count_events(self) -> int:
        return int(self.client.query("SELECT count() FROM events FINAL").result_rows[0][0])

    def archive(self, page: int = 10_000) -> Iterator[ArchivedEvent]:
        """The archived raw log, per agent in sequence order, read in pages."""
        after_agent, after_seq = "", -1
        while True:
            result = self.client.query(
                "SELECT agent_id, seq, payload, occurred_at FROM events FINAL"
                " WHERE (agent_id, seq) > ({a:String}, {s:Int64})"
                " ORDER BY agent_id, seq LIMIT {n:UInt32}",
                parameters={"a": after_agent, "s": after_seq, "n": page},
                column_formats={"payload": "bytes"},
            )
            rows = result.result_rows
            for agent_id, seq, payload, occurred_at in rows:
                yield ArchivedEvent(agent_id, int(seq), payload, _aware(occurred_at))
            if len(rows) < page:
                return
            after_agent, after_seq = rows[-1][0], int(rows[-1][1])

    def checkpoint(self, agent_id: str) -> Checkpoint | None:
        """The latest checkpoint of ``agent_id``'s fold state (``agent_states``), if any."""
        rows = self.client.query(
            "SELECT seq, state FROM agent_states FINAL WHERE agent_id = {a:String}",
            parameters={"a": agent_id},
            column_formats={"state": "bytes"},
        ).result_rows
        return Checkpoint(agent_id, int(rows[0][0]), rows[0][1]) if rows else None

    def retained_checkpoint(
        self,
        agent_id: str,
        config_version: str,
        *,
        below: int = INT64_MAX,
        until: datetime | None = None,
    ) -> Checkpoint | None:
        """The retained checkpoint of ``agent_id`` made under ``config_version`` with the
        highest sequence that is below ``below`` and below every event of the agent that
        occurred after ``until`` (when given): so every archived event up to it occurred
        at or before ``until``. None when there is none, and always for an agent with an
        erasure receipt (its archive lost rows the checkpoints had folded)."""
        rows = self.client.query(
            "SELECT seq, state FROM agent_checkpoints"
            " WHERE agent_id = {a:String} AND config_version = {v:String} AND seq < {b:Int64}"
            " AND seq < ifNull((SELECT toInt64(minOrNull(seq)) FROM events"
            "  WHERE agent_id = {a:String} AND occurred_at > {u:DateTime64(3, 'UTC')}), {b:Int64})"
            " AND (SELECT count() FROM erasures WHERE agent_id = {a:String}) = 0"
            " ORDER BY seq DESC LIMIT 1",
            parameters={"a": agent_id, "v": config_version, "b": below, "u": until or _END_OF_TIME},
            column_formats={"state": "bytes"},
        ).result_rows
        return Checkpoint(agent_id, int(rows[0][0]), rows[0][1]) if rows else None

    def log_prefix(self, agent_id: str, upto: int) -> LogPrefix:
        """What the archive holds of ``agent_id`` up to sequence ``upto``: see
        :class:`LogPrefix`."""
        where = "agent_id = {a:String} AND seq <= {s:Int64}"
        params = {"a": agent_id, "s": upto}
        (count, last_at, first_type), *_ = self.client.query(
            f"SELECT uniqExact(seq), maxIf(occurred_at, seq = {{s:Int64}}),"
            f" anyIf(type, seq = 0) FROM events WHERE {where}",
            parameters=params,
        ).result_rows
        sealed = self.client.query(
            f"SELECT any(payload) FROM events WHERE {where}"
            " AND startsWith(payload, unhex({h:String})) GROUP BY ifNull(user_id, agent_id)",
            parameters={**params, "h": SEALED_HEADER.hex()},
            column_formats={"any(payload)": "bytes"},
        ).result_rows
        return LogPrefix(
            agent_id=agent_id,
            upto=upto,
            events=int(count),
            last_at=_aware(last_at) if int(count) else None,
            first_type=str(first_type) if int(count) else None,
            sealed=[bytes(row[0]) for row in sealed],
        )

    def agent_log(
        self,
        agent_id: str,
        *,
        after_seq: int = -1,
        until: datetime | None = None,
        upto_seq: int | None = None,
    ) -> Iterator[ArchivedEvent]:
        """``agent_id``'s archived raw events with ``seq > after_seq`` in sequence
        order, only those that occurred at or before ``until`` and with ``seq <=
        upto_seq`` when given."""
        page = 10_000
        last = INT64_MAX if upto_seq is None else upto_seq
        while True:
            result = self.client.query(
                "SELECT agent_id, seq, payload, occurred_at FROM events FINAL"
                " WHERE agent_id = {a:String} AND seq > {s:Int64} AND seq <= {l:Int64}"
                " AND occurred_at <= {u:DateTime64(3, 'UTC')}"
                " ORDER BY seq LIMIT {n:UInt32}",
                parameters={
                    "a": agent_id,
                    "s": after_seq,
                    "l": last,
                    "u": until or _END_OF_TIME,
                    "n": page,
                },
                column_formats={"payload": "bytes"},
            )
            rows = result.result_rows
            for row_agent, seq, payload, occurred_at in rows:
                yield ArchivedEvent(row_agent, int(seq), payload, _aware(occurred_at))
            if len(rows) < page:
                return
            after_seq = int(rows[-1][1])

    def episodes_of(
        self, agent_id: str, *, user_id: str | None, until_seq: int, limit: int
    ) -> list[dict[str, Any]]:
        """The last ``limit`` episodes of ``agent_id`` (and ``user_id`` when given)
        closed at or before sequence ``until_seq``, newest first."""
        result = self.client.query(
            "SELECT episode_id, session_id, user_id, summary, importance, sentiment, confidence,"
            " entities, turn_count, started_at, ended_at, cut, previous_episode_id, summariser, seq"
            " FROM episodes WHERE agent_id = {a:String} AND seq <= {s:Int64}"
            " AND ({u:Nullable(String)} IS NULL OR user_id = {u:Nullable(String)})"
            " ORDER BY seq DESC LIMIT {n:UInt32}",
            parameters={"a": agent_id, "s": until_seq, "u": user_id, "n": limit},
        )
        return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]


_END_OF_TIME = datetime(2299, 12, 31, tzinfo=UTC)
_FOLD_COUNTS = ("sessions", "episodes", "memories", "facts", "persona")


def _receipt(erased: SubjectErased, rows: dict[str, int]) -> ErasureReceipt:
    body = erased.body
    return ErasureReceipt(
        request_id=body.request_id,
        agent_id=erased.agent_id,
        subject=body.subject,
        requested_at=body.requested_at,
        erased_at=_millis(datetime.now(UTC)),
        seq=erased.seq,
        fold={name: int(getattr(body, name)) for name in _FOLD_COUNTS},
        rows=rows,
    )


def _millis(moment: datetime) -> datetime:
    """``moment`` at the history's precision (``DateTime64(3)``)."""
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def _receipt_row(r: ErasureReceipt) -> list[Any]:
    fold = [r.fold[name] for name in _FOLD_COUNTS]
    return [r.request_id, r.agent_id, r.subject, r.requested_at, r.erased_at, r.seq, *fold, r.rows]


def _receipt_of(row: Sequence[Any]) -> ErasureReceipt:
    request_id, agent_id, subject, requested_at, erased_at, seq, *fold, rows = row
    return ErasureReceipt(
        request_id=request_id if isinstance(request_id, UUID) else UUID(str(request_id)),
        agent_id=agent_id,
        subject=subject,
        requested_at=None if requested_at is None else _aware(requested_at),
        erased_at=_aware(erased_at),
        seq=int(seq),
        fold={name: int(n) for name, n in zip(_FOLD_COUNTS, fold, strict=True)},
        rows={str(k): int(v) for k, v in dict(rows).items()},
    )


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
