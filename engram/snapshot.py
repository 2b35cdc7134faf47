"""Memory snapshots: what a stateless agent loads when it starts.

A snapshot is an agent's memory as the processors hold it — the working memory
of its open sessions, the tail of its episodes, its current long-term facts, its
persona and skills — plus the log position it reflects (the per-agent sequence
of the last event folded into it).

Two ways to the same state, both exact:

* the latest snapshot starts from the fold state the worker checkpoints into the
  ClickHouse history with every flush (``agent_states``) and folds the archived
  events after it, if any;
* a snapshot ``as_of`` a moment folds the agent's archived log from its first
  event, in sequence order, up to the last event that occurred at or before that
  moment. It is the same fold the worker ran, so it needs no model, no vector and
  no clock.

Everything in a :class:`Snapshot` is JSON-serialisable (``model_dump(mode="json")``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from engram.results import DEFAULT_EPISODES, Position, Snapshot
from processors import AgentMemory, AgentState, MemoryConfig
from schemas import BadEvent, Codec
from sinks.clickhouse import ClickHouseHistory


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
) -> Snapshot:
    """The snapshot of ``agent_id`` now (``as_of`` None) or as of an aware moment.

    ``session_id`` narrows working memory to that session; ``user_id`` narrows the
    episodes to that user. Raises :class:`UnknownAgent` when the history has no
    event of the agent, ``ValueError`` for a naive ``as_of`` or a negative
    ``episodes``.
    """
    if as_of is not None and as_of.tzinfo is None:
        raise ValueError("as_of must be an aware datetime (UTC offset included)")
    if episodes < 0:
        raise ValueError("episodes must be 0 or more")
    config = config or MemoryConfig()
    memory, position = _fold(history, agent_id, as_of, config)
    if position.seq < 0:
        raise UnknownAgent(f"no events of agent {agent_id!r} in the history")
    state = memory.state()
    tail = history.episodes_of(agent_id, user_id=user_id, until_seq=position.seq, limit=episodes)
    return Snapshot(
        agent_id=agent_id,
        user_id=user_id,
        session_id=session_id,
        as_of=as_of,
        position=position,
        working=_working(state, session_id),
        episodes=[_jsonable(row) for row in tail],
        facts=_facts(state, as_of),
        persona=_persona(state),
        skills=[s.model_dump(mode="json") for s in state.skills.skills],
        memories=_memory_counts(state),
        config_version=config.version,
    )


def _fold(
    history: ClickHouseHistory, agent_id: str, as_of: datetime | None, config: MemoryConfig
) -> tuple[AgentMemory, Position]:
    start = history.checkpoint(agent_id) if as_of is None else None
    if start is not None:
        # the checkpoint is the worker's stored state: {"memory": ..., "positions": ...}
        state = AgentState.model_validate(json.loads(start.state)["memory"])
    else:
        state = AgentState(agent_id=agent_id)
    memory = AgentMemory(state, config)
    codec = Codec()
    folded = skipped = 0
    last_at: datetime | None = None
    for archived in history.agent_log(agent_id, after_seq=memory.seq, until=as_of):
        try:
            event = codec.decode(archived.payload)
        except BadEvent:
            skipped += 1
            continue
        memory.apply(event)
        folded += 1
        last_at = archived.occurred_at
    if last_at is None and start is not None:
        last_at = _last_event_at(history, agent_id, memory.seq)
    return memory, Position(
        seq=memory.seq, last_event_at=last_at, events_folded=folded, skipped=skipped
    )


def _last_event_at(history: ClickHouseHistory, agent_id: str, seq: int) -> datetime | None:
    for archived in history.agent_log(agent_id, after_seq=seq - 1):
        return archived.occurred_at
    return None


def _working(state: AgentState, session_id: str | None) -> list[dict[str, Any]]:
    return [
        s.model_dump(mode="json")
        for s in state.sessions
        if session_id is None or s.session_id == session_id
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


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, datetime):
            value = (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()
        out[key] = value
    return out
