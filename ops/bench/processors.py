"""Events folded per second through every processor, single-threaded and pure:
typed events in, derived events out, no I/O. Both forgetting curves are run on
the same events in the same run (exponential, the default, and FSRS).

Run: ``python -m ops.bench.processors --events 100000``.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from datetime import UTC, datetime, timedelta

from ops.bench.common import machine
from processors import AgentMemory, MemoryConfig
from schemas import (
    ClockTicked,
    Event,
    FactAsserted,
    InteractionRecorded,
    MemoryRecalled,
    SessionEnded,
)

TEXTS = (
    "I want to visit Kyoto in April for the cherry blossoms, please remember that.",
    "我对花生过敏，一定要记住！",
    "Sure, I'll look for a ryokan near Gion with vegetarian meals.",
    "今天天气不错，我们下午去散步吧。",
    "ok",
)


def workload(n: int, agents: int) -> list[Event]:
    """A realistic mix: mostly turns in sessions of 12, session ends, facts, recalls, ticks."""
    start = datetime(2026, 10, 1, tzinfo=UTC)
    events: list[Event] = []
    for i in range(n):
        agent = f"agent-{i % agents}"
        at = start + timedelta(seconds=30 * (i // agents))
        common = {"event_id": uuid.uuid4(), "agent_id": agent, "occurred_at": at, "user_id": "u"}
        session = f"s{i // (agents * 12)}"
        kind = i % 50
        if kind == 49:
            events.append(SessionEnded(**common, session_id=session))
        elif kind == 48:
            body = {"namespace": "p", "key": f"k{i % 7}", "value": str(i)}
            events.append(FactAsserted(**common, body=body))
        elif kind == 47:
            recalled = {"query": "kyoto", "memory_ids": ["x"], "scores": [0.5]}
            events.append(MemoryRecalled(**common, body=recalled))
        elif kind == 46:
            events.append(ClockTicked(**common, body={"partition": 0, "interval_s": 60.0}))
        else:
            body = {"role": "user" if i % 2 else "assistant", "content": TEXTS[i % len(TEXTS)]}
            events.append(InteractionRecorded(**common, session_id=session, body=body))
    return events


def fold_rate(events: list[Event], config: MemoryConfig) -> tuple[float, int]:
    memories: dict[str, AgentMemory] = {}
    derived = 0
    started = time.perf_counter()
    for event in events:
        memory = memories.get(event.agent_id)
        if memory is None:
            memory = memories[event.agent_id] = AgentMemory.empty(event.agent_id, config)
        derived += len(memory.apply(event).derived)
    return len(events) / (time.perf_counter() - started), derived


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--agents", type=int, default=100)
    args = parser.parse_args()
    events = workload(args.events, args.agents)
    rate, derived = fold_rate(events, MemoryConfig())
    fsrs_rate, _ = fold_rate(events, MemoryConfig(forgetting={"curve": "fsrs"}))
    print(
        json.dumps(
            {
                "events": args.events,
                "agents": args.agents,
                "all_processors_per_s": round(rate),
                "all_processors_fsrs_per_s": round(fsrs_rate),
                "derived_events": derived,
                "machine": machine(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
