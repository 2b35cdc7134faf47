"""L1 working memory: the last turns of each open session, folded from the log: turn
cap, token budget kept by compression, offloaded tool results, idle TTL."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from itertools import count
from typing import Any
from uuid import UUID

import pytest

from processors import AgentMemory, MemoryConfig
from processors.state import WorkingParams
from processors.summary import split_sentences
from processors.working import WorkingMemory, estimate_tokens
from schemas import (
    BadEvent,
    ClockTicked,
    Codec,
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
    WorkingSet,
    WorkingUpdated,
)

AGENT = "agent-wm"
T0 = datetime(2024, 6, 1, 8, 0, tzinfo=UTC)


class Log:
    """Builds one agent's events with fresh ids and increasing times."""

    def __init__(self) -> None:
        self.n = count(1)
        self.skip = timedelta(0)

    def wait(self, seconds: float) -> None:
        """Let ``seconds`` of event time pass before the next event (besides its 1 s)."""
        self.skip += timedelta(seconds=seconds)

    def _env(self, session: str | None) -> dict[str, Any]:
        i = next(self.n)
        return {
            "event_id": UUID(int=i),
            "agent_id": AGENT,
            "session_id": session,
            "user_id": "u-1",
            "occurred_at": T0 + self.skip + timedelta(seconds=i),
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

    def set(self, session: str, **body: Any) -> WorkingSet:
        return WorkingSet(**self._env(session), body=body)

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
    the deltas alone, by the fold rule of :class:`~schemas.WorkingBody`: drop every
    session in ``expired``, then ``working = prepended + working[evicted:] + added``
    for the delta's own session (a cleared session left empty is dropped). It checks
    every delta against what it claims about the whole working memory, against the
    turn cap and, when given, the token budget: only a lone newest turn may exceed it.
    """

    def __init__(self, limit: int | None = None, budget: int | None = None) -> None:
        self.limit = limit
        self.budget = budget
        self.sessions: dict[str | None, list[Turn]] = {}
        self.evicted: dict[str | None, int] = {}

    def apply(self, update: DerivedEvent) -> list[Turn]:
        assert isinstance(update, WorkingUpdated)
        sid, body = update.session_id, update.body
        for turn in [*body.prepended, *body.added]:
            assert turn.tokens == estimate_tokens(turn.content)
        assert len(body.added) <= 1
        assert len(body.prepended) <= 1
        assert all(t.role == "summary" and not t.offloaded for t in body.prepended)
        for gone in body.expired:
            self.sessions.pop(gone, None)
            self.evicted.pop(gone, None)
        if sid is None:  # a clock.tick: it only expires sessions
            assert body.cleared and body.expired == sorted(set(body.expired))
            assert (body.added, body.prepended, body.evicted, body.size, body.tokens) == (
                [],
                [],
                0,
                0,
                0,
            )
            return []
        assert body.expired == []
        working = self.sessions.get(sid, [])
        assert body.evicted <= len(working), "cannot evict turns the session never held"
        if body.cleared:
            assert body.evicted == len(working), "a cleared delta evicts everything held"
            assert body.prepended == []
        working = body.prepended + working[body.evicted :] + body.added
        if body.cleared and not working:
            self.sessions.pop(sid, None)
            self.evicted.pop(sid, None)
        else:
            self.sessions[sid] = working
            before = 0 if body.cleared else self.evicted.get(sid, 0)
            self.evicted[sid] = before + (0 if body.cleared else body.evicted)
        assert body.size == len(working)
        assert body.tokens == sum(t.tokens for t in working)
        assert sum(t.role == "summary" for t in working) <= 1
        assert all(t.role != "summary" for t in working[1:]), "a summary is only in front"
        if self.limit is not None:
            assert len(working) <= self.limit
        if self.budget is not None and body.tokens > self.budget:
            assert len(working) == 1, "only a lone newest turn may exceed the budget"
            assert working == body.added or not body.added
        return list(working)

    def replay(self, derived: list[DerivedEvent]) -> list[list[Turn]]:
        """The working memory of the updated session after each delta."""
        return [self.apply(d) for d in derived]

    def agrees_with(self, memory: AgentMemory) -> bool:
        """Whether it holds what the processor holds (an empty session is no session)."""
        held = {s.session_id: s.turns for s in memory.state().sessions if s.turns}
        return held == {sid: w for sid, w in self.sessions.items() if w}


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


# -- token budget and compression -------------------------------------------------------


def budgeted(budget: int, **working: Any) -> MemoryConfig:
    return MemoryConfig(
        working_turns=working.pop("turns", 50),
        working=WorkingParams(token_budget=budget, **working),
    )


def test_over_budget_the_oldest_turns_become_one_summary_in_front() -> None:
    log = Log()
    texts = [
        "I need a flight to Paris on Friday.",  # 9 tokens
        "Sure, which airport do you prefer?",  # 9
        "Charles de Gaulle, morning if possible.",  # 10
        "There is an Air France flight at 9:40.",  # 10
        "Book it please.",  # 4
        "Done: booking reference XK42.",  # 8
    ]
    events = [log.say("s", t) for t in texts]
    config = budgeted(30, compress_to=0.5, summary_chars=60)
    memory, derived = fold(events, config)
    seen = bodies(derived)
    # 9 + 9 + 10 = 28 fits; + 10 = 38 does not: the verbatim turns must come under
    # 15 (half the budget), so the three oldest are summarised; later, with 9 + 10 +
    # 4 + 8 = 31, the summary and the next turn are summarised again, into one
    assert [(b.evicted, contents(b.prepended), b.size, b.tokens) for b in seen] == [
        (0, [], 1, 9),
        (0, [], 2, 18),
        (0, [], 3, 28),
        (3, [texts[0]], 2, 9 + 10),
        (0, [], 3, 9 + 10 + 4),
        (2, [texts[0]], 3, 9 + 4 + 8),
    ]
    assert [contents(b.added) for b in seen] == [[t] for t in texts]
    replica = Replica(budget=30)
    after = replica.replay(derived)
    summary, *verbatim = after[-1]
    assert (summary.role, summary.content) == ("summary", texts[0])
    # a summary is named and dated by the newest turn it covers
    assert summary.event_id == str(events[3].event_id)
    assert summary.occurred_at == events[3].occurred_at
    assert contents(verbatim) == texts[4:]
    assert replica.agrees_with(memory)
    (state,) = memory.state().sessions
    assert (state.compressed, state.dropped) == (4, 0)
    assert state.turns == after[-1]


def test_the_budget_is_never_exceeded_and_the_newest_turn_is_verbatim() -> None:
    log = Log()
    sentences = [
        "The quarterly report is due on Monday.",
        "Revenue grew twelve percent in Asia.",
        "我们需要在周五之前完成预算。",
        "Marketing asked for two more designers.",
        "客户对新版本的反馈很好。",
        "The server migration is scheduled for June.",
    ]
    texts = [f"{sentences[i % 6]} {sentences[(i * 5 + 1) % 6]}" for i in range(40)]
    events = [log.say("s", t, role=("user", "assistant")[i % 2]) for i, t in enumerate(texts)]
    config = budgeted(80, summary_chars=120)
    memory, derived = fold(events, config)
    replica = Replica(budget=80)
    for event, working in zip(events, replica.replay(derived), strict=True):
        assert sum(t.tokens for t in working) <= 80
        assert working[-1].event_id == str(event.event_id)
        assert working[-1].content == event.body.content  # type: ignore[attr-defined]
        assert all(t.role in {"user", "assistant"} for t in working[1:])
    assert any(b.prepended for b in bodies(derived))
    assert replica.agrees_with(memory)
    summary = replica.sessions["s"][0]
    assert summary.role == "summary"
    # extractive: every sentence of the summary was said
    assert set(split_sentences(summary.content)) <= set(sentences)
    # the summary covers exactly the turns before the verbatim ones
    first_verbatim = replica.sessions["s"][1].event_id
    position = [str(e.event_id) for e in events].index(first_verbatim)
    assert summary.event_id == str(events[position - 1].event_id)
    (state,) = memory.state().sessions
    assert state.compressed + len(state.turns) - 1 + state.dropped == len(texts)


def test_chinese_turns_are_compressed_by_their_cjk_token_count() -> None:
    log = Log()
    texts = ["我明天早上要去北京出差。", "帮我订一张高铁票。", "好的，已经订好了八点的车票。"]
    assert [estimate_tokens(t) for t in texts] == [12, 9, 14]
    memory, derived = fold([log.say("s", t) for t in texts], budgeted(30, summary_chars=16))
    last = bodies(derived)[-1]
    # 12 + 9 + 14 = 35 > 30: the verbatim turns must come under 22, so the two
    # oldest are summarised (in at most 16 characters) and the newest is kept
    assert (last.evicted, contents(last.prepended), last.tokens) == (2, [texts[0]], 12 + 14)
    assert Replica(budget=30).replay(derived)[-1] == [*last.prepended, *last.added]
    assert memory.state().sessions[0].compressed == 2


def test_latin_text_costs_a_quarter_of_cjk_against_the_budget() -> None:
    log = Log()
    latin = ["a" * 76, "b" * 4]  # 19 + 1 tokens
    _, derived = fold([log.say("s", t) for t in latin], budgeted(20))
    assert [b.evicted for b in bodies(derived)] == [0, 0]
    cjk = ["汉" * 19, "字"]  # 19 + 1 tokens too
    _, derived = fold([log.say("s", t) for t in cjk], budgeted(20))
    assert [b.evicted for b in bodies(derived)] == [0, 0]
    _, derived = fold([log.say("s", t) for t in ["汉" * 20, "字"]], budgeted(20))
    assert bodies(derived)[-1].evicted == 1, "21 tokens do not fit in 20"


def test_a_turn_larger_than_the_budget_is_kept_whole_and_alone() -> None:
    """The rule: the newest turn is never compressed or cut. Alone over the budget,
    it evicts everything older and stays whole; once a newer turn arrives it is
    compressed like any older turn (or, if even its summary does not fit, evicted)."""
    log = Log()
    big = "This is one very long sentence that goes on and on about the weather in Lyon now"
    assert estimate_tokens(big) == 20
    events = [log.say("s", "hi"), log.say("s", "ok"), log.say("s", big), log.say("s", "fine")]
    memory, derived = fold(events, budgeted(10, summary_chars=20))
    seen = bodies(derived)
    assert [(b.evicted, contents(b.prepended), b.size, b.tokens) for b in seen[2:]] == [
        (2, [], 1, 20),  # over the budget, alone, whole
        (1, ["This is one very…"], 2, 5 + 1),  # then summarised into 20 characters
    ]
    replica = Replica(budget=10)
    after = replica.replay(derived)
    assert contents(after[2]) == [big]
    assert replica.agrees_with(memory)
    (state,) = memory.state().sessions
    assert (state.dropped, state.compressed) == (2, 1)


def test_last_resort_evicts_what_cannot_be_compressed_into_the_budget() -> None:
    log = Log()
    big = "This is one very long sentence that goes on and on about the weather in Lyon now"
    events = [log.say("s", "hi"), log.say("s", big), log.say("s", "fine")]
    memory, derived = fold(events, budgeted(20, summary_chars=400))
    last = bodies(derived)[-1]
    # "hi" + big = 21 > 20, so "hi" was evicted; then big's summary is big itself
    # (one sentence), 20 + 1 > 20: nothing but the newest turn can stay
    assert (last.evicted, last.prepended, contents(last.added), last.size) == (1, [], ["fine"], 1)
    assert contents(Replica(budget=20).replay(derived)[-1]) == ["fine"]
    (state,) = memory.state().sessions
    assert (state.dropped, state.compressed) == (2, 0)


def test_the_turn_cap_applies_before_the_budget() -> None:
    log = Log()
    texts = ["one two three four", "five six seven", "eight nine ten", "eleven twelve"]
    _, derived = fold([log.say("s", t) for t in texts], budgeted(1000, turns=2))
    assert [b.evicted for b in bodies(derived)] == [0, 0, 1, 1]
    assert not any(b.prepended for b in bodies(derived))
    assert contents(Replica(limit=2).replay(derived)[-1]) == texts[2:]


# -- offloaded tool results ---------------------------------------------------------------


def test_a_large_tool_result_is_offloaded_with_its_source_event() -> None:
    log = Log()
    full = "The forecast for Shanghai is sunny. Highs of 25°C. " + "hourly data " * 400
    result = log.result("s", "weather", full)
    memory, derived = fold([log.call("s", "weather", "{}"), result])
    (turn,) = bodies(derived)[-1].added
    marker = f"[offloaded: {len(full)} chars, event {result.event_id}]"
    assert turn.offloaded is True
    assert turn.event_id == str(result.event_id)
    assert turn.content == f"The forecast for Shanghai is sunny. Highs of 25°C.… {marker}"
    assert estimate_tokens(turn.content) <= 50 + estimate_tokens(f"… {marker}")
    assert turn.tokens == estimate_tokens(turn.content) < estimate_tokens(full) // 20
    assert result.body.content == full, "history keeps the full text"
    assert memory.state().sessions[0].turns[-1] == turn


def test_offloading_keeps_the_head_of_text_without_sentences() -> None:
    log = Log()
    blob = '{"rows": [' + ", ".join(f'{{"id": {i}}}' for i in range(500)) + "]}"
    result = log.result("s", "sql", blob)
    _, derived = fold([result], MemoryConfig(working=WorkingParams(offload_head_tokens=5)))
    (turn,) = bodies(derived)[0].added
    # the longest start worth 5 estimated tokens: 20 characters
    assert turn.content == (
        f'{{"rows": [{{"id": 0}},… [offloaded: {len(blob)} chars, event {result.event_id}]'
    )


def test_a_chinese_tool_result_keeps_its_first_sentences() -> None:
    log = Log()
    full = "上海今天晴。气温二十五度。" + "逐小时数据" * 1000
    result = log.result("s", "weather", full)
    _, derived = fold([result], MemoryConfig(working=WorkingParams(offload_head_tokens=20)))
    (turn,) = bodies(derived)[0].added
    assert turn.offloaded
    # the two sentences are 13 tokens; with the third they would be over 20
    assert turn.content.startswith("上海今天晴。气温二十五度。…")
    assert estimate_tokens(turn.content) < 40


def test_only_tool_results_longer_than_the_threshold_are_offloaded() -> None:
    log = Log()
    config = MemoryConfig(working=WorkingParams(offload_chars=10, token_budget=10_000))
    events = [
        log.result("s", "a", "x" * 10),  # at the threshold: kept
        log.result("s", "b", "y" * 11),  # above: offloaded
        log.say("s", "z" * 50),  # a long message is not a tool result
        log.call("s", "c", "w" * 50),  # nor is a long call
    ]
    _, derived = fold(events, config)
    turns = Replica().replay(derived)[-1]
    assert [t.offloaded for t in turns] == [False, True, False, False]
    assert turns[0].content == "x" * 10
    assert turns[1].content == f"yyyyyyyyyyy… [offloaded: 11 chars, event {events[1].event_id}]"


def test_an_offloaded_result_counts_its_short_form_against_the_budget() -> None:
    log = Log()
    events = [log.say("s", "查一下数据库"), log.result("s", "sql", "行" * 5000)]
    _, derived = fold(events, budgeted(100))
    last = bodies(derived)[-1]
    assert (last.evicted, last.prepended) == (0, [])
    assert last.tokens == 6 + last.added[0].tokens < 100


# -- idle TTL -------------------------------------------------------------------------------

HOUR = 3600.0


def test_the_next_event_after_the_idle_ttl_clears_then_starts_afresh() -> None:
    log = Log()
    events = [log.start("s", "旧任务"), log.say("s", "a"), log.say("s", "b")]
    log.wait(2 * HOUR)
    events.append(log.say("s", "c"))
    memory, derived = fold(events)
    last = bodies(derived)[-1]
    assert (contents(last.added), last.evicted, last.cleared, last.size, last.task) == (
        ["c"],
        2,
        True,
        1,
        None,
    )
    replica = Replica()
    assert contents(replica.replay(derived)[-1]) == ["c"]
    assert replica.agrees_with(memory)
    (state,) = memory.state().sessions
    assert (contents(state.turns), state.task) == (["c"], None)
    assert state.last_at == events[-1].occurred_at


def test_activity_within_the_ttl_keeps_the_session() -> None:
    log = Log()
    events = [log.say("s", "a")]
    log.wait(2 * HOUR - 1)  # the next event is exactly 2 h later: not older than the TTL
    events.append(log.say("s", "b"))
    log.wait(2 * HOUR - 1)
    events.append(log.say("other", "elsewhere"))  # another session's event does not clear s
    _, derived = fold(events)
    assert not any(b.cleared for b in bodies(derived))
    assert contents(Replica().replay(derived)[1]) == ["a", "b"]


def test_a_start_after_the_ttl_resets_the_task_and_other_events_close() -> None:
    log = Log()
    events = [log.start("s", "old"), log.say("s", "x"), log.say("t", "y")]
    log.wait(3 * HOUR)
    events += [log.start("s", "new"), log.fact("t")]
    memory, derived = fold(events)
    start, fact = bodies(derived)[-2:]
    assert (start.evicted, start.cleared, start.size, start.task) == (1, True, 0, "new")
    assert (fact.evicted, fact.cleared, fact.size, fact.task) == (1, True, 0, None)
    assert [(s.session_id, s.task, s.turns) for s in memory.state().sessions] == [("s", "new", [])]
    replica = Replica()
    replica.replay(derived)
    assert replica.sessions == {}
    assert replica.agrees_with(memory)


def test_a_tick_clears_every_idle_session_of_the_agent() -> None:
    log = Log()
    events: list[Event] = [log.say("a", "1"), log.say("c", "2"), log.start("b", "task")]
    log.wait(HOUR)
    events.append(log.say("b", "3"))
    log.wait(HOUR + 5)
    events.append(log.tick())
    memory, derived = fold(events, MemoryConfig(working=WorkingParams(idle_ttl_s=2 * HOUR)))
    tick = derived[-1]
    assert isinstance(tick, WorkingUpdated)
    assert tick.session_id is None
    assert tick.source_event_id == events[-1].event_id
    assert tick.body == WorkingBody(size=0, tokens=0, cleared=True, expired=["a", "c"])
    replica = Replica()
    replica.replay(derived)
    assert set(replica.sessions) == {"b"}
    assert replica.agrees_with(memory)
    assert [s.session_id for s in memory.state().sessions] == ["b"]


def test_past_the_session_cap_the_least_recently_active_session_is_cleared() -> None:
    log = Log()
    events: list[Event] = [log.say("a", "1"), log.say("b", "2"), log.say("c", "3")]
    log.wait(60)
    events.append(log.say("a", "4"))  # "a" is active again: "b" is now the oldest
    events.append(log.say("d", "5"))  # a fourth session, over a cap of three
    memory, derived = fold(events, MemoryConfig(working=WorkingParams(max_sessions=3)))
    own, crowded = derived[-2:]
    assert isinstance(own, WorkingUpdated) and isinstance(crowded, WorkingUpdated)
    assert (own.session_id, contents(own.body.added)) == ("d", ["5"])
    assert crowded.session_id is None
    assert crowded.source_event_id == events[-1].event_id
    assert crowded.body == WorkingBody(size=0, tokens=0, cleared=True, expired=["b"])
    assert [s.session_id for s in memory.state().sessions] == ["a", "c", "d"]
    replica = Replica()
    replica.replay(derived)
    assert set(replica.sessions) == {"a", "c", "d"}
    assert replica.agrees_with(memory)


def test_a_smaller_session_cap_clears_several_at_once() -> None:
    log = Log()
    events: list[Event] = [log.say(s, s) for s in ("a", "b", "c", "d")]
    memory = AgentMemory.empty("agent", MemoryConfig())
    for event in events:
        memory.apply(event)
    state = memory.state()  # four open sessions, restored under a cap of two
    smaller = MemoryConfig(working=WorkingParams(max_sessions=2))
    restored = AgentMemory(state, smaller)
    derived = restored.apply(log.say("e", "e")).derived
    assert isinstance(derived[-1], WorkingUpdated)
    assert derived[-1].body.expired == ["a", "b", "c"]
    assert [s.session_id for s in restored.state().sessions] == ["d", "e"]


def test_under_the_session_cap_nothing_is_crowded_out() -> None:
    log = Log()
    events: list[Event] = [log.say("a", "1"), log.say("b", "2")]
    memory, derived = fold(events, MemoryConfig(working=WorkingParams(max_sessions=2)))
    assert all(d.session_id is not None for d in derived)
    assert [s.session_id for s in memory.state().sessions] == ["a", "b"]


def test_a_tick_with_nothing_idle_changes_nothing() -> None:
    log = Log()
    events: list[Event] = [log.say("a", "1")]
    log.wait(2 * HOUR - 1)
    events.append(log.tick())  # exactly the TTL after the last activity
    memory, derived = fold(events)
    assert len(derived) == 1
    assert [s.session_id for s in memory.state().sessions] == ["a"]


def test_an_ended_session_after_the_ttl_is_cleared_once() -> None:
    log = Log()
    events = [log.say("s", "1"), log.say("s", "2")]
    log.wait(5 * HOUR)
    events.append(log.end("s"))
    memory, derived = fold(events)
    assert bodies(derived)[-1] == WorkingBody(evicted=2, size=0, tokens=0, cleared=True)
    assert memory.state().sessions == []


def test_compressed_and_offloaded_state_round_trips() -> None:
    log = Log()
    params = WorkingParams(token_budget=40, summary_chars=40, offload_chars=30)
    working = WorkingMemory([], limit=5, params=params)
    events = [
        log.say("s", "Please summarise the sales figures for March."),
        log.result("s", "sql", "March sales were 1200 units. " * 5),
        log.say("s", "And what about April compared to March?"),
        log.say("s", "April was better by ten percent."),
    ]
    for event in events:
        working.apply(event)
    (state,) = working.state()
    assert state.turns[0].role == "summary"
    assert state.compressed >= 1
    restored = WorkingMemory(working.state(), limit=5, params=params)
    assert restored.state() == working.state()
    for event in [log.say("s", "Thanks, put it in the report."), log.tick()]:
        assert restored.apply(event) == working.apply(event)
    assert restored.state() == working.state()


# -- working.set: task, variables, scratchpad ----------------------------------------


def test_working_set_changes_only_what_it_gives() -> None:
    log = Log()
    events: list[Event] = [
        log.start("s", task="plan the Kyoto trip"),
        log.set("s", variables={"city": "Kyoto", "budget": "3000"}),
        log.set("s", scratchpad="ryokan shortlist: 1. Gion 2. 祇園白川"),
        log.set("s", task="book the ryokan", variables={"budget": None, "语言": "中文"}),
    ]
    memory, derived = fold(events)
    last = bodies(derived)[-1]
    assert last.task == "book the ryokan"
    assert last.variables == {"city": "Kyoto", "语言": "中文"}
    assert last.scratchpad == "ryokan shortlist: 1. Gion 2. 祇園白川"
    (state,) = memory.state().sessions
    assert (state.task, state.variables, state.scratchpad) == (
        last.task,
        last.variables,
        last.scratchpad,
    )
    assert [b.variables for b in bodies(derived)][1] == {"city": "Kyoto", "budget": "3000"}


def test_working_set_clears_with_empty_text_and_keeps_turns() -> None:
    log = Log()
    events: list[Event] = [
        log.say("s", "hello"),
        log.set("s", task="draft", scratchpad="notes"),
        log.set("s", task="", scratchpad=""),
    ]
    _, derived = fold(events)
    last = bodies(derived)[-1]
    assert (last.task, last.scratchpad) == (None, None)
    assert (last.added, last.evicted, last.size) == ([], 0, 1)  # turns untouched


def test_a_large_scratchpad_keeps_its_head_and_where_the_rest_is() -> None:
    log = Log()
    pad = "First the ryokan. " + "Then the temples, one by one. " * 200
    event = log.set("s", scratchpad=pad)
    config = MemoryConfig(working=WorkingParams(offload_chars=500))
    _, derived = fold([event], config)
    kept = bodies(derived)[0].scratchpad
    assert kept is not None and len(kept) < 500
    assert kept.startswith("First the ryokan.")
    assert kept.endswith(f"[offloaded: {len(pad)} chars, event {event.event_id}]")


def test_working_set_is_cleared_with_the_session() -> None:
    log = Log()
    events: list[Event] = [
        log.set("s", task="t", variables={"k": "v"}, scratchpad="p"),
        log.end("s"),
        log.say("s", "a new start"),
    ]
    memory, derived = fold(events)
    ended, fresh = bodies(derived)[1:]
    assert ended.cleared
    assert (fresh.task, fresh.variables, fresh.scratchpad) == (None, {}, None)
    (state,) = memory.state().sessions
    assert (state.task, state.variables, state.scratchpad) == (None, {}, None)


def test_working_set_survives_a_state_round_trip() -> None:
    log = Log()
    memory, _ = fold([log.set("s", variables={"a": "1"}, scratchpad="pad")])
    resumed = AgentMemory(
        type(memory.state()).model_validate_json(memory.state().model_dump_json()), MemoryConfig()
    )
    (derived,) = [d for d in resumed.apply(log.set("s", variables={"b": "2"})).derived]
    assert isinstance(derived, WorkingUpdated)
    assert (derived.body.variables, derived.body.scratchpad) == ({"a": "1", "b": "2"}, "pad")


def test_working_set_needs_a_session() -> None:
    with pytest.raises(ValueError, match=r"working\.set needs a session_id"):
        WorkingSet(event_id=UUID(int=1), agent_id=AGENT, occurred_at=T0, body={"task": "t"})
    sent = {
        "event_id": str(UUID(int=2)),
        "type": "working.set",
        "agent_id": AGENT,
        "occurred_at": T0.isoformat(),
        "body": {"scratchpad": "notes"},
    }
    with pytest.raises(BadEvent, match=r"working\.set needs a session_id"):
        Codec().decode(json.dumps(sent).encode())


def test_working_set_makes_no_long_term_change() -> None:
    log = Log()
    memory = AgentMemory.empty(AGENT, MemoryConfig())
    step = memory.apply(log.set("s", task="t", scratchpad="x" * 5000))
    assert [d.type for d in step.derived] == ["working.updated"]


def test_every_event_type_is_a_leaf() -> None:
    """The fold tells events apart by ``type(event) is T`` (processors.working,
    processors.episodes), which is ``isinstance`` only while no event type has a
    subclass: an event of a subclass would be taken for no event at all."""
    from schemas.codec import ALL_TYPES

    assert [t for t in ALL_TYPES if t.__subclasses__()] == []
    assert len(set(ALL_TYPES)) == len(ALL_TYPES)
