"""Time travel has two roads that must agree: replaying an agent's archived log up to
T (:func:`engram.snapshot.take_snapshot`) and SQL over the ClickHouse history as of T
(:func:`engram.history.history_snapshot`).

Multi-week bilingual histories of two agents (sessions, tool calls, working-memory
sets, facts asserted and retracted, persona updates, recalls and feedback, clock
ticks that forget and expire, flashbulb turns, compression) go through the real
broker into a running ``engram up``; at many seeded random moments, and at event
times exactly, the two roads must give the same snapshot, part for part. The CLI's
``engram history`` and ``engram replay`` print them, and refuse an unknown agent and
a moment in the future.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import clickhouse_connect
import pytest
from clickhouse_connect.driver.client import Client

from engram import Memory, make_event
from engram.errors import RequestFailed
from engram.history import history_snapshot, http_client
from engram.results import Snapshot
from engram.settings import Settings
from engram.snapshot import UnknownAgent, take_snapshot
from engram.transfer import archive_opener
from ops.bench.timetravel import comparable, history_of, moments
from processors import AgentMemory, MemoryConfig
from processors.forgetting import ForgettingParams
from processors.state import ConsolidationParams, WorkingParams
from schemas import Codec, DerivedEvent, Event
from sinks.clickhouse import ClickHouseHistory, SequencedEvent
from sinks.keys import OpenEvent
from tests.support import Stack, engram_cmd, wait_until

pytestmark = pytest.mark.integration
DAY = timedelta(days=1)
DAYS = {"tt-a": (24, 11), "tt-b": (17, 12)}
"""Per agent prefix: days of history and the generator's seed."""


@dataclass
class Published:
    client: Client
    history: ClickHouseHistory
    logs: dict[str, list[Event]]
    open_event: OpenEvent | None = None


@pytest.fixture(scope="module")
def published(stack: Stack) -> Iterator[Published]:
    run = uuid.uuid4().hex[:8]
    logs = {
        f"{prefix}-{run}": history_of(f"{prefix}-{run}", days=days, seed=seed)
        for prefix, (days, seed) in DAYS.items()
    }
    with Memory(bootstrap=stack.bootstrap) as memory:
        for events in logs.values():
            memory.publish_many(events)
    for agent_id, events in logs.items():
        wait_until(
            partial(folded_to, stack, agent_id, len(events) - 1),
            120,
            f"the fold of {agent_id}'s {len(events)} events",
        )
    client = http_client(stack.http)
    settings = Settings.from_env({"ENGRAM_HOME": str(stack.home), **stack.env})
    with archive_opener(settings) as open_event:  # the stack's keys open its sealed log
        yield Published(client, ClickHouseHistory(client), logs, open_event)
    client.close()


def folded_to(stack: Stack, agent_id: str, seq: int) -> bool:
    """Whether the worker's checkpoint of ``agent_id`` reached ``seq`` (it is written
    after the events and changes of the same flush)."""
    query = "SELECT max(seq) FROM agent_states FINAL WHERE agent_id = {a:String}"
    return bool(stack.scalar(query, a=agent_id) == seq)


def both(p: Published, agent_id: str, at: datetime, **options: Any) -> tuple[Snapshot, Snapshot]:
    replayed = take_snapshot(p.history, agent_id, as_of=at, open_event=p.open_event, **options)
    queried = history_snapshot(p.client, agent_id, as_of=at, **options)
    return replayed, queried


def differences(one: Any, two: Any, path: str = "") -> list[str]:
    """Where two JSON values differ (the first few), for a readable failure."""
    if isinstance(one, dict) and isinstance(two, dict):
        out = []
        for key in sorted(set(one) | set(two)):
            out += differences(one.get(key), two.get(key), f"{path}.{key}")
        return out[:10]
    if isinstance(one, list) and isinstance(two, list) and len(one) == len(two):
        return [
            d
            for i, (a, b) in enumerate(zip(one, two, strict=True))
            for d in differences(a, b, f"{path}[{i}]")
        ]
    return [] if one == two else [f"{path}: replay {one!r} != history {two!r}"]


