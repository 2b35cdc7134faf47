"""The fold resumes from what it processed, not from what the consumer group
committed: if the group's offset runs ahead of the fold (faust acks messages it
skipped during a rebalance, and counts gaps as acked), the fold sees the hole at the
partition's next message (an event, or the ticker's tick at the latest), reads the
partition again from its own mark, and so loses nothing and applies nothing twice.
A partition with no mark at all (nothing of it was ever processed) is read from the
start of its log, whatever the group committed for it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import OffsetAndMetadata

from engram import Memory, make_event
from engram.status import consumer_lag, partition_bounds
from ops.kafka import ApacheKafka, available
from schemas import Event
from tests.support import FAST_GROUP, start_stack, wait_until

UNAVAILABLE = available()
pytestmark = [
    pytest.mark.integration,
    # Apache Kafka: Tansu refuses offset commits from outside the group's generation
    pytest.mark.skipif(UNAVAILABLE is not None, reason=UNAVAILABLE or ""),
]


def caught_up(bootstrap: str) -> bool:
    lags = asyncio.run(consumer_lag(bootstrap, "engram-worker", ["engram.events"]))
    return bool(lags) and all(p.lag == 0 for p in lags)


def turns(n: int, offset: int = 0, agents: int = 3) -> list[Event]:
    """``n`` turns spread over the agents guard-0 .. guard-{agents - 1} (on partitions
    4, 3, 2 and, for guard-3, 5 of six)."""
    t0 = datetime(2026, 10, 5, 9, 0, tzinfo=UTC)
    return [
        make_event(
            "interaction.recorded",
            agent_id=f"guard-{(i + offset) % agents}",
            session_id="s",
            occurred_at=t0 + timedelta(seconds=i + offset),
            body={"role": "user", "content": f"turn {i + offset} 第{i + offset}句"},
        )
        for i in range(n)
    ]


async def commit_to_the_end(bootstrap: str, topic: str, group: str) -> dict[int, int]:
    """Commit the group's offsets to the end of every partition, as a consumer that
    acked what it never processed would; returns what was committed."""
    partitions, _, ends = await partition_bounds(bootstrap, [topic])
    member = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await member.start()
    try:
        member.assign(partitions)
        await member.commit({tp: OffsetAndMetadata(end, "") for tp, end in ends.items()})
        return {tp.partition: end for tp, end in ends.items()}
    finally:
        await member.stop()


def test_a_group_offset_ahead_of_the_fold_loses_nothing(tmp_path: Path) -> None:
    with ApacheKafka(tmp_path / "kafka") as broker:
        env = {  # short group timeouts: a member the broker still counts expires soon
            "ENGRAM_KAFKA_BOOTSTRAP": broker.bootstrap,
            **FAST_GROUP,
            "ENGRAM_LOG_LEVEL": "INFO",
        }
        first = start_stack(tmp_path / "home", **env)
        # guard-3 (partition 5) appears only while no worker runs: no mark there
        before, after = turns(90), turns(80, offset=90, agents=4)
        with Memory(bootstrap=broker.bootstrap) as memory:
            memory.publish_many(before)
        wait_until(lambda: first.scalar("SELECT count() FROM events FINAL") == 90, 60, "90")
        # and their flush finished (states and marks saved, offsets committed): this test
        # is about a group offset ahead of the fold, not a stop in the middle of a flush
        wait_until(lambda: caught_up(broker.bootstrap), 60, "the first worker's commits")
        assert first.stop() == 0
        with Memory(bootstrap=broker.bootstrap) as memory:
            memory.publish_many(after)  # while no worker runs
        committed = asyncio.run(
            commit_to_the_end(broker.bootstrap, "engram.events", "engram-worker")
        )
        assert sum(committed.values()) > 0

        second = start_stack(tmp_path / "home", **env)
        try:
            later = turns(4, offset=170, agents=4)  # a hole shows at a partition's next message
            with Memory(bootstrap=broker.bootstrap) as memory:
                memory.publish_many(later)
            wait_until(
                lambda: second.scalar("SELECT count() FROM events FINAL") == 174,
                150,
                "the 80 events the group had committed past, and the 4 after them",
            )
            rows = second.rows(
                "SELECT agent_id, groupArray(seq), groupArray(toString(event_id))"
                " FROM (SELECT agent_id, seq, event_id FROM events FINAL ORDER BY agent_id, seq)"
                " GROUP BY agent_id ORDER BY agent_id"
            )
            assert [row[0] for row in rows] == [f"guard-{i}" for i in range(4)]
            for agent_id, seqs, ids in rows:
                assert seqs == list(range(len(seqs))), f"{agent_id}: gap or repeat in sequence"
                expected = [
                    str(e.event_id) for e in before + after + later if e.agent_id == agent_id
                ]
                assert ids == expected, f"{agent_id}: events out of log order"
        finally:
            assert second.stop() == 0
