"""The fold's parameters and serialised state: the pydantic models of ``processors/``.

They live apart from the fold's logic because the logic's modules are compiled by
mypyc (``setup.py``), which does not compile pydantic models: a model's fields,
defaults and validators are read by pydantic at class creation, from plain Python.
Each model is documented where the fold uses it; the modules of the fold import
them from here.
"""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Annotated, Literal
from uuid import UUID

from pydantic import Field

from processors.cues import (
    CONFIDENCE_CUES,
    IMPORTANCE_MARKERS,
    INTENSIFIERS,
    NEGATORS,
    POLARITY,
)
from processors.forgetting import Trace
from processors.persona import PersonaState, SkillsState
from schemas import Model, Turn
from schemas.base import Importance, Signed, Unit, UtcMillis

Kind = Literal["turn", "episode", "semantic", "core", "fact"]
"""What a memory was made from."""


class ScoringParams(Model):
    """Every number of the default scorer and summariser; defaults are the shipped ones.

    Importance (1..10) = ``importance_base`` + min(Σ distinct markers,
    ``marker_cap``) + min(``entity_weight`` · #entities, ``entity_cap``) +
    ``length_max`` · min(1, words / ``length_scale``) + ``exclaim_importance`` (if
    any ``!``) + ``arousal_weight`` · |sentiment|, where words = Latin words +
    CJK characters / ``cjk_chars_per_word``.

    Sentiment (-1..1) = tanh(``sentiment_gain`` · Σ cue polarity · m), with
    m = −``negation_factor`` for a negated cue, ``intensifier_boost`` for an
    intensified one, else 1; the sum is amplified by ``exclaim_sentiment`` per
    ``!`` (at most three).

    Confidence (0..1) = ``confidence_base`` + Σ distinct confidence cues −
    ``question_penalty`` (if a question), clamped to [``confidence_min``,
    ``confidence_max``].
    """

    importance_base: Annotated[float, Field(ge=1.0, le=10.0)] = 2.0
    marker_cap: Annotated[float, Field(ge=0.0)] = 6.0
    entity_weight: Annotated[float, Field(ge=0.0)] = 0.4
    entity_cap: Annotated[float, Field(ge=0.0)] = 1.5
    length_max: Annotated[float, Field(ge=0.0)] = 1.5
    length_scale: Annotated[float, Field(gt=0.0)] = 30.0
    cjk_chars_per_word: Annotated[float, Field(gt=0.0)] = 1.5
    exclaim_importance: Annotated[float, Field(ge=0.0)] = 0.5
    arousal_weight: Annotated[float, Field(ge=0.0)] = 1.5
    sentiment_gain: Annotated[float, Field(gt=0.0)] = 1.0
    negation_factor: Annotated[float, Field(ge=0.0, le=1.0)] = 0.75
    intensifier_boost: Annotated[float, Field(ge=1.0)] = 1.3
    exclaim_sentiment: Annotated[float, Field(ge=0.0)] = 0.1
    negation_window: Annotated[int, Field(ge=1)] = 3
    confidence_base: Annotated[float, Field(ge=0.0, le=1.0)] = 0.7
    confidence_min: Annotated[float, Field(ge=0.0, le=1.0)] = 0.1
    confidence_max: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0
    question_penalty: Annotated[float, Field(ge=0.0)] = 0.1
    episode_peak_weight: Annotated[float, Field(ge=0.0, le=1.0)] = 0.7
    summary_tf_weight: Annotated[float, Field(ge=0.0)] = 1.0
    summary_position_weight: Annotated[float, Field(ge=0.0)] = 0.2
    summary_importance_weight: Annotated[float, Field(ge=0.0)] = 1.0
    summary_redundancy: Annotated[float, Field(gt=0.0, le=1.0)] = 0.6
    importance_markers: dict[str, Annotated[float, Field(ge=0.0)]] = Field(
        default_factory=lambda: dict(IMPORTANCE_MARKERS)
    )
    polarity: dict[str, Annotated[float, Field(ge=-1.0, le=1.0)]] = Field(
        default_factory=lambda: dict(POLARITY)
    )
    confidence_cues: dict[str, float] = Field(default_factory=lambda: dict(CONFIDENCE_CUES))
    negators: tuple[str, ...] = NEGATORS
    negator_chars: str = "不没别未无"
    intensifiers: tuple[str, ...] = INTENSIFIERS


