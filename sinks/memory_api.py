"""The seed interfaces (long-term, episodic, MemCube) as reads over the ClickHouse
projections, and the event each of their writes is.

Writes are events. engram has one way in: an event published to the log
(``engram.Memory.publish`` / ``publish_many``). So the seeds' ``Set``, ``Append``
and ``add`` are not methods that write here: ``set_event``, ``delete_event``,
``append_event``, ``end_session_event`` and ``add_event`` only *build* the
validated event (a fresh ``event_id``, ``occurred_at`` now unless given) and do
no I/O; the caller publishes it::

    facts = LongTermMemory(client)
    memory.publish(facts.set_event("kiko", "city", "上海", namespace="profile"))
    ...  # once the worker has folded it:
    facts.get("kiko", "city", namespace="profile")  # '上海'

Reads are queries over the views of ``sinks.clickhouse.MIGRATIONS`` (``facts``,
``episodes``, ``memories``) through any clickhouse-connect ``Client``: chdb, a
ClickHouse server, or the HTTP endpoint of ``engram up``.

Guarantees:

- isolation: every query binds the agent as a server-side parameter
  (``{agent_id:String}``), never formatted into the SQL, so no argument can
  read another agent's rows; an empty agent id is a ``ValueError``;
- consistency: reads see what the worker has flushed (the views are functions
  of ``memory_changes``, read ``FINAL``); an event just published shows up once
  it is folded, not before;
- time: every datetime returned is aware UTC; every datetime given must be aware.

Not here: ``Memory.recall`` (MemCube's vector/hybrid recall) comes with the
Qdrant projection; it is not imitated over ClickHouse. MemCube's ``consolidate``
has no request event: consolidation is decided by the fold (flashbulb promotion
when a memory is made, abstraction when a window of event time closes), so
:meth:`MemCube.consolidate` is a read of its result, the L3 memories.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable
from datetime import UTC, datetime
from typing import Annotated, Any

from clickhouse_connect.driver.client import Client
from pydantic import AwareDatetime, BeforeValidator

from schemas import (
    FactAsserted,
    FactAssertedBody,
    FactRetracted,
    FactRetractedBody,
    InteractionBody,
    InteractionRecorded,
    Model,
    Role,
    SessionEnded,
    SessionEndedBody,
)

LAYERS = ("L1", "L2", "L3")
MAX_LIMIT = 10_000


def _as_utc(value: object) -> object:
    """chdb returns naive datetimes that are UTC; a server may return aware ones."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return value


UtcTime = Annotated[AwareDatetime, BeforeValidator(_as_utc)]
"""An aware UTC datetime, whatever the client returned."""


# -- rows -------------------------------------------------------------------


class FactRow(Model):
    """One version of a long-term fact, valid over ``[valid_from, valid_to)``;
    ``valid_to`` None means it is the current value."""

    agent_id: str
    namespace: str
    key: str
    value: str
    valid_from: UtcTime
    valid_to: UtcTime | None
    seq: int
    config_version: str

    @property
    def qualified_key(self) -> str:
        return f"{self.namespace}/{self.key}"


class Episode(Model):
    """One closed L2 episode (seed 001's ``EpisodicEntry``)."""

    agent_id: str
    episode_id: str
    session_id: str | None
    user_id: str | None
    summary: str
    importance: float
    sentiment: float
    confidence: float
    entities: tuple[str, ...]
    turn_count: int
    started_at: UtcTime
    ended_at: UtcTime
    cut: str
    previous_episode_id: str | None
    summariser: str
    seq: int
    config_version: str


class MemoryRow(Model):
    """The current state of one memory item (seed 002's memory entry)."""

    agent_id: str
    memory_id: str
    user_id: str | None
    session_id: str | None
    kind: str
    layer: str
    text: str
    importance: float
    sentiment: float
    strength: float
    reinforcements: int
    last_reinforced_at: UtcTime
    promoted: bool
    forgotten: bool
    forgotten_at: UtcTime | None
    created_at: UtcTime
    config_version: str


# -- SQL --------------------------------------------------------------------
# Only these constant fragments are ever joined into SQL; every value is bound.

