"""Forgetting: how strongly an L2 memory is held, as a pure function of event time.

Two curves, chosen by :attr:`ForgettingParams.curve`:

* ``exponential`` (the seed's Ebbinghaus model): retention ``R = exp(-Δt / S)``,
  ``Δt`` in days since the last reinforcement, ``S`` (``strength_days``) the
  e-folding time. ``S`` starts from importance, is multiplied by
  ``reinforce_factor`` (with diminishing returns) at each recall or positive
  feedback, and by ``weaken_factor`` at each negative feedback.
* ``fsrs``: the FSRS-6 model of the ``fsrs`` library. A memory is a card; a
  reinforcement is a review rated ``Good``, a negative feedback (a correction) a
  review rated ``Again`` (a lapse). Retention is the scheduler's retrievability,
  a power curve counted in whole days since the card's last review; ``S`` is the
  card's stability (the number of days until R falls to 0.9).

Contract:

* pure and deterministic: time comes only from the ``at`` arguments (aware
  datetimes, normalised to UTC and truncated to the millisecond, the wire
  precision); naive datetimes are a ``ValueError``. The ``fsrs`` library reads
  the wall clock or ``random`` only when a datetime or card id is omitted or
  fuzzing is on; this module always passes them and turns fuzzing off;
* late arrival: a reinforcement or weakening whose ``at`` is earlier than the
  trace's latest review takes effect at that review instead
  (``t = max(at, latest)``), so a trace's times never go backwards; retention
  asked for a time before the last review is 1.0;
* retention is rounded to 6 decimals, so equal inputs give equal floats in JSON;
* an invalidated trace stays invalidated (a later recall does not revive it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any, Final, cast

from fsrs import Card, Rating, Scheduler, State

from processors.build import fields, trusted, updated
from processors.traces import (
    FSRS6_DEFAULT_WEIGHTS,
    Curve,
    ForgettingParams,
    FsrsCard,
    Trace,
    build_scheduler,
    scheduler_of,
)

FSRS_NEUTRAL_IMPORTANCE = 5.0
"""The importance whose FSRS card starts with the library's own ``Good`` stability."""

_FSRS_INITIAL_STABILITY = (0.001, 100.0)  # the bounds fsrs allows for weights 0..3
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_DAY_SECONDS = 86_400.0
_DAY_MS = 86_400_000


def new_trace(importance: float, at: datetime, params: ForgettingParams) -> Trace:
    """The trace of a memory created at ``at`` with ``importance`` (clamped to 1..10)."""
    if at.tzinfo is not UTC or at.microsecond % 1000:
        at = _instant(at)
    level = min(max(importance, 1.0), 10.0)
    if params.curve == "fsrs":
        initial = params.fsrs_weights[2] * params.importance_factor ** (
            level - FSRS_NEUTRAL_IMPORTANCE
        )
        low, high = _FSRS_INITIAL_STABILITY
        stored = _first_review(params, min(max(initial, low), high)).card(at)
        return _trace(_stability(stored), at, stored, _NEW_FSRS_GIVEN)
    strength = params.base_strength_days * params.importance_factor ** (level - 1.0)
    values = {
        "strength_days": min(max(strength, params.min_strength_days), params.max_strength_days),
        "last_reinforced_at": at,
        "reinforcements": 0,
        "lapses": 0,
        "invalidated": False,
        "card": None,
    }
    return trusted(Trace, values, _NEW_GIVEN)  # _bounded(strength), inline


_NEW_GIVEN: Final = fields({"strength_days", "last_reinforced_at"})
_NEW_FSRS_GIVEN: Final = fields({"strength_days", "last_reinforced_at", "card"})


def _trace(strength: float, at: datetime, card: FsrsCard | None, given: set[str]) -> Trace:
    """A new trace (no reinforcement, no lapse) from values valid by construction."""
    values = {
        "strength_days": strength,
        "last_reinforced_at": at,
        "reinforcements": 0,
        "lapses": 0,
        "invalidated": False,
        "card": card,
    }
    return trusted(Trace, values, given)