class WorkingParams(Model):
    """L1 parameters besides the turn cap, which is ``MemoryConfig.working_turns``.

    ``compress_to``: when compression runs, the turns kept verbatim are brought
    under this fraction of the budget, the rest being left for the summary, so
    that compression does not run again at every new turn.
    """

    token_budget: Annotated[int, Field(ge=1)] = 2000
    compress_to: Annotated[float, Field(gt=0, le=1)] = 0.75
    summary_chars: Annotated[int, Field(ge=16)] = 400
    offload_chars: Annotated[int, Field(ge=1)] = 2000
    offload_head_tokens: Annotated[int, Field(ge=1)] = 50
    idle_ttl_s: Annotated[float, Field(gt=0)] = 7200.0
    max_sessions: Annotated[int, Field(ge=1)] = 256
    """Open sessions per agent; past it the least recently active ones are cleared.

    Working memory is part of the agent's state, saved whole (at one flush in ten, see
    ``streams.pipeline.STATE_SAVE_EVERY``; at every flush before): without
    a cap an agent that opens sessions faster than the idle TTL clears them grows its
    state without end (measured: 1 000 sessions of 20 short turns, 3.9 MB, 45–75 ms
    to serialise per flush), past the 8 MiB a record of the state changelog may
    hold. 256 sessions of 20 short turns measured 1.0 MB; at a full token budget
    (2 000 tokens, about 8 000 Latin characters each) they would be about 2 MB."""


class SessionState(Model):
    """Serialised form of one session's working memory. ``dropped`` counts the
    entries that left without a trace (turn cap, last-resort eviction);
    ``compressed`` those folded into the summary."""

    session_id: str
    turns: list[Turn] = []
    task: str | None = None
    variables: dict[str, str] = {}
    scratchpad: str | None = None
    dropped: int = 0
    compressed: int = 0
    last_at: datetime


class EpisodeParams(Model):
    idle_gap_s: Annotated[float, Field(gt=0)] = 1800.0
    max_turns: Annotated[int, Field(ge=1)] = 20
    single_turn_importance: Annotated[float, Field(ge=1, le=10)] = 8.0
    summary_chars: Annotated[int, Field(ge=40)] = 600


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
    """Open episodes, and the last closed episode of each user of the agent (``""``:
    episodes without a user), which the next one of that user links to. The chain
    is per user: one user's episodes never name another's, so erasing a user leaves
    the others' chains as if that user had never been."""

    open: list[OpenEpisode] = []
    previous: dict[str, str] = {}


class PromotionParams(Model):
    """Flashbulb bar: importance above ``flashbulb_importance`` and |sentiment| at
    least ``flashbulb_sentiment``."""

    flashbulb_importance: Annotated[float, Field(ge=1, le=10)] = 8.0
    flashbulb_sentiment: Annotated[float, Field(ge=0, le=1)] = 0.7


class MemoryItem(Model):
    """What the fold keeps of one live memory (its text lives in history)."""

    memory_id: str
    layer: Literal["L2", "L3"]
    kind: Kind
    importance: Importance
    sentiment: Signed
    user_id: str | None = None
    created_at: datetime
    trace: Trace
    promoted: bool = False


class ConsolidationParams(Model):
    window_s: Annotated[float, Field(gt=0)] = 86_400.0
    min_episodes: Annotated[int, Field(ge=1)] = 2
    summary_chars: Annotated[int, Field(ge=40)] = 400


class WindowEpisode(Model):
    episode_id: str
    summary: str
    importance: float
    sentiment: float
    confidence: float
    entities: list[str] = []


class Window(Model):
    user_id: str | None = None
    start: UtcMillis
    episodes: list[WindowEpisode] = []


class ConsolidationState(Model):
    windows: list[Window] = []


class FactVersion(Model):
    """One value of a fact over ``[valid_from, valid_to)``; ``valid_to`` None = current.

    ``asserted_by`` is the ``event_id`` of the ``fact.asserted`` that set it.
    """

    value: str
    valid_from: UtcMillis
    valid_to: UtcMillis | None = None
    asserted_by: UUID
    confidence: Unit | None = None
    user_id: str | None = None
    """The user of the assertion (what erasure purges by)."""

    def holds_at(self, at: datetime) -> bool:
        """Whether ``at`` (aware) lies in ``[valid_from, valid_to)``."""
        return self.valid_from <= at and (self.valid_to is None or at < self.valid_to)


class FactHistory(Model):
    """Every version of one ``(namespace, key)``, oldest first."""

    namespace: str
    key: str
    versions: list[FactVersion]


class FactsState(Model):
    """Serialised facts of one agent: one history per key, sorted by ``(namespace, key)``."""

    facts: list[FactHistory] = []


class AgentState(Model):
    """Serialised memory of one agent: what is needed to resume the fold exactly.

    ``recent_ids`` is the base64 of the 16-byte ids of the agent's last
    ``dedupe_window`` events, oldest first, packed end to end.
    """

    agent_id: str
    seq: int = -1
    recent_ids: str = ""
    sessions: list[SessionState] = []
    episodes: EpisodesState = EpisodesState()
    memories: list[MemoryItem] = []
    consolidation: ConsolidationState = ConsolidationState()
    facts: FactsState = FactsState()
    persona: PersonaState = PersonaState()
    skills: SkillsState = SkillsState()
    session_users: dict[str, str] = {}
    """The user of each open session that has one (the first its events named)."""
    persona_users: list[str | None] = []
    """The user of each persona version's update, in step with ``persona.versions``."""

    def recent(self) -> list[bytes]:
        packed = base64.b64decode(self.recent_ids)
        return [packed[i : i + 16] for i in range(0, len(packed), 16)]
