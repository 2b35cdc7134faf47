"""Time to recover after a sink outage: ``python -m ops.bench.outage --rounds 3``;
broker restarts survived: ``python -m ops.bench.outage --broker-restarts 5``.

Runs ``engram up`` on the embedded stack with ``ENGRAM_FAULT=flags`` (see
``streams.faults``), publishes a bilingual history, and in each round: puts the
ClickHouse history and the vector store down (flag files), publishes more, holds the
outage ``--outage`` seconds (the lag shows in ``GET /v1/status``), then brings the
stores back and times how long the worker takes, by itself, to reach lag 0 with every
event and memory change in ClickHouse. The retries back off up to 2 s
(``streams.retry``), so recovery is bounded by that cap plus the catch-up.

With ``--broker-restarts N`` it runs Apache Kafka (``ops.kafka``) instead: a client
publishes slowly while ``engram up`` folds, the broker is killed with SIGKILL and
started again on the same directory and port N times, then it checks that every
event the client saw acknowledged is in ClickHouse once, and that the memory changes
equal the pure fold's.

The helpers here (a history, the fold's expected projection, status probes, flags)
are shared with ``tests/integration/test_sink_faults.py`` and
``test_broker_faults.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID, uuid5

import httpx

from engram import Memory, make_event
from engram.errors import PublishError
from engram.history import http_client
from ops.bench.common import KEEP_HOMES, BenchStack, machine, start_stack
from ops.kafka import ApacheKafka
from processors import AgentMemory, MemoryConfig
from schemas import Event, MemoryCreated

NAMESPACE = UUID("6f1d2c3b-8a4e-4b5f-9c7d-1e2f3a4b5c6d")
TURNS = (
    ("user", "Book a table for Friday, 周五晚上订个位子。", 7.0),
    ("assistant", "好的。Which restaurant do you prefer?", None),
    ("user", "I am allergic to peanuts, 我对花生过敏，请一定记住！", 9.5),
    ("assistant", "记住了：no peanuts.", None),
)
STORES = ("clickhouse", "vectors")


# -- a history and what it must project to ------------------------------------------


def history(count: int, *, run: str, agents: int = 4, start: datetime | None = None) -> list[Event]:
    """About ``count`` events of ``agents`` agents (sessions of bilingual turns, a fact),
    ids ``uuid5`` of ``run`` and the position; times one second apart from ``start``
    (now by default: fresh events, as live agents publish them)."""
    begin = start or datetime.now(UTC)
    out: list[Event] = []
    session = 0
    while len(out) < count:
        for a in range(agents):
            out += session_events(f"{run}-agent-{a}", session, run, len(out), begin)
        session += 1
    return out


def session_events(
    agent_id: str, session: int, run: str, first: int, begin: datetime
) -> list[Event]:
    specs: list[tuple[str, dict[str, Any]]] = [("session.started", {"task": f"任务 {session}"})]
    for turn, (role, text, importance) in enumerate(TURNS):
        body: dict[str, Any] = {"role": role, "content": f"{text} (#{session}.{turn})"}
        if importance is not None:
            body["importance"] = importance
        specs.append(("interaction.recorded", body))
    specs.append(("fact.asserted", {"namespace": "prefs", "key": f"k{session % 3}", "value": "值"}))
    specs.append(("session.ended", {"reason": "done"}))
    return [
        make_event(
            kind,
            agent_id=agent_id,
            session_id=f"s{session}",
            user_id="user-1",
            occurred_at=begin + timedelta(seconds=first + i),
            event_id=uuid5(NAMESPACE, f"{run}:{first + i}"),
            body=body,
        )
        for i, (kind, body) in enumerate(specs)
    ]


@dataclass(frozen=True)
class Expected:
    """What an uninterrupted run projects: event ids (``events``), derived event ids
    (``memory_changes``) and the ids of the memories created (vector points)."""

    events: set[str]
    changes: set[str]
    memories: set[str]


def expected(events: Sequence[Event]) -> Expected:
    """Fold ``events`` in order with the pure processors (what the worker folds)."""
    folds: dict[str, AgentMemory] = {}
    changes: set[str] = set()
    memories: set[str] = set()
    for event in events:
        fold = folds.setdefault(event.agent_id, AgentMemory.empty(event.agent_id, MemoryConfig()))
        for derived in fold.apply(event).derived:
            changes.add(str(derived.event_id))
            if isinstance(derived, MemoryCreated):
                memories.add(str(derived.body.memory_id))
    return Expected({str(e.event_id) for e in events}, changes, memories)


# -- the stack: publish, faults, status --------------------------------------------


async def apublish(bootstrap: str, events: Sequence[Event], batch: int = 100) -> None:
    async with Memory(bootstrap=bootstrap) as memory:
        for start in range(0, len(events), batch):
            await memory.apublish_many(events[start : start + batch])


def publish(bootstrap: str, events: Sequence[Event]) -> None:
    asyncio.run(apublish(bootstrap, events))


class Publisher(threading.Thread):
    """Publishes ``events`` in batches of 5, 50 ms apart, with a client of the given
    deadline (``Memory(timeout=...)``); keeps the events acknowledged and the errors."""

    def __init__(self, bootstrap: str, events: Sequence[Event], deadline: float) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.events, self.deadline = bootstrap, list(events), deadline
        self.acked: list[Event] = []
        self.errors: list[Exception] = []

    def run(self) -> None:
        asyncio.run(self.publish())

    async def publish(self) -> None:
        async with Memory(bootstrap=self.bootstrap, timeout=self.deadline) as memory:
            for start in range(0, len(self.events), 5):
                batch = self.events[start : start + 5]
                try:
                    await memory.apublish_many(batch)
                    self.acked += batch
                except PublishError as error:
                    self.errors.append(error)
                await asyncio.sleep(0.05)


def set_fault(home: Path, store: str, fault: str | None) -> None:
    """Put ``store`` down (``"down"``) or slow (``"slow:<s>"``), or end it (None), by
    its flag file: the worker must run with ``ENGRAM_FAULT=flags``."""
    flag = home / "faults" / store
    if fault is None:
        flag.unlink(missing_ok=True)
        return
    flag.parent.mkdir(parents=True, exist_ok=True)
    flag.write_text(fault)


def status(http: str) -> dict[str, Any]:
    """``GET /v1/status`` of the running ``engram up``."""
    response = httpx.get(f"{http}/v1/status", timeout=30)
    response.raise_for_status()
    answer: dict[str, Any] = response.json()
    return answer


def lag(answer: dict[str, Any], topic: str) -> int:
    return sum(int(p["lag"]) for p in answer["lag"] if p["topic"] == topic)


def committed(answer: dict[str, Any], topic: str) -> int:
    """Sum over ``topic``'s partitions of the group's committed offsets (none: 0)."""
    return sum(int(p["committed"] or 0) for p in answer["lag"] if p["topic"] == topic)


def count(http: str, query: str) -> int:
    client = http_client(http)
    try:
        return int(client.query(query).result_rows[0][0])
    finally:
        client.close()


def known_status(http: str) -> dict[str, Any] | None:
    """:func:`status`, or None while the broker does not answer it (a 503: the lag is
    unknown, as for a moment after a broker restarts)."""
    try:
        return status(http)
    except httpx.HTTPStatusError as error:
        if error.response.status_code == 503:
            return None
        raise


def complete(http: str, want: Expected) -> bool:
    """Lag 0 on every topic, and every event and memory change in ClickHouse."""
    answer = known_status(http)
    return (
        answer is not None
        and answer["total_lag"] == 0
        and count(http, "SELECT count() FROM events") >= len(want.events)
        and count(http, "SELECT count() FROM memory_changes") >= len(want.changes)
    )


def settled(http: str, quiet: float = 2.0, timeout: float = 120.0) -> dict[str, Any]:
    """The status once the lag is 0 and no committed offset moved for ``quiet`` s
    (twice the worker's commit interval, ``broker_commit_interval`` in
    :func:`streams.app.create_app`: 1 s, not faust's default 2.8 s): commits of what
    was already written have landed."""
    began = time.monotonic()
    last = known_status(http)
    while True:
        time.sleep(quiet)
        now = known_status(http)
        if now is not None and last is not None and now["total_lag"] == 0:
            offsets = [(p["topic"], p["partition"], p["committed"]) for p in now["lag"]]
            if offsets == [(p["topic"], p["partition"], p["committed"]) for p in last["lag"]]:
                return now
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"the committed offsets did not settle within {timeout:.0f}s")
        last = now


def wait_for(check: Callable[[], bool], timeout: float, what: str, every: float = 0.1) -> float:
    """Seconds until ``check()`` holds; TimeoutError naming ``what`` after ``timeout``."""
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s")
        time.sleep(every)
    return time.monotonic() - began


# -- the benchmark -----------------------------------------------------------------


@dataclass
class Round:
    events: int
    peak_lag: int
    recovered_s: float


def outage_round(
    stack: BenchStack, published: list[Event], fresh: list[Event], hold: float
) -> Round:
    """Stores down, ``fresh`` published, ``hold`` s of outage, stores back: the time
    from the stores' return to a complete projection of everything published."""
    http = stack.up["http"]
    for store in STORES:
        set_fault(stack.home, store, "down")
    publish(stack.up["kafka_bootstrap"], fresh)
    published += fresh
    want = expected(published)
    peak = 0
    ends = time.monotonic() + hold
    while time.monotonic() < ends:
        peak = max(peak, status(http)["total_lag"])
        time.sleep(0.5)
    for store in STORES:
        set_fault(stack.home, store, None)
    recovered = wait_for(lambda: complete(http, want), 300, "recovery")
    return Round(len(fresh), peak, recovered)


def ids(http: str, table: str) -> list[str]:
    client = http_client(http)
    try:
        return [str(r[0]) for r in client.query(f"SELECT event_id FROM {table}").result_rows]
    finally:
        client.close()


@dataclass
class BrokerRun:
    restarts: int
    acked: int
    errors: int
    lost: int
    duplicated: int
    changes_equal: bool
    restart_s: list[float]


def broker_restarts(restarts: int, events: int, down: float) -> BrokerRun:
    """Apache Kafka killed and restarted ``restarts`` times under a publishing client
    and a folding ``engram up``; what was acknowledged, lost, applied twice."""
    root = Path(tempfile.mkdtemp(prefix="engram-broker-outage-"))
    try:
        return _broker_restarts(root, restarts, events, down)
    finally:
        if not os.environ.get(KEEP_HOMES):
            shutil.rmtree(root, ignore_errors=True)


def _broker_restarts(root: Path, restarts: int, events: int, down: float) -> BrokerRun:
    history_ = history(events, run="broker-bench")
    with ApacheKafka(root / "kafka") as kafka:
        stack = start_stack(
            root / "home",
            180.0,
            ENGRAM_KAFKA_BOOTSTRAP=kafka.bootstrap,
            ENGRAM_TICK_INTERVAL_S="0",
            ENGRAM_SESSION_TIMEOUT_S="6",
            ENGRAM_REBALANCE_TIMEOUT_S="3",
        )
        http = stack.up["http"]
        try:
            publisher = Publisher(kafka.bootstrap, history_, deadline=60.0)
            publisher.start()
            took = []
            for restart in range(restarts):
                mark = len(history_) * (restart + 1) // (restarts + 1)
                wait_for(lambda: len(publisher.acked) >= mark, 300, "publishing")  # noqa: B023
                kafka.kill()
                time.sleep(down)
                began = time.monotonic()
                kafka.start()  # from the main thread: the broker dies with its starter
                took.append(time.monotonic() - began)
            publisher.join()
            want = expected(publisher.acked)
            wait_for(lambda: complete(http, want), 600, "the worker catching up")
            settled(http)
            seen, changes = ids(http, "events"), ids(http, "memory_changes")
        finally:
            stack.stop()
    return BrokerRun(
        restarts,
        len(publisher.acked),
        len(publisher.errors),
        len(want.events - set(seen)),
        len(seen) - len(set(seen)),
        sorted(changes) == sorted(want.changes),
        took,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.outage", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--events", type=int, default=500, help="published per round")
    parser.add_argument("--outage", type=float, default=10.0, help="seconds each outage lasts")
    parser.add_argument("--broker-restarts", type=int, default=0, help="Apache Kafka mode")
    args = parser.parse_args(argv)
    if args.broker_restarts:
        run = broker_restarts(args.broker_restarts, args.events, down=3.0)
        print(machine())
        print(run)
        good = run.lost == run.duplicated == run.errors == 0 and run.changes_equal
        print(
            f"broker restarts survived: {run.restarts if good else 0}/{run.restarts}"
            f" ({run.acked} events acknowledged, {run.lost} lost, {run.duplicated} twice)"
        )
        return 0 if good else 1
    stack = start_stack(ENGRAM_FAULT="flags", ENGRAM_TICK_INTERVAL_S="0")
    try:
        events = history(args.events * (args.rounds + 1), run="outage-bench")
        published = events[: args.events]
        publish(stack.up["kafka_bootstrap"], published)
        wait_for(lambda: complete(stack.up["http"], expected(published)), 300, "first catch-up")
        rounds = []
        for r in range(args.rounds):
            fresh = events[args.events * (r + 1) : args.events * (r + 2)]
            rounds.append(outage_round(stack, published, fresh, args.outage))
            print(f"round {r + 1}: {rounds[-1]}", flush=True)
    finally:
        stack.stop()
    times = [r.recovered_s for r in rounds]
    print(machine())
    print(
        f"sink outage of {args.outage:.0f}s (ClickHouse and vectors down), {args.events} events"
        f" published during it: recovered to lag 0 in median {statistics.median(times):.2f}s,"
        f" max {max(times):.2f}s over {len(times)} rounds"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
