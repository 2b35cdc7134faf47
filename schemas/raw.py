"""Raw event types on ``engram.events``: what agents, tools and the ticker publish."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal
from uuid import UUID

from pydantic import Field, model_validator

from schemas.base import INT64_MAX, Event, Ident, Importance, Model, Signed, Unit, UtcMillis

Text = Annotated[str, Field(max_length=1_000_000)]
Role = Literal["user", "assistant", "system", "tool"]


class InteractionBody(Model):
    """One conversation turn; importance / sentiment / confidence, when given, win
    over the pipeline's own estimates."""

    role: Role
    content: Text
    intent: str | None = None
    entities: list[str] = []
    importance: Importance | None = None
    sentiment: Signed | None = None
    confidence: Unit | None = None


class InteractionRecorded(Event):
    TYPE: ClassVar[str] = "interaction.recorded"
    type: Literal["interaction.recorded"] = "interaction.recorded"
    body: InteractionBody


class ToolCallBody(Model):
    call_id: Ident
    tool: Ident
    arguments: Text = "{}"


class ToolCalled(Event):
    TYPE: ClassVar[str] = "tool.called"
    type: Literal["tool.called"] = "tool.called"
    body: ToolCallBody


class ToolResultBody(Model):
    """A tool's answer; a large ``content`` is kept in history and summarised in
    working memory."""

    call_id: Ident
    tool: Ident
    ok: bool = True
    content: Text = ""


class ToolResult(Event):
    TYPE: ClassVar[str] = "tool.result"
    type: Literal["tool.result"] = "tool.result"
    body: ToolResultBody


class SessionStartedBody(Model):
    task: str | None = None


class SessionStarted(Event):
    TYPE: ClassVar[str] = "session.started"
    type: Literal["session.started"] = "session.started"
    body: SessionStartedBody = SessionStartedBody()


class SessionEndedBody(Model):
    reason: str | None = None


class SessionEnded(Event):
    TYPE: ClassVar[str] = "session.ended"
    type: Literal["session.ended"] = "session.ended"
    body: SessionEndedBody = SessionEndedBody()


class WorkingSetBody(Model):
    """What an agent keeps in a session's working memory besides its turns. Every
    field is optional and only what is given changes:

    - ``task``: replaces the session's current task; ``""`` clears it;
    - ``variables``: merged by key into the session's variables; a key whose value
      is ``None`` is removed;
    - ``scratchpad``: replaces the session's scratchpad (free notes); ``""`` clears
      it. A scratchpad longer than the working-memory offload threshold keeps only
      its head and where the full text is, like a large tool result.

    The event needs a ``session_id``: working memory is per session.
    """

    task: str | None = None
    variables: dict[str, str | None] = {}
    scratchpad: Text | None = None


class WorkingSet(Event):
    TYPE: ClassVar[str] = "working.set"
    type: Literal["working.set"] = "working.set"
    body: WorkingSetBody

    @model_validator(mode="after")
    def _needs_session(self) -> WorkingSet:
        if self.session_id is None:
            raise ValueError("working.set needs a session_id: working memory is per session")
        return self


class FactAssertedBody(Model):
    namespace: Ident
    key: Ident
    value: Text
    confidence: Unit | None = None


class FactAsserted(Event):
    TYPE: ClassVar[str] = "fact.asserted"
    type: Literal["fact.asserted"] = "fact.asserted"
    body: FactAssertedBody


class FactRetractedBody(Model):
    namespace: Ident
    key: Ident
    reason: str | None = None


class FactRetracted(Event):
    TYPE: ClassVar[str] = "fact.retracted"
    type: Literal["fact.retracted"] = "fact.retracted"
    body: FactRetractedBody


class PersonaBody(Model):
    """Fields left out keep their previous value; ``preferences`` merge by key."""

    name: str | None = None
    description: str | None = None
    style: str | None = None
    preferences: dict[str, str] = {}


class PersonaUpdated(Event):
    TYPE: ClassVar[str] = "persona.updated"
    type: Literal["persona.updated"] = "persona.updated"
    body: PersonaBody


class RecalledBody(Model):
    query: Text
    memory_ids: list[str]
    scores: list[float]


class MemoryRecalled(Event):
    TYPE: ClassVar[str] = "memory.recalled"
    type: Literal["memory.recalled"] = "memory.recalled"
    body: RecalledBody


class FeedbackBody(Model):
    memory_id: str
    useful: bool
    correction: str | None = None


class FeedbackGiven(Event):
    TYPE: ClassVar[str] = "feedback.given"
    type: Literal["feedback.given"] = "feedback.given"
    body: FeedbackBody


class TickBody(Model):
    """Written by the ticker to every partition; ``partition`` says which."""

    partition: Annotated[int, Field(ge=0, le=INT64_MAX)]
    interval_s: Annotated[float, Field(gt=0)]


class ClockTicked(Event):
    TYPE: ClassVar[str] = "clock.tick"
    type: Literal["clock.tick"] = "clock.tick"
    body: TickBody


class ErasureBody(Model):
    subject: Ident
    reason: str | None = None
    requested_at: UtcMillis | None = None


class SubjectErasureRequested(Event):
    TYPE: ClassVar[str] = "subject.erasure_requested"
    type: Literal["subject.erasure_requested"] = "subject.erasure_requested"
    body: ErasureBody


Seq = Annotated[int, Field(ge=0, le=INT64_MAX)]


class RolledBackBody(Model):
    """Roll the agent's memory back to its state at ``to``: ``to_seq`` is the agent's
    last sequence at or before ``to`` in the archived log (what ``engram rollback``
    found there). The event itself takes the next sequence: history is never edited."""

    to: UtcMillis
    to_seq: Seq
    reason: str | None = None


class MemoryRolledBack(Event):
    TYPE: ClassVar[str] = "memory.rolled_back"
    type: Literal["memory.rolled_back"] = "memory.rolled_back"
    body: RolledBackBody


class ForkedBody(Model):
    """The first event of a new agent: its memory begins as ``source_agent_id``'s was
    at ``at`` (``source_seq``: the source's last sequence at or before ``at``).
    ``source_event_id`` (version 2; None in version-1 bytes, a fork made by an older
    engram) is the id of the source's event at ``source_seq``: which agent of that
    name, and which log, the fork was made from (``engram import`` checks it)."""

    source_agent_id: Ident
    at: UtcMillis
    source_seq: Seq
    source_event_id: UUID | None = None


class MemoryForked(Event):
    """Version 2 added ``source_event_id`` to the body (version 1 bytes read as None)."""

    TYPE: ClassVar[str] = "memory.forked"
    SCHEMA_VERSION: ClassVar[int] = 2
    type: Literal["memory.forked"] = "memory.forked"
    body: ForkedBody


RAW_TYPES: tuple[type[Event], ...] = (
    InteractionRecorded,
    ToolCalled,
    ToolResult,
    SessionStarted,
    SessionEnded,
    WorkingSet,
    FactAsserted,
    FactRetracted,
    PersonaUpdated,
    MemoryRecalled,
    FeedbackGiven,
    ClockTicked,
    SubjectErasureRequested,
    MemoryRolledBack,
    MemoryForked,
)
