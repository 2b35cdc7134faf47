"""L1 working memory: the recent turns of each open session of one agent.

Deterministic and clock-free: what a session holds depends only on the events
folded into it, in order.
"""

from __future__ import annotations

import re
from collections import deque
from datetime import datetime

from schemas import (
    Event,
    InteractionRecorded,
    Model,
    SessionEnded,
    SessionStarted,
    ToolCalled,
    ToolResult,
    Turn,
    WorkingBody,
)


class SessionState(Model):
    """Serialised form of one session's working memory."""

    session_id: str
    turns: list[Turn] = []
    task: str | None = None
    variables: dict[str, str] = {}
    dropped: int = 0
    last_at: datetime


class SessionWorking:
    """One session's working memory: the last ``limit`` turns, its task and variables."""

    def __init__(self, state: SessionState, limit: int) -> None:
        self.session_id = state.session_id
        self.turns: deque[Turn] = deque(state.turns, maxlen=limit)
        self.tokens = sum(t.tokens for t in self.turns)
        self.task = state.task
        self.variables = dict(state.variables)
        self.dropped = state.dropped
        self.last_at = state.last_at

    def add(self, turn: Turn) -> WorkingBody:
        """Append ``turn``, evicting the oldest when full; return the delta."""
        evicted = 0
        if len(self.turns) == self.turns.maxlen:
            self.tokens -= self.turns[0].tokens
            self.dropped += 1
            evicted = 1
        self.turns.append(turn)
        self.tokens += turn.tokens
        self.last_at = turn.occurred_at
        return self.body(added=[turn], evicted=evicted)

    def body(
        self, *, added: list[Turn] | None = None, evicted: int = 0, cleared: bool = False
    ) -> WorkingBody:
        return WorkingBody(
            added=added or [],
            evicted=evicted,
            size=0 if cleared else len(self.turns),
            tokens=0 if cleared else self.tokens,
            task=self.task,
            variables=dict(self.variables),
            cleared=cleared,
        )

    def state(self) -> SessionState:
        return SessionState(
            session_id=self.session_id,
            turns=list(self.turns),
            task=self.task,
            variables=dict(self.variables),
            dropped=self.dropped,
            last_at=self.last_at,
        )


CJK = re.compile("[\u3000-\u9fff\uac00-\ud7af]")


def estimate_tokens(text: str) -> int:
    """Rough token count: one per CJK character, one per ~4 other characters."""
    cjk = len(CJK.findall(text))
    return cjk + (len(text) - cjk + 3) // 4


def turn_of(event: Event) -> Turn | None:
    """The working-memory entry an event contributes, if any."""
    role: str
    match event:
        case InteractionRecorded(body=body):
            role, content = body.role, body.content
        case ToolCalled(body=body):
            role, content = "tool_call", f"{body.tool}({body.arguments})"
        case ToolResult(body=body):
            role, content = "tool", body.content
        case _:
            return None
    return Turn(
        event_id=str(event.event_id),
        role=role,
        content=content,
        occurred_at=event.occurred_at,
        tokens=estimate_tokens(content),
    )


class WorkingMemory:
    """Every open session of one agent; :meth:`apply` returns the change an event
    made to its session's working memory (or None when it changed none)."""

    def __init__(self, sessions: list[SessionState], limit: int) -> None:
        self.limit = limit
        self.sessions = {s.session_id: SessionWorking(s, limit) for s in sessions}

    def apply(self, event: Event) -> WorkingBody | None:
        sid = event.session_id
        if sid is None:
            return None
        if isinstance(event, SessionEnded):
            ended = self.sessions.pop(sid, None)
            if ended is None:
                return None
            return ended.body(evicted=len(ended.turns), cleared=True)
        if isinstance(event, SessionStarted):
            session = self._session(sid, event.occurred_at)
            session.task = event.body.task
            session.last_at = event.occurred_at
            return session.body()
        turn = turn_of(event)
        if turn is None:
            return None
        return self._session(sid, event.occurred_at).add(turn)

    def _session(self, sid: str, at: datetime) -> SessionWorking:
        session = self.sessions.get(sid)
        if session is None:
            session = SessionWorking(SessionState(session_id=sid, last_at=at), self.limit)
            self.sessions[sid] = session
        return session

    def state(self) -> list[SessionState]:
        return [s.state() for s in self.sessions.values()]
