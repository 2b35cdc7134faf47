"""Facts with validity intervals: a new value closes the old one, history is kept,
and "the value as of T" is the one asserted last at or before T and not retracted."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from uuid import UUID

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processors.facts import Facts
from processors.state import FactsState, FactVersion
from schemas import Event, FactAsserted, FactRetracted, FactSetBody

AGENT = "agent-facts"
T0 = datetime(2024, 1, 1, tzinfo=UTC)
LAWS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KEYS = [("user", "city"), ("user", "name"), ("prefs", "lang")]


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def asserted(i: int, value: str, when: datetime, key: tuple[str, str] = KEYS[0]) -> Event:
    return FactAsserted(
        event_id=UUID(int=i),
        agent_id=AGENT,
        occurred_at=when,
        body={"namespace": key[0], "key": key[1], "value": value},
    )


def retracted(i: int, when: datetime, key: tuple[str, str] = KEYS[0]) -> Event:
    return FactRetracted(
        event_id=UUID(int=i),
        agent_id=AGENT,
        occurred_at=when,
        body={"namespace": key[0], "key": key[1]},
    )


def fold(events: Sequence[Event], facts: Facts | None = None) -> tuple[Facts, list[str]]:
    """Fold ``events``; the facts and every change made, as JSON."""
    facts = facts or Facts()
    changes = [c.model_dump_json() for e in events if (c := facts.apply(e)) is not None]
    return facts, changes


# -- examples -------------------------------------------------------------------------


def test_a_new_value_closes_the_old_one() -> None:
    facts = Facts()
    facts.apply(asserted(1, "Paris", at(0)))
    change = facts.apply(asserted(2, "Berlin", at(10)))
    assert change == FactSetBody(
        namespace="user", key="city", value="Berlin", valid_from=at(10), previous_value="Paris"
    )
    old, new = facts.history("user", "city")
    assert (old.value, old.valid_from, old.valid_to) == ("Paris", at(0), at(10))
    assert (new.value, new.valid_from, new.valid_to) == ("Berlin", at(10), None)
    assert new.asserted_by == UUID(int=2)
    assert facts.current("user", "city") == "Berlin"


def test_value_at_uses_half_open_intervals() -> None:
    facts, _ = fold([asserted(1, "Paris", at(0)), asserted(2, "Berlin", at(10))])
    assert facts.value_at("user", "city", at(-1)) is None
    assert facts.value_at("user", "city", at(0)) == "Paris"
    assert facts.value_at("user", "city", at(9.99)) == "Paris"
    assert facts.value_at("user", "city", at(10)) == "Berlin"
    assert facts.value_at("user", "city", at(10_000)) == "Berlin"
    assert facts.value_at("user", "other", at(5)) is None


def test_retraction_closes_without_a_new_version() -> None:
    facts = Facts()
    facts.apply(asserted(1, "Paris", at(0)))
    change = facts.apply(retracted(2, at(5)))
    assert change == FactSetBody(
        namespace="user", key="city", value=None, valid_from=at(5), previous_value="Paris"
    )
    (only,) = facts.history("user", "city")
    assert only.valid_to == at(5)
    assert facts.current("user", "city") is None
    assert facts.value_at("user", "city", at(4)) == "Paris"
    assert facts.value_at("user", "city", at(5)) is None
    assert facts.list_current() == {}


def test_retracting_nothing_is_a_no_op() -> None:
    facts = Facts()
    assert facts.apply(retracted(1, at(0))) is None
    facts.apply(asserted(2, "Paris", at(1)))
    facts.apply(retracted(3, at(2)))
    assert facts.apply(retracted(4, at(3))) is None
    assert facts.state() == fold([asserted(2, "Paris", at(1)), retracted(3, at(2))])[0].state()


def test_reasserting_the_current_value_is_a_no_op() -> None:
    facts = Facts()
    facts.apply(asserted(1, "Paris", at(0)))
    before = facts.state()
    assert facts.apply(asserted(2, "Paris", at(5))) is None
    assert facts.state() == before
    assert facts.history("user", "city")[0].asserted_by == UUID(int=1)


def test_a_value_asserted_again_after_a_retraction_is_a_new_version() -> None:
    facts, _ = fold([asserted(1, "Paris", at(0)), retracted(2, at(5)), asserted(3, "Paris", at(9))])
    assert [(v.valid_from, v.valid_to) for v in facts.history("user", "city")] == [
        (at(0), at(5)),
        (at(9), None),
    ]
    assert facts.value_at("user", "city", at(7)) is None


def test_history_is_kept_and_confidence_recorded() -> None:
    log = [asserted(i, v, at(i)) for i, v in enumerate(["a", "b", "c"], start=1)]
    log.append(
        FactAsserted(
            event_id=UUID(int=9),
            agent_id=AGENT,
            occurred_at=at(9),
            body={"namespace": "user", "key": "city", "value": "d", "confidence": 0.5},
        )
    )
    facts, changes = fold(log)
    assert len(changes) == 4
    assert [v.value for v in facts.history("user", "city")] == ["a", "b", "c", "d"]
    assert facts.history("user", "city")[-1].confidence == 0.5
    assert facts.history("user", "city")[0].confidence is None
    assert [json.loads(c)["confidence"] for c in changes] == [None, None, None, 0.5]  # fact.set too


def test_list_current_is_by_namespace_and_key() -> None:
    facts, _ = fold(
        [
            asserted(1, "Paris", at(0), KEYS[0]),
            asserted(2, "Ada", at(1), KEYS[1]),
            asserted(3, "fr", at(2), KEYS[2]),
            retracted(4, at(3), KEYS[1]),
        ]
    )
    assert facts.list_current() == {("prefs", "lang"): "fr", ("user", "city"): "Paris"}
    assert list(facts.list_current()) == [("prefs", "lang"), ("user", "city")]


def test_other_events_change_nothing() -> None:
    from schemas import SessionStarted

    facts = Facts()
    event = SessionStarted(event_id=UUID(int=1), agent_id=AGENT, session_id="s", occurred_at=T0)
    assert facts.apply(event) is None
    assert facts.state() == FactsState()


def test_late_assertion_takes_effect_at_the_current_start() -> None:
    facts = Facts()
    facts.apply(asserted(1, "Paris", at(10)))
    change = facts.apply(asserted(2, "Berlin", at(5)))
    assert change is not None and change.valid_from == at(10)
    old, new = facts.history("user", "city")
    assert (old.valid_from, old.valid_to) == (at(10), at(10))
    assert (new.valid_from, new.valid_to) == (at(10), None)
    assert facts.value_at("user", "city", at(10)) == "Berlin"
    assert facts.value_at("user", "city", at(7)) is None


def test_late_events_never_go_before_a_closed_interval() -> None:
    facts, _ = fold([asserted(1, "Paris", at(0)), retracted(2, at(10))])
    change = facts.apply(asserted(3, "Rome", at(3)))
    assert change is not None and change.valid_from == at(10)
    assert facts.value_at("user", "city", at(5)) == "Paris"
    late = facts.apply(retracted(4, at(1)))
    assert late is not None and late.valid_from == at(10)
    assert [(v.valid_from, v.valid_to) for v in facts.history("user", "city")] == [
        (at(0), at(10)),
        (at(10), at(10)),
    ]


# -- properties -----------------------------------------------------------------------

Op = tuple[str, int, str, int]
"""(kind, key index, value, step in minutes from the previous event)."""

ops = st.lists(
    st.tuples(
        st.sampled_from(["assert", "assert", "retract"]),
        st.integers(0, len(KEYS) - 1),
        st.sampled_from(["a", "b", "c"]),
        st.integers(0, 3),
    ),
    max_size=40,
)


def build(log: Sequence[Op], *, steps_may_go_back: bool = False) -> list[Event]:
    """Events for ``log``; times grow by each step (or wander if ``steps_may_go_back``)."""
    events: list[Event] = []
    minute = 0
    for i, (kind, k, value, step) in enumerate(log, start=1):
        minute = minute - step if steps_may_go_back and i % 2 else minute + step
        when = at(minute)
        if kind == "assert":
            events.append(asserted(i, value, when, KEYS[k]))
        else:
            events.append(retracted(i, when, KEYS[k]))
    return events


def reference(events: Sequence[Event], key: tuple[str, str], moment: datetime) -> str | None:
    """Naive answer: the last value asserted at or before ``moment``, unless retracted since."""
    value: str | None = None
    for event in events:
        if event.occurred_at > moment:
            break
        match event:
            case FactAsserted(body=b) if (b.namespace, b.key) == key:
                value = b.value
            case FactRetracted(body=b) if (b.namespace, b.key) == key:
                value = None
    return value


def probes(events: Sequence[Event]) -> list[datetime]:
    """Instants worth asking about: every event time, just before and after it."""
    ms = timedelta(milliseconds=1)
    times = {at(-1)} | {e.occurred_at + d for e in events for d in (-ms, 0 * ms, ms)}
    return sorted(times)


@LAWS
@given(ops)
def test_value_at_is_the_last_assertion_not_retracted(log: list[Op]) -> None:
    events = build(log)
    facts, _ = fold(events)
    for moment in probes(events):
        for key in KEYS:
            assert facts.value_at(*key, moment) == reference(events, key, moment), (key, moment)


@LAWS
@given(ops, st.booleans())
def test_intervals_are_ordered_and_disjoint_even_for_late_events(log: list[Op], back: bool) -> None:
    events = build(log, steps_may_go_back=back)
    facts, _ = fold(events)
    for key in KEYS:
        versions: list[FactVersion] = facts.history(*key)
        for v in versions:
            assert v.valid_to is None or v.valid_from <= v.valid_to
        for earlier, later in pairwise(versions):
            assert earlier.valid_to is not None and earlier.valid_to <= later.valid_from
        assert all(v.valid_to is not None for v in versions[:-1])


@LAWS
@given(ops, st.booleans())
def test_current_follows_log_order(log: list[Op], back: bool) -> None:
    events = build(log, steps_may_go_back=back)
    facts, _ = fold(events)
    for key in KEYS:
        expected: str | None = None
        for event in events:
            if isinstance(event, FactAsserted) and (event.body.namespace, event.body.key) == key:
                expected = event.body.value
            elif isinstance(event, FactRetracted) and (event.body.namespace, event.body.key) == key:
                expected = None
        assert facts.current(*key) == expected


@LAWS
@given(ops, st.data())
def test_resume_from_serialised_state_equals_whole_fold(log: list[Op], data: st.DataObject) -> None:
    events = build(log, steps_may_go_back=data.draw(st.booleans()))
    cut = data.draw(st.integers(0, len(events)))
    first, head = fold(events[:cut])
    restored = FactsState.model_validate_json(first.state().model_dump_json())
    resumed, tail = fold(events[cut:], Facts(restored))
    whole, changes = fold(events)
    assert head + tail == changes
    assert resumed.state().model_dump_json() == whole.state().model_dump_json()


@LAWS
@given(ops)
def test_folding_twice_gives_the_same_state(log: list[Op]) -> None:
    events = build(log)
    one, changes_one = fold(events)
    two, changes_two = fold(events)
    assert changes_one == changes_two
    assert one.state().model_dump_json() == two.state().model_dump_json()


@LAWS
@given(ops)
def test_redelivering_an_assertion_right_away_changes_nothing(log: list[Op]) -> None:
    events = build(log)
    doubled = [e for e in events for e in ((e, e) if isinstance(e, FactAsserted) else (e,))]
    assert fold(doubled)[0].state() == fold(events)[0].state()
