"""The seed interfaces over the projections, through the HTTP endpoint of a real
``engram up``: a bilingual history of facts changing over time, sessions cut into
episodes, a flashbulb turn and forgetting at a tick, read back with LongTermMemory,
EpisodicMemory and MemCube, and with every analyst query of ``ops/sql``."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import clickhouse_connect
import httpx
import pytest
from clickhouse_connect.driver.client import Client

from engram import Memory, make_event
from processors.episodes import memory_id_of
from schemas import Event
from sinks.memory_api import EpisodicMemory, LongTermMemory, MemCube
from tests.support import REPO, Stack, wait_until

pytestmark = pytest.mark.integration
DAY0 = datetime(2026, 10, 1, 9, 0, tzinfo=UTC)
TICK_AT = DAY0 + timedelta(days=40)
USER = "mei"
CRAFTED = ("x' OR 1=1 --", "' OR ''='", "%", "x\\' OR 1=1 --")
SQL_DIR = REPO / "ops" / "sql"

facts = LongTermMemory.set_event
episodic = EpisodicMemory.append_event


def memory_id(kind: str, source: Event) -> str:
    return memory_id_of(kind, source.agent_id, str(source.event_id))


@dataclass
class History:
    """One agent's published events, with the turns the assertions name."""

    agent_id: str
    events: list[Event] = field(default_factory=list)
    marks: dict[str, Event] = field(default_factory=dict)

    def add(self, event: Event, mark: str | None = None) -> Event:
        self.events.append(event)
        if mark:
            self.marks[mark] = event
        return event

    def fact(self, namespace: str, key: str, value: str, at: datetime) -> None:
        self.add(facts(self.agent_id, key, value, namespace=namespace, occurred_at=at))

    def session(self, sid: str, start: datetime, lines: list[str], *, end: bool = True) -> None:
        for i, line in enumerate(lines):
            role = "user" if i % 2 == 0 else "assistant"
            at = start + timedelta(minutes=i)
            self.add(episodic(self.agent_id, sid, role, line, user_id=USER, occurred_at=at))
        self.marks[sid] = self.events[-len(lines)]
        if end:
            at = start + timedelta(minutes=len(lines))
            self.add(EpisodicMemory.end_session_event(self.agent_id, sid, occurred_at=at))


def main_history(agent_id: str) -> History:
    h = History(agent_id)
    h.fact("default", "name", "Mei Chen", DAY0)
    h.fact("profile", "city", "Berlin", DAY0)
    h.fact("profile", "diet", "vegetarian", DAY0)
    h.session(
        "kyoto",
        DAY0 + timedelta(minutes=10),
        [
            "I want to visit Kyoto in April for the cherry blossoms.",
            "April is busy; shall I book a ryokan near Gion?",
        ],
        end=False,
    )
    h.add(
        MemCube.add_event(
            agent_id,
            "kyoto",
            "My father passed away last week.",
            user_id=USER,
            importance=9.5,
            sentiment=-0.9,
            occurred_at=DAY0 + timedelta(minutes=12),
        ),
        "loss",
    )
    h.add(
        EpisodicMemory.end_session_event(
            agent_id, "kyoto", reason="done", occurred_at=DAY0 + timedelta(minutes=13)
        )
    )
    h.fact("preferences", "语言", "中文", DAY0 + timedelta(days=1))
    h.session(
        "晚饭",
        DAY0 + timedelta(days=1, hours=10),
        ["今天晚上吃什么？", "我们去吃火锅吧。", "好主意，我来订位。"],
    )
    h.fact("profile", "city", "上海", DAY0 + timedelta(days=2))
    # never ended: the tick 38 days on closes it (its change carries no session)
    h.session(
        "chat",
        DAY0 + timedelta(days=2),
        ["Remind me about the dentist.", "Noted, Thursday."],
        end=False,
    )
    h.fact("profile", "diet", "vegan", DAY0 + timedelta(days=3))
    # 23 turns: cut at 20 (turn_count), the last 3 at session.ended
    h.session("long", DAY0 + timedelta(days=3, hours=2), [f"第{i}条消息" for i in range(1, 24)])
    h.marks["long-2"] = h.events[-4]
    h.add(
        make_event(
            "memory.recalled",
            agent_id=agent_id,
            occurred_at=DAY0 + timedelta(days=4),
            body={
                "query": "Kyoto trip",
                "memory_ids": [memory_id("episode", h.marks["kyoto"])],
                "scores": [0.9],
            },
        )
    )
    retract_at = DAY0 + timedelta(days=5)
    h.add(
        LongTermMemory.delete_event(agent_id, "diet", namespace="profile", occurred_at=retract_at)
    )
    h.add(
        make_event(
            "clock.tick",
            agent_id=agent_id,
            occurred_at=TICK_AT,
            body={"partition": 0, "interval_s": 60.0},
        )
    )
    return h


