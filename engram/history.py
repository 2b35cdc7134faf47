"""Read the ClickHouse history from the CLI: through the running ``engram up``
(its read-only ClickHouse-compatible endpoint, since chdb allows one process per
data directory), a ClickHouse server, or the embedded data directory itself.

It is also the second road of time travel: :func:`history_snapshot` answers, from
SQL over the history alone, the snapshot as of T that
:func:`engram.snapshot.take_snapshot` reconstructs by replaying the log; the two
must agree (``tests/integration/test_time_travel.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlparse

import clickhouse_connect
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError
from pydantic_core import from_json
from rich.console import Console
from rich.table import Table

from engram.client import read_up_file
from engram.errors import EngramError, NotRunning
from engram.results import DEFAULT_EPISODES, Position, Snapshot, SnapshotMemory
from engram.settings import Settings
from engram.snapshot import UnknownAgent, episode_record, working_of
from engram.sqlgate import ReadOnlyViolation, check_read_only
from processors import MemoryConfig
from processors.consolidation import Consolidation
from processors.forgetting import ForgettingParams, FsrsCard, Trace, retention_of
from processors.persona import PersonaVersion, SkillRecord
from processors.rebase import in_memory, renamed_id, undone_spans
from processors.state import ConsolidationState, SessionState
from processors.working import SUMMARY_ROLE
from schemas import EpisodeBody, FactSetBody, ForkedChangeBody, Turn, WorkingBody


def http_client(url: str) -> Client:
    """A clickhouse-connect HTTP client for ``http://host:port``."""
    parsed = urlparse(url)
    return clickhouse_connect.get_client(
        host=parsed.hostname or "127.0.0.1",
        port=parsed.port or 8123,
        interface=parsed.scheme or "http",
        username=parsed.username or "default",
        password=parsed.password or "",
    )


def history_client(settings: Settings) -> Client:
    """The best way to the history from here; raises NotRunning when there is none."""
    up = read_up_file(settings.up_file)
    if up is not None:
        try:
            return http_client(up["http"])  # the client asks the server on creation
        except ClickHouseError as error:
            raise NotRunning(
                f"engram up's API at {up['http']} does not answer ({type(error).__name__});"
                f" if the stack stopped without cleaning up, {settings.up_file} is left from"
                " it: start `engram up` again, or remove that file to read the history"
                " directly"
            ) from None
    if settings.clickhouse_url:
        if settings.clickhouse_url.startswith("chdb:"):
            return clickhouse_connect.get_client(dsn=settings.clickhouse_url)
        return http_client(settings.clickhouse_url)
    if (settings.home / "clickhouse").is_dir():
        return clickhouse_connect.get_client(dsn=settings.clickhouse_dsn)
    raise NotRunning(
        f"no history found: engram is not running and {settings.home / 'clickhouse'} does not "
        "exist. Run `engram demo` or `engram up` first, or set ENGRAM_CLICKHOUSE_URL."
    )


