"""``engram mcp``: engram as tools for agent frameworks, over MCP on stdio.

The server is a thin face of the public client :class:`engram.client.Memory`:
every tool is one client call, so the MCP tools, the Python client and the HTTP
API share one contract. Events go to the log (Kafka, ``acks=all``); recall and
snapshots are answered by the running ``engram up``.

Errors the agent can act on (an invalid event, an unknown agent, engram not
answering) are MCP tool errors (``isError: true``) whose text is the reason;
nothing of a batch with an invalid event is published. Logs go to stderr only:
stdout is the protocol.

Example (an MCP client's configuration)::

    {"command": "engram", "args": ["mcp"], "env": {"ENGRAM_HOME": "/path/to/home"}}
"""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import httpx
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import AwareDatetime, BaseModel, Field

from engram.client import Memory, read_up_file
from engram.errors import EngramError, NotRunning
from engram.results import RecalledMemory, RecallResult, Snapshot
from engram.settings import Settings
from schemas import BadEvent

log = logging.getLogger("engram.mcp")

AGENT_EVENT_TYPES = (
    "interaction.recorded",
    "session.started",
    "session.ended",
    "working.set",
    "tool.called",
    "tool.result",
    "fact.asserted",
    "fact.retracted",
    "persona.updated",
    "feedback.given",
)
"""What an agent may publish through MCP. The other raw types are not the agent's
to write: ``memory.recalled`` is recorded by recall itself, ``clock.tick`` by the
ticker, ``subject.erasure_requested`` by an operator."""

MAX_EVENTS = 1000
"""Most events one ``memory_publish`` call may carry."""

INSTRUCTIONS = """\
engram is this agent's long-term memory, kept as an immutable event log.
At the start of a session call memory_snapshot to load what the agent was doing
(working memory, recent episodes, facts, persona). Before answering anything that may
depend on the past (preferences, earlier decisions, facts about the user), call
memory_recall. Record every turn, tool call and learned fact with memory_publish so it
can be remembered later. When a recalled memory helped or was wrong, say so with
memory_feedback."""

# -- arguments -------------------------------------------------------------

AgentId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=256,
        description="The agent whose memory this is (the same id the events carry).",
    ),
]
UserId = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=256,
        description="Only memories of this user (the person the agent talks to). Omit for all.",
    ),
]
SnapshotUserId = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=256,
        description=(
            "Only this user's episodes and memories. Working memory, facts and persona are"
            " the agent's, of every user: narrow working memory with session_id."
        ),
    ),
]
SessionId = Annotated[
    str | None,
    Field(min_length=1, max_length=256, description="Only this session's working memory."),
]
Query = Annotated[
    str,
    Field(
        min_length=1,
        max_length=8192,
        description="What to remember, in natural language (any language), e.g. "
        "'what is the user allergic to?'.",
    ),
]
TopK = Annotated[int, Field(ge=1, le=100, description="How many memories to return at most.")]
Layers = Annotated[
    list[Literal["L2", "L3"]] | None,
    Field(
        description="Only these layers: L2 = episodes and important single turns, "
        "L3 = consolidated long-term knowledge. Omit for both."
    ),
]
MinImportance = Annotated[
    float | None,
    Field(ge=1, le=10, description="Only memories at least this important (1-10)."),
]
AsOf = Annotated[
    AwareDatetime | None,
    Field(
        description="Reconstruct the memory as it was at this moment (ISO-8601 with a UTC "
        "offset, e.g. 2026-11-01T10:00:00+00:00). Omit for now."
    ),
]
Events = Annotated[
    list[dict[str, Any]],
    Field(min_length=1, max_length=MAX_EVENTS, description="The events, as JSON objects."),
]
MemoryId = Annotated[
    str, Field(min_length=1, description="The memory_id of a memory that memory_recall returned.")
]
Useful = Annotated[bool, Field(description="true if the memory helped, false if it did not.")]
Correction = Annotated[
    str | None,
    Field(description="What is true instead, when the memory was wrong; it invalidates it."),
]

# -- results ---------------------------------------------------------------


class Recalled(BaseModel):
    """One recalled memory."""

    memory_id: str
    text: str
    layer: str
    kind: str
    score: float
    retention: float
    importance: float
    created_at: datetime
    sources: list[str]


class RecallAnswer(BaseModel):
    """The memories recalled for a query, best first."""

    query: str
    agent_id: str
    user_id: str | None
    memories: list[Recalled]


class Published(BaseModel):
    """Every event was validated and acknowledged by the log."""

    accepted: int
    event_ids: list[str]


