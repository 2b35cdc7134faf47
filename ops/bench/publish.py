"""Publishing benchmark: what ``Memory.publish_many`` costs the client, in direct mode.

Starts the embedded broker (Tansu) on a free port, creates ``engram.ingest`` and
publishes N ``interaction.recorded`` events (100 agents, ~284 bytes, as the ingest
bench's) with engram's client, as a client without a master key does (clear Avro to
``engram.ingest``; the worker seals them). Reported: events/s until every one is
acknowledged, and the client process's CPU time per event (it shares the machine with
the broker). Reference in the same run, on a topic of its own: the same events
encoded and sent by a plain aiokafka producer one ``send`` each, as the client wrote
them before it wrote record batches (:func:`streams.logwriter.write_records`).

Run: ``python -m ops.bench.publish --events 100000``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from aiokafka import AIOKafkaProducer

from engram import Memory
from engram.settings import Settings
from ops.bench.common import cpu_seconds, machine
from ops.bench.ingest import make_events
from ops.broker import EmbeddedBroker
from ops.topics import KEEP_FOREVER, SHORT_LIVED, TopicSpec, ensure_topics
from schemas import Codec, InteractionRecorded


def timed(work: Callable[[], None]) -> tuple[float, float]:
    """Wall seconds and this process's CPU seconds of ``work()``."""
    me = os.getpid()
    cpu, wall = cpu_seconds(me), time.perf_counter()
    work()
    return time.perf_counter() - wall, cpu_seconds(me) - cpu


async def send_each(bootstrap: str, topic: str, events: list[InteractionRecorded]) -> None:
    """The reference: each event encoded, then one ``send`` each (``acks=all``, keyed
    by agent, at its time), then wait for them all: the client before record batches."""
    codec = Codec()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic,
                key=e.agent_id.encode(),
                value=codec.encode(e),
                timestamp_ms=int(e.occurred_at.timestamp() * 1000),
            )
            for e in events
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def run(n: int, agents: int, chunk: int) -> dict[str, object]:
    events = make_events(n, agents)
    size = sum(len(Codec().encode(e)) for e in events[:1000]) / min(n, 1000)
    with tempfile.TemporaryDirectory(prefix="engram-bench-") as home:
        broker = EmbeddedBroker(log_path=Path(home) / "broker.log")
        bootstrap = broker.start()
        try:
            settings = Settings.from_env({"ENGRAM_HOME": home})
            reference = "bench.publish.reference"
            asyncio.run(
                ensure_topics(
                    bootstrap,
                    [
                        TopicSpec(settings.ingest_topic, 6, SHORT_LIVED),
                        TopicSpec(reference, 6, KEEP_FOREVER),
                    ],
                )
            )
            with Memory(bootstrap=bootstrap, settings=settings) as memory:
                memory.publish_many(events[:100])  # connected before the clock starts

                def publish_all() -> None:
                    for at in range(100, n, chunk):
                        memory.publish_many(events[at : at + chunk])

                client_s, client_cpu = timed(publish_all)
            each_s, each_cpu = timed(lambda: asyncio.run(send_each(bootstrap, reference, events)))
        finally:
            broker.stop()
    published = n - 100
    return {
        "events": published,
        "agents": agents,
        "chunk": chunk,
        "avg_event_bytes": round(size),
        "client_per_s": round(published / client_s),
        "client_cpu_us_per_event": round(client_cpu / published * 1e6, 1),
        "reference_send_each_per_s": round(n / each_s),
        "reference_send_each_cpu_us_per_event": round(each_cpu / n * 1e6, 1),
        "machine": machine(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument(
        "--chunk", type=int, default=5_000, help="events per publish_many call (default 5000)"
    )
    args = parser.parse_args()
    if args.events <= 100:
        parser.error("--events must be more than 100 (the first 100 connect the client)")
    if args.agents < 1 or args.chunk < 1:
        parser.error("--agents and --chunk must be at least 1")
    print(json.dumps(run(args.events, args.agents, args.chunk), indent=2))


if __name__ == "__main__":
    main()
