"""Time to erase one user: the worker's side of an erasure, stage by stage, on the real
stores (chdb, Qdrant Edge) in a temp directory.

The history: ``--agents`` agents, each with the erased user and ``--others`` other
users taking turns; the erased user has ``--events`` events in all (turns, some of
them important, session ends, facts, persona updates), so about one memory per ten
events. Everything is folded by the processors and written as the worker writes it
(raw events, memory changes, a checkpoint per agent); the memories are projected to
an Edge index (random dense vectors, real BM25 terms). Then the erasure, timed:

* ``fold``: every agent's pure purge (``subject.erasure_requested`` -> ``subject.erased``);
* ``clickhouse``: :meth:`ClickHouseHistory.write_sync` of the erasures and the new
  checkpoints, which purges (lightweight DELETEs, shared documents rewritten) and
  writes the receipts;
* ``vectors``: :meth:`VectorIndex.erase` per agent.

Not included: destroying the data keys (one write to ``engram.keys`` per key, on the
broker) and the time the request waits in the log.

Run: ``python -m ops.bench.erasure --events 10000 --agents 5`` (``--json`` for JSON).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import clickhouse_connect

from ops.bench.common import machine
from processors import AgentMemory, MemoryConfig
from processors.recall import document_sparse
from schemas import (
    Codec,
    DerivedEvent,
    Event,
    FactAsserted,
    InteractionRecorded,
    MemoryCreated,
    PersonaUpdated,
    SessionEnded,
    SubjectErased,
    SubjectErasureRequested,
)
from sinks.clickhouse import Checkpoint, ClickHouseHistory, SequencedEvent
from sinks.vectors import EdgeIndex, Point, SparseVector

START = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
GONE = "erased-user"
DIMS = 64


def events_of(agent: str, user: str, count: int, rng: random.Random) -> Iterator[Event]:
    """``count`` events of ``user`` with ``agent``: turns (about 7 % important) in
    sessions of twenty, facts and persona updates now and then."""
    for i in range(count):
        common: dict[str, Any] = {
            "event_id": uuid.uuid4(),
            "agent_id": agent,
            "session_id": f"{agent}-{user}-{i // 20}",
            "user_id": user,
            "occurred_at": START + timedelta(seconds=20 * i),
        }
        roll = rng.random()
        if i % 20 == 19:
            yield SessionEnded(**common)
        elif roll < 0.02:
            fact = {"namespace": f"user:{user}", "key": f"k{i % 7}", "value": f"{user} {i}"}
            yield FactAsserted(**common, body=fact)
        elif roll < 0.025:
            yield PersonaUpdated(**common, body={"preferences": {user: f"likes {i}"}})
        else:
            importance = 9.0 if roll > 0.93 else 4.0
            text = f"{user} says {i}: 我想去京都看樱花 and book a ryokan #{rng.randrange(10**6)}"
            body: dict[str, Any] = {"role": "user", "content": text, "importance": importance}
            yield InteractionRecorded(**common, body=body)


def interleaved(agent: str, users: list[str], per_user: int, seed: int) -> list[Event]:
    rng = random.Random(seed)
    streams = [list(events_of(agent, u, per_user, rng)) for u in users]
    merged = [e for group in zip(*streams, strict=True) for e in group]
    return sorted(merged, key=lambda e: e.occurred_at)


def write(
    history: ClickHouseHistory, memory: AgentMemory, events: list[Event]
) -> list[DerivedEvent]:
    """Fold ``events`` and write them as the worker does; return the derived events."""
    codec = Codec()
    sequenced: list[SequencedEvent] = []
    derived: list[DerivedEvent] = []
    for event in events:
        step = memory.apply(event)
        if step.seq is not None:
            sequenced.append(SequencedEvent(event, step.seq, codec.encode(event)))
            derived += step.derived
    for start in range(0, len(sequenced), 5000):
        history.write_sync(sequenced[start : start + 5000], [])
    for start in range(0, len(derived), 5000):
        history.write_sync([], derived[start : start + 5000])
    state = memory.state().model_dump_json().encode()
    history.write_sync([], [], [Checkpoint(memory.agent_id, memory.seq, state)])
    return derived


def project(index: EdgeIndex, derived: list[DerivedEvent], rng: random.Random) -> int:
    points = []
    for e in derived:
        if isinstance(e, MemoryCreated):
            indices, values = document_sparse(e.body.text)
            dense = [rng.random() for _ in range(DIMS)]
            payload = {"agent_id": e.agent_id, "user_id": e.user_id, "text": e.body.text}
            points.append(Point(e.body.memory_id, dense, SparseVector(indices, values), payload))
    for start in range(0, len(points), 512):
        index.upsert(points[start : start + 512])
    return len(points)


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    history = ClickHouseHistory(clickhouse_connect.get_client(dsn=f"chdb://{work / 'ch'}"))
    history.ensure_schema()
    index = EdgeIndex(work / "vectors")
    index.ensure(DIMS)
    rng = random.Random(args.seed)
    config = MemoryConfig()
    per_agent = args.events // args.agents
    users = [GONE, *(f"user-{i}" for i in range(args.others))]
    memories: dict[str, AgentMemory] = {}
    gone_memories = 0
    for a in range(args.agents):
        agent = f"agent-{a}"
        memory = memories[agent] = AgentMemory.empty(agent, config)
        derived = write(history, memory, interleaved(agent, users, per_agent, args.seed + a))
        project(index, derived, rng)
        gone_memories += sum(1 for m in memory.state().memories if m.user_id == GONE)
    request_id = uuid.uuid4()
    at = START + timedelta(days=30)

    started = time.perf_counter()
    erased: list[SubjectErased] = []
    for agent, memory in memories.items():
        request = SubjectErasureRequested(
            event_id=request_id, agent_id=agent, occurred_at=at, body={"subject": GONE}
        )
        [change] = memory.apply(request).derived
        assert isinstance(change, SubjectErased)
        erased.append(change)
    fold_s = time.perf_counter() - started

    states = [
        Checkpoint(a, m.seq, m.state().model_dump_json().encode()) for a, m in memories.items()
    ]
    started = time.perf_counter()
    history.write_sync([], erased, states)
    clickhouse_s = time.perf_counter() - started

    started = time.perf_counter()
    points = sum(index.erase(agent, GONE) for agent in memories)
    vectors_s = time.perf_counter() - started
    index.close()

    receipts = history.erasures()
    rows = sum(sum(r.rows.values()) for r in receipts)
    return {
        "events_of_user": per_agent * args.agents,
        "events_total": per_agent * args.agents * len(users),
        "memories_of_user": gone_memories,
        "agents": args.agents,
        "fold_s": round(fold_s, 3),
        "clickhouse_s": round(clickhouse_s, 3),
        "vectors_s": round(vectors_s, 3),
        "total_s": round(fold_s + clickhouse_s + vectors_s, 3),
        "rows_deleted_or_rewritten": rows,
        "points_deleted": points,
        "machine": machine(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=10_000, help="events of the erased user")
    parser.add_argument("--agents", type=int, default=5)
    parser.add_argument("--others", type=int, default=2, help="other users per agent")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="engram-bench-erasure-"))
    try:
        report = run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for key, value in report.items():
        print(f"{key:>26}: {value}")


if __name__ == "__main__":
    main()