class FeedbackRecorded(BaseModel):
    """The id of the feedback.given event that records the judgement."""

    event_id: str


# -- descriptions ----------------------------------------------------------

RECALL = """\
Search this agent's long-term memory for what is relevant to a question.

Use it before answering anything that may depend on earlier conversations: the user's
preferences, allergies, plans, decisions, facts learned in past sessions. Returns the
best memories first, each with memory_id, text, layer (L2 episode or important turn,
L3 consolidated knowledge), score, retention (0-1: how well it is still remembered),
importance (1-10), created_at and sources (the event or memory ids it came from).
Recalling a memory strengthens it. An empty list means nothing relevant is remembered.
Memories appear a few seconds after the events that create them are published."""

PUBLISH = """\
Record events in this agent's memory: conversation turns, session starts and ends,
tool calls and results, facts, persona changes. Events are immutable facts; engram
derives working memory, episodes and long-term memories from them.

Each event is a JSON object:
  {"type": ..., "agent_id": ..., "session_id": optional, "user_id": optional,
   "event_id": optional UUID (a new one if omitted; publishing the same id again is
   deduplicated), "occurred_at": optional ISO-8601 with offset (now if omitted),
   "body": {...}}
Types and bodies:
- interaction.recorded: {"role": "user"|"assistant"|"system"|"tool", "content": text,
  optional "intent", "entities": [str], "importance": 1-10, "sentiment": -1..1,
  "confidence": 0..1}. A turn with importance >= 8 becomes a long-term memory at once.
- session.started: {"task": optional text}; session.ended: {"reason": optional text}
  (ending a session closes its episode and clears its working memory).
- working.set: {"task": text ("" clears), "variables": {str: str or null to remove},
  "scratchpad": text ("" clears)}, all optional; needs session_id.
- tool.called: {"call_id", "tool", "arguments": JSON text};
  tool.result: {"call_id", "tool", "ok": bool, "content": text}.
- fact.asserted: {"namespace", "key", "value": text, optional "confidence": 0..1}
  (a new value replaces the old one); fact.retracted: {"namespace", "key", "reason"}.
- persona.updated: {"name", "description", "style", "preferences": {str: str}}, all
  optional.
- feedback.given: {"memory_id", "useful": bool, "correction"} (memory_feedback is simpler).
Every event is checked before any is sent: if one is invalid the call fails with its
index and reason and nothing is published. Returns the accepted count and event ids."""

SNAPSHOT = """\
Load this agent's memory as a whole: what a fresh agent process should read at the
start of a session. Returns working memory (the recent turns, task, variables and
scratchpad of each open session), the latest episodes (summaries of past sessions),
current facts,
persona, skills, memory counts per layer and the log position the snapshot reflects.
Give session_id for one session's working memory only, user_id for one user's episodes
and memories (working memory, facts and persona stay the agent's, of every user),
as_of to see the memory as it was at a past moment. Fails if engram has no events of
the agent yet."""

FEEDBACK = """\
Tell engram whether a memory returned by memory_recall was useful. A useful memory is
strengthened and kept longer; a useless one is weakened; a correction (what is true
instead) invalidates it. Returns the id of the recorded feedback event."""


# -- the server ------------------------------------------------------------


def build_server(memory: Memory) -> MCPServer[None]:
    """The MCP server with the memory tools, each one call of ``memory``; the
    server closes ``memory`` when it stops."""

    @asynccontextmanager
    async def closing(_: MCPServer[None]) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await memory.aclose()

    server: MCPServer[None] = MCPServer(
        "engram", instructions=INSTRUCTIONS, lifespan=closing, log_level="WARNING"
    )
    _add_recall(server, memory)
    _add_publish(server, memory)
    _add_snapshot(server, memory)
    _add_feedback(server, memory)
    return server


def _add_recall(server: MCPServer[None], memory: Memory) -> None:
    async def memory_recall(
        query: Query,
        agent_id: AgentId,
        user_id: UserId = None,
        k: TopK = 10,
        layers: Layers = None,
        min_importance: MinImportance = None,
    ) -> RecallAnswer:
        with _tool_errors():
            result = await memory.arecall(
                query,
                agent_id=agent_id,
                user_id=user_id,
                k=k,
                layers=layers,
                min_importance=min_importance,
            )
        return _answer(result)

    hints = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
    server.add_tool(memory_recall, title="Recall memories", description=RECALL, annotations=hints)


