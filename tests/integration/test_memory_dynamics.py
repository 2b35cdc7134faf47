"""A multi-day, multi-session scenario in English and Chinese through the real broker
and chdb: episodes, single-turn memories, flashbulb promotion, reinforcement,
forgetting at a tick, fact intervals and persona versions, read from ClickHouse."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from engram import Memory, make_event
from processors.episodes import memory_id_of
from schemas import Event
from tests.support import Stack, wait_until

pytestmark = pytest.mark.integration
DAY0 = datetime(2026, 10, 1, 9, 0, tzinfo=UTC)


class Script:
    def __init__(self, agent_id: str) -> None:
        self.agent_id = agent_id
        self.events: list[Event] = []

    def add(
        self, kind: str, at: datetime, body: dict[str, Any], session: str | None = None
    ) -> Event:
        event = make_event(
            kind,
            agent_id=self.agent_id,
            session_id=session,
            user_id="mei",
            occurred_at=at,
            body=body,
        )
        self.events.append(event)
        return event

    def say(self, session: str, at: datetime, content: str, **scores: float) -> Event:
        role = "user" if len(self.events) % 2 == 0 else "assistant"
        return self.add(
            "interaction.recorded", at, {"role": role, "content": content, **scores}, session
        )


def episode_id(first_turn: Event) -> str:
    return memory_id_of("episode", first_turn.agent_id, str(first_turn.event_id))


def scenario(agent_id: str) -> tuple[Script, dict[str, Event]]:
    s = Script(agent_id)
    marks: dict[str, Event] = {}
    t = DAY0
    s.add("session.started", t, {"task": "plan a trip to Kyoto"}, "trip")
    marks["trip"] = s.say(
        "trip", t + timedelta(minutes=1), "I want to visit Kyoto in April for the cherry blossoms."
    )
    s.say("trip", t + timedelta(minutes=2), "April is busy; shall I book a ryokan near Gion?")
    s.say("trip", t + timedelta(minutes=3), "Yes please. 我对花生过敏，一定要记住！")
    marks["loss"] = s.say(
        "trip",
        t + timedelta(minutes=4),
        "My father passed away last week.",
        importance=9.5,
        sentiment=-0.9,
    )
    s.add("session.ended", t + timedelta(minutes=5), {"reason": "done"}, "trip")
    t = DAY0 + timedelta(days=1)
    marks["idle"] = s.say("chat", t, "Remind me about the dentist.")
    s.say("chat", t + timedelta(minutes=1), "Noted, Thursday at 10.")
    s.say("chat", t + timedelta(hours=3), "今天天气不错。")  # after a 3 h gap: a new episode
    t = DAY0 + timedelta(days=2)
    marks["chatter"] = s.say("small", t, "ok 1")
    for i in range(2, 21):
        s.say("small", t + timedelta(seconds=i), f"ok {i}")
    t = DAY0 + timedelta(days=3)
    marks["work1"] = s.say("work1", t, "The quarterly report is due on Friday.")
    s.say("work1", t + timedelta(minutes=1), "I will draft the revenue section today.")
    s.add("session.ended", t + timedelta(minutes=2), {}, "work1")
    marks["work2"] = s.say("work2", t + timedelta(hours=2), "请把季度报告发给张经理。")
    s.say("work2", t + timedelta(hours=2, minutes=1), "好的，今天下午发送。")
    s.add("session.ended", t + timedelta(hours=2, minutes=2), {}, "work2")
    s.add("fact.asserted", DAY0, {"namespace": "profile", "key": "diet", "value": "vegetarian"})
    s.add(
        "fact.asserted",
        DAY0 + timedelta(days=3),
        {"namespace": "profile", "key": "diet", "value": "vegan"},
    )
    s.add("fact.retracted", DAY0 + timedelta(days=5), {"namespace": "profile", "key": "diet"})
    s.add("persona.updated", DAY0, {"name": "Kiko", "style": "warm", "preferences": {"lang": "zh"}})
    s.add("persona.updated", DAY0 + timedelta(days=1), {"style": "concise"})
    s.add("tool.called", DAY0 + timedelta(days=1), {"call_id": "c1", "tool": "calendar"}, "chat")
    s.add(
        "tool.result",
        DAY0 + timedelta(days=1, seconds=5),
        {"call_id": "c1", "tool": "calendar", "ok": True},
        "chat",
    )
    s.add(
        "memory.recalled",
        DAY0 + timedelta(days=4),
        {"query": "Kyoto trip", "memory_ids": [episode_id(marks["trip"])], "scores": [0.9]},
    )
    s.add("clock.tick", DAY0 + timedelta(days=40), {"partition": 0, "interval_s": 60.0})
    return s, marks


def test_a_month_of_memory_in_clickhouse(stack: Stack) -> None:
    agent_id = f"scenario-{uuid.uuid4().hex[:8]}"
    script, marks = scenario(agent_id)
    with Memory(bootstrap=stack.bootstrap) as memory:
        memory.publish_many(script.events)
    total = len(script.events)
    wait_until(
        lambda: (
            stack.scalar(
                "SELECT max(seq) FROM memory_changes FINAL WHERE agent_id = {a:String}", a=agent_id
            )
            == total - 1
        ),
        60,
        "the changes of the last event",
    )
    cuts = dict(
        stack.rows(
            "SELECT cut, count() FROM episodes WHERE agent_id = {a:String} GROUP BY cut", a=agent_id
        )
    )
    # the gap in "chat" cuts one; the tick 40 days on closes the still-open rest of it
    assert cuts == {"session_ended": 3, "idle_gap": 2, "turn_count": 1}
    owners = stack.rows(
        "SELECT DISTINCT session_id, user_id FROM episodes WHERE agent_id = {a:String}"
        " AND session_id = 'chat'",
        a=agent_id,
    )
    assert owners == [("chat", "mei")], "an episode closed by a tick keeps its session and user"
    trip = episode_id(marks["trip"])
    summary, importance, previous = stack.rows(
        "SELECT summary, importance, previous_episode_id FROM episodes"
        " WHERE episode_id = {e:String}",
        e=trip,
    )[0]
    assert "Kyoto" in summary and importance >= 5
    assert previous is None, "the first episode links to nothing"

    memories = {
        row[0]: row[1:]
        for row in stack.rows(
            "SELECT memory_id, kind, layer, promoted, forgotten, reinforcements FROM memories"
            " WHERE agent_id = {a:String}",
            a=agent_id,
        )
    }
    loss = memory_id_of("turn", agent_id, str(marks["loss"].event_id))
    assert memories[loss] == ("turn", "L3", 1, 0, 0), "flashbulb: promoted to L3, never forgotten"
    chatter = episode_id(marks["chatter"])
    assert memories[chatter][3] == 1, "an unimportant episode is forgotten 40 days on"
    assert memories[trip][4] == 1, "the recalled episode was reinforced"
    idle = episode_id(marks["idle"])
    assert memories[idle][0] == "episode"
    forgotten_in_history = stack.scalar(
        "SELECT count() FROM memory_changes FINAL"
        " WHERE agent_id = {a:String} AND type = 'memory.forgotten'",
        a=agent_id,
    )
    assert forgotten_in_history >= 1, "forgotten memories stay in history"

    semantic = stack.rows(
        "SELECT layer, text FROM memories WHERE agent_id = {a:String} AND kind = 'semantic'",
        a=agent_id,
    )
    assert len(semantic) == 1, "day 3's two episodes are consolidated into one L3 memory"
    assert semantic[0][0] == "L3" and "report" in semantic[0][1]
    sources = stack.scalar(
        "SELECT JSONExtract(body, 'sources', 'Array(String)') FROM memory_changes FINAL"
        " WHERE agent_id = {a:String} AND type = 'memory.promoted'"
        " AND JSONExtractString(body, 'reason') = 'abstraction'",
        a=agent_id,
    )
    assert sources == [episode_id(marks["work1"]), episode_id(marks["work2"])]
    facts = stack.rows(
        "SELECT value, toString(valid_from), toString(valid_to) FROM facts"
        " WHERE agent_id = {a:String} ORDER BY valid_from",
        a=agent_id,
    )
    assert facts == [
        ("vegetarian", "2026-10-01 09:00:00.000", "2026-10-04 09:00:00.000"),
        ("vegan", "2026-10-04 09:00:00.000", "2026-10-06 09:00:00.000"),
    ]
    persona = stack.rows(
        "SELECT version, name, style FROM persona WHERE agent_id = {a:String} ORDER BY version",
        a=agent_id,
    )
    assert persona == [(1, "Kiko", "warm"), (2, "Kiko", "concise")]
    skill = stack.rows(
        "SELECT JSONExtractUInt(body, 'uses'), JSONExtractFloat(body, 'success_rate')"
        " FROM memory_changes FINAL"
        " WHERE agent_id = {a:String} AND type = 'skill.updated' ORDER BY seq DESC LIMIT 1",
        a=agent_id,
    )
    assert skill == [(1, 1.0)]
