"""The shapes recall and snapshots return: plain pydantic models, light to import
(the client needs them without the vector store or the embedding models)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

DEFAULT_EPISODES = 10
"""How many of the latest episodes a snapshot carries unless asked otherwise."""


class RecalledMemory(BaseModel):
    """One recalled memory, with its score and the parts of it."""

    memory_id: str
    text: str
    layer: str
    kind: str
    score: float
    relevance: float
    retention: float
    recency: float
    importance: float
    strength: float
    reinforcements: int
    forgotten: bool
    session_id: str | None
    user_id: str | None
    created_at: datetime
    last_reinforced_at: datetime
    sources: list[str]


class RecallResult(BaseModel):
    """What a recall returned; ``event_id`` is the ``memory.recalled`` that records it."""

    query: str
    agent_id: str
    user_id: str | None
    memories: list[RecalledMemory]
    event_id: uuid.UUID | None = None


class Position(BaseModel):
    """The log position a snapshot reflects: the agent's sequence number of the
    last event folded (-1 for an agent without events) and when it occurred."""

    seq: int
    last_event_at: datetime | None = None
    events_folded: int = 0
    skipped: int = 0


class SnapshotMemory(BaseModel):
    """One live L2/L3 memory in a snapshot, with its retention at the snapshot's
    ``retention_at``. ``text`` is filled only by the history road (the fold keeps
    no texts); ``last_reinforced_at`` is the creation or latest reinforcement."""

    model_config = ConfigDict(frozen=True)

    memory_id: str
    layer: str
    kind: str
    importance: float
    sentiment: float
    user_id: str | None
    created_at: datetime
    last_reinforced_at: datetime
    strength_days: float
    reinforcements: int
    lapses: int
    invalidated: bool
    promoted: bool
    retention: float
    text: str | None = None


class Snapshot(BaseModel):
    """An agent's memory at one position of its log.

    ``memories`` counts the live memories per layer; ``memory_items`` lists them
    (narrowed to ``user_id`` when given), sorted by id, with their retention at
    ``retention_at`` (``as_of``, else the time of the last event folded); the latest
    snapshot (no ``as_of``) leaves the list empty unless asked.
    ``road`` says how it was made: ``replay`` (the fold) or ``history`` (SQL).
    """

    model_config = ConfigDict(frozen=True)

    agent_id: str
    user_id: str | None = None
    session_id: str | None = None
    as_of: datetime | None = None
    position: Position
    working: list[dict[str, Any]]
    episodes: list[dict[str, Any]]
    facts: list[dict[str, Any]]
    persona: dict[str, Any] | None
    skills: list[dict[str, Any]]
    memories: dict[str, int]
    config_version: str
    memory_items: list[SnapshotMemory] = []
    retention_at: datetime | None = None
    road: str = "replay"
