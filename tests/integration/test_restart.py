"""Crash and resume: kill -9 the worker mid-stream, start it again on the same
broker and home; the history must equal that of an uninterrupted run."""

from __future__ import annotations

import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from engram import Memory, make_event
from ops.broker import EmbeddedBroker
from schemas import Event
from tests.support import FAST_GROUP, start_stack, wait_until

pytestmark = pytest.mark.integration


def history(n: int, agents: int, offset: int = 0) -> list[Event]:
    t0 = datetime(2026, 10, 1, tzinfo=UTC)
    return [
        make_event(
            "interaction.recorded",
            agent_id=f"crash-agent-{i % agents}",
            session_id=f"s{(i + offset) // 50}",
            occurred_at=t0 + timedelta(seconds=i + offset),
            body={"role": "user", "content": f"message {i + offset} 消息"},
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("first_feed", ["on", "off"])
def test_kill_minus_nine_and_resume_loses_nothing_and_repeats_nothing(
    tmp_path: Path, first_feed: str
) -> None:
    """The second life feeds the fold directly (the default); the first one too, or
    through faust's stream (``ENGRAM_DIRECT_FEED=off``): either way the same history."""
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        env = {"ENGRAM_KAFKA_BOOTSTRAP": broker.bootstrap, "ENGRAM_BATCH_SIZE": "200", **FAST_GROUP}
        first = start_stack(tmp_path / "home", **env, ENGRAM_DIRECT_FEED=first_feed)
        before = history(3000, agents=5)
        with Memory(bootstrap=broker.bootstrap) as memory:
            memory.publish_many(before)
        wait_until(lambda: first.scalar("SELECT count() FROM events") >= 600, 60, "some progress")
        first.stop(signal.SIGKILL)
        assert first.process.returncode == -signal.SIGKILL

        second = start_stack(tmp_path / "home", **env)
        try:
            after = history(1000, agents=5, offset=3000)
            with Memory(bootstrap=broker.bootstrap) as memory:
                memory.publish_many(after)
                memory.publish_many(after[-100:])  # a client retrying recent events
            total = len(before) + len(after)
            wait_until(
                lambda: second.scalar("SELECT count() FROM events FINAL") == total,
                120,
                f"{total} events after the restart",
            )
            wait_until(
                lambda: (
                    second.scalar(
                        "SELECT count() FROM memory_changes FINAL WHERE type = 'working.updated'"
                    )
                    == total
                ),
                60,
                "one working-memory change per event",
            )
            rows = second.rows(
                "SELECT agent_id, groupArray(seq), groupArray(toString(event_id))"
                " FROM (SELECT agent_id, seq, event_id FROM events FINAL ORDER BY agent_id, seq)"
                " GROUP BY agent_id ORDER BY agent_id"
            )
            published = {str(e.event_id) for e in before + after}
            seen: set[str] = set()
            for agent_id, seqs, ids in rows:
                assert seqs == list(range(len(seqs))), f"{agent_id}: gap or repeat in sequence"
                expected = [str(e.event_id) for e in before + after if e.agent_id == agent_id]
                assert ids == expected, f"{agent_id}: events out of log order"
                seen |= set(ids)
            assert seen == published
        finally:
            assert second.stop() == 0