def retention(trace: Trace, at: datetime, params: ForgettingParams) -> float:
    """R in [0, 1] at ``at``; 1.0 at (or before) the last review."""
    at = _instant(at)
    if params.curve == "fsrs":
        # the scheduler reads only the card's last review and stability: the stored
        # card has both, so no ``fsrs.Card`` is built for it
        stored = trace.card
        if stored is None:
            _card(trace)  # raises
        value = _scheduler(params).get_card_retrievability(cast(Card, stored), current_datetime=at)
    else:
        _no_card(trace)
        days = (at - trace.last_reinforced_at).total_seconds() / _DAY_SECONDS
        value = math.exp(-max(days, 0.0) / trace.strength_days)
    return round(min(max(value, 0.0), 1.0), 6)


@dataclass(frozen=True, slots=True)
class _Reviewed:
    """What FSRS retrievability reads of a card: its last review and stability."""

    last_review: datetime
    stability: float


def retention_of(
    strength: float, last_reinforced_at: datetime, at: datetime, params: ForgettingParams
) -> float:
    """:func:`retention` of a trace with this strength (``S``, or the FSRS card's
    stability) whose clock last restarted at ``last_reinforced_at``, at ``at``: the
    same value, without building the trace (recall scores many candidates)."""
    at = _instant(at)
    last = _instant(last_reinforced_at)
    if params.curve == "fsrs":
        reviewed = cast(Card, _Reviewed(last, strength))
        value = _scheduler(params).get_card_retrievability(reviewed, current_datetime=at)
    else:
        days = (at - last).total_seconds() / _DAY_SECONDS
        value = math.exp(-max(days, 0.0) / strength)
    return round(min(max(value, 0.0), 1.0), 6)


def reinforce(trace: Trace, at: datetime, params: ForgettingParams) -> Trace:
    """A recall or positive feedback: a successful review; ``S`` does not shrink."""
    at = max(_instant(at), _latest(trace))
    counted = {"last_reinforced_at": at, "reinforcements": trace.reinforcements + 1}
    if params.curve == "fsrs":
        card, _ = _scheduler(params).review_card(_card(trace), Rating.Good, review_datetime=at)
        return _with_card(trace, counted, card)
    _no_card(trace)
    gain = (params.reinforce_factor - 1.0) * params.reinforce_damping**trace.reinforcements
    strength = _bounded(trace.strength_days * (1.0 + gain), params)
    return updated(trace, {**counted, "strength_days": strength})


def weaken(trace: Trace, at: datetime, params: ForgettingParams) -> Trace:
    """A negative feedback or correction: a lapse; invalidates at ``invalidate_after``."""
    at = max(_instant(at), _latest(trace))
    lapses = trace.lapses + 1
    counted = {
        "lapses": lapses,
        "invalidated": trace.invalidated or lapses >= params.invalidate_after,
    }
    if params.curve == "fsrs":
        card, _ = _scheduler(params).review_card(_card(trace), Rating.Again, review_datetime=at)
        return _with_card(trace, counted, card)
    _no_card(trace)
    strength = _bounded(trace.strength_days * params.weaken_factor, params)
    return updated(trace, {**counted, "strength_days": strength})


def should_forget(trace: Trace, at: datetime, params: ForgettingParams, *, protected: bool) -> bool:
    """Whether a tick at ``at`` forgets the memory: never if ``protected`` (L3,
    flashbulb, promoted), always if invalidated, else when R < the curve's threshold."""
    if protected:
        return False
    if trace.invalidated:
        return True
    return retention(trace, at, params) < params.forget_below


