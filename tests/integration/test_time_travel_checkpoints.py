"""A replay as of T that starts from a checkpoint kept by position gives, byte for byte,
what the replay from the first event gives (:func:`engram.snapshot.replay_start`).

Histories are folded into a real chdb the way the worker folds them: in flush groups
of random sizes, each written with the touched agents' states as checkpoints
(``{"memory": ..., "positions": ...}``), rollbacks and forks with their past read
back from the archive. The writer keeps a checkpoint every few sequence numbers
(``agent_checkpoints``); snapshots at many moments (random ones, every event time of a
stretch, both ends) are taken with those checkpoints, then again after they are
deleted (from the first event), and compared as JSON. Covered: a plain multi-week
history, narrowed to a user with a long episode tail (episodes from before the
checkpoint), events whose times go back, a rollback and a fork, another config, and an
erasure (its agent's kept checkpoints before it go, and none is used after it), and
sealed events whose subject's keys are destroyed.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import clickhouse_connect
import pytest
from clickhouse_connect.driver.client import Client

from engram.events import make_event
from engram.snapshot import replay_start, take_snapshot
from ops.bench.timetravel import history_of, moments
from processors import AgentMemory, MemoryConfig, Step
from processors.state import WorkingParams
from schemas import Codec, DerivedEvent, Event, MemoryForked, MemoryRolledBack
from schemas.sealed import SealingCodec
from sinks.clickhouse import Checkpoint, ClickHouseHistory, SequencedEvent
from sinks.clickhouse_erasure import DELETE_SYNC
from sinks.keys import KeyBook, OpenEvent
from streams.past import read_past_sync

pytestmark = pytest.mark.integration
EVERY = 97
"""The writer's ``checkpoint_every`` here: many kept checkpoints per history."""
READ = Codec().decode


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    """chdb in a temp dir (one engine per process: closed at the end of the module)."""
    client = clickhouse_connect.get_client(dsn=f"chdb://{tmp_path_factory.mktemp('chdb')}/ch")
    ClickHouseHistory(client).ensure_schema()
    yield client
    client.close()


class Worker:
    """Folds events as the worker does: flush groups of random sizes, a checkpoint of
    every touched agent with each flush, a rollback's or a fork's past read from the
    archive after the events before it are flushed."""

    def __init__(
        self,
        history: ClickHouseHistory,
        config: MemoryConfig,
        seed: int,
        codec: Codec | None = None,
    ) -> None:
        self.history = history
        self.config = config
        self.rng = random.Random(seed)
        self.codec = codec or Codec()
        self.memories: dict[str, AgentMemory] = {}
        self.sequenced: list[SequencedEvent] = []
        self.changes: list[DerivedEvent] = []
        self.size = self.rng.randint(5, 150)

    def fold(self, events: list[Event]) -> None:
        for event in events:
            memory = self.memories.setdefault(
                event.agent_id, AgentMemory.empty(event.agent_id, self.config)
            )
            step = self._step(memory, event)
            assert step.seq is not None
            self.sequenced.append(SequencedEvent(event, step.seq, self.codec.encode(event)))
            self.changes += step.derived
            if len(self.sequenced) >= self.size:
                self.flush()
        self.flush()

    def _step(self, memory: AgentMemory, event: Event) -> Step:
        if isinstance(event, MemoryRolledBack):
            self.flush()
            past = read_past_sync(self.history, READ, event.agent_id, event.body.to_seq)
            return memory.roll_back(event, past)
        if isinstance(event, MemoryForked):
            self.flush()
            body = event.body
            return memory.fork(
                event, read_past_sync(self.history, READ, body.source_agent_id, body.source_seq)
            )
        return memory.apply(event)

    def flush(self) -> None:
        touched = sorted({s.event.agent_id for s in self.sequenced})
        checkpoints = [self.checkpoint(self.memories[agent]) for agent in touched]
        self.history.write_sync(self.sequenced, self.changes, checkpoints)
        self.sequenced, self.changes = [], []
        self.size = self.rng.randint(5, 150)

    @staticmethod
    def checkpoint(memory: AgentMemory) -> Checkpoint:
        """The worker's stored state (``streams.pipeline.StoredState``'s shape)."""
        stored = {"memory": json.loads(memory.state().model_dump_json()), "positions": {"0": 1}}
        return Checkpoint(memory.agent_id, memory.seq, json.dumps(stored).encode())


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def shifted(events: list[Event], by: timedelta) -> list[Event]:
    return [e.model_copy(update={"occurred_at": e.occurred_at + by}) for e in events]


