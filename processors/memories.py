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

from datetime import datetime
from typing import Final, Literal

from processors.build import fields, trusted, updated
from processors.forgetting import (
    ForgettingParams,
    Trace,
    forget_from,
    millis_of,
    new_trace,
    reinforce,
    retention,
    should_forget,
    weaken,
)
from processors.state import Kind, MemoryItem, PromotionParams
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


class NewMemory:
    """A memory a processor wants created; the registry gives it a trace.

    Not changed once made. A class of its own with slots, not a named tuple: compiled,
    it is made and read natively (a named tuple's ``__new__`` is Python, its fields
    read by name through the generic attribute lookup), and one is made for every
    important turn and every episode."""

    __slots__ = (
        "at",
        "confidence",
        "entities",
        "importance",
        "kind",
        "layer",
        "memory_id",
        "sentiment",
        "session_id",
        "sources",
        "text",
        "user_id",
    )  # fmt: skip

    def __init__(
        self,
        memory_id: str,
        layer: Literal["L2", "L3"],
        kind: Kind,
        text: str,
        importance: float,
        sentiment: float,
        confidence: float,
        entities: list[str],
        sources: list[str],
        at: datetime,
        user_id: str | None,
        session_id: str | None = None,
    ) -> None:
        self.memory_id = memory_id
        self.layer: Literal["L2", "L3"] = layer
        self.kind: Kind = kind
        self.text = text
        self.importance = importance
        self.sentiment = sentiment
        self.confidence = confidence
        self.entities = entities
        self.sources = sources
        self.at = at
        self.user_id = user_id
        self.session_id = session_id


Change = tuple[type[DerivedEvent], Model]


def promotion(new: NewMemory, reason: Literal["flashbulb", "abstraction"]) -> Change:
    """``memory.promoted`` from L2 to L3 for ``reason``, listing the memory's sources."""
    values = {
        "memory_id": new.memory_id,
        "from_layer": "L2",
        "to_layer": "L3",
        "reason": reason,
        "sources": new.sources,
    }
    return (MemoryPromoted, trusted(PromotedBody, values, _PROMOTED_GIVEN))


_ALWAYS = -(2**63)
"""A bound that every tick reaches: a memory that may be forgotten at any time."""
_PROMOTED_GIVEN: Final = fields(PromotedBody.model_fields)
_ITEM_GIVEN: Final = fields(MemoryItem.model_fields)
_CREATED_GIVEN: Final = fields(MemoryCreatedBody.model_fields)
_STRENGTH_GIVEN: Final = fields(StrengthChangeBody.model_fields)
_FORGOTTEN_GIVEN: Final = fields(ForgottenBody.model_fields)


