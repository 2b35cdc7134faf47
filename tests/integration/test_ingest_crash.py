"""A crash of the ingest hop between sealing a batch and committing it (kill -9 at
``ingest.published``): the next life seals again at most that one batch, which the
fold's per-agent window of event ids covers, so nothing is folded twice and nothing
is lost. One agent, more events than the window: before the hop committed each batch
at once, a crash sealed again everything since faust's last periodic commit (more
than a window's worth here), and the copies beyond the window were folded twice.

Its own Tansu broker: the worker's topics and group must start empty."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from ops.broker import EmbeddedBroker
from ops.crash import (
    GROUP,
    PARTITIONS,
    archived,
    create_and_publish,
    history,
    read_history,
    start,
    worker_env,
)
from ops.launch import stop
from ops.topics import read_to_end
from processors import MemoryConfig

pytestmark = pytest.mark.integration

WINDOW = MemoryConfig().dedupe_window
EVENTS = history(3 * WINDOW, agents=1)


async def sealed_and_committed(bootstrap: str) -> tuple[int, int]:
    """Records on ``engram.events`` (read, not told: Tansu's end offsets can stop at
    the last batch's first record), and the group's committed offsets of
    ``engram.ingest``, summed over the partitions."""
    sealed = await read_to_end(bootstrap, "engram.events", lambda _: None)
    # the group's consumer, never subscribed: it reads the group's offsets, joins nothing
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=GROUP)
    await consumer.start()
    try:
        ingest = [TopicPartition("engram.ingest", p) for p in range(PARTITIONS)]
        committed = sum([await consumer.committed(tp) or 0 for tp in ingest])
        return sealed, committed
    finally:
        await consumer.stop()


@pytest.mark.timeout(300)
def test_a_crash_between_sealing_and_committing_folds_no_event_twice(tmp_path: Path) -> None:
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        home = tmp_path / "home"
        # every event waits on engram.ingest before the worker starts: full batches
        asyncio.run(create_and_publish(broker.bootstrap, EVENTS))
        # killed with the batch that takes the sealed records past one window
        crash = {"ENGRAM_CRASH_AT": f"ingest.published:{WINDOW + 1}", "ENGRAM_BATCH_SIZE": "1000"}
        process, _ = start(home, worker_env(home, broker.bootstrap, crash))
        deadline = time.monotonic() + 120
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        code = stop(process, signal.SIGKILL)
        assert code == -9, "the worker never sealed more than a window of records"

        sealed, committed = asyncio.run(sealed_and_committed(broker.bootstrap))
        assert WINDOW < sealed < len(EVENTS), f"{sealed} sealed: the crash came too late"
        assert committed > 0, "no batch's offsets were committed before the crash"
        assert sealed - committed <= WINDOW, "the next life seals again more than one window"

        process, up = start(home, worker_env(home, broker.bootstrap))
        try:
            deadline = time.monotonic() + 120
            while archived(up) < len(EVENTS) and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(3.0)  # a copy folded twice would come right after its original
            events, _, _ = read_history(up)
        finally:
            assert stop(process) == 0
    ids = [str(row[2]) for row in events]
    seqs = [row[1] for row in events]
    assert sorted(ids) == sorted(str(e.event_id) for e in EVENTS)  # none lost, none twice
    assert seqs == list(range(len(EVENTS)))  # one agent: every sequence once, in order
