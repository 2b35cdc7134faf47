"""A ClickHouse rebuild purges erasures as the live sink did: the rebuilt
``memory_changes`` equals, row for row, the one the live flushes and their purges
wrote, when the rebuild defers its purges and runs them together (two erasures of one
agent in one batch included), and when it runs them after every batch.

Real parts: the session's broker (the derived log is published there and read back by
:func:`ops.rebuild.rebuild`) and chdb in a temp dir. The live side is the fold's own
flush (:meth:`ClickHouseHistory.write_sync`: rows, checkpoint, then the live purge),
one flush per raw event, as a worker that flushes at every erasure does."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import clickhouse_connect
import pytest
from aiokafka import AIOKafkaProducer
from clickhouse_connect.driver.client import Client

from engram.events import make_event
from ops.rebuild import ClickHouseProjection, LogReader, Progress, rebuild
from ops.topics import KEEP_FOREVER, TopicSpec, ensure_topics
from processors import AgentMemory, MemoryConfig
from schemas import Codec, DerivedEvent, Event, SubjectErased, SubjectErasureRequested
from sinks.clickhouse import Checkpoint, ClickHouseHistory, SequencedEvent
from sinks.clickhouse_erasure import waves

pytestmark = pytest.mark.integration

START = datetime(2026, 5, 4, 8, 0, tzinfo=UTC)
USERS = ("lea", "mei", "kim", "sam")
ALL = "SELECT * FROM {} ORDER BY agent_id, seq, idx, body"


def turns(agent: str, user: str, at: datetime, n: int) -> list[Event]:
    """A session of ``user``: turns, a private fact, the shared motto, a persona change."""
    session = f"{agent}-{user}-{n}"

    def event(kind: str, minutes: int, body: dict[str, Any] | None = None) -> Event:
        when = at + timedelta(minutes=minutes)
        return make_event(
            kind, agent_id=agent, session_id=session, user_id=user, occurred_at=when, body=body
        )

    return [
        event("session.started", 0, {"task": "help"}),
        event("interaction.recorded", 1, {"role": "user", "content": f"{user} {n} secret"}),
        event("interaction.recorded", 2, {"role": "assistant", "content": f"noted {user} {n}"}),
        event("session.ended", 3),
        event("fact.asserted", 4, {"namespace": f"user:{user}", "key": "k", "value": f"{n}"}),
        event("fact.asserted", 5, {"namespace": "team", "key": "motto", "value": f"{user} {n}"}),
        event("persona.updated", 6, {"preferences": {user: f"{n}"}}),
    ]


def erase(agent: str, subject: str, at: datetime) -> SubjectErasureRequested:
    return SubjectErasureRequested(
        event_id=uuid.uuid4(), agent_id=agent, occurred_at=at, body={"subject": subject}
    )


def unattended(agent: str, at: datetime, n: int) -> list[Event]:
    """The agent's own changes, without a user: the shared motto and the persona."""
    body = {"namespace": "team", "key": "motto", "value": f"{agent} {n}"}
    return [
        make_event("fact.asserted", agent_id=agent, occurred_at=at, body=body),
        make_event("persona.updated", agent_id=agent, occurred_at=at, body={"style": f"{n}"}),
    ]


def raw_log() -> list[Event]:
    """Three agents, each user's sessions twice with changes of the agent's own (no
    user) between. ``a1``: ``mei`` erased, more turns, ``sam`` erased, more turns (two
    erasures of one agent). ``a2``: ``kim`` erased, and a subject it never met. ``a3``:
    the agent itself erased (its rows without a user)."""
    events: list[Event] = []
    at = START
    for agent in ("a1", "a2", "a3"):
        for n in range(2):
            for user in USERS:
                events += turns(agent, user, at, n)
                at += timedelta(minutes=10)
            events += unattended(agent, at, n)
            at += timedelta(minutes=10)
    events += [erase("a1", "mei", at), erase("a2", "kim", at), erase("a2", "zed", at)]
    events += [erase("a3", "a3", at)]
    at += timedelta(minutes=10)
    for user in ("lea", "kim", "sam"):
        events += turns("a1", user, at, 2)
        at += timedelta(minutes=10)
    events += [erase("a1", "sam", at)]
    at += timedelta(minutes=10)
    events += turns("a1", "lea", at, 3) + turns("a2", "lea", at, 3)
    return events