def snapshots(
    history: ClickHouseHistory,
    agent_id: str,
    at: list[datetime],
    config: MemoryConfig,
    read: OpenEvent,
    **options: Any,
) -> list[str]:
    return [
        take_snapshot(
            history, agent_id, as_of=t, config=config, open_event=read, **options
        ).model_dump_json()
        for t in at
    ]


def assert_both_starts_agree(
    engine: Client,
    agent_id: str,
    at: list[datetime],
    config: MemoryConfig | None = None,
    read: OpenEvent = READ,
    **options: Any,
) -> int:
    """Snapshots with the kept checkpoints equal those from the first event (after the
    checkpoints are deleted); returns at how many moments a checkpoint was used."""
    config = config or MemoryConfig()
    history = ClickHouseHistory(engine)
    used = sum(replay_start(history, agent_id, t, config, read) is not None for t in at)
    started = snapshots(history, agent_id, at, config, read, **options)
    engine.command(
        "DELETE FROM agent_checkpoints WHERE agent_id = {a:String}",
        parameters={"a": agent_id},
        settings=DELETE_SYNC,
    )
    assert all(replay_start(history, agent_id, t, config, read) is None for t in at)
    from_first = snapshots(history, agent_id, at, config, read, **options)
    for t, one, two in zip(at, started, from_first, strict=True):
        assert one == two, f"{agent_id} as of {t.isoformat()}"
    return used


def kept(engine: Client, agent_id: str) -> list[int]:
    rows = engine.query(
        "SELECT seq FROM agent_checkpoints WHERE agent_id = {a:String} ORDER BY seq",
        parameters={"a": agent_id},
    ).result_rows
    return [int(r[0]) for r in rows]


