"""The ticker: clock ticks on every partition reach every agent as its own
``clock.tick`` (archived in its log) and forgetting happens without any event
from the agent."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from engram import Memory, make_event
from ops.broker import EmbeddedBroker
from tests.support import FAST_GROUP, start_stack, wait_until

pytestmark = pytest.mark.integration


def test_ticks_reach_idle_agents_and_forget_old_memories(tmp_path: Path) -> None:
    long_ago = datetime.now(UTC) - timedelta(days=90)
    events = [
        make_event(
            "interaction.recorded",
            agent_id=f"ticked-{i}",
            session_id="s",
            occurred_at=long_ago + timedelta(minutes=n),
            body={"role": "user", "content": f"ok {n}"},
        )
        for i in range(3)
        for n in range(3)
    ]
    events += [
        make_event(
            "session.ended",
            agent_id=f"ticked-{i}",
            session_id="s",
            occurred_at=long_ago + timedelta(minutes=5),
        )
        for i in range(3)
    ]
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        stack = start_stack(
            tmp_path / "home",
            ENGRAM_KAFKA_BOOTSTRAP=broker.bootstrap,
            **FAST_GROUP,
            ENGRAM_TICK_INTERVAL_S="1",
        )
        try:
            with Memory(bootstrap=broker.bootstrap) as memory:
                memory.publish_many(events)
            forgotten = wait_until(
                lambda: stack.scalar("SELECT count() FROM memories WHERE forgotten") == 3 or None,
                60,
                "each agent's old episode forgotten at a tick",
            )
            assert forgotten
            ticks = dict(
                stack.rows(
                    "SELECT agent_id, count() FROM events FINAL WHERE type = 'clock.tick'"
                    " GROUP BY agent_id"
                )
            )
            assert set(ticks) == {"ticked-0", "ticked-1", "ticked-2"}, "no row for the clock itself"
            seqs = stack.rows(
                "SELECT agent_id, groupArray(seq) FROM (SELECT agent_id, seq FROM events FINAL"
                " ORDER BY agent_id, seq) GROUP BY agent_id"
            )
            for _, numbers in seqs:
                assert numbers == list(range(len(numbers))), "ticks take their place in sequence"
        finally:
            assert stack.stop() == 0
