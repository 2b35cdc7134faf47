"""Rollback and fork: an agent's memory set to what a fold of a past log makes of it.

Both are pure. The past is given, never read here: the worker reads it from the
archive (:mod:`streams.past`) and hands it over as a :class:`Past`, the agent's
archived events up to a sequence, in order. :func:`fold_past` folds it into a fresh
memory, resolving on the way every ``memory.rolled_back`` in it (from the prefix of
the same past, which holds every event it needs) and a leading ``memory.forked``
(from the past of the source, :attr:`Past.origin`). :func:`rebase_changes` is the
diff of two memories as derived events: what brings the projections of one in line
with the other (memories forgotten or created again, facts and persona set back,
working sessions replaced).

Replay is exact because the past a rollback or a fork needs is a fixed part of the
archive: the events of an agent up to a sequence that was folded before the request
(the archive is append-only and keyed by sequence, so the same rows on every read).
A shredded event (its subject erased) is left out of the past, as every replay
leaves it out. Known limits of the projections (the fold states are exact): restored
memories carry the rollback's time as their last review in the vector payload, a
skill the past did not have keeps its record, and a fact set back is valid from the
rollback's time in ``fact.set`` (the fold keeps the versions of the past).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from processors.config import MemoryConfig
from processors.forgetting import retention
from processors.ids import uuid5_str
from processors.persona import PersonaVersion, SkillRecord
from processors.state import ConsolidationState, EpisodesState, MemoryItem, SessionState
from schemas import (
    DerivedEvent,
    Event,
    FactSet,
    FactSetBody,
    ForgottenBody,
    MemoryCreated,
    MemoryCreatedBody,
    MemoryForgotten,
    MemoryForked,
    MemoryPromoted,
    MemoryReinforced,
    MemoryRolledBack,
    MemoryWeakened,
    Model,
    PersonaVersionBody,
    PersonaVersioned,
    PromotedBody,
    SkillBody,
    SkillUpdated,
    StrengthChangeBody,
    WorkingBody,
    WorkingUpdated,
)

if TYPE_CHECKING:
    from processors.memory import AgentMemory, Scoped


_Namer = Callable[[str], str]


class RebaseRefused(ValueError):
    """A rollback or fork that cannot apply (the pipeline dead-letters it)."""


@dataclass(frozen=True, slots=True)
class Past:
    """An agent's archived log up to a sequence: ``events`` are ``(seq, event)`` in
    sequence order, shredded ones left out; ``last_seq`` is the last archived sequence
    read (shredded or not; -1: none); ``origin`` is the past of the agent this one was
    forked from, when its log begins with a ``memory.forked``."""

    agent_id: str
    events: tuple[tuple[int, Event], ...]
    last_seq: int = -1
    origin: Past | None = None

    def upto(self, seq: int) -> Past:
        """This past cut after sequence ``seq``."""
        kept = tuple(pair for pair in self.events if pair[0] <= seq)
        return Past(self.agent_id, kept, min(self.last_seq, seq), self.origin)

    def at(self, seq: int, moment: datetime) -> Past:
        """The past a rollback or fork to ``moment`` restores, ``seq`` being the last
        sequence at or before it: the events up to ``seq`` that occurred at or before
        ``moment``, in sequence order. That is what an as-of snapshot at ``moment``
        folds: an event logged before a late one but dated after ``moment`` is left
        out (for a log whose times never go back, the prefix itself)."""
        cut = self.upto(seq)
        kept = tuple(pair for pair in cut.events if pair[1].occurred_at <= moment)
        return Past(self.agent_id, kept, cut.last_seq, self.origin)


@dataclass(frozen=True, slots=True)
class Creation:
    """How a memory entered the derived log: its ``memory.created`` and scope, and its
    ``memory.promoted`` if it had one."""

    body: MemoryCreatedBody
    session_id: str | None
    user_id: str | None
    promoted: PromotedBody | None = None


@dataclass
class Replayed:
    """A fold of a past: the memory, and the creation of every memory it made."""

    memory: AgentMemory
    created: dict[str, Creation] = field(default_factory=dict)

    def note(self, derived: tuple[DerivedEvent, ...]) -> None:
        for event in derived:
            if isinstance(event, MemoryCreated):
                body = event.body
                self.created[body.memory_id] = Creation(body, event.session_id, event.user_id)
            elif isinstance(event, MemoryPromoted) and event.body.memory_id in self.created:
                known = self.created[event.body.memory_id]
                self.created[event.body.memory_id] = Creation(
                    known.body, known.session_id, known.user_id, event.body
                )


def fold_past(past: Past, config: MemoryConfig) -> Replayed:
    """A fresh memory of ``past.agent_id`` folded from ``past`` (see the module docstring)."""
    from processors.memory import AgentMemory  # processors.memory imports this module

    replayed = Replayed(AgentMemory.empty(past.agent_id, config))
    memory = replayed.memory
    for _seq, event in past.events:
        if isinstance(event, MemoryRolledBack):
            # checked when the worker folded it: here the sequence may run behind the
            # archive's (shredded events are left out of a past)
            step = memory.roll_back(event, past.upto(event.body.to_seq), checked=True)
        elif isinstance(event, MemoryForked):
            if past.origin is None:
                raise RebaseRefused(f"the past of {past.agent_id!r} lacks its fork's source")
            step = memory.fork(event, past.origin)
        else:
            step = memory.apply(event)
        replayed.note(step.derived)
    return replayed


# -- renaming (fork) ------------------------------------------------------------------


def renamed_id(agent_id: str, old: str) -> str:
    """The id in agent ``agent_id`` of a memory, episode or turn id of the source."""
    return uuid5_str(f"fork:{agent_id}:{old}")


def rename(replayed: Replayed, agent_id: str, config: MemoryConfig) -> Replayed:
    """``replayed`` as agent ``agent_id``'s: every id that must be unique across agents
    re-derived from ``agent_id`` and the old id (:func:`renamed_id`): memory ids (the
    vector point ids), episode ids and the event ids of open episodes' turns (the
    next episode's id is made from its first turn's). Sources that name renamed
    memories are renamed too; working-memory turns keep their ids (they find the
    source's history)."""
    from processors.memory import AgentMemory

    state = replayed.memory.state()
    names = {old: renamed_id(agent_id, old) for old in replayed.created}

    def name(old: str) -> str:
        return names.get(old) or renamed_id(agent_id, old)

    memories = [
        item.model_copy(update={"memory_id": name(item.memory_id)}) for item in state.memories
    ]
    episodes = _renamed_episodes(state.episodes, name)
    consolidation = _renamed_windows(state.consolidation, name)
    moved = state.model_copy(
        update={
            "agent_id": agent_id,
            "memories": memories,
            "episodes": episodes,
            "consolidation": consolidation,
        }
    )
    out = Replayed(AgentMemory(moved, config))
    for old, creation in replayed.created.items():
        sources = [names.get(s, s) for s in creation.body.sources]
        body = creation.body.model_copy(update={"memory_id": name(old), "sources": sources})
        promoted = creation.promoted
        if promoted is not None:
            promoted = promoted.model_copy(
                update={
                    "memory_id": name(old),
                    "sources": [names.get(s, s) for s in promoted.sources],
                }
            )
        out.created[name(old)] = Creation(body, creation.session_id, creation.user_id, promoted)
    return out


def _renamed_episodes(state: EpisodesState, name: _Namer) -> EpisodesState:
    open_ = [
        episode.model_copy(
            update={
                "turns": [
                    t.model_copy(update={"event_id": name(t.event_id)}) for t in episode.turns
                ]
            }
        )
        for episode in state.open
    ]
    previous = {user: name(episode_id) for user, episode_id in state.previous.items()}
    return state.model_copy(update={"open": open_, "previous": previous})


def _renamed_windows(state: ConsolidationState, name: _Namer) -> ConsolidationState:
    windows = [
        window.model_copy(
            update={
                "episodes": [
                    e.model_copy(update={"episode_id": name(e.episode_id)}) for e in window.episodes
                ]
            }
        )
        for window in state.windows
    ]
    return state.model_copy(update={"windows": windows})


# -- the diff -------------------------------------------------------------------------


class Counts(Model):
    """How many changes of each kind a rebase made."""

    forgotten: int = 0
    restored: int = 0
    facts: int = 0
    persona: int = 0
    sessions: int = 0


def rebase_changes(now: AgentMemory, then: Replayed, at: datetime) -> tuple[list[Scoped], Counts]:
    """The derived changes that take the projections of ``now`` to those of
    ``then.memory``, at ``at``, in a fixed order (memories by id, facts by key, persona,
    skills by name, working sessions by id), and how many of each kind."""
    memories = list(_memory_changes(now, then, at))
    facts = list(_fact_changes(now, then.memory, at))
    persona = list(_persona_changes(now, then.memory, at))
    skills = list(_skill_changes(now, then.memory))
    sessions = list(_working_changes(now, then.memory))
    counts = Counts(
        forgotten=sum(1 for c in memories if c[0] is MemoryForgotten),
        restored=sum(1 for c in memories if c[0] is MemoryCreated),
        facts=len(facts),
        persona=len(persona),
        sessions=len({c[2] for c in sessions if c[2] is not None}),
    )
    return [*memories, *facts, *persona, *skills, *sessions], counts


def _memory_changes(now: AgentMemory, then: Replayed, at: datetime) -> Iterator[Scoped]:
    before, after = now.memories.items, then.memory.memories.items
    params = now.config.forgetting
    for memory_id in sorted(set(before) - set(after)):
        item = before[memory_id]
        value = min(1.0, max(0.0, float(retention(item.trace, at, params))))
        body = ForgottenBody(memory_id=memory_id, retention=value)
        yield MemoryForgotten, body, None, item.user_id
    for memory_id in sorted(after):
        item, old = after[memory_id], before.get(memory_id)
        if old == item:
            continue
        creation = then.created.get(memory_id)
        if old is None or old.layer != item.layer or old.promoted != item.promoted:
            if creation is None:
                raise RebaseRefused(f"memory {memory_id} of the past has no memory.created")
            yield from _recreated(item, creation)
        elif old.trace != item.trace:
            yield _strength(item, old.trace.strength_days, None, item.user_id)


def _recreated(item: MemoryItem, creation: Creation) -> Iterator[Scoped]:
    """A memory created again as it was made, then promoted and reinforced (or
    weakened) to where the past left it."""
    body = creation.body
    yield MemoryCreated, body, creation.session_id, creation.user_id
    if item.promoted and creation.promoted is not None:
        yield MemoryPromoted, creation.promoted, creation.session_id, creation.user_id
    trace = item.trace
    if trace.reinforcements or trace.invalidated or trace.strength_days != body.strength:
        yield _strength(item, body.strength, creation.session_id, creation.user_id)


def _strength(item: MemoryItem, than: float, session: str | None, user: str | None) -> Scoped:
    """The absolute strength of ``item`` now, as a reinforcement (or a weakening, when
    below ``than``)."""
    trace = item.trace
    kind: type[DerivedEvent] = MemoryReinforced if trace.strength_days >= than else MemoryWeakened
    body = StrengthChangeBody(
        memory_id=item.memory_id,
        strength=trace.strength_days,
        reinforcements=trace.reinforcements,
        reason="rebased",
        invalidated=trace.invalidated,
    )
    return kind, body, session, user


def _fact_changes(now: AgentMemory, then: AgentMemory, at: datetime) -> Iterator[Scoped]:
    keys = sorted(set(now.facts.histories) | set(then.facts.histories))
    for namespace, key in keys:
        old, new = now.facts.current(namespace, key), then.facts.current(namespace, key)
        if old == new:
            continue
        versions = then.facts.histories.get((namespace, key), [])
        current = versions[-1] if versions and new is not None else None
        body = FactSetBody(
            namespace=namespace,
            key=key,
            value=new,
            valid_from=at,
            previous_value=old,
            confidence=current.confidence if current is not None else None,
        )
        yield FactSet, body, None, current.user_id if current is not None else None


def _persona_changes(now: AgentMemory, then: AgentMemory, at: datetime) -> Iterator[Scoped]:
    old, new = now.persona.current(), then.persona.current()
    if _content(old) == _content(new):
        return
    if new is None:
        body = PersonaVersionBody(version=1, updated_at=at)
        yield PersonaVersioned, body, None, None
        return
    body = PersonaVersionBody(**new.model_dump(exclude={"source_event_id"}))
    yield PersonaVersioned, body, None, then.persona_users[-1] if then.persona_users else None


def _content(version: PersonaVersion | None) -> object:
    return None if version is None else version.content()


def _skill_changes(now: AgentMemory, then: AgentMemory) -> Iterator[Scoped]:
    for name, record in sorted(then.skills.records.items()):
        if now.skills.records.get(name) != record:
            yield SkillUpdated, _skill(record), None, None


def _skill(record: SkillRecord) -> SkillBody:
    return SkillBody(**record.model_dump())


def _working_changes(now: AgentMemory, then: AgentMemory) -> Iterator[Scoped]:
    """Sessions open now and not then expire; each session of ``then`` that differs
    from now is replaced whole (cleared, then its turns added)."""
    before = {s.session_id: s for s in now.working.state()}
    after = {s.session_id: s for s in then.working.state()}
    gone = sorted(set(before) - set(after))
    if gone:
        yield WorkingUpdated, WorkingBody(size=0, tokens=0, expired=gone), None, None
    users = then.session_users
    for sid in sorted(after):
        session = after[sid]
        if before.get(sid) != session:
            yield WorkingUpdated, _replaced(session, before.get(sid)), sid, users.get(sid)


def _replaced(session: SessionState, old: SessionState | None) -> WorkingBody:
    return WorkingBody(
        added=list(session.turns),
        evicted=len(old.turns) if old is not None else 0,
        size=len(session.turns),
        tokens=sum(t.tokens for t in session.turns),
        task=session.task,
        variables=dict(session.variables),
        scratchpad=session.scratchpad,
        cleared=True,
    )


def undone_spans(rollbacks: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The stretches of an agent's log that its rollbacks undid, as open intervals
    ``(to_seq, seq)``, latest first.

    ``rollbacks``: ``(seq, to_seq)`` of every rollback the agent's fold applied (its
    ``agent.rolled_back``), in any order. The memory after the log is the memory of a
    path through it: from the end back to the latest rollback, then on from its
    ``to_seq`` (what the rollback restored), and so on. A rollback inside a stretch a
    later one undid is off that path: the later one restored a state from before it,
    so what it had undone is back. An event with a sequence inside a span (``to_seq <
    s < seq``) is not part of the memory's past; the rollback itself is."""
    spans: list[tuple[int, int]] = []
    for seq, to_seq in sorted(set(rollbacks), reverse=True):
        if spans and seq > spans[-1][0]:
            continue  # undone by a later rollback, or the same position twice
        spans.append((to_seq, seq))
    return spans


def in_memory(seq: int, spans: Sequence[tuple[int, int]]) -> bool:
    """Whether the event at ``seq`` is on the memory's path (see :func:`undone_spans`)."""
    return not any(low < seq < high for low, high in spans)
