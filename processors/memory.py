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
from datetime import datetime
from typing import Any, Final, final
from uuid import UUID

from processors.build import fields, trusted
from processors.config import MemoryConfig
from processors.consolidation import Consolidation
from processors.episodes import Episodes
from processors.erasure import (
    Owner,
    open_sessions_of,
    purge_episodes,
    purge_facts,
    purge_memories,
    purge_persona,
    purge_sessions,
)
from processors.facts import Facts
from processors.ids import text_of, uuid5_of
from processors.memories import Change, Memories
from processors.persona import Persona
from processors.rebase import Past, RebaseRefused, Replayed, fold_past, rebase_changes, rename
from processors.skills import Skills
from processors.state import (
    AgentState,
)
from processors.working import WorkingMemory
from schemas import (
    DERIVED_TYPES,
    AgentForked,
    AgentRolledBack,
    ClockTicked,
    DerivedEvent,
    EpisodeClosed,
    ErasedBody,
    Event,
    FactAsserted,
    FactRetracted,
    FactSet,
    FeedbackGiven,
    ForkedChangeBody,
    InteractionRecorded,
    MemoryForked,
    MemoryRecalled,
    MemoryRolledBack,
    Model,
    PersonaUpdated,
    PersonaVersionBody,
    PersonaVersioned,
    RolledBackChangeBody,
    SessionEnded,
    SessionStarted,
    SkillBody,
    SkillUpdated,
    SubjectErased,
    SubjectErasureRequested,
    ToolCalled,
    ToolResult,
    WorkingSet,
    WorkingUpdated,
)

Scoped = tuple[type[DerivedEvent], Model, str | None, str | None]
"""A change with the session and user it belongs to."""

DERIVED_GIVEN: Final = fields(
    {
        "event_id",
        "agent_id",
        "session_id",
        "user_id",
        "occurred_at",
        "source_event_id",
        "seq",
        "idx",
        "config_version",
        "body",
    }
)
"""The fields a derived event is built with (the others take their defaults)."""

QUIET: Final[frozenset[type[Event]]] = frozenset(
    {InteractionRecorded, SessionStarted, SessionEnded, WorkingSet, SubjectErasureRequested}
)
"""Event types that make no long-term change (no reinforcement, sweep, fact,
persona or skill): :meth:`AgentMemory._long_term` has nothing to say about them."""


@final
class Step:
    """What folding one event did: ``seq`` is None for a dropped duplicate. Immutable
    (``Final`` fields). A plain class, not a dataclass: mypyc compiles its
    ``__init__``, where a dataclass's generated one runs as plain Python (~3 % of
    the fold's time, once per event)."""

    def __init__(self, seq: int | None, derived: tuple[DerivedEvent, ...]) -> None:
        self.seq: Final = seq
        self.derived: Final = derived

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Step):
            return NotImplemented
        return self.seq == other.seq and self.derived == other.derived

    def __hash__(self) -> int:
        return hash((self.seq, self.derived))

    def __repr__(self) -> str:
        return f"Step(seq={self.seq!r}, derived={self.derived!r})"


DUPLICATE: Final = Step(None, ())

_REBASES: Final[frozenset[type[Event]]] = frozenset({MemoryRolledBack, MemoryForked})

_SKILL_GIVEN: Final = fields(SkillBody.model_fields)
"""A skill's record is a ``SkillBody`` field for field (``SkillBody(**record.model_dump())``)."""

_TYPE: Final[dict[type[DerivedEvent], str]] = {kind: kind.TYPE for kind in DERIVED_TYPES}
"""Each derived type's ``type`` (a class attribute costs more to read on a model)."""

_VERSION: Final[dict[type[DerivedEvent], int]] = {
    kind: kind.SCHEMA_VERSION for kind in DERIVED_TYPES
}
"""Each derived type's current schema version, which its events declare."""


