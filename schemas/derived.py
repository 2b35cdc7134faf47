"""Derived event types on ``engram.memory``: every change of a memory item."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal
from uuid import UUID

from pydantic import Field

from schemas.base import INT64_MAX, DerivedEvent, Importance, Model, Signed, Unit, UtcMillis

Layer = Literal["L1", "L2", "L3"]


class MemoryCreatedBody(Model):
    """A new memory item. ``strength`` is its forgetting trace's S at creation and
    ``formed_at`` the moment that trace's clock starts: a single turn's time, its
    episode's last turn, or the end of a consolidation window — not necessarily the
    time of the event that closed the episode (version 2; None in version-1 bytes,
    where the event's ``occurred_at`` stands in)."""

    memory_id: str
    layer: Layer
    kind: Literal["turn", "episode", "semantic", "core", "fact"]
    text: str
    importance: Importance
    sentiment: Signed
    confidence: Unit
    entities: list[str] = []
    sources: list[str] = []
    strength: Annotated[float, Field(gt=0)]
    formed_at: UtcMillis | None = None


class MemoryCreated(DerivedEvent):
    TYPE: ClassVar[str] = "memory.created"
    SCHEMA_VERSION: ClassVar[int] = 2
    type: Literal["memory.created"] = "memory.created"
    body: MemoryCreatedBody


class StrengthChangeBody(Model):
    memory_id: str
    strength: Annotated[float, Field(gt=0)]
    reinforcements: Annotated[int, Field(ge=0, le=INT64_MAX)]
    reason: str
    invalidated: bool = False


class MemoryReinforced(DerivedEvent):
    TYPE: ClassVar[str] = "memory.reinforced"
    type: Literal["memory.reinforced"] = "memory.reinforced"
    body: StrengthChangeBody


class MemoryWeakened(DerivedEvent):
    TYPE: ClassVar[str] = "memory.weakened"
    type: Literal["memory.weakened"] = "memory.weakened"
    body: StrengthChangeBody


class PromotedBody(Model):
    memory_id: str
    from_layer: Layer
    to_layer: Layer
    reason: Literal["flashbulb", "abstraction"]
    sources: list[str] = []


class MemoryPromoted(DerivedEvent):
    TYPE: ClassVar[str] = "memory.promoted"
    type: Literal["memory.promoted"] = "memory.promoted"
    body: PromotedBody


class ForgottenBody(Model):
    memory_id: str
    retention: Unit


class MemoryForgotten(DerivedEvent):
    TYPE: ClassVar[str] = "memory.forgotten"
    type: Literal["memory.forgotten"] = "memory.forgotten"
    body: ForgottenBody


class EpisodeBody(Model):
    episode_id: str
    summary: str
    importance: Importance
    sentiment: Signed
    confidence: Unit
    entities: list[str] = []
    turn_count: Annotated[int, Field(ge=0, le=INT64_MAX)]
    started_at: UtcMillis
    ended_at: UtcMillis
    previous_episode_id: str | None = None
    cut: Literal["session_ended", "idle_gap", "turn_count"]
    sources: list[str] = []
    summariser: str


class EpisodeClosed(DerivedEvent):
    TYPE: ClassVar[str] = "episode.closed"
    type: Literal["episode.closed"] = "episode.closed"
    body: EpisodeBody


class FactSetBody(Model):
    """A fact's value from ``valid_from``; ``value`` is None for a retraction."""

    namespace: str
    key: str
    value: str | None = None
    valid_from: UtcMillis
    previous_value: str | None = None
    confidence: Unit | None = None


class FactSet(DerivedEvent):
    TYPE: ClassVar[str] = "fact.set"
    type: Literal["fact.set"] = "fact.set"
    body: FactSetBody


class Turn(Model):
    """One entry of working memory; an offloaded tool result keeps a summary here and
    its full text in history, found by ``event_id``."""

    event_id: str
    role: str
    content: str
    occurred_at: UtcMillis
    tokens: Annotated[int, Field(ge=0, le=INT64_MAX)] = 0
    offloaded: bool = False


class WorkingBody(Model):
    """A change of working memory, as a delta. Folding an agent's deltas in order
    rebuilds every session's working memory exactly, by this rule:

    1. the working memory of every session named in ``expired`` is dropped whole
       (the idle TTL cleared it at a ``clock.tick``; such a delta has no session);
    2. the delta's own session (``session_id``, when there is one) becomes
       ``prepended + working[evicted:] + added``: its ``evicted`` oldest entries
       left, ``prepended`` (at most one entry, role ``summary``: what was
       compressed, including any earlier summary) went in front and ``added``
       (the new turn) at the end.

    ``size`` and ``tokens`` describe the session's whole working memory after the
    change (0 on a tick); ``task``, ``variables`` and ``scratchpad`` are given
    whole. ``cleared``: everything the session held was discarded (``evicted`` is all of it), at
    ``session.ended`` or because the idle TTL expired before this event (which, if
    a turn or a start, then opened the session afresh); on a tick, the sessions in
    ``expired`` were. A session with no entries left and one never seen are alike."""

    added: list[Turn] = []
    evicted: Annotated[int, Field(ge=0, le=INT64_MAX)] = 0
    prepended: list[Turn] = []
    size: Annotated[int, Field(ge=0, le=INT64_MAX)]
    tokens: Annotated[int, Field(ge=0, le=INT64_MAX)]
    task: str | None = None
    variables: dict[str, str] = {}
    scratchpad: str | None = None
    cleared: bool = False
    expired: list[str] = []


class WorkingUpdated(DerivedEvent):
    """Version 2 added ``scratchpad`` to the body (version 1 bytes read as None)."""

    TYPE: ClassVar[str] = "working.updated"
    SCHEMA_VERSION: ClassVar[int] = 2
    type: Literal["working.updated"] = "working.updated"
    body: WorkingBody


class TermWeights(Model):
    """The BM25 document weights of a memory's text (term indices and weights, as the
    vector projection stores them), recorded beside its vector so that a rebuild need
    not tokenise the text again. Packed, so that a reader takes each list whole rather
    than an item at a time: ``indices`` is the base64 of little-endian unsigned 32-bit
    integers, ascending, ``values`` the base64 of one little-endian IEEE double per
    index. ``tokenizer`` names the tokenizer and weighting that made them
    (``processors.recall.TOKENIZER``): a reader whose own differs computes the weights
    again, as it does when they are not well formed."""

    tokenizer: str
    indices: str
    values: str


class EmbeddedBody(Model):
    """A memory's vector from ``model``. ``terms`` (version 2; None in version-1
    bytes) are the BM25 weights of the text that was embedded. ``vector`` stays the
    last field: readers unpack it whole (``schemas.avro.DoublesTail``)."""

    memory_id: str
    model: str
    model_version: str
    dims: Annotated[int, Field(gt=0, le=INT64_MAX)]
    terms: TermWeights | None = None
    vector: list[float]


class MemoryEmbedded(DerivedEvent):
    """Version 2 added ``terms`` to the body (version 1 bytes read as None)."""

    TYPE: ClassVar[str] = "memory.embedded"
    SCHEMA_VERSION: ClassVar[int] = 2
    type: Literal["memory.embedded"] = "memory.embedded"
    body: EmbeddedBody


class PersonaVersionBody(Model):
    """The whole persona document as of this version (versions count from 1)."""

    version: Annotated[int, Field(ge=1, le=INT64_MAX)]
    name: str | None = None
    description: str | None = None
    style: str | None = None
    preferences: dict[str, str] = {}
    updated_at: UtcMillis


class PersonaVersioned(DerivedEvent):
    TYPE: ClassVar[str] = "persona.versioned"
    type: Literal["persona.versioned"] = "persona.versioned"
    body: PersonaVersionBody


class SkillBody(Model):
    """A tool's record as procedural memory (L4) after this use or result."""

    name: str
    uses: Annotated[int, Field(ge=0, le=INT64_MAX)]
    successes: Annotated[int, Field(ge=0, le=INT64_MAX)]
    failures: Annotated[int, Field(ge=0, le=INT64_MAX)]
    last_used_at: UtcMillis | None = None
    success_rate: Unit | None = None


class SkillUpdated(DerivedEvent):
    TYPE: ClassVar[str] = "skill.updated"
    type: Literal["skill.updated"] = "skill.updated"
    body: SkillBody


class ErasedBody(Model):
    """What an erasure removed from one agent's memory: counts only, never content.

    ``request_id`` is the ``event_id`` of the ``subject.erasure_requested`` that asked
    for it (as published: before the fold gave each agent its own copy); a subject the
    agent never met, or one erased before, has every count 0."""

    subject: str
    request_id: UUID
    requested_at: UtcMillis | None = None
    sessions: Annotated[int, Field(ge=0, le=INT64_MAX)] = 0
    episodes: Annotated[int, Field(ge=0, le=INT64_MAX)] = 0
    memories: Annotated[int, Field(ge=0, le=INT64_MAX)] = 0
    facts: Annotated[int, Field(ge=0, le=INT64_MAX)] = 0
    persona: Annotated[int, Field(ge=0, le=INT64_MAX)] = 0


class SubjectErased(DerivedEvent):
    """A subject's content left the agent's memory (working sessions, open episodes,
    consolidation windows, memories, fact versions, persona versions); projections
    purge the subject when they read it."""

    TYPE: ClassVar[str] = "subject.erased"
    type: Literal["subject.erased"] = "subject.erased"
    body: ErasedBody


Count = Annotated[int, Field(ge=0, le=INT64_MAX)]


class RebasedBody(Model):
    """How a rollback or a fork changed the agent's memory, counts only: memories
    that left it (``forgotten``), memories it got back or got (``restored``), facts
    and persona set back, working sessions replaced."""

    forgotten: Count = 0
    restored: Count = 0
    facts: Count = 0
    persona: Count = 0
    sessions: Count = 0


class RolledBackChangeBody(RebasedBody):
    """``request_id``: the ``memory.rolled_back`` that asked for it."""

    request_id: UUID
    to: UtcMillis
    to_seq: Count


class AgentRolledBack(DerivedEvent):
    """The agent's memory went back to what it was at ``to``; the changes with the same
    ``source_event_id`` bring the projections in line."""

    TYPE: ClassVar[str] = "agent.rolled_back"
    type: Literal["agent.rolled_back"] = "agent.rolled_back"
    body: RolledBackChangeBody


class ForkedChangeBody(RebasedBody):
    """``request_id``: the ``memory.forked`` that asked for it."""

    request_id: UUID
    source_agent_id: str
    at: UtcMillis
    source_seq: Count


class AgentForked(DerivedEvent):
    """The agent began as a copy of ``source_agent_id`` at ``at`` (memory ids renamed)."""

    TYPE: ClassVar[str] = "agent.forked"
    type: Literal["agent.forked"] = "agent.forked"
    body: ForkedChangeBody


DERIVED_TYPES: tuple[type[DerivedEvent], ...] = (
    MemoryCreated,
    MemoryReinforced,
    MemoryWeakened,
    MemoryPromoted,
    MemoryForgotten,
    EpisodeClosed,
    FactSet,
    WorkingUpdated,
    MemoryEmbedded,
    PersonaVersioned,
    SkillUpdated,
    SubjectErased,
    AgentRolledBack,
    AgentForked,
)
