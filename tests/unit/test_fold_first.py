"""Memories wait to be embedded while the fold is behind (:class:`FoldFirst`): not at
all when it is not, or when the embedding agent's queue is crowded; until it catches
up; at most ``longest_s``."""

from __future__ import annotations

import asyncio
import time

from streams.vectors import FoldFirst


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