def run_sql(
    settings: Settings, query: str, parameters: dict[str, str] | None = None
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run one read-only query (``{name:Type}`` placeholders bound from ``parameters``);
    returns column names and rows."""
    try:
        check_read_only(query)
    except ReadOnlyViolation as error:
        raise EngramError(str(error)) from None
    client = history_client(settings)
    try:
        result = client.query(query, parameters=parameters or None)
    except ClickHouseError as error:
        raise EngramError(f"query failed: {error}") from None
    finally:
        client.close()
    return list(result.column_names), [tuple(r) for r in result.result_rows]


# -- the second road: a snapshot as of T from the history alone -------------------------

_AS_OF = "agent_id = {a:String} AND occurred_at <= {t:DateTime64(3, 'UTC')}"

_AT_KEY = "bitShiftLeft(seq, 16) + idx"
"""A change's place in the agent's log, as ``(seq, idx)`` orders it, in one number."""

_ITEMS = f"""
WITH
    argMaxIf((body, user_id, occurred_at, anchor), {_AT_KEY}, type = 'memory.created')
        AS made_as,
    groupBitOr(multiIf(type = 'memory.created', 1, type = 'memory.promoted', 4, 0)) AS flags,
    maxIf({_AT_KEY} + 1, type = 'memory.created')
        > maxIf({_AT_KEY} + 1, type = 'memory.forgotten') AS live
SELECT
    multiIf(type IN ('fact.set', 'skill.updated', 'persona.versioned'), type, '') AS kind,
    item, if(live, made_as.1, '') AS created, made_as.2 AS owner,
    made_as.3 AS created_change_at,
    argMaxIf(strength, {_AT_KEY},
             type IN ('memory.created', 'memory.reinforced', 'memory.weakened')) AS strength,
    maxIf(occurred_at, type = 'memory.reinforced') AS last_reinforced,
    maxIf(occurred_at, type IN ('memory.reinforced', 'memory.weakened')) AS last_review,
    uniqExactIf({_AT_KEY}, type = 'memory.reinforced') AS reinforcements,
    uniqExactIf({_AT_KEY}, type = 'memory.weakened') AS lapses,
    max(invalidated) AS invalidated, bitTest(flags, 2) AS promoted,
    max(episode_end) AS ended_at, made_as.4 AS anchored_by, live,
    argMaxIf((seq, idx, session_id, user_id, body, source_event_id), ({_AT_KEY}, body),
             type IN ('episode.closed', 'fact.set', 'skill.updated', 'persona.versioned')) AS doc
FROM memory_changes
WHERE {_AS_OF}
    AND (type IN ('episode.closed', 'fact.set', 'skill.updated', 'persona.versioned')
         OR (memory_id != '' AND type IN ('memory.created', 'memory.reinforced', 'memory.weakened',
                                          'memory.promoted', 'memory.forgotten')
             AND NOT arrayExists(s -> seq > s.1 AND seq <= s.2,
                                 {{x:Array(Tuple(UInt64, UInt64))}})
             AND NOT (seq = {{f:Int64}} AND type IN ('memory.reinforced', 'memory.weakened'))))
GROUP BY kind, item
HAVING kind != '' OR live OR ended_at != ''"""
"""In one pass, grouped by what a change is about (``item``; :func:`_items` reads the
rows):

* a memory (``kind`` ''): whether it was created by T and not forgotten since its
  latest creation (``live``), with what its retention needs (the latest strength, the
  reinforcements and lapses) and its anchor, the episode whose end dates it (its own,
  or the first source episode of a semantic memory). Only the changes on the memories'
  path count: not those of a span ``x`` (``low < seq <= high``), each a stretch that a
  rollback by T undid (:func:`processors.rebase.undone_spans`) with that rollback's
  own changes (at ``high``). Those take the projections from the memory before the
  rollback to the memory it restored, the fold of the changes before the stretch
  (``seq <= low``), and these say more: a memory a rollback brought back is live from
  its creation before the stretch, with the reinforcements and lapses it had then, as replay
  restores it (the rollback's ``memory.created`` and ``memory.reinforced`` would date
  it and its last reinforcement at the rollback, and count one reinforcement for
  all). Nor the strength changes of the fork at sequence ``f`` (-1: none), which set
  each memory it copied to its source's trace (:func:`_forked` takes that trace from
  the source's history instead). An episode's ``episode.closed`` is grouped with the
  memory of the episode (``item``: the episode's id), so every episode closed by T comes with its
  end and its record (``doc``);
* the latest ``fact.set`` of every key (``item``: namespace and key; a null value:
  retracted), every skill's latest record (``item``: its name) and the persona version
  in force at T, each as its ``doc``.

``doc`` is the latest such record (of equal keys, a rewrite before its old row went,
the greatest body); :data:`_AT_KEY` orders the changes as ``(seq, idx)`` does.
``item``, ``strength``, ``invalidated``, ``episode_end`` and ``anchor`` are columns
ClickHouse computed from each body when the row was written
(:data:`sinks.clickhouse.READ_COLUMNS`). One ``GROUP BY`` straight over the table, its
filter in ``HAVING``: a subquery around it (or a CTE under it) costs the engine more to
plan and run. (The anchor comes back as ``anchored_by``: an alias ``anchor`` would stand
for the column that ``made_as`` reads, a cycle.)"""

_WORKING = f"""
SELECT seq, idx, session_id, occurred_at, body, blank,
       at_key > greatest(own_reset, expired_at) AS after_reset
FROM (
    SELECT
        seq, idx, session_id, occurred_at, body, blank, own, at_key,
        max(if(own AND cleared, at_key, 0)) OVER (PARTITION BY sid) AS own_reset,
        max(if(own, 0, at_key)) OVER (PARTITION BY sid) AS expired_at
    FROM (
        SELECT
            seq, idx, session_id, occurred_at, body, blank, cleared,
            {_AT_KEY} + 1 AS at_key, session_id IS NOT NULL AS own,
            arrayJoin(if(own, [assumeNotNull(session_id)], expired)) AS sid
        FROM memory_changes
        WHERE {_AS_OF} AND type = 'working.updated'
    )
)
WHERE own AND (at_key > greatest(own_reset, expired_at)
               OR (at_key = own_reset AND own_reset > expired_at))"""
"""In one pass, every session's working-memory deltas that matter at T: those since it
was last cleared (at its end, an idle expiry listed by a session-less delta, or a
reopening). The delta that cleared it comes with ``after_reset`` false and whether it
added no turn (``blank``): such a delta matters only when a ``session.started`` or
``working.set`` made it (:func:`_deltas`: the one thing a delta cannot tell, a cleared
session that such an event opened afresh). ``cleared``, ``blank`` and ``expired``
(the sessions an idle expiry cleared) are computed from each body when the row was
written (:data:`sinks.clickhouse.READ_COLUMNS`). ``at_key`` counts from 1 here: 0 is
"never" for ``own_reset`` and ``expired_at``, and the agent's first change (seq 0,
idx 0) must come after it."""

_POSITION = f"""
SELECT tuple(uniqExact(seq), max(seq), argMax(occurred_at, seq),
             groupArrayIf(tuple(seq, type), type IN ('session.started', 'working.set')))
    AS position
FROM events
WHERE {_AS_OF}"""
"""How many archived events occurred by T, the last one's sequence and time, and the
sequence and type of those that were a ``session.started`` or a ``working.set``."""

_ROLLBACKS = f"""
SELECT groupArrayIf(tuple(seq, JSONExtractUInt(body, 'to_seq')), type = 'agent.rolled_back')
           AS rollbacks,
       groupArrayIf(tuple(seq, body), type = 'agent.forked') AS forks
FROM memory_changes
WHERE {_AS_OF} AND type IN ('agent.rolled_back', 'agent.forked')"""
"""Every rollback the agent's fold applied by T: ``(seq, to_seq)``, for
:func:`processors.rebase.undone_spans`; and the fork it began with, if it did:
``(seq, body)`` of its ``agent.forked`` (the same row more than once, or none)."""

ITEMS_SQL = f"SELECT groupArray(tuple(*)) AS items FROM ({_ITEMS})"
""":data:`_ITEMS` alone, as one row: what :func:`history_snapshot` asks again, on the
memories' path, of an agent with rollbacks by T or that began as a fork."""

SNAPSHOT_SQL = f"""
SELECT position, items, working, rollbacks, forks
FROM ({_POSITION}) AS p
CROSS JOIN ({ITEMS_SQL}) AS i
CROSS JOIN (SELECT groupArray(tuple(*)) AS working FROM ({_WORKING})) AS w
CROSS JOIN ({_ROLLBACKS}) AS r"""
"""The second road in one round trip: three parts over one agent's changes and
archived events that occurred by T come back as the columns of one row. Each part is
a one-row subquery of a cross join, not a scalar subquery: the engine runs scalar
subqueries one after another while it plans the query, the joined ones in one
pipeline. Each part reads its table itself: a CTE of the agent's changes shared by two
parts cost more to plan and run than the two reads (and ``AS MATERIALIZED`` is out:
chdb 26.9 loses rows when a materialised CTE has this many readers). No ``SETTINGS``
either: the read-only endpoint of ``engram up`` refuses a query that changes one.

* ``position``: :data:`_POSITION`;
* ``items``: :data:`_ITEMS` (memories, episodes, facts, skills, persona);
  ``working``: :data:`_WORKING`; each an array of its rows (in no order: they are
  sorted here);
* ``rollbacks``, ``forks``: :data:`_ROLLBACKS`, what takes the episodes a rollback
  undid off the episode list (and, for a fork, continues that list into its source's
  as of the fork, :func:`inherited_tail`: one more query per fork in the chain, when
  the agent's own episodes are fewer than asked), and the changes a rollback undid or
  made off the memories' path: the query runs with no spans (``x`` empty) and no fork
  (``f`` -1) and, for an agent with a rollback by T or that began as a fork, its items
  part runs again with them (:data:`ITEMS_SQL`), and a fork's source is read as of the fork
  (:func:`_forked`); the agents with neither, nearly all, pay no second round trip.

Every part reads one agent's rows with ``occurred_at <= T``. Derived changes carry the
time of the event that made them, so for a log whose event times never go back these
are exactly the changes of the log's prefix up to T: what the fold of that prefix (the
first road, :func:`engram.snapshot.take_snapshot`) holds.

The query's cost on chdb is mostly planning (about 15 ms for these parts) and
aggregating the agent's whole history: memories and the latest records were two parts
(a group by memory and a ranking window), now one group, which took a fifth less.

No ``FINAL``: it costs a third of the query on chdb (the merge of every part, planned
for each read). A key (agent, sequence, index) may then come more than once, from a
flush written again after a failure (the same row) or from an erasure's rewrite before
the old row is deleted (a crash in between; the redo deletes it): the parts count
distinct keys (``uniqExact``, ``uniqExactIf``), take one of a key's rows (``argMax``,
the greatest body among equal keys) and :func:`_unique` keeps one working row per key
(the greatest, so the choice is deterministic)."""

EPISODES_SQL = f"""
SELECT seq, session_id, user_id, body
FROM memory_changes FINAL
WHERE {_AS_OF} AND type = 'episode.closed'
  AND ({{u:Nullable(String)}} IS NULL OR user_id = {{u:Nullable(String)}})
  AND NOT arrayExists(s -> seq > s.1 AND seq < s.2, {{x:Array(Tuple(UInt64, UInt64))}})
ORDER BY seq DESC, idx DESC
LIMIT {{n:UInt32}}"""
"""The latest episodes closed by T (of one user when given), newest first, but those
of the stretches ``x`` that rollbacks undid (:func:`processors.rebase.undone_spans`)."""


def history_snapshot(
    client: Client,
    agent_id: str,
    *,
    as_of: datetime,
    user_id: str | None = None,
    session_id: str | None = None,
    episodes: int = DEFAULT_EPISODES,
    config: MemoryConfig | None = None,
) -> Snapshot:
    """The snapshot of ``agent_id`` as of ``as_of``, from SQL over the history alone.

    It answers what :func:`engram.snapshot.take_snapshot` answers by replay, from
    ``memory_changes`` (memories, episodes, facts, persona, skills, working memory)
    and the archive's ``events`` only for the position (how many events occurred by
    T, the last one's sequence) and, in working memory, for the type of an event
    that reopened a session. ``config`` gives what the changes do not carry: the
    forgetting curve that turns a strength into a retention at T, the turn cap that
    splits a delta's evictions into dropped and compressed entries, and the
    consolidation window that dates a semantic memory (``memory.created`` does not
    record the time its trace starts from). Under the ``fsrs`` curve a memory's card
    is rebuilt from its stability and last review only, all that its retention reads.
    One part cannot come from the history: a fact's ``confidence`` (``fact.set`` does
    not record it) is None here; and memories have their ``text`` here, not in the
    fold.

    For a log whose event times never go back, the two roads agree on everything
    else (``tests/integration/test_time_travel.py``). A late event (one that occurred
    before an event already in the log) breaks the premise: its changes were made
    after the later event, which the fold of "the events that occurred by T" skips,
    so the roads may then differ: replay folds the events of T's past as if the late
    ones had come on time, the history holds what the worker made of them in log
    order.

    Raises :class:`~engram.snapshot.UnknownAgent` when no event of the agent
    occurred at or before ``as_of``, ``ValueError`` for a naive ``as_of``.
    """
    if as_of.tzinfo is None:
        raise ValueError("as_of must be an aware datetime (UTC offset included)")
    if episodes < 0:
        raise ValueError("episodes must be 0 or more")
    config = config or MemoryConfig()
    at = as_of.astimezone(UTC)
    where: dict[str, Any] = {"a": agent_id, "t": at, "x": [], "f": -1}
    [(found, item_rows, working_rows, rollbacks, forks)] = _rows(client, SNAPSHOT_SQL, where)
    count, seq, last_at, opening = found
    if not count:
        raise UnknownAgent(
            f"no events of agent {agent_id!r} in the history at or before {at.isoformat()}"
        )
    spans = undone_spans(rollbacks)
    memory_rows, docs = _memory_rows(client, agent_id, at, item_rows, spans, forks)
    own = [
        episode_record(EpisodeBody.model_validate_json(body), session, user, int(seq), agent_id)
        for seq, _idx, session, user, body, _ in _latest(docs, user_id, episodes, spans)
    ]
    inherited = inherited_tail(client, fork_of(forks), user_id=user_id, limit=episodes - len(own))
    position = Position(seq=int(seq), last_event_at=_aware(last_at), events_folded=int(count))
    items = [_memory_of(row, at, config) for row in memory_rows]
    counts = {"L2": 0, "L3": 0}
    for item in items:
        counts[item.layer] += 1
    facts = (fact_of(doc[4], at) for doc in docs.get("fact.set", []))
    skills = (SkillRecord.model_validate_json(doc[4]) for doc in docs.get("skill.updated", []))
    persona = docs.get("persona.versioned")
    deltas = _deltas(_unique(working_rows, width=2), opening)  # by (seq, idx)
    sessions = sessions_from_deltas(deltas, config.working_turns)
    return Snapshot(
        agent_id=agent_id,
        user_id=user_id,
        session_id=session_id,
        as_of=as_of,
        position=position,
        working=working_of(sessions, session_id),
        episodes=own + inherited,
        facts=sorted((f for f in facts if f), key=lambda f: (f["namespace"], f["key"])),
        persona=persona_of(persona[0][4], persona[0][5]) if persona else None,
        skills=[s.model_dump(mode="json") for s in sorted(skills, key=lambda s: s.name)],
        memories=counts,
        config_version=config.version,
        memory_items=[m for m in items if user_id is None or m.user_id == user_id],
        retention_at=as_of,
        road="history",
    )


MEMORIES_SQL = f"""
SELECT items, rollbacks, forks
FROM ({ITEMS_SQL}) AS i
CROSS JOIN ({_ROLLBACKS}) AS r"""
"""The items part and the rollbacks of :data:`SNAPSHOT_SQL` alone: what
:func:`_forked` asks of a fork's source as of the fork."""


def _memory_rows(
    client: Client,
    agent_id: str,
    at: datetime,
    item_rows: Sequence[Sequence[Any]],
    spans: list[tuple[int, int]],
    forks: Sequence[Sequence[Any]],
) -> tuple[list[tuple[Any, ...]], dict[str, list[tuple[Any, ...]]]]:
    """:func:`_items` of the agent's memories as of ``at`` on their path (:data:`_ITEMS`):
    ``item_rows`` as the query without spans nor fork answered them, asked again with
    ``spans`` (the stretches its rollbacks undid) and its fork's sequence when it has
    either, and the memories a fork copied given their source's trace (:func:`_forked`)."""
    fork = min(((int(seq), str(body)) for seq, body in forks), default=None)
    if spans or fork is not None:  # the memories on their path: see _ITEMS
        where = {"a": agent_id, "t": at, "x": spans, "f": -1 if fork is None else fork[0]}
        [(item_rows,)] = _rows(client, ITEMS_SQL, where)
    memory_rows, docs = _items(item_rows)
    if fork is not None:
        memory_rows = _forked(
            client, agent_id, memory_rows, ForkedChangeBody.model_validate_json(fork[1])
        )
    return memory_rows, docs


def _forked(
    client: Client, agent_id: str, rows: list[tuple[Any, ...]], fork: ForkedChangeBody
) -> list[tuple[Any, ...]]:
    """``rows`` (:func:`_items`' memories of an agent that began as ``fork``) with the
    memories the fork copied read on from their source's trace, as replay folds them:
    the fork's ``memory.created`` and strength change date a copy at the fork and count
    one reinforcement for its whole trace; the copy is the source's memory as of the
    fork's moment (the source's history read as this road reads it, its own rollbacks
    and fork included), then this agent's changes since (the fork's strength changes
    left out, :data:`_ITEMS`): dated as the source dated it, reinforced and weakened
    by both, its strength the latest. The source is read with the changes that
    occurred by the fork's moment, what the fork folded for a source whose event times
    never go back (late events: see :func:`history_snapshot`)."""
    where = {"a": fork.source_agent_id, "t": fork.at, "x": [], "f": -1}
    [(item_rows, rollbacks, forks)] = _rows(client, MEMORIES_SQL, where)
    source_rows, _ = _memory_rows(
        client, fork.source_agent_id, fork.at, item_rows, undone_spans(rollbacks), forks
    )
    copied = {renamed_id(agent_id, row[0]): row for row in source_rows}
    out = []
    for row in rows:
        source = copied.get(row[0])
        if source is None:  # a memory of its own
            out.append(row)
            continue
        (memory_id, created, user_id, _change_at, strength, reinforced, review, reinforcements,
         lapses, invalidated, promoted, _ended_at) = row  # fmt: skip
        own = bool(reinforcements or lapses)  # a strength change since the fork
        out.append((
            memory_id, created, user_id, source[3], strength if own else source[4],
            max(reinforced, source[5]) if reinforcements else source[5],
            max(review, source[6]) if own else source[6],
            reinforcements + source[7], lapses + source[8],
            invalidated or source[9], promoted or source[10], source[11],
        ))  # fmt: skip
    return out


def rebases(
    client: Client, agent_id: str, as_of: datetime | None
) -> tuple[list[tuple[int, int]], ForkedChangeBody | None]:
    """The stretches of the agent's log its rollbacks by ``as_of`` (None: all) undid
    (:func:`processors.rebase.undone_spans`: their episodes are not the memory's), and
    the fork it began with (None: it did not), in one query."""
    where = {"a": agent_id, "t": as_of or _END_OF_TIME}
    [(rollbacks, forks)] = _rows(client, _ROLLBACKS, where)
    return undone_spans(rollbacks), fork_of(forks)


def fork_of(forks: Sequence[Sequence[Any]]) -> ForkedChangeBody | None:
    """The fork an agent began with, from :data:`_ROLLBACKS`' ``forks`` (None: none)."""
    fork = min(((int(seq), str(body)) for seq, body in forks), default=None)
    return None if fork is None else ForkedChangeBody.model_validate_json(fork[1])


def episode_tail(
    client: Client, agent_id: str, *, user_id: str | None, as_of: datetime | None, limit: int
) -> list[dict[str, Any]]:
    """The last ``limit`` episodes closed by ``as_of`` (None: all), newest first; not
    those a rollback undid; then, for a fork, its source's (:func:`inherited_tail`)."""
    spans, fork = rebases(client, agent_id, as_of)
    where = {"a": agent_id, "t": as_of or _END_OF_TIME, "u": user_id, "n": limit, "x": spans}
    own = [
        episode_record(EpisodeBody.model_validate_json(body), session, user, int(seq), agent_id)
        for seq, session, user, body in _rows(client, EPISODES_SQL, where)
    ]
    return own + inherited_tail(client, fork, user_id=user_id, limit=limit - len(own))


def inherited_tail(
    client: Client, fork: ForkedChangeBody | None, *, user_id: str | None, limit: int
) -> list[dict[str, Any]]:
    """The episodes an agent that began as ``fork`` (None: not a fork) lists after its
    own: the last ``limit`` of its source's episode tail as of the fork's moment
    (:func:`episode_tail`, so its rollbacks by then and its own fork count), each
    with the source's ``agent_id`` and ``seq``. Empty when ``limit`` is 0 or less. The
    source is read with the changes that occurred by the fork's moment, as
    :func:`_forked` reads its memories."""
    if fork is None or limit <= 0:
        return []
    return episode_tail(client, fork.source_agent_id, user_id=user_id, as_of=fork.at, limit=limit)


def fact_of(body: str, at: datetime) -> dict[str, Any] | None:
    """A key's latest ``fact.set`` by ``at`` as a snapshot lists it; None if retracted."""
    fact = FactSetBody.model_validate_json(body)
    if fact.value is None or fact.valid_from > at:
        return None
    return {
        "namespace": fact.namespace,
        "key": fact.key,
        "value": fact.value,
        "valid_from": fact.valid_from.isoformat(),
        "confidence": fact.confidence,
    }


def persona_of(body: str, source_event_id: Any) -> dict[str, Any]:
    """A ``persona.versioned`` body as the fold keeps the version (with its source)."""
    doc = json.loads(body)
    doc["source_event_id"] = str(source_event_id)
    return PersonaVersion.model_validate(doc).model_dump(mode="json")


def _memory_of(row: Sequence[Any], at: datetime, config: MemoryConfig) -> SnapshotMemory:
    (memory_id, created, user_id, change_at, strength, reinforced, review, reinforcements,
     lapses, invalidated, promoted, ended_at) = row  # fmt: skip
    body = from_json(created)  # the sink wrote it from a valid MemoryCreatedBody
    created_at = memory_created_at(body["kind"], _aware(change_at), ended_at, config)
    last, clock = trace_clock(
        created_at=created_at,
        reinforced_at=_aware(reinforced) if reinforcements else None,
        reviewed_at=_aware(review) if reinforcements or lapses else None,
        params=config.forgetting,
    )
    strength_days = float(strength)
    promoted = bool(promoted) or body["layer"] == "L3"
    return SnapshotMemory(  # validating in pydantic-core costs half of model_construct
        memory_id=memory_id,
        layer="L3" if promoted else body["layer"],
        kind=body["kind"],
        importance=body["importance"],
        sentiment=body["sentiment"],
        user_id=user_id,
        created_at=created_at,
        last_reinforced_at=last,
        strength_days=strength_days,
        reinforcements=int(reinforcements),
        lapses=int(lapses),
        invalidated=bool(invalidated),
        promoted=promoted,
        retention=retention_of(strength_days, clock, at, config.forgetting),
        text=body["text"],
    )


_NO_WINDOWS = ConsolidationState()
"""The consolidation state whose windows :func:`memory_created_at` only measures."""


def memory_created_at(
    kind: str, change_at: datetime, episode_end: str, config: MemoryConfig
) -> datetime:
    """When the fold dates a memory of ``kind`` (its trace starts there): a turn at its
    event, an episode at its last turn, a semantic memory at the end of its
    consolidation window (found from the end of its first source episode)."""
    if kind == "episode" and episode_end:
        return _parse_moment(episode_end)
    if kind == "semantic" and episode_end:
        window = Consolidation(_NO_WINDOWS, config.consolidation, config.scoring)
        size = timedelta(seconds=config.consolidation.window_s)
        return window.window_start(_parse_moment(episode_end)) + size
    return change_at


def trace_clock(
    *,
    created_at: datetime,
    reinforced_at: datetime | None,
    reviewed_at: datetime | None,
    params: ForgettingParams,
) -> tuple[datetime, datetime]:
    """A memory's last reinforcement (its creation if none) and the moment its
    retention counts from, from its changes: times never go back (a late review takes
    effect at the latest one); a weakening moves only an FSRS card's last review, from
    which that curve counts (:func:`processors.forgetting.retention_of` of the trace's
    strength at this moment is the retention of :func:`rebuild_trace`'s trace)."""
    last = max(created_at, reinforced_at or created_at)
    if params.curve == "fsrs":
        return last, max(last, reviewed_at or last)
    return last, last


def rebuild_trace(
    *,
    created_at: datetime,
    strength_days: float,
    reinforced_at: datetime | None,
    reviewed_at: datetime | None,
    reinforcements: int,
    lapses: int,
    invalidated: bool,
    params: ForgettingParams,
) -> Trace:
    """The forgetting trace of a memory from its changes (:func:`trace_clock`); the FSRS
    card holds what retrievability reads (stability, last review)."""
    last, review = trace_clock(
        created_at=created_at, reinforced_at=reinforced_at, reviewed_at=reviewed_at, params=params
    )
    card = None
    if params.curve == "fsrs":
        card = FsrsCard(
            card_id=0, state=2, step=None, stability=strength_days, difficulty=None,
            due=review, last_review=review,
        )  # fmt: skip
    return Trace(
        strength_days=strength_days,
        last_reinforced_at=last,
        reinforcements=reinforcements,
        lapses=lapses,
        invalidated=invalidated,
        card=card,
    )


_OPENING = ("session.started", "working.set", "memory.rolled_back", "memory.forked")
"""Source types whose cleared delta without a turn leaves the session open (empty)."""


def sessions_from_deltas(rows: Iterable[Sequence[Any]], limit: int) -> list[SessionState]:
    """Working memory rebuilt from ``working.updated`` deltas in log order, by the rule
    of :class:`schemas.derived.WorkingBody`. A row is ``(seq, idx, session_id,
    occurred_at, body, source_type)``; ``source_type`` matters only for a cleared
    delta without a new turn: a ``session.started`` or ``working.set`` opened the
    session afresh, and so did a rollback or a fork (they replace a session whole,
    :mod:`processors.rebase`); anything else left it closed. ``limit`` is the turn cap
    (``MemoryConfig.working_turns``), which tells dropped entries from compressed ones."""
    sessions: dict[str, _Session] = {}
    for _seq, _idx, sid, occurred_at, raw, source_type in rows:
        body = WorkingBody.model_validate_json(raw)
        at = _aware(occurred_at)
        for gone in body.expired:
            sessions.pop(gone, None)
        if sid is None:
            continue
        if body.cleared:
            sessions.pop(sid, None)
            if not body.added and source_type not in _OPENING:
                continue
        session = sessions.get(sid)
        if session is None:
            session = sessions[sid] = _Session(sid, at)
        session.apply(body, at, limit, fresh=body.cleared)
    return [s.state() for s in sessions.values()]


class _Session:
    """One session's working memory as its deltas rebuild it."""

    def __init__(self, session_id: str, at: datetime) -> None:
        self.session_id = session_id
        self.turns: list[Turn] = []
        self.dropped = self.compressed = 0
        self.last_at = at
        self.body = WorkingBody(size=0, tokens=0)

    def apply(self, body: WorkingBody, at: datetime, limit: int, *, fresh: bool) -> None:
        self.body = body
        self.last_at = max(self.last_at, at)
        if not body.added:
            return
        evicted = 0 if fresh else body.evicted  # a reopened session evicted the old one's
        kept = [*self.turns, *body.added]
        capped = max(0, len(kept) - limit)
        self.dropped += capped
        kept = kept[capped:]
        fitted = evicted - capped
        folded = sum(1 for t in kept[:fitted] if t.role != SUMMARY_ROLE)
        if body.prepended:
            self.compressed += folded
        else:
            self.dropped += folded
        self.turns = [*body.prepended, *kept[fitted:]]

    def state(self) -> SessionState:
        return SessionState(
            session_id=self.session_id,
            turns=self.turns,
            task=self.body.task,
            variables=self.body.variables,
            scratchpad=self.body.scratchpad,
            dropped=self.dropped,
            compressed=self.compressed,
            last_at=self.last_at,
        )


def _items(
    rows: Sequence[Sequence[Any]],
) -> tuple[list[tuple[Any, ...]], dict[str, list[tuple[Any, ...]]]]:
    """:data:`_ITEMS`' rows as the live memories, by memory id, each with the end of its
    anchor episode ('' when that episode is not closed by T) in place of the anchor;
    and the records by type (``episode.closed``, ``fact.set``, ``skill.updated``,
    ``persona.versioned``), each ``(seq, idx, session_id, user_id, body,
    source_event_id)``."""
    ends = {row[1]: row[12] for row in rows if not row[0] and row[12]}
    live = sorted((row for row in rows if not row[0] and row[14]), key=lambda row: str(row[1]))
    docs: dict[str, list[tuple[Any, ...]]] = {}
    for row in rows:
        kind = row[0] or ("episode.closed" if row[12] else "")
        if kind:
            docs.setdefault(kind, []).append(tuple(row[15]))
    return [(*row[1:12], ends.get(row[13], "")) for row in live], docs


def _latest(
    docs: dict[str, list[tuple[Any, ...]]],
    user_id: str | None,
    count: int,
    spans: Sequence[tuple[int, int]],
) -> list[tuple[Any, ...]]:
    """The last ``count`` episodes closed by T (of ``user_id`` when given), newest
    first; not those of the stretches ``spans`` a rollback undid."""
    closed = docs.get("episode.closed", [])
    mine = (
        doc
        for doc in closed
        if (user_id is None or doc[3] == user_id) and in_memory(int(doc[0]), spans)
    )
    return sorted(mine, key=lambda doc: (doc[0], doc[1]), reverse=True)[:count]


def _deltas(
    rows: Iterable[Sequence[Any]], opening: Iterable[tuple[int, str]]
) -> list[tuple[Any, ...]]:
    """:data:`_WORKING`'s rows as :func:`sessions_from_deltas` reads them, in log order,
    each with the type of the event that made it when that opens a session (else ''),
    without the clearing deltas that added no turn and that no such event made."""
    opened = {int(seq): str(kind) for seq, kind in opening}
    out = []
    for seq, idx, session_id, occurred_at, body, blank, after_reset in rows:
        source = opened.get(int(seq), "")
        if after_reset or not blank or source:
            out.append((seq, idx, session_id, occurred_at, body, source))
    return sorted(out, key=lambda row: (row[0], row[1]))


def _unique(rows: Iterable[Sequence[Any]], width: int) -> list[tuple[Any, ...]]:
    """One row per key, the key being a row's first ``width`` values: the greatest row
    of those that share it (rows are tuples of comparable values), in no order."""
    kept: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for row in rows:
        key, value = tuple(row[:width]), tuple(row)
        known = kept.get(key)
        if known is None or _order(value) > _order(known):
            kept[key] = value
    return list(kept.values())


def _order(row: tuple[Any, ...]) -> tuple[str, ...]:
    """A total order over rows whose values may be None or of mixed types."""
    return tuple("" if value is None else str(value) for value in row)


def _rows(client: Client, query: str, parameters: dict[str, Any]) -> list[tuple[Any, ...]]:
    try:
        result = client.query(query, parameters=parameters)
    except ClickHouseError as error:
        raise EngramError(f"history query failed: {error}") from None
    return [tuple(row) for row in result.result_rows]


def _aware(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _parse_moment(text: str) -> datetime:
    return _aware(datetime.fromisoformat(text))


_END_OF_TIME = datetime(2299, 12, 31, tzinfo=UTC)


def time_travel(
    settings: Settings,
    road: str,
    agent_id: str,
    moment: datetime,
    *,
    user_id: str | None = None,
    session_id: str | None = None,
    episodes: int = DEFAULT_EPISODES,
) -> Snapshot:
    """The snapshot as of ``moment`` by ``road``: ``history`` (SQL) or ``replay`` (the
    fold of the archived log), read through :func:`history_client`. Raises
    :class:`~engram.snapshot.UnknownAgent`, ``EngramError`` (no history, a failed query)."""
    from engram.snapshot import take_snapshot
    from engram.transfer import archive_opener
    from sinks.clickhouse import ClickHouseHistory
    from sinks.derivations import live_config

    client = history_client(settings)
    try:
        history = ClickHouseHistory(client)
        config = live_config(history)  # the live derivation's parameters
        if road == "history":
            return history_snapshot(
                client,
                agent_id,
                as_of=moment,
                user_id=user_id,
                session_id=session_id,
                episodes=episodes,
                config=config,
            )
        with archive_opener(settings) as open_event:  # sealed events open with the keys
            if open_event is None and _has_sealed(client, agent_id):
                raise EngramError(
                    f"the archive of {agent_id!r} is sealed and its keys are not at hand"
                    " (they are on the broker, with the master key): start `engram up`, or"
                    " set ENGRAM_KAFKA_BOOTSTRAP (and ENGRAM_MASTER_KEY if it is not in"
                    " $ENGRAM_HOME); `engram history` answers from the history alone"
                )
            return take_snapshot(
                history,
                agent_id,
                config=config,
                as_of=moment,
                user_id=user_id,
                session_id=session_id,
                episodes=episodes,
                open_event=open_event,
            )
    except ClickHouseError as error:
        raise EngramError(f"history query failed: {error}") from None
    finally:
        client.close()


def _has_sealed(client: Client, agent_id: str) -> bool:
    """Whether ``agent_id``'s archive holds a sealed payload (keys needed to replay)."""
    from schemas.sealed import SEALED_HEADER

    found = client.query(
        "SELECT count() FROM events WHERE agent_id = {a:String}"
        " AND startsWith(payload, unhex({h:String}))",
        parameters={"a": agent_id, "h": SEALED_HEADER.hex()},
    )
    return bool(found.result_rows[0][0])


def print_time_travel(console: Console, snap: Snapshot) -> None:
    """A snapshot as tables, with its memories and their retention."""
    from engram.views import print_snapshot

    print_snapshot(console, snap)
    at = snap.retention_at.isoformat() if snap.retention_at else "?"
    table = Table(
        "memory", "layer", "kind", "importance", "retention", "recalls", "text",
        title=f"memories ({snap.road}), retention at {at}",
    )  # fmt: skip
    for m in snap.memory_items:
        text = (m.text or "")[:60]
        table.add_row(
            m.memory_id[:8], m.layer, m.kind, f"{m.importance:.1f}", f"{m.retention:.3f}",
            str(m.reinforcements), text,
        )  # fmt: skip
    console.print(table)
