"""Abstraction windows and the flashbulb law, at the level of the whole fold."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from processors import AgentMemory, MemoryConfig
from processors.consolidation import Consolidation, _window
from processors.scoring import DEFAULT_PARAMS
from processors.state import ConsolidationParams, ConsolidationState, Window
from schemas import (
    ClockTicked,
    Event,
    InteractionRecorded,
    MemoryCreated,
    MemoryForgotten,
    MemoryPromoted,
    SessionEnded,
)

AGENT = "agent-consolidation"
DAY = datetime(2026, 10, 1, tzinfo=UTC)


def turn(at: datetime, session: str, content: str, **scores: float) -> InteractionRecorded:
    body = {"role": "user", "content": content, **scores}
    return InteractionRecorded(
        event_id=uuid.uuid4(),
        agent_id=AGENT,
        session_id=session,
        user_id="u",
        occurred_at=at,
        body=body,
    )


def end(at: datetime, session: str) -> SessionEnded:
    return SessionEnded(
        event_id=uuid.uuid4(), agent_id=AGENT, session_id=session, user_id="u", occurred_at=at
    )


def tick(at: datetime) -> ClockTicked:
    body = {"partition": 0, "interval_s": 60.0}
    return ClockTicked(event_id=uuid.uuid4(), agent_id=AGENT, occurred_at=at, body=body)


def fold(events: list[Event], config: MemoryConfig | None = None) -> list[object]:
    memory = AgentMemory.empty(AGENT, config or MemoryConfig())
    return [d for e in events for d in memory.apply(e).derived]


def test_a_days_episodes_become_one_semantic_memory_when_the_day_is_over() -> None:
    events: list[Event] = [
        turn(DAY + timedelta(hours=9), "a", "The report is due on Friday."),
        end(DAY + timedelta(hours=9, minutes=1), "a"),
        turn(DAY + timedelta(hours=15), "b", "请把报告发给张经理。"),
        end(DAY + timedelta(hours=15, minutes=1), "b"),
    ]
    assert not any(isinstance(d, MemoryCreated) and d.body.kind == "semantic" for d in fold(events))
    derived = fold([*events, tick(DAY + timedelta(days=1))])
    semantic = [d for d in derived if isinstance(d, MemoryCreated) and d.body.kind == "semantic"]
    assert len(semantic) == 1
    assert semantic[0].body.layer == "L3"
    episodes = [
        d.body.memory_id
        for d in derived
        if isinstance(d, MemoryCreated) and d.body.kind == "episode"
    ]
    assert semantic[0].body.sources == episodes
    promoted = [
        d for d in derived if isinstance(d, MemoryPromoted) and d.body.reason == "abstraction"
    ]
    assert [p.body.memory_id for p in promoted] == [semantic[0].body.memory_id]


def test_a_single_episode_is_not_consolidated() -> None:
    events: list[Event] = [
        turn(DAY + timedelta(hours=9), "a", "Only one thing happened today."),
        end(DAY + timedelta(hours=9, minutes=1), "a"),
        tick(DAY + timedelta(days=2)),
    ]
    assert not any(isinstance(d, MemoryCreated) and d.body.kind == "semantic" for d in fold(events))


@settings(max_examples=40, deadline=None)
@given(
    days=st.lists(st.integers(min_value=1, max_value=2000), min_size=1, max_size=6),
    sentiment=st.sampled_from([-0.95, -0.7, 0.7, 0.9]),
    importance=st.floats(min_value=8.01, max_value=10.0),
)
def test_a_flashbulb_memory_is_never_forgotten(
    days: list[int], sentiment: float, importance: float
) -> None:
    events: list[Event] = [
        turn(DAY, "s", "The day I got married.", importance=importance, sentiment=sentiment),
        turn(DAY + timedelta(minutes=1), "s", "ok"),
        end(DAY + timedelta(minutes=2), "s"),
    ]
    events += [tick(DAY + timedelta(days=d)) for d in sorted(days)]
    derived = fold(events)
    flashbulb = {
        d.body.memory_id
        for d in derived
        if isinstance(d, MemoryPromoted) and d.body.reason == "flashbulb"
    }
    assert flashbulb, "importance above 8 and |sentiment| at least 0.7 is promoted"
    forgotten = {d.body.memory_id for d in derived if isinstance(d, MemoryForgotten)}
    assert not flashbulb & forgotten


@given(
    st.one_of(st.none(), st.text(max_size=8)),
    st.datetimes(
        min_value=datetime(1971, 1, 1),
        max_value=datetime(2200, 1, 1),
        timezones=st.sampled_from([UTC, timezone(timedelta(hours=9))]),
    ),
    st.booleans(),
)
def test_a_window_built_unvalidated_is_the_validated_window(
    user_id: str | None, at: datetime, whole: bool
) -> None:
    start = Consolidation(ConsolidationState(), ConsolidationParams(), DEFAULT_PARAMS).window_start(
        at
    )
    if not whole:  # a start that validation changes: built validated
        start = at
    built = _window(user_id, start)
    expected = Window(user_id=user_id, start=start)
    assert built == expected
    assert built.model_fields_set == expected.model_fields_set
    assert built.model_dump_json() == expected.model_dump_json()
    assert built.start.tzinfo is expected.start.tzinfo
