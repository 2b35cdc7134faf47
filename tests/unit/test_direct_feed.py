"""``streams.app.DirectFeed``: what the worker's consumer hands an agent, on a real faust
app and consumer (not started: the feed touches only their bookkeeping). Its path
through the broker is the integration tests' (every worker feeds its fold, its ingest
hop and its vector agents directly unless ``ENGRAM_DIRECT_FEED=off``)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka.structs import ConsumerRecord
from faust.transport.drivers.aiokafka import ConsumerMessage
from faust.types import TP
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.app import DirectFeed, _message, create_app, direct_feed, direct_feeds, fed_batches

TOPIC = "engram.events"


def app_for(name: str) -> Any:
    app = create_app(app_id=f"feed-{name}", bootstrap="127.0.0.1:1", partitions=2)
    app.flow_control.resume()
    return app


def messages(offsets: range, partition: int = 0, generation: int = 0, feeds: int = 1) -> list[Any]:
    """Fetched messages, each with one reference per feed it is handed to (as the
    consumer's hand-over gives them)."""
    made = [
        ConsumerMessage(
            TOPIC, partition, offset, 0.0, 0, None, b"k", b"v", None, generation_id=generation
        )
        for offset in offsets
    ]
    for message in made:
        message.incref(feeds)
    return made


async def test_take_gives_what_is_queued_at_once_up_to_the_batch_and_tracks_it() -> None:
    app = app_for("take")
    feed = direct_feed(app, TOPIC)
    aiter(app.topic(TOPIC))  # subscribed, as the fold does it: acks of its topic count
    await app.topics._update_indices()  # what the conductor does on subscribing
    assert direct_feeds(app) == {TOPIC: [feed]}
    await feed.put(messages(range(3)))
    await feed.put(messages(range(2), partition=1))
    first = await asyncio.wait_for(feed.take(4), 0.1)  # no batch window: what is there
    assert [(m.partition, m.offset) for m in first] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    rest = await asyncio.wait_for(feed.take(4), 0.1)
    assert [(m.partition, m.offset) for m in rest] == [(1, 1)]
    for message in first + rest:
        assert message.tracked and message in app.consumer.unacked
        assert message.ack(app.consumer)  # tracked, current generation, flow on: counted
    assert app.consumer._acked[TP(TOPIC, 0)] == [0, 1, 2]
    await feed.put(messages(range(3, 6)))
    app.flow_control.clear()  # a revocation: faust's stream queues and the feed emptied
    assert not feed.queued


async def test_take_waits_for_a_message_when_none_is_queued() -> None:
    feed = direct_feed(app_for("wait"), TOPIC)
    taking = asyncio.ensure_future(feed.take(10))
    await asyncio.sleep(0.05)
    assert not taking.done()
    await feed.put(messages(range(1)))
    assert [m.offset for m in await asyncio.wait_for(taking, 0.1)] == [0]


async def test_a_full_feed_holds_the_hand_over_back_until_taken_or_cleared() -> None:
    feed = DirectFeed(app_for("full"), TOPIC, maxsize=2)
    await feed.put(messages(range(2)))
    assert feed.full()
    putting = asyncio.ensure_future(feed.put(messages(range(2, 4))))
    await asyncio.sleep(0.05)
    assert not putting.done()
    assert len(await feed.take(1)) == 1
    await asyncio.wait_for(putting, 0.1)
    assert len(feed.queued) == 3
    putting = asyncio.ensure_future(feed.put(messages(range(4, 5))))
    await asyncio.sleep(0.05)
    assert not putting.done()
    assert feed.clear() == 3  # partitions revoked: dropped, never tracked
    await asyncio.wait_for(putting, 0.1)
    assert [m.offset for m in await feed.take(10)] == [4]


async def test_messages_of_an_older_generation_or_a_stopped_flow_are_not_taken() -> None:
    app = app_for("stale")
    feed = direct_feed(app, TOPIC)
    app.consumer_generation_id = 3
    # committed past them: the refused acks need no re-read (no consumer runs here)
    app.consumer._committed_offset[TP(TOPIC, 0)] = 100
    old = messages(range(2), generation=2)
    current = messages(range(2, 4), generation=3)
    await feed.put(old + current)
    taken = await asyncio.wait_for(feed.take(10), 0.1)
    assert taken == current
    assert all(m.acked and not m.tracked for m in old)  # released, refused: read again
    assert not app.consumer._acked[TP(TOPIC, 0)]
    app.flow_control.suspend()  # a rebalance: the flow stops before the revocation
    stopped = messages(range(4, 6), generation=3)
    await feed.put(stopped)
    taking = asyncio.ensure_future(feed.take(10))
    await asyncio.sleep(0.05)
    assert not taking.done()  # nothing to take: the stopped flow's messages are skipped
    assert all(m.acked and not m.tracked for m in stopped)
    taking.cancel()


def test_declaring_a_feed_leaves_the_app_to_the_loop_the_worker_runs_it_on() -> None:
    """The stack declares its agents, then makes the loop its worker runs on: a feed
    that bound the app to the loop current at declaration ran the worker on that one,
    where a reprocess's stop request (sent to the worker's loop) never arrived."""
    app = create_app(app_id="feed-loop", bootstrap="127.0.0.1:1", partitions=2)
    feed = direct_feed(app, TOPIC)
    loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        assert app.loop is loop

        async def hand_over_and_revoke() -> int:
            await feed.put(messages(range(2)))
            app.flow_control.clear()  # registered on first use: cleared with the streams
            return len(feed.queued)

        assert loop.run_until_complete(hand_over_and_revoke()) == 0
    finally:
        asyncio.set_event_loop(None)
        loop.close()


async def test_two_feeds_of_a_topic_each_get_every_message_and_ack_it_only_when_both_are_done() -> (
    None
):
    """Two agents read one topic (the embedding and the vector projection): a message
    is acked once both released it, whichever ends last, as faust's conductor counts a
    reference per stream; a batch's references are released when its agent asks for
    the next batch, and an agent that holds a message (a hole) keeps it unacked."""
    app = app_for("two")
    first, second = direct_feed(app, TOPIC), direct_feed(app, TOPIC)
    assert direct_feeds(app) == {TOPIC: [first, second]}
    aiter(app.topic(TOPIC))
    await app.topics._update_indices()
    handed = messages(range(3), feeds=2)
    await first.put(handed)
    await second.put(handed)
    stream = app.stream(app.topic(TOPIC))
    one, two = fed_batches(stream, first, 10), fed_batches(stream, second, 10)
    batch = await asyncio.wait_for(one.__anext__(), 0.1)
    assert [d.message.offset for d in batch] == [0, 1, 2]
    batch[2].message.incref()  # the first agent holds offset 2 (a hole before it, say)
    await asyncio.wait_for(first.put(messages(range(3, 4), feeds=1)), 0.1)
    await asyncio.wait_for(one.__anext__(), 0.1)  # done with its first batch: released
    assert not any(m.acked for m in handed)  # the second agent still has them
    other = await asyncio.wait_for(two.__anext__(), 0.1)
    assert [d.message for d in other] == handed
    await two.aclose()  # the second agent stops: its references released
    assert [m.acked for m in handed] == [True, True, False]
    assert app.consumer._acked[TP(TOPIC, 0)] == [0, 1]
    await one.aclose()


async def test_a_window_gathers_a_batch_until_it_is_full_or_the_window_ends() -> None:
    feed = direct_feed(app_for("window"), TOPIC)
    await feed.put(messages(range(2)))
    loop = asyncio.get_running_loop()
    began = loop.time()
    taken = await asyncio.wait_for(feed.take(10, within=0.2), 1.0)
    assert [m.offset for m in taken] == [0, 1]
    assert loop.time() - began >= 0.15  # waited for more, then gave what it had
    taking = asyncio.ensure_future(feed.take(3, within=5.0))
    await feed.put(messages(range(2, 3)))
    await asyncio.sleep(0.05)
    assert not taking.done()
    await feed.put(messages(range(3, 6)))
    assert [m.offset for m in await asyncio.wait_for(taking, 0.5)] == [2, 3, 4]


async def test_a_feed_passes_over_what_its_agent_ignores_and_acks_it_once_every_feed_did() -> None:
    """The vector agents ignore working memory, most of the derived log: their feeds
    pass it over at the hand-over (not queued, not batched), tell the agent which
    messages (its order guard counts them done) and release each feed's reference as a
    done batch would; a message is acked once the other feed released it too, and the
    committed offset waits for the messages before it; a message passed over while the
    flow is stopped is refused (read again), as take does, and not reported passed."""
    app = app_for("ignore")
    reported: list[int] = []
    wanted = direct_feed(
        app,
        TOPIC,
        ignores=lambda value: value == b"working",
        passed=lambda ms: reported.extend(m.offset for m in ms),
    )
    other = direct_feed(app, TOPIC)
    aiter(app.topic(TOPIC))
    await app.topics._update_indices()
    handed = messages(range(4), feeds=2)
    for message, value in zip(handed, (b"memory", b"working", b"working", b"memory"), strict=True):
        message.value = value
    await wanted.put(handed)
    await other.put(handed)
    assert [m.offset for m in wanted.queued] == [0, 3]  # the ignored ones not queued
    assert [m.offset for m in other.queued] == [0, 1, 2, 3]
    assert reported == [1, 2]
    assert handed[1].tracked and not handed[1].acked  # released here; the other holds it
    stream = app.stream(app.topic(TOPIC))
    theirs = fed_batches(stream, other, 10)
    assert len(await asyncio.wait_for(theirs.__anext__(), 0.1)) == 4
    await theirs.aclose()  # the other agent is done with all four
    assert [m.acked for m in handed] == [False, True, True, False]
    assert app.consumer._acked[TP(TOPIC, 0)] == [1, 2]  # nothing committable before 0
    ours = fed_batches(stream, wanted, 10)
    assert [d.message.offset for d in await asyncio.wait_for(ours.__anext__(), 0.1)] == [0, 3]
    await ours.aclose()
    assert all(m.acked for m in handed)
    assert sorted(app.consumer._acked[TP(TOPIC, 0)]) == [0, 1, 2, 3]
    app.flow_control.suspend()  # a rebalance: passed over, but refused, read again
    stopped = messages(range(4, 5))
    stopped[0].value = b"working"
    await wanted.put(stopped)
    assert stopped[0].acked and not stopped[0].tracked
    assert not wanted.queued and reported == [1, 2]


async def test_what_every_feed_ignores_is_passed_over_once_at_the_hand_over() -> None:
    """The hand-over passes over a message that every feed of its topic ignores (the
    derived log's working memory, which neither vector agent reads) once for them all:
    each feed's agent is told (its order guard counts it done), it is acked at once,
    and it is never queued; a message some feed takes goes to every feed as before,
    and a feed passes over by itself what it alone ignores. Passed over in a stopped
    flow or an older generation, it is refused (read again) and not reported."""
    app = app_for("all-ignore")
    reports: dict[str, list[int]] = {"embed": [], "project": []}

    def feed_of(name: str, ignored: set[bytes]) -> DirectFeed:
        return direct_feed(
            app,
            TOPIC,
            ignores=lambda value: value in ignored,
            passed=lambda ms: reports[name].extend(m.offset for m in ms),
        )

    embed = feed_of("embed", {b"working", b"embedded"})
    project = feed_of("project", {b"working"})
    aiter(app.topic(TOPIC))
    await app.topics._update_indices()
    consumer = app.consumer
    tp = TP(TOPIC, 0)
    consumer._committed_offset[tp] = 0
    handed = messages(range(5), feeds=0)
    values = (b"memory", b"working", b"embedded", b"working", b"working")
    for message, value in zip(handed, values, strict=True):
        message.value = value
    await consumer._hand_over([(tp, m) for m in handed])
    assert [m.offset for m in embed.queued] == [0]
    assert [m.offset for m in project.queued] == [0, 2]
    assert reports == {"embed": [1, 3, 4, 2], "project": [1, 3, 4]}
    assert [m.acked for m in handed] == [False, True, False, True, True]
    assert [m.tracked for m in handed] == [False, True, True, True, True]  # 0: not taken yet
    assert [m.refcount for m in handed] == [2, 0, 1, 0, 0]  # 2: the embedding feed let go
    assert sorted(consumer._acked[tp]) == [1, 3, 4]
    assert consumer._read_offset[tp] == 4
    await consumer._hand_over([(tp, m) for m in handed[:4]])  # read before: skipped
    assert len(project.queued) == 2 and reports["project"] == [1, 3, 4]

    app.consumer_generation_id = 7  # a rebalance: what was fetched before it is stale
    stale = messages(range(5, 6), feeds=0, generation=6)
    stale[0].value = b"working"
    await consumer._hand_over([(tp, stale[0])])
    app.flow_control.suspend()  # and while the flow is stopped, nothing counts
    stopped = messages(range(6, 7), feeds=0, generation=7)
    stopped[0].value = b"working"
    await consumer._hand_over([(tp, stopped[0])])
    assert all(m.acked and not m.tracked for m in stale + stopped)  # refused: read again
    assert sorted(consumer._acked[tp]) == [1, 3, 4]
    assert reports["project"] == [1, 3, 4]
    assert consumer._engram_rewind == {tp: 5}


def test_the_fetched_records_become_the_messages_faust_makes_of_them() -> None:
    """The worker's fetch makes each record's message itself (faust's ``getmany``
    asked the app for the generation at every record): it must be the message
    faust's ``_to_message`` makes, slot for slot."""
    app = app_for("fetched")
    app.consumer_generation_id = 4
    tp = TP(TOPIC, 1)
    for timestamp in (1_732_000_000_123, None):
        record = ConsumerRecord(
            TOPIC, 1, 42, timestamp, 0, b"key", b"value", 99, 3, 5, [("h", b"1")]
        )
        ours = _message(tp, record, 4)
        theirs = app.consumer._to_message(tp, record)
        slots = [s for s in ConsumerMessage.__slots__ if s not in ("__weakref__", "span")]
        assert ours.generation_id == 4 and ours.tp is tp and ours.headers == [("h", b"1")]
        assert {s: getattr(ours, s) for s in slots} == {s: getattr(theirs, s) for s in slots}


ACKED_TOPIC, OTHER_TOPIC = TOPIC, "engram.unsubscribed"
MESSAGE_STATES = st.tuples(
    st.sampled_from([ACKED_TOPIC, OTHER_TOPIC]),
    st.integers(0, 1),  # partition
    st.integers(0, 6),  # offset (repeats: an offset acked twice)
    st.integers(0, 3),  # references held
    st.booleans(),  # tracked
    st.booleans(),  # of the current generation
    st.booleans(),  # acked before
)


@settings(max_examples=150, deadline=None)
@given(
    states=st.lists(MESSAGE_STATES, max_size=14),
    committed=st.tuples(st.none() | st.integers(0, 6), st.none() | st.integers(0, 6)),
    active=st.booleans(),
)
def test_acking_a_batch_in_one_step_is_acking_each_message(
    states: list[tuple[str, int, int, int, bool, bool, bool]],
    committed: tuple[int | None, int | None],
    active: bool,
) -> None:
    """``_Consumer.ack_all`` leaves the messages and the consumer's bookkeeping (acked
    offsets and count, the unacked set, what is read again) as ``message.ack`` one by
    one does, whatever their references, tracking, generation, earlier acks, topic
    (acks count only for a subscribed one), committed offsets and flow."""

    def run(name: str, batched: bool) -> tuple[Any, ...]:
        app = app_for(name)
        aiter(app.topic(ACKED_TOPIC))
        asyncio.run(app.topics._update_indices())
        app.consumer_generation_id = 5
        consumer = app.consumer
        for partition, offset in enumerate(committed):
            consumer._committed_offset[TP(ACKED_TOPIC, partition)] = offset
        made = []
        for topic, partition, offset, refs, tracked, current, acked in states:
            message = ConsumerMessage(
                topic,
                partition,
                offset,
                0.0,
                0,
                None,
                b"k",
                b"v",
                None,
                generation_id=5 if current else 4,
            )
            message.refcount, message.tracked, message.acked = refs, tracked, acked
            if tracked:
                consumer.unacked.add(message)
            made.append(message)
        if not active:
            app.flow_control.suspend()
        consumer._read_again = lambda tp, offset: rewinds.append((tp, offset))
        rewinds: list[tuple[TP, int]] = []
        if batched:
            consumer.ack_all(made)
        else:
            for message in made:
                message.ack(consumer)
        return (
            [(m.acked, m.refcount, m in consumer.unacked) for m in made],
            {tp: list(v) for tp, v in consumer._acked.items() if v},
            {tp: sorted(v) for tp, v in consumer._acked_index.items() if v},
            consumer._n_acked,
            rewinds,
        )

    assert run("batched", True) == run("one-by-one", False)
