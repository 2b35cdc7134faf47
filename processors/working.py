"""L1 working memory: the recent turns of each open session of one agent.

Deterministic and clock-free: what a session holds depends only on the events
folded into it, in order, and on the parameters.

Each session keeps at most ``max_turns`` entries (``MemoryConfig.working_turns``)
and at most ``token_budget`` estimated tokens (:func:`estimate_tokens`):

- a ``tool.result`` longer than ``offload_chars`` characters is *offloaded*: its
  entry keeps the head of the text (at most ``offload_head_tokens``) and
  ``[offloaded: N chars, event <id>]``; the full text stays in history, in the
  source event;
- after every new turn, the oldest entries beyond ``max_turns`` leave; then, while
  the tokens exceed the budget, the oldest entries (never the newest one) are
  *compressed* into one ``summary`` entry at the front, made by the extractive
  :func:`~processors.summary.summarise`; if even everything but the newest turn
  cannot be compressed into the budget, it is evicted (the last resort);
- the newest turn is kept whole even when it alone exceeds the budget: it is then
  all the session holds, and it is compressed like any older turn once a newer
  one arrives.

A session is cleared at ``session.ended``, and when its last activity is more than
``idle_ttl_s`` of event time older than the next event for it or a ``clock.tick``
of the agent. An agent keeps at most ``max_sessions`` sessions open: an event that
opens one more clears the least recently active others (oldest last activity, then
session id), as the idle TTL would, so that an agent whose sessions never end
(clients that just stop) holds a bounded state. How these changes read as deltas is
documented on :class:`~schemas.derived.WorkingBody`.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Final

from processors.build import fields, trusted, updated
from processors.scoring import DEFAULT_PARAMS
from processors.sentences import iter_sentences
from processors.state import ScoringParams, SessionState, WorkingParams
from processors.summary import summarise_texts
from schemas import (
    ClockTicked,
    Event,
    InteractionRecorded,
    SessionEnded,
    SessionStarted,
    ToolCalled,
    ToolResult,
    Turn,
    WorkingBody,
    WorkingSet,
)

SUMMARY_ROLE = "summary"


DEFAULT_WORKING = WorkingParams()


class SessionWorking:
    """One session's working memory: its entries, task and variables."""

    def __init__(
        self,
        state: SessionState,
        limit: int,
        params: WorkingParams = DEFAULT_WORKING,
        scoring: ScoringParams = DEFAULT_PARAMS,
    ) -> None:
        self.session_id = state.session_id
        self.limit = limit
        self.params = params
        self.budget = params.token_budget
        self.scoring = scoring
        self.ttl = _ttl(params)
        self.turns: list[Turn] = list(state.turns)
        self.tokens = sum(t.tokens for t in self.turns)
        self.task = state.task
        self.variables = dict(state.variables)
        self.scratchpad = state.scratchpad
        self.dropped = state.dropped
        self.compressed = state.compressed
        self.last_at = state.last_at

    def set(self, event: WorkingSet, params: WorkingParams) -> None:
        """Apply a ``working.set``: only the fields it gives change (see its body)."""
        given = event.body
        if given.task is not None:
            self.task = given.task or None
        for key, value in sorted(given.variables.items()):
            if value is None:
                self.variables.pop(key, None)
            else:
                self.variables[key] = value
        if given.scratchpad is not None:
            pad = given.scratchpad
            if len(pad) > params.offload_chars:
                pad = offload(pad, str(event.event_id), params.offload_head_tokens)
            self.scratchpad = pad or None
        self.touch(event.occurred_at)

    def touch(self, at: datetime) -> None:
        self.last_at = max(self.last_at, at)

    def idle(self, at: datetime) -> bool:
        """Whether the session's last activity is more than the TTL before ``at``."""
        return at - self.last_at > self.ttl

    def add(self, turn: Turn) -> WorkingBody:
        """Append ``turn``, then keep the turn cap and the token budget; return the delta."""
        turns = self.turns
        turns.append(turn)
        fields = turn.__dict__  # see processors.build: reading fields
        self.tokens += fields["tokens"]
        at = fields["occurred_at"]
        if at > self.last_at:
            self.last_at = at
        capped = len(turns) - self.limit
        if capped > 0:
            self._evict(capped)
            self.dropped += capped
        else:
            capped = 0
        if self.tokens <= self.budget or len(turns) < 2:
            values = {
                "added": [turn],
                "evicted": capped,
                "prepended": [],
                "size": len(turns),
                "tokens": self.tokens,
                "task": self.task,
                "variables": dict(self.variables),
                "scratchpad": self.scratchpad,
                "cleared": False,
                "expired": [],
            }
            return trusted(WorkingBody, values, _BODY_GIVEN)
        fitted, summary = self._fit()
        return self.body(
            added=[turn],
            evicted=capped + fitted,
            prepended=[] if summary is None else [summary],
        )

    def _fit(self) -> tuple[int, Turn | None]:
        """Bring the tokens within the budget: replace the ``k`` oldest entries by a
        summary, ``k`` as small as leaves the verbatim turns under ``compress_to`` of
        the budget and the whole within it; else keep only the newest turn. Return
        ``k`` and the summary now in front (None when none was made)."""
        budget = self.params.token_budget
        turns = self.turns
        if self.tokens <= budget or len(turns) < 2:
            return 0, None
        if turns[-1].tokens <= budget:
            goal = math.floor(budget * self.params.compress_to)
            k, rest = 1, self.tokens - turns[0].tokens  # rest: tokens of turns[k:]
            while k < len(turns) - 1 and rest > goal:
                rest -= turns[k].tokens
                k += 1
            while k < len(turns):
                summary = self._summary(turns[:k])
                made = 0 if summary is None else summary.tokens
                if made + rest <= budget:
                    self._replace(k, summary)
                    return k, summary
                rest -= turns[k].tokens
                k += 1
        k = len(turns) - 1  # the last resort: only the newest turn stays
        self._replace(k, None)
        return k, None

    def _summary(self, turns: list[Turn]) -> Turn | None:
        """One entry summarising ``turns`` (dated and named by the newest of them)."""
        text = summarise_texts(
            [t.content for t in turns],
            max_chars=self.params.summary_chars,
            params=self.scoring,
        )
        if not text:
            return None
        last = turns[-1]
        return trusted(
            Turn,
            {
                "event_id": last.event_id,
                "role": SUMMARY_ROLE,
                "content": text,
                "occurred_at": last.occurred_at,
                "tokens": estimate_tokens(text),
                "offloaded": False,
            },
            _SUMMARY_GIVEN,
        )

    def _replace(self, k: int, summary: Turn | None) -> None:
        """Replace the ``k`` oldest entries by ``summary`` (or by nothing)."""
        folded = sum(1 for t in self.turns[:k] if t.role != SUMMARY_ROLE)
        self._evict(k)
        if summary is None:
            self.dropped += folded
        else:
            self.compressed += folded
            self.turns.insert(0, summary)
            self.tokens += summary.tokens

    def _evict(self, k: int) -> None:
        if k:
            self.tokens -= sum(t.tokens for t in self.turns[:k])
            del self.turns[:k]

    def body(
        self,
        *,
        added: list[Turn] | None = None,
        evicted: int = 0,
        prepended: list[Turn] | None = None,
        cleared: bool = False,
    ) -> WorkingBody:
        return trusted(
            WorkingBody,
            {
                "added": added or [],
                "evicted": evicted,
                "prepended": prepended or [],
                "size": 0 if cleared else len(self.turns),
                "tokens": 0 if cleared else self.tokens,
                "task": self.task,
                "variables": dict(self.variables),
                "scratchpad": self.scratchpad,
                "cleared": cleared,
                "expired": [],
            },
            _BODY_GIVEN,
        )

    def state(self) -> SessionState:
        return trusted(
            SessionState,
            {
                "session_id": self.session_id,
                "turns": list(self.turns),
                "task": self.task,
                "variables": dict(self.variables),
                "scratchpad": self.scratchpad,
                "dropped": self.dropped,
                "compressed": self.compressed,
                "last_at": self.last_at,
            },
            _STATE_GIVEN,
        )