def fold_live(history: ClickHouseHistory, log: list[Event] | None = None) -> list[DerivedEvent]:
    """Fold the raw log (``log``, or a new :func:`raw_log`) as the worker does, one
    flush per event with a checkpoint; return the derived log in order."""
    codec, config = Codec(), MemoryConfig()
    memories: dict[str, AgentMemory] = {}
    derived: list[DerivedEvent] = []
    for event in log or raw_log():
        memory = memories.setdefault(event.agent_id, AgentMemory.empty(event.agent_id, config))
        step = memory.apply(event)
        if step.seq is None:
            continue
        state = memory.state().model_dump_json().encode()
        history.write_sync(
            [SequencedEvent(event, step.seq, codec.encode(event))],
            step.derived,
            [Checkpoint(memory.agent_id, memory.seq, state)],
        )
        derived += step.derived
    return derived


async def publish(bootstrap: str, topic: str, derived: list[DerivedEvent]) -> None:
    codec = Codec()
    await ensure_topics(bootstrap, [TopicSpec(topic, 2, KEEP_FOREVER)])
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for event in derived:
            await producer.send(topic, key=event.agent_id.encode(), value=codec.encode(event))
        await producer.flush()
    finally:
        await producer.stop()


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Client]:
    """chdb in a temp dir, closed after the test whatever happens (chdb opens one data
    directory per process: a test that left its own open would fail the next)."""
    opened = clickhouse_connect.get_client(dsn=f"chdb://{tmp_path / 'ch'}")
    try:
        yield opened
    finally:
        opened.close()


@pytest.mark.parametrize("purge_every", [1, 4096], ids=["after-every-batch", "deferred"])
def test_a_rebuild_purges_erasures_as_the_live_sink_did(
    broker: str, client: Client, purge_every: int
) -> None:
    history = ClickHouseHistory(client)
    history.ensure_schema()
    derived = fold_live(history)
    erasures = [e for e in derived if isinstance(e, SubjectErased)]
    assert len(waves(erasures)) == 2, "a1's two erasures go in two waves"
    topic = f"rebuild-erasure-{uuid.uuid4().hex[:8]}"
    asyncio.run(publish(broker, topic, derived))
    live = client.query(ALL.format("memory_changes")).result_rows
    kept = [str(r) for r in live if r[0] == "a1" and r[4] != "subject.erased" and r[7]]
    assert kept and not [r for r in kept if "mei" in r or "sam" in r], "a1 forgot mei and sam"

    projection = ClickHouseProjection(history, settle_s=0, purge_every=purge_every)
    progress = Progress("clickhouse", keep=True)
    status = asyncio.run(rebuild(projection, LogReader(broker, topic), progress))
    assert status.state == "done", status.error

    assert history.live_version() == 2
    rebuilt = client.query(ALL.format("memory_changes")).result_rows
    assert rebuilt == client.query(ALL.format("memory_changes_v1")).result_rows == live
    assert len(history.erasures()) == len(erasures), "the rebuild writes no receipt"
    assert transient_tables(client) == [], "the exclusions went with the swap"


def transient_tables(client: Client) -> list[str]:
    """Tables a rebuild uses for a while (its exclusions and the copy without them)."""
    found = client.query(
        "SELECT name FROM system.tables WHERE database = currentDatabase()"
        " AND match(name, '_v[0-9]+_(excluded|kept)$') ORDER BY name"
    )
    return [str(r[0]) for r in found.result_rows]