def other_history(agent_id: str) -> History:
    h = History(agent_id)
    h.fact("profile", "city", "Paris", DAY0)
    h.fact("default", "name", "Other Agent", DAY0)
    h.session("kyoto", DAY0 + timedelta(minutes=30), ["B's secret: the vault code is 1234.", "OK."])
    return h


@dataclass
class Scenario:
    main: History
    other: History
    client: Client
    stack: Stack

    @property
    def agent(self) -> str:
        return self.main.agent_id

    def raw(self, sql: str, **params: Any) -> list[tuple[Any, ...]]:
        return self.stack.rows(sql, **params)

    def run_sql_file(self, name: str, **params: Any) -> list[dict[str, Any]]:
        sql = (SQL_DIR / name).read_text()
        return list(self.client.query(sql, parameters=params).named_results())


def folded(stack: Stack, history: History) -> bool:
    last = stack.scalar(
        "SELECT max(seq) FROM memory_changes FINAL WHERE agent_id = {a:String}", a=history.agent_id
    )
    return bool(last == len(history.events) - 1)


@pytest.fixture(scope="module")
def scenario(stack: Stack) -> Iterator[Scenario]:
    tag = uuid.uuid4().hex[:8]
    main, other = main_history(f"api-{tag}"), other_history(f"api-other-{tag}")
    with Memory(bootstrap=stack.bootstrap) as memory:
        memory.publish_many(main.events + other.events)
    wait_until(lambda: folded(stack, main) and folded(stack, other), 60, "both agents folded")
    url = httpx.URL(stack.http)
    client = clickhouse_connect.get_client(host=url.host, port=url.port, interface="http")
    try:
        yield Scenario(main, other, client, stack)
    finally:
        client.close()


# -- writes are events ----------------------------------------------------------


def test_write_methods_build_events_and_do_no_io() -> None:
    at = datetime(2026, 1, 1, 8, 0, tzinfo=UTC)
    asserted = LongTermMemory.set_event("kiko", "city", "上海", namespace="profile", occurred_at=at)
    assert (asserted.type, asserted.agent_id, asserted.occurred_at) == ("fact.asserted", "kiko", at)
    assert (asserted.body.namespace, asserted.body.key, asserted.body.value) == (
        "profile",
        "city",
        "上海",
    )
    retracted = LongTermMemory.delete_event("kiko", "city")
    assert retracted.type == "fact.retracted" and retracted.body.namespace == "default"
    assert retracted.occurred_at.tzinfo is not None
    turn = EpisodicMemory.append_event("kiko", "s1", "user", "你好", importance=9.5, sentiment=-0.9)
    assert (turn.type, turn.session_id, turn.body.importance) == ("interaction.recorded", "s1", 9.5)
    added = MemCube.add_event("kiko", "s1", "hello")
    assert added.type == "interaction.recorded" and added.body.role == "user"
    assert added.event_id != turn.event_id
    ended = EpisodicMemory.end_session_event("kiko", "s1")
    assert ended.type == "session.ended"
    for bad in ("", "   "):
        with pytest.raises(ValueError):
            LongTermMemory.set_event(bad, "k", "v")
        with pytest.raises(ValueError):
            EpisodicMemory.append_event("kiko", bad, "user", "hi")
    with pytest.raises(ValueError):
        LongTermMemory.set_event("kiko", "k", "v", occurred_at=datetime(2026, 1, 1))
    with pytest.raises(ValueError):
        MemCube.add_event("kiko", "s1", "hi", importance=11)


