"""L2/L3 memory items of one agent: creation, flashbulb promotion, reinforcement,
weakening and forgetting, all decided by event time.

A memory is created from an episode or a single important turn (L2), or by
abstraction (L3 semantic). Flashbulb moments (importance above the bar and a
strong sentiment) are promoted to L3 core at once: kept verbatim, never
forgotten. Recalls and useful feedback reinforce a memory; corrections weaken
it; at a ``clock.tick`` every unprotected L2 memory whose retention fell below
the threshold is forgotten (it leaves recall and the fold's state; history keeps it).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from processors.forgetting import (
    ForgettingParams,
    Trace,
    new_trace,
    reinforce,
    retention,
    should_forget,
    weaken,
)
from schemas import (
    DerivedEvent,
    ForgottenBody,
    MemoryCreated,
    MemoryCreatedBody,
    MemoryForgotten,
    MemoryPromoted,
    MemoryReinforced,
    MemoryWeakened,
    Model,
    PromotedBody,
    StrengthChangeBody,
)
from schemas.base import Importance, Signed

Kind = Literal["turn", "episode", "semantic", "core", "fact"]


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


@dataclass(frozen=True)
class NewMemory:
    """A memory a processor wants created; the registry gives it a trace."""

    memory_id: str
    layer: Literal["L2", "L3"]
    kind: Kind
    text: str
    importance: float
    sentiment: float
    confidence: float
    entities: list[str]
    sources: list[str]
    at: datetime
    user_id: str | None
    session_id: str | None = None


Change = tuple[type[DerivedEvent], Model]


def promotion(new: NewMemory, reason: Literal["flashbulb", "abstraction"]) -> Change:
    """``memory.promoted`` from L2 to L3 for ``reason``, listing the memory's sources."""
    body = PromotedBody(
        memory_id=new.memory_id, from_layer="L2", to_layer="L3", reason=reason, sources=new.sources
    )
    return (MemoryPromoted, body)


class Memories:
    """The live L2/L3 memories of one agent (forgotten ones are dropped)."""

    def __init__(
        self, items: list[MemoryItem], forgetting: ForgettingParams, promotion: PromotionParams
    ) -> None:
        self.items = {item.memory_id: item for item in items}
        self.forgetting = forgetting
        self.promotion = promotion

    def create(self, new: NewMemory) -> list[Change]:
        """``memory.created``, then ``memory.promoted`` if it is a flashbulb moment."""
        if new.memory_id in self.items:
            return []
        trace = new_trace(new.importance, new.at, self.forgetting)
        item = MemoryItem(
            memory_id=new.memory_id,
            layer=new.layer,
            kind=new.kind,
            importance=new.importance,
            sentiment=new.sentiment,
            user_id=new.user_id,
            created_at=new.at,
            trace=trace,
            promoted=new.layer == "L3",
        )
        body = MemoryCreatedBody(
            memory_id=new.memory_id,
            layer=new.layer,
            kind=new.kind,
            text=new.text,
            importance=new.importance,
            sentiment=new.sentiment,
            confidence=new.confidence,
            entities=new.entities,
            sources=new.sources,
            strength=trace.strength_days,
        )
        changes: list[Change] = [(MemoryCreated, body)]
        if new.kind == "semantic":
            changes.append(promotion(new, "abstraction"))
        elif new.layer == "L2" and self.is_flashbulb(new.importance, new.sentiment):
            item = item.model_copy(update={"layer": "L3", "promoted": True})
            changes.append(promotion(new, "flashbulb"))
        self.items[new.memory_id] = item
        return changes

    def is_flashbulb(self, importance: float, sentiment: float) -> bool:
        bar = self.promotion
        return importance > bar.flashbulb_importance and abs(sentiment) >= bar.flashbulb_sentiment

    def recalled(self, memory_ids: list[str], at: datetime, reason: str) -> list[Change]:
        """Reinforce each live memory among ``memory_ids`` once (duplicates ignored)."""
        changes: list[Change] = []
        for memory_id in dict.fromkeys(memory_ids):
            item = self.items.get(memory_id)
            if item is None:
                continue
            trace = reinforce(item.trace, at, self.forgetting)
            self.items[memory_id] = item.model_copy(update={"trace": trace})
            changes.append((MemoryReinforced, self._strength(memory_id, trace, reason)))
        return changes

    def corrected(self, memory_id: str, at: datetime, reason: str) -> list[Change]:
        """Weaken a live memory (a lapse); enough lapses invalidate it."""
        item = self.items.get(memory_id)
        if item is None:
            return []
        trace = weaken(item.trace, at, self.forgetting)
        self.items[memory_id] = item.model_copy(update={"trace": trace})
        return [(MemoryWeakened, self._strength(memory_id, trace, reason))]

    def sweep(self, at: datetime) -> list[Change]:
        """At a tick: forget every unprotected memory that fell below the threshold."""
        changes: list[Change] = []
        for memory_id in sorted(self.items):
            item = self.items[memory_id]
            protected = item.layer == "L3" or item.promoted
            if should_forget(item.trace, at, self.forgetting, protected=protected):
                value = retention(item.trace, at, self.forgetting)
                changes.append(
                    (MemoryForgotten, ForgottenBody(memory_id=memory_id, retention=value))
                )
                del self.items[memory_id]
        return changes

    @staticmethod
    def _strength(memory_id: str, trace: Trace, reason: str) -> StrengthChangeBody:
        return StrengthChangeBody(
            memory_id=memory_id,
            strength=trace.strength_days,
            reinforcements=trace.reinforcements,
            reason=reason,
            invalidated=trace.invalidated,
        )

    def state(self) -> list[MemoryItem]:
        return [self.items[k] for k in sorted(self.items)]
