"""Memory snapshots: what a stateless agent loads when it starts.

A snapshot is an agent's memory as the processors hold it — the working memory
of its open sessions, the tail of its episodes, its current long-term facts, its
persona and skills — plus the log position it reflects (the per-agent sequence
of the last event folded into it).

Two ways to the same state, both exact:

* the latest snapshot starts from the fold state the worker last checkpointed into
  the ClickHouse history (``agent_states``, written when it saves the state, see
  :data:`streams.pipeline.STATE_SAVE_EVERY`) and folds the archived events after it,
  if any;
* a snapshot ``as_of`` a moment folds the agent's archived events that occurred
  at or before that moment, in sequence order, as from the first one. It is the same
  fold the worker ran, so it needs no model, no vector and no clock; its episodes are
  the ones the fold closed, its memories carry their retention at that moment.
  (For a log whose event times never go back, that is exactly the log's prefix up
  to the moment; :mod:`engram.history` answers the same question from the
  ClickHouse history alone, the second road.) It starts from the last checkpoint
  the worker kept by position (``agent_checkpoints``) before the moment's cut when
  one is exactly what the fold from the first event holds there
  (:func:`replay_start`), and folds only the events after it: the same result,
  byte for byte, without folding the whole log.

Everything in a :class:`Snapshot` is JSON-serialisable (``model_dump(mode="json")``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any

from engram.results import DEFAULT_EPISODES, Position, Snapshot, SnapshotMemory
from processors import AgentMemory, AgentState, MemoryConfig, Step
from processors.forgetting import ForgettingParams, retention
from processors.rebase import in_memory
from processors.state import SessionState
from schemas import (
    BadEvent,
    Codec,
    EpisodeBody,
    EpisodeClosed,
    Event,
    ForkedChangeBody,
    MemoryForked,
    MemoryRolledBack,
)
from sinks.clickhouse import ArchivedEvent, Checkpoint, ClickHouseHistory, LogPrefix
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
    latest snapshot reads its episode tail from the history. An agent that began as a
    fork lists, after its own episodes, those of its source's snapshot as of the fork
    (by replay here, :func:`engram.history.episode_tail` for the latest), up to
    ``episodes`` in all; each episode names the agent that closed it. Raises
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
    read = open_event or _clear_reader()
    folded = _fold(history, agent_id, as_of, config, read)
    memory, position, closed = folded.memory, folded.position, folded.closed
    if position.seq < 0:
        when = "" if as_of is None else f" at or before {as_of.isoformat()}"
        raise UnknownAgent(f"no events of agent {agent_id!r} in the history{when}")
    state = memory.state()
    from engram.history import episode_tail, rebases  # engram.history imports this module

    if closed is None:
        tail = episode_tail(history.client, agent_id, user_id=user_id, as_of=None, limit=episodes)
    else:
        spans, fork = rebases(history.client, agent_id, as_of)

        def kept(episode: dict[str, Any]) -> bool:
            mine = user_id is None or episode["user_id"] == user_id
            return mine and in_memory(episode["seq"], spans)

        found = [e for e in reversed(closed) if kept(e)]
        if len(found) < episodes and folded.before is not None:
            more = episodes - len(found)
            found += _episodes_before(history, agent_id, folded.before, kept, more, config, read)
        tail = found[:episodes]
        if fork is not None and len(tail) < episodes:
            tail += _inherited(history, fork, user_id, episodes - len(tail), config, read)
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


def _inherited(
    history: ClickHouseHistory,
    fork: ForkedChangeBody,
    user_id: str | None,
    need: int,
    config: MemoryConfig,
    read: OpenEvent,
) -> list[dict[str, Any]]:
    """The episodes an agent that began as ``fork`` lists after its own: the last
    ``need`` (of ``user_id`` when given) its source's snapshot as of the fork's moment
    lists by replay (its rollbacks by then and its own fork count). Empty when the
    history holds no event of the source by then."""
    try:
        source = take_snapshot(
            history, fork.source_agent_id, user_id=user_id, as_of=fork.at, episodes=need,
            config=config, list_memories=False, open_event=read,
        )  # fmt: skip
    except UnknownAgent:
        return []
    return source.episodes


@dataclass
class _Run:
    """A fold in progress over archived rows: the memory, the last event folded (its
    sequence and time), how many were folded and skipped, the episodes it closed."""

    memory: AgentMemory
    last_seq: int
    last_at: datetime | None = None
    folded: int = 0
    skipped: int = 0
    closed: list[dict[str, Any]] = field(default_factory=list)

    def fold(
        self, rows: Iterable[ArchivedEvent], history: ClickHouseHistory, read: OpenEvent
    ) -> None:
        """Fold ``rows`` (in sequence order) as the worker folded them."""
        for archived in rows:
            event = _opened(read, archived.payload)
            if event is None:  # bad, or sealed under a destroyed key (an erased subject)
                self.skipped += 1
                continue
            step = _step(self.memory, event, history, read)
            if step.seq is None:
                continue  # a duplicate: the worker dropped it too
            self.folded += 1
            self.last_at, self.last_seq = archived.occurred_at, archived.seq
            self.closed.extend(
                episode_record(d.body, d.session_id, d.user_id, archived.seq, self.memory.agent_id)
                for d in step.derived
                if isinstance(d, EpisodeClosed)
            )


@dataclass(frozen=True)
class _Folded:
    """A fold's result; ``closed``: every episode it closed, oldest first, None when it
    started from the latest checkpoint; ``before``: the sequence of the kept checkpoint
    a fold as of a moment started from (the episodes closed up to it are not in
    ``closed``), None when it started from the first event."""

    memory: AgentMemory
    position: Position
    closed: list[dict[str, Any]] | None
    before: int | None


def _fold(
    history: ClickHouseHistory,
    agent_id: str,
    as_of: datetime | None,
    config: MemoryConfig,
    read: OpenEvent,
) -> _Folded:
    """The fold up to ``as_of`` (None: every archived event, from the latest checkpoint)."""
    if as_of is None:
        return _fold_latest(history, agent_id, config, read)
    start = replay_start(history, agent_id, as_of, config, read)
    if start is None:
        run = _Run(AgentMemory(AgentState(agent_id=agent_id), config), last_seq=-1)
    else:
        run = _Run(AgentMemory(start.state, config), start.seq, start.last_at, start.events)
    run.fold(history.agent_log(agent_id, after_seq=run.last_seq, until=as_of), history, read)
    position = Position(
        seq=run.last_seq, last_event_at=run.last_at, events_folded=run.folded, skipped=run.skipped
    )
    return _Folded(run.memory, position, run.closed, None if start is None else start.seq)


def _fold_latest(
    history: ClickHouseHistory, agent_id: str, config: MemoryConfig, read: OpenEvent
) -> _Folded:
    """From the worker's latest checkpoint (or the first event) to the archive's end;
    ``events_folded`` counts the events after the checkpoint."""
    start = history.checkpoint(agent_id)
    state = _state_of(start) if start is not None else AgentState(agent_id=agent_id)
    run = _Run(AgentMemory(state, config), last_seq=state.seq)
    run.fold(history.agent_log(agent_id, after_seq=state.seq), history, read)
    if run.last_at is None and start is not None:
        run.last_at = _last_event_at(history, agent_id, state.seq)
    position = Position(
        seq=run.last_seq, last_event_at=run.last_at, events_folded=run.folded, skipped=run.skipped
    )
    return _Folded(run.memory, position, None if start is not None else run.closed, None)


@dataclass(frozen=True)
class Start:
    """A kept checkpoint a replay as of a moment starts from: the fold's state after
    the event with sequence ``seq``, which occurred at ``last_at``; ``events``: how
    many events the fold from the first one had folded by then (``seq + 1``)."""

    state: AgentState
    seq: int
    last_at: datetime | None
    events: int


def replay_start(
    history: ClickHouseHistory,
    agent_id: str,
    as_of: datetime,
    config: MemoryConfig,
    read: OpenEvent,
) -> Start | None:
    """The kept checkpoint (``agent_checkpoints``) a replay as of ``as_of`` starts from,
    or None: start from the first event.

    Exact by construction: the fold from the checkpoint then gives, byte for byte, what
    the fold from the first event gives, because the checkpoint is the fold state of
    the very events that fold would read before it. It is used only when

    * it was made under ``config`` (same version, so same parameters);
    * every archived event up to it occurred at or before ``as_of`` (the replay cuts
      the log by event time, in sequence order: a checkpoint after an event that
      occurred later than ``as_of`` holds an event the replay leaves out);
    * the agent has no erasure receipt (the archive lost rows the checkpoints folded);
    * the archive holds every sequence from 0 up to it (none purged) and ``read`` opens
      them all: one sealed event per subject is opened (a subject's events open with
      its keys, or none does once they are destroyed), the clear ones were decoded by
      the fold that archived them;
    * a log that begins with a ``memory.forked`` has its source's past, up to the
      fork's sequence, whole and open to ``read`` the same way (a rollback's past is
      the agent's own prefix, checked already).

    Otherwise (and when the checkpoint's state is not of this agent at that sequence)
    the replay starts from the first event: slower, never different.
    """
    found = history.retained_checkpoint(agent_id, config.version, until=as_of)
    if found is None:
        return None
    prefix = history.log_prefix(agent_id, found.seq)
    if not _intact(history, prefix, read):
        return None
    state = _state_of(found)
    if state.agent_id != agent_id or state.seq != found.seq:
        return None
    return Start(state, found.seq, prefix.last_at, prefix.events)


def _intact(history: ClickHouseHistory, prefix: LogPrefix, read: OpenEvent) -> bool:
    """Whether ``prefix`` is whole and open to ``read`` (see :func:`replay_start`), and
    so is the past of the source it forks from, if it does."""
    if not prefix.whole or not all(_opened(read, raw) is not None for raw in prefix.sealed):
        return False
    if prefix.first_type != MemoryForked.TYPE:
        return True
    first = next(iter(history.agent_log(prefix.agent_id, upto_seq=0)), None)
    fork = None if first is None else _opened(read, first.payload)
    if not isinstance(fork, MemoryForked):
        return False
    source = history.log_prefix(fork.body.source_agent_id, fork.body.source_seq)
    return _intact(history, source, read)


def _episodes_before(
    history: ClickHouseHistory,
    agent_id: str,
    before: int,
    kept: Callable[[dict[str, Any]], bool],
    need: int,
    config: MemoryConfig,
    read: OpenEvent,
) -> list[dict[str, Any]]:
    """The last ``need`` episodes that are ``kept`` closed at or before sequence
    ``before``, newest first, as the fold from the first event closes them:
    each stretch between two kept checkpoints is folded again from the earlier one
    (the first stretch from the first event), the latest stretch first, until enough
    are found. ``before`` is a checkpoint :func:`replay_start` accepted, so the events
    up to it are whole and open, and so are the kept checkpoints before it."""
    found: list[dict[str, Any]] = []
    upto = before
    while len(found) < need and upto >= 0:
        earlier = history.retained_checkpoint(agent_id, config.version, below=upto)
        state = _state_of(earlier) if earlier is not None else AgentState(agent_id=agent_id)
        if earlier is not None and state.seq != earlier.seq:
            state = AgentState(agent_id=agent_id)
        run = _Run(AgentMemory(state, config), last_seq=state.seq)
        run.fold(history.agent_log(agent_id, after_seq=state.seq, upto_seq=upto), history, read)
        found += [e for e in reversed(run.closed) if kept(e)]
        upto = state.seq
    return found[:need]


@cache
def _clear_reader() -> OpenEvent:
    """The reader of clear payloads (one codec: making one loads every schema)."""
    return Codec().decode


def _state_of(checkpoint: Checkpoint) -> AgentState:
    """A checkpoint's fold state: the worker stores ``{"memory": ..., "positions": ...}``
    (``streams.pipeline.StoredState``), a bare ``AgentState`` is read as well."""
    doc = json.loads(checkpoint.state)
    return AgentState.model_validate(doc.get("memory", doc))


def _opened(read: OpenEvent, payload: bytes) -> Event | None:
    """The archived event, or None when ``read`` cannot open it (bad, or shredded)."""
    try:
        return read(payload)
    except BadEvent:
        return None


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
    body: EpisodeBody, session_id: str | None, user_id: str | None, seq: int, agent_id: str
) -> dict[str, Any]:
    """An episode as a snapshot lists it: its ``episode.closed`` body (without the
    source ids), the session and user it belongs to, the agent whose log closed it
    (``agent_id``: the snapshot's agent, or for a fork the source it inherited the
    episode from) and the sequence in that log that closed it (``seq``)."""
    record = body.model_dump(mode="json", exclude={"sources"})
    record.update(session_id=session_id, user_id=user_id, seq=seq, agent_id=agent_id)
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
