"""L2 episodic memory: sessions cut into episodes, each with a summary and scores.

An open episode collects a session's turns. It closes at ``session.ended``, when
the next turn (or a ``clock.tick``) comes more than ``idle_gap_s`` of event time
after the last one, or when it holds ``max_turns`` turns. A closed episode
becomes an ``episode.closed`` event and an L2 memory; a single turn whose
importance reaches ``single_turn_importance`` becomes an L2 memory at once.
Scores supplied by the agent win over the heuristic ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from processors.build import fields, trusted
from processors.ids import canonical_text, uuid5_str
from processors.memories import NewMemory
from processors.scoring import DEFAULT_PARAMS, aggregate_values, analyse_turn, analysis
from processors.state import EpisodeParams, EpisodesState, EpisodeTurn, OpenEpisode, ScoringParams
from processors.summary import SUMMARISER_NAME, summarise_texts
from schemas import ClockTicked, EpisodeBody, Event, InteractionRecorded, SessionEnded

Cut = Literal["session_ended", "idle_gap", "turn_count"]


Said = tuple[str, str, str, datetime, float, float, float, tuple[str, ...]]
"""An open episode's turn as the fold keeps it: an :class:`EpisodeTurn`'s fields, in
order, in a plain tuple (``entities`` a tuple too). The cyclic garbage collector stops
scanning a tuple of immutable values once it has seen it, while it scans a model at
every full collection, and open episodes hold many turns. Read by the indices below."""
EVENT_ID: Final = 0
ROLE: Final = 1
CONTENT: Final = 2
AT: Final = 3
IMPORTANCE: Final = 4
SENTIMENT: Final = 5
CONFIDENCE: Final = 6
ENTITIES: Final = 7


def said(turn: EpisodeTurn) -> Said:
    """The fold's tuple of an :class:`EpisodeTurn`."""
    values = turn.__dict__
    return (
        values["event_id"],
        values["role"],
        values["content"],
        values["at"],
        values["importance"],
        values["sentiment"],
        values["confidence"],
        tuple(values["entities"]),
    )


def episode_turn(turn: Said) -> EpisodeTurn:
    """The :class:`EpisodeTurn` of one of the fold's tuples (see :data:`Said`)."""
    values = dict(zip(_TURN_FIELDS, turn, strict=True))
    values["entities"] = list(turn[ENTITIES])
    return trusted(EpisodeTurn, values, _TURN_GIVEN)


def memory_id_of(kind: str, agent_id: str, source: str) -> str:
    """The deterministic id of the memory a source (an event or episode) of
    ``agent_id`` makes. The agent is part of it: event ids are unique per agent only
    (its fold drops repeats), and two agents' memories must never share an id (the
    vector store keys points by it)."""
    return uuid5_str(f"{kind}:{agent_id}:{source}")


@dataclass(frozen=True)
class EpisodeOutput:
    """What folding one event into the episodes produced."""

    closed: list[EpisodeBody]
    memories: list[NewMemory]


NOTHING: Final[tuple[list[EpisodeBody], list[NewMemory]]] = ([], [])
"""What most events make: no closed episode, no memory (never mutated)."""


