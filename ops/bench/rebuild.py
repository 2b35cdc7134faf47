"""Rebuild benchmark: the rebuild engine of ``engram rebuild`` (:mod:`ops.rebuild`)
on real parts it starts itself: the embedded broker (Tansu), chdb in a temp dir,
Qdrant Edge in a temp dir.

1. ClickHouse: N derived events on a topic (what the fold derives from a seeded
   workload of turns, sessions, facts, recalls and ticks, spread over more agents
   by renaming them), rebuilt into a new ``memory_changes`` version and swapped in.
   Figure: derived events read and written per second.
2. Vectors: P memories on a topic as ``memory.created`` + ``memory.embedded`` (a
   recorded vector: no model is called), rebuilt into a new Edge version and
   swapped in. Figure: points per second.

The records are sealed under per-subject keys on a key topic, as the stack's derived
log is by default, and the rebuild opens them with a keyring read from that topic,
as ``engram rebuild`` does; ``--clear`` writes them in clear Avro (``ENGRAM_SEAL=off``).

References in the same run, on the same records: a plain aiokafka consumer reading
every record (the floor of reading the log); ``Codec.decode`` alone; the rebuild's
bytes-to-rows road alone (:func:`ops.rebuild.change_rows`); Edge upserting
the rebuilt points alone; the BM25 term weights of the memory texts alone (the
projection computes them from the text, as the live one does). Run:
``python -m ops.bench.rebuild --events 1000000 --points 100000``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import secrets
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import clickhouse_connect
import numpy as np
from aiokafka import AIOKafkaProducer

from ops.bench.common import compiled, machine
from ops.bench.processors import rich_workload
from ops.broker import EmbeddedBroker
from ops.rebuild import (
    ClickHouseProjection,
    LogReader,
    Progress,
    VectorProjection,
    change_rows,
    rebuild,
)
from ops.topics import COMPACTED, KEEP_FOREVER, TopicSpec, ensure_topics, read_to_end
from processors import AgentMemory, AgentState, MemoryConfig
from processors.recall import document_sparse
from schemas import Codec, DerivedEvent, Event, MemoryCreated, MemoryEmbedded
from schemas.sealed import SealingCodec
from sinks.clickhouse import ClickHouseHistory
from sinks.keys import BlockingKeyring, KafkaKeyring, MasterKey, OpenEvent
from sinks.vectors import EdgeIndex, Point
from streams.vectors import document_terms

CHANGES_TOPIC = "bench.memory.changes"
VECTORS_TOPIC = "bench.memory.vectors"
KEYS_TOPIC = "bench.keys"

Encode = Callable[[list[Event]], list[bytes]]
"""Bytes of events, in order, as the bench writes them (sealed or clear)."""


class Keys:
    """The bench's keys: a master key and the key topic on the bench's broker, or none
    (``--clear``). :meth:`encode` writes events as the fold would, :meth:`opener` reads
    them back as ``engram rebuild`` does."""

    def __init__(self, bootstrap: str, sealed: bool) -> None:
        self.bootstrap = bootstrap
        self.master = MasterKey(secrets.token_bytes(32)) if sealed else None

    def encode(self, events: list[Event]) -> list[bytes]:
        """Sealed bytes (their new data keys written to the key topic first) or clear."""
        if self.master is None:
            codec = Codec()
            return [codec.encode(event) for event in events]
        return asyncio.run(self._sealed(events, self.master))

    async def _sealed(self, events: list[Event], master: MasterKey) -> list[bytes]:
        ring = KafkaKeyring(self.bootstrap, KEYS_TOPIC, master)
        await ring.start()
        try:
            codec = SealingCodec(ring, remember=False)
            out = [codec.encode(event) for event in events]
            await ring.flush()
            return out
        finally:
            await ring.stop()

    @contextmanager
    def opener(self) -> Iterator[OpenEvent | None]:
        """What the stack hands a rebuild: a keyring read from the topic, or None."""
        if self.master is None:
            yield None
            return
        keys = BlockingKeyring(self.bootstrap, KEYS_TOPIC, self.master)
        try:
            yield keys.opener()
        finally:
            keys.close()


MODEL = "bench-model"


def fold(raw_events: int, agents: int) -> list[DerivedEvent]:
    """The derived events of a seeded workload, folded by the real processors."""
    config, memories = MemoryConfig(), dict[str, AgentMemory]()
    derived: list[DerivedEvent] = []
    for event in rich_workload(raw_events, agents):
        memory = memories.get(event.agent_id)
        if memory is None:
            memory = memories[event.agent_id] = AgentMemory(
                AgentState(agent_id=event.agent_id), config
            )
        derived.extend(memory.apply(event).derived)
    return derived


def encoded_changes(
    n: int, template: list[DerivedEvent], encode: Encode
) -> list[tuple[bytes, bytes]]:
    """``n`` (key, value) records: copies of ``template`` under renamed agents."""
    events = list[Event]()
    copy = 0
    while len(events) < n:
        for event in template:
            agent = f"{event.agent_id}-c{copy}"
            events.append(
                event.model_copy(
                    update={"agent_id": agent, "event_id": uuid.uuid5(event.event_id, agent)}
                )
            )
            if len(events) == n:
                break
        copy += 1
    values = encode(events)
    return [(e.agent_id.encode(), v) for e, v in zip(events, values, strict=True)]


def encoded_vectors(
    points: int, dims: int, template: list[MemoryCreated], encode: Encode, *, terms: bool = True
) -> list[tuple[bytes, bytes]]:
    """``points`` memories: each a ``memory.created`` and its ``memory.embedded``, with
    the BM25 weights of the text recorded beside the vector as the embedding agent
    records them (v2), or, without ``terms``, none (the rebuild computes them, as for
    vectors recorded before version 2)."""
    rng, events = np.random.default_rng(7), list[Event]()
    for i in range(points):
        base = template[i % len(template)]
        agent = f"{base.agent_id}-c{i // len(template)}"
        memory_id = str(uuid.uuid5(base.event_id, agent))
        body = base.body.model_copy(update={"memory_id": memory_id})
        created = base.model_copy(
            update={"agent_id": agent, "event_id": uuid.uuid5(base.event_id, agent), "body": body}
        )
        vector = rng.standard_normal(dims).astype(np.float32)
        embedded = MemoryEmbedded(
            event_id=uuid.uuid5(created.event_id, "embedded"),
            agent_id=agent,
            session_id=created.session_id,
            user_id=created.user_id,
            occurred_at=created.occurred_at,
            source_event_id=created.event_id,
            seq=created.seq,
            idx=created.idx,
            config_version=created.config_version,
            schema_version=2 if terms else 1,
            body={
                "memory_id": memory_id,
                "model": MODEL,
                "model_version": "1",
                "dims": dims,
                "terms": document_terms(created.body.text) if terms else None,
                "vector": [float(x) for x in vector / np.linalg.norm(vector)],
            },
        )
        events += [created, embedded]
    values = encode(events)
    return [(e.agent_id.encode(), v) for e, v in zip(events, values, strict=True)]


async def publish(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> float:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=20, max_batch_size=1024 * 1024
    )
    await producer.start()
    started = time.perf_counter()
    try:
        pending = []
        for key, value in records:
            pending.append(await producer.send(topic, key=key, value=value))
            if len(pending) >= 20_000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return time.perf_counter() - started


async def raw_consume(bootstrap: str, topic: str, n: int) -> float:
    """Seconds for a plain aiokafka consumer to read ``n`` records of ``topic``."""
    started = time.perf_counter()
    await read_to_end(bootstrap, topic, lambda _: None, stop_after=n)
    return time.perf_counter() - started


def timed_rebuild(
    projection: Any, bootstrap: str, topic: str, open_event: OpenEvent | None
) -> tuple[float, float, Progress]:
    """Wall seconds, CPU seconds of this process (every thread: the reader, chdb's and
    the writers') and the progress of one rebuild of ``topic`` (``open_event`` opens
    sealed records)."""
    progress = Progress(
        "clickhouse" if isinstance(projection, ClickHouseProjection) else "vectors", False
    )
    started, cpu = time.perf_counter(), time.process_time()
    status = asyncio.run(
        rebuild(projection, LogReader(bootstrap, topic), progress, open_event=open_event)
    )
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu
    if status.state != "done":
        raise RuntimeError(f"rebuild ended {status.state}: {status.error}")
    return elapsed, cpu, progress


def bench_clickhouse(
    bootstrap: str, home: Path, n: int, template: list[DerivedEvent], keys: Keys
) -> dict[str, Any]:
    records = encoded_changes(n, template, keys.encode)
    publish_s = asyncio.run(publish(bootstrap, CHANGES_TOPIC, records))
    client = clickhouse_connect.get_client(dsn=f"chdb://{home / 'clickhouse'}")
    history = ClickHouseHistory(client)
    history.ensure_schema()
    with keys.opener() as open_event:
        elapsed, cpu, progress = timed_rebuild(
            ClickHouseProjection(history, settle_s=0), bootstrap, CHANGES_TOPIC, open_event
        )
        sample = [value for _, value in records[:20_000]]
        started = time.perf_counter()
        change_rows(Codec(), sample, open_event)
        rows_s = (time.perf_counter() - started) / len(sample) * n
    rows = int(client.query("SELECT count() FROM memory_changes").result_rows[0][0])
    live = history.live_version()
    client.close()
    consume_s = asyncio.run(raw_consume(bootstrap, CHANGES_TOPIC, n))
    return {
        "derived_events": n,
        "sealed": keys.master is not None,
        "avg_event_bytes": round(sum(len(v) for _, v in records) / n),
        "publish_s": round(publish_s, 1),
        "rebuild_s": round(elapsed, 2),
        "rebuild_events_per_s": round(n / elapsed),
        "rebuild_cpu_us_per_event": round(cpu / n * 1e6, 1),
        "raw_consume_per_s": round(n / consume_s),
        "ratio_to_raw_consume": round(consume_s / elapsed, 4),
        "change_rows_alone_per_s": round(n / rows_s),
        "rows_in_rebuilt_table": rows,
        "live_version": live,
        "applied": progress.applied,
    }


def bench_vectors(
    bootstrap: str,
    home: Path,
    points: int,
    dims: int,
    template: list[MemoryCreated],
    keys: Keys,
    *,
    terms: bool = True,
) -> dict[str, Any]:
    records = encoded_vectors(points, dims, template, keys.encode, terms=terms)
    publish_s = asyncio.run(publish(bootstrap, VECTORS_TOPIC, records))
    index = EdgeIndex(home / "vectors")
    index.ensure(dims)
    try:
        cpu, projection = cpu_times(), TimedVectors(index, MODEL)
        with keys.opener() as open_event:
            elapsed, _, _ = timed_rebuild(projection, bootstrap, VECTORS_TOPIC, open_event)
        fixed_s = sum(projection.fixed.values())
        own_s, children_s = (after - before for after, before in zip(cpu_times(), cpu, strict=True))
        rebuilt = index.points()
        live = index.live_version()
        store_s = upsert_floor(index, rebuilt)
    finally:
        index.close()
    consume_s = asyncio.run(raw_consume(bootstrap, VECTORS_TOPIC, len(records)))
    texts = [str(p.payload["text"]) for p in rebuilt[:2000]]
    started = time.perf_counter()
    for text in texts:
        document_sparse(text)
    terms_s = (time.perf_counter() - started) / len(texts) * points
    return {
        "points": points,
        "sealed": keys.master is not None,
        "dims": dims,
        "recorded_terms": terms,
        "records": len(records),
        "publish_s": round(publish_s, 1),
        "rebuild_s": round(elapsed, 2),
        "rebuild_points_per_s": round(points / elapsed),
        "fixed_s": {step: round(took, 2) for step, took in projection.fixed.items()},
        "copy_points_per_s": round(points / (elapsed - fixed_s)),
        "rebuild_records_per_s": round(len(records) / elapsed),
        "rebuild_cpu_us_per_point": round(own_s / points * 1e6, 1),
        "writer_process_cpu_us_per_point": round(children_s / points * 1e6, 1),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "raw_consume_records_per_s": round(len(records) / consume_s),
        "ratio_to_raw_consume": round(consume_s / elapsed, 4),
        "edge_upsert_alone_points_per_s": round(points / store_s),
        "bm25_terms_alone_points_per_s": round(points / terms_s),
        "avg_text_chars": round(sum(map(len, texts)) / len(texts)),
        "points_in_rebuilt_version": len(rebuilt),
        "live_version": live,
    }


class TimedVectors(VectorProjection):
    """The vector projection, timing the steps whose cost does not grow with the log:
    ``prepare`` (a new Edge version, its payload indexes, the writer process),
    ``complete`` (the version taken back from it) and ``finish`` (the previous version
    dropped). The rest of the rebuild is the copy."""

    def __init__(self, index: EdgeIndex, model: str) -> None:
        super().__init__(index, model)
        self.fixed: dict[str, float] = {}

    async def prepare(self, progress: Progress) -> None:
        started = time.perf_counter()
        await super().prepare(progress)
        self.fixed["prepare"] = time.perf_counter() - started

    async def complete(self, progress: Progress) -> None:
        started = time.perf_counter()
        await super().complete(progress)
        self.fixed["complete"] = time.perf_counter() - started

    async def finish(self, progress: Progress) -> None:
        started = time.perf_counter()
        await super().finish(progress)
        self.fixed["finish"] = time.perf_counter() - started


def cpu_times() -> tuple[float, float]:
    """CPU seconds (user + system) of this process and of its children that ended (the
    rebuild's Edge writer process ends before the swap; the broker runs on)."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def upsert_floor(index: EdgeIndex, points: list[Point]) -> float:
    """Seconds to upsert the same points, whole, into a fresh version in batches of
    2 500: what Edge itself costs, without reading, decoding or tokenising."""
    twin = index.pinned(index.create_version())
    started = time.perf_counter()
    for at in range(0, len(points), 2500):
        twin.upsert(points[at : at + 2500])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=200_000, help="derived events (ClickHouse)")
    parser.add_argument("--points", type=int, default=50_000, help="memories (vectors)")
    parser.add_argument("--dims", type=int, default=512)
    parser.add_argument("--raw", type=int, default=20_000, help="raw events folded as the template")
    parser.add_argument("--skip", choices=("clickhouse", "vectors"), default=None)
    parser.add_argument(
        "--no-terms",
        action="store_true",
        help="vectors recorded without BM25 weights (as before memory.embedded v2)",
    )
    parser.add_argument(
        "--clear",
        action="store_true",
        help="records in clear Avro (ENGRAM_SEAL=off) instead of sealed, the default",
    )
    args = parser.parse_args()
    random.seed(0)
    template = fold(args.raw, 50)
    created = [e for e in template if isinstance(e, MemoryCreated)]
    home = Path(tempfile.mkdtemp(prefix="engram-bench-rebuild-"))
    result: dict[str, Any] = {"machine": machine(), "compiled": compiled()}
    try:
        with EmbeddedBroker(log_path=home / "broker.log") as broker:
            specs = [
                TopicSpec(CHANGES_TOPIC, 6, KEEP_FOREVER),
                TopicSpec(VECTORS_TOPIC, 6, KEEP_FOREVER),
                TopicSpec(KEYS_TOPIC, 1, COMPACTED),
            ]
            asyncio.run(ensure_topics(broker.bootstrap, specs))
            keys = Keys(broker.bootstrap, sealed=not args.clear)
            if args.skip != "clickhouse":
                result["clickhouse"] = bench_clickhouse(
                    broker.bootstrap, home, args.events, template, keys
                )
                print(json.dumps(result["clickhouse"]), flush=True)
            if args.skip != "vectors":
                result["vectors"] = bench_vectors(
                    broker.bootstrap,
                    home,
                    args.points,
                    args.dims,
                    created,
                    keys,
                    terms=not args.no_terms,
                )
    finally:
        shutil.rmtree(home, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