def test_both_roads_agree_at_many_moments(published: Published) -> None:
    seen: dict[str, int] = {}
    for n, (agent_id, events) in enumerate(published.logs.items()):
        for at in [*moments(events, 32, seed=100 + n), *compressions(published, agent_id)]:
            replayed, queried = both(published, agent_id, at)
            one, two = comparable(replayed), comparable(queried)
            assert one == two, f"{agent_id} as of {at.isoformat()}: {differences(one, two)}"
            assert replayed.position.events_folded == sum(e.occurred_at <= at for e in events)
            _count(seen, replayed)
    # the histories exercised every part the roads compare
    assert seen["working"] and seen["compressed"] and seen["episodes"] and seen["facts"]
    assert seen["persona_versions"] >= 3 and seen["skills"] and seen["L3"] and seen["L2"]
    assert seen["reinforced"] and seen["lapsed"] and seen["faded"], seen
    print(seen)


def compressions(p: Published, agent_id: str) -> list[datetime]:
    """A few moments at which working memory was just compressed into a summary."""
    rows = p.client.query(
        "SELECT occurred_at FROM memory_changes FINAL WHERE agent_id = {a:String}"
        " AND type = 'working.updated' AND position(body, '\"role\":\"summary\"') > 0"
        " ORDER BY seq LIMIT 4",
        parameters={"a": agent_id},
    ).result_rows
    return [at.replace(tzinfo=UTC) for (at,) in rows]


def _count(seen: dict[str, int], snap: Snapshot) -> None:
    def add(key: str, value: int | bool) -> None:
        seen[key] = seen.get(key, 0) + int(value)

    add("working", bool(snap.working))
    add("compressed", any(s["compressed"] for s in snap.working))
    add("episodes", bool(snap.episodes))
    add("facts", bool(snap.facts))
    seen["persona_versions"] = max(
        seen.get("persona_versions", 0), (snap.persona or {}).get("version", 0)
    )
    add("skills", bool(snap.skills))
    add("L2", snap.memories["L2"] > 0)
    add("L3", snap.memories["L3"] > 0)
    add("reinforced", any(m.reinforcements for m in snap.memory_items))
    add("lapsed", any(m.lapses for m in snap.memory_items))
    add("faded", any(m.retention < 0.5 for m in snap.memory_items))


def test_forgetting_shows_as_of_t(published: Published) -> None:
    """A memory forgotten at a tick is listed, with a falling retention, before it and
    is gone after it, on both roads."""
    agent_id = next(iter(published.logs))
    memory_id, forgotten_at = published.client.query(
        "SELECT memory_id, occurred_at FROM memory_changes FINAL WHERE agent_id = {a:String}"
        " AND type = 'memory.forgotten' ORDER BY seq LIMIT 1",
        parameters={"a": agent_id},
    ).result_rows[0]
    forgotten_at = forgotten_at.replace(tzinfo=UTC)
    just_before = forgotten_at - timedelta(milliseconds=1)
    for snap in both(published, agent_id, just_before):
        (item,) = [m for m in snap.memory_items if m.memory_id == memory_id]
        assert 0 < item.retention < 0.5
    for snap in both(published, agent_id, forgotten_at):
        assert memory_id not in {m.memory_id for m in snap.memory_items}


def test_narrowed_to_a_user_and_a_session(published: Published) -> None:
    agent_id, events = next(iter(published.logs.items()))
    at = events[len(events) // 2].occurred_at
    for user in ("mei", "tom"):
        replayed, queried = both(published, agent_id, at, user_id=user, episodes=3)
        assert comparable(replayed) == comparable(queried)
        assert len(replayed.episodes) == 3 and {e["user_id"] for e in replayed.episodes} == {user}
        assert {m.user_id for m in replayed.memory_items} == {user}
    open_at = next(e for e in events if e.type == "working.set")
    replayed, queried = both(
        published, agent_id, open_at.occurred_at, session_id=open_at.session_id
    )
    assert comparable(replayed) == comparable(queried)
    assert [s["session_id"] for s in replayed.working] == [open_at.session_id]


def test_before_the_first_event_the_agent_is_unknown(published: Published) -> None:
    agent_id, events = next(iter(published.logs.items()))
    before = events[0].occurred_at - timedelta(seconds=1)
    with pytest.raises(UnknownAgent):
        take_snapshot(published.history, agent_id, as_of=before, open_event=published.open_event)
    with pytest.raises(UnknownAgent):
        history_snapshot(published.client, agent_id, as_of=before)


def cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        engram_cmd(*args), env=stack.env, capture_output=True, text=True, timeout=120
    )


