"""Memories wait to be embedded while the fold is behind (:class:`FoldFirst`): not at
all when it is not, or when the embedding agent's queue is crowded; until it catches
up; at most ``longest_s``."""

from __future__ import annotations

import asyncio
import time

from streams.vectors import FoldFirst, LoopLag


def run_wait(first: FoldFirst) -> tuple[float, float]:
    """(seconds ``wait`` said it waited, seconds it took)."""
    started = time.monotonic()
    waited = asyncio.run(first.wait())
    return waited, time.monotonic() - started


def test_a_fold_that_keeps_up_makes_no_batch_wait() -> None:
    first = FoldFirst(lambda: False, longest_s=5.0)
    waited, took = run_wait(first)
    assert waited == 0.0
    assert took < 1.0  # no sleep at all: waited is 0.0 exactly
    assert first.waited_s == 0.0


def test_a_batch_waits_until_the_fold_catches_up() -> None:
    caught_up_at = time.monotonic() + 0.3
    first = FoldFirst(lambda: time.monotonic() < caught_up_at, longest_s=5.0, poll_s=0.01)
    waited, took = run_wait(first)
    assert 0.3 <= took < 3.0
    assert 0.28 <= waited <= took
    assert first.waited_s == waited


def test_a_batch_waits_at_most_longest_s_and_the_waits_add_up() -> None:
    first = FoldFirst(lambda: True, longest_s=0.2, poll_s=0.05)
    for _ in range(2):
        waited, took = run_wait(first)
        assert 0.19 <= waited <= took < 3.0
    assert 0.38 <= first.waited_s < 6.0


def test_a_crowded_queue_makes_no_batch_wait_and_ends_a_wait() -> None:
    first = FoldFirst(lambda: True, longest_s=5.0, crowded=lambda: True)
    assert run_wait(first)[0] == 0.0
    crowded_at = time.monotonic() + 0.2
    first = FoldFirst(
        lambda: True, longest_s=5.0, crowded=lambda: time.monotonic() >= crowded_at, poll_s=0.01
    )
    waited, took = run_wait(first)
    assert 0.18 <= waited <= took < 3.0


def _hold(seconds: float) -> None:
    """Hold the running loop (no timer runs meanwhile), as a fold batch holds it."""
    time.sleep(seconds)


def test_a_busy_loop_runs_its_timers_late() -> None:
    """:class:`LoopLag` is busy while a timer ended late within ``hold_s``: after the
    loop was held, not on a loop that was not (a generous ``late_s``: a loaded machine
    runs timers a little late too), nor before it runs."""

    async def measure(hold_s: float) -> bool:
        lag = LoopLag(period_s=0.02, late_s=0.25, hold_s=5.0)
        assert not lag.busy()
        task = asyncio.create_task(lag.run())
        for _ in range(3):
            await asyncio.sleep(0.05)
            _hold(hold_s)
        await asyncio.sleep(0.05)
        busy = lag.busy()
        task.cancel()
        return busy

    assert asyncio.run(measure(0.6))
    assert not asyncio.run(measure(0.0))