def forget_from(trace: Trace, params: ForgettingParams) -> int | None:
    """A lower bound, in epoch milliseconds, of the first instant at which
    :func:`should_forget` (unprotected) may hold; None when it may hold at any time.

    Before the bound the retention, rounded, is surely at or above the threshold, so a
    sweep need not compute it: the bound leaves a margin of 2e-6 in retention, a
    relative 1e-9 in time and a millisecond (a day for FSRS's whole days).
    """
    if trace.invalidated:
        return None
    try:
        target = params.forget_below + 2e-6
        if target >= 1.0:
            return None
        if params.curve == "fsrs":
            card = trace.card
            if card is None or card.last_review is None or card.stability is None:
                return None
            scheduler = _scheduler(params)
            decay: float = getattr(scheduler, "_DECAY", 0.0)
            factor: float = getattr(scheduler, "_FACTOR", 0.0)
            if decay >= 0.0 or factor <= 0.0:
                return None
            safe_days = (float(target ** (1.0 / decay)) - 1.0) * card.stability / factor
            whole = max(0, math.floor(safe_days * (1.0 - 1e-9)) - 1)
            return _millis(card.last_review) + whole * _DAY_MS
        if trace.card is not None:
            return None
        safe_days = trace.strength_days * math.log(1.0 / target) * (1.0 - 1e-9)
        return _millis(trace.last_reinforced_at) + max(0, math.floor(safe_days * _DAY_MS) - 1)
    except (ArithmeticError, ValueError):
        return None


def millis_of(at: datetime) -> int:
    """``at`` (aware) in epoch milliseconds, as :func:`forget_from` counts them."""
    return _millis(_instant(at))


