"""Vector store figures behind ``sinks.vectors``: upserts per second in batches
(dense + sparse + full payload) and filtered top-10 latency (p50/p95) of dense and
sparse search, for Qdrant Edge before and after ``optimize()`` (plus the optimize
and reopen times), and for qdrant-client local mode at a smaller size.

Run: ``python -m ops.bench.vectors --points 50000 --dims 512`` (``--json`` for JSON).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from qdrant_client import QdrantClient
from rich.console import Console
from rich.table import Table

from ops.bench.common import machine
from sinks.vectors import ClientIndex, EdgeIndex, Point, Scope, SparseVector, VectorIndex

VOCABULARY = 50_000
TEXTS = (
    "I want to visit Kyoto in April for the cherry blossoms.",
    "我对花生过敏，一定要记住！",
    "Sure, I'll look for a ryokan near Gion with vegetarian meals.",
    "今天天气不错，我们下午去散步吧。",
)


@dataclass(frozen=True)
class Row:
    store: str
    points: int
    phase: str
    upserts_per_s: float | None
    dense_p50_ms: float
    dense_p95_ms: float
    sparse_p50_ms: float
    sparse_p95_ms: float
    mean_hits: float
    seconds: float | None = None
    seconds_for: str = ""


@dataclass(frozen=True)
class Query:
    dense: list[float]
    sparse: SparseVector
    scope: Scope


def terms(rng: np.random.Generator, low: int, high: int) -> SparseVector:
    """Zipf-distributed term ids (a few common, many rare) with term counts 1–3."""
    ids = np.unique((rng.zipf(1.3, size=int(rng.integers(low, high))) - 1) % VOCABULARY)
    counts = rng.integers(1, 4, size=len(ids)).astype(float)
    return SparseVector([int(i) for i in ids], counts.tolist())


def payload(i: int, agents: int, rng: np.random.Generator) -> dict[str, Any]:
    at = 1_790_000_000_000 + i * 1_000
    return {
        "agent_id": f"agent-{i % agents}",
        "user_id": f"user-{i % 7}",
        "session_id": f"s{i // 64}",
        "layer": "L3" if i % 10 == 0 else "L2",
        "kind": "episode",
        "importance": float(rng.uniform(1, 10)),
        "sentiment": float(rng.uniform(-1, 1)),
        "strength": 1.0,
        "reinforcements": int(rng.integers(0, 5)),
        "last_reinforced_at": at,
        "created_at": at,
        "forgotten": i % 20 == 0,
        "invalidated": i % 97 == 0,
        "promoted": i % 10 == 0,
        "text": TEXTS[i % len(TEXTS)],
        "sources": [f"{i:032x}"],
    }


def batches(points: int, dims: int, agents: int, size: int, seed: int) -> Iterator[list[Point]]:
    """Deterministic points, made a batch at a time (50k x 512 floats as lists won't fit)."""
    for start in range(0, points, size):
        rng = np.random.default_rng([seed, start])
        count = min(size, points - start)
        dense = rng.standard_normal((count, dims), dtype=np.float32).tolist()
        yield [
            Point(
                f"{seed:08x}-0000-4000-8000-{start + j:012x}",
                dense[j],
                terms(rng, 6, 24),
                payload(start + j, agents, rng),
            )
            for j in range(count)
        ]


def queries(count: int, dims: int, agents: int, seed: int) -> list[Query]:
    rng = np.random.default_rng([seed, 1 << 40])
    return [
        Query(
            rng.standard_normal(dims, dtype=np.float32).tolist(),
            terms(rng, 3, 7),
            Scope(f"agent-{int(rng.integers(agents))}"),
        )
        for _ in range(count)
    ]


def load(index: VectorIndex, args: argparse.Namespace, points: int) -> float:
    """Upserts per second, timing only the ``upsert`` calls."""
    spent = 0.0
    for batch in batches(points, args.dims, args.agents, args.batch, args.seed):
        started = time.perf_counter()
        index.upsert(batch)
        spent += time.perf_counter() - started
    return points / spent


def percentiles(run: Callable[[Query], int], qs: list[Query]) -> tuple[float, float, float]:
    """p50 and p95 in ms, and the mean number of hits, after a short warm-up."""
    for query in qs[:5]:
        run(query)
    times, hits = [], 0
    for query in qs:
        started = time.perf_counter()
        hits += run(query)
        times.append((time.perf_counter() - started) * 1000)
    cuts = statistics.quantiles(times, n=100, method="inclusive")
    return cuts[49], cuts[94], hits / len(qs)


def probe(
    index: VectorIndex,
    qs: list[Query],
    store: str,
    points: int,
    phase: str,
    rate: float | None = None,
) -> Row:
    def dense(q: Query) -> int:
        return len(index.search_dense(q.dense, q.scope, 10))

    def sparse(q: Query) -> int:
        return len(index.search_sparse(q.sparse, q.scope, 10))

    d50, d95, dense_hits = percentiles(dense, qs)
    s50, s95, sparse_hits = percentiles(sparse, qs)
    mean_hits = (dense_hits + sparse_hits) / 2
    return Row(store, points, phase, rate, d50, d95, s50, s95, mean_hits)


def timed(step: Callable[[], object]) -> float:
    started = time.perf_counter()
    step()
    return time.perf_counter() - started


def reopen(open_store: Callable[[], VectorIndex], scope: Scope) -> tuple[VectorIndex, float]:
    """A fresh handle on the same path, and the seconds until it answered a count."""
    started = time.perf_counter()
    index = open_store()
    index.count(scope)
    return index, time.perf_counter() - started


def bench_edge(args: argparse.Namespace, root: Path) -> list[Row]:
    qs = queries(args.queries, args.dims, args.agents, args.seed)
    index: VectorIndex = EdgeIndex(root)
    index.ensure(args.dims)
    rate = load(index, args, args.points)
    before = probe(index, qs, "qdrant-edge", args.points, "before optimize", rate)
    optimize_s = timed(index.optimize)
    after = probe(index, qs, "qdrant-edge", args.points, "after optimize")
    index.close()
    index, reopen_s = reopen(lambda: EdgeIndex(root), qs[0].scope)
    again = probe(index, qs, "qdrant-edge", args.points, "reopened")
    index.close()
    return [
        before,
        replace(after, seconds=optimize_s, seconds_for="optimize"),
        replace(again, seconds=reopen_s, seconds_for="reopen"),
    ]


def bench_client(args: argparse.Namespace, root: Path) -> list[Row]:
    qs = queries(args.client_queries, args.dims, args.agents, args.seed)
    index: VectorIndex = ClientIndex(QdrantClient(path=str(root)))
    index.ensure(args.dims)
    rate = load(index, args, args.client_points)
    row = probe(index, qs, "qdrant-client local", args.client_points, "exact search", rate)
    index.close()
    index, reopen_s = reopen(lambda: ClientIndex(QdrantClient(path=str(root))), qs[0].scope)
    index.close()
    return [replace(row, seconds=reopen_s, seconds_for="reopen")]


def table(rows: list[Row], header: str) -> Table:
    out = Table(title=f"vector stores, filtered top-10 — {header}")
    for name in ("store", "points", "phase", "upserts/s", "dense p50", "dense p95"):
        out.add_column(name, justify="left" if name in ("store", "phase") else "right")
    for name in ("sparse p50", "sparse p95", "hits", "other"):
        out.add_column(name, justify="right")
    for r in rows:
        out.add_row(
            r.store,
            f"{r.points:,}",
            r.phase,
            "" if r.upserts_per_s is None else f"{r.upserts_per_s:,.0f}",
            f"{r.dense_p50_ms:.2f} ms",
            f"{r.dense_p95_ms:.2f} ms",
            f"{r.sparse_p50_ms:.2f} ms",
            f"{r.sparse_p95_ms:.2f} ms",
            f"{r.mean_hits:.1f}",
            "" if r.seconds is None else f"{r.seconds_for} {r.seconds:.1f} s",
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--points", type=int, default=50_000, help="points in Qdrant Edge")
    parser.add_argument("--dims", type=int, default=512)
    parser.add_argument("--agents", type=int, default=10, help="agents the points spread over")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--client-points", type=int, default=5_000, help="points in local mode")
    parser.add_argument("--client-queries", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--skip-client", action="store_true")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="engram-bench-vectors-"))
    try:
        rows = bench_edge(args, work / "edge")
        if not args.skip_client:
            rows += bench_client(args, work / "local")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    header = f"{args.dims} dims, {args.agents} agents, batches of {args.batch}, {machine()}"
    if args.json:
        report = {"machine": machine(), "args": vars(args), "rows": [asdict(r) for r in rows]}
        print(json.dumps(report, indent=2))
    else:
        Console(width=160).print(table(rows, header))


if __name__ == "__main__":
    main()