# -- seed 001: long-term ---------------------------------------------------------


def test_long_term_get_current_and_as_of(scenario: Scenario) -> None:
    ltm, agent = LongTermMemory(scenario.client), scenario.agent
    assert ltm.get(agent, "city", namespace="profile") == "上海"
    assert ltm.get(agent, "city", namespace="profile", as_of=DAY0 + timedelta(days=1)) == "Berlin"
    assert ltm.get(agent, "city", namespace="profile", as_of=DAY0 - timedelta(seconds=1)) is None
    assert ltm.get(agent, "name") == "Mei Chen", "the default namespace"
    assert ltm.get(agent, "diet", namespace="profile") is None, "retracted"
    diet_at = {
        DAY0: "vegetarian",
        DAY0 + timedelta(days=3) - timedelta(milliseconds=1): "vegetarian",
        DAY0 + timedelta(days=3): "vegan",  # [valid_from, valid_to): the new value from T
        DAY0 + timedelta(days=5) - timedelta(milliseconds=1): "vegan",
        DAY0 + timedelta(days=5): None,
    }
    for moment, value in diet_at.items():
        assert ltm.get(agent, "diet", namespace="profile", as_of=moment) == value, moment
    shanghai = datetime(2026, 10, 3, 17, 0, tzinfo=UTC).astimezone(ZoneInfo("Asia/Shanghai"))
    assert ltm.get(agent, "city", namespace="profile", as_of=shanghai) == "上海", "any zone"


def test_long_term_list_by_agent(scenario: Scenario) -> None:
    ltm, agent = LongTermMemory(scenario.client), scenario.agent
    assert ltm.list_by_agent(agent) == {
        "default/name": "Mei Chen",
        "preferences/语言": "中文",
        "profile/city": "上海",
    }
    assert ltm.list_by_agent(agent, namespace="profile") == {"city": "上海"}
    assert ltm.list_by_agent(agent, as_of=DAY0 + timedelta(hours=12)) == {
        "default/name": "Mei Chen",
        "profile/city": "Berlin",
        "profile/diet": "vegetarian",
    }
    assert ltm.list_by_agent(agent, namespace="profile", as_of=DAY0 + timedelta(days=4)) == {
        "city": "上海",
        "diet": "vegan",
    }
    assert ltm.list_by_agent(agent, namespace="nowhere") == {}


def test_long_term_history_rows_are_typed_and_utc(scenario: Scenario) -> None:
    ltm = LongTermMemory(scenario.client)
    versions = ltm.history(scenario.agent, "diet", namespace="profile")
    assert [(v.value, v.valid_from, v.valid_to) for v in versions] == [
        ("vegetarian", DAY0, DAY0 + timedelta(days=3)),
        ("vegan", DAY0 + timedelta(days=3), DAY0 + timedelta(days=5)),
    ]
    assert all(v.valid_from.tzinfo == UTC for v in versions)
    current = ltm.facts(scenario.agent, namespace="profile")
    assert [(f.qualified_key, f.value, f.valid_to) for f in current] == [
        ("profile/city", "上海", None)
    ]
    with pytest.raises(Exception, match="frozen"):
        current[0].value = "Berlin"  # type: ignore[misc]  # rows are frozen


# -- seed 001: episodic ----------------------------------------------------------


def test_episodic_list_by_agent_newest_first(scenario: Scenario) -> None:
    em, h = EpisodicMemory(scenario.client), scenario.main
    episodes = em.list_by_agent(h.agent_id)
    assert [(e.session_id, e.cut, e.turn_count) for e in episodes] == [
        ("long", "session_ended", 3),
        ("long", "turn_count", 20),
        ("chat", "idle_gap", 2),
        ("晚饭", "session_ended", 3),
        ("kyoto", "session_ended", 3),
    ]
    assert [e.ended_at for e in episodes] == sorted((e.ended_at for e in episodes), reverse=True)
    assert all(e.user_id == USER and e.ended_at.tzinfo == UTC for e in episodes)
    kyoto = episodes[-1]
    assert kyoto.episode_id == memory_id("episode", h.marks["kyoto"])
    assert "Kyoto" in kyoto.summary and kyoto.previous_episode_id is None
    assert kyoto.started_at == DAY0 + timedelta(minutes=10)
    assert kyoto.ended_at == DAY0 + timedelta(minutes=12)
    assert "火锅" in episodes[-2].summary or "吃" in episodes[-2].summary
    assert [e.episode_id for e in em.list_by_agent(h.agent_id, limit=2)] == [
        e.episode_id for e in episodes[:2]
    ]
    before = em.list_by_agent(h.agent_id, before=DAY0 + timedelta(days=2))
    assert [e.session_id for e in before] == ["晚饭", "kyoto"]


