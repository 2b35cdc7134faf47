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
from typing import Annotated, Literal
from uuid import UUID, uuid5

from pydantic import Field

from processors.ids import ENGRAM_NAMESPACE
from processors.memories import NewMemory
from processors.scoring import Scores, ScoringParams, aggregate, analyse_turn
from processors.summary import SUMMARISER_NAME, summarise
from schemas import ClockTicked, EpisodeBody, Event, InteractionRecorded, Model, SessionEnded
from schemas.base import UtcMillis

Cut = Literal["session_ended", "idle_gap", "turn_count"]


class EpisodeParams(Model):
    idle_gap_s: Annotated[float, Field(gt=0)] = 1800.0
    max_turns: Annotated[int, Field(ge=1)] = 20
    single_turn_importance: Annotated[float, Field(ge=1, le=10)] = 8.0
    summary_chars: Annotated[int, Field(ge=40)] = 280


class EpisodeTurn(Model):
    event_id: str
    role: str
    content: str
    at: UtcMillis
    importance: float
    sentiment: float
    confidence: float
    entities: list[str] = []


class OpenEpisode(Model):
    session_id: str
    user_id: str | None = None
    turns: list[EpisodeTurn] = []


class EpisodesState(Model):
    open: list[OpenEpisode] = []
    previous_episode_id: str | None = None


def memory_id_of(kind: str, source: str) -> str:
    """The deterministic id of the memory a source (an event or episode) makes."""
    return str(uuid5(ENGRAM_NAMESPACE, f"{kind}:{source}"))


@dataclass(frozen=True)
class EpisodeOutput:
    """What folding one event into the episodes produced."""

    closed: list[EpisodeBody]
    memories: list[NewMemory]


class Episodes:
    def __init__(self, state: EpisodesState, params: EpisodeParams, scoring: ScoringParams) -> None:
        self.open = {o.session_id: o.model_copy(deep=True) for o in state.open}
        self.previous = state.previous_episode_id
        self.params = params
        self.scoring = scoring

    def apply(self, event: Event) -> EpisodeOutput:
        closed: list[EpisodeBody] = []
        memories: list[NewMemory] = []
        if isinstance(event, ClockTicked):
            for idle in sorted(self.open):
                if self._idle(self.open[idle], event.occurred_at):
                    self._close(idle, "idle_gap", closed, memories)
            return EpisodeOutput(closed, memories)
        sid = event.session_id
        if sid is None:
            return EpisodeOutput(closed, memories)
        if isinstance(event, SessionEnded):
            if sid in self.open:
                self._close(sid, "session_ended", closed, memories)
            return EpisodeOutput(closed, memories)
        if not isinstance(event, InteractionRecorded):
            return EpisodeOutput(closed, memories)
        current = self.open.get(sid)
        if current is not None and self._idle(current, event.occurred_at):
            self._close(sid, "idle_gap", closed, memories)
        turn = self._turn(event)
        episode = self.open.setdefault(sid, OpenEpisode(session_id=sid, user_id=event.user_id))
        episode.turns.append(turn)
        if turn.importance >= self.params.single_turn_importance:
            memories.append(self._turn_memory(turn, event.user_id, sid))
        if len(episode.turns) >= self.params.max_turns:
            self._close(sid, "turn_count", closed, memories)
        return EpisodeOutput(closed, memories)

    def _idle(self, episode: OpenEpisode, at: datetime) -> bool:
        gap = timedelta(seconds=self.params.idle_gap_s)
        return bool(episode.turns) and at - episode.turns[-1].at > gap

    def _turn(self, event: InteractionRecorded) -> EpisodeTurn:
        body = event.body
        scores, found = analyse_turn(
            body.content,
            importance=body.importance,
            sentiment=body.sentiment,
            confidence=body.confidence,
            params=self.scoring,
        )
        entities = list(dict.fromkeys([*body.entities, *found]))[:10]
        return EpisodeTurn(
            event_id=str(event.event_id),
            role=body.role,
            content=body.content,
            at=event.occurred_at,
            importance=scores.importance,
            sentiment=scores.sentiment,
            confidence=scores.confidence,
            entities=entities,
        )

    @staticmethod
    def _turn_memory(turn: EpisodeTurn, user_id: str | None, session_id: str) -> NewMemory:
        return NewMemory(
            memory_id=memory_id_of("turn", turn.event_id),
            layer="L2",
            kind="turn",
            text=turn.content,
            importance=turn.importance,
            sentiment=turn.sentiment,
            confidence=turn.confidence,
            entities=turn.entities,
            sources=[turn.event_id],
            at=turn.at,
            user_id=user_id,
            session_id=session_id,
        )

    def _close(
        self, sid: str, cut: Cut, closed: list[EpisodeBody], memories: list[NewMemory]
    ) -> None:
        episode = self.open.pop(sid)
        if not episode.turns:
            return
        turns = episode.turns
        scores = aggregate([Scores(t.importance, t.sentiment, t.confidence) for t in turns])
        episode_id = str(uuid5(ENGRAM_NAMESPACE, f"episode:{UUID(turns[0].event_id)}"))
        entities = list(dict.fromkeys(e for t in turns for e in t.entities))[:20]
        sources = [t.event_id for t in turns]
        summary = summarise(
            [(t.role, t.content) for t in turns],
            max_chars=self.params.summary_chars,
            params=self.scoring,
        )
        body = EpisodeBody(
            episode_id=episode_id,
            summary=summary,
            importance=scores.importance,
            sentiment=scores.sentiment,
            confidence=scores.confidence,
            entities=entities,
            turn_count=len(turns),
            started_at=turns[0].at,
            ended_at=turns[-1].at,
            previous_episode_id=self.previous,
            cut=cut,
            sources=sources,
            summariser=SUMMARISER_NAME,
        )
        self.previous = episode_id
        closed.append(body)
        memories.append(
            NewMemory(
                memory_id=episode_id,
                layer="L2",
                kind="episode",
                text=summary,
                importance=scores.importance,
                sentiment=scores.sentiment,
                confidence=scores.confidence,
                entities=entities,
                sources=sources,
                at=turns[-1].at,
                user_id=episode.user_id,
                session_id=episode.session_id,
            )
        )

    def state(self) -> EpisodesState:
        return EpisodesState(
            open=[self.open[k] for k in sorted(self.open)], previous_episode_id=self.previous
        )
