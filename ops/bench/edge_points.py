"""What Qdrant Edge's own Python binding costs per point, alone in one process: the
``Point`` constructor (it converts the vectors and the payload into its own values)
and ``EdgeShard.update`` (upserts in batches), for a memory's point as the vector
projection makes it (512-d dense, BM25 sparse terms, the 20-field payload) and for
the same point with smaller payloads. It is the floor under a vector rebuild: a
writer process does this and nothing less for every point.

Run: ``python -m ops.bench.edge_points --points 20000`` (``--json`` for JSON).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import qdrant_edge as qe
from rich.console import Console
from rich.table import Table

from ops.bench.common import machine
from sinks.edge_shard import WirePoint, edge_point
from sinks.vectors import (
    BOOL_FIELDS,
    FLOAT_FIELDS,
    KEYWORD_FIELDS,
    _edge_config,
    _edge_indexes,
    wire_point,
)
from streams.vectors import memory_point

BATCH = 512
FILTER_FIELDS = (*KEYWORD_FIELDS, *FLOAT_FIELDS, *BOOL_FIELDS)
"""The payload fields recall filters on (the indexed ones)."""
TEXT = "The user wants to see Kyoto in April for the cherry blossoms. 我们下午去京都的寺庙看看。"


@dataclass(frozen=True)
class Row:
    payload: str
    fields: int
    build_us: float
    update_us: float
    points_per_s: float


def points(n: int, dims: int, seed: int = 7) -> list[WirePoint]:
    """``n`` points as the projection writes them: ids, vectors, terms and payload."""
    rng = random.Random(seed)
    out: list[WirePoint] = []
    for i in range(n):
        head = {
            "agent_id": f"agent-{i % 100}",
            "user_id": f"user-{i % 7}",
            "session_id": f"s-{i % 300}",
            "layer": "L2",
            "kind": "episode",
            "importance": rng.uniform(1, 10),
            "sentiment": rng.uniform(-1, 1),
            "confidence": rng.random(),
            "strength": 1.0,
        }
        sources = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(3)]
        tail = (["Kyoto", "京都"], sources, str(uuid.UUID(int=rng.getrandbits(128))))
        bare = memory_point(
            str(uuid.UUID(int=rng.getrandbits(128))), TEXT, 1_700_000_000_000 + i, head, tail
        )
        terms = sorted(rng.sample(range(100_000), 15))
        point = wire_point(bare)
        out.append(
            (
                point[0],
                [rng.random() for _ in range(dims)],
                terms,
                [rng.random() for _ in terms],
                point[4],
            )
        )
    return out


def measure(
    label: str, wire: list[WirePoint], dims: int, shape: Callable[[WirePoint], WirePoint]
) -> Row:
    """CPU time per point of building Edge's points and of upserting them, into a new
    shard with the projection's config and payload indexes."""
    shaped = [shape(p) for p in wire]
    with tempfile.TemporaryDirectory() as home:
        shard = qe.EdgeShard.create(home, _edge_config(dims))
        for name, schema in _edge_indexes().items():
            shard.update(qe.UpdateOperation.create_field_index(name, schema))
        started = time.process_time()
        built = [edge_point(p) for p in shaped]
        made = time.process_time()
        for at in range(0, len(built), BATCH):
            shard.update(qe.UpdateOperation.upsert_points(built[at : at + BATCH]))
        done = time.process_time()
        shard.close()
    n = len(wire)
    return Row(
        label,
        len(shaped[0][4]),
        1e6 * (made - started) / n,
        1e6 * (done - made) / n,
        n / (done - started),
    )


def keep(fields: tuple[str, ...]) -> Callable[[WirePoint], WirePoint]:
    def shape(p: WirePoint) -> WirePoint:
        return p[0], p[1], p[2], p[3], {k: v for k, v in p[4].items() if k in fields}

    return shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=20_000)
    parser.add_argument("--dims", type=int, default=512)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    wire = points(args.points, args.dims)
    rows = [
        measure("whole (as the projection writes it)", wire, args.dims, lambda p: p),
        measure("filter fields only", wire, args.dims, keep(FILTER_FIELDS)),
        measure("none", wire, args.dims, keep(())),
    ]
    report: dict[str, Any] = {
        "machine": machine(),
        "points": args.points,
        "dims": args.dims,
        "rows": [asdict(r) for r in rows],
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    table = Table(
        title=f"Qdrant Edge, {args.points} points of {args.dims} d, CPU per point"
        f" ({report['machine']})"
    )
    for column in ("payload", "fields", "build µs", "update µs", "points/s"):
        table.add_column(column)
    for r in rows:
        table.add_row(
            r.payload,
            str(r.fields),
            f"{r.build_us:.1f}",
            f"{r.update_us:.1f}",
            f"{r.points_per_s:,.0f}",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