_FACTS = """SELECT agent_id, namespace, key, value, valid_from, valid_to, seq, config_version
FROM facts
WHERE agent_id = {agent_id:String}"""
_FACT_NAMESPACE = " AND namespace = {namespace:String}"
_FACT_KEY = " AND key = {key:String}"
_FACT_CURRENT = " AND valid_to IS NULL"
_FACT_AS_OF = (
    " AND valid_from <= {as_of:DateTime64(3, 'UTC')}"
    " AND (valid_to IS NULL OR valid_to > {as_of:DateTime64(3, 'UTC')})"
)
_FACT_ORDER = " ORDER BY namespace, key, valid_from, seq"

# A change made at a clock.tick (an idle episode closed by it, a consolidation it
# triggers) carries the tick's envelope, whose session and user are empty; so the
# session and user of an episode or memory are those of its first source turn
# (for a semantic memory: of the first turn of its first episode), found in the
# raw-event archive, falling back to the envelope.
_ORIGINS = """turns AS (
    SELECT toString(event_id) AS turn_id, session_id, user_id
    FROM events FINAL
    WHERE agent_id = {agent_id:String} AND type = 'interaction.recorded'
),
episode_turns AS (
    SELECT JSONExtractString(body, 'episode_id') AS episode_id,
           JSONExtract(body, 'sources', 'Array(String)')[1] AS turn_id
    FROM memory_changes FINAL
    WHERE agent_id = {agent_id:String} AND type = 'episode.closed'
)"""

_EPISODES = f"""WITH {_ORIGINS}
SELECT * FROM (
    SELECT
        ep.agent_id AS agent_id,
        ep.episode_id AS episode_id,
        coalesce(t.session_id, ep.session_id) AS session_id,
        coalesce(t.user_id, ep.user_id) AS user_id,
        ep.summary AS summary,
        ep.importance AS importance,
        ep.sentiment AS sentiment,
        ep.confidence AS confidence,
        ep.entities AS entities,
        ep.turn_count AS turn_count,
        ep.started_at AS started_at,
        ep.ended_at AS ended_at,
        ep.cut AS cut,
        ep.previous_episode_id AS previous_episode_id,
        ep.summariser AS summariser,
        ep.seq AS seq,
        ep.config_version AS config_version
    FROM episodes AS ep
    LEFT JOIN episode_turns AS et ON et.episode_id = ep.episode_id
    LEFT JOIN turns AS t ON t.turn_id = et.turn_id
    WHERE ep.agent_id = {{agent_id:String}}
)
WHERE 1"""
_EPISODE_BEFORE = " AND ended_at < {before:DateTime64(3, 'UTC')}"
_EPISODE_SESSION = " AND session_id = {session_id:String}"
_EPISODE_NEWEST_FIRST = " ORDER BY ended_at DESC, seq DESC, episode_id LIMIT {limit:UInt32}"
_EPISODE_IN_ORDER = " ORDER BY started_at, seq, episode_id LIMIT {limit:UInt32}"

_MEMORIES = f"""WITH {_ORIGINS},
memory_sources AS (
    SELECT memory_id,
           argMax(JSONExtract(body, 'sources', 'Array(String)')[1], (seq, idx)) AS source
    FROM memory_changes FINAL
    WHERE agent_id = {{agent_id:String}} AND type = 'memory.created'
    GROUP BY memory_id
)
SELECT * FROM (
    SELECT
        m.agent_id AS agent_id,
        m.memory_id AS memory_id,
        coalesce(t.user_id, m.user_id) AS user_id,
        if(m.kind = 'semantic', NULL, coalesce(t.session_id, m.session_id)) AS session_id,
        m.kind AS kind,
        m.layer AS layer,
        m.text AS text,
        m.importance AS importance,
        m.sentiment AS sentiment,
        m.strength AS strength,
        m.reinforcements AS reinforcements,
        m.last_reinforced_at AS last_reinforced_at,
        m.promoted AS promoted,
        m.forgotten AS forgotten,
        if(m.forgotten, toNullable(m.forgotten_at), NULL) AS forgotten_at,
        m.created_at AS created_at,
        m.config_version AS config_version
    FROM memories AS m
    LEFT JOIN memory_sources AS ms ON ms.memory_id = m.memory_id
    LEFT JOIN episode_turns AS et ON et.episode_id = ms.source
    LEFT JOIN turns AS t ON t.turn_id = if(et.turn_id != '', et.turn_id, ms.source)
    WHERE m.agent_id = {{agent_id:String}} AND m.kind != ''
)
WHERE has({{layers:Array(String)}}, layer)"""
_MEMORY_LIVE = " AND NOT forgotten"
_MEMORY_USER = " AND user_id = {user_id:String}"
_MEMORY_ORDER = " ORDER BY created_at, memory_id"


