"""``working.set`` through the real broker: the task, variables and scratchpad an agent
sets reach the history (``working.updated``) and the snapshot a fresh agent loads."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from engram import Memory, make_event
from schemas import Event
from tests.support import Stack, wait_until

pytestmark = pytest.mark.integration


def test_working_set_reaches_history_and_snapshot(stack: Stack) -> None:
    agent = f"ws-{uuid.uuid4().hex[:8]}"
    t0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
    pad = "候选酒店：祇园白川旁的旅馆。" + "Compare prices before booking. " * 150

    def event(kind: str, minutes: int, body: dict[str, object]) -> Event:
        return make_event(
            kind,
            agent_id=agent,
            session_id="trip",
            user_id="mei",
            occurred_at=t0 + timedelta(minutes=minutes),
            body=body,
        )

    events = [
        event("session.started", 0, {"task": "plan the Kyoto trip"}),
        event("working.set", 1, {"variables": {"city": "Kyoto", "预算": "3000"}}),
        event("interaction.recorded", 2, {"role": "user", "content": "Find a ryokan near Gion."}),
        event("working.set", 3, {"task": "book the ryokan", "scratchpad": pad}),
        event("working.set", 4, {"variables": {"预算": None, "nights": "3"}}),
    ]
    with Memory(bootstrap=stack.bootstrap) as memory:
        memory.publish_many(events)
    rows = wait_until(
        lambda: (
            found
            if len(
                found := stack.rows(
                    "SELECT seq, body FROM memory_changes FINAL"
                    " WHERE agent_id = {a:String} AND type = 'working.updated' ORDER BY seq",
                    a=agent,
                )
            )
            == 5
            else None
        ),
        60,
        "five working.updated rows",
    )
    last = json.loads(rows[-1][1])
    assert last["task"] == "book the ryokan"
    assert last["variables"] == {"city": "Kyoto", "nights": "3"}
    assert last["scratchpad"].startswith("候选酒店：祇园白川旁的旅馆。")
    assert f"[offloaded: {len(pad)} chars, event {events[3].event_id}]" in last["scratchpad"]
    assert [t["content"] for t in last["added"]] == []
    assert last["size"] == 1  # the turn is still there
    with Memory(http=stack.http) as memory:
        snap = memory.snapshot(agent, session_id="trip")
    (session,) = snap.working
    assert session["task"] == "book the ryokan"
    assert session["variables"] == {"city": "Kyoto", "nights": "3"}
    assert session["scratchpad"] == last["scratchpad"]
    assert [t["content"] for t in session["turns"]] == ["Find a ryokan near Gion."]
