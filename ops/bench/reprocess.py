"""Reprocess benchmark: ``engram reprocess`` of a folded history with new parameters.

``--agents`` agents with ``--events`` raw events in all (the time-travel benchmark's
seeded bilingual histories, ``--light`` mix) are published to a fresh ``engram up`` on
the embedded stack and folded live; then a reprocess to FSRS forgetting with a shorter
episode gap runs to its swap. Reported: raw events reprocessed per second (start to
swap, embedding the new memories included), the time the worker was stopped for the
swap, and, as references measured in the same run, the live fold's rate on the same
events and the raw aiokafka consume rate of ``engram.events``.

Run: ``python -m ops.bench.reprocess [--events 20000] [--agents 20]``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import datetime
from typing import Any

import httpx

from ops.bench.common import machine, start_stack, wait_embedded
from ops.bench.timetravel import history_of
from ops.topics import read_to_end
from processors import MemoryConfig
from schemas import Event

NEW = MemoryConfig(name="bench-fsrs", forgetting={"curve": "fsrs"}, episodes={"idle_gap_s": 600.0})


def histories(events: int, agents: int) -> list[Event]:
    """``events`` raw events over ``agents`` agents, each agent's in log order."""
    per = max(1, events // agents)
    out: list[Event] = []
    for a in range(agents):
        days = 10
        while True:
            mine = history_of(f"bench-rp-{a}", days=days, seed=a, heavy=False)
            if len(mine) >= per:
                break
            days *= 2
        out += mine[:per]
    return out


async def consume_rate(bootstrap: str, topic: str, n: int) -> float:
    """Records per second of a plain consumer reading ``n`` records of ``topic``."""
    started = time.perf_counter()
    read = await read_to_end(bootstrap, topic, lambda _: None, stop_after=n)
    return read / (time.perf_counter() - started)


def wait_folded(stack: Any, count: int, timeout: float) -> float:
    """Seconds until the archive holds ``count`` events."""
    started = time.monotonic()
    while stack.count("SELECT count() FROM events FINAL") < count:
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"not folded within {timeout:.0f}s")
        time.sleep(0.2)
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> None:
    from engram.client import Memory

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--agents", type=int, default=20)
    args = parser.parse_args(argv)

    events = histories(args.events, args.agents)
    stack = start_stack(ENGRAM_TICK_INTERVAL_S="0")
    try:
        http, bootstrap = str(stack.up["http"]), str(stack.up["kafka_bootstrap"])
        started = time.monotonic()
        with Memory(bootstrap=bootstrap) as memory:
            memory.publish_many(events)
        folded_s = time.monotonic() - started + wait_folded(stack, len(events), 1800)
        wait_embedded(bootstrap)  # the live vectors first: the reprocess reuses them
        consumed = asyncio.run(consume_rate(bootstrap, "engram.events", len(events)))

        body = {"config": NEW.model_dump(mode="json")}
        with httpx.Client(base_url=http, timeout=30) as client:
            client.post("/v1/admin/reprocess", json=body).raise_for_status()
            stopped_at: float | None = None
            while True:
                status = client.get("/v1/admin/reprocess").json()
                if status["state"] == "swapping" and stopped_at is None:
                    stopped_at = time.monotonic()
                if status["state"] not in ("running", "swapping"):
                    break
                time.sleep(0.1)
        ended = time.monotonic()
        if status["state"] != "done":
            raise SystemExit(f"reprocess ended {status['state']}: {status['error']}")
        took = (
            status["finished_at"] and _seconds(status["started_at"], status["finished_at"])
        ) or 0.0
        print(f"machine: {machine()}")
        print(f"raw events: {len(events)} over {args.agents} agents")
        print(f"live fold (publish to archived): {len(events) / folded_s:,.0f} events/s")
        print(f"raw aiokafka consume of engram.events: {consumed:,.0f} records/s")
        print(
            f"reprocess: {status['done']:,} offsets, {status['derived']:,} derived,"
            f" {status['embedded']:,} embedded ({status['reused']:,} reused) in {took:.1f}s:"
            f" {status['done'] / took:,.0f} raw events/s"
        )
        if stopped_at is not None:
            print(f"worker stopped for the swap: {ended - stopped_at:.1f}s at most")
    finally:
        stack.stop()


def _seconds(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


if __name__ == "__main__":
    main()