# -- argument checks ----------------------------------------------------------


def _text(value: object, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _moment(value: object, name: str) -> datetime:
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise ValueError(f"{name} must be an aware datetime, got {value!r}")
    return value.astimezone(UTC)


def _limit(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_LIMIT:
        raise ValueError(f"limit must be an int in 1..{MAX_LIMIT}, got {value!r}")
    return value


def _layers(layers: Collection[str] | None) -> list[str]:
    if layers is None:
        return list(LAYERS)
    if isinstance(layers, str):
        raise ValueError(f"layers must be a collection of layers, not the string {layers!r}")
    wrong = [layer for layer in layers if layer not in LAYERS]
    if wrong:
        raise ValueError(f"unknown layers {wrong!r}; layers are {LAYERS}")
    return list(layers)


def _query(client: Client, sql: str, parameters: dict[str, Any]) -> list[dict[str, Any]]:
    return list(client.query(sql, parameters=parameters).named_results())


def _envelope(agent_id: str, occurred_at: datetime | None) -> dict[str, Any]:
    """Envelope fields of a new event: a fresh id, the time now unless given."""
    at = datetime.now(UTC) if occurred_at is None else _moment(occurred_at, "occurred_at")
    return {"event_id": uuid.uuid4(), "agent_id": _text(agent_id, "agent_id"), "occurred_at": at}


def interaction_event(
    agent_id: str,
    session_id: str,
    role: Role,
    content: str,
    *,
    user_id: str | None = None,
    intent: str | None = None,
    entities: Iterable[str] = (),
    importance: float | None = None,
    sentiment: float | None = None,
    confidence: float | None = None,
    occurred_at: datetime | None = None,
) -> InteractionRecorded:
    """An ``interaction.recorded`` (one turn) to publish; scores given here win over
    the pipeline's estimates. Raises ValueError (pydantic's) if it is invalid."""
    body = InteractionBody(
        role=role,
        content=content,
        intent=intent,
        entities=list(entities),
        importance=importance,
        sentiment=sentiment,
        confidence=confidence,
    )
    return InteractionRecorded(
        **_envelope(agent_id, occurred_at),
        session_id=_text(session_id, "session_id"),
        user_id=user_id,
        body=body,
    )


# -- seed 001: long-term memory ---------------------------------------------


class LongTermMemory:
    """Seed 001's ``LongTermMemoryStore``: key/values per agent and namespace, read
    from the ``facts`` view (bi-temporal: every value keeps its validity interval).

    ``Set`` is :meth:`set_event` (``fact.asserted``), a delete is
    :meth:`delete_event` (``fact.retracted``): both build the event, the caller
    publishes it. A new value closes the previous one instead of erasing it, so
    :meth:`get` and :meth:`list_by_agent` answer for any past moment (``as_of``).
    """

    def __init__(self, client: Client) -> None:
        self.client = client

    def facts(
        self,
        agent_id: str,
        *,
        namespace: str | None = None,
        key: str | None = None,
        as_of: datetime | None = None,
    ) -> list[FactRow]:
        """Versions of the agent's facts, by namespace, key and validity: those valid
        at ``as_of`` when given, else the current ones."""
        sql = _FACTS
        params: dict[str, Any] = {"agent_id": _text(agent_id, "agent_id")}
        if namespace is not None:
            sql += _FACT_NAMESPACE
            params["namespace"] = _text(namespace, "namespace")
        if key is not None:
            sql += _FACT_KEY
            params["key"] = _text(key, "key")
        if as_of is None:
            sql += _FACT_CURRENT
        else:
            sql += _FACT_AS_OF
            params["as_of"] = _moment(as_of, "as_of")
        return [FactRow(**row) for row in _query(self.client, sql + _FACT_ORDER, params)]

    def get(
        self,
        agent_id: str,
        key: str,
        *,
        namespace: str = "default",
        as_of: datetime | None = None,
    ) -> str | None:
        """The value of ``namespace/key`` valid at ``as_of`` (else the current one),
        or None when it had none (never set, or retracted)."""
        rows = self.facts(agent_id, namespace=namespace, key=key, as_of=as_of)
        return max(rows, key=lambda row: row.seq).value if rows else None

    def list_by_agent(
        self,
        agent_id: str,
        *,
        namespace: str | None = None,
        as_of: datetime | None = None,
    ) -> dict[str, str]:
        """key → value of the agent's facts valid at ``as_of`` (else current), sorted;
        keys are namespace-qualified (``"profile/city"``) when ``namespace`` is None."""
        rows = sorted(self.facts(agent_id, namespace=namespace, as_of=as_of), key=_by_seq)
        pairs = ((row.key if namespace else row.qualified_key, row.value) for row in rows)
        return dict(sorted(dict(pairs).items()))

    def history(self, agent_id: str, key: str, *, namespace: str = "default") -> list[FactRow]:
        """Every version of ``namespace/key``, oldest first, closed ones included."""
        sql = _FACTS + _FACT_NAMESPACE + _FACT_KEY + _FACT_ORDER
        params = {
            "agent_id": _text(agent_id, "agent_id"),
            "namespace": _text(namespace, "namespace"),
            "key": _text(key, "key"),
        }
        return [FactRow(**row) for row in _query(self.client, sql, params)]

    @staticmethod
    def set_event(
        agent_id: str,
        key: str,
        value: str,
        *,
        namespace: str = "default",
        user_id: str | None = None,
        confidence: float | None = None,
        occurred_at: datetime | None = None,
    ) -> FactAsserted:
        """The ``fact.asserted`` that sets ``namespace/key`` to ``value`` from
        ``occurred_at`` (default now). No I/O: publish it with ``engram.Memory``."""
        body = FactAssertedBody(namespace=namespace, key=key, value=value, confidence=confidence)
        return FactAsserted(**_envelope(agent_id, occurred_at), user_id=user_id, body=body)

    @staticmethod
    def delete_event(
        agent_id: str,
        key: str,
        *,
        namespace: str = "default",
        user_id: str | None = None,
        reason: str | None = None,
        occurred_at: datetime | None = None,
    ) -> FactRetracted:
        """The ``fact.retracted`` that ends ``namespace/key``'s current value at
        ``occurred_at`` (its history stays). No I/O: publish it with ``engram.Memory``."""
        body = FactRetractedBody(namespace=namespace, key=key, reason=reason)
        return FactRetracted(**_envelope(agent_id, occurred_at), user_id=user_id, body=body)


def _by_seq(row: FactRow) -> int:
    return row.seq


# -- seed 001: episodic memory ----------------------------------------------


class EpisodicMemory:
    """Seed 001's ``EpisodicMemoryStore`` over the ``episodes`` view.

    An episode is not appended directly: turns are (:meth:`append_event`, an
    ``interaction.recorded``), and the fold cuts them into episodes at
    ``session.ended`` (:meth:`end_session_event`), an idle gap or a turn count,
    each with a summary and scores.
    """

    def __init__(self, client: Client) -> None:
        self.client = client

    def list_by_agent(
        self, agent_id: str, *, limit: int = 50, before: datetime | None = None
    ) -> list[Episode]:
        """The agent's latest ``limit`` episodes, newest first (by end), those that
        ended strictly before ``before`` when given."""
        sql = _EPISODES
        params: dict[str, Any] = {"agent_id": _text(agent_id, "agent_id"), "limit": _limit(limit)}
        if before is not None:
            sql += _EPISODE_BEFORE
            params["before"] = _moment(before, "before")
        return self._episodes(sql + _EPISODE_NEWEST_FIRST, params)

    def list_by_session(
        self, agent_id: str, session_id: str, *, limit: int = MAX_LIMIT
    ) -> list[Episode]:
        """The episodes of one session, in the order they happened."""
        params: dict[str, Any] = {
            "agent_id": _text(agent_id, "agent_id"),
            "session_id": _text(session_id, "session_id"),
            "limit": _limit(limit),
        }
        return self._episodes(_EPISODES + _EPISODE_SESSION + _EPISODE_IN_ORDER, params)

    def _episodes(self, sql: str, params: dict[str, Any]) -> list[Episode]:
        return [Episode(**row) for row in _query(self.client, sql, params)]

    @staticmethod
    def append_event(
        agent_id: str,
        session_id: str,
        role: Role,
        content: str,
        *,
        user_id: str | None = None,
        intent: str | None = None,
        entities: Iterable[str] = (),
        importance: float | None = None,
        sentiment: float | None = None,
        confidence: float | None = None,
        occurred_at: datetime | None = None,
    ) -> InteractionRecorded:
        """The ``interaction.recorded`` that appends one turn to the session's open
        episode. No I/O: publish it with ``engram.Memory``."""
        return interaction_event(
            agent_id,
            session_id,
            role,
            content,
            user_id=user_id,
            intent=intent,
            entities=entities,
            importance=importance,
            sentiment=sentiment,
            confidence=confidence,
            occurred_at=occurred_at,
        )

    @staticmethod
    def end_session_event(
        agent_id: str,
        session_id: str,
        *,
        user_id: str | None = None,
        reason: str | None = None,
        occurred_at: datetime | None = None,
    ) -> SessionEnded:
        """The ``session.ended`` that closes the session's open episode. No I/O."""
        return SessionEnded(
            **_envelope(agent_id, occurred_at),
            session_id=_text(session_id, "session_id"),
            user_id=user_id,
            body=SessionEndedBody(reason=reason),
        )


# -- seed 002: MemCube ------------------------------------------------------


class MemCube:
    """Seed 002's ``MemorySystem`` over the ``memories`` view: L2 episodic and
    single-turn memories, L3 core (flashbulb) and semantic memories, with their
    strength, reinforcements and forgetting.

    ``add`` is :meth:`add_event` (an ``interaction.recorded``; the fold routes it
    to L1 working memory, L2 and, for a flashbulb moment, L3). ``consolidate`` is
    a read (:meth:`consolidate`), ``recall`` comes with the Qdrant projection.
    """

    def __init__(self, client: Client) -> None:
        self.client = client

    def list_memories(
        self,
        agent_id: str,
        *,
        layers: Collection[str] | None = None,
        include_forgotten: bool = False,
        user_id: str | None = None,
    ) -> list[MemoryRow]:
        """The agent's memories in ``layers`` (default all), oldest first; forgotten
        ones only with ``include_forgotten``; only ``user_id``'s when given."""
        sql = _MEMORIES
        params: dict[str, Any] = {
            "agent_id": _text(agent_id, "agent_id"),
            "layers": _layers(layers),
        }
        if not include_forgotten:
            sql += _MEMORY_LIVE
        if user_id is not None:
            sql += _MEMORY_USER
            params["user_id"] = _text(user_id, "user_id")
        return [MemoryRow(**row) for row in _query(self.client, sql + _MEMORY_ORDER, params)]

    def consolidate(self, agent_id: str, *, user_id: str | None = None) -> list[MemoryRow]:
        """What consolidation has made of the agent's memories: its L3 memories,
        promoted (flashbulb, kept verbatim) or semantic (abstracted from episodes).

        There is no event that asks for a consolidation: the fold consolidates as
        the log goes (a flashbulb moment at once, an abstraction when its window of
        event time closes), so this reads the result instead of forcing it."""
        return self.list_memories(agent_id, layers=("L3",), user_id=user_id)

    @staticmethod
    def add_event(
        agent_id: str,
        session_id: str,
        content: str,
        *,
        role: Role = "user",
        user_id: str | None = None,
        intent: str | None = None,
        entities: Iterable[str] = (),
        importance: float | None = None,
        sentiment: float | None = None,
        confidence: float | None = None,
        occurred_at: datetime | None = None,
    ) -> InteractionRecorded:
        """The ``interaction.recorded`` that adds ``content`` to memory. A session is
        required: turns outside a session make no episode. No I/O."""
        return interaction_event(
            agent_id,
            session_id,
            role,
            content,
            user_id=user_id,
            intent=intent,
            entities=entities,
            importance=importance,
            sentiment=sentiment,
            confidence=confidence,
            occurred_at=occurred_at,
        )
