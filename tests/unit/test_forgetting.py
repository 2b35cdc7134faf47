"""Forgetting curves (exponential and FSRS): the laws the sweep at each tick relies on."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

import fsrs
import fsrs.card
import fsrs.scheduler
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from processors.forgetting import (
    Curve,
    ForgettingParams,
    Trace,
    new_trace,
    reinforce,
    retention,
    should_forget,
    weaken,
)

T0 = datetime(2024, 3, 1, 9, 30, tzinfo=UTC)
DAY_MS = 86_400_000
CURVES: tuple[Curve, ...] = ("exponential", "fsrs")
PARAMS = {curve: ForgettingParams(curve=curve) for curve in CURVES}

curves = st.sampled_from(CURVES)
importances = st.floats(min_value=1.0, max_value=10.0, allow_nan=False)
gaps = st.integers(min_value=0, max_value=90 * DAY_MS).map(lambda ms: timedelta(milliseconds=ms))
steps = st.lists(st.tuples(st.sampled_from(["reinforce", "weaken"]), gaps), max_size=8)


@dataclass(frozen=True)
class History:
    """A trace built from a creation and a run of reinforcements and weakenings."""

    curve: Curve
    trace: Trace
    now: datetime  # the time of the last step

    @property
    def params(self) -> ForgettingParams:
        return PARAMS[self.curve]


def build(curve: Curve, importance: float, ops: list[tuple[str, timedelta]]) -> History:
    params = PARAMS[curve]
    at = T0
    trace = new_trace(importance, at, params)
    for op, gap in ops:
        at += gap
        trace = (reinforce if op == "reinforce" else weaken)(trace, at, params)
    return History(curve, trace, at)


@st.composite
def histories(draw: st.DrawFn, curve: Curve | None = None) -> History:
    chosen: Curve = curve if curve is not None else draw(curves)
    return build(chosen, draw(importances), draw(steps))


def last_review(trace: Trace) -> datetime:
    """When the curve's clock restarted: the FSRS card's review (a lapse is one too)."""
    if trace.card is not None and trace.card.last_review is not None:
        return trace.card.last_review
    return trace.last_reinforced_at


def first_forgotten_day(curve: Curve, importance: float) -> float:
    """Days after creation of the first hourly tick that forgets an unrecalled memory."""
    params = PARAMS[curve]
    trace = new_trace(importance, T0, params)
    for hour in range(24 * 1000):
        if should_forget(trace, T0 + timedelta(hours=hour), params, protected=False):
            return hour / 24
    raise AssertionError("never forgotten within 1000 days")


# retention between and at reinforcements


@given(histories())
def test_retention_is_one_at_the_last_review(h: History) -> None:
    assert retention(h.trace, last_review(h.trace), h.params) == 1.0
    assert retention(new_trace(5, h.now, h.params), h.now, h.params) == 1.0


@given(histories(), gaps, gaps)
def test_retention_never_rises_between_reinforcements(
    h: History, a: timedelta, b: timedelta
) -> None:
    early, late = sorted((a, b))
    r_early = retention(h.trace, h.now + early, h.params)
    r_late = retention(h.trace, h.now + late, h.params)
    assert 0.0 <= r_late <= r_early <= 1.0


@given(histories(), gaps, gaps)
def test_a_reinforcement_raises_retention_and_strength(
    h: History, gap: timedelta, later: timedelta
) -> None:
    at = h.now + gap
    after = reinforce(h.trace, at, h.params)
    assert retention(after, at, h.params) == 1.0 >= retention(h.trace, at, h.params)
    assert retention(after, at + later, h.params) >= retention(h.trace, at + later, h.params)
    assert after.reinforcements == h.trace.reinforcements + 1
    assert after.last_reinforced_at == at
    assert after.lapses == h.trace.lapses
    if h.curve == "exponential" or at - last_review(h.trace) >= timedelta(days=1):
        assert after.strength_days > h.trace.strength_days
    else:  # FSRS: a same-day review may leave a stable card's stability unchanged
        assert after.strength_days >= h.trace.strength_days


@given(histories(), gaps)
def test_a_weakening_lowers_strength_and_counts_a_lapse(h: History, gap: timedelta) -> None:
    at = h.now + gap
    after = weaken(h.trace, at, h.params)
    floor = h.params.min_strength_days if h.curve == "exponential" else 0.001  # fsrs' minimum
    assert after.strength_days <= h.trace.strength_days
    if h.trace.strength_days > floor:
        assert after.strength_days < h.trace.strength_days
    assert after.lapses == h.trace.lapses + 1
    assert after.reinforcements == h.trace.reinforcements
    assert after.last_reinforced_at == h.trace.last_reinforced_at
    assert after.invalidated == (after.lapses >= h.params.invalidate_after)
    if h.curve == "exponential":  # the clock keeps running: R drops at once
        assert retention(after, at, h.params) <= retention(h.trace, at, h.params)


@pytest.mark.parametrize("curve", CURVES)
def test_enough_negative_feedback_invalidates_and_the_next_tick_forgets(curve: Curve) -> None:
    params = PARAMS[curve]
    trace = reinforce(new_trace(10, T0, params), T0 + timedelta(days=1), params)
    for n in range(1, params.invalidate_after + 1):
        assert not trace.invalidated
        trace = weaken(trace, T0 + timedelta(days=1, hours=n), params)
    assert trace.invalidated
    assert should_forget(trace, T0 + timedelta(days=1, hours=4), params, protected=False)
    assert reinforce(trace, T0 + timedelta(days=2), params).invalidated  # stays invalid
    assert not should_forget(trace, T0 + timedelta(days=2), params, protected=True)


# importance and protection


@given(curves, importances, importances, gaps)
def test_higher_importance_decays_slower(curve: Curve, a: float, b: float, gap: timedelta) -> None:
    params = PARAMS[curve]
    low, high = (new_trace(i, T0, params) for i in sorted((a, b)))
    assert low.strength_days <= high.strength_days
    if abs(a - b) >= 0.01:
        assert low.strength_days < high.strength_days
    assert retention(low, T0 + gap, params) <= retention(high, T0 + gap, params)


@given(histories(), st.integers(min_value=-DAY_MS, max_value=100 * 365 * DAY_MS))
def test_protected_memories_are_never_forgotten(h: History, offset_ms: int) -> None:
    at = h.now + timedelta(milliseconds=offset_ms)
    assert not should_forget(h.trace, at, h.params, protected=True)
    invalid = h.trace.model_copy(update={"invalidated": True})
    assert not should_forget(invalid, at, h.params, protected=True)


@given(histories(), st.integers(min_value=0, max_value=10 * 365 * DAY_MS))
def test_unprotected_memories_are_forgotten_below_the_threshold(h: History, ms: int) -> None:
    at = h.now + timedelta(milliseconds=ms)
    below = retention(h.trace, at, h.params) < h.params.forget_below
    assert should_forget(h.trace, at, h.params, protected=False) == (below or h.trace.invalidated)


# the documented horizons of the defaults


@pytest.mark.parametrize(
    ("curve", "importance", "low", "high"),
    [
        ("exponential", 1, 0.5, 1.5),
        ("exponential", 5, 7, 14),
        ("exponential", 9, 90, 150),
        ("exponential", 10, 150, 270),
        ("fsrs", 1, 1, 3),
        ("fsrs", 5, 7, 14),
        ("fsrs", 9, 120, 180),
        ("fsrs", 10, 220, 330),
    ],
)
def test_default_horizons(curve: Curve, importance: float, low: float, high: float) -> None:
    assert low <= first_forgotten_day(curve, importance) <= high


def test_exponential_horizon_is_s_ln_one_over_threshold() -> None:
    params = PARAMS["exponential"]
    trace = new_trace(5, T0, params)
    horizon = trace.strength_days * math.log(1 / params.threshold)
    assert trace.strength_days == pytest.approx(0.5 * 1.85**4)
    assert first_forgotten_day("exponential", 5) == pytest.approx(horizon, abs=1 / 24)


def test_horizons_grow_with_importance() -> None:
    for curve in CURVES:
        days = [first_forgotten_day(curve, i) for i in range(1, 11)]
        assert days == sorted(days) and len(set(days)) == len(days)


# determinism, serialisation, late and bad times


@given(curves, importances, steps)
def test_same_inputs_give_equal_traces_and_json(
    curve: Curve, importance: float, ops: list[tuple[str, timedelta]]
) -> None:
    one, two = build(curve, importance, ops), build(curve, importance, ops)
    assert one == two
    assert one.trace.model_dump_json() == two.trace.model_dump_json()
    at = one.now + timedelta(days=3)
    assert retention(one.trace, at, one.params) == retention(two.trace, at, two.params)


@given(histories(), gaps)
def test_a_trace_round_trips_through_json(h: History, gap: timedelta) -> None:
    restored = Trace.model_validate_json(h.trace.model_dump_json())
    assert restored == h.trace
    at = h.now + gap
    assert retention(restored, at, h.params) == retention(h.trace, at, h.params)
    for step in (reinforce, weaken):  # the FSRS card is rebuilt exactly
        assert step(restored, at, h.params) == step(h.trace, at, h.params)


@given(histories(), st.integers(min_value=1, max_value=400 * DAY_MS))
def test_times_before_the_last_review_do_not_crash(h: History, back_ms: int) -> None:
    at = last_review(h.trace) - timedelta(milliseconds=back_ms)
    assert retention(h.trace, at, h.params) == 1.0
    should_forget(h.trace, at, h.params, protected=False)
    for step in (reinforce, weaken):
        after = step(h.trace, at, h.params)
        assert after.last_reinforced_at >= h.trace.last_reinforced_at
        assert last_review(after) >= last_review(h.trace)


def test_other_time_zones_and_microseconds_are_normalised() -> None:
    params = PARAMS["fsrs"]
    east = T0.astimezone(timezone(timedelta(hours=8))) + timedelta(microseconds=999)
    assert new_trace(5, east, params) == new_trace(5, T0, params)
    assert new_trace(5, east, params).last_reinforced_at.tzinfo == UTC


@pytest.mark.parametrize("curve", CURVES)
def test_naive_datetimes_are_rejected(curve: Curve) -> None:
    params = PARAMS[curve]
    with pytest.raises(ValueError, match="aware"):
        new_trace(5, datetime(2024, 1, 1), params)
    trace = new_trace(5, T0, params)
    with pytest.raises(ValueError, match="aware"):
        retention(trace, datetime(2024, 1, 1), params)


def test_a_trace_is_read_only_by_its_own_curve() -> None:
    with pytest.raises(ValueError, match="fsrs curve"):
        retention(new_trace(5, T0, PARAMS["fsrs"]), T0, PARAMS["exponential"])
    with pytest.raises(ValueError, match="exponential curve"):
        reinforce(new_trace(5, T0, PARAMS["exponential"]), T0, PARAMS["fsrs"])


def test_params_are_validated() -> None:
    with pytest.raises(ValidationError):
        ForgettingParams(fsrs_weights=(1.0, 2.0))
    with pytest.raises(ValidationError):
        ForgettingParams(threshold=1.5)
    with pytest.raises(ValidationError):
        ForgettingParams(min_strength_days=10, max_strength_days=1)
    assert PARAMS["exponential"].forget_below == 0.2
    assert PARAMS["fsrs"].forget_below == 0.75
    assert ForgettingParams().fsrs_weights == fsrs.scheduler.DEFAULT_PARAMETERS


# FSRS: faithful to the library, and never the wall clock


def test_fsrs_traces_follow_the_library() -> None:
    """At importance 5 the card is exactly the library's, reviewed Good then as told."""
    params = PARAMS["fsrs"]
    scheduler = fsrs.Scheduler(learning_steps=(), relearning_steps=(), enable_fuzzing=False)
    card = fsrs.Card(card_id=1, due=T0)
    card, _ = scheduler.review_card(card, fsrs.Rating.Good, review_datetime=T0)
    trace = new_trace(5, T0, params)
    plan = [(3, fsrs.Rating.Good), (10, fsrs.Rating.Again), (12, fsrs.Rating.Good)]
    for days, rating in plan:
        at = T0 + timedelta(days=days, hours=5)
        card, _ = scheduler.review_card(card, rating, review_datetime=at)
        step = reinforce if rating == fsrs.Rating.Good else weaken
        trace = step(trace, at, params)
        stored = trace.card
        assert stored is not None
        assert (stored.stability, stored.difficulty, stored.due, stored.state) == (
            card.stability,
            card.difficulty,
            card.due,
            card.state,
        )
        assert trace.strength_days == card.stability
        later = at + timedelta(days=20)
        expected = round(scheduler.get_card_retrievability(card, current_datetime=later), 6)
        assert retention(trace, later, params) == expected


class _NoClock(datetime):
    @classmethod
    def now(cls, tz: object = None) -> _NoClock:
        raise AssertionError("fsrs read the wall clock")


def test_fsrs_never_reads_the_clock_or_randomness(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*_: object) -> float:
        raise AssertionError("fsrs used randomness")

    monkeypatch.setattr(fsrs.card, "datetime", _NoClock)
    monkeypatch.setattr(fsrs.scheduler, "datetime", _NoClock)
    monkeypatch.setattr(fsrs.scheduler, "random", forbidden)
    params = ForgettingParams(curve="fsrs", importance_factor=1.3)  # uncached schedulers
    trace = new_trace(7, T0, params)
    for days in (1, 5, 30, 200):
        trace = reinforce(trace, T0 + timedelta(days=days), params)
    trace = weaken(trace, T0 + timedelta(days=300), params)
    assert 0.0 < retention(trace, T0 + timedelta(days=400), params) < 1.0
    should_forget(trace, T0 + timedelta(days=400), params, protected=False)
