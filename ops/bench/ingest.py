"""End-to-end ingest benchmark: N interaction events published to the embedded
stack, timed until ClickHouse holds all of them and their memory changes.

Beside it, in the same run and on the same topic, the references: the raw
aiokafka consume rate (the physical floor of reading the log) and the codec's
decode rate. Run: ``python -m ops.bench.ingest --events 100000``. After that figure,
``embedded_s``: until every memory the events made has its embedding (the vectors'
side, which the end-to-end time does not include), with the CPU each process used
until then; ``--no-vectors`` skips that wait (the raw consume reference is then read
while the embedding child may still be at work).

Sealing (issue 7): each mode runs on a fresh stack, one after the other in the same run.
``sealed`` publishes clear events to ``engram.ingest`` as a client without a master
key does (the worker seals them onto ``engram.events``, the fold opens them and seals
what it derives); ``clear`` is the same path with ``ENGRAM_SEAL=off`` (the ingest agent
forwards clear bytes), so the two differ by the cryptography alone; ``direct`` is the
path before sealing: clear events straight to ``engram.events``, no ingest hop.
``--seal`` runs ``sealed`` only, ``--no-seal`` ``clear`` only; the default runs
``sealed,clear`` (``--repeat N`` rounds, alternated) and reports the overhead of the
medians. Also the seal and open rates of one process.

``--texts rich`` draws a text for each event (:data:`TEXTS`); the default repeats one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta

from aiokafka import AIOKafkaConsumer, TopicPartition

from ops.bench.common import (
    BenchStack,
    children,
    compiled,
    cpu_seconds,
    machine,
    peak_rss_mib,
    start_stack,
    wait_embedded,
)
from ops.bench.processors import rich_text
from schemas import Codec, InteractionBody, InteractionRecorded
from schemas.sealed import SealingCodec, subject_of
from sinks.keys import KeyBook
from streams.logwriter import LogWriter, Record

CONTENT = (
    "The user asked to move the Thursday review to Friday afternoon and to invite the "
    "design team; 用户希望把周四的评审改到周五下午。"
)

CHUNK = 5_000
"""Records the bench hands its producer at a time."""


TEXTS = ("repeated", "rich")
"""What the events say: ``repeated``, :data:`CONTENT` every time (the scorer and the
summariser answer from their memos after the first); ``rich``, a text drawn for each
event (seeded) as the processors bench's rich workload draws its turns
(:func:`ops.bench.processors.rich_text`: one to four of 38 English and Chinese
sentences, now and then a long text), so the fold reads most texts anew (a one-sentence
text recurs)."""


def make_events(n: int, agents: int, texts: str = "repeated") -> list[InteractionRecorded]:
    """``n`` interaction events spread over ``agents`` agents, a millisecond apart,
    saying what ``texts`` (:data:`TEXTS`) says."""
    if texts not in TEXTS:
        raise ValueError(f"texts must be one of {TEXTS}, not {texts!r}")
    rng = random.Random(0)
    start = datetime(2026, 11, 1, tzinfo=UTC)
    return [
        InteractionRecorded(
            event_id=uuid.uuid4(),
            agent_id=f"bench-agent-{i % agents:04d}",
            session_id=f"bench-agent-{i % agents:04d}-s{i // (agents * 50)}",
            user_id=f"user-{i % agents:04d}",
            occurred_at=start + timedelta(milliseconds=i),
            body=InteractionBody(
                role="user" if i % 2 else "assistant",
                content=CONTENT if texts == "repeated" else rich_text(rng),
            ),
        )
        for i in range(n)
    ]


def make_payloads(n: int, agents: int, texts: str = "repeated") -> list[tuple[bytes, bytes]]:
    """(key, Avro bytes) of :func:`make_events`."""
    codec = Codec()
    return [(e.agent_id.encode(), codec.encode(e)) for e in make_events(n, agents, texts)]


MODES: dict[str, tuple[str, dict[str, str]]] = {
    "sealed": ("engram.ingest", {}),
    "clear": ("engram.ingest", {"ENGRAM_SEAL": "off"}),
    "direct": ("engram.events", {"ENGRAM_SEAL": "off"}),
}
"""Mode -> (the topic the bench publishes to, the stack's environment)."""


def mode_of(mode: str) -> tuple[str, dict[str, str]]:
    """The topic and stack environment of ``mode``: a name of :data:`MODES`, optionally
    followed by ``:KEY=VALUE`` settings for the stack (``direct:ENGRAM_EMBED_PROCESS=off``),
    so one run can alternate variants of a mode."""
    name, *settings = mode.split(":")
    if name not in MODES:
        raise SystemExit(f"unknown mode {name!r}; known: {', '.join(MODES)}")
    topic, env = MODES[name]
    extra = dict(pair.split("=", 1) for pair in settings if "=" in pair)
    if len(extra) != len(settings):
        raise SystemExit(f"mode {mode!r}: settings are KEY=VALUE, after a colon")
    return topic, {**env, **extra}


async def publish(bootstrap: str, payloads: list[tuple[bytes, bytes]], topic: str) -> float:
    """Seconds to write ``payloads`` to ``topic`` and have every one acknowledged: a
    plain aiokafka producer (``acks=all``) writing record batches per partition, the
    key's partition as Kafka's default partitioner gives it, :data:`CHUNK` records at
    a time, as engram's client writes (:func:`streams.logwriter.write_records`).
    The bench shares the machine's two cores with the stack: a ``send`` a record cost
    it ~24 µs of CPU a record, the batches ~5 µs."""
    writer = LogWriter(bootstrap)
    await writer.start()
    started = time.perf_counter()
    try:
        for at in range(0, len(payloads), CHUNK):
            await writer.send(topic, [Record(k, v) for k, v in payloads[at : at + CHUNK]])
    finally:
        await writer.stop()
    return time.perf_counter() - started


async def raw_consume(bootstrap: str, n: int) -> float:
    """Seconds for a plain aiokafka consumer to read ``n`` messages of engram.events."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [
            TopicPartition("engram.events", p)
            for p in consumer.partitions_for_topic("engram.events") or ()
        ]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        seen = 0
        started = time.perf_counter()
        while seen < n:
            batch = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            seen += sum(len(records) for records in batch.values())
        return time.perf_counter() - started
    finally:
        await consumer.stop()


def decode_rate(payloads: list[tuple[bytes, bytes]]) -> float:
    codec = Codec()
    sample = [v for _, v in payloads[:20_000]]
    started = time.perf_counter()
    for value in sample:
        codec.decode(value)
    return len(sample) / (time.perf_counter() - started)


def seal_rates(payloads: list[tuple[bytes, bytes]]) -> tuple[float, float]:
    """Events sealed and opened per second by one process (keys in memory)."""
    keys = KeyBook()
    codec = SealingCodec(keys)
    events = [codec.decode(v) for _, v in payloads[:20_000]]
    for event in events:
        keys.keys.setdefault(subject_of(event), {"k": secrets.token_bytes(32)})
    started = time.perf_counter()
    sealed = [codec.encode(e) for e in events]
    sealing = len(events) / (time.perf_counter() - started)
    started = time.perf_counter()
    for raw in sealed:
        codec.open(raw)
    return sealing, len(events) / (time.perf_counter() - started)


def wait_for(
    stack: BenchStack, n: int, timeout: float, timeline: list[list[float]] | None = None
) -> float:
    """Poll until ClickHouse holds ``n`` events and ``n`` memory changes; return the time.
    ``timeline``, when given, gets one sample per poll: seconds since the call, the
    events ClickHouse holds, the worker's CPU seconds since the call."""
    deadline = time.monotonic() + timeout
    began, worker = time.perf_counter(), int(stack.up["pid"])
    cpu_began = cpu_seconds(worker)
    # The count of a table is read from its parts' metadata; the changes' count by type
    # scans, and the poll shares the history's one thread with the fold's writes, so it
    # waits for the cheap count first.
    archived = "SELECT count() FROM events"
    changed = "SELECT count() FROM memory_changes WHERE type = 'working.updated'"
    while time.monotonic() < deadline:
        held = stack.count(archived)
        if timeline is not None:
            at, cpu = time.perf_counter() - began, cpu_seconds(worker) - cpu_began
            timeline.append([round(at, 2), held, round(cpu, 2)])
        if held >= n and stack.count(changed) >= n:
            return time.perf_counter()
        time.sleep(0.25)
    raise TimeoutError(f"ClickHouse did not reach {n} events within {timeout:.0f}s")


def cpu_processes(stack: BenchStack) -> dict[str, int]:
    """The stack's processes whose CPU time the bench reports per event: the worker,
    the broker, the embedding child and the ingest child (when there are)."""
    processes = {"worker": int(stack.up["pid"])}
    if stack.up.get("broker_pid"):
        processes["broker"] = int(stack.up["broker_pid"])
    for i, pid in enumerate(children(stack.up["pid"], "sinks.embed_process")):
        processes[f"embedder{i or ''}"] = pid
    for i, pid in enumerate(children(stack.up["pid"], "ops.ingest_child")):
        processes[f"ingest{i or ''}"] = pid
    return processes


def run(
    n: int,
    agents: int,
    timeout: float,
    mode: str = "direct",
    timeline: bool = False,
    texts: str = "repeated",
    vectors: bool = True,
) -> dict[str, object]:
    payloads = make_payloads(n, agents, texts)
    avg_bytes = sum(len(v) for _, v in payloads) / n
    topic, env = mode_of(mode)
    stack = start_stack(None, 120.0, **env)
    try:
        bootstrap = stack.up["kafka_bootstrap"]
        time.sleep(8)  # let the worker join its group before the clock starts
        processes = cpu_processes(stack)
        cpu_before = {name: cpu_seconds(pid) for name, pid in processes.items()}
        started = time.perf_counter()
        own_before = cpu_seconds(os.getpid())
        publish_s = asyncio.run(publish(bootstrap, payloads, topic))
        publisher_cpu = cpu_seconds(os.getpid()) - own_before
        samples: list[list[float]] | None = [] if timeline else None
        done = wait_for(stack, n, timeout, samples)
        elapsed = done - started
        cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in processes.items()}
        load = os.getloadavg()[0]  # beside the figures: the machine is shared
        # the vectors' side, which end_to_end_s does not wait for: until every memory
        # made has its embedding (the topic is read once a second meanwhile)
        embedded = elapsed + wait_embedded(bootstrap, timeout) if vectors else None
        cpu_embedded = {
            name: cpu_seconds(pid) - cpu_before[name] for name, pid in processes.items()
        }
        final = stack.count("SELECT count() FROM events FINAL")
        rss = peak_rss_mib(stack.up["pid"])
        embedders = children(stack.up["pid"], "sinks.embed_process")
        embedder_rss = sum(peak_rss_mib(pid) for pid in embedders)
        consume_s = asyncio.run(raw_consume(bootstrap, n))
    finally:
        stack.stop()
    return {
        "mode": mode,
        "texts": texts,
        "events": n,
        "agents": agents,
        "avg_event_bytes": round(avg_bytes),
        "publish_s": round(publish_s, 2),
        "publisher_cpu_us_per_event": round(publisher_cpu / n * 1e6, 1),
        "end_to_end_s": round(elapsed, 2),
        "end_to_end_per_s": round(n / elapsed),
        "raw_consume_per_s": round(n / consume_s),
        "ratio_to_raw_consume": round((n / elapsed) / (n / consume_s), 4),
        "decode_per_s": round(decode_rate(payloads)),
        "cpu_us_per_event": {name: round(seconds / n * 1e6, 1) for name, seconds in cpu.items()},
        **(
            {
                "embedded_s": round(embedded, 2),
                "embedded_per_s": round(n / embedded),
                "cpu_us_per_event_until_embedded": {
                    name: round(seconds / n * 1e6, 1) for name, seconds in cpu_embedded.items()
                },
            }
            if embedded is not None
            else {}
        ),
        "load_average_1m": round(load, 2),
        "worker_peak_rss_mib": round(rss),
        "embedding_child_peak_rss_mib": round(embedder_rss) if embedders else None,
        "rows_in_clickhouse": final,
        "machine": machine(),
        "compiled": compiled(),
        **({"timeline": samples} if samples is not None else {}),
    }


