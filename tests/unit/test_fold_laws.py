"""Laws of the fold that make replay and time travel exact: dedupe, sequence,
deterministic derived ids, replay equality, redelivery, resume from a snapshot."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from uuid import UUID, uuid5

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from processors import AgentMemory, AgentState, MemoryConfig, as_of, evolve
from processors.episodes import memory_id_of
from processors.ids import ENGRAM_NAMESPACE, derived_id
from processors.state import WorkingParams
from processors.summary import summarise
from processors.working import estimate_tokens, offload
from schemas import (
    ClockTicked,
    DerivedEvent,
    Event,
    FactAsserted,
    FactRetracted,
    FeedbackGiven,
    InteractionRecorded,
    MemoryRecalled,
    PersonaUpdated,
    SessionEnded,
    SessionStarted,
    ToolCalled,
    ToolResult,
    Turn,
    WorkingSet,
    WorkingUpdated,
)

AGENT = "agent-law"
T0 = datetime(2024, 1, 1, tzinfo=UTC)
LAWS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def say(i: int, session: str | None = "s", text: str = "hi", at: datetime | None = None) -> Event:
    return InteractionRecorded(
        event_id=UUID(int=i),
        agent_id=AGENT,
        session_id=session,
        occurred_at=at or T0 + timedelta(seconds=i),
        body={"role": "user", "content": text},
    )


def run(events: Sequence[Event], config: MemoryConfig | None = None) -> tuple[list[str], str]:
    """Fold from empty: the derived events as JSON, and the final state as JSON."""
    memory = AgentMemory.empty(AGENT, config or MemoryConfig())
    derived = [d.model_dump_json() for e in events for d in memory.apply(e).derived]
    return derived, memory.state().model_dump_json()


# -- dedupe and sequence --------------------------------------------------------------


def test_seqs_count_accepted_events_in_log_order() -> None:
    memory = AgentMemory.empty(AGENT, MemoryConfig())
    steps = [memory.apply(say(i)) for i in (5, 3, 9, 1)]
    assert [s.seq for s in steps] == [0, 1, 2, 3]
    assert [d.seq for s in steps for d in s.derived] == [0, 1, 2, 3]
    assert memory.state().seq == 3


def test_duplicates_do_nothing_and_keep_the_sequence() -> None:
    memory = AgentMemory.empty(AGENT, MemoryConfig())
    first = memory.apply(say(1, text="original"))
    before = memory.state()
    again = memory.apply(say(1, text="a different payload, same id"))
    assert (again.seq, again.derived) == (None, ())
    assert memory.state() == before
    assert memory.apply(say(2)).seq == (first.seq or 0) + 1


def test_duplicates_beyond_the_window_are_accepted_again() -> None:
    """Documented bound: an id is remembered for the last ``dedupe_window`` accepted ids."""
    memory = AgentMemory.empty(AGENT, MemoryConfig(dedupe_window=3))
    assert [memory.apply(say(i)).seq for i in (1, 2, 3)] == [0, 1, 2]
    assert memory.apply(say(1)).seq is None  # 1 is still among the last three
    assert memory.apply(say(4)).seq == 3  # window now 2, 3, 4
    assert memory.apply(say(1)).seq == 4  # forgotten, so accepted again
    assert memory.apply(say(2)).seq == 5
    assert memory.apply(say(4)).seq is None  # window is 4, 1, 2
    assert memory.state().recent() == [UUID(int=i).bytes for i in (4, 1, 2)]


def test_the_window_survives_a_snapshot() -> None:
    config = MemoryConfig(dedupe_window=2)
    memory = AgentMemory.empty(AGENT, config)
    for i in (1, 2, 3):
        memory.apply(say(i))
    restored = AgentMemory(AgentState.model_validate_json(memory.state().model_dump_json()), config)
    assert restored.apply(say(3)).seq is None
    assert restored.apply(say(1)).seq == 3
    assert restored.apply(say(2)).seq == 4


# -- derived ids and config version ------------------------------------------------------


def test_derived_ids_are_uuid5_of_the_source() -> None:
    source = UUID("3b8f2a1e-6c4d-4e7f-9a0b-1c2d3e4f5a6b")
    # pinned: a change here changes every derived id and every Qdrant point id
    assert UUID("8f7d6b9e-3c1a-5e2f-9b4d-2a6c8e0f1b3d") == ENGRAM_NAMESPACE
    assert derived_id(source, 0) == UUID("d41278ae-4d22-54bc-828e-df3593eca4cb")
    assert derived_id(UUID(int=1), 0) == UUID("c4879a59-c4ca-569e-85de-9b5fbadf0e3e")
    assert derived_id(source, 0) == uuid5(ENGRAM_NAMESPACE, f"{source}:0")
    assert derived_id(source, 0).version == 5
    assert len({derived_id(source, i) for i in range(50)}) == 50


def test_derived_events_carry_source_seq_idx_and_config() -> None:
    config = MemoryConfig()
    memory = AgentMemory.empty(AGENT, config)
    memory.apply(say(7))
    (update,) = memory.apply(say(8, session="s", text="第二句")).derived
    assert isinstance(update, WorkingUpdated)
    assert update.event_id == derived_id(UUID(int=8), 0)
    assert update.source_event_id == UUID(int=8)
    assert (update.seq, update.idx) == (1, 0)
    assert update.config_version == MemoryConfig().version == config.version


def test_config_version_names_every_parameter() -> None:
    base = MemoryConfig()
    assert re.fullmatch(r"default@[0-9a-f]{10}", base.version)
    assert MemoryConfig().version == base.version
    variants = [
        MemoryConfig(working_turns=base.working_turns + 1),
        MemoryConfig(dedupe_window=base.dedupe_window + 1),
        MemoryConfig(name="experiment"),
        MemoryConfig(working=WorkingParams(token_budget=base.working.token_budget + 1)),
        MemoryConfig(working=WorkingParams(offload_chars=base.working.offload_chars + 1)),
        MemoryConfig(working=WorkingParams(idle_ttl_s=base.working.idle_ttl_s + 1)),
    ]
    versions = {base.version} | {v.version for v in variants}
    assert len(versions) == 7
    assert MemoryConfig(name="experiment").version.startswith("experiment@")


def test_a_config_change_changes_the_derived_log() -> None:
    log = [say(i) for i in range(1, 4)]
    old, _ = run(log, MemoryConfig())
    new, _ = run(log, MemoryConfig(working_turns=7))
    assert old != new
    assert all(MemoryConfig(working_turns=7).version in d for d in new)


# -- generated logs ------------------------------------------------------------------------

TEXTS = st.one_of(
    st.sampled_from(
        [
            "hello",
            "please remember my flight",
            "我喜欢绿茶",
            "明天下午三点开会",
            "ok 好的",
            "",
            "My flight to Lisbon leaves at nine. Please book a taxi for seven tomorrow.",
            "我们明天下午三点开会。请把项目预算和时间表发给我。",
        ]
    ),
    st.text(max_size=12),
    st.text(st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), max_size=8),
)
SESSIONS = st.sampled_from(["s1", "s2", "会话3"])
VARIABLES = st.sampled_from(["city", "step", "变量"])
ZONES = st.sampled_from([UTC, timezone(timedelta(hours=8)), timezone(timedelta(hours=-5))])


@st.composite
def agent_logs(draw: st.DrawFn, max_size: int = 30) -> list[Event]:
    """One agent's log in event-time order, with exact duplicates injected."""
    kinds = [
        "start", "end", "say", "say", "say", "call", "result", "fact", "tick", "dup",
        "retract", "persona", "recall", "feedback", "moment", "set",
    ]  # fmt: skip
    events: list[Event] = []
    at = T0
    for i in range(draw(st.integers(0, max_size))):
        kind = draw(st.sampled_from(kinds))
        if kind == "dup":
            if events:
                events.append(draw(st.sampled_from(events)))
            continue
        at += timedelta(milliseconds=draw(st.integers(0, 90_000_000)))
        env: dict[str, Any] = {
            "event_id": draw(st.uuids()),
            "agent_id": AGENT,
            "session_id": draw(SESSIONS),
            "occurred_at": at.astimezone(draw(ZONES)),
        }
        match kind:
            case "start":
                task = draw(st.none() | TEXTS)
                events.append(SessionStarted(**env, body={"task": task}))
            case "end":
                events.append(SessionEnded(**env))
            case "set":
                body = {
                    "task": draw(st.none() | TEXTS),
                    "variables": draw(st.dictionaries(VARIABLES, st.none() | TEXTS, max_size=3)),
                    "scratchpad": draw(st.none() | TEXTS),
                }
                events.append(WorkingSet(**env, body=body))
            case "say":
                env["session_id"] = draw(st.none() | SESSIONS)
                role = draw(st.sampled_from(["user", "assistant", "system", "tool"]))
                events.append(
                    InteractionRecorded(**env, body={"role": role, "content": draw(TEXTS)})
                )
            case "call":
                body = {"call_id": f"c{i}", "tool": "search", "arguments": draw(TEXTS)}
                events.append(ToolCalled(**env, body=body))
            case "result":
                body = {"call_id": f"c{i}", "tool": "search", "content": draw(TEXTS)}
                events.append(ToolResult(**env, body=body))
            case "fact":
                env["session_id"] = draw(st.none() | SESSIONS)
                body = {"namespace": "n", "key": "k", "value": draw(TEXTS)}
                events.append(FactAsserted(**env, body=body))
            case "tick":
                env["session_id"] = None
                events.append(ClockTicked(**env, body={"partition": 0, "interval_s": 60.0}))
            case "retract":
                events.append(FactRetracted(**env, body={"namespace": "n", "key": "k"}))
            case "persona":
                body = {"style": draw(st.none() | TEXTS), "preferences": {"lang": draw(TEXTS)}}
                events.append(PersonaUpdated(**env, body=body))
            case "moment":  # agent-supplied scores: flashbulbs and single-turn memories
                body = {
                    "role": "user",
                    "content": draw(TEXTS),
                    "importance": draw(st.floats(1, 10)),
                    "sentiment": draw(st.floats(-1, 1)),
                }
                events.append(InteractionRecorded(**env, body=body))
            case "recall" | "feedback":
                said = [e for e in events if isinstance(e, InteractionRecorded)]
                ids = [
                    memory_id_of(kind, e.agent_id, str(e.event_id))
                    for e in said
                    for kind in ("episode", "turn")
                ]
                target = draw(st.sampled_from(ids)) if ids else "none"
                if kind == "recall":
                    body = {"query": "q", "memory_ids": [target], "scores": [0.5]}
                    events.append(MemoryRecalled(**env, body=body))
                else:
                    body = {"memory_id": target, "useful": draw(st.booleans())}
                    events.append(FeedbackGiven(**env, body=body))
    return events


