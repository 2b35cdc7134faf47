"""The processors benchmark folds under the collector policy it names, and leaves the
collector as it found it (``ops/bench/processors.py``, ``--gc``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from ops.bench.processors import CONFIGS, WORKLOADS, fold_pass, fold_rate


@pytest.fixture
def collector() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    if enabled:
        gc.enable()
    else:
        gc.disable()


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("automatic", [True, False])
def test_a_pass_folds_as_fold_rate_and_leaves_the_collector_as_found(
    collector: None, enabled: bool, automatic: bool
) -> None:
    events = WORKLOADS["bench"](600, 5)
    (gc.enable if enabled else gc.disable)()
    seen: list[bool] = []

    def watch(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            seen.append(gc.isenabled())

    _, derived, sweep_s = fold_pass(events, CONFIGS["exponential"], automatic_gc=automatic)
    assert gc.isenabled() is enabled
    assert derived == fold_rate(events, CONFIGS["exponential"])[1] > 0
    assert sweep_s >= 0.0
    gc.callbacks.append(watch)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(watch)
    assert seen == [enabled]


def test_under_the_worker_policy_no_automatic_collection_runs_during_a_pass(
    collector: None,
) -> None:
    events = WORKLOADS["bench"](2000, 5)
    gc.enable()
    generations: list[int] = []

    def watch(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            generations.append(info["generation"])

    gc.callbacks.append(watch)
    try:
        fold_pass(events, CONFIGS["exponential"], automatic_gc=False)
        worker = list(generations)
        generations.clear()
        fold_pass(events, CONFIGS["exponential"], automatic_gc=True)
    finally:
        gc.callbacks.remove(watch)
    assert worker == [2]  # the one full collection after the pass, none during it
    assert generations  # CPython's own collections ran during the pass
