"""The framework floor: how fast one faust agent takes N messages off the embedded
broker with an empty body (``take_events`` batches of 1 000, uvloop), beside the raw
aiokafka consume rate of the same topic in the same run.

Also the same agent behind the worker's consumer (``streams.app.Transport``), which
hands each fetched batch over in one task. Run: ``python -m ops.bench.faust_floor
--events 100000``. Whatever engram does per event is paid on top of this floor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import faust
import uvloop
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from mode import Worker

from ops.bench.common import machine
from ops.broker import EmbeddedBroker
from ops.topics import TopicSpec, ensure_topics
from streams.app import Transport

TOPIC = "bench.floor"


async def fill(bootstrap: str, n: int) -> None:
    await ensure_topics(bootstrap, [TopicSpec(TOPIC, 6, {})])
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        value = b"x" * 280
        futures = [
            await producer.send(TOPIC, key=b"k%d" % (i % 100), value=value) for i in range(n)
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def raw_consume(bootstrap: str, n: int) -> float:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        await consumer.topics()
        tps = [TopicPartition(TOPIC, p) for p in consumer.partitions_for_topic(TOPIC) or ()]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        seen, started = 0, time.perf_counter()
        while seen < n:
            batch = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            seen += sum(len(records) for records in batch.values())
        return time.perf_counter() - started
    finally:
        await consumer.stop()


def faust_consume(bootstrap: str, n: int, *, engram_consumer: bool) -> float:
    """Seconds from the first batch to the n-th message in one faust agent, read by
    faust's own consumer or (``engram_consumer``) by the worker's (``streams.app``:
    one hand-over task per fetched batch)."""
    datadir = Path(tempfile.mkdtemp(prefix="engram-faust-floor-"))
    app = faust.App(
        "bench-floor-engram" if engram_consumer else "bench-floor",
        broker=f"kafka://{bootstrap}",
        datadir=str(datadir),
        store="memory://",
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=6,
        broker_heartbeat_interval=1,
        broker_rebalance_timeout=2,
    )
    if engram_consumer:
        app.transport = Transport(app.conf.broker_consumer, app, fetch_max_wait_ms=1500)
    topic = app.topic(
        TOPIC, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
    )
    seen = [0]
    times: list[float] = []
    done = threading.Event()

    @app.agent(topic)
    async def take(stream: faust.StreamT[bytes]) -> None:
        async for batch in stream.take_events(1000, within=0.2):  # type: ignore[attr-defined]
            if not times:
                times.append(time.perf_counter())
            seen[0] += len(batch)
            if seen[0] >= n and not done.is_set():
                times.append(time.perf_counter())
                done.set()
                os.kill(os.getpid(), 15)

    asyncio.set_event_loop(uvloop.new_event_loop())
    with contextlib.suppress(SystemExit):  # the worker exits when the agent signals it
        Worker(app, loglevel="ERROR", quiet=True, redirect_stdouts=False).execute_from_commandline()
    shutil.rmtree(datadir, ignore_errors=True)
    if len(times) < 2:
        raise RuntimeError("faust did not take every message")
    return times[1] - times[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=100_000)
    n = parser.parse_args().events
    with EmbeddedBroker() as broker:
        asyncio.run(fill(broker.bootstrap, n))
        raw = asyncio.run(raw_consume(broker.bootstrap, n))
        floor = faust_consume(broker.bootstrap, n, engram_consumer=False)
        engram = faust_consume(broker.bootstrap, n, engram_consumer=True)
    print(
        json.dumps(
            {
                "events": n,
                "raw_aiokafka_per_s": round(n / raw),
                "faust_take_events_per_s": round(n / floor),
                "engram_consumer_take_events_per_s": round(n / engram),
                "machine": machine(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
