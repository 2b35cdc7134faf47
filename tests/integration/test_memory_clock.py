"""A memory's forgetting clock starts when it formed — an episode's at its last turn —
not when the event that closed the episode arrived: history (the ``memories`` view)
and recall (the vector payload) date it as the fold does."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from engram import Memory, make_event
from schemas import Event
from tests.support import Stack, wait_until

pytestmark = pytest.mark.integration


def test_an_episode_memory_is_dated_by_its_last_turn(stack: Stack) -> None:
    agent = f"clock-{uuid.uuid4().hex[:8]}"
    t0 = datetime(2026, 10, 20, 9, 0, tzinfo=UTC)
    last_turn = t0 + timedelta(minutes=3)
    closed = t0 + timedelta(hours=5)  # the session ends long after its last turn

    def event(kind: str, at: datetime, body: dict[str, object]) -> Event:
        return make_event(
            kind, agent_id=agent, session_id="s", user_id="mei", occurred_at=at, body=body
        )

    turns = [
        "We booked the ryokan in Gion for the first week of April.",
        "好的，四月第一周，祇园的旅馆。",
        "Remember that the deposit is due on March 1st.",
        "I will remind you about the deposit.",
    ]
    events = [
        event("interaction.recorded", t0 + timedelta(minutes=i), {"role": "user", "content": t})
        for i, t in enumerate(turns)
    ]
    events.append(event("session.ended", closed, {"reason": "done"}))
    with Memory(bootstrap=stack.bootstrap) as memory:
        memory.publish_many(events)
    row = wait_until(
        lambda: next(
            iter(
                stack.rows(
                    "SELECT created_at, last_reinforced_at FROM memories"
                    " WHERE agent_id = {a:String} AND kind = 'episode'",
                    a=agent,
                )
            ),
            None,
        ),
        60,
        "the episode's memory in history",
    )
    assert [moment.replace(tzinfo=UTC) for moment in row] == [last_turn, last_turn]
    with Memory(http=stack.http) as memory:
        found = wait_until(
            lambda: memory.recall("ryokan deposit", agent_id=agent, record=False).memories,
            60,
            "the episode's memory in recall",
        )
    (episode,) = [m for m in found if m.kind == "episode"]
    assert episode.created_at == last_turn and episode.last_reinforced_at == last_turn
