"""Rollback and fork in the fold (:mod:`processors.rebase`): laws that keep them exact.

* rolling back to a cut equals folding the log up to the cut, on every content field
  of the state, and the projections built from every derived event (the history's
  and the rollback's) equal those of the prefix alone;
* the sequence and the dedupe window go on; later events fold on top as on the prefix;
* a replay of the log with the rollback in it (:func:`fold_past`) is the worker's state;
* a fork is the source's prefix under new ids; same inputs, byte-identical outputs;
* to a moment, both restore what an as-of snapshot at that moment folds: an event
  logged before a late one but dated after the moment is left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from engram.history import sessions_from_deltas
from processors import AgentMemory, MemoryConfig
from processors.rebase import Past, RebaseRefused, fold_past, in_memory, undone_spans
from schemas import (
    DerivedEvent,
    Event,
    FactAsserted,
    FactSet,
    InteractionRecorded,
    MemoryCreated,
    MemoryForgotten,
    MemoryForked,
    MemoryPromoted,
    MemoryReinforced,
    MemoryRolledBack,
    MemoryWeakened,
    PersonaVersioned,
    WorkingUpdated,
)
from tests.unit.test_fold_laws import AGENT, agent_logs

LAWS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CONFIG = MemoryConfig.model_validate(
    {"episodes": {"max_turns": 3}, "consolidation": {"window_s": 3600.0, "min_episodes": 1}}
)
REQUEST = UUID(int=2**100)
FORK = "agent-fork"


class Worker:
    """Folds a log as the worker does: the archive keeps what was accepted, in order."""

    def __init__(self, agent_id: str = AGENT) -> None:
        self.memory = AgentMemory.empty(agent_id, CONFIG)
        self.archive: list[tuple[int, Event]] = []

    def feed(self, events: Sequence[Event]) -> Worker:
        for event in events:
            seq = self.memory.apply(event).seq
            if seq is not None:
                self.archive.append((seq, event))
        return self

    def past(self) -> Past:
        return Past(self.memory.agent_id, tuple(self.archive), len(self.archive) - 1)


def fold(events: Sequence[Event], agent_id: str = AGENT) -> tuple[AgentMemory, list[DerivedEvent]]:
    memory = AgentMemory.empty(agent_id, CONFIG)
    derived = [d for e in events for d in memory.apply(e).derived]
    return memory, derived


def rollback(to: Event, to_seq: int, event_id: UUID = REQUEST) -> MemoryRolledBack:
    return MemoryRolledBack(
        event_id=event_id,
        agent_id=AGENT,
        occurred_at=to.occurred_at + timedelta(days=3),
        body={"to": to.occurred_at, "to_seq": to_seq},
    )


def content(memory: AgentMemory) -> dict[str, Any]:
    return memory.state().model_dump(mode="json", exclude={"seq", "recent_ids"})


def project(derived: Sequence[DerivedEvent]) -> dict[str, Any]:
    """The projections of a derived log: live memories (with the payload the vector
    sink keeps), current facts, the persona."""
    memories: dict[str, dict[str, Any]] = {}
    facts: dict[tuple[str, str], str | None] = {}
    persona: Any = None
    for d in derived:
        match d:
            case MemoryCreated(body=b):
                memories[b.memory_id] = {
                    "live": True, "text": b.text, "strength": b.strength,
                    "reinforcements": 0, "invalidated": False, "promoted": b.layer == "L3",
                }  # fmt: skip
            case MemoryReinforced(body=b) | MemoryWeakened(body=b):
                memories[b.memory_id].update(
                    strength=b.strength, reinforcements=b.reinforcements, invalidated=b.invalidated
                )
            case MemoryPromoted(body=b):
                memories[b.memory_id]["promoted"] = True
            case MemoryForgotten(body=b):
                memories[b.memory_id]["live"] = False
            case FactSet(body=b):
                facts[(b.namespace, b.key)] = b.value
            case PersonaVersioned(body=b):
                doc = (b.name, b.description, b.style, b.preferences)
                persona = None if doc == (None, None, None, {}) else doc
    return {
        "memories": {k: v for k, v in memories.items() if v["live"]},
        "facts": {k: v for k, v in facts.items() if v is not None},
        "persona": persona,
    }


def working(derived: Sequence[DerivedEvent], types: dict[UUID, str]) -> list[Any]:
    """Working memory as the history road rebuilds it from the deltas."""
    rows = [
        (d.seq, d.idx, d.session_id, d.occurred_at, d.body.model_dump_json(),
         types.get(d.source_event_id, "memory.rolled_back"))
        for d in derived
        if isinstance(d, WorkingUpdated)
    ]  # fmt: skip
    sessions = sessions_from_deltas(rows, CONFIG.working_turns)
    return sorted(
        (s.session_id, [t.model_dump() for t in s.turns], s.task, s.variables, s.scratchpad)
        for s in sessions
    )


@st.composite
def cut_logs(draw: st.DrawFn) -> tuple[Worker, int]:
    worker = Worker().feed(draw(agent_logs(max_size=40)))
    assume(worker.archive)
    return worker, draw(st.integers(0, len(worker.archive) - 1))


@LAWS
@given(cut_logs())
def test_rolling_back_equals_folding_the_prefix(case: tuple[Worker, int]) -> None:
    worker, cut = case
    events = [e for _, e in worker.archive]
    _, full = fold(events)
    prefix, prefix_derived = fold(events[: cut + 1])
    seq_before = worker.memory.seq
    step = worker.memory.roll_back(rollback(events[cut], cut), worker.past())
    assert step.seq == seq_before + 1 == worker.memory.seq
    assert content(worker.memory) == content(prefix)
    assert project([*full, *step.derived]) == project(prefix_derived)
    types = {e.event_id: e.type for e in events}
    assert working([*full, *step.derived], types) == working(prefix_derived, types)


@LAWS
@given(cut_logs(), agent_logs(max_size=10))
def test_later_events_fold_on_top_as_on_the_prefix(
    case: tuple[Worker, int], later: list[Event]
) -> None:
    worker, cut = case
    events = [e for _, e in worker.archive]
    assume(not {e.event_id for e in later} & {e.event_id for e in events})
    worker.memory.roll_back(rollback(events[cut], cut), worker.past())
    prefix, _ = fold(events[: cut + 1])
    start = events[-1].occurred_at + timedelta(days=4)
    moved = [e.model_copy(update={"occurred_at": start + (e.occurred_at - later[0].occurred_at)})
             for e in later]  # fmt: skip
    for event in moved:
        worker.memory.apply(event)
        prefix.apply(event)
    assert content(worker.memory) == content(prefix)


@LAWS
@given(cut_logs())
def test_replaying_the_log_with_its_rollback_gives_the_workers_state(
    case: tuple[Worker, int],
) -> None:
    worker, cut = case
    events = [e for _, e in worker.archive]
    request = rollback(events[cut], cut)
    step = worker.memory.roll_back(request, worker.past())
    assert step.seq is not None
    worker.archive.append((step.seq, request))
    replayed = fold_past(worker.past(), CONFIG).memory
    assert replayed.state() == worker.memory.state()
    # a second rollback, after the first and to a moment after it, replays the first
    again = rollback(request, step.seq, UUID(int=2**101))
    second = worker.memory.roll_back(again, worker.past())
    assert second.seq is not None
    worker.archive.append((second.seq, again))
    assert fold_past(worker.past(), CONFIG).memory.state() == worker.memory.state()


@LAWS
@given(cut_logs())
def test_a_rollback_is_deterministic(case: tuple[Worker, int]) -> None:
    worker, cut = case
    events = [e for _, e in worker.archive]
    request = rollback(events[cut], cut)
    state = worker.memory.state()
    one = AgentMemory(state, CONFIG).roll_back(request, worker.past())
    two = AgentMemory(state, CONFIG).roll_back(request, worker.past())
    assert [d.model_dump_json() for d in one.derived] == [d.model_dump_json() for d in two.derived]
    assert one.derived[0].type == "agent.rolled_back"


def test_a_rollback_is_deduplicated_and_keeps_the_window() -> None:
    worker = Worker().feed([say(i) for i in range(1, 6)])
    events = [e for _, e in worker.archive]
    request = rollback(events[1], 1)
    first = worker.memory.roll_back(request, worker.past())
    assert first.seq == 5 and first.derived
    assert worker.memory.roll_back(request, worker.past()).seq is None
    assert worker.memory.apply(events[3]).seq is None  # still in the dedupe window
    assert worker.memory.apply(say(9)).seq == 6


def test_a_rollback_beyond_the_log_or_without_its_past_is_refused() -> None:
    worker = Worker().feed([say(i) for i in range(1, 4)])
    events = [e for _, e in worker.archive]
    with pytest.raises(RebaseRefused, match="last seq is 2"):
        worker.memory.roll_back(rollback(events[0], 7), worker.past())
    with pytest.raises(RebaseRefused, match="needs the past"):
        worker.memory.apply(rollback(events[0], 0))
    assert worker.memory.seq == 2


def say(i: int, agent_id: str = AGENT) -> Event:
    return InteractionRecorded(
        event_id=UUID(int=i),
        agent_id=agent_id,
        session_id="s",
        occurred_at=T0 + timedelta(minutes=i),
        body={"role": "user", "content": f"turn {i} 第{i}句", "importance": 9, "sentiment": 0.9},
    )


T0 = datetime(2026, 1, 1, tzinfo=UTC)


# -- fork -------------------------------------------------------------------------------


def forked(source: Worker, cut: int) -> MemoryForked:
    at = source.archive[cut][1].occurred_at
    return MemoryForked(
        event_id=UUID(int=2**102),
        agent_id=FORK,
        occurred_at=at + timedelta(days=5),
        body={"source_agent_id": AGENT, "at": at, "source_seq": cut},
    )


def without_ids(projection: dict[str, Any]) -> dict[str, Any]:
    memories = sorted(map(repr, projection["memories"].values()))
    return {**projection, "memories": memories}


@LAWS
@given(cut_logs())
def test_a_fork_is_the_sources_prefix_under_new_ids(case: tuple[Worker, int]) -> None:
    source, cut = case
    events = [e for _, e in source.archive]
    prefix, prefix_derived = fold(events[: cut + 1])
    fork = AgentMemory.empty(FORK, CONFIG)
    step = fork.fork(forked(source, cut), source.past())
    assert step.seq == 0 and step.derived[0].type == "agent.forked"
    mine, theirs = fork.state(), prefix.state()
    assert mine.agent_id == FORK
    assert {m.memory_id for m in mine.memories}.isdisjoint(
        {d.body.memory_id for d in prefix_derived if isinstance(d, MemoryCreated)}
    )
    strip = {"memory_id"}
    assert sorted(m.model_dump_json(exclude=strip) for m in mine.memories) == sorted(
        m.model_dump_json(exclude=strip) for m in theirs.memories
    )
    assert (mine.facts, mine.persona, mine.sessions, mine.skills) == (
        theirs.facts, theirs.persona, theirs.sessions, theirs.skills,
    )  # fmt: skip
    assert without_ids(project(step.derived)) == without_ids(project(prefix_derived))
    replayed = fold_past(Past(FORK, ((0, forked(source, cut)),), 0, source.past()), CONFIG)
    assert replayed.memory.state() == fork.state()


def test_a_fork_onto_an_agent_with_events_is_refused() -> None:
    source = Worker().feed([say(i) for i in range(1, 4)])
    taken = AgentMemory.empty(FORK, CONFIG)
    taken.apply(say(50, FORK))
    with pytest.raises(RebaseRefused, match="has events already"):
        taken.fork(forked(source, 1), source.past())
    short = Past(AGENT, tuple(source.archive[:1]), 0)
    with pytest.raises(RebaseRefused, match="does not reach seq 1"):
        AgentMemory.empty(FORK, CONFIG).fork(forked(source, 1), short)


# -- late events ------------------------------------------------------------------------


def test_a_rollback_or_fork_to_a_moment_leaves_out_what_was_logged_before_but_dated_after() -> None:
    """``--to T`` resolves to the last sequence whose event occurred at or before T; an
    event logged before it but dated after T (the late one came later) is not part of
    the state at T, which is what an as-of snapshot at T folds."""

    def fact(i: int, key: str, value: str, at: datetime) -> FactAsserted:
        body = {"namespace": "p", "key": key, "value": value}
        return FactAsserted(event_id=UUID(int=1000 + i), agent_id=AGENT, occurred_at=at, body=body)

    day = timedelta(days=1)
    log = [
        fact(0, "lang", "en", T0),
        fact(1, "drink", "coffee", T0 + 3 * day),
        fact(2, "city", "Kyoto", T0 + day),  # late: logged after coffee, dated before it
    ]
    moment = T0 + 2 * day
    as_of, _ = fold([e for e in log if e.occurred_at <= moment])
    assert {fact.key for fact in as_of.state().facts.facts} == {"lang", "city"}

    worker = Worker().feed(log)
    back = MemoryRolledBack(
        event_id=REQUEST, agent_id=AGENT, occurred_at=T0 + 4 * day,
        body={"to": moment, "to_seq": 2},
    )  # fmt: skip
    worker.memory.roll_back(back, worker.past())
    assert content(worker.memory) == content(as_of)

    fork = AgentMemory.empty(FORK, CONFIG)
    at = MemoryForked(
        event_id=UUID(int=2**102), agent_id=FORK, occurred_at=T0 + 4 * day,
        body={"source_agent_id": AGENT, "at": moment, "source_seq": 2},
    )  # fmt: skip
    fork.fork(at, Worker().feed(log).past())
    assert fork.state().facts == as_of.state().facts


# -- ids across agents ------------------------------------------------------------------


def test_two_agents_events_with_one_id_make_memories_with_their_own_ids() -> None:
    """Event ids are unique per agent only: a turn memory and an episode made from the
    same event id by two agents must not share an id (the vector store keys points by
    it: one would overwrite the other)."""
    made: dict[str, set[str]] = {}
    for agent in ("alice", "bob"):
        memory = AgentMemory.empty(agent, CONFIG)
        derived = [  # the same event ids for both
            *memory.apply(say(1, agent)).derived,
            *memory.apply(say(2, agent)).derived,
            *memory.apply(say(3, agent)).derived,  # max_turns 3: the episode closes
        ]
        made[agent] = {d.body.memory_id for d in derived if isinstance(d, MemoryCreated)}
    assert len(made["alice"]) == len(made["bob"]) == 4  # three important turns, an episode
    assert made["alice"].isdisjoint(made["bob"])


@st.composite
def rollback_logs(draw: st.DrawFn) -> tuple[int, list[tuple[int, int]]]:
    """A log's length and its rollbacks ``(seq, to_seq)``, each to an earlier event."""
    length = draw(st.integers(1, 40))
    seqs = draw(st.sets(st.integers(1, length - 1), max_size=8)) if length > 1 else set()
    return length, [(seq, draw(st.integers(0, seq - 1))) for seq in sorted(seqs)]


@given(rollback_logs())
def test_the_undone_spans_leave_what_the_memory_holds_after_its_rollbacks(
    log: tuple[int, list[tuple[int, int]]],
) -> None:
    """Against the fold's own rule, event by event: a rollback's memory is the memory
    after its ``to_seq`` (which itself went through every earlier rollback) plus itself."""
    length, rollbacks = log
    to = dict(rollbacks)
    held: list[frozenset[int]] = []
    for seq in range(length):
        before = held[to[seq]] if seq in to else (held[-1] if held else frozenset())
        held.append(before | {seq})
    spans = undone_spans(reversed(rollbacks))
    assert {s for s in range(length) if in_memory(s, spans)} == held[-1]


def test_a_rollback_of_a_rollback_to_before_it_brings_back_what_it_undid() -> None:
    assert undone_spans([(6, 2), (9, 4)]) == [(4, 9)]  # 3 and 4 are back
    assert undone_spans([(6, 2), (9, 7)]) == [(7, 9), (2, 6)]
    assert undone_spans([(6, 2), (9, 6)]) == [(6, 9), (2, 6)]  # the rollback at 6 stays
