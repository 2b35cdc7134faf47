"""The in-order guard of the forwarding agents (streams.ordered): each partition
is acted on strictly in offset order from the group's committed offset."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from aiokafka import TopicPartition

from streams.ordered import Holes, InOrder, in_order

TOPIC = "engram.ingest"


@dataclass
class Message:
    partition: int
    offset: int
    topic: str = TOPIC
    refcount: int = 0
    acked: bool = False

    def incref(self) -> None:
        self.refcount += 1

    def ack(self, consumer: Any) -> None:
        self.refcount -= 1
        if self.refcount == 0:
            self.acked = True
            consumer.acked.append((self.partition, self.offset))


@dataclass
class Item:
    message: Message


@dataclass
class Consumer:
    committed: dict[TopicPartition, int]
    earliest: dict[TopicPartition, int] = field(default_factory=dict)
    acked: list[tuple[int, int]] = field(default_factory=list)
    seeks: list[tuple[int, int]] = field(default_factory=list)

    @property
    def _committed_offset(self) -> dict[TopicPartition, int]:
        return self.committed

    async def earliest_offsets(self, *tps: TopicPartition) -> dict[TopicPartition, int]:
        return {tp: self.earliest.get(tp, 0) for tp in tps}

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp.partition, offset))


@dataclass
class App:
    consumer: Consumer
    _engram_holes: Holes = field(default_factory=Holes)  # holes_of finds it, no timer


def tp(partition: int) -> TopicPartition:
    return TopicPartition(TOPIC, partition)


def guard(**committed: int) -> InOrder:
    offsets = {tp(int(p[1:])): o for p, o in committed.items()}
    return InOrder(App(Consumer(offsets)))


def offsets(messages: list[Any]) -> list[tuple[int, int]]:
    return [(m.partition, m.offset) for m in messages]


def test_messages_from_the_committed_offset_are_ready_in_order() -> None:
    admitted = guard(p0=5).admit([Message(0, 5), Message(0, 6), Message(0, 7)])
    assert offsets(admitted.ready) == [(0, 5), (0, 6), (0, 7)]
    assert admitted.held == [] and admitted.gaps == {}


def test_a_message_past_a_hole_is_held_with_the_rest_of_its_partition() -> None:
    g = guard(p0=5, p1=0)
    admitted = g.admit([Message(0, 5), Message(0, 7), Message(1, 0), Message(0, 6)])
    assert offsets(admitted.ready) == [(0, 5), (1, 0)]
    assert offsets(admitted.held) == [(0, 7), (0, 6)]
    assert admitted.gaps == {tp(0): 6}
    again = g.admit([Message(0, 6), Message(0, 7)])  # the partition read again from 6
    assert offsets(again.ready) == [(0, 6), (0, 7)]


def test_messages_below_the_next_offset_were_acted_on_and_are_done() -> None:
    g = guard(p0=3)
    g.admit([Message(0, 3), Message(0, 4)])
    admitted = g.admit([Message(0, 3), Message(0, 4), Message(0, 5)])
    assert offsets(admitted.done) == [(0, 3), (0, 4)]
    assert offsets(admitted.ready) == [(0, 5)]


def test_after_a_revocation_the_committed_offset_is_the_start_again() -> None:
    g = guard(p0=3)
    g.admit([Message(0, 3), Message(0, 4)])
    g.forget()
    assert offsets(g.admit([Message(0, 3)]).ready) == [(0, 3)]


def test_in_order_acts_on_ready_acks_ready_and_done_never_held_and_seeks_the_hole() -> None:
    g = guard(p0=2)
    consumer = g.consumer
    acted: list[tuple[int, int]] = []

    async def act(messages: list[Any]) -> None:
        acted.extend(offsets(messages))

    messages = [Message(0, 1), Message(0, 2), Message(0, 4), Message(0, 5)]
    for m in messages:
        m.incref()  # faust's own reference, dropped when the batch ends
    asyncio.run(in_order([Item(m) for m in messages], g, act))
    for m in messages:
        m.ack(consumer)
    assert acted == [(0, 2)]
    assert consumer.acked == [(0, 1), (0, 2)]
    assert [m.acked for m in messages] == [True, True, False, False]
    assert consumer.seeks == [(0, 3)]


def test_a_hole_removed_by_retention_starts_the_partition_at_its_log_start() -> None:
    g = guard(p0=2)
    g.consumer.earliest[tp(0)] = 10
    admitted = g.admit([Message(0, 10)])
    assert admitted.gaps == {tp(0): 2}

    async def nothing(messages: list[Any]) -> None:
        raise AssertionError("nothing is ready")

    asyncio.run(in_order([Item(Message(0, 10))], g, nothing))
    assert g.consumer.seeks == [(0, 10)]
    assert offsets(g.admit([Message(0, 10)]).ready) == [(0, 10)]


def test_a_hole_sought_is_sought_again_while_it_stays_a_hole() -> None:
    g = guard(p0=2)
    asyncio.run(in_order([Item(Message(0, 4))], g, lambda messages: asyncio.sleep(0)))
    holes = g.holes
    assert list(holes.open) == [tp(0)]
    start = holes.open[tp(0)][1]
    assigned = {tp(0)}
    assert holes.due(assigned, start + 0.5) == [], "patience first"
    assert holes.due(assigned, start + 2.5) == [(tp(0), 2)]
    assert holes.due(assigned, start + 3.0) == [], "then patience again"
    g.admit([Message(0, 2)])  # the hole came
    assert holes.due(assigned, start + 10) == [] and not holes.open


def test_a_hole_of_a_partition_gone_elsewhere_is_dropped() -> None:
    g = guard(p0=2)
    asyncio.run(in_order([Item(Message(0, 4))], g, lambda messages: asyncio.sleep(0)))
    assert g.holes.due(set(), 1e12) == [] and not g.holes.open


def test_offsets_passed_over_count_as_done_once_the_agent_reaches_them() -> None:
    """The vector agents' feeds pass over working memory (acked, never batched): the
    guard must not wait for those offsets as holes, nor move past a message it has not
    admitted yet (3 is queued when 4 and 5 are passed over)."""
    g = guard(p0=3, p1=0)
    g.pass_over([Message(0, 4), Message(0, 5), Message(1, 0), Message(1, 1)])
    assert g.expected(tp(0)) == 3, "3 comes first: passing 4 and 5 does not skip it"
    assert g.expected(tp(1)) == 2, "the partition's next offsets were passed: move on"
    admitted = g.admit([Message(0, 3), Message(0, 6), Message(1, 2)])
    assert offsets(admitted.ready) == [(0, 3), (0, 6), (1, 2)]
    assert admitted.held == [] and admitted.gaps == {}
    g.pass_over([Message(0, 8)])
    held = g.admit([Message(0, 9)])  # 7 is missing, neither admitted nor passed: a hole
    assert held.gaps == {tp(0): 7} and offsets(held.held) == [(0, 9)]
    g.pass_over([Message(0, 7)])  # read again, and passed over this time
    assert offsets(g.admit([Message(0, 9)]).ready) == [(0, 9)]
    assert g.passed[tp(0)] == set(), "what the guard moved past is not kept"
    g.pass_over([Message(0, 4)])  # a re-read of an offset long done
    assert g.expected(tp(0)) == 10
    g.forget()
    assert g.passed == {} and g.expected(tp(0)) == 3


def test_offsets_passed_over_before_the_committed_offset_is_known_wait_for_it() -> None:
    g = guard()  # nothing committed yet
    g.pass_over([Message(0, 0), Message(0, 1)])
    assert g.expected(tp(0)) is None
    g.consumer.committed[tp(0)] = 0
    assert g.expected(tp(0)) == 2


def test_many_offsets_passed_behind_a_message_not_admitted_yet_are_all_done_at_once() -> None:
    """While the embedding agent embeds a memory, thousands of working-memory records
    after it pass: they wait in the guard's set and leave it as the agent reaches them."""
    g = guard(p0=0)
    g.pass_over([Message(0, offset) for offset in range(1, 10_001)])
    assert g.expected(tp(0)) == 0 and len(g.passed[tp(0)]) == 10_000
    assert offsets(g.admit([Message(0, 0)]).ready) == [(0, 0)]
    assert g.expected(tp(0)) == 10_001 and g.passed[tp(0)] == set()
