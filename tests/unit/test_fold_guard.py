"""The fold's gap guard: each partition is folded strictly in offset order from its
saved mark, whatever offsets the consumer delivers (streams.pipeline.Folder)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import faust

from engram import make_event
from processors import MemoryConfig
from schemas import Codec
from schemas.sealed import SealingCodec
from sinks.keys import KeyBook
from streams.pipeline import Folder, mark_key

CODEC = Codec()
T0 = datetime(2026, 10, 5, 9, 0, tzinfo=UTC)


@dataclass
class Table:
    """What the fold reads of a faust table: its ``data`` mapping."""

    data: dict[bytes, bytes] = field(default_factory=dict)


@dataclass
class Message:
    topic: str
    partition: int
    offset: int
    key: bytes
    value: bytes


@dataclass
class Item:
    message: Message


def item(partition: int, offset: int, agent: str = "a") -> Item:
    event = make_event(
        "interaction.recorded",
        agent_id=agent,
        session_id="s",
        occurred_at=T0 + timedelta(seconds=offset),
        body={"role": "user", "content": f"turn {offset} 第{offset}句"},
    )
    return Item(Message("engram.events", partition, offset, agent.encode(), CODEC.encode(event)))


def folder(table: Table | None = None) -> Folder:
    return Folder(cast("faust.Table[bytes, bytes]", table or Table()), CODEC, MemoryConfig())


def batch(*items: Item) -> Any:
    return list(items)


def test_without_a_mark_the_first_offset_is_taken_and_marked() -> None:
    fold = folder()
    result = fold.fold(batch(item(0, 5), item(0, 6)))
    assert [s.event.body.content for s in result.sequenced] == ["turn 5 第5句", "turn 6 第6句"]
    assert not result.held and not result.gaps
    assert fold.expected(0) == 7


def test_a_message_past_the_mark_is_held_with_the_rest_of_its_partition() -> None:
    table = Table({mark_key(0): b"9", mark_key(1): b"3"})
    fold = folder(table)
    result = fold.fold(batch(item(0, 10), item(0, 12), item(1, 4), item(0, 13)))
    assert [s.event.body.content for s in result.sequenced] == ["turn 10 第10句", "turn 4 第4句"]
    assert result.gaps == {0: 11}  # read partition 0 again from offset 11
    assert [m.offset for m in result.held] == [12, 13]
    assert fold.expected(0) == 11 and fold.expected(1) == 5


def test_a_message_before_the_mark_was_processed_before_and_is_passed_over() -> None:
    fold = folder(Table({mark_key(2): b"20"}))
    result = fold.fold(batch(item(2, 19), item(2, 20), item(2, 21)))
    assert [s.event.body.content for s in result.sequenced] == ["turn 21 第21句"]
    assert not result.held


def test_unmarked_partitions_start_where_they_are_told() -> None:
    fold = folder(Table({mark_key(1): b"0"}))
    assert fold.unmarked([0, 1, 2, 0]) == [0, 2]
    fold.start(0, 0)
    result = fold.fold(batch(item(0, 3)))
    assert result.gaps == {0: 0} and not result.sequenced


def test_marks_are_saved_with_the_states_and_once() -> None:
    table = Table()
    fold = folder(table)
    result = fold.fold(batch(item(3, 0, "x"), item(3, 1, "y")))
    records, checkpoints = fold.state_records(result.touched)
    keys = [r.key for r in records]
    assert keys == [b"x", b"y", mark_key(3)]
    assert table.data[mark_key(3)] == b"1"
    assert [c.agent_id for c in checkpoints] == ["x", "y"]
    assert fold.state_records({}) == ([], [])  # nothing new: no mark again
    assert fold.agents_on(3) == ["x", "y"]  # the marks are not agents


def test_a_shredded_event_keeps_its_place_in_its_agents_sequence() -> None:
    """Sealed under a key since destroyed, an event derives nothing but takes its seq:
    the events after it are numbered as the fold that met it in clear numbered them."""
    keys = KeyBook()
    keys.keys["gone"] = {"k1": secrets.token_bytes(32)}
    keys.keys["kept"] = {"k2": secrets.token_bytes(32)}
    codec = SealingCodec(keys)
    turns = [
        make_event(
            "interaction.recorded",
            agent_id="a",
            session_id="s",
            user_id=user,
            occurred_at=T0 + timedelta(seconds=i),
            body={"role": "user", "content": f"turn {i}"},
        )
        for i, user in enumerate(["kept", "gone", "kept"])
    ]
    sealed = [codec.encode(e) for e in turns]

    def fold_all() -> list[tuple[int, str]]:
        fold = Folder(cast("faust.Table[bytes, bytes]", Table()), codec, MemoryConfig())
        items = [Item(Message("engram.events", 0, i, b"a", raw)) for i, raw in enumerate(sealed)]
        result = fold.fold(batch(*items))
        assert not result.held and not result.dead
        return [(s.seq, str(s.event.user_id)) for s in result.sequenced]

    assert fold_all() == [(0, "kept"), (1, "gone"), (2, "kept")]
    keys.keys["gone"]["k1"] = None  # the subject is erased: its key destroyed
    assert fold_all() == [(0, "kept"), (2, "kept")]


def test_a_rollback_waits_for_its_past_and_says_so() -> None:
    fold = folder()
    first = fold.fold(batch(item(0, 0), item(0, 1)))
    assert [s.seq for s in first.sequenced] == [0, 1]
    request = make_event(
        "memory.rolled_back",
        agent_id="a",
        occurred_at=T0 + timedelta(minutes=5),
        body={"to": T0.isoformat(), "to_seq": 1},
    )
    held = Item(Message("engram.events", 0, 2, b"a", CODEC.encode(request)))
    result = fold.fold(batch(held, item(0, 3)))
    assert result.gaps == {0: 2} and result.waiting == {0}  # a wait, not a hole
    assert [m.offset for m in result.held] == [2, 3]
    assert list(result.wanted.values()) == [("a", 1)]
