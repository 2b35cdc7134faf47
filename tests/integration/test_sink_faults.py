"""Sink faults (issue 6, item 4): ClickHouse and the vector store go down under a
running ``engram up`` (``ENGRAM_FAULT=flags``, its own embedded Tansu broker). The
worker retries in place and commits nothing it has not written: the lag shows in
``GET /v1/status`` for as long as the outage lasts, and when the stores come back the
worker recovers by itself to projections equal to an uninterrupted run's (the pure
fold of the same events): every event once, every memory change, every vector point.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from ops.bench.outage import (
    committed,
    complete,
    count,
    expected,
    history,
    lag,
    publish,
    set_fault,
    settled,
    status,
    wait_for,
)
from ops.crash import read_points
from schemas.sealed import SealingCodec
from streams.vectors import VECTOR_TYPES
from tests.support import Stack, engram_cmd, start_stack

pytestmark = pytest.mark.integration
OUTAGE_S = 8.0


@pytest.fixture
def faulty(tmp_path: Path) -> Iterator[Stack]:
    """``engram up`` whose stores fail while a flag file under its home says so."""
    stack = start_stack(tmp_path / "home", 120.0, ENGRAM_FAULT="flags")
    try:
        yield stack
    finally:
        code = stack.stop()
    assert code == 0, f"engram up exited with {code}; see {stack.home / 'up.log'}"


def partitions_committed(answer: dict[str, Any], topic: str) -> dict[int, int]:
    """Per partition of ``topic``, the group's committed offset (none: 0)."""
    return {
        int(p["partition"]): int(p["committed"] or 0) for p in answer["lag"] if p["topic"] == topic
    }


def kinds_between(bootstrap: str, start: dict[int, int], end: dict[int, int]) -> list[str]:
    """The types of the ``engram.memory`` records from ``start`` up to ``end`` (per
    partition), read from their headers (the sealed envelope)."""
    codec = SealingCodec(None)

    async def read() -> list[str]:
        stops = {
            TopicPartition("engram.memory", p): stop
            for p, stop in end.items()
            if stop > start.get(p, 0)
        }
        if not stops:
            return []
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign(list(stops))
            for tp in stops:
                consumer.seek(tp, start.get(tp.partition, 0))
            kinds: list[str] = []
            deadline = time.monotonic() + 30
            while stops and time.monotonic() < deadline:
                batch = await consumer.getmany(*stops, timeout_ms=1000)
                for tp, records in batch.items():
                    kinds += [
                        codec.kind(r.value or b"") or "?" for r in records if r.offset < stops[tp]
                    ]
                for tp in list(stops):
                    if await consumer.position(tp) >= stops[tp]:
                        del stops[tp]
            return kinds
        finally:
            await consumer.stop()

    return asyncio.run(read())


def test_a_store_outage_stalls_the_line_visibly_and_the_worker_recovers_by_itself(
    faulty: Stack,
) -> None:
    events = history(300, run="sink-faults")
    before, first, then = events[:150], events[150:225], events[225:]
    assert expected(before + first).memories - expected(before).memories, (
        "the events published while only the vector store is down make memories"
    )
    publish(faulty.bootstrap, before)
    wait_for(lambda: complete(faulty.http, expected(before)), 120, "the first catch-up")
    memory_committed_before = partitions_committed(settled(faulty.http), "engram.memory")

    # the vector store goes down first: the fold goes on, and the vector agent stalls
    # at the first memory it cannot project (the fold's first flush with ClickHouse
    # down may hold no memory at all, so that order would show no lag on engram.memory)
    set_fault(faulty.home, "vectors", "down")
    publish(faulty.bootstrap, first)
    wait_for(
        lambda: count(faulty.http, "SELECT count() FROM events") == len(before) + len(first),
        120,
        "the fold's history while only the vector store is down",
    )
    wait_for(
        lambda: lag(status(faulty.http), "engram.memory") > 0,
        60,
        "the vector agent's stall to show as lag on engram.memory",
    )

    set_fault(faulty.home, "clickhouse", "down")
    written_before = count(faulty.http, "SELECT count() FROM events")
    publish(faulty.bootstrap, then)
    ends = time.monotonic() + OUTAGE_S
    seen_events_lag = seen_memory_lag = 0
    memory_committed_during = memory_committed_before
    while time.monotonic() < ends:
        answer = status(faulty.http)
        written = count(faulty.http, "SELECT count() FROM events")
        assert written == written_before, "nothing reaches ClickHouse while it is down"
        assert committed(answer, "engram.events") <= written, "an offset committed unwritten"
        memory_committed_during = partitions_committed(answer, "engram.memory")
        seen_events_lag = max(seen_events_lag, lag(answer, "engram.events"))
        seen_memory_lag = max(seen_memory_lag, lag(answer, "engram.memory"))
        time.sleep(0.5)
    # derived records may be committed past only where the vector agent had nothing to
    # write (a working-memory update)
    passed = kinds_between(faulty.bootstrap, memory_committed_before, memory_committed_during)
    assert not set(passed) & VECTOR_TYPES, f"committed past unprojected records: {passed}"
    assert seen_events_lag > 0, "the fold's stall shows as lag on engram.events"
    assert seen_memory_lag > 0, "the vector agent's stall still shows as lag on engram.memory"
    shown = subprocess.run(
        engram_cmd("status", "--json"), env=faulty.env, capture_output=True, timeout=60, check=True
    )
    assert json.loads(shown.stdout)["total_lag"] > 0, "`engram status` shows it too"

    set_fault(faulty.home, "clickhouse", None)
    set_fault(faulty.home, "vectors", None)
    want = expected(events)
    wait_for(lambda: complete(faulty.http, want), 120, "recovery after the outage")
    ids = [str(r[0]) for r in faulty.rows("SELECT event_id FROM events")]
    changes = [str(r[0]) for r in faulty.rows("SELECT event_id FROM memory_changes")]
    assert sorted(ids) == sorted(want.events), "every event once, none twice"
    assert sorted(changes) == sorted(want.changes), "every memory change once"
    assert faulty.stop() == 0
    assert set(read_points(faulty.home)) == want.memories, "every memory is a vector point"


def test_a_slow_store_loses_nothing(faulty: Stack) -> None:
    events = history(120, run="slow-sink")
    set_fault(faulty.home, "clickhouse", "slow:1.5")
    set_fault(faulty.home, "vectors", "slow:1.5")
    publish(faulty.bootstrap, events)
    want = expected(events)
    wait_for(lambda: complete(faulty.http, want), 180, "a complete projection through slow stores")
    ids = [str(r[0]) for r in faulty.rows("SELECT event_id FROM events")]
    assert sorted(ids) == sorted(want.events)
    set_fault(faulty.home, "clickhouse", None)
    set_fault(faulty.home, "vectors", None)
    assert faulty.stop() == 0
    assert set(read_points(faulty.home)) == want.memories