_BODY_GIVEN: Final = fields(WorkingBody.model_fields)
_STATE_GIVEN = fields(SessionState.model_fields)
_SUMMARY_GIVEN = fields({"event_id", "role", "content", "occurred_at", "tokens"})
_TURN_GIVEN: Final = fields(Turn.model_fields)
_EXPIRED_GIVEN: Final = fields({"size", "tokens", "cleared", "expired"})
_FRESH_GIVEN = fields({"session_id", "turns", "last_at"})


def _ttl(params: WorkingParams) -> timedelta:
    return timedelta(seconds=params.idle_ttl_s)


CJK = re.compile(
    "["
    "\u1100-\u11ff"  # Hangul jamo
    "\u2e80-\u2fdf"  # CJK radicals, Kangxi radicals
    "\u3000-\u9fff"  # CJK punctuation, kana, bopomofo, extension A, unified ideographs
    "\uac00-\ud7af"  # Hangul syllables
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\uff00-\uffef"  # full-width and half-width forms (，！？：)
    "\U00020000-\U0003134f"  # CJK extensions B-H
    "]"
)


_NOT_CJK = re.compile(f"[^{CJK.pattern[1:-1]}]+")
"""Runs of characters that :data:`CJK` does not match: counting them is faster."""


def estimate_tokens(text: str) -> int:
    """Rough token count: one per CJK character (ideographs, kana, Hangul, their
    punctuation and full-width forms: :data:`CJK`), one per started 4 other characters.

    Counted in C where the extension ``processors._text`` is built (branch-free range
    checks, several characters at a time); :func:`reference_estimate_tokens` is its
    Python."""
    if text.isascii():
        return (len(text) + 3) // 4
    if _native_tokens is not None:
        return _native_tokens(text)
    return reference_estimate_tokens(text)


