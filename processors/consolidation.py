"""Consolidation by abstraction: the episodes of one agent and user within a window
of event time (default one day) become one L3 semantic memory listing its sources.

A window closes when the log shows an event (or a tick) at or after its end; a
window with fewer than ``min_episodes`` episodes is dropped unconsolidated.
Deterministic: the memory's id is a ``uuid5`` of the agent, user and window.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import uuid5

from processors.build import fields, trusted, updated
from processors.ids import ENGRAM_NAMESPACE
from processors.memories import NewMemory
from processors.scoring import Scores, aggregate
from processors.state import (
    ConsolidationParams,
    ConsolidationState,
    ScoringParams,
    Window,
    WindowEpisode,
)
from processors.summary import summarise_texts
from schemas import EpisodeBody

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Consolidation:
    """Open abstraction windows of one agent, keyed by user and window start."""

    def __init__(
        self, state: ConsolidationState, params: ConsolidationParams, scoring: ScoringParams
    ) -> None:
        self.windows = {(w.user_id or "", w.start): w for w in state.windows}
        self.params = params
        self.scoring = scoring
        self.size = timedelta(seconds=params.window_s)
        self.first_end = self._first_end()

    def _first_end(self) -> datetime | None:
        """When the earliest open window ends (None: no window is open)."""
        if not self.windows:
            return None
        return min(w.start for w in self.windows.values()) + self.size

    def window_start(self, at: datetime) -> datetime:
        size = self.params.window_s
        offset = (at - EPOCH).total_seconds()
        return EPOCH + timedelta(seconds=offset - offset % size)

    def add(self, episode: EpisodeBody, user_id: str | None) -> None:
        start = self.window_start(episode.ended_at)
        key = (user_id or "", start)
        window = self.windows.get(key) or _window(user_id, start)
        entry = trusted(
            WindowEpisode,
            {
                "episode_id": episode.episode_id,
                "summary": episode.summary,
                "importance": episode.importance,
                "sentiment": episode.sentiment,
                "confidence": episode.confidence,
                "entities": episode.entities,
            },
            _ENTRY_GIVEN,
        )
        self.windows[key] = updated(window, {"episodes": [*window.episodes, entry]})
        end = start + self.size
        if self.first_end is None or end < self.first_end:
            self.first_end = end

    def due(self, agent_id: str, at: datetime) -> list[NewMemory]:
        """Consolidate every window that ended at or before ``at``."""
        if self.first_end is None or self.first_end > at:
            return []
        size = self.size
        out = []
        for key in sorted(self.windows):
            window = self.windows[key]
            if window.start + size > at:
                continue
            del self.windows[key]
            if len(window.episodes) >= self.params.min_episodes:
                out.append(self._memory(agent_id, window, window.start + size))
        self.first_end = self._first_end()
        return out

    def _memory(self, agent_id: str, window: Window, end: datetime) -> NewMemory:
        episodes = window.episodes
        scores = aggregate(
            [Scores(e.importance, e.sentiment, e.confidence) for e in episodes], self.scoring
        )
        text = summarise_texts(
            [e.summary for e in episodes],
            max_chars=self.params.summary_chars,
            params=self.scoring,
        )
        name = f"semantic:{agent_id}:{window.user_id or ''}:{window.start.isoformat()}"
        return NewMemory(
            memory_id=str(uuid5(ENGRAM_NAMESPACE, name)),
            layer="L3",
            kind="semantic",
            text=text,
            importance=scores.importance,
            sentiment=scores.sentiment,
            confidence=scores.confidence,
            entities=list(dict.fromkeys(x for e in episodes for x in e.entities))[:20],
            sources=[e.episode_id for e in episodes],
            at=end,
            user_id=window.user_id,
        )

    def state(self) -> ConsolidationState:
        return ConsolidationState(windows=[self.windows[k] for k in sorted(self.windows)])


_ENTRY_GIVEN = fields(WindowEpisode.model_fields)
_WINDOW_GIVEN = fields(["user_id", "start"])


def _window(user_id: str | None, start: datetime) -> Window:
    """``Window(user_id=user_id, start=start)``, not validated when it is valid already
    (a window's start is whole seconds of UTC, :meth:`Consolidation.window_start`):
    validating it cost some 30 000 instructions, a tenth of a closing episode's."""
    if start.tzinfo is UTC and not start.microsecond % 1000 and type(user_id) in _USERS:
        return trusted(Window, {"user_id": user_id, "start": start, "episodes": []}, _WINDOW_GIVEN)
    return Window(user_id=user_id, start=start)


_USERS = frozenset({str, type(None)})