def test_the_cli_prints_both_roads(stack: Stack, published: Published) -> None:
    agent_id, events = next(iter(published.logs.items()))
    at = events[2 * len(events) // 3].occurred_at.isoformat()
    answers = []
    for command, flag in (("history", "--as-of"), ("replay", "--until")):
        done = cli(stack, command, "--agent", agent_id, flag, at, "--format", "json")
        assert done.returncode == 0, done.stderr
        answers.append(comparable(Snapshot.model_validate(json.loads(done.stdout))))
        table = cli(stack, command, "--agent", agent_id, flag, at)
        assert table.returncode == 0 and "retention" in table.stdout, table.stderr
    assert answers[0] == answers[1]


@pytest.mark.parametrize("command,flag", [("history", "--as-of"), ("replay", "--until")])
def test_the_cli_refuses_unsafe_input(
    stack: Stack, published: Published, command: str, flag: str
) -> None:
    agent_id = next(iter(published.logs))
    future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    done = cli(stack, command, "--agent", agent_id, flag, future)
    assert done.returncode == 2 and "in the future" in done.stderr
    done = cli(
        stack, command, "--agent", f"nobody-{uuid.uuid4().hex[:6]}", flag, "2026-05-01T00:00Z"
    )
    assert done.returncode == 1 and "no events of agent" in done.stderr
    done = cli(stack, command, "--agent", agent_id, flag, "2026-05-01T00:00")
    assert done.returncode == 2 and "no UTC offset" in done.stderr
    helped = cli(stack, command, "--help")
    assert helped.returncode == 0 and "Example" in helped.stdout


def test_the_http_api_answers_both_roads(stack: Stack, published: Published) -> None:
    agent_id, events = next(iter(published.logs.items()))
    at = events[len(events) // 3].occurred_at
    with Memory(http=stack.http) as memory:
        queried = memory.history(agent_id, as_of=at, user_id="mei")
        replayed = memory.snapshot(agent_id, as_of=at, user_id="mei")
        latest = memory.snapshot(agent_id)
        with pytest.raises(RequestFailed) as future:
            memory.history(agent_id, as_of=datetime.now(UTC) + timedelta(hours=1))
        with pytest.raises(RequestFailed) as unknown:
            memory.history(f"nobody-{uuid.uuid4().hex[:6]}", as_of=at)
    assert queried.road == "history" and replayed.road == "replay"
    assert comparable(queried) == comparable(replayed)
    assert future.value.status == 422 and unknown.value.status == 404
    # the latest snapshot, what an agent loads at start, counts its memories, lists none
    assert latest.memories["L2"] + latest.memories["L3"] > 0 and latest.memory_items == []


# -- other parameter sets: the worker's own fold written by the real sink into chdb ------

CONFIGS = {
    "fsrs": MemoryConfig(forgetting=ForgettingParams(curve="fsrs")),
    "tight": MemoryConfig(
        working_turns=4,
        working=WorkingParams(token_budget=300, idle_ttl_s=1800),
        consolidation=ConsolidationParams(window_s=6 * 3600),
    ),
    # one open session at most, and a day of idle TTL: a new session clears the one
    # left open (the cap on open sessions) before the TTL would
    "crowded": MemoryConfig(working=WorkingParams(max_sessions=1, idle_ttl_s=86_400)),
}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    """chdb in a temp dir (one engine per process: closed at the end of the module)."""
    client = clickhouse_connect.get_client(dsn=f"chdb://{tmp_path_factory.mktemp('chdb')}/ch")
    ClickHouseHistory(client).ensure_schema()
    yield client
    client.close()


def fold_into(history: ClickHouseHistory, events: list[Event], config: MemoryConfig) -> None:
    """What the worker does: fold in log order, archive the events, write the changes."""
    codec = Codec()
    memory = AgentMemory.empty(events[0].agent_id, config)
    archived: list[SequencedEvent] = []
    changes: list[DerivedEvent] = []
    for event in events:
        step = memory.apply(event)
        assert step.seq is not None
        archived.append(SequencedEvent(event, step.seq, codec.encode(event)))
        changes.extend(step.derived)
    history.write_sync(archived, changes)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_both_roads_agree_under_other_parameters(engine: Client, name: str) -> None:
    config = CONFIGS[name]
    agent_id = f"tt-{name}-{uuid.uuid4().hex[:6]}"
    events = history_of(agent_id, days=20, seed=len(name))
    history = ClickHouseHistory(engine)
    fold_into(history, events, config)
    if name == "crowded":
        fold, crowded = AgentMemory.empty(agent_id, config), 0
        for event in events:
            derived = fold.apply(event).derived
            if event.type != "clock.tick":
                crowded += sum(
                    d.type == "working.updated" and d.session_id is None for d in derived
                )
        assert crowded > 0, "no session was crowded out: the roads' agreement on it is untested"
    faded = 0
    first_days = [e.occurred_at for e in events if e.occurred_at < events[0].occurred_at + DAY * 2]
    for at in [*moments(events, 30, seed=7), *first_days]:  # and after every early event
        replayed = take_snapshot(history, agent_id, as_of=at, config=config)
        queried = history_snapshot(engine, agent_id, as_of=at, config=config)
        one, two = comparable(replayed), comparable(queried)
        assert one == two, f"{name} as of {at.isoformat()}: {differences(one, two)}"
        assert replayed.config_version == config.version
        faded += any(m.retention < 0.9 for m in replayed.memory_items)
    assert faded


def test_a_flush_written_twice_changes_no_answer(engine: Client) -> None:
    """The second road reads without ``FINAL``: rows written again by a retried flush
    (same keys, same bodies), still unmerged, must not count twice."""
    agent_id = f"tt-twice-{uuid.uuid4().hex[:6]}"
    events = history_of(agent_id, days=12, seed=11)
    history = ClickHouseHistory(engine)
    config = MemoryConfig()
    engine.command("SYSTEM STOP MERGES memory_changes")
    engine.command("SYSTEM STOP MERGES events")
    try:
        fold_into(history, events, config)
        moments_at = moments(events, 12, seed=3)
        once = [history_snapshot(engine, agent_id, as_of=at, config=config) for at in moments_at]
        fold_into(history, events, config)  # the same rows again
        where = {"a": agent_id}
        rows = "SELECT count() FROM memory_changes WHERE agent_id = {a:String}"
        distinct = "SELECT count() FROM memory_changes FINAL WHERE agent_id = {a:String}"
        assert engine.query(rows, parameters=where).result_rows[0][0] == 2 * int(
            engine.query(distinct, parameters=where).result_rows[0][0]
        )
        for at, before in zip(moments_at, once, strict=True):
            after = history_snapshot(engine, agent_id, as_of=at, config=config)
            replayed = take_snapshot(history, agent_id, as_of=at, config=config)
            assert comparable(after) == comparable(before), differences(
                comparable(after), comparable(before)
            )
            assert comparable(after) == comparable(replayed), at.isoformat()
    finally:
        engine.command("SYSTEM START MERGES memory_changes")
        engine.command("SYSTEM START MERGES events")


@pytest.mark.parametrize("opening", ["interaction.recorded", "session.started"])
def test_an_agents_first_change_is_on_both_roads(engine: Client, opening: str) -> None:
    """The working-memory change of the agent's very first event (seq 0, idx 0) is part
    of the state as of any later moment, on the second road too."""
    agent_id = f"tt-first-{uuid.uuid4().hex[:6]}"
    t0 = datetime(2026, 10, 1, 9, 0, tzinfo=UTC)
    first = (
        {"role": "user", "content": "first turn of s1"}
        if opening == "interaction.recorded"
        else {"task": "plan the trip"}
    )
    events = [
        make_event(opening, agent_id=agent_id, session_id="s1", occurred_at=t0, body=first),
        make_event("interaction.recorded", agent_id=agent_id, session_id="s1",
                   occurred_at=t0 + timedelta(minutes=1),
                   body={"role": "user", "content": "second turn of s1"}),
    ]  # fmt: skip
    config = MemoryConfig()
    history = ClickHouseHistory(engine)
    fold_into(history, events, config)
    at = t0 + timedelta(minutes=2)
    replayed = take_snapshot(history, agent_id, as_of=at, config=config)
    queried = history_snapshot(engine, agent_id, as_of=at, config=config)
    assert [s["session_id"] for s in replayed.working] == ["s1"]
    one, two = comparable(replayed), comparable(queried)
    assert one == two, differences(one, two)