def reference_estimate_tokens(text: str) -> int:
    """:func:`estimate_tokens` in Python."""
    if text.isascii():
        return (len(text) + 3) // 4
    other = sum(map(len, _NOT_CJK.findall(text)))
    return len(text) - other + (other + 3) // 4


def offload(content: str, event_id: str, head_tokens: int) -> str:
    """The short stand-in of an offloaded text: its first sentences that fit in
    ``head_tokens`` estimated tokens (else as many of its first characters), "…",
    and where the full text is: ``[offloaded: N chars, event <id>]``."""
    head = ""
    for sentence in iter_sentences(content):
        gap = " " if head and not (CJK.match(head[-1]) and CJK.match(sentence[0])) else ""
        longer = head + gap + sentence
        if estimate_tokens(longer) > head_tokens:
            break
        head = longer
    if not head:
        head = _prefix(content.strip(), head_tokens).rstrip()
    return f"{head}… [offloaded: {len(content)} chars, event {event_id}]"


def _prefix(text: str, tokens: int) -> str:
    """The longest start of ``text`` whose :func:`estimate_tokens` is at most ``tokens``."""
    cjk = other = 0
    for i, char in enumerate(text):
        if CJK.match(char):
            cjk += 1
        else:
            other += 1
        if cjk + (other + 3) // 4 > tokens:
            return text[:i]
    return text


def turn_of(
    event: Event, params: WorkingParams = DEFAULT_WORKING, name: str | None = None
) -> Turn | None:
    """The working-memory entry an event contributes, if any. ``name`` is
    ``str(event.event_id)``, when known."""
    role: str
    offloaded = False
    fields = event.__dict__  # see processors.build: reading fields
    if type(event) is InteractionRecorded:
        said = fields["body"].__dict__
        role, content = said["role"], said["content"]
    elif type(event) is ToolCalled:
        call = event.body
        role, content = "tool_call", f"{call.tool}({call.arguments})"
    elif type(event) is ToolResult:
        role, content = "tool", event.body.content
        if len(content) > params.offload_chars:
            content = offload(content, str(event.event_id), params.offload_head_tokens)
            offloaded = True
    else:
        return None
    # estimate_tokens(content), its ASCII case inline
    tokens = (len(content) + 3) // 4 if content.isascii() else estimate_tokens(content)
    return trusted(
        Turn,
        {
            "event_id": str(fields["event_id"]) if name is None else name,
            "role": role,
            "content": content,
            "occurred_at": fields["occurred_at"],
            "tokens": tokens,
            "offloaded": offloaded,
        },
        _TURN_GIVEN,
    )


