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
from processors.consolidation import Consolidation, ConsolidationState
from processors.episodes import Episodes, EpisodesState
from processors.facts import Facts, FactsState
from processors.ids import derived_id
from processors.memories import Change, Memories, MemoryItem
from processors.persona import Persona, PersonaState, Skills, SkillsState
from processors.working import SessionState, WorkingMemory
from schemas import (
    ClockTicked,
    DerivedEvent,
    EpisodeClosed,
    Event,
    FactAsserted,
    FactRetracted,
    FactSet,
    FeedbackGiven,
    MemoryRecalled,
    Model,
    PersonaUpdated,
    PersonaVersionBody,
    PersonaVersioned,
    SkillBody,
    SkillUpdated,
    ToolCalled,
    ToolResult,
    WorkingUpdated,
)


class AgentState(Model):
    """Serialised memory of one agent: what is needed to resume the fold exactly.

    ``recent_ids`` is the base64 of the 16-byte ids of the agent's last
    ``dedupe_window`` events, oldest first, packed end to end.
    """

    agent_id: str
    seq: int = -1
    recent_ids: str = ""
    sessions: list[SessionState] = []
    episodes: EpisodesState = EpisodesState()
    memories: list[MemoryItem] = []
    consolidation: ConsolidationState = ConsolidationState()
    facts: FactsState = FactsState()
    persona: PersonaState = PersonaState()
    skills: SkillsState = SkillsState()

    def recent(self) -> list[bytes]:
        packed = base64.b64decode(self.recent_ids)
        return [packed[i : i + 16] for i in range(0, len(packed), 16)]


Scoped = tuple[type[DerivedEvent], Model, str | None, str | None]
"""A change with the session and user it belongs to."""


def scoped(changes: list[Change], session_id: str | None, user_id: str | None) -> list[Scoped]:
    return [(kind, body, session_id, user_id) for kind, body in changes]


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
        self.working = WorkingMemory(
            state.sessions, config.working_turns, config.working, config.scoring
        )
        self.episodes = Episodes(state.episodes, config.episodes, config.scoring)
        self.memories = Memories(state.memories, config.forgetting, config.promotion)
        self.consolidation = Consolidation(
            state.consolidation, config.consolidation, config.scoring
        )
        self.facts = Facts(state.facts)
        self.persona = Persona(state.persona)
        self.skills = Skills(state.skills)

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
        changes = self._changes(event)
        return tuple(
            kind(  # every derived type has a typed ``body``; the pairs are built to match
                event_id=derived_id(event.event_id, idx),
                agent_id=event.agent_id,
                session_id=session_id,
                user_id=user_id,
                occurred_at=event.occurred_at,
                source_event_id=event.event_id,
                seq=self.seq,
                idx=idx,
                config_version=self.config.version,
                body=body,  # type: ignore[call-arg]  # DerivedEvent subclasses declare body
            )
            for idx, (kind, body, session_id, user_id) in enumerate(changes)
        )

    def _changes(self, event: Event) -> list[Scoped]:
        """Every memory change ``event`` makes, in a fixed order: working memory,
        episodes and their memories, consolidation, reinforcement, forgetting, facts,
        persona, skills. Each carries the session and user it belongs to: the event's,
        except for episodes and memories, which keep their own (a tick that closes an
        episode has neither)."""
        here = (event.session_id, event.user_id)
        changes: list[Scoped] = []
        working = self.working.apply(event)
        if working is not None:
            changes.append((WorkingUpdated, working, *here))
        episodes = self.episodes.apply(event)
        owners = {new.memory_id: (new.session_id, new.user_id) for new in episodes.memories}
        for body in episodes.closed:
            session_id, user_id = owners.get(body.episode_id, here)
            changes.append((EpisodeClosed, body, session_id, user_id))
            self.consolidation.add(body, user_id)
        for new in episodes.memories:
            changes += scoped(self.memories.create(new), new.session_id, new.user_id)
        for new in self.consolidation.due(self.agent_id, event.occurred_at):
            changes += scoped(self.memories.create(new), new.session_id, new.user_id)
        changes += scoped(self._long_term(event), *here)
        return changes

    def _long_term(self, event: Event) -> list[Change]:
        at = event.occurred_at
        match event:
            case MemoryRecalled(body=body):
                return self.memories.recalled(body.memory_ids, at, "recalled")
            case FeedbackGiven(body=body) if body.useful:
                return self.memories.recalled([body.memory_id], at, "useful feedback")
            case FeedbackGiven(body=body):
                return self.memories.corrected(
                    body.memory_id, at, body.correction or "negative feedback"
                )
            case ClockTicked():
                return self.memories.sweep(at)
            case FactAsserted() | FactRetracted():
                fact = self.facts.apply(event)
                return [] if fact is None else [(FactSet, fact)]
            case PersonaUpdated():
                version = self.persona.apply(event)
                if version is None:
                    return []
                doc = PersonaVersionBody(**version.model_dump(exclude={"source_event_id"}))
                return [(PersonaVersioned, doc)]
            case ToolCalled() | ToolResult():
                skill = self.skills.apply(event)
                return [] if skill is None else [(SkillUpdated, SkillBody(**skill.model_dump()))]
            case _:
                return []

    def state(self) -> AgentState:
        return AgentState(
            agent_id=self.agent_id,
            seq=self.seq,
            recent_ids=base64.b64encode(b"".join(self.recent)).decode(),
            sessions=self.working.state(),
            episodes=self.episodes.state(),
            memories=self.memories.state(),
            consolidation=self.consolidation.state(),
            facts=self.facts.state(),
            persona=self.persona.state(),
            skills=self.skills.state(),
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