def _instant(at: datetime) -> datetime:
    """``at`` in UTC at millisecond precision; a naive datetime is an error."""
    if at.tzinfo is UTC and not at.microsecond % 1000:
        return at
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError(f"forgetting needs an aware datetime, got {at!r}")
    at = at.astimezone(UTC)
    return at.replace(microsecond=at.microsecond // 1000 * 1000)


def _millis(at: datetime) -> int:
    return (at - _EPOCH) // _MS


_MS = timedelta(milliseconds=1)


def _bounded(strength: float, params: ForgettingParams) -> float:
    return min(max(strength, params.min_strength_days), params.max_strength_days)


def _latest(trace: Trace) -> datetime:
    """The latest review: a weakening moves the FSRS card's review, not the reinforcement."""
    last = trace.card.last_review if trace.card else None
    return trace.last_reinforced_at if last is None else max(trace.last_reinforced_at, last)


def _no_card(trace: Trace) -> None:
    if trace.card is not None:
        raise ValueError("this trace was made by the fsrs curve, not the exponential one")


def _card(trace: Trace) -> Card:
    stored = trace.card
    if stored is None:
        raise ValueError("this trace was made by the exponential curve, not the fsrs one")
    return Card(
        card_id=stored.card_id,
        state=State(stored.state),
        step=stored.step,
        stability=stored.stability,
        difficulty=stored.difficulty,
        due=stored.due,
        last_review=stored.last_review,
    )


def _stored(card: Card) -> FsrsCard:
    due, last = card.due, card.last_review
    if _is_millis(due) and (last is None or _is_millis(last)):
        values = {
            "card_id": card.card_id,
            "state": int(card.state),
            "step": card.step,
            "stability": card.stability,
            "difficulty": card.difficulty,
            "due": due,
            "last_review": last,
        }
        return trusted(FsrsCard, values, _CARD_GIVEN)
    return FsrsCard(
        card_id=card.card_id,
        state=int(card.state),
        step=card.step,
        stability=card.stability,
        difficulty=card.difficulty,
        due=card.due,
        last_review=card.last_review,
    )


_CARD_GIVEN = fields(FsrsCard.model_fields)


def _is_millis(at: datetime) -> bool:
    """Whether ``at`` is already what ``UtcMillis`` validation would make of it."""
    return at.tzinfo is UTC and not at.microsecond % 1000


def _stability(card: FsrsCard) -> float:
    if card.stability is None:  # fsrs sets it at the first review, which new_trace makes
        raise ValueError("an fsrs card without stability was never reviewed")
    return card.stability


def _with_card(trace: Trace, counted: dict[str, Any], card: Card) -> Trace:
    stored = _stored(card)
    return updated(trace, {**counted, "card": stored, "strength_days": _stability(stored)})


def _scheduler(params: ForgettingParams) -> Scheduler:
    """The deterministic scheduler: no fuzzing, no intra-day (re)learning steps."""
    return _known(params).scheduler


@dataclass(frozen=True)
class _FirstReview:
    """A new card's first review (``Good``) by a creation scheduler, up to its time.

    The review of a blank learning card depends on the time only through ``due``
    (the time plus a whole number of days) and ``last_review`` (the time), so it is
    made once per initial stability and moved to each creation time.
    """

    state: int
    step: int | None
    stability: float | None
    difficulty: float | None
    interval: timedelta

    def card(self, at: datetime) -> FsrsCard:
        """The card of a memory created at ``at`` (UTC, milliseconds)."""
        values = {
            "card_id": _millis(at),
            "state": self.state,
            "step": self.step,
            "stability": self.stability,
            "difficulty": self.difficulty,
            "due": at + self.interval,
            "last_review": at,
        }
        return trusted(FsrsCard, values, _CARD_GIVEN)


_REFERENCE = datetime(2000, 1, 1, tzinfo=UTC)


def _review_first(params: ForgettingParams, initial_stability: float) -> _FirstReview:
    scheduler = _creation_scheduler(params, initial_stability)
    blank = Card(card_id=_millis(_REFERENCE), state=State.Learning, step=0, due=_REFERENCE)
    card, _ = scheduler.review_card(blank, Rating.Good, review_datetime=_REFERENCE)
    if card.last_review != _REFERENCE or not _is_millis(card.due):
        raise ValueError("fsrs reviewed a new card unlike fsrs 6")  # pragma: no cover
    return _FirstReview(
        int(card.state), card.step, card.stability, card.difficulty, card.due - _REFERENCE
    )


@dataclass
class _Known:
    """What is worked out once per parameter set (kept by identity, see :func:`_known`)."""

    params: ForgettingParams
    scheduler: Scheduler
    first_reviews: dict[float, _FirstReview]


_KNOWN: dict[int, _Known] = {}


def _known(params: ForgettingParams) -> _Known:
    """The scheduler and first reviews of ``params``, found by identity (hashing a
    parameter set costs more than a review); the entry holds ``params``, so its id
    is not reused while it is known."""
    known = _KNOWN.get(id(params))
    if known is None or known.params is not params:
        if len(_KNOWN) >= 64:
            _KNOWN.clear()
        known = _KNOWN[id(params)] = _Known(params, scheduler_of(params), {})
    return known


def _first_review(params: ForgettingParams, initial_stability: float) -> _FirstReview:
    reviews = _known(params).first_reviews
    review = reviews.get(initial_stability)
    if review is None:
        if len(reviews) >= 4096:
            reviews.clear()
        review = reviews[initial_stability] = _review_first(params, initial_stability)
    return review


@lru_cache(maxsize=256)
def _creation_scheduler(params: ForgettingParams, initial_stability: float) -> Scheduler:
    """The scheduler of a card's first review: weight 2 (the initial stability of a
    ``Good`` first review) carries the memory's importance."""
    weights = list(params.fsrs_weights)
    weights[2] = initial_stability
    return build_scheduler(params, tuple(weights))


__all__ = [
    "FSRS6_DEFAULT_WEIGHTS",
    "Curve",
    "ForgettingParams",
    "FsrsCard",
    "Trace",
    "forget_from",
    "millis_of",
    "new_trace",
    "reinforce",
    "retention",
    "should_forget",
    "weaken",
]
