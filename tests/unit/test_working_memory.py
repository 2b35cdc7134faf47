"""L1 working memory: the last turns of each open session, folded from the log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import count
from typing import Any
from uuid import UUID

import pytest

from processors import AgentMemory, MemoryConfig
from processors.working import WorkingMemory, estimate_tokens
from schemas import (
    ClockTicked,
    DerivedEvent,
    Event,
    FactAsserted,
    InteractionRecorded,
    SessionEnded,
    SessionStarted,
    ToolCalled,
    ToolResult,
    Turn,
    WorkingBody,
    WorkingUpdated,
)

AGENT = "agent-wm"
T0 = datetime(2024, 6, 1, 8, 0, tzinfo=UTC)


class Log:
    """Builds one agent's events with fresh ids and increasing times."""

    def __init__(self) -> None:
        self.n = count(1)

    def _env(self, session: str | None) -> dict[str, Any]:
        i = next(self.n)
        return {
            "event_id": UUID(int=i),
            "agent_id": AGENT,
            "session_id": session,
            "user_id": "u-1",
            "occurred_at": T0 + timedelta(seconds=i),
        }

    def start(self, session: str, task: str | None = None) -> SessionStarted:
        return SessionStarted(**self._env(session), body={"task": task})

    def end(self, session: str) -> SessionEnded:
        return SessionEnded(**self._env(session), body={"reason": "done"})

    def say(self, session: str | None, text: str, role: str = "user") -> InteractionRecorded:
        return InteractionRecorded(**self._env(session), body={"role": role, "content": text})

    def call(self, session: str, tool: str, arguments: str) -> ToolCalled:
        body = {"call_id": f"c{tool}", "tool": tool, "arguments": arguments}
        return ToolCalled(**self._env(session), body=body)

    def result(self, session: str, tool: str, content: str) -> ToolResult:
        body = {"call_id": f"c{tool}", "tool": tool, "content": content}
        return ToolResult(**self._env(session), body=body)

    def fact(self, session: str | None) -> FactAsserted:
        body = {"namespace": "prefs", "key": "drink", "value": "绿茶"}
        return FactAsserted(**self._env(session), body=body)

    def tick(self) -> ClockTicked:
        return ClockTicked(**self._env(None), body={"partition": 0, "interval_s": 60.0})


def fold(
    events: list[Event], config: MemoryConfig | None = None
) -> tuple[AgentMemory, list[DerivedEvent]]:
    memory = AgentMemory.empty(AGENT, config or MemoryConfig())
    out: list[DerivedEvent] = []
    for event in events:  # only working memory's changes: the other processors test their own
        out.extend(d for d in memory.apply(event).derived if isinstance(d, WorkingUpdated))
    return memory, out


def bodies(derived: list[DerivedEvent]) -> list[WorkingBody]:
    assert all(isinstance(d, WorkingUpdated) for d in derived)
    return [d.body for d in derived if isinstance(d, WorkingUpdated)]


