"""Working memory rebuilt from its ``working.updated`` deltas equals the fold's own,
after every event of a generated bilingual history (the pure part of the history
road of time travel)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from engram.history import memory_created_at, rebuild_trace, sessions_from_deltas, trace_clock
from ops.bench.timetravel import START, history_of
from processors import AgentMemory, MemoryConfig
from processors.forgetting import (
    ForgettingParams,
    new_trace,
    reinforce,
    retention,
    retention_of,
    weaken,
)
from schemas import WorkingUpdated


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("turns", [20, 4])
def test_deltas_rebuild_the_working_memory_of_the_fold(seed: int, turns: int) -> None:
    config = MemoryConfig(working_turns=turns)
    memory = AgentMemory.empty("a", config)
    rows: list[tuple[Any, ...]] = []
    checked = 0
    for event in history_of("a", days=6, seed=seed):
        step = memory.apply(event)
        for d in step.derived:
            if isinstance(d, WorkingUpdated):
                source = event.type if event.type in ("session.started", "working.set") else None
                row = (d.seq, d.idx, d.session_id, d.occurred_at, d.body.model_dump_json(), source)
                rows.append(row)
        if step.derived:
            assert sessions_from_deltas(rows, config.working_turns) == memory.state().sessions
            checked += 1
    assert checked > 100
    bodies = [row[4] for row in rows]
    assert any('"cleared":true' in b for b in bodies), "sessions were cleared"
    assert any('"expired":["' in b for b in bodies), "idle sessions expired at a tick"
    if turns == 20:  # a cap of 4 turns keeps the tokens under the budget
        assert any('"role":"summary"' in b for b in bodies), "working memory was compressed"


T0 = START


@pytest.mark.parametrize("curve", ["exponential", "fsrs"])
def test_a_trace_rebuilt_from_its_changes_has_the_folds_retention(curve: str) -> None:
    params = ForgettingParams(curve=curve)
    made = new_trace(6.0, T0, params)
    trace = reinforce(made, T0 + timedelta(days=2), params)
    trace = weaken(trace, T0 + timedelta(days=5), params)
    trace = reinforce(trace, T0 + timedelta(days=1), params)  # late: takes effect at day 5
    rebuilt = rebuild_trace(
        created_at=T0,
        strength_days=trace.strength_days,
        reinforced_at=T0 + timedelta(days=2),
        reviewed_at=T0 + timedelta(days=5),
        reinforcements=2,
        lapses=1,
        invalidated=False,
        params=params,
    )
    last, clock = trace_clock(
        created_at=T0,
        reinforced_at=T0 + timedelta(days=2),
        reviewed_at=T0 + timedelta(days=5),
        params=params,
    )
    assert last == rebuilt.last_reinforced_at
    for days in (0, 1, 3, 7, 30, 400):
        at = T0 + timedelta(days=days, hours=5)
        assert retention(rebuilt, at, params) == retention(trace, at, params)
        assert retention_of(trace.strength_days, clock, at, params) == retention(trace, at, params)


def test_a_semantic_memory_is_dated_at_the_end_of_its_window() -> None:
    config = MemoryConfig()
    at = memory_created_at("semantic", T0 + timedelta(days=3), "2026-03-02T17:45:00.123Z", config)
    assert at.isoformat() == "2026-03-03T00:00:00+00:00"
