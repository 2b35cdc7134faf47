"""The worker's garbage collector (``ops.worker.tune_gc``): off for allocations, a full
pass for cycles on its clock. Run in a child interpreter: it turns the collector off
for the whole process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import gc, threading, time, weakref
from ops.worker import tune_gc

class Node:
    pass

tune_gc(0.3)
assert not gc.isenabled(), "the automatic collector is still on"
gone = []
cycle = Node()
cycle.self = cycle
weakref.finalize(cycle, gone.append, "cycle")
del cycle
kept = [[] for _ in range(200_000)]  # four times the old young-generation threshold
assert gone == [], "a cycle was collected on allocations"
deadline = time.monotonic() + 10
while not gone and time.monotonic() < deadline:
    time.sleep(0.05)
assert gone == ["cycle"], "the sweep did not collect the cycle"
tune_gc(0.3)
sweepers = [t for t in threading.enumerate() if t.name == "engram-gc"]
assert len(sweepers) == 1 and sweepers[0].daemon, sweepers
print("ok")
"""


def test_the_worker_collects_cycles_on_its_clock_and_not_on_allocations() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"