class AgentMemory:
    """The live, mutable fold of one agent; ``state()`` serialises it."""

    def __init__(self, state: AgentState, config: MemoryConfig) -> None:
        self.agent_id = state.agent_id
        self.config = config
        self.version = config.version
        self.seq = state.seq
        # the ids as ints (``UUID.int``), packed into bytes only by ``state()``
        recent = (int.from_bytes(key) for key in state.recent())
        self.recent: deque[int] = deque(recent, maxlen=config.dedupe_window)
        self.recent_set = set(self.recent)
        self.working = WorkingMemory(
            state.sessions, config.working_turns, config.working, config.scoring
        )
        self.episodes = Episodes(state.episodes, config.episodes, config.scoring, state.agent_id)
        self.memories = Memories(state.memories, config.forgetting, config.promotion)
        self.consolidation = Consolidation(
            state.consolidation, config.consolidation, config.scoring
        )
        self.facts = Facts(state.facts)
        self.persona = Persona(state.persona)
        self.skills = Skills(state.skills)
        self.session_users = dict(state.session_users)
        self.persona_users = list(state.persona_users)

    @classmethod
    def empty(cls, agent_id: str, config: MemoryConfig) -> AgentMemory:
        return cls(AgentState(agent_id=agent_id), config)

    def apply(self, event: Event) -> Step:
        """Fold one event of this agent; duplicates of a recent ``event_id`` do nothing.
        A rollback or a fork needs its past: :meth:`roll_back`, :meth:`fork`."""
        if type(event) in _REBASES:
            raise RebaseRefused(f"{event.type} needs the past it rebases on")
        fields = event.__dict__  # see processors.build: reading fields
        source = fields["event_id"]
        if not self._count(source.int):
            return DUPLICATE
        return Step(self.seq, self._derive(event, fields, source))

    def take_place(self, event_id: UUID) -> int | None:
        """An event whose content is gone (sealed under an erased subject's destroyed
        key) keeps its place: it takes the next sequence number and derives nothing, so
        a replay after an erasure numbers the agent's other events as the fold that met
        them first did. None for a duplicate of a recent id."""
        return self.seq if self._count(event_id.int) else None

    def seen(self, event: Event) -> bool:
        """Whether ``event`` is a duplicate of a recent one (folding it does nothing)."""
        return event.event_id.int in self.recent_set

    def _count(self, key: int) -> bool:
        """Take the next sequence for the event with id ``key``; False: a duplicate."""
        recent_set = self.recent_set
        if key in recent_set:
            return False
        recent = self.recent
        if len(recent) == recent.maxlen:
            recent_set.discard(recent[0])
        recent.append(key)
        recent_set.add(key)
        self.seq += 1
        return True

    def roll_back(self, event: MemoryRolledBack, past: Past, *, checked: bool = False) -> Step:
        """Fold a rollback: the memory becomes the fold of ``past`` (this agent's events
        up to ``event.body.to_seq``: the caller reads them from the archive, which holds
        them since they were folded before the rollback) that occurred at or before
        ``event.body.to`` (:meth:`Past.at`: the state an as-of snapshot at that moment
        folds, late events included), while the sequence and the
        dedupe window go on (the rollback takes the next sequence). Emits
        ``agent.rolled_back`` (counts), then the changes that bring the projections in
        line (:func:`processors.rebase.rebase_changes`). Raises RebaseRefused for a
        ``to_seq`` beyond this agent's sequence or a past of another agent (unless
        ``checked``: a replay of a rollback the worker accepted)."""
        body = event.body
        if self.seen(event):
            return DUPLICATE
        if past.agent_id != self.agent_id or (body.to_seq > self.seq and not checked):
            raise RebaseRefused(
                f"cannot roll {self.agent_id!r} back to seq {body.to_seq}: "
                f"its last seq is {self.seq}"
            )
        restored = fold_past(past.at(body.to_seq, body.to), self.config)
        changes, counts = rebase_changes(self, restored, event.occurred_at)
        self._count(event.event_id.int)
        record = RolledBackChangeBody(
            request_id=event.event_id, to=body.to, to_seq=body.to_seq, **counts.model_dump()
        )
        self._adopt(restored)
        return self._step(event, [(AgentRolledBack, record, None, None), *changes])

    def fork(self, event: MemoryForked, past: Past) -> Step:
        """Fold a fork on this (new) agent: its memory becomes the fold of ``past`` (the
        source's events up to ``source_seq`` that occurred at or before ``at``, as for a
        rollback) with its ids renamed for this agent
        (:func:`processors.rebase.rename`). Emits ``agent.forked`` (counts), then a
        ``memory.created`` for each memory, facts, persona, skills and working sessions.
        Raises RebaseRefused when this agent has events already, or when the past is
        not the source's or does not reach ``source_seq``."""
        body = event.body
        if self.seen(event):
            return DUPLICATE
        if self.seq >= 0:
            raise RebaseRefused(f"cannot fork onto {self.agent_id!r}: it has events already")
        if past.agent_id != body.source_agent_id or past.last_seq < body.source_seq:
            raise RebaseRefused(
                f"the archive of {body.source_agent_id!r} does not reach seq {body.source_seq}"
            )
        copied = rename(
            fold_past(past.at(body.source_seq, body.at), self.config), self.agent_id, self.config
        )
        changes, counts = rebase_changes(self, copied, event.occurred_at)
        self._count(event.event_id.int)
        record = ForkedChangeBody(
            request_id=event.event_id,
            source_agent_id=body.source_agent_id,
            at=body.at,
            source_seq=body.source_seq,
            **counts.model_dump(),
        )
        self._adopt(copied)
        return self._step(event, [(AgentForked, record, None, None), *changes])

    def _adopt(self, other: Replayed) -> None:
        """Take ``other``'s memory content; sequence and dedupe window stay this one's."""
        memory = other.memory
        self.working = memory.working
        self.episodes = memory.episodes
        self.memories = memory.memories
        self.consolidation = memory.consolidation
        self.facts = memory.facts
        self.persona = memory.persona
        self.skills = memory.skills
        self.session_users = dict(memory.session_users)
        self.persona_users = list(memory.persona_users)

    def _step(self, event: Event, changes: list[Scoped]) -> Step:
        fields = event.__dict__
        return Step(self.seq, self._build(changes, fields, fields["event_id"]))

    def _derive(
        self, event: Event, fields: dict[str, Any], source: UUID
    ) -> tuple[DerivedEvent, ...]:
        """The derived events of ``event``, whose ``__dict__`` is ``fields``."""
        name = text_of(source.int)  # str(source), without the call to UUID.__str__
        return self._build(self._changes(event, name, fields), fields, source, name)

    def _build(
        self,
        changes: list[Scoped],
        fields: dict[str, Any],
        source: UUID,
        name: str | None = None,
    ) -> tuple[DerivedEvent, ...]:
        """``changes`` as derived events of the event whose ``__dict__`` is ``fields``."""
        if name is None:
            name = str(source)
        if not changes:
            return ()
        agent_id = fields["agent_id"]
        at = fields["occurred_at"]
        seq = self.seq
        version = self.version
        derived: list[DerivedEvent] = []
        for idx, (kind, body, session_id, user_id) in enumerate(changes):
            values = {
                "event_id": uuid5_of(f"{name}:{idx}"),  # derived_id(source, idx)
                "type": _TYPE[kind],
                "agent_id": agent_id,
                "session_id": session_id,
                "user_id": user_id,
                "occurred_at": at,
                "schema_version": _VERSION[kind],
                "source_event_id": source,
                "seq": seq,
                "idx": idx,
                "config_version": version,
                "body": body,
            }
            derived.append(trusted(kind, values, DERIVED_GIVEN))
        return tuple(derived)

    def _changes(
        self, event: Event, name: str | None = None, fields: dict[str, Any] | None = None
    ) -> list[Scoped]:
        """Every memory change ``event`` makes, in a fixed order: working memory,
        episodes and their memories, consolidation, reinforcement, forgetting, facts,
        persona, skills. Each carries the session and user it belongs to: the event's,
        except for episodes and memories, which keep their own (a tick that closes an
        episode has neither). ``name`` is ``str(event.event_id)`` and ``fields`` the
        event's ``__dict__``, when known."""
        if fields is None:
            fields = event.__dict__
        if type(event) is SubjectErasureRequested:
            return [(SubjectErased, self._erase(event), None, None)]
        here_session, here_user = fields["session_id"], fields["user_id"]
        changes: list[Scoped] = []
        was_open = here_session is not None and here_session in self.working.sessions
        working = self.working.apply(event, name)
        if working is not None:
            users = self.session_users
            if here_session is not None and not was_open:
                # a new life of the session: the user of a life that ended is not its user
                # (a saved state forgets them; the fold must not depend on when it saved)
                users.pop(here_session, None)
            if here_user is not None and here_session is not None and here_session not in users:
                users[here_session] = here_user
            # a delta carries the session's task, variables and scratchpad whole: one made
            # by an event naming no user (the agent's own turn) is the session user's data
            owner = here_user
            if owner is None and here_session is not None:
                owner = users.get(here_session)
            changes.append((WorkingUpdated, working, here_session, owner))
            crowded = self.working.crowd_out(here_session)
            if crowded is not None:
                changes.append((WorkingUpdated, crowded, None, None))
        closed, memories = self.episodes.step(event, name)
        if closed:
            owners = {new.memory_id: (new.session_id, new.user_id) for new in memories}
            for episode in closed:
                session_id, user_id = owners.get(episode.episode_id, (here_session, here_user))
                changes.append((EpisodeClosed, episode, session_id, user_id))
                self.consolidation.add(episode, user_id)
        create = self.memories.create
        for new in memories:
            for kind, body in create(new):
                changes.append((kind, body, new.session_id, new.user_id))
        for new in self.consolidation.due(self.agent_id, fields["occurred_at"]):
            for kind, body in create(new):
                changes.append((kind, body, new.session_id, new.user_id))
        if type(event) not in QUIET:
            for kind, body in self._long_term(event):
                changes.append((kind, body, here_session, here_user))
        return changes

    def _long_term(self, event: Event) -> list[Change]:
        """The long-term changes of ``event``: reinforcement, a sweep, a fact, the
        persona, a skill. Told apart by the event's type, not a ``match`` of class
        patterns: each pattern is an ``isinstance`` call (events are never subclassed)."""
        at = event.occurred_at
        if type(event) is MemoryRecalled:
            return self.memories.recalled(event.body.memory_ids, at, "recalled")
        if type(event) is FeedbackGiven:
            body = event.body
            if body.useful:
                return self.memories.recalled([body.memory_id], at, "useful feedback")
            return self.memories.corrected(
                body.memory_id, at, body.correction or "negative feedback"
            )
        if type(event) is ClockTicked:
            return self.memories.sweep(at)
        if type(event) is FactAsserted or type(event) is FactRetracted:
            fact = self.facts.apply(event)
            return [] if fact is None else [(FactSet, fact)]
        if type(event) is PersonaUpdated:
            version = self.persona.apply(event)
            if version is None:
                return []
            self.persona_users.append(event.user_id)
            doc = PersonaVersionBody(**version.model_dump(exclude={"source_event_id"}))
            return [(PersonaVersioned, doc)]
        if type(event) is ToolCalled or type(event) is ToolResult:
            skill = self.skills.apply(event)
            if skill is None:
                return []
            return [(SkillUpdated, trusted(SkillBody, dict(skill.__dict__), _SKILL_GIVEN))]
        return []

    def _erase(self, event: SubjectErasureRequested) -> ErasedBody:
        """Drop everything of the request's subject (:mod:`processors.erasure`)."""
        owner = Owner(event.body.subject, self.agent_id)
        mine = open_sessions_of(self.episodes, owner)
        sessions = purge_sessions(self.working, self._session_users(), mine, owner)
        return ErasedBody(
            subject=owner.subject,
            request_id=event.event_id,
            requested_at=event.body.requested_at,
            sessions=sessions,
            episodes=purge_episodes(self.episodes, self.consolidation, owner),
            memories=purge_memories(self.memories, owner),
            facts=purge_facts(self.facts, owner),
            persona=purge_persona(self.persona, self.persona_users, owner),
        )

    def _session_users(self) -> dict[str, str]:
        """``session_users`` of the open sessions only (the others are forgotten)."""
        live = self.working.sessions
        self.session_users = {s: u for s, u in sorted(self.session_users.items()) if s in live}
        return self.session_users

    def state(self) -> AgentState:
        return AgentState(
            agent_id=self.agent_id,
            seq=self.seq,
            recent_ids=base64.b64encode(b"".join(k.to_bytes(16) for k in self.recent)).decode(),
            sessions=self.working.state(),
            episodes=self.episodes.state(),
            memories=self.memories.state(),
            consolidation=self.consolidation.state(),
            facts=self.facts.state(),
            persona=self.persona.state(),
            skills=self.skills.state(),
            session_users=self._session_users(),
            persona_users=list(self.persona_users),
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