def test_episodic_list_by_session_in_order(scenario: Scenario) -> None:
    em, h = EpisodicMemory(scenario.client), scenario.main
    long = em.list_by_session(h.agent_id, "long")
    assert [(e.cut, e.turn_count) for e in long] == [("turn_count", 20), ("session_ended", 3)]
    assert long[1].previous_episode_id == long[0].episode_id
    assert long[1].episode_id == memory_id("episode", h.marks["long-2"])
    # closed by the tick, whose change has no session: found by its first turn
    (chat,) = em.list_by_session(h.agent_id, "chat")
    assert chat.episode_id == memory_id("episode", h.marks["chat"]) and chat.cut == "idle_gap"
    (kyoto,) = em.list_by_session(h.agent_id, "kyoto")
    assert "vault" not in kyoto.summary, "another agent's session of the same name"
    assert em.list_by_session(h.agent_id, "no-such-session") == []
    assert len(em.list_by_session(h.agent_id, "long", limit=1)) == 1


# -- seed 002: MemCube -----------------------------------------------------------


def raw_memories(scenario: Scenario, where: str = "1", **params: Any) -> set[str]:
    rows = scenario.raw(
        f"SELECT memory_id FROM memories WHERE agent_id = {{a:String}} AND {where}",
        a=scenario.agent,
        **params,
    )
    return {row[0] for row in rows}


def test_memcube_list_memories(scenario: Scenario) -> None:
    cube, h = MemCube(scenario.client), scenario.main
    live = cube.list_memories(h.agent_id)
    every = cube.list_memories(h.agent_id, include_forgotten=True)
    assert {m.memory_id for m in live} == raw_memories(scenario, "NOT forgotten")
    assert {m.memory_id for m in every} == raw_memories(scenario)
    assert not any(m.forgotten for m in live)
    forgotten = [m for m in every if m.forgotten]
    assert forgotten, "the dull episodes are forgotten at the tick 40 days on"
    assert all(m.forgotten_at == TICK_AT and m.layer == "L2" for m in forgotten)
    assert all(m.forgotten_at is None for m in live)
    by_id = {m.memory_id: m for m in every}
    for first, session in ((h.marks["晚饭"], "晚饭"), (h.marks["long"], "long")):
        assert by_id[memory_id("episode", first)].forgotten, session
    chat = by_id[memory_id("episode", h.marks["chat"])]
    assert (chat.session_id, chat.user_id, chat.kind) == ("chat", USER, "episode"), (
        "made at the tick: session and user come from its first turn"
    )
    ((last_turn,),) = scenario.raw(
        "SELECT max(occurred_at) FROM events WHERE agent_id = {a:String}"
        " AND session_id = 'chat' AND type = 'interaction.recorded'",
        a=h.agent_id,
    )
    # closed by the tick, but formed (its forgetting clock started) at its last turn
    assert chat.created_at == last_turn.replace(tzinfo=UTC) < TICK_AT
    l2 = cube.list_memories(h.agent_id, layers=["L2"], include_forgotten=True)
    assert l2 and all(m.layer == "L2" for m in l2)
    assert memory_id("turn", h.marks["loss"]) not in {m.memory_id for m in l2}
    assert cube.list_memories(h.agent_id, layers=["L1"]) == []
    assert cube.list_memories(h.agent_id, user_id=USER) == live
    assert cube.list_memories(h.agent_id, user_id="someone-else") == []
    assert [m.created_at for m in live] == sorted(m.created_at for m in live)


