"""A crash of the ingest hop between sealing a batch and committing it (kill -9 at
``ingest.published``): the next life seals again at most that one batch, which the
fold's per-agent window of event ids covers, so nothing is folded twice and nothing
is lost. One agent, more events than the window: before the hop committed each batch
at once, a crash sealed again everything since faust's last periodic commit (more
than a window's worth here), and the copies beyond the window were folded twice.

The hop runs in the worker (``ENGRAM_INGEST_PROCESS=off``: the whole stack dies) or in
its own process (the default: the stack starts it again, and it dies with the stack).

Its own Tansu broker: the worker's topics and group must start empty."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from ops.bench.common import children
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
from ops.ingest_child import MODULE, ingest_group
from ops.launch import stop
from ops.topics import read_to_end
from processors import MemoryConfig

pytestmark = pytest.mark.integration

WINDOW = MemoryConfig().dedupe_window
EVENTS = history(3 * WINDOW, agents=1)
IN_WORKER = {"ENGRAM_INGEST_PROCESS": "off"}


async def sealed_and_committed(bootstrap: str) -> tuple[int, int]:
    """Records on ``engram.events`` (read, not told: Tansu's end offsets can stop at
    the last batch's first record), and the group's committed offsets of
    ``engram.ingest``, summed over the partitions."""
    sealed = await read_to_end(bootstrap, "engram.events", lambda _: None)
    return sealed, await committed_ingest(bootstrap, GROUP)


async def committed_ingest(bootstrap: str, group: str) -> int:
    """``group``'s committed offsets of ``engram.ingest``, summed over the partitions."""
    # the group's consumer, never subscribed: it reads the group's offsets, joins nothing
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await consumer.start()
    try:
        ingest = [TopicPartition("engram.ingest", p) for p in range(PARTITIONS)]
        return sum([await consumer.committed(tp) or 0 for tp in ingest])
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
        process, _ = start(home, worker_env(home, broker.bootstrap, IN_WORKER | crash))
        deadline = time.monotonic() + 120
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        code = stop(process, signal.SIGKILL)
        assert code == -9, "the worker never sealed more than a window of records"

        sealed, committed = asyncio.run(sealed_and_committed(broker.bootstrap))
        assert WINDOW < sealed < len(EVENTS), f"{sealed} sealed: the crash came too late"
        assert committed > 0, "no batch's offsets were committed before the crash"
        assert sealed - committed <= WINDOW, "the next life seals again more than one window"

        process, up = start(home, worker_env(home, broker.bootstrap, IN_WORKER))
        try:
            events = archive_all(up, 120)
        finally:
            assert stop(process) == 0
    folded_once(events)


def archive_all(up: dict[str, Any], timeout: float) -> list[Any]:
    """The archive's rows once it holds as many events as :data:`EVENTS` (or after
    ``timeout`` s), and a while more: a copy folded twice comes right after its original."""
    deadline = time.monotonic() + timeout
    while archived(up) < len(EVENTS) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(3.0)
    events, _, _ = read_history(up)
    return events


def folded_once(events: list[Any]) -> None:
    """The archive holds every event of :data:`EVENTS` once, in its order."""
    ids = [str(row[2]) for row in events]
    assert sorted(ids) == sorted(str(e.event_id) for e in EVENTS)  # none lost, none twice
    assert [row[1] for row in events] == list(range(len(EVENTS)))


def ingest_children(stack: subprocess.Popen[bytes]) -> list[int]:
    return children(stack.pid, MODULE)


@pytest.mark.timeout(300)
def test_an_ingest_process_killed_between_sealing_and_committing_is_started_again(
    tmp_path: Path,
) -> None:
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        home = tmp_path / "home"
        asyncio.run(create_and_publish(broker.bootstrap, EVENTS))
        # every life of the child is killed with the batch that takes it past a window:
        # 3 windows of events in batches of (at most) a window take several lives
        crash = {"ENGRAM_CRASH_AT": f"ingest.published:{WINDOW + 1}", "ENGRAM_BATCH_SIZE": "1000"}
        process, up = start(home, worker_env(home, broker.bootstrap, crash))
        try:
            # the last life commits every record (the one before it may have sealed them
            # all, then died, and the stack waits out a back-off before starting it)
            deadline = time.monotonic() + 180
            hop = ingest_group(GROUP)
            while asyncio.run(committed_ingest(broker.bootstrap, hop)) < len(EVENTS):
                assert time.monotonic() < deadline, "the ingest process never caught up"
                time.sleep(0.5)
            events = archive_all(up, 60)
            assert process.poll() is None, "the stack died with its ingest process"
            restarts = (home / "up.log").read_text().count("ingest process exited with -9")
            assert restarts >= 1, "the ingest process was never killed"
            (child,) = ingest_children(process)
        finally:
            code = stop(process, signal.SIGKILL)
        assert code == -9
        deadline = time.monotonic() + 10  # and the child dies with the stack
        while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{child}").exists(), "the ingest process outlived its stack"
    folded_once(events)
