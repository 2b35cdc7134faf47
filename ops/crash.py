"""Crash and resume on Apache Kafka: ``python -m ops.crash --points 20``.

Publishes a long bilingual history, runs ``engram up`` against Apache Kafka (its
log on disk) and kills the worker with SIGKILL again and again: at the named fault
points of ``streams.faults`` (mid-flush of every sink: after the history write,
after the derived publish, before the state save, before the commit, mid vector
upsert, after the embeddings' publish) and at random moments. Then it restarts it
once more, waits until the consumer group has committed every record, and compares
every projection with that of an uninterrupted run of the same history: the
``events``, ``memory_changes`` and ``agent_states`` tables (FINAL, every column)
and the vector points (ids, payloads, dense and sparse vectors). Prints the kill
points tried, events lost and events applied twice.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID, uuid5

import qdrant_edge as qe
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from engram import Memory, make_event
from engram.history import http_client
from ops.ingest_child import ingest_group
from ops.kafka import ApacheKafka
from ops.launch import launch, stop
from ops.net import free_port
from ops.topics import ensure_topics, pipeline_topics
from processors import AgentMemory, MemoryConfig
from schemas import Event, MemoryCreated
from streams.faults import POINTS as ALL_POINTS

NAMESPACE = UUID("0c5a7f2e-3b1d-4e8f-9a6c-2d4b6e8f0a1c")
T0 = datetime(2026, 9, 1, 8, 0, tzinfo=UTC)
GROUP = "engram-worker"
FIRST = "random:10.0"
"""The first life of a crashed run: long enough for faust to commit an offset on every
partition. (A worker killed before its group committed any offset on a partition
used to skip or stall there once restarted: faust does not seek a partition without
a committed offset; ``streams.app`` now reads such a partition from its log start.
``--plans embed.published:2`` is that case.)"""
TOPICS = ("engram.events", "engram.memory")
FOLLOWED = ("engram.ingest", *TOPICS)
"""The topics whose lag says whether the worker caught up: the client has no master key,
so it publishes to ``engram.ingest``, which the worker seals onto ``engram.events``."""
PARTITIONS = 6
# Short group timeouts: a member killed with SIGKILL leaves the group after 6 s.
WORKER_ENV = {
    "ENGRAM_TICK_INTERVAL_S": "0",
    "ENGRAM_SESSION_TIMEOUT_S": "6",
    "ENGRAM_REBALANCE_TIMEOUT_S": "3",
    "ENGRAM_BATCH_SIZE": "50",
    "ENGRAM_LOG_LEVEL": "WARNING",
}
TURNS = (
    ("user", "Can you book a table for dinner on Friday? 周五晚上订个位子。", 6.0),
    ("assistant", "好的，我来订。Which restaurant do you prefer?", None),
    ("user", "The Sichuan place near the office, 办公室附近那家川菜馆。", 7.0),
    ("assistant", "Booked for 7pm. 已经订好了，晚上七点。", None),
    ("user", "I am allergic to peanuts, 我对花生过敏，请一定记住！", 9.5),
    ("assistant", "记住了：no peanuts. I will tell the restaurant.", None),
)


POINTS = tuple(p for p in ALL_POINTS if not p.startswith("erasure."))
"""The fault points of the pipeline's own flushes (the erasure's is exercised by
the erasure tests: this history erases nothing)."""


def history(events: int, agents: int = 4) -> list[Event]:
    """About ``events`` events: sessions of bilingual turns with tool use, facts, recalls
    and feedback on earlier memories, and a tick days later (so memories are created,
    reinforced, weakened and forgotten); ids are ``uuid5`` and the memory ids come from
    folding the history as it is written (the fold is pure), so every run publishes
    the very same history."""
    folds = {
        f"crash-agent-{a}": AgentMemory.empty(f"crash-agent-{a}", MemoryConfig())
        for a in range(agents)
    }
    created: dict[str, list[str]] = {agent: [] for agent in folds}
    out: list[Event] = []
    session = 0
    while len(out) < events:
        for agent_id, fold in folds.items():
            made = session_events(agent_id, session, len(out), created[agent_id][-3:])
            for event in made:
                for change in fold.apply(event).derived:
                    if isinstance(change, MemoryCreated):
                        created[agent_id].append(change.body.memory_id)
            out += made
        session += 1
    return out


def session_events(agent_id: str, session: int, start: int, earlier: list[str]) -> list[Event]:
    at = T0 + timedelta(days=60 * session)
    sid = f"s{session}"
    specs: list[tuple[str, dict[str, Any]]] = [("session.started", {"task": f"任务 {session}"})]
    if earlier:
        specs.append(
            (
                "memory.recalled",
                {
                    "query": "花生 peanuts",
                    "memory_ids": earlier[-2:],
                    "scores": [0.9, 0.5][: len(earlier[-2:])],
                },
            )
        )
        specs.append(
            (
                "feedback.given",
                {
                    "memory_id": earlier[0],
                    "useful": session % 2 == 0,
                    "correction": None if session % 2 == 0 else "不对 wrong",
                },
            )
        )
    for turn, (role, text, importance) in enumerate(TURNS):
        body: dict[str, Any] = {"role": role, "content": f"{text} (#{session}.{turn})"}
        if importance is not None and (session + turn) % 3 == 0:
            body["importance"] = importance
            body["sentiment"] = 0.8 if turn % 2 else -0.9
        specs.append(("interaction.recorded", body))
    specs += [
        (
            "tool.called",
            {"call_id": f"c{session}", "tool": "book", "arguments": '{"时间": "19:00"}'},
        ),
        ("tool.result", {"call_id": f"c{session}", "tool": "book", "content": "ok 成功 " * 40}),
        (
            "fact.asserted",
            {"namespace": "prefs", "key": f"k{session % 5}", "value": f"值 {session}"},
        ),
        ("session.ended", {"reason": "done"}),
        ("clock.tick", {"partition": 0, "interval_s": 3600.0}),
    ]
    return [
        make_event(
            kind,
            agent_id=agent_id,
            session_id=None if kind == "clock.tick" else sid,
            user_id="user-1",
            occurred_at=at + (timedelta(days=59) if kind == "clock.tick" else timedelta(seconds=i)),
            event_id=uuid5(NAMESPACE, f"{agent_id}:{start + i}"),
            body=body,
        )
        for i, (kind, body) in enumerate(specs)
    ]


# -- the stack -----------------------------------------------------------------------


def worker_env(home: Path, bootstrap: str, extra: Mapping[str, str] = {}) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env |= WORKER_ENV | {
        "ENGRAM_HOME": str(home),
        "ENGRAM_HTTP": f"127.0.0.1:{free_port()}",
        "ENGRAM_KAFKA_BOOTSTRAP": bootstrap,
    }
    return env | dict(extra)


async def create_and_publish(bootstrap: str, events: Sequence[Event]) -> None:
    await ensure_topics(bootstrap, pipeline_topics(*TOPICS, "engram.events.dlq", PARTITIONS))
    async with Memory(bootstrap=bootstrap) as memory:
        for start in range(0, len(events), 500):
            await memory.apublish_many(events[start : start + 500])


async def lag(bootstrap: str, group: str = GROUP) -> int:
    """Records of the pipeline's topics the group has not committed yet, those of
    ``engram.ingest`` by the ingest hop's group when it has committed (the hop in its
    own process, :func:`~ops.ingest_child.ingest_group`); -1 while the broker cannot
    tell (the group's coordinator is not there yet)."""
    try:
        return sum((await _lag(bootstrap, group)).values())
    except KafkaError:
        return -1


async def _lag(bootstrap: str, group: str) -> dict[str, int]:
    """Per ``topic:partition`` that lags: how many records it lags by."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await admin.start()
    await consumer.start()
    try:
        parts = [TopicPartition(t, p) for t in FOLLOWED for p in range(PARTITIONS)]
        ends = await consumer.end_offsets(parts)
        committed = await admin.list_consumer_group_offsets(group)
        # the ingest hop commits in a group of its own when it runs in its own process
        hop = await admin.list_consumer_group_offsets(ingest_group(group))
        committed.update({tp: at for tp, at in hop.items() if tp.topic == FOLLOWED[0]})
        behind = {
            f"{tp.topic}:{tp.partition}": ends[tp]
            - (committed[tp].offset if tp in committed else 0)
            for tp in parts
        }
        return {where: n for where, n in behind.items() if n}
    finally:
        await consumer.stop()
        await admin.close()


@dataclass
class Life:
    """One start of the worker and how it ended."""

    plan: str
    code: int | None = None
    by_itself: bool = False
    seconds: float = 0.0


@dataclass
class Projection:
    events: list[tuple[Any, ...]]
    changes: list[tuple[Any, ...]]
    states: list[tuple[Any, ...]]
    points: dict[str, Any]
    lives: list[Life] = field(default_factory=list)


def rows(up: Mapping[str, Any], query: str) -> list[tuple[Any, ...]]:
    client = http_client(up["http"])
    try:
        return [tuple(r) for r in client.query(query).result_rows]
    finally:
        client.close()


def read_history(up: Mapping[str, Any]) -> tuple[list[Any], list[Any], list[Any]]:
    return (
        # payload is sealed (a fresh nonce and key per run): the clear body is compared
        rows(up, "SELECT * EXCEPT (payload) FROM events FINAL ORDER BY agent_id, seq"),
        rows(up, "SELECT * FROM memory_changes FINAL ORDER BY agent_id, seq, idx"),
        # the state without its log positions: a crash mid-forward on the ingest hop
        # publishes some events to engram.events twice (the fold drops the copies), so
        # the offsets an agent's state was last folded at may differ; the memory may not
        rows(
            up,
            "SELECT agent_id, seq, JSONExtractRaw(state, 'memory') FROM agent_states FINAL"
            " ORDER BY agent_id",
        ),
    )


def read_points(home: Path) -> dict[str, Any]:
    """Every point of the live vector collection: payload, dense and sparse vectors
    (read from the Edge shard once the worker is stopped)."""
    (root,) = [p.parent for p in (home / "vectors").glob("*/live.json")]
    version = json.loads((root / "live.json").read_text())["version"]
    shard = qe.EdgeShard.load(str(root / f"memories_v{version}"))
    try:
        found: dict[str, Any] = {}
        offset = None
        while True:
            request = qe.ScrollRequest(
                offset=offset, limit=1000, with_payload=True, with_vector=True
            )
            records, offset = shard.scroll(request)
            for r in records:
                found[str(r.id)] = (dict(r.payload or {}), vectors_of(r.vector))
            if offset is None:
                return found
    finally:
        shard.close()


def vectors_of(vector: Any) -> Any:
    if isinstance(vector, dict):
        return {k: vectors_of(v) for k, v in sorted(vector.items())}
    if hasattr(vector, "indices"):
        return (list(vector.indices), list(vector.values))
    return list(vector) if vector is not None else None


def archived(up: Mapping[str, Any]) -> int:
    """Events in the stack's archive (-1 when it does not answer: it died)."""
    try:
        return int(rows(up, "SELECT count() FROM events")[0][0])
    except Exception:  # a killed worker's endpoint is gone
        return -1


def start(home: Path, env: Mapping[str, str]) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    return launch(home, env, timeout=180)


def kill_life(
    home: Path, bootstrap: str, plan: str, chunk: Sequence[Event], wait: float = 60.0
) -> Life:
    """Start the worker with ``plan`` (``point:n`` or ``random:seconds``), publish
    ``chunk`` (in two halves: the second once the worker has archived some of the first,
    or a second after it when nothing is archived yet), and end the worker by SIGKILL:
    its own at the fault point, or ours at the random moment (or when the point is not
    reached within ``wait`` s)."""
    kind, _, arg = plan.rpartition(":")
    extra = {"ENGRAM_CRASH_AT": plan} if kind in POINTS else {}
    begun = time.monotonic()
    process, up = start(home, worker_env(home, bootstrap, extra))
    life = Life(plan)
    try:
        # in two parts, the second once the worker is folding the first, so it flushes
        # more than once even when one batch could take the whole chunk (a plan may name
        # the n-th passage); a worker still joining its group would take both at once
        half = len(chunk) // 2
        before = archived(up)
        asyncio.run(create_and_publish(bootstrap, chunk[:half]))
        folding = time.monotonic() + 60.0
        while process.poll() is None and time.monotonic() < folding:
            time.sleep(0.2)
            if archived(up) > before:
                break
        asyncio.run(create_and_publish(bootstrap, chunk[half:]))
        if process.poll() is None:
            time.sleep(1.0)
        deadline = time.monotonic() + (float(arg) if kind == "random" else wait)
        while time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        life.by_itself = process.poll() is not None
    finally:
        life.code = stop(process, signal.SIGKILL)
    life.seconds = time.monotonic() - begun
    return life


def caught_up(bootstrap: str, timeout: float = 300.0) -> None:
    """Return once the group has committed every record of the pipeline's topics."""
    deadline = time.monotonic() + timeout
    while (left := asyncio.run(lag(bootstrap))) != 0:
        if time.monotonic() > deadline:
            where = asyncio.run(_lag(bootstrap, GROUP))
            raise TimeoutError(
                f"the workers still lag {left} records after {timeout:.0f}s: {where}"
            )
        time.sleep(1.0)


def settle(home: Path, bootstrap: str, chunk: Sequence[Event] = ()) -> Projection:
    """Start the worker without faults, publish ``chunk``, wait until the group has
    committed every record, read the history, stop it and read the vectors."""
    process, up = start(home, worker_env(home, bootstrap))
    try:
        asyncio.run(create_and_publish(bootstrap, chunk))
        caught_up(bootstrap)
        events, changes, states = read_history(up)
    finally:
        code = stop(process)
    if code != 0:
        raise RuntimeError(f"engram up exited with {code}; see {home / 'up.log'}")
    return Projection(events, changes, states, read_points(home))


def chunks(events: Sequence[Event], count: int) -> list[Sequence[Event]]:
    """``events`` cut in ``count`` consecutive runs of about the same length."""
    bounds = [len(events) * i // count for i in range(count + 1)]
    return [events[a:b] for a, b in itertools.pairwise(bounds)]


def run(directory: Path, events: Sequence[Event], plans: Sequence[str]) -> Projection:
    """On a fresh Apache Kafka under ``directory``: live the ``plans`` (each ending in
    SIGKILL) with a share of ``events`` published at the start of each life, then
    settle on the last share and read the projections. Without plans, the
    uninterrupted run: one life, every event."""
    home = directory / "home"
    shares = chunks(events, len(plans) + 1)
    with ApacheKafka(directory / "kafka") as kafka:
        lives = [
            kill_life(home, kafka.bootstrap, p, c) for p, c in zip(plans, shares, strict=False)
        ]
        projection = settle(home, kafka.bootstrap, shares[-1])
    projection.lives = lives
    return projection


def run_pair(directory: Path, events: Sequence[Event], plan: str) -> Projection:
    """Two workers in one consumer group, each ``engram up`` with a home of its own
    (chdb and Qdrant Edge are single-process). ``a`` folds the first half of the
    history alone and stops; then ``a`` starts with the fault ``plan`` and ``b`` joins
    (a rebalance), the second half is published, ``a`` dies at the point (``b`` takes
    every partition) and starts again (a third rebalance). The history is the union of
    the two homes' tables (agent states: the latest per agent); vectors are not
    compared, each home holding only the points of the partitions its worker had."""
    half = len(events) // 2
    with ApacheKafka(directory / "kafka") as kafka:
        bootstrap = kafka.bootstrap
        asyncio.run(create_and_publish(bootstrap, events[:half]))
        a_home, b_home = directory / "a", directory / "b"
        a, _ = start(a_home, worker_env(a_home, bootstrap))
        caught_up(bootstrap)
        if (code := stop(a)) != 0:
            raise RuntimeError(f"engram up exited with {code}; see {a_home / 'up.log'}")
        begun = time.monotonic()
        a, _ = start(a_home, worker_env(a_home, bootstrap, {"ENGRAM_CRASH_AT": plan}))
        # one deployment, one master key: b unwraps the data keys a made
        shared = {"ENGRAM_MASTER_KEY_FILE": str(a_home / "master.key")}
        b, b_up = start(b_home, worker_env(b_home, bootstrap, shared))
        life = Life(plan)
        try:
            asyncio.run(create_and_publish(bootstrap, events[half:]))
            deadline = time.monotonic() + 120
            while a.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            life.by_itself = a.poll() is not None
            life.code = stop(a, signal.SIGKILL)
            life.seconds = time.monotonic() - begun
            a, a_up = start(a_home, worker_env(a_home, bootstrap))
            caught_up(bootstrap)
            histories = [read_history(a_up), read_history(b_up)]
        finally:
            codes = stop(a), stop(b)
    if codes != (0, 0):
        raise RuntimeError(f"the workers exited with {codes}; see {directory}/*/up.log")
    events_rows = sorted({row for h in histories for row in h[0]})
    changes_rows = sorted({row for h in histories for row in h[1]})
    latest: dict[str, tuple[Any, ...]] = {}
    for row in sorted((row for h in histories for row in h[2]), key=lambda r: r[1]):
        latest[row[0]] = row
    states = [latest[agent] for agent in sorted(latest)]
    return Projection(events_rows, changes_rows, states, {}, [life])


def kill_plans(points: int, seed: int = 0) -> list[str]:
    """``points`` plans: a random moment 10 s in (so the group has committed an offset
    on every partition: see ``FIRST``), then each fault point in turn at its 1st to
    3rd passage (``embed.published``: the 1st), every third plan a random moment 2 to
    12 s after the start."""
    rng = random.Random(seed)
    plans = [FIRST]
    for i in range(points - 1):
        if i % 3 == 2:
            plans.append(f"random:{rng.uniform(2.0, 12.0):.1f}")
        else:
            point = POINTS[(i - i // 3) % len(POINTS)]
            plans.append(f"{point}:{1 if point == 'embed.published' else rng.randint(1, 3)}")
    return plans


@dataclass
class Comparison:
    published: int
    lost: set[str]
    duplicated: int
    differences: list[str]


def compare(
    reference: Projection, crashed: Projection, published: Sequence[Event], *, vectors: bool = True
) -> Comparison:
    """Lost: published event ids missing from the crashed run's ``events``; duplicated:
    events applied twice (an id under two sequence numbers, or a sequence with a
    repeat); differences: projections that are not identical to the reference."""
    ids = {str(e.event_id) for e in published}
    seen = [str(row[2]) for row in crashed.events]
    lost = ids - set(seen)
    duplicated = len(seen) - len(set(seen))
    for agent in {row[0] for row in crashed.events}:
        seqs = [row[1] for row in crashed.events if row[0] == agent]
        duplicated += len(seqs) - len(set(seqs))
    differences = [
        name
        for name, a, b in (
            ("events", reference.events, crashed.events),
            ("memory_changes", reference.changes, crashed.changes),
            ("agent_states", reference.states, crashed.states),
            ("vector points", reference.points, crashed.points),
        )
        if a != b and (vectors or name != "vector points")
    ]
    return Comparison(len(ids), lost, duplicated, differences)


def main(argv: Sequence[str] | None = None) -> int:
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m ops.crash", description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=20, help="SIGKILLs in the crashed run")
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", type=Path, default=None, help="keep the runs here")
    parser.add_argument("--plans", default="", help="point:n or random:s, comma-separated")
    parser.add_argument("--log-level", default="WARNING", help="the workers' ENGRAM_LOG_LEVEL")
    parser.add_argument("--pair", default="", help="point:n: two workers instead, see run_pair")
    args = parser.parse_args(argv)
    WORKER_ENV["ENGRAM_LOG_LEVEL"] = args.log_level
    root = args.dir or Path(tempfile.mkdtemp(prefix="engram-crash-"))
    events = history(args.events)
    plans = args.plans.split(",") if args.plans else kill_plans(args.points, args.seed)
    started = time.monotonic()
    reference = run(root / "reference", events, [])
    if args.pair:
        plans = [args.pair]
        crashed = run_pair(root / "pair", events, args.pair)
    else:
        crashed = run(root / "crashed", events, plans)
    result = compare(reference, crashed, events, vectors=not args.pair)
    for life in crashed.lives:
        how = "killed itself at the point" if life.by_itself else "killed by us"
        print(f"  {life.plan:<22} {how:<28} exit {life.code}  ({life.seconds:.1f}s)")
    reached = sum(1 for life in crashed.lives if life.by_itself or life.plan.startswith("random"))
    print(f"events published:     {result.published} ({len(reference.events)} applied)")
    print(f"memory changes:       {len(reference.changes)}; vector points: {len(reference.points)}")
    print(f"kill points tried:    {len(plans)} ({reached} hit as planned)")
    print(f"events lost:          {len(result.lost)}")
    print(f"events duplicated:    {result.duplicated}")
    print(f"projections differing from the uninterrupted run: {result.differences or 'none'}")
    print(f"time: {time.monotonic() - started:.0f}s; runs kept in {root}")
    return 0 if not (result.lost or result.duplicated or result.differences) else 1


if __name__ == "__main__":
    sys.exit(main())