class Replica:
    """A consumer of ``working.updated``: rebuilds each session's working memory from
    the deltas alone (``working[evicted:] + added``, emptied when cleared), checking
    every delta against what it claims about the whole working memory."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.sessions: dict[str | None, list[Turn]] = {}
        self.evicted: dict[str | None, int] = {}

    def apply(self, update: DerivedEvent) -> list[Turn]:
        assert isinstance(update, WorkingUpdated)
        sid, body = update.session_id, update.body
        working = self.sessions.get(sid, [])
        assert body.evicted <= len(working), "cannot evict turns the session never held"
        for turn in body.added:
            assert turn.tokens == estimate_tokens(turn.content)
        if body.cleared:
            assert body.added == []
            assert body.evicted == len(working), "a cleared delta evicts everything held"
            self.sessions.pop(sid, None)
            self.evicted.pop(sid, None)
            working = []
        else:
            working = working[body.evicted :] + body.added
            self.sessions[sid] = working
            self.evicted[sid] = self.evicted.get(sid, 0) + body.evicted
        assert body.size == len(working)
        assert body.tokens == sum(t.tokens for t in working)
        if self.limit is not None:
            assert len(working) <= self.limit
        return list(working)

    def replay(self, derived: list[DerivedEvent]) -> list[list[Turn]]:
        """The working memory of the updated session after each delta."""
        return [self.apply(d) for d in derived]


def contents(turns: list[Turn]) -> list[str]:
    return [t.content for t in turns]


def test_keeps_the_last_working_turns_and_counts_dropped() -> None:
    log = Log()
    texts = [f"turn {i}" for i in range(7)]
    events = [log.start("s", "写周报"), *(log.say("s", t) for t in texts)]
    memory, derived = fold(events, MemoryConfig(working_turns=3))
    seen = bodies(derived)
    assert len(seen) == 8
    assert [len(b.added) for b in seen] == [0, 1, 1, 1, 1, 1, 1, 1]
    assert [b.evicted for b in seen] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [b.size for b in seen] == [0, 1, 2, 3, 3, 3, 3, 3]
    replica = Replica(limit=3)
    after = replica.replay(derived)
    assert [contents(w) for w in after] == [texts[max(0, k - 3) : k] for k in range(8)]
    assert contents(after[-1]) == ["turn 4", "turn 5", "turn 6"]
    assert replica.evicted["s"] == 4
    (state,) = memory.state().sessions
    assert (state.dropped, [t.content for t in state.turns]) == (4, ["turn 4", "turn 5", "turn 6"])
    assert state.turns == after[-1]


def test_default_limit_is_the_config_value() -> None:
    log = Log()
    limit = MemoryConfig().working_turns
    _, derived = fold([log.say("s", str(i)) for i in range(limit + 5)])
    seen = bodies(derived)
    assert [b.evicted for b in seen] == [0] * limit + [1] * 5
    assert [b.size for b in seen] == [*range(1, limit + 1), *[limit] * 5]
    replica = Replica(limit=limit)
    last = replica.replay(derived)[-1]
    assert len(last) == limit
    assert replica.evicted["s"] == 5
    assert contents(last) == [str(i) for i in range(5, limit + 5)]


def test_turn_records_its_source() -> None:
    log = Log()
    event = log.say("s", "记住：我对花生过敏", role="user")
    _, derived = fold([event])
    (update,) = derived
    body = bodies(derived)[0]
    (turn,) = body.added
    assert (turn.event_id, turn.role, turn.content, turn.occurred_at) == (
        str(event.event_id),
        "user",
        "记住：我对花生过敏",
        event.occurred_at,
    )
    assert turn.tokens == estimate_tokens(turn.content) == 9
    assert turn.offloaded is False
    assert (body.evicted, body.size, body.tokens, body.cleared) == (0, 1, 9, False)
    assert (update.agent_id, update.session_id, update.user_id) == (AGENT, "s", "u-1")
    assert update.occurred_at == event.occurred_at
    assert update.source_event_id == event.event_id


def test_task_is_set_at_session_started_and_kept() -> None:
    log = Log()
    _, derived = fold([log.start("s", "订机票"), log.say("s", "去上海"), log.say("s", "周五")])
    seen = bodies(derived)
    assert seen[0] == WorkingBody(added=[], evicted=0, size=0, tokens=0, task="订机票")
    assert [b.task for b in seen] == ["订机票"] * 3
    assert [contents(w) for w in Replica().replay(derived)] == [
        [],
        ["去上海"],
        ["去上海", "周五"],
    ]


def test_restart_replaces_the_task_and_keeps_turns() -> None:
    log = Log()
    _, derived = fold([log.start("s", "a"), log.say("s", "x"), log.start("s", "b")])
    last = bodies(derived)[-1]
    assert (last.task, last.added, last.evicted, last.cleared) == ("b", [], 0, False)
    assert (last.size, last.tokens) == (1, estimate_tokens("x"))
    assert contents(Replica().replay(derived)[-1]) == ["x"]


def test_session_ended_clears() -> None:
    log = Log()
    events = [
        log.start("s", "task"),
        log.say("s", "hi"),
        log.say("other", "keep me"),
        log.say("s", "again"),
        log.say("s", "third"),
        log.end("s"),
    ]
    memory, derived = fold(events, MemoryConfig(working_turns=2))
    cleared = derived[-1]
    assert isinstance(cleared, WorkingUpdated)
    assert cleared.session_id == "s"
    # it held two turns ("hi" was evicted earlier): exactly those two leave
    assert cleared.body == WorkingBody(
        added=[], evicted=2, size=0, tokens=0, task="task", variables={}, cleared=True
    )
    replica = Replica(limit=2)
    after = replica.replay(derived)
    assert contents(after[-2]) == ["again", "third"]
    assert after[-1] == []
    assert set(replica.sessions) == {"other"}
    assert contents(replica.sessions["other"]) == ["keep me"]
    assert [s.session_id for s in memory.state().sessions] == ["other"]
    assert not any(b.cleared for b in bodies(derived[:-1]))


def test_a_session_after_its_end_starts_fresh() -> None:
    log = Log()
    events = [log.say("s", "1"), log.say("s", "2"), log.end("s"), log.say("s", "3")]
    memory, derived = fold(events, MemoryConfig(working_turns=1))
    seen = bodies(derived)
    assert [(b.evicted, b.size, b.cleared) for b in seen] == [
        (0, 1, False),
        (1, 1, False),
        (1, 0, True),
        (0, 1, False),
    ]
    replica = Replica(limit=1)
    assert [contents(w) for w in replica.replay(derived)] == [["1"], ["2"], [], ["3"]]
    assert replica.evicted["s"] == 0
    (state,) = memory.state().sessions
    assert (contents(state.turns), state.dropped) == (["3"], 0)


def test_ending_an_unknown_session_does_nothing() -> None:
    log = Log()
    memory, derived = fold([log.say("s", "x"), log.end("never-opened")])
    assert len(derived) == 1
    assert [s.session_id for s in memory.state().sessions] == ["s"]


def test_sessions_are_independent() -> None:
    log = Log()
    events = [
        log.start("a", "task A"),
        log.start("b", "任务 B"),
        log.say("a", "a1"),
        log.say("b", "b1"),
        log.say("a", "a2"),
        log.say("a", "a3"),
        log.say("b", "b2"),
    ]
    _, derived = fold(events, MemoryConfig(working_turns=2))
    by_session: dict[str | None, list[WorkingBody]] = {}
    for d in derived:
        assert isinstance(d, WorkingUpdated)
        by_session.setdefault(d.session_id, []).append(d.body)
    replica = Replica(limit=2)
    replica.replay(derived)
    a, b = by_session["a"][-1], by_session["b"][-1]
    assert (contents(replica.sessions["a"]), a.task, replica.evicted["a"]) == (
        ["a2", "a3"],
        "task A",
        1,
    )
    assert (contents(replica.sessions["b"]), b.task, replica.evicted["b"]) == (
        ["b1", "b2"],
        "任务 B",
        0,
    )
    assert [x.evicted for x in by_session["a"]] == [0, 0, 0, 1]
    assert [x.evicted for x in by_session["b"]] == [0, 0, 0]


def test_events_without_session_produce_no_working_update() -> None:
    log = Log()
    events = [log.say(None, "no session"), log.tick(), log.fact(None)]
    memory = AgentMemory.empty(AGENT, MemoryConfig())
    steps = [memory.apply(e) for e in events]
    assert [s.seq for s in steps] == [0, 1, 2]  # still folded, in sequence
    assert not any(isinstance(d, WorkingUpdated) for s in steps for d in s.derived)
    assert memory.state().sessions == []


def test_non_turn_events_with_a_session_touch_nothing() -> None:
    """A fact with a session id neither updates nor opens that session's working memory."""
    log = Log()
    memory, derived = fold([log.fact("s")])
    assert derived == []
    assert memory.state().sessions == []
    memory, derived = fold([log.fact("late"), log.end("late")])
    assert derived == [], "a session nobody opened must not be 'cleared'"