def test_memcube_consolidate_holds_the_flashbulb(scenario: Scenario) -> None:
    cube, h = MemCube(scenario.client), scenario.main
    l3 = cube.consolidate(h.agent_id)
    assert {m.memory_id for m in l3} == raw_memories(scenario, "layer = 'L3'")
    assert all(m.layer == "L3" and not m.forgotten for m in l3)
    loss = {m.memory_id: m for m in l3}[memory_id("turn", h.marks["loss"])]
    assert loss.text == "My father passed away last week.", "kept verbatim"
    assert (loss.kind, loss.promoted, loss.importance, loss.sentiment) == ("turn", True, 9.5, -0.9)
    assert (loss.session_id, loss.user_id) == ("kyoto", USER)
    assert loss.created_at == DAY0 + timedelta(minutes=12) and loss.created_at.tzinfo == UTC
    assert cube.consolidate(h.agent_id, user_id=USER) == l3


# -- isolation and arguments -----------------------------------------------------


def test_no_read_crosses_agents(scenario: Scenario) -> None:
    ltm = LongTermMemory(scenario.client)
    em, cube = EpisodicMemory(scenario.client), MemCube(scenario.client)
    other = scenario.other.agent_id
    assert ltm.list_by_agent(other) == {"default/name": "Other Agent", "profile/city": "Paris"}
    assert "Paris" not in ltm.list_by_agent(scenario.agent).values()
    assert [e.session_id for e in em.list_by_session(other, "kyoto")] == ["kyoto"]
    assert {m.agent_id for m in cube.list_memories(other, include_forgotten=True)} <= {other}
    mine = {m.memory_id for m in cube.list_memories(scenario.agent, include_forgotten=True)}
    theirs = {m.memory_id for m in cube.list_memories(other, include_forgotten=True)}
    assert not mine & theirs
    for crafted in CRAFTED:
        assert ltm.get(crafted, "city", namespace="profile") is None
        assert ltm.get(scenario.agent, crafted, namespace="profile") is None
        assert ltm.get(scenario.agent, "city", namespace=crafted) is None
        assert ltm.list_by_agent(crafted) == {}
        assert ltm.list_by_agent(crafted, as_of=TICK_AT) == {}
        assert em.list_by_agent(crafted) == []
        assert em.list_by_session(crafted, "kyoto") == []
        assert em.list_by_session(scenario.agent, crafted) == []
        assert cube.list_memories(crafted, include_forgotten=True) == []
        assert cube.list_memories(scenario.agent, user_id=crafted) == []
        assert cube.consolidate(crafted) == []


def test_bad_arguments_are_value_errors(scenario: Scenario) -> None:
    ltm = LongTermMemory(scenario.client)
    em, cube = EpisodicMemory(scenario.client), MemCube(scenario.client)
    calls = [
        lambda agent: ltm.get(agent, "k"),
        lambda agent: ltm.list_by_agent(agent),
        lambda agent: ltm.history(agent, "k"),
        lambda agent: em.list_by_agent(agent),
        lambda agent: em.list_by_session(agent, "s"),
        lambda agent: cube.list_memories(agent),
        lambda agent: cube.consolidate(agent),
    ]
    for call in calls:
        for bad in ("", " ", None):
            with pytest.raises(ValueError):
                call(bad)
    naive = datetime(2026, 10, 2)
    bad_calls = [
        lambda: ltm.get(scenario.agent, "k", as_of=naive),
        lambda: ltm.list_by_agent(scenario.agent, as_of=naive),
        lambda: em.list_by_agent(scenario.agent, before=naive),
        lambda: em.list_by_agent(scenario.agent, limit=0),
        lambda: em.list_by_agent(scenario.agent, limit=10**9),
        lambda: em.list_by_session(scenario.agent, ""),
        lambda: cube.list_memories(scenario.agent, layers=["L9"]),
        lambda: cube.list_memories(scenario.agent, layers="L2"),
        lambda: cube.list_memories(scenario.agent, user_id=""),
        lambda: ltm.get(scenario.agent, "", namespace="profile"),
    ]
    for bad_call in bad_calls:
        with pytest.raises(ValueError):
            bad_call()


# -- ops/sql ----------------------------------------------------------------------