class Episodes:
    def __init__(
        self,
        state: EpisodesState,
        params: EpisodeParams,
        scoring: ScoringParams,
        agent_id: str,
    ) -> None:
        self.agent_id = agent_id
        """Whose episodes: part of every memory and episode id (:func:`memory_id_of`)."""
        self.open = {o.session_id: _Open.of(o) for o in state.open}
        self.previous = dict(state.previous)
        self.params = params
        self.scoring = scoring
        self.gap = timedelta(seconds=params.idle_gap_s)
        self.single = params.single_turn_importance
        self.max_turns = params.max_turns

    def apply(self, event: Event) -> EpisodeOutput:
        closed, memories = self.step(event)
        return EpisodeOutput(list(closed), list(memories))

    def step(
        self, event: Event, name: str | None = None
    ) -> tuple[list[EpisodeBody], list[NewMemory]]:
        """:meth:`apply`, as ``(closed, memories)``; ``name`` is ``str(event.event_id)``,
        when known. The lists returned must not be changed."""
        if type(event) is not InteractionRecorded:
            return self._other(event)
        fields = event.__dict__  # see processors.build: reading fields
        sid = fields["session_id"]
        if sid is None:
            return NOTHING
        closed: list[EpisodeBody] = []
        memories: list[NewMemory] = []
        at = fields["occurred_at"]
        current = self.open.get(sid)
        if current is not None and (turns := current.turns) and at - turns[-1][AT] > self.gap:
            self._close(sid, "idle_gap", closed, memories)  # the idle gap: see _idle
            current = None
        turn = self._turn(event, name, fields)
        if current is None:
            current = self.open[sid] = _Open.new(sid, fields["user_id"])
        elif current.user_id is None:
            # the first user its turns name owns the episode (a greeting before the user
            # spoke names none): erasing that user then erases the episode
            current.user_id = fields["user_id"]
        current.turns.append(turn)
        if turn[IMPORTANCE] >= self.single:
            memories.append(self._turn_memory(turn, fields["user_id"], sid))
        if len(current.turns) >= self.max_turns:
            self._close(sid, "turn_count", closed, memories)
        if closed or memories:
            return closed, memories
        return NOTHING

    def _other(self, event: Event) -> tuple[list[EpisodeBody], list[NewMemory]]:
        """:meth:`step` for every event but a turn: a tick or a session's end may cut."""
        if type(event) is ClockTicked:
            if not self.open:
                return NOTHING
            closed: list[EpisodeBody] = []
            memories: list[NewMemory] = []
            for idle in sorted(self.open):
                if self._idle(self.open[idle], event.occurred_at):
                    self._close(idle, "idle_gap", closed, memories)
            return closed, memories
        sid = event.session_id
        if sid is None or type(event) is not SessionEnded or sid not in self.open:
            return NOTHING
        closed, memories = [], []
        self._close(sid, "session_ended", closed, memories)
        return closed, memories

    def _idle(self, episode: _Open, at: datetime) -> bool:
        turns = episode.turns
        return bool(turns) and at - turns[-1][AT] > self.gap

    def _turn(
        self,
        event: InteractionRecorded,
        name: str | None = None,
        fields: dict[str, Any] | None = None,
    ) -> Said:
        """The episode's record of a turn; ``fields`` is the event's ``__dict__``."""
        if fields is None:
            fields = event.__dict__
        body = fields["body"].__dict__  # see processors.build: reading fields
        content = body["content"]
        importance, sentiment, confidence = (
            body["importance"],
            body["sentiment"],
            body["confidence"],
        )
        found: tuple[str, ...] | list[str]
        if importance is None and sentiment is None and confidence is None:
            scores, found = analysis(content, self.scoring)  # analyse_turn's common case
        else:
            scores, found = analyse_turn(
                content,
                importance=importance,
                sentiment=sentiment,
                confidence=confidence,
                params=self.scoring,
            )
        given = body["entities"]
        # found: at most 10 entities, without repeats (extract_entities' contract)
        entities = tuple(dict.fromkeys([*given, *found]))[:10] if given else tuple(found)
        return (
            str(fields["event_id"]) if name is None else name,
            body["role"],
            content,
            fields["occurred_at"],
            scores.importance,
            scores.sentiment,
            scores.confidence,
            entities,
        )

    def _turn_memory(self, turn: Said, user_id: str | None, session_id: str) -> NewMemory:
        source = turn[EVENT_ID]
        return NewMemory(  # positional (in field order): the faster call
            memory_id_of("turn", self.agent_id, source),  # memory_id
            "L2",  # layer
            "turn",  # kind
            turn[CONTENT],  # text
            turn[IMPORTANCE],
            turn[SENTIMENT],
            turn[CONFIDENCE],
            list(turn[ENTITIES]),
            [source],  # sources
            turn[AT],
            user_id,
            session_id,
        )

    def _close(
        self, sid: str, cut: Cut, closed: list[EpisodeBody], memories: list[NewMemory]
    ) -> None:
        episode = self.open.pop(sid)
        if not episode.turns:
            return
        turns = episode.turns
        importance, sentiment, confidence = aggregate_values(
            [t[IMPORTANCE] for t in turns],
            [t[SENTIMENT] for t in turns],
            [t[CONFIDENCE] for t in turns],
            DEFAULT_PARAMS,
        )
        episode_id = memory_id_of("episode", self.agent_id, canonical_text(turns[0][EVENT_ID]))
        entities = list(dict.fromkeys(e for t in turns for e in t[ENTITIES]))[:20]
        sources = [t[EVENT_ID] for t in turns]
        summary = summarise_texts(
            [t[CONTENT] for t in turns],
            max_chars=self.params.summary_chars,
            params=self.scoring,
        )
        body = trusted(
            EpisodeBody,
            {
                "episode_id": episode_id,
                "summary": summary,
                "importance": importance,
                "sentiment": sentiment,
                "confidence": confidence,
                "entities": entities,
                "turn_count": len(turns),
                "started_at": turns[0][AT],
                "ended_at": turns[-1][AT],
                "previous_episode_id": self.previous.get(episode.user_id or ""),
                "cut": cut,
                "sources": sources,
                "summariser": SUMMARISER_NAME,
            },
            _BODY_GIVEN,
        )
        self.previous[episode.user_id or ""] = episode_id
        closed.append(body)
        memories.append(
            NewMemory(
                memory_id=episode_id,
                layer="L2",
                kind="episode",
                text=summary,
                importance=importance,
                sentiment=sentiment,
                confidence=confidence,
                entities=entities,
                sources=sources,
                at=turns[-1][AT],
                user_id=episode.user_id,
                session_id=episode.session_id,
            )
        )

    def state(self) -> EpisodesState:
        return EpisodesState(
            open=[self.open[k].state() for k in sorted(self.open)],
            previous={k: self.previous[k] for k in sorted(self.previous)},
        )


class _Open:
    """An open episode, as the fold keeps it (its turns grow in place)."""

    __slots__ = ("session_id", "turns", "user_id")

    def __init__(self, session_id: str, user_id: str | None, turns: list[Said]) -> None:
        self.session_id = session_id
        self.user_id = user_id
        self.turns = turns

    @classmethod
    def of(cls, state: OpenEpisode) -> _Open:
        """The open episode ``state`` saved."""
        return cls(state.session_id, state.user_id, [said(turn) for turn in state.turns])

    @classmethod
    def new(cls, session_id: str, user_id: str | None) -> _Open:
        """An episode opened by its first turn, which the caller appends."""
        return cls(session_id, user_id, [])

    def state(self) -> OpenEpisode:
        turns = [episode_turn(turn) for turn in self.turns]
        return OpenEpisode(session_id=self.session_id, user_id=self.user_id, turns=turns)


_TURN_FIELDS = tuple(EpisodeTurn.model_fields)
_TURN_GIVEN = fields(_TURN_FIELDS)
_BODY_GIVEN: Final = fields(EpisodeBody.model_fields)