# small budgets, thresholds and TTLs, so that compression, offloading and idle
# expiry all happen in logs of a few short turns an hour or so apart
working_params = st.builds(
    WorkingParams,
    token_budget=st.integers(1, 40),
    compress_to=st.sampled_from([0.25, 0.75, 1.0]),
    summary_chars=st.integers(16, 40),
    offload_chars=st.integers(1, 16),
    offload_head_tokens=st.integers(1, 4),
    idle_ttl_s=st.sampled_from([3_600.0, 7_200.0, 86_400.0]),
    max_sessions=st.sampled_from([1, 2, 256]),
)
configs = st.builds(MemoryConfig, working_turns=st.integers(1, 4), working=working_params)


def test_generated_logs_are_interesting() -> None:
    """Guard against a generator that silently stops producing what the laws need."""
    seen: set[str] = set()
    derived: set[str] = set()
    dup_seen = False

    @settings(max_examples=100, deadline=None, database=None, derandomize=True)
    @given(agent_logs())
    def look(log: list[Event]) -> None:
        nonlocal dup_seen
        seen.update(e.type for e in log)
        dup_seen = dup_seen or len({e.event_id for e in log}) < len(log)
        memory = AgentMemory.empty(AGENT, MemoryConfig())
        derived.update(d.type for e in log for d in memory.apply(e).derived)

    look()
    assert {"session.started", "session.ended", "interaction.recorded", "tool.called"} <= seen
    assert {"tool.result", "fact.asserted", "clock.tick", "working.set"} <= seen
    assert dup_seen
    # recalls and feedback name memories the fold made (their ids are derived as it does)
    assert "memory.reinforced" in derived, derived


