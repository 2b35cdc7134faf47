"""The faust worker's run loop and keys, shared by the stack (:mod:`ops.stack`) and
its ingest process (:mod:`ops.ingest_child`), without the stack's heavier imports (the
HTTP API, the vector stores): the ingest process starts in about half the time."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from typing import TYPE_CHECKING

import faust
import uvloop
from mode import Worker

from engram.settings import Settings
from ops.diagnose import log_awaits, log_consumer_state
from schemas.sealed import SealingCodec
from sinks.keys import KafkaKeyring
from streams.app import Topics, create_app, create_topics
from streams.ingest import WorkerKeys

if TYPE_CHECKING:
    from ops.reprocess import WorkerControl


def worker_app(
    settings: Settings,
    bootstrap: str,
    *,
    app_id: str,
    datadir: str,
    memory_topic: str,
    ingest: bool,
) -> tuple[faust.App, Topics]:
    """A faust app of ``settings``' broker, partitions, group timeouts and fetch wait
    (group ``app_id``, files under ``$ENGRAM_HOME/<datadir>``), with the pipeline's
    topics declared (``engram.ingest`` only with ``ingest``)."""
    session_timeout, rebalance_timeout = settings.group_timeouts()
    app = create_app(
        app_id=app_id,
        bootstrap=bootstrap,
        partitions=settings.partitions,
        session_timeout_s=session_timeout,
        rebalance_timeout_s=rebalance_timeout,
        fetch_max_wait_ms=settings.fetch_wait_ms,
        datadir=settings.home / datadir,
    )
    topics = create_topics(
        app,
        events=settings.events_topic,
        memory=memory_topic,
        dead_letters=settings.dlq_topic,
        ingest=settings.ingest_topic if ingest else None,
    )
    return app, topics


def worker_keys(settings: Settings, bootstrap: str) -> tuple[WorkerKeys, SealingCodec]:
    """Keys of a worker's own (a keyring on the key topic, when sealing is on; it starts
    in the loop that first uses it) and the sealing codec over them."""
    master = settings.master_key()
    ring = (
        KafkaKeyring(bootstrap, settings.keys_topic, master, settings.key_archive())
        if master is not None
        else None
    )
    return WorkerKeys(ring), SealingCodec(ring, max_bytes=settings.max_event_bytes)


SHUTDOWN_SETTLE_S = 1.0
"""How long a stopped worker waits for the tasks it cancelled to end before it closes
its loop (they end within a few iterations of it)."""


class StackWorker(Worker):
    """mode's worker, whose SIGUSR1 also logs the consumer's state per partition
    (after mode's own dump of every task's stack), and whose loop closes as soon as the
    tasks left once the app has stopped are cancelled and ended."""

    def _on_sigusr1(self) -> None:
        super()._on_sigusr1()
        for app in self.services:
            if isinstance(app, faust.App):
                log_consumer_state(app)
        log_awaits()

    def _gather_all(self) -> None:
        """Cancel the tasks left on the loop once the app has stopped, and wait until
        they have ended (at most :data:`SHUTDOWN_SETTLE_S`). mode waits a second for
        them to end by themselves first, but those left are aiokafka's background
        routines (metadata, fetch and send loops, connection readers), which end only
        when cancelled: each stop waited the whole second, then mode's sentinel one more
        (see :meth:`_sentinel_task`), in the stack and again in its ingest process."""
        left = list(asyncio.all_tasks(loop=self.loop))
        for task in left:
            task.cancel()
        if left:
            ended = asyncio.wait(left, timeout=SHUTDOWN_SETTLE_S)
            self.loop.run_until_complete(ended)

    async def _sentinel_task(self) -> None:
        """What the loop runs last before it closes (mode sleeps a second): a few of
        its iterations, for the callbacks the cancelled tasks scheduled as they ended."""
        for _ in range(10):
            await asyncio.sleep(0)


GC_SWEEP_S = 60.0
"""How often the worker's garbage collector looks for cycles, in seconds.

The worker holds a large heap that lives for seconds to hours (the fold's state,
events on their way to a flush, caches), and Python's collector, driven by counts of
allocations, went over it again and again: with thresholds (50 000, 20, 100) and the
heap frozen at start, about 50 young and 2 middle passes per 100 000 events, ~2 s of
the worker's ~19 s (``ops/bench/ingest.py``, BENCHMARKS.md). Yet almost nothing the
worker drops is a cycle (it is freed at once by its reference count): about 1 600
objects of cyclic garbage, ~130 KB, per 50 000 events, once the history's inserts
stopped leaving theirs (:meth:`sinks.clickhouse.ClickHouseHistory.insert`). So the
automatic collector is off, and one full pass runs every ``GC_SWEEP_S`` instead:
cyclic garbage waits at most that long."""

_swept: list[threading.Thread] = []


def tune_gc(sweep_s: float = GC_SWEEP_S) -> None:
    """Move what the process holds at start (modules, the app) out of the collector's
    reach (``gc.freeze``), turn the automatic collector off and collect cycles every
    ``sweep_s`` seconds on a daemon thread instead (:data:`GC_SWEEP_S`; one thread per
    process, however often this is called)."""
    gc.collect()
    gc.freeze()
    gc.disable()
    if not _swept:
        sweeper = threading.Thread(target=_sweep, args=(sweep_s,), name="engram-gc", daemon=True)
        _swept.append(sweeper)
        sweeper.start()


def _sweep(every_s: float) -> None:
    while True:
        time.sleep(every_s)
        gc.collect()


def run_worker(
    app: faust.App, log_level: str = "WARNING", control: WorkerControl | None = None
) -> int:
    """Run the faust worker in the foreground until SIGINT/SIGTERM (or until
    ``control`` stops it for a reprocess's swap)."""
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    tune_gc()
    worker = StackWorker(app, loglevel=log_level, quiet=True, redirect_stdouts=False)
    if control is not None:
        control.attach(worker, loop)
    try:
        worker.execute_from_commandline()
    except SystemExit as stop:
        return int(stop.code or 0)
    return 0