def _rate(result: dict[str, object]) -> float:
    rate = result["end_to_end_per_s"]
    assert isinstance(rate, int | float)
    return float(rate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument(
        "--seal",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="only the sealed mode (--no-seal: only clear); default: both, same run",
    )
    parser.add_argument(
        "--modes",
        help="comma-separated modes: sealed, clear, direct; each optionally with"
        " :KEY=VALUE settings of the stack, e.g. direct:ENGRAM_EMBED_PROCESS=off",
    )
    parser.add_argument("--repeat", type=int, default=1, help="rounds of the modes, alternated")
    parser.add_argument(
        "--texts",
        choices=TEXTS,
        default="repeated",
        help="repeated: one text every time (the default, as before); rich: a text drawn"
        " for each event, as the processors bench's rich workload draws its turns",
    )
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="add each run's polls after the publish: [seconds, events in ClickHouse,"
        " worker CPU seconds], to see where in the run the time goes",
    )
    parser.add_argument(
        "--vectors",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after the end-to-end figure, wait until every memory has its embedding"
        " (embedded_s; the default); --no-vectors stops the stack at the end-to-end figure",
    )
    args = parser.parse_args()
    if args.modes:
        modes = args.modes.split(",")
    else:
        modes = {True: ["sealed"], False: ["clear"], None: ["sealed", "clear"]}[args.seal]
    runs = [
        run(args.events, args.agents, args.timeout, m, args.timeline, args.texts, args.vectors)
        for _ in range(args.repeat)
        for m in modes
    ]
    summary: dict[str, object] = {"runs": runs}
    rates = {m: statistics.median([_rate(r) for r in runs if r["mode"] == m]) for m in modes}
    summary["median_per_s"] = rates
    if "sealed" in rates and "clear" in rates:
        summary["sealing_overhead"] = round(1 - rates["sealed"] / rates["clear"], 4)
    seal_per_s, open_per_s = seal_rates(make_payloads(20_000, args.agents, args.texts))
    summary["seal_per_s"], summary["open_per_s"] = round(seal_per_s), round(open_per_s)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
