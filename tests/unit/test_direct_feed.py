"""``streams.app.DirectFeed``: what the worker's consumer hands the fold, on a real faust
app and consumer (not started: the feed touches only their bookkeeping). Its path
through the broker is the integration tests' (every worker feeds its fold directly
unless ``ENGRAM_DIRECT_FEED=off``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from faust.transport.drivers.aiokafka import ConsumerMessage
from faust.types import TP

from streams.app import DirectFeed, create_app, direct_feed, direct_feeds

TOPIC = "engram.events"


def app_for(name: str) -> Any:
    app = create_app(app_id=f"feed-{name}", bootstrap="127.0.0.1:1", partitions=2)
    app.flow_control.resume()
    return app


def messages(offsets: range, partition: int = 0, generation: int = 0) -> list[Any]:
    return [
        ConsumerMessage(
            TOPIC, partition, offset, 0.0, 0, None, b"k", b"v", None, generation_id=generation
        )
        for offset in offsets
    ]


async def test_take_gives_what_is_queued_at_once_up_to_the_batch_and_tracks_it() -> None:
    app = app_for("take")
    feed = direct_feed(app, TOPIC)
    aiter(app.topic(TOPIC))  # subscribed, as the fold does it: acks of its topic count
    await app.topics._update_indices()  # what the conductor does on subscribing
    assert direct_feeds(app) == {TOPIC: feed}
    await feed.put(messages(range(3)))
    await feed.put(messages(range(2), partition=1))
    first = await asyncio.wait_for(feed.take(4), 0.1)  # no batch window: what is there
    assert [(m.partition, m.offset) for m in first] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    rest = await asyncio.wait_for(feed.take(4), 0.1)
    assert [(m.partition, m.offset) for m in rest] == [(1, 1)]
    for message in first + rest:
        assert message.tracked and message in app.consumer.unacked
        message.incref()  # the fold's reference
        assert message.ack(app.consumer)  # tracked, current generation, flow on: counted
    assert app.consumer._acked[TP(TOPIC, 0)] == [0, 1, 2]
    await feed.put(messages(range(3, 6)))
    app.flow_control.clear()  # a revocation: faust's stream queues and the feed emptied
    assert not feed.queued
    with pytest.raises(ValueError, match="already has a direct feed"):
        direct_feed(app, TOPIC)


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
    assert all(m.acked and not m.tracked for m in old)  # refused: read again, not committed
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