def test_generated_working_memory_is_interesting() -> None:
    """The generated logs and configs reach every path of working memory."""
    paths: set[str] = set()

    @settings(max_examples=500, deadline=None, database=None, derandomize=True)
    @given(agent_logs(), configs)
    def look(log: list[Event], config: MemoryConfig) -> None:
        memory = AgentMemory.empty(AGENT, config)
        for event in log:
            for d in memory.apply(event).derived:
                if not isinstance(d, WorkingUpdated):
                    continue
                body = d.body
                checks = {
                    "compressed": bool(body.prepended),
                    "offloaded": any(t.offloaded for t in body.added),
                    "tick expiry": bool(body.expired),
                    "idle restart": body.cleared and bool(body.added),
                    "ended": body.cleared and isinstance(event, SessionEnded),
                    "over budget": body.tokens > config.working.token_budget,
                    "last resort": body.evicted > 0 and not body.prepended and body.size == 1,
                }
                paths.update(name for name, hit in checks.items() if hit)

    look()
    assert paths == {
        "compressed",
        "offloaded",
        "tick expiry",
        "idle restart",
        "ended",
        "over budget",
        "last resort",
    }


@LAWS
@given(log=agent_logs(), config=configs)
def test_replay_is_identical(log: list[Event], config: MemoryConfig) -> None:
    first = run(log, config)
    second = run(log, config)
    assert first == second
    rebuilt = [e.model_copy(deep=True) for e in log]
    assert run(rebuilt, config) == first


