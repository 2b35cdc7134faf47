"""The fold of one agent's log: dedupe, per-agent sequence, then every processor.

``AgentMemory.apply`` is deterministic: the same state and event give the same
result on every replay (no I/O, no wall clock, no randomness; derived ids are
``uuid5`` of the source event id). ``evolve`` and ``as_of`` are the pure faces of
it over serialised states.
"""

from __future__ import annotations

import base64
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from processors.config import MemoryConfig
from processors.ids import derived_id
from processors.working import SessionState, WorkingMemory
from schemas import DerivedEvent, Event, Model, WorkingUpdated


class AgentState(Model):
    """Serialised memory of one agent: what is needed to resume the fold exactly.

    ``recent_ids`` is the base64 of the 16-byte ids of the agent's last
    ``dedupe_window`` events, oldest first, packed end to end.
    """

    agent_id: str
    seq: int = -1
    recent_ids: str = ""
    sessions: list[SessionState] = []

    def recent(self) -> list[bytes]:
        packed = base64.b64decode(self.recent_ids)
        return [packed[i : i + 16] for i in range(0, len(packed), 16)]


@dataclass(frozen=True)
class Step:
    """What folding one event did: ``seq`` is None for a dropped duplicate."""

    seq: int | None
    derived: tuple[DerivedEvent, ...]


class AgentMemory:
    """The live, mutable fold of one agent; ``state()`` serialises it."""

    def __init__(self, state: AgentState, config: MemoryConfig) -> None:
        self.agent_id = state.agent_id
        self.config = config
        self.seq = state.seq
        self.recent: deque[bytes] = deque(state.recent(), maxlen=config.dedupe_window)
        self.recent_set = set(self.recent)
        self.working = WorkingMemory(state.sessions, config.working_turns)

    @classmethod
    def empty(cls, agent_id: str, config: MemoryConfig) -> AgentMemory:
        return cls(AgentState(agent_id=agent_id), config)

    def apply(self, event: Event) -> Step:
        """Fold one event of this agent; duplicates of a recent ``event_id`` do nothing."""
        key = event.event_id.bytes
        if key in self.recent_set:
            return Step(None, ())
        self._remember(key)
        self.seq += 1
        return Step(self.seq, self._derive(event))

    def _remember(self, key: bytes) -> None:
        if len(self.recent) == self.recent.maxlen:
            self.recent_set.discard(self.recent[0])
        self.recent.append(key)
        self.recent_set.add(key)

    def _derive(self, event: Event) -> tuple[DerivedEvent, ...]:
        body = self.working.apply(event)
        if body is None:
            return ()
        return (
            WorkingUpdated(
                event_id=derived_id(event.event_id, 0),
                agent_id=event.agent_id,
                session_id=event.session_id,
                user_id=event.user_id,
                occurred_at=event.occurred_at,
                source_event_id=event.event_id,
                seq=self.seq,
                config_version=self.config.version,
                body=body,
            ),
        )

    def state(self) -> AgentState:
        return AgentState(
            agent_id=self.agent_id,
            seq=self.seq,
            recent_ids=base64.b64encode(b"".join(self.recent)).decode(),
            sessions=self.working.state(),
        )


def evolve(
    state: AgentState, event: Event, config: MemoryConfig
) -> tuple[AgentState, tuple[DerivedEvent, ...]]:
    """Pure: same state and event, same result, on every replay."""
    memory = AgentMemory(state, config)
    step = memory.apply(event)
    return memory.state(), step.derived


def as_of(
    events: Iterable[Event], moment: datetime, agent_id: str, config: MemoryConfig
) -> AgentState:
    """What the agent remembered at ``moment``: replay the log up to it."""
    memory = AgentMemory.empty(agent_id, config)
    for event in events:
        if event.occurred_at > moment:
            break
        memory.apply(event)
    return memory.state()