def test_every_sql_file_is_tested() -> None:
    assert {p.name for p in SQL_DIR.glob("*.sql")} == {
        "retention_curve.sql",
        "knew_on_date.sql",
        "promotions_per_day.sql",
        "episodes_per_agent.sql",
    }
    for path in SQL_DIR.glob("*.sql"):
        assert path.read_text().startswith("-- "), f"{path.name} needs its comment header"


def points(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["row"] == "point"]


def test_sql_retention_curve_of_a_forgotten_episode(scenario: Scenario) -> None:
    dinner = memory_id("episode", scenario.main.marks["晚饭"])
    rows = scenario.run_sql_file(
        "retention_curve.sql", agent_id=scenario.agent, memory_id=dinner, days=45
    )
    changes = [r for r in rows if r["row"] == "change"]
    assert [r["type"] for r in changes] == ["memory.created", "memory.forgotten"]
    created, forgotten = changes
    strength = created["strength"]
    assert strength > 0 and forgotten["at"].replace(tzinfo=UTC) == TICK_AT
    assert forgotten["retention"] < 0.2 and forgotten["forgotten"]
    curve = points(rows)
    assert len(curve) == 46 and curve[0]["retention"] == 1.0
    start = created["at"]
    for day, point in enumerate(curve):
        assert point["at"] == start + timedelta(days=day)
        assert point["retention"] == pytest.approx(math.exp(-day / strength), abs=1e-6)
        assert point["forgotten"] == (point["at"] >= forgotten["at"])
    assert [r["at"] for r in rows] == sorted(r["at"] for r in rows)
    at_tick = math.exp(-(forgotten["at"] - start).total_seconds() / 86400 / strength)
    assert forgotten["retention"] == pytest.approx(at_tick, abs=1e-3), "SQL agrees with the fold"


def test_sql_retention_curve_rises_at_a_reinforcement(scenario: Scenario) -> None:
    kyoto = memory_id("episode", scenario.main.marks["kyoto"])
    rows = scenario.run_sql_file(
        "retention_curve.sql", agent_id=scenario.agent, memory_id=kyoto, days=6
    )
    reinforced = [r for r in rows if r["type"] == "memory.reinforced"]
    assert len(reinforced) == 1
    created = next(r for r in rows if r["type"] == "memory.created")
    assert reinforced[0]["strength"] > created["strength"]
    retention = [r["retention"] for r in points(rows)]
    assert retention[1] > retention[2] > retention[3], "decays between reinforcements"
    assert retention[4] > retention[3] and retention[4] > 0.99, "rises at the recall on day 4"
    assert retention[4] > retention[5] > retention[6]
    crafted = scenario.run_sql_file(
        "retention_curve.sql", agent_id="x' OR 1=1 --", memory_id=kyoto, days=6
    )
    assert crafted == []


def test_sql_knew_on_date(scenario: Scenario) -> None:
    h = scenario.main
    moment = DAY0 + timedelta(days=4, hours=1)
    rows = scenario.run_sql_file("knew_on_date.sql", agent_id=h.agent_id, at=moment)
    known_facts = {r["id"]: r["content"] for r in rows if r["kind"] == "fact"}
    assert known_facts == {
        "default/name": "Mei Chen",
        "preferences/语言": "中文",
        "profile/city": "上海",
        "profile/diet": "vegan",
    }
    memories = {r["id"]: r for r in rows if r["kind"] == "memory"}
    # consolidation by abstraction (if the fold does it) adds semantic L3 memories
    semantic = {i for i, r in memories.items() if r["detail"] == "semantic"}
    assert semantic == raw_memories(
        scenario, "kind = 'semantic' AND created_at <= {t:DateTime64(3, 'UTC')}", t=moment
    )
    assert all(memories[i]["layer"] == "L3" for i in semantic)
    expected = {
        memory_id("episode", h.marks["kyoto"]),
        memory_id("turn", h.marks["loss"]),
        memory_id("episode", h.marks["晚饭"]),
        memory_id("episode", h.marks["long"]),
        memory_id("episode", h.marks["long-2"]),
    }
    assert set(memories) - semantic == expected, "the chat episode was only closed by the tick"
    loss = memories[memory_id("turn", h.marks["loss"])]
    assert (loss["layer"], loss["detail"]) == ("L3", "turn")
    kyoto = memories[memory_id("episode", h.marks["kyoto"])]
    assert kyoto["retention"] > 0.99, "recalled an hour before"
    assert all(0 < r["retention"] <= 1 for r in memories.values())

    late = scenario.run_sql_file("knew_on_date.sql", agent_id=h.agent_id, at=TICK_AT)
    late_facts = {r["id"]: r["content"] for r in late if r["kind"] == "fact"}
    assert late_facts == LongTermMemory(scenario.client).list_by_agent(h.agent_id, as_of=TICK_AT)
    live = {m.memory_id for m in MemCube(scenario.client).list_memories(h.agent_id)}
    assert {r["id"] for r in late if r["kind"] == "memory"} == live, "two roads agree"
    before = scenario.run_sql_file(
        "knew_on_date.sql", agent_id=h.agent_id, at=DAY0 - timedelta(days=1)
    )
    assert before == []