class Memories:
    """The live L2/L3 memories of one agent (forgotten ones are dropped).

    ``watch`` holds, for each memory a tick may forget (L2, not promoted), the epoch
    millisecond before which it surely will not (:func:`forget_from`, worked out at
    the first sweep that sees it: None until then), so that a sweep computes the
    retention of those near their end only.
    """

    def __init__(
        self, items: list[MemoryItem], forgetting: ForgettingParams, promotion: PromotionParams
    ) -> None:
        self.items = {item.memory_id: item for item in items}
        self.forgetting = forgetting
        self.promotion = promotion
        self.flash_importance = promotion.flashbulb_importance
        self.flash_sentiment = promotion.flashbulb_sentiment
        self.watch: dict[str, int | None] = {}
        for item in items:
            self._watch(item)

    def _watch(self, item: MemoryItem) -> None:
        if item.layer == "L3" or item.promoted:
            self.watch.pop(item.memory_id, None)
        else:
            self.watch[item.memory_id] = None

    def create(self, new: NewMemory) -> list[Change]:
        """``memory.created``, then ``memory.promoted`` if it is a flashbulb moment."""
        memory_id = new.memory_id
        if memory_id in self.items:
            return []
        importance, sentiment = new.importance, new.sentiment
        trace = new_trace(importance, new.at, self.forgetting)
        layer, kind = new.layer, new.kind
        created = {
            "memory_id": memory_id,
            "layer": layer,
            "kind": kind,
            "text": new.text,
            "importance": importance,
            "sentiment": sentiment,
            "confidence": new.confidence,
            "entities": new.entities,
            "sources": new.sources,
            "strength": trace.strength_days,
            "formed_at": trace.last_reinforced_at,
        }
        changes: list[Change] = [
            (MemoryCreated, trusted(MemoryCreatedBody, created, _CREATED_GIVEN))
        ]
        promoted = layer == "L3"
        if kind == "semantic":
            changes.append(promotion(new, "abstraction"))
        elif layer == "L2" and self.is_flashbulb(importance, sentiment):
            layer, promoted = "L3", True
            changes.append(promotion(new, "flashbulb"))
        values = {
            "memory_id": memory_id,
            "layer": layer,
            "kind": kind,
            "importance": importance,
            "sentiment": sentiment,
            "user_id": new.user_id,
            "created_at": new.at,
            "trace": trace,
            "promoted": promoted,
        }
        self.items[memory_id] = trusted(MemoryItem, values, _ITEM_GIVEN)
        if not promoted:  # a tick may forget it: see ``watch``
            self.watch[memory_id] = None
        return changes

    def is_flashbulb(self, importance: float, sentiment: float) -> bool:
        return importance > self.flash_importance and abs(sentiment) >= self.flash_sentiment

    def recalled(self, memory_ids: list[str], at: datetime, reason: str) -> list[Change]:
        """Reinforce each live memory among ``memory_ids`` once (duplicates ignored)."""
        changes: list[Change] = []
        for memory_id in dict.fromkeys(memory_ids):
            item = self.items.get(memory_id)
            if item is None:
                continue
            trace = reinforce(item.trace, at, self.forgetting)
            self._replace(item, trace)
            changes.append((MemoryReinforced, self._strength(memory_id, trace, reason)))
        return changes

    def corrected(self, memory_id: str, at: datetime, reason: str) -> list[Change]:
        """Weaken a live memory (a lapse); enough lapses invalidate it."""
        item = self.items.get(memory_id)
        if item is None:
            return []
        trace = weaken(item.trace, at, self.forgetting)
        self._replace(item, trace)
        return [(MemoryWeakened, self._strength(memory_id, trace, reason))]

    def _replace(self, item: MemoryItem, trace: Trace) -> None:
        new = updated(item, {"trace": trace})
        self.items[item.memory_id] = new
        self._watch(new)

    def sweep(self, at: datetime) -> list[Change]:
        """At a tick: forget every unprotected memory that fell below the threshold."""
        if not self.watch:
            return []
        now = millis_of(at)
        watch = self.watch
        for memory_id, bound in watch.items():
            if bound is None:
                bound = forget_from(self.items[memory_id].trace, self.forgetting)
                watch[memory_id] = _ALWAYS if bound is None else bound
        near = [m for m, bound in watch.items() if bound is not None and bound <= now]
        changes: list[Change] = []
        for memory_id in sorted(near):
            item = self.items[memory_id]
            protected = item.layer == "L3" or item.promoted
            if should_forget(item.trace, at, self.forgetting, protected=protected):
                value = retention(item.trace, at, self.forgetting)
                body = trusted(
                    ForgottenBody,
                    {"memory_id": memory_id, "retention": float(value)},
                    _FORGOTTEN_GIVEN,
                )
                changes.append((MemoryForgotten, body))
                del self.items[memory_id]
                del self.watch[memory_id]
        return changes

    @staticmethod
    def _strength(memory_id: str, trace: Trace, reason: str) -> StrengthChangeBody:
        values = {
            "memory_id": memory_id,
            "strength": trace.strength_days,
            "reinforcements": trace.reinforcements,
            "reason": reason,
            "invalidated": trace.invalidated,
        }
        return trusted(StrengthChangeBody, values, _STRENGTH_GIVEN)

    def state(self) -> list[MemoryItem]:
        return [self.items[k] for k in sorted(self.items)]
