"""Memory snapshots: what a stateless agent loads when it starts.

A snapshot is an agent's memory as the processors hold it — the working memory
of its open sessions, the tail of its episodes, its current long-term facts, its
persona and skills — plus the log position it reflects (the per-agent sequence
of the last event folded into it).

Two ways to the same state, both exact:

* the latest snapshot starts from the fold state the worker checkpoints into the
  ClickHouse history with every flush (``agent_states``) and folds the archived
  events after it, if any;
* a snapshot ``as_of`` a moment folds the agent's archived events that occurred
  at or before that moment, from the first, in sequence order. It is the same fold
  the worker ran, so it needs no model, no vector and no clock; its episodes are
  the ones the fold closed, its memories carry their retention at that moment.
  (For a log whose event times never go back, that is exactly the log's prefix up
  to the moment; :mod:`engram.history` answers the same question from the
  ClickHouse history alone, the second road.)

Everything in a :class:`Snapshot` is JSON-serialisable (``model_dump(mode="json")``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from engram.results import DEFAULT_EPISODES, Position, Snapshot, SnapshotMemory
from processors import AgentMemory, AgentState, MemoryConfig, Step
from processors.forgetting import ForgettingParams, retention
from processors.working import SessionState
from schemas import (
    BadEvent,
    Codec,
    EpisodeBody,
    EpisodeClosed,
    Event,
    MemoryForked,
    MemoryRolledBack,
)
from sinks.clickhouse import ClickHouseHistory
from sinks.keys import OpenEvent


class UnknownAgent(LookupError):
    """The history holds nothing for this agent."""


def take_snapshot(
    history: ClickHouseHistory,
    agent_id: str,
    *,
    user_id: str | None = None,
    session_id: str | None = None,
    as_of: datetime | None = None,
    episodes: int = DEFAULT_EPISODES,
    config: MemoryConfig | None = None,
    list_memories: bool | None = None,
    open_event: OpenEvent | None = None,
) -> Snapshot:
    """The snapshot of ``agent_id`` now (``as_of`` None) or as of an aware moment.

    ``list_memories``: whether ``memory_items`` lists the live memories with their
    retention; by default only as of a moment (time travel). The latest snapshot is
    what an agent loads at start (through MCP, into its context): it keeps the counts
    and leaves the memories to recall.

    ``session_id`` narrows working memory to that session; ``user_id`` narrows the
    episodes and the listed memories to that user. As of a moment, everything comes
    from the fold (the closed episodes are the ``episode.closed`` it derived); the
    latest snapshot reads its episode tail from the history. Raises
    :class:`UnknownAgent` when the history has no event of the agent (at or before
    ``as_of``), ``ValueError`` for a naive ``as_of`` or a negative ``episodes``.

    ``open_event`` reads each archived payload (sealed ones with the keys, see
    :func:`sinks.keys.open_waiting`; None for a shredded event, which the replay skips
    and counts in ``position.skipped``); without it only clear payloads are read.
    """
    if as_of is not None and as_of.tzinfo is None:
        raise ValueError("as_of must be an aware datetime (UTC offset included)")
    if episodes < 0:
        raise ValueError("episodes must be 0 or more")
    config = config or MemoryConfig()
    memory, position, closed = _fold(history, agent_id, as_of, config, open_event)
    if position.seq < 0:
        when = "" if as_of is None else f" at or before {as_of.isoformat()}"
        raise UnknownAgent(f"no events of agent {agent_id!r} in the history{when}")
    state = memory.state()
    if closed is None:
        from engram.history import episode_tail  # engram.history imports this module

        tail = episode_tail(history.client, agent_id, user_id=user_id, as_of=None, limit=episodes)
    else:
        mine = [e for e in reversed(closed) if user_id is None or e["user_id"] == user_id]
        tail = mine[:episodes]
    retention_at = as_of or position.last_event_at
    listed = as_of is not None if list_memories is None else list_memories
    return Snapshot(
        agent_id=agent_id,
        user_id=user_id,
        session_id=session_id,
        as_of=as_of,
        position=position,
        working=working_of(state.sessions, session_id),
        episodes=tail,
        facts=_facts(state, as_of),
        persona=_persona(state),
        skills=[s.model_dump(mode="json") for s in state.skills.skills],
        memories=_memory_counts(state),
        config_version=config.version,
        memory_items=_memory_items(state, retention_at, config.forgetting, user_id)
        if listed
        else [],
        retention_at=retention_at,
        road="replay",
    )


def _fold(
    history: ClickHouseHistory,
    agent_id: str,
    as_of: datetime | None,
    config: MemoryConfig,
    open_event: OpenEvent | None = None,
) -> tuple[AgentMemory, Position, list[dict[str, Any]] | None]:
    """The fold up to ``as_of``, its position and, when it started from the first
    event (not from a checkpoint), every episode it closed, oldest first."""
    start = history.checkpoint(agent_id) if as_of is None else None
    if start is not None:
        # the checkpoint is the worker's stored state: {"memory": ..., "positions": ...}
        state = AgentState.model_validate(json.loads(start.state)["memory"])
    else:
        state = AgentState(agent_id=agent_id)
    memory = AgentMemory(state, config)
    closed: list[dict[str, Any]] | None = None if start is not None else []
    read = open_event or Codec().decode
    folded = skipped = 0
    last_at: datetime | None = None
    last_seq = memory.seq
    for archived in history.agent_log(agent_id, after_seq=memory.seq, until=as_of):
        try:
            event = read(archived.payload)
        except BadEvent:
            event = None
        if event is None:  # bad, or sealed under a destroyed key (an erased subject)
            skipped += 1
            continue
        step = _step(memory, event, history, read)
        if step.seq is None:
            continue  # a duplicate: the worker dropped it too
        folded += 1
        last_at, last_seq = archived.occurred_at, archived.seq
        if closed is not None:
            closed.extend(
                episode_record(d.body, d.session_id, d.user_id, last_seq)
                for d in step.derived
                if isinstance(d, EpisodeClosed)
            )
    if last_at is None and start is not None:
        last_at = _last_event_at(history, agent_id, memory.seq)
        last_seq = memory.seq
    position = Position(seq=last_seq, last_event_at=last_at, events_folded=folded, skipped=skipped)
    return memory, position, closed


def _step(memory: AgentMemory, event: Event, history: ClickHouseHistory, read: OpenEvent) -> Step:
    """Fold one archived event; a rollback or a fork with its past, read from the
    archive as the worker read it (:mod:`streams.past`)."""
    from streams.past import read_past_sync  # only replays that meet one need it

    if isinstance(event, MemoryRolledBack):
        past = read_past_sync(history, read, memory.agent_id, event.body.to_seq)
        return memory.roll_back(event, past, checked=True)
    if isinstance(event, MemoryForked):
        body = event.body
        return memory.fork(
            event, read_past_sync(history, read, body.source_agent_id, body.source_seq)
        )
    return memory.apply(event)


def _last_event_at(history: ClickHouseHistory, agent_id: str, seq: int) -> datetime | None:
    for archived in history.agent_log(agent_id, after_seq=seq - 1):
        return archived.occurred_at
    return None


def working_of(sessions: Iterable[SessionState], session_id: str | None) -> list[dict[str, Any]]:
    """The working memory of the open sessions (or of ``session_id``), by session id."""
    chosen = (s for s in sessions if session_id is None or s.session_id == session_id)
    return [s.model_dump(mode="json") for s in sorted(chosen, key=lambda s: s.session_id)]


def episode_record(
    body: EpisodeBody, session_id: str | None, user_id: str | None, seq: int
) -> dict[str, Any]:
    """An episode as a snapshot lists it: its ``episode.closed`` body (without the
    source ids), the session and user it belongs to and the sequence that closed it."""
    record = body.model_dump(mode="json", exclude={"sources"})
    record.update(session_id=session_id, user_id=user_id, seq=seq)
    return record


def _memory_items(
    state: AgentState, at: datetime | None, params: ForgettingParams, user_id: str | None
) -> list[SnapshotMemory]:
    """The fold's live memories (of ``user_id`` when given) with their retention at ``at``."""
    return [
        SnapshotMemory(
            memory_id=item.memory_id,
            layer=item.layer,
            kind=item.kind,
            importance=item.importance,
            sentiment=item.sentiment,
            user_id=item.user_id,
            created_at=item.created_at,
            last_reinforced_at=item.trace.last_reinforced_at,
            strength_days=item.trace.strength_days,
            reinforcements=item.trace.reinforcements,
            lapses=item.trace.lapses,
            invalidated=item.trace.invalidated,
            promoted=item.promoted,
            retention=1.0 if at is None else retention(item.trace, at, params),
        )
        for item in sorted(state.memories, key=lambda m: m.memory_id)
        if user_id is None or item.user_id == user_id
    ]


def _facts(state: AgentState, as_of: datetime | None) -> list[dict[str, Any]]:
    """The current version of every fact (as of the fold's end)."""
    out = []
    for history in state.facts.facts:
        current = history.versions[-1] if history.versions else None
        if current is None or current.valid_to is not None:
            continue  # retracted
        if as_of is not None and not current.holds_at(as_of):
            continue
        out.append(
            {
                "namespace": history.namespace,
                "key": history.key,
                "value": current.value,
                "valid_from": current.valid_from.isoformat(),
                "confidence": current.confidence,
            }
        )
    return out


def _persona(state: AgentState) -> dict[str, Any] | None:
    versions = state.persona.versions
    return versions[-1].model_dump(mode="json") if versions else None


def _memory_counts(state: AgentState) -> dict[str, int]:
    """Live memories per layer (forgotten ones have left the fold state)."""
    counts = {"L2": 0, "L3": 0}
    for item in state.memories:
        counts[item.layer] += 1
    return counts