def test_sql_promotions_per_day(scenario: Scenario) -> None:
    params = {"since": DAY0 - timedelta(days=1), "until": DAY0 + timedelta(days=60)}
    rows = scenario.run_sql_file("promotions_per_day.sql", agent_id=scenario.agent, **params)
    flashbulbs = raw_memories(scenario, "promoted AND kind IN ('turn', 'episode')")
    assert memory_id("turn", scenario.main.marks["loss"]) in flashbulbs
    by_reason = {(r["day"], r["reason"]): r for r in rows}
    assert by_reason.pop((date(2026, 10, 1), "flashbulb"))["promotions"] == len(flashbulbs)
    # consolidation by abstraction (if the fold does it): semantic memories, made in L3
    assert {reason for _, reason in by_reason} <= {"abstraction"}
    semantic = raw_memories(scenario, "kind = 'semantic'")
    assert sum(r["promotions"] for r in by_reason.values()) == len(semantic)
    assert all(r["agents"] == 1 for r in rows)
    everyone = scenario.run_sql_file("promotions_per_day.sql", agent_id="", **params)
    day0 = {r["reason"]: r for r in everyone if r["day"] == date(2026, 10, 1)}
    assert day0["flashbulb"]["promotions"] >= len(flashbulbs)
    empty = scenario.run_sql_file(
        "promotions_per_day.sql", agent_id=scenario.agent, since=TICK_AT, until=TICK_AT
    )
    assert empty == []


def test_sql_episodes_per_agent(scenario: Scenario) -> None:
    params = {"since": DAY0 - timedelta(days=1), "until": DAY0 + timedelta(days=60)}
    (row,) = scenario.run_sql_file("episodes_per_agent.sql", agent_id=scenario.agent, **params)
    assert row["agent_id"] == scenario.agent
    assert (row["episodes"], row["sessions"], row["turns"]) == (5, 4, 3 + 3 + 2 + 23)
    assert (row["cut_session_ended"], row["cut_idle_gap"], row["cut_turn_count"]) == (3, 1, 1)
    assert row["first_started_at"].replace(tzinfo=UTC) == DAY0 + timedelta(minutes=10)
    assert 1 <= row["avg_importance"] <= 10 and -1 <= row["avg_sentiment"] <= 1
    everyone = scenario.run_sql_file("episodes_per_agent.sql", agent_id="", **params)
    counts = {r["agent_id"]: r["episodes"] for r in everyone}
    assert counts[scenario.agent] == 5 and counts[scenario.other.agent_id] == 1
    first_two_days = scenario.run_sql_file(
        "episodes_per_agent.sql",
        agent_id=scenario.agent,
        since=DAY0,
        until=DAY0 + timedelta(days=2),
    )
    assert [(r["episodes"], r["sessions"]) for r in first_two_days] == [(2, 2)]


def test_sql_files_are_read_only_for_the_gate(scenario: Scenario) -> None:
    """Each file is one statement the engram HTTP gate accepts (no trailing ';')."""
    for path in sorted(Path(SQL_DIR).glob("*.sql")):
        assert not path.read_text().rstrip().endswith(";"), path.name
