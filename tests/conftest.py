"""Fixtures that start real components: the Tansu broker and ``engram up``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from ops.broker import EmbeddedBroker
from tests.support import Stack, start_stack

# CI runs the property tests on a fixed seed, so a run is repeatable; local runs explore.
settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Tansu broker on a free port for the whole session; yields its address."""
    log = tmp_path_factory.mktemp("tansu") / "broker.log"
    with EmbeddedBroker(log_path=log) as broker:
        yield broker.bootstrap


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory, tansu: str) -> Iterator[Stack]:
    """``engram up`` against the session broker, chdb in a temp home."""
    home: Path = tmp_path_factory.mktemp("engram-home")
    running = start_stack(
        home,
        ENGRAM_KAFKA_BOOTSTRAP=tansu,
        ENGRAM_SESSION_TIMEOUT_S="6",
        ENGRAM_REBALANCE_TIMEOUT_S="2",
        ENGRAM_TICK_INTERVAL_S="0",  # tests publish their ticks: counts stay exact
    )
    yield running
    code = running.stop()
    assert code == 0, f"engram up exited with {code}"
