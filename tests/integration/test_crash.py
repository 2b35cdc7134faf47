"""Crash and resume on Apache Kafka (bytewax's ABORT pattern): kill -9 the worker at a
random moment and at every fault point of ``streams.faults`` (mid-flush of each sink;
``flush.saved`` in the two-worker test), restart it; once caught up, every projection
equals that of an uninterrupted run of the same history. The same with two workers in
one consumer group, one of them killed mid-flush (rebalances on join, death, restart).

The many-points version with figures is ``python -m ops.crash --points 20``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ops.crash import FIRST, POINTS, Projection, compare, history, run, run_pair
from ops.kafka import available

UNAVAILABLE = available()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.crash,  # not in `make test`: minutes of kill -9 and restarts (make test-crash)
    pytest.mark.skipif(UNAVAILABLE is not None, reason=UNAVAILABLE or ""),
]
EVENTS = history(520)
PAIR_POINT = "flush.saved"  # the one fault point the two-worker test takes
PASSAGE = {"embed.published": 1}  # at the 2nd passage elsewhere


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Projection:
    """The uninterrupted run: what every crashed run must end up with."""
    done = run(tmp_path_factory.mktemp("reference"), EVENTS, [])
    kinds = {row[4] for row in done.changes}
    assert len(done.events) == len(EVENTS)
    assert {"memory.created", "memory.reinforced", "memory.weakened", "memory.forgotten"} <= kinds
    assert done.points and all("dense" in vectors for _, vectors in done.points.values())
    return done


@pytest.mark.timeout(600)  # the uninterrupted run, then seven lives of the worker
def test_kill_minus_nine_at_every_fault_point_loses_nothing_and_repeats_nothing(
    reference: Projection, tmp_path: Path
) -> None:
    plans = [
        FIRST,
        *(f"{point}:{PASSAGE.get(point, 2)}" for point in POINTS if point != PAIR_POINT),
    ]
    crashed = run(tmp_path, EVENTS, plans)
    for life in crashed.lives:
        assert life.code == -9, f"{life.plan}: ended with {life.code}"
        if not life.plan.startswith("random"):
            assert life.by_itself, f"{life.plan}: the fault point was never reached"
    result = compare(reference, crashed, EVENTS)
    assert (result.lost, result.duplicated) == (set(), 0)
    assert crashed.events == reference.events
    assert crashed.changes == reference.changes
    assert crashed.states == reference.states
    assert crashed.points == reference.points


@pytest.mark.timeout(600)
def test_two_workers_with_a_rebalance_mid_flush_fold_every_event_once(
    reference: Projection, tmp_path: Path
) -> None:
    """Only the history is compared: each worker keeps its own chdb and vector store
    (both single-process), so the vectors of a partition that moved are split."""
    crashed = run_pair(tmp_path, EVENTS, f"{PAIR_POINT}:1")
    (life,) = crashed.lives
    assert life.by_itself and life.code == -9, "worker a never reached the fault point"
    result = compare(reference, crashed, EVENTS, vectors=False)
    assert (result.lost, result.duplicated) == (set(), 0)
    assert crashed.events == reference.events
    assert crashed.changes == reference.changes
    assert crashed.states == reference.states
