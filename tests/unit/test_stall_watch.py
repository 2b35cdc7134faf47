"""The stall watch: a partition that stands still with work left (records fetched
that never reached the agents, for the patience; records handed over and never
committed, for the longer one) is read again from its committed offset; a partition
that moves, is caught up, or still has records waiting is left alone."""

from __future__ import annotations

from aiokafka import TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from streams.app import StallWatch, Standing

TP = TopicPartition("engram.ingest", 3)


def test_records_fetched_past_what_was_handed_over_are_stranded() -> None:
    # the case seen: 30 handed over, 42 committed (so 30..41 were processed), the
    # fetcher at the log's end (51): 42..50 were fetched and never delivered
    assert Standing(read=30, committed=42, position=51, buffered=False).stranded() == 42
    assert Standing(read=45, committed=42, position=51, buffered=False).stranded() == 46
    assert Standing(read=None, committed=0, position=7, buffered=False).stranded() == 0


def test_caught_up_waiting_or_unknown_partitions_are_not_stranded() -> None:
    assert Standing(read=50, committed=42, position=51, buffered=False).stranded() is None
    assert Standing(read=30, committed=51, position=51, buffered=False).stranded() is None
    assert Standing(read=30, committed=42, position=51, buffered=True).stranded() is None
    assert Standing(read=30, committed=None, position=51, buffered=False).stranded() is None
    assert Standing(read=30, committed=42, position=None, buffered=False).stranded() is None


def test_a_stranded_partition_is_read_again_once_the_patience_is_over() -> None:
    watch = StallWatch(patience_s=5, unfinished_s=20)
    stuck = {TP: Standing(read=30, committed=42, position=51, buffered=False)}
    assert watch.due(stuck, now=100.0) == []
    assert watch.due(stuck, now=104.9) == []
    assert watch.due(stuck, now=105.0) == [(TP, 42)]
    # its clock restarts: not sought again at once
    assert watch.due(stuck, now=106.0) == []
    assert watch.due(stuck, now=110.0) == [(TP, 42)]


def test_handed_over_but_never_committed_waits_the_longer_patience() -> None:
    # seen: 36..50 handed to the stream (read 50), nothing of them committed
    watch = StallWatch(patience_s=5, unfinished_s=20)
    stuck = {TP: Standing(read=50, committed=36, position=51, buffered=False)}
    assert stuck[TP].stranded() is None and stuck[TP].unfinished()
    assert watch.due(stuck, now=0.0) == []
    assert watch.due(stuck, now=19.0) == []
    assert watch.due(stuck, now=20.0) == [(TP, 36)]


def test_a_caught_up_or_waiting_partition_is_never_read_again() -> None:
    watch = StallWatch(patience_s=5, unfinished_s=20)
    done = {TP: Standing(read=50, committed=51, position=51, buffered=False)}
    waiting = {TP: Standing(read=50, committed=36, position=51, buffered=True)}
    for now in range(0, 100, 5):
        assert watch.due(done, now=float(now)) == []
    watch = StallWatch(patience_s=5, unfinished_s=20)
    for now in range(0, 100, 5):
        assert watch.due(waiting, now=float(now)) == []


def test_a_partition_that_moves_is_never_read_again() -> None:
    watch = StallWatch(patience_s=5, unfinished_s=20)
    for step in range(20):  # handed over one more every second, never caught up
        moving = {TP: Standing(read=step, committed=0, position=100, buffered=False)}
        assert watch.due(moving, now=float(step)) == []


def test_a_revoked_partition_is_forgotten() -> None:
    watch = StallWatch(patience_s=5, unfinished_s=20)
    stuck = {TP: Standing(read=30, committed=42, position=51, buffered=False)}
    watch.due(stuck, now=0.0)
    watch.due({}, now=3.0)
    assert watch.due(stuck, now=6.0) == []  # its clock started again at 6
    assert watch.due(stuck, now=11.0) == [(TP, 42)]


@given(
    read=st.none() | st.integers(0, 1000),
    committed=st.integers(0, 1000),
    position=st.integers(0, 1000),
)
def test_the_offset_read_again_from_is_never_past_an_unprocessed_record(
    read: int | None, committed: int, position: int
) -> None:
    """A re-read starts at the committed offset: nothing at or past it was processed
    for sure, and nothing before it is needed again."""
    watch = StallWatch(patience_s=1, unfinished_s=1)
    standing = Standing(read, committed, position, buffered=False)
    watch.due({TP: standing}, now=0.0)
    due = watch.due({TP: standing}, now=1.0)
    if position <= committed:
        assert due == []  # nothing fetched past what was processed: nothing to do
    else:
        assert due == [(TP, committed)]