class WorkingMemory:
    """Every open session of one agent; :meth:`apply` returns the change an event
    made to working memory (or None when it changed none)."""

    def __init__(
        self,
        sessions: list[SessionState],
        limit: int,
        params: WorkingParams = DEFAULT_WORKING,
        scoring: ScoringParams = DEFAULT_PARAMS,
    ) -> None:
        self.limit = limit
        self.params = params
        self.scoring = scoring
        self.ttl = _ttl(params)
        self.sessions = {s.session_id: self._working(s) for s in sessions}

    def _working(self, state: SessionState) -> SessionWorking:
        return SessionWorking(state, self.limit, self.params, self.scoring)

    def apply(self, event: Event, name: str | None = None) -> WorkingBody | None:
        """The change ``event`` makes; ``name`` is ``str(event.event_id)``, when known."""
        # ``type(event) is T``, not ``isinstance``: the event types have no subclasses
        # (a test holds them so), and pydantic's ``__instancecheck__`` costs about 900
        # instructions each time it answers no
        if type(event) is ClockTicked:
            return self._expire(event.occurred_at)
        fields = event.__dict__  # see processors.build: reading fields
        sid = fields["session_id"]
        if sid is None:
            return None
        at = fields["occurred_at"]
        old = self.sessions.get(sid)
        if type(event) is SessionEnded:
            if old is None:
                return None
            del self.sessions[sid]
            return old.body(evicted=len(old.turns), cleared=True)
        stale = old is not None and at - old.last_at > self.ttl
        if old is not None and stale:
            del self.sessions[sid]
        body: WorkingBody | None = None
        if type(event) is SessionStarted:
            session = self._session(sid, at)
            session.task = event.body.task
            session.touch(at)
            body = session.body()
        elif type(event) is WorkingSet:
            session = self._session(sid, at)
            session.set(event, self.params)
            body = session.body()
        elif (turn := turn_of(event, self.params, name)) is not None:
            session = self.sessions.get(sid) or self._session(sid, at)
            body = session.add(turn)
        if old is None or not stale:
            return body
        # the idle TTL cleared the session; this event, if it is a turn or a start,
        # opened it afresh (a fresh session neither evicts nor compresses)
        if body is None:
            return old.body(evicted=len(old.turns), cleared=True)
        return updated(body, {"evicted": len(old.turns), "cleared": True})

    def crowd_out(self, keep: str | None) -> WorkingBody | None:
        """Past ``max_sessions`` open sessions, clear the least recently active ones
        (oldest last activity, then session id), never ``keep``: a session-less delta
        naming them, like a tick's (None: nothing to clear). Cheap when under the cap."""
        over = len(self.sessions) - self.params.max_sessions
        if over <= 0:
            return None
        order = ((s.last_at, sid) for sid, s in self.sessions.items() if sid != keep)
        return self._clear(sorted(sid for _, sid in heapq.nsmallest(over, order)))

    def _expire(self, at: datetime) -> WorkingBody | None:
        """At a clock.tick: clear every idle session."""
        return self._clear(sorted(sid for sid, s in self.sessions.items() if s.idle(at)))

    def _clear(self, expired: list[str]) -> WorkingBody | None:
        """Drop the sessions ``expired`` (sorted) whole: the session-less delta."""
        if not expired:
            return None
        for sid in expired:
            del self.sessions[sid]
        return trusted(
            WorkingBody,
            {
                "added": [],
                "evicted": 0,
                "prepended": [],
                "size": 0,
                "tokens": 0,
                "task": None,
                "variables": {},
                "scratchpad": None,
                "cleared": True,
                "expired": expired,
            },
            _EXPIRED_GIVEN,
        )

    def _session(self, sid: str, at: datetime) -> SessionWorking:
        session = self.sessions.get(sid)
        if session is None:
            fresh = trusted(
                SessionState,
                {
                    "session_id": sid,
                    "turns": [],
                    "task": None,
                    "variables": {},
                    "scratchpad": None,
                    "dropped": 0,
                    "compressed": 0,
                    "last_at": at,
                },
                _FRESH_GIVEN,
            )
            session = self.sessions[sid] = self._working(fresh)
        return session

    def state(self) -> list[SessionState]:
        return [s.state() for s in self.sessions.values()]


def _load_native_tokens() -> Callable[[str], int] | None:
    """``processors._text.estimate_tokens``, or None where it is not built
    (``ENGRAM_PURE_PYTHON=1``)."""
    try:
        from processors._text import estimate_tokens
    except ImportError:
        return None
    return estimate_tokens


_native_tokens: Final = _load_native_tokens()
"""A final name: compiled code reads it without a lookup in the module's globals."""