def test_what_an_interrupted_purge_left_is_cleaned_and_the_live_version_stays(
    client: Client,
) -> None:
    """A rebuild killed between its purges and its swap leaves its version, its
    exclusions and perhaps the copy without them: the next rebuild's clean-up drops
    them all, and the live table and kept versions are untouched."""
    history = ClickHouseHistory(client)
    history.ensure_schema()
    fold_live(history)
    live = client.query(ALL.format("memory_changes")).result_rows
    version = history.create_version()
    excluded = history.exclusions(version)
    client.command(f"INSERT INTO {excluded} VALUES (1)")
    client.command(f"CREATE TABLE memory_changes_v{version}_kept AS memory_changes")
    assert transient_tables(client) == [
        f"memory_changes_v{version}_{r}" for r in ("excluded", "kept")
    ]
    dropped = history.clean_versions()
    assert f"memory_changes_v{version}" in dropped
    assert transient_tables(client) == []
    assert client.query(ALL.format("memory_changes")).result_rows == live
    assert history.live_version() == 1


def test_keeping_the_unexcluded_rows_copies_the_version_without_them(client: Client) -> None:
    """What a rebuild's purges named leaves the version at its swap; the rest is kept
    as it was, and the exclusions go."""
    history = ClickHouseHistory(client)
    history.ensure_schema()
    fold_live(history)
    version = history.create_version()
    table = f"memory_changes_v{version}"
    client.command(f"INSERT INTO {table} SELECT * FROM memory_changes")
    everything = client.query(ALL.format(table)).result_rows
    assert {r[0] for r in everything} >= {"a1", "a2"}
    excluded = history.exclusions(version)
    client.command(
        f"INSERT INTO {excluded} SELECT cityHash64(agent_id, seq, idx, body) FROM {table}"
        " WHERE agent_id = 'a1'"
    )
    history.keep_unexcluded(version)
    assert client.query(ALL.format(table)).result_rows == [r for r in everything if r[0] != "a1"]
    assert transient_tables(client) == []
    assert history.table_versions()[version] == version, "the copy carries its version"


def test_the_live_purge_rewrites_the_agents_own_documents_too(client: Client) -> None:
    """The agent's own rows (no user) are another's than the erased subject's: its
    persona versions and fact changes are re-derived without the subject too (they
    used to be neither the subject's nor the others', and kept the subject's values)."""
    history = ClickHouseHistory(client)
    history.ensure_schema()
    fold_live(history)
    unattended = client.query(
        "SELECT body FROM memory_changes WHERE agent_id = 'a1' AND user_id IS NULL"
        " AND type IN ('fact.set', 'persona.versioned')"
    ).result_rows
    assert unattended
    assert not [b for (b,) in unattended if "mei" in b or "sam" in b]


def fold_in_one_flush(history: ClickHouseHistory, log: list[Event]) -> None:
    """Fold ``log`` as one flush: every row, the agents' last checkpoints, then the
    live purge of every erasure at once (``a1``'s two among them)."""
    codec, config = Codec(), MemoryConfig()
    memories: dict[str, AgentMemory] = {}
    events: list[SequencedEvent] = []
    derived: list[DerivedEvent] = []
    for event in log:
        memory = memories.setdefault(event.agent_id, AgentMemory.empty(event.agent_id, config))
        step = memory.apply(event)
        if step.seq is not None:
            events.append(SequencedEvent(event, step.seq, codec.encode(event)))
            derived += step.derived
    states = [
        Checkpoint(m.agent_id, m.seq, m.state().model_dump_json().encode())
        for m in memories.values()
    ]
    assert sum(isinstance(e, SubjectErased) and e.agent_id == "a1" for e in derived) == 2
    history.write_sync(events, derived, states)


def test_two_erasures_of_one_agent_in_one_flush_purge_as_in_two(tmp_path: Path) -> None:
    """The live purge of a flush that holds two erasures of one agent leaves what a
    flush per erasure leaves (it runs them in waves, one per agent at a time: in one
    statement, a row rewritten twice could get its first body back and be deleted)."""
    log, tables = raw_log(), []
    for name, fold in (("apart", fold_live), ("together", fold_in_one_flush)):
        opened = clickhouse_connect.get_client(dsn=f"chdb://{tmp_path / name}")
        try:
            history = ClickHouseHistory(opened)
            history.ensure_schema()
            fold(history, log)
            tables.append(opened.query(ALL.format("memory_changes")).result_rows)
        finally:
            opened.close()
    apart, together = tables
    assert apart and together == apart