def test_a_replay_from_a_kept_checkpoint_is_the_replay_from_the_first_event(
    engine: Client,
) -> None:
    agent = fresh("ck")
    events = history_of(agent, days=14, seed=5)
    Worker(ClickHouseHistory(engine, checkpoint_every=EVERY), MemoryConfig(), seed=1).fold(events)
    seqs = kept(engine, agent)
    assert len(seqs) >= len(events) // EVERY - 1
    assert all(b // EVERY > a // EVERY for a, b in itertools.pairwise(seqs))
    stretch = [e.occurred_at for e in events[seqs[2] - 3 : seqs[2] + 4]]  # around one
    at = [*moments(events, 40, seed=3), *stretch]
    used = assert_both_starts_agree(engine, agent, at)
    assert used >= len(at) // 2


def test_an_episode_tail_from_before_the_checkpoint(engine: Client) -> None:
    agent = fresh("ck-tail")
    events = history_of(agent, days=10, seed=8)
    Worker(ClickHouseHistory(engine, checkpoint_every=EVERY), MemoryConfig(), seed=2).fold(events)
    at = moments(events, 16, seed=4)
    assert assert_both_starts_agree(engine, agent, at, user_id="mei", episodes=40)


def test_events_whose_times_go_back(engine: Client) -> None:
    """An event stamped later than those after it: a moment between its time and theirs
    cuts it out of the replay, so no checkpoint after it may be used then."""
    agent = fresh("ck-late")
    events = history_of(agent, days=8, seed=9)
    rng = random.Random(6)
    for i in rng.sample(range(50, len(events) - 50), 6):
        events[i] = shifted([events[i]], timedelta(days=rng.choice([1, 3])))[0]
    Worker(ClickHouseHistory(engine, checkpoint_every=EVERY), MemoryConfig(), seed=3).fold(events)
    at = [*moments(events, 30, seed=5), *(e.occurred_at for e in events[::40])]
    assert assert_both_starts_agree(engine, agent, at)


def test_a_rollback_and_a_fork(engine: Client) -> None:
    source, forked = fresh("ck-src"), fresh("ck-fork")
    events = history_of(source, days=6, seed=10)
    history = ClickHouseHistory(engine, checkpoint_every=EVERY)
    worker = Worker(history, MemoryConfig(), seed=4)
    worker.fold(events)
    end = events[-1].occurred_at
    middle = events[len(events) // 2]
    back = make_event(
        "memory.rolled_back",
        agent_id=source,
        occurred_at=end + timedelta(hours=1),
        body={"to": middle.occurred_at, "to_seq": len(events) // 2},
    )
    later = shifted(history_of(source, days=3, seed=11)[1:], end - events[0].occurred_at)
    later = shifted(later, timedelta(days=1))
    fork = make_event(
        "memory.forked",
        agent_id=forked,
        occurred_at=end + timedelta(hours=2),
        body={"source_agent_id": source, "at": middle.occurred_at, "source_seq": len(events) // 3},
    )
    own = shifted(history_of(forked, days=4, seed=12)[1:], end - events[0].occurred_at)
    own = shifted(own, timedelta(days=2))
    worker.fold([back, *later, fork, *own])
    at = [*moments([*events, back, *later], 30, seed=6), back.occurred_at]
    assert assert_both_starts_agree(engine, source, at)
    assert assert_both_starts_agree(engine, forked, moments([fork, *own], 20, seed=7))


def test_only_checkpoints_of_the_same_parameters_are_used(engine: Client) -> None:
    agent = fresh("ck-cfg")
    tight = MemoryConfig(working_turns=4, working=WorkingParams(token_budget=300))
    events = history_of(agent, days=6, seed=13)
    Worker(ClickHouseHistory(engine, checkpoint_every=EVERY), tight, seed=5).fold(events)
    at = moments(events, 12, seed=8)
    history = ClickHouseHistory(engine)
    assert all(replay_start(history, agent, t, MemoryConfig(), READ) is None for t in at)
    assert assert_both_starts_agree(engine, agent, at, tight)


def test_an_erasure_purges_the_kept_checkpoints_before_it_and_stops_their_use(
    engine: Client,
) -> None:
    agent = fresh("ck-erase")
    events = history_of(agent, days=8, seed=14)
    history = ClickHouseHistory(engine, checkpoint_every=EVERY)
    worker = Worker(history, MemoryConfig(), seed=6)
    worker.fold(events)
    before = kept(engine, agent)
    assert len(before) >= 3
    at = moments(events, 12, seed=9)
    assert sum(replay_start(history, agent, t, MemoryConfig(), READ) is not None for t in at) > 3
    request = make_event(
        "subject.erasure_requested",
        agent_id=agent,
        occurred_at=events[-1].occurred_at + timedelta(minutes=5),
        body={"subject": "tom", "requested_at": events[-1].occurred_at},
    )
    worker.fold([request])  # the fold derives subject.erased; the write purges
    seq = worker.memories[agent].seq
    assert history.erasures() and all(s >= seq for s in kept(engine, agent)), kept(engine, agent)
    receipt = next(r for r in history.erasures() if r.agent_id == agent)
    assert receipt.rows["agent_checkpoints"] == len(before)
    later = [*at, request.occurred_at]
    assert all(replay_start(history, agent, t, MemoryConfig(), READ) is None for t in later)
    assert_both_starts_agree(engine, agent, later)


def test_a_shredded_subject_stops_the_use_of_checkpoints_that_folded_its_events(
    engine: Client,
) -> None:
    """Sealed events (the worker's default): while the reader holds the keys, kept
    checkpoints are used; once a subject's keys are destroyed, its events are skipped
    by the replay from the first event, and no checkpoint that folded one is used."""
    agent = fresh("ck-sealed")
    events = history_of(agent, days=8, seed=15)
    book = KeyBook({s: {"k1": os.urandom(32)} for s in ("tom", "mei", agent)})
    history = ClickHouseHistory(engine, checkpoint_every=EVERY)
    Worker(history, MemoryConfig(), seed=7, codec=SealingCodec(book)).fold(events)
    read = SealingCodec(book).open
    at = moments(events, 12, seed=10)
    assert sum(replay_start(history, agent, t, MemoryConfig(), read) is not None for t in at) > 3
    assert all(replay_start(history, agent, t, MemoryConfig(), READ) is None for t in at)
    book.keys["tom"]["k1"] = None  # destroyed: tom's events are shredded
    first = min(e.occurred_at for e in events if e.user_id == "tom")
    assert all(
        replay_start(history, agent, t, MemoryConfig(), read) is None for t in at if t >= first
    )
    assert_both_starts_agree(engine, agent, at, read=read)


def test_the_writer_keeps_one_checkpoint_per_stretch(engine: Client) -> None:
    agent = fresh("ck-keep")
    events = history_of(agent, days=4, seed=16)
    history = ClickHouseHistory(engine, checkpoint_every=EVERY)
    Worker(history, MemoryConfig(), seed=8).fold(events)
    seqs = kept(engine, agent)
    assert seqs and seqs[0] < EVERY + 150  # the first one this writer saw
    assert len({s // EVERY for s in seqs}) == len(seqs)
    version = engine.query(
        "SELECT DISTINCT config_version FROM agent_checkpoints WHERE agent_id = {a:String}",
        parameters={"a": agent},
    ).result_rows
    assert version == [(MemoryConfig().version,)]
    with pytest.raises(ValueError):
        ClickHouseHistory(engine, checkpoint_every=0)