def _add_publish(server: MCPServer[None], memory: Memory) -> None:
    async def memory_publish(events: Events) -> Published:
        with _tool_errors():
            published = await memory.apublish_many(completed(events))
        return Published(accepted=len(published), event_ids=[str(e.event_id) for e in published])

    hints = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
    server.add_tool(memory_publish, title="Record events", description=PUBLISH, annotations=hints)


def _add_snapshot(server: MCPServer[None], memory: Memory) -> None:
    async def memory_snapshot(
        agent_id: AgentId,
        user_id: SnapshotUserId = None,
        session_id: SessionId = None,
        as_of: AsOf = None,
    ) -> Snapshot:
        with _tool_errors():
            return await memory.asnapshot(
                agent_id, user_id=user_id, session_id=session_id, as_of=as_of
            )

    hints = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    server.add_tool(memory_snapshot, title="Load memory", description=SNAPSHOT, annotations=hints)


def _add_feedback(server: MCPServer[None], memory: Memory) -> None:
    async def memory_feedback(
        memory_id: MemoryId, useful: Useful, agent_id: AgentId, correction: Correction = None
    ) -> FeedbackRecorded:
        with _tool_errors():
            event = await memory.afeedback(
                memory_id, useful, agent_id=agent_id, correction=correction
            )
        return FeedbackRecorded(event_id=str(event.event_id))

    hints = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
    server.add_tool(
        memory_feedback, title="Judge a memory", description=FEEDBACK, annotations=hints
    )


def completed(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events with ``event_id`` (new uuid4) and ``occurred_at`` (now, UTC) filled
    where omitted; raises BadEvent for a type an agent may not publish."""
    return [_completed(index, event) for index, event in enumerate(events)]


def _completed(index: int, event: dict[str, Any]) -> dict[str, Any]:
    kind = event.get("type")
    if isinstance(kind, str) and kind not in AGENT_EVENT_TYPES:
        allowed = ", ".join(AGENT_EVENT_TYPES)
        raise BadEvent(
            f"event {index}: type {kind!r} cannot be published here (allowed: {allowed})"
        )
    filled = dict(event)
    if filled.get("event_id") is None:
        filled["event_id"] = str(uuid.uuid4())
    if filled.get("occurred_at") is None:
        filled["occurred_at"] = datetime.now(UTC).isoformat()
    return filled


def _answer(result: RecallResult) -> RecallAnswer:
    return RecallAnswer(
        query=result.query,
        agent_id=result.agent_id,
        user_id=result.user_id,
        memories=[_recalled(m) for m in result.memories],
    )


def _recalled(memory: RecalledMemory) -> Recalled:
    return Recalled(
        memory_id=memory.memory_id,
        text=memory.text,
        layer=memory.layer,
        kind=memory.kind,
        score=memory.score,
        retention=memory.retention,
        importance=memory.importance,
        created_at=memory.created_at,
        sources=memory.sources,
    )


@contextmanager
def _tool_errors() -> Iterator[None]:
    """Client errors as MCP tool errors carrying the reason, for the model to read."""
    try:
        yield
    except BadEvent as bad:
        raise ToolError(f"invalid event, nothing was published: {bad.reason}") from None
    except EngramError as error:
        raise ToolError(str(error)) from None


# -- the command -----------------------------------------------------------


def connect(settings: Settings) -> Memory:
    """A client of the running ``engram up``: events to its Kafka (or
    ``ENGRAM_KAFKA_BOOTSTRAP``), recall and snapshots to its HTTP API. Raises
    NotRunning when ``engram up`` is not running or does not answer."""
    up = read_up_file(settings.up_file)
    if up is None:
        raise NotRunning(
            f"engram is not running: no {settings.up_file}. Start it with `engram up` "
            "(with the same ENGRAM_HOME) before `engram mcp`."
        )
    try:
        httpx.get(f"{up['http']}/v1/health", timeout=5).raise_for_status()
    except (httpx.HTTPError, KeyError) as error:
        raise NotRunning(
            f"engram up does not answer at {up.get('http')} ({error!r}); "
            f"is it still running? ({settings.up_file} may be stale)"
        ) from None
    bootstrap = settings.kafka_bootstrap or up["kafka_bootstrap"]
    return Memory(bootstrap=bootstrap, http=up["http"], settings=settings)


def serve(settings: Settings) -> None:
    """Serve the memory tools over stdio until the client closes stdin."""
    logging.basicConfig(
        stream=sys.stderr,
        level=settings.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    memory = connect(settings)
    log.info("engram mcp: events to %s, queries to %s", memory.bootstrap, memory.http)
    build_server(memory).run("stdio")