def test_tool_events_are_turns() -> None:
    log = Log()
    events = [
        log.say("s", "查一下天气", role="user"),
        log.call("s", "weather", '{"city": "上海"}'),
        log.result("s", "weather", "晴，25°C"),
        log.say("s", "上海今天晴。", role="assistant"),
    ]
    _, derived = fold(events)
    last = Replica().replay(derived)[-1]
    assert [(t.role, t.content) for t in last] == [
        ("user", "查一下天气"),
        ("tool_call", 'weather({"city": "上海"})'),
        ("tool", "晴，25°C"),
        ("assistant", "上海今天晴。"),
    ]
    assert [t.event_id for t in last] == [str(e.event_id) for e in events]
    # 5 CJK; 2 CJK + ceil(21 / 4); 1 CJK + ceil(5 / 4) (the full-width comma is not CJK
    # here); 6 CJK (the ideographic full stop is)
    assert [t.tokens for t in last] == [5, 2 + 6, 1 + 2, 6]


def test_tokens_sum_the_estimates_of_the_kept_turns() -> None:
    log = Log()
    texts = ["你好世界", "hello world", "混合 mixed text 文本"]
    _, derived = fold([log.say("s", t) for t in texts], MemoryConfig(working_turns=2))
    seen = bodies(derived)
    assert seen[0].tokens == 4
    assert seen[1].tokens == 4 + estimate_tokens(texts[1]) == 7
    assert seen[-1].evicted == 1
    assert seen[-1].tokens == estimate_tokens(texts[1]) + estimate_tokens(texts[2])
    assert [t.tokens for b in seen for t in b.added] == [estimate_tokens(t) for t in texts]
    Replica(limit=2).replay(derived)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("", 0),
        ("abcd", 1),
        ("abcde", 2),
        ("hello world", 3),
        ("你好世界", 4),
        ("记忆是持久的", 6),
        ("こんにちは", 5),
        ("안녕하세요", 5),
        ("你好 hello", 2 + 2),
        ("，。、", 3),
    ],
)
def test_estimate_tokens(text: str, tokens: int) -> None:
    assert estimate_tokens(text) == tokens


def test_cjk_counts_one_token_per_character() -> None:
    zh = "人工智能的记忆系统" * 10
    assert estimate_tokens(zh) == len(zh)
    assert estimate_tokens("a" * 40) == 10
    assert estimate_tokens(zh + "a" * 40) == len(zh) + 10


def test_working_memory_state_round_trips() -> None:
    log = Log()
    working = WorkingMemory([], limit=2)
    for event in [log.start("s", "t"), log.say("s", "1"), log.say("s", "2"), log.say("s", "3")]:
        last = working.apply(event)
    assert last is not None
    assert (contents(last.added), last.evicted, last.size) == (["3"], 1, 2)
    assert last.tokens == estimate_tokens("2") + estimate_tokens("3")
    restored = WorkingMemory(working.state(), limit=2)
    assert restored.state() == working.state()
    (state,) = restored.state()
    assert (contents(state.turns), state.dropped) == (["2", "3"], 1)
    nxt = log.say("s", "4")
    resumed = restored.apply(nxt)
    assert resumed == working.apply(nxt)
    assert resumed is not None
    assert (contents(resumed.added), resumed.evicted, resumed.size) == (["4"], 1, 2)
    assert resumed.tokens == estimate_tokens("3") + estimate_tokens("4")