@LAWS
@given(log=agent_logs(), config=configs, data=st.data())
def test_redelivery_changes_nothing(
    log: list[Event], config: MemoryConfig, data: st.DataObject
) -> None:
    assume(log)
    i = data.draw(st.integers(0, len(log) - 1), label="duplicated")
    j = data.draw(st.integers(i + 1, len(log)), label="inserted at")
    redelivered = [*log[:j], log[i], *log[j:]]
    assert run(redelivered, config) == run(log, config)


@LAWS
@given(log=agent_logs(), config=configs)
def test_every_event_delivered_twice_changes_nothing(
    log: list[Event], config: MemoryConfig
) -> None:
    doubled = [e for event in log for e in (event, event)]
    assert run(doubled, config) == run(log, config)


@LAWS
@given(log=agent_logs(), config=configs, data=st.data())
def test_resume_from_a_snapshot(
    log: list[Event], config: MemoryConfig, data: st.DataObject
) -> None:
    k = data.draw(st.integers(0, len(log)), label="split")
    head = AgentMemory.empty(AGENT, config)
    derived = [d.model_dump_json() for e in log[:k] for d in head.apply(e).derived]
    snapshot = head.state().model_dump_json()
    tail = AgentMemory(AgentState.model_validate_json(snapshot), config)
    derived += [d.model_dump_json() for e in log[k:] for d in tail.apply(e).derived]
    assert (derived, tail.state().model_dump_json()) == run(log, config)


@LAWS
@given(log=agent_logs(), config=configs)
def test_evolve_agrees_with_apply(log: list[Event], config: MemoryConfig) -> None:
    memory = AgentMemory.empty(AGENT, config)
    state = AgentState(agent_id=AGENT)
    for event in log:
        step = memory.apply(event)
        state, derived = evolve(state, event, config)
        assert derived == step.derived
        assert state == memory.state()
        assert state.model_dump_json() == memory.state().model_dump_json()


@LAWS
@given(log=agent_logs(), config=configs)
def test_sequence_and_ids_over_a_log(log: list[Event], config: MemoryConfig) -> None:
    memory = AgentMemory.empty(AGENT, config)
    seqs: list[int] = []
    derived: list[DerivedEvent] = []
    for event in log:
        step = memory.apply(event)
        if step.seq is not None:
            seqs.append(step.seq)
        assert all(d.seq == step.seq for d in step.derived)
        assert all(d.event_id == derived_id(event.event_id, d.idx) for d in step.derived)
        derived.extend(step.derived)
    assert seqs == list(range(len({e.event_id for e in log})))
    assert len({d.event_id for d in derived}) == len(derived)
    assert all(d.config_version == config.version for d in derived)
    for d in derived:
        if not isinstance(d, WorkingUpdated):
            continue  # the other processors have tests of their own
        assert d.body.size <= config.working_turns
        assert len(d.body.added) <= 1
        assert len(d.body.prepended) <= 1
        assert d.body.evicted <= config.working_turns
        # within the budget, unless the newest turn alone is over it (a start or a
        # restart may follow it and still report it)
        assert d.body.tokens <= config.working.token_budget or d.body.size == 1


