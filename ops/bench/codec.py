"""What the sealed road's codec costs an event, in one process: no broker, no worker.

Run: ``python -m ops.bench.codec --events 20000``. The events are the ingest
benchmark's (:func:`ops.bench.ingest.make_events`), each subject with a data key of
its own, and the derived events are what folding them makes. Three steps, as the
stack takes them, each timed over every event (best of ``--repeat`` passes, µs an
event):

- ``decode``: the ingest hop decodes and validates the clear bytes it was sent, as it
  does anything a producer sends (:meth:`~schemas.sealed.SealingCodec.open`);
- ``seal``: the ingest hop seals an event from the bytes it was sent
  (:meth:`~schemas.sealed.SealingCodec.reseal`);
- ``open``: the fold opens a sealed event (:meth:`~schemas.sealed.SealingCodec.open_clear`,
  nothing remembered from the sealing, as in the worker);
- ``derived``: the worker encodes and seals what the fold derived from an event
  (:meth:`~schemas.sealed.SealingCodec.encode_with_clear` of each derived event,
  summed per source event).

``compiled`` says whether ``schemas.wire`` ran from its mypyc build (``setup.py``):
``ENGRAM_PURE_PYTHON=1`` installs, or a copy of the sources without the extension
first on ``PYTHONPATH``, give the plain-Python figures to compare.
"""

from __future__ import annotations

import argparse
import gc
import json
import secrets
import time
from collections.abc import Callable
from typing import Any

from ops.bench.common import compiled, machine
from ops.bench.ingest import make_events
from processors import AgentMemory, MemoryConfig
from schemas import Codec, DerivedEvent, Event
from schemas.sealed import RECENT, SealingCodec
from sinks.keys import KeyBook


def best_us(step: Callable[[], Any], n: int, repeat: int) -> float:
    """The fastest of ``repeat`` runs of ``step``, in µs per each of ``n`` events, with
    the automatic garbage collector off as in the stack's processes
    (:func:`ops.worker.tune_gc`): on, its passes over the events' objects tripled
    ``open``'s figure (31 against 13 µs), a cost the worker does not pay."""
    best = float("inf")
    for _ in range(repeat):
        RECENT.clear()
        gc.collect()
        gc.disable()
        try:
            began = time.perf_counter()
            step()
            best = min(best, time.perf_counter() - began)
        finally:
            gc.enable()
    return round(best / n * 1e6, 2)


class Workload:
    """The ingest benchmark's ``n`` events over ``agents`` agents, each subject with a
    data key of its own; their clear and sealed bytes; what folding them derives."""

    def __init__(self, n: int, agents: int) -> None:
        self.events = make_events(n, agents)
        book = KeyBook()
        for event in self.events:
            book.keys.setdefault(event.user_id or event.agent_id, {"k1": secrets.token_bytes(32)})
        self.codec = SealingCodec(book, remember=False)
        self.clear = [Codec().encode(event) for event in self.events]
        self.sealed = self.seal()
        memories: dict[str, AgentMemory] = {}
        self.derived: list[DerivedEvent] = []
        for event in self.events:
            memory = memories.get(event.agent_id)
            if memory is None:
                memory = memories[event.agent_id] = AgentMemory.empty(event.agent_id, CONFIG)
            self.derived += memory.apply(event).derived

    def decode(self) -> list[Event | None]:
        """``decode``: every event's clear bytes decoded and validated."""
        return [self.codec.open(raw) for raw in self.clear]

    def seal(self) -> list[bytes]:
        """``seal``: every event sealed from its clear bytes."""
        return [self.codec.reseal(e, raw) for e, raw in zip(self.events, self.clear, strict=True)]

    def open(self) -> list[tuple[Event | None, bytes | None]]:
        """``open``: every sealed event opened, with its clear bytes."""
        return [self.codec.open_clear(raw) for raw in self.sealed]

    def encode_derived(self) -> list[tuple[bytes, bytes]]:
        """``derived``: every derived event's clear and sealed bytes."""
        return [self.codec.encode_with_clear(event) for event in self.derived]


CONFIG = MemoryConfig()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if min(args.events, args.agents, args.repeat) < 1:
        parser.error("--events, --agents and --repeat must be at least 1")
    n = args.events
    work = Workload(n, args.agents)
    steps: dict[str, Callable[[], Any]] = {
        "decode": work.decode,
        "seal": work.seal,
        "open": work.open,
        "derived": work.encode_derived,
    }
    result: dict[str, Any] = {
        "events": n,
        "derived_per_event": round(len(work.derived) / n, 2),
        "us_per_event": {name: best_us(step, n, args.repeat) for name, step in steps.items()},
        "compiled": compiled(),
        "machine": machine(),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
