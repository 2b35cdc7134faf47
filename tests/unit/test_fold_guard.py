"""The fold's gap guard: each partition is folded strictly in offset order from its
saved mark, whatever offsets the consumer delivers (streams.pipeline.Folder)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import faust
from hypothesis import given, settings
from hypothesis import strategies as st

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


def test_a_sealed_event_is_sequenced_with_the_clear_bytes_it_opened_to() -> None:
    """What the archive's native road reads (``SequencedEvent.clear``): the clear bytes
    inside the sealed payload; a clear payload needs none."""
    keys = KeyBook()
    keys.keys["mei"] = {"k1": secrets.token_bytes(32)}
    codec = SealingCodec(keys)
    turn = make_event(
        "interaction.recorded",
        agent_id="a",
        session_id="s",
        user_id="mei",
        occurred_at=T0,
        body={"role": "user", "content": "我对花生过敏"},
    )
    clear, sealed = codec.encode_with_clear(turn)
    fold = Folder(cast("faust.Table[bytes, bytes]", Table()), codec, MemoryConfig())
    (sequenced,) = fold.fold(batch(Item(Message("engram.events", 0, 0, b"a", sealed)))).sequenced
    assert (sequenced.event, sequenced.payload, sequenced.clear) == (turn, sealed, clear)
    (plain,) = folder().fold(batch(item(0, 0))).sequenced
    assert plain.clear is None and plain.payload[:2] == b"\xc3\x01"


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


def deferring(table: Table, save_every: int) -> Folder:
    return Folder(
        cast("faust.Table[bytes, bytes]", table), CODEC, MemoryConfig(), save_every=save_every
    )


def test_a_state_saved_later_holds_its_partitions_mark_before_its_first_unsaved_event() -> None:
    table = Table()
    fold = deferring(table, save_every=1000)  # no slot comes: saved when new, or at the end
    first = fold.fold(batch(item(0, 0, "x"), item(0, 1, "y")))
    records, _ = fold.state_records(first.touched)
    assert [r.key for r in records] == [b"x", b"y", mark_key(0)]  # new agents: saved at once
    second = fold.fold(batch(item(0, 2, "x"), item(0, 3, "y"), item(0, 4, "x")))
    records, checkpoints = fold.state_records(second.touched)
    assert records == [] and checkpoints == []  # both unsaved; the mark stays at 1
    assert table.data[mark_key(0)] == b"1"
    assert set(fold.unsaved) == {"x", "y"}
    records, checkpoints = fold.state_records({}, final=True)
    assert [r.key for r in records] == [b"x", b"y", mark_key(0)]
    assert table.data[mark_key(0)] == b"4" and not fold.unsaved
    assert [c.agent_id for c in checkpoints] == ["x", "y"]


def test_each_unsaved_agent_is_saved_within_save_every_closes() -> None:
    table = Table()
    fold = deferring(table, save_every=4)
    agents = [f"agent-{n}" for n in range(12)]
    fold.state_records(fold.fold(batch(*(item(0, n, a) for n, a in enumerate(agents)))).touched)
    offset = len(agents)
    fold.fold(batch(*(item(0, offset + n, a) for n, a in enumerate(agents))))
    saved: list[str] = []
    for _ in range(4):  # nothing folded meanwhile: the slots still come round
        records, _ = fold.state_records({})
        saved += [r.key.decode() for r in records if not r.key.startswith(b"\x00")]
    assert sorted(saved) == sorted(agents) and not fold.unsaved
    assert table.data[mark_key(0)] == str(2 * len(agents) - 1).encode()


def test_an_agent_entering_a_new_stretch_of_sequence_numbers_is_saved_at_that_close() -> None:
    # the history keeps one checkpoint per stretch: a replay as of T starts from the last
    # one before T, so a state saved only every save_every closes would space them out
    table = Table()
    fold = Folder(
        cast("faust.Table[bytes, bytes]", table),
        CODEC,
        MemoryConfig(),
        save_every=1000,
        checkpoint_every=4,
    )
    saved_at: list[int] = []
    for offset in range(14):  # one event per close; seq 0..13
        _, checkpoints = fold.state_records(fold.fold(batch(item(0, offset, "x"))).touched)
        saved_at += [c.seq for c in checkpoints]
    assert saved_at == [0, 4, 8, 12]  # new, then each first close in a new stretch
    assert fold.saved_seq["x"] == 12 and set(fold.unsaved) == {"x"}


def test_an_erasure_saves_its_agent_at_the_next_close() -> None:
    table = Table()
    fold = deferring(table, save_every=1000)
    fold.state_records(fold.fold(batch(item(0, 0, "x"))).touched)
    request = make_event(
        "subject.erasure_requested", agent_id="x", body={"subject": "u1", "reason": "test"}
    )
    erasure = Item(Message("engram.events", 0, 1, b"x", CODEC.encode(request)))
    result = fold.fold(batch(item(0, 2, "x")))
    assert fold.state_records(result.touched) == ([], [])
    result = fold.fold(batch(erasure))
    records, _ = fold.state_records(result.touched)
    assert [r.key for r in records] == [b"x", mark_key(0)]


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=8),
    crash_after=st.integers(0, 8),
    save_every=st.integers(1, 5),
)
def test_a_crash_between_saves_loses_nothing_and_applies_nothing_twice(
    sizes: list[int], crash_after: int, save_every: int
) -> None:
    """Fold batches, closing after each, then crash (the live states are lost; the table
    keeps what was saved) and read the partition again from its mark, as the worker
    does: the states and the sequenced events equal those of a fold without a crash."""
    agents = ["x", "y", "z"]
    items = [item(0, n, agents[(n * 7 // 3) % 3]) for n in range(sum(sizes))]
    batches, start = [], 0
    for size in sizes:
        batches.append(items[start : start + size])
        start += size

    def states(fold: Folder) -> dict[str, bytes]:
        return {a: fold.live[a].stored() for a in sorted(fold.live)}

    whole = deferring(Table(), save_every)
    whole_seqs = []
    for chunk in batches:
        result = whole.fold(chunk)
        whole_seqs += [(s.event.agent_id, s.seq) for s in result.sequenced]
        whole.state_records(result.touched)

    table = Table()
    first = deferring(table, save_every)
    seqs = []
    for chunk in batches[:crash_after]:
        result = first.fold(chunk)
        seqs += [(s.event.agent_id, s.seq) for s in result.sequenced]
        first.state_records(result.touched)
    again = deferring(table, save_every)  # a new life: what the table holds
    expected = again.expected(0)
    if expected is None:
        again.start(0, 0)
        expected = 0
    redo = again.fold([i for i in items if i.message.offset >= expected])
    again_seqs = [(s.event.agent_id, s.seq) for s in redo.sequenced]
    done = {(a, q) for a, q in seqs}
    # events sequenced before the crash come again only for unsaved agents, identically
    assert set(again_seqs) | done == set(whole_seqs)
    assert sorted(set(seqs + again_seqs)) == sorted(whole_seqs)
    for agent_id, live in again.live.items():
        assert live.stored() == states(whole)[agent_id]
    assert set(again.live) | {a for a, _ in seqs} == set(whole.live)