@LAWS
@given(log=agent_logs(), config=configs, data=st.data())
def test_as_of_is_the_fold_of_the_past(
    log: list[Event], config: MemoryConfig, data: st.DataObject
) -> None:
    assume(log)
    moment = data.draw(st.sampled_from(log)).occurred_at
    memory = AgentMemory.empty(AGENT, config)
    for event in log:
        if event.occurred_at <= moment:
            memory.apply(event)
    assert as_of(log, moment, AGENT, config) == memory.state()


Entry = tuple[str, str, str, bool]
"""(event id, role, content, offloaded) of one working-memory entry."""


def reference_turn(event: Event, params: WorkingParams) -> Entry | None:
    """The working-memory entry an event makes, if any."""
    match event:
        case InteractionRecorded(body=body):
            return str(event.event_id), body.role, body.content, False
        case ToolCalled(body=body):
            return str(event.event_id), "tool_call", f"{body.tool}({body.arguments})", False
        case ToolResult(body=body) if len(body.content) > params.offload_chars:
            short = offload(body.content, str(event.event_id), params.offload_head_tokens)
            return str(event.event_id), "tool", short, True
        case ToolResult(body=body):
            return str(event.event_id), "tool", body.content, False
    return None


def reference_set(session: dict[str, Any], event: WorkingSet, params: WorkingParams) -> None:
    """``working.set`` as its body documents it: only what is given changes."""
    body = event.body
    if body.task is not None:
        session["task"] = body.task if body.task else None
    for key, value in body.variables.items():
        if value is None:
            session["vars"].pop(key, None)
        else:
            session["vars"][key] = value
    if body.scratchpad is not None:
        pad = body.scratchpad
        if len(pad) > params.offload_chars:
            pad = offload(pad, str(event.event_id), params.offload_head_tokens)
        session["pad"] = pad if pad else None


def cost(entries: Sequence[Entry]) -> int:
    return sum(estimate_tokens(content) for _, _, content, _ in entries)


def reference_fit(
    turns: list[Entry], config: MemoryConfig
) -> tuple[list[Entry], list[Entry], int, int]:
    """Turns within the budget, by brute force: the first prefix of k entries (never
    the newest) that leaves the verbatim rest under ``compress_to`` of the budget (or
    is all but the newest) and whose summary fits with the rest; else the newest
    alone. Returns the turns, the summary made ([] or [it]), k, and how many of the
    k were turns (not an earlier summary): summarised, or dropped if no summary."""
    params = config.working
    budget = params.token_budget
    if cost(turns) <= budget or len(turns) < 2:
        return turns, [], 0, 0
    raw = [sum(role != "summary" for _, role, _, _ in turns[:k]) for k in range(len(turns))]
    if estimate_tokens(turns[-1][2]) <= budget:
        goal = math.floor(budget * params.compress_to)
        for k in range(1, len(turns)):
            rest = turns[k:]
            if cost(rest) > goal and k < len(turns) - 1:
                continue
            text = summarise([(r, c) for _, r, c, _ in turns[:k]], max_chars=params.summary_chars)
            if estimate_tokens(text) + cost(rest) > budget:
                continue
            if not text:
                return rest, [], k, raw[k]
            summary = (turns[k - 1][0], "summary", text, False)
            return [summary, *rest], [summary], k, raw[k]
    k = len(turns) - 1
    return turns[k:], [], k, raw[k]


@LAWS
@given(log=agent_logs(), config=configs)
def test_working_memory_matches_a_reference_model(log: list[Event], config: MemoryConfig) -> None:
    """A deliberately naive re-statement of L1 working memory (turn cap, budget by
    compression, offloading, idle TTL at the session's next event or a tick, the cap
    on open sessions),
    compared delta by delta; the deltas, folded by the rule of ``WorkingBody``, must
    rebuild the reference's turns, and the processor's own, after each one."""
    params = config.working
    ttl = timedelta(seconds=params.idle_ttl_s)
    sessions: dict[str, dict[str, Any]] = {}
    expected: list[tuple[Any, ...]] = []
    seen: set[UUID] = set()

    def fresh(at: datetime) -> dict[str, Any]:
        return {
            "turns": [],
            "task": None,
            "vars": {},
            "pad": None,
            "dropped": 0,
            "compressed": 0,
            "last": at,
        }

    for event in log:
        sid, at = event.session_id, event.occurred_at
        if event.event_id in seen:
            continue
        seen.add(event.event_id)
        if isinstance(event, ClockTicked):
            idle = sorted(s for s, session in sessions.items() if at - session["last"] > ttl)
            for s in idle:
                del sessions[s]
            if idle:
                expected.append((None, [], [], 0, 0, 0, None, {}, None, True, idle, []))
            continue
        if sid is None:
            continue
        if isinstance(event, SessionEnded):
            ended = sessions.pop(sid, None)
            if ended is not None:
                held = len(ended["turns"])
                gone = (ended["task"], ended["vars"], ended["pad"])
                expected.append((sid, [], [], held, 0, 0, *gone, True, [], []))
            continue
        stale = sid in sessions and at - sessions[sid]["last"] > ttl
        cleared_held: tuple[Any, ...] = (None, {}, None)
        held = 0
        if stale:
            cleared = sessions.pop(sid)
            cleared_held = (cleared["task"], cleared["vars"], cleared["pad"])
            held = len(cleared["turns"])
        added: list[Entry] = []
        summary: list[Entry] = []
        evicted = 0
        if isinstance(event, SessionStarted):
            session = sessions.setdefault(sid, fresh(at))
            session["task"] = event.body.task
            session["last"] = max(session["last"], at)
        elif isinstance(event, WorkingSet):
            session = sessions.setdefault(sid, fresh(at))
            reference_set(session, event, params)
            session["last"] = max(session["last"], at)
        elif (turn := reference_turn(event, params)) is not None:
            session = sessions.setdefault(sid, fresh(at))
            session["last"] = max(session["last"], at)
            turns = [*session["turns"], turn]
            added = [turn]
            if len(turns) > config.working_turns:
                turns = turns[1:]
                session["dropped"] += 1
                evicted = 1
            turns, summary, k, folded = reference_fit(turns, config)
            evicted += k
            session["compressed" if summary else "dropped"] += folded
            session["turns"] = turns
        elif stale:
            expected.append((sid, [], [], held, 0, 0, *cleared_held, True, [], []))
            continue
        else:
            continue
        turns = list(session["turns"])
        row = [sid, summary, added, evicted, len(turns), cost(turns), session["task"]]
        row += [dict(session["vars"]), session["pad"]]
        if stale:
            row[3] = held
        expected.append((*row, stale, [], turns))
        over = len(sessions) - params.max_sessions
        if over > 0:  # the least recently active others leave, as a tick's delta
            oldest = sorted((other["last"], s) for s, other in sessions.items() if s != sid)
            crowd = sorted(s for _, s in oldest[:over])
            for s in crowd:
                del sessions[s]
            expected.append((None, [], [], 0, 0, 0, None, {}, None, True, crowd, []))

    memory = AgentMemory.empty(AGENT, config)
    rebuilt: dict[str | None, list[Turn]] = {}
    actual = []
    for event in log:
        for d in memory.apply(event).derived:
            if not isinstance(d, WorkingUpdated):
                continue
            body = d.body
            for t in [*body.prepended, *body.added]:
                assert t.tokens == estimate_tokens(t.content)
            for gone in body.expired:
                rebuilt.pop(gone, None)
            working: list[Turn] = []
            if d.session_id is not None:
                working = rebuilt.get(d.session_id, [])
                assert body.evicted <= len(working)
                working = body.prepended + working[body.evicted :] + body.added
                rebuilt[d.session_id] = working
            assert body.size == len(working)
            assert body.tokens == sum(t.tokens for t in working)

            def entries(turns: list[Turn]) -> list[Entry]:
                return [(t.event_id, t.role, t.content, t.offloaded) for t in turns]

            actual.append(
                (
                    d.session_id,
                    entries(body.prepended),
                    entries(body.added),
                    body.evicted,
                    body.size,
                    body.tokens,
                    body.task,
                    body.variables,
                    body.scratchpad,
                    body.cleared,
                    body.expired,
                    entries(working),
                )
            )
        held = {s.session_id: s.turns for s in memory.state().sessions if s.turns}
        assert held == {sid: turns for sid, turns in rebuilt.items() if turns}
    assert actual == expected
    final = {
        s.session_id: (
            [(t.event_id, t.role, t.content, t.offloaded) for t in s.turns],
            s.task,
            s.variables,
            s.scratchpad,
            s.dropped,
            s.compressed,
        )
        for s in memory.state().sessions
    }
    assert final == {
        sid: (
            session["turns"],
            session["task"],
            session["vars"],
            session["pad"],
            session["dropped"],
            session["compressed"],
        )
        for sid, session in sessions.items()
    }
