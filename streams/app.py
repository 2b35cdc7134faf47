"""The faust app of engram and its topics; the wiring lives in :mod:`streams.pipeline`."""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import aiokafka
import faust
from faust.sensors.monitor import Monitor
from faust.transport import consumer as faust_consumer
from faust.transport.drivers import aiokafka as faust_kafka
from faust.types import TP
from faust.types.tuples import ConsumerMessage, ack_lock
from mode.utils.futures import notify

log = logging.getLogger("engram.streams")

HOLE_PATIENCE_S = 5.0
"""How long the committed offset of a partition may wait for its own message (a hole)
before the worker reads the partition again from there."""

FETCH_MAX_WAIT_MS = 100
"""How long the worker's fetches wait for data (faust's own consumer waits 1 500 ms).

The embedded broker (Tansu) answers a waiting fetch only when the wait ends, not when
data arrives, so the wait is the floor of the worker's latency on it: measured with
a record every 50 ms, receive latency p50/p95 362/714 ms at 1 500 ms, 25/41 ms at
100 ms. Apache Kafka answers as soon as data arrives; there a short wait only makes
idle fetches more frequent (10 per second per broker connection)."""


class _ConsumerThread(faust_kafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(
        self, transport: faust_kafka.Transport
    ) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        # aiokafka builds its fetcher from this at start(); faust passes a constant
        consumer._fetch_max_wait_ms = getattr(transport, "fetch_max_wait_ms", FETCH_MAX_WAIT_MS)
        return consumer


DIRECT_FEED_MAXSIZE = 16_384
"""How many messages a :class:`DirectFeed` holds before the worker's hand-over waits
(faust's ``stream_buffer_maxsize``, which bounds a stream's queue in the same way)."""


class DirectFeed:
    """The messages of one topic for one agent, handed by the worker's consumer
    straight to it, in lists, instead of one faust event at a time through the
    conductor, the topic's channel queue and the agent's stream (about 70 µs of the
    worker's time per message: ``ops/bench/faust_floor.py``). A topic may have several
    feeds, one per agent that reads it.

    The contract, which keeps what faust's stream does per message that engram relies on:

    - :meth:`_Consumer._hand_over` gives every fetched message of the topic to each of
      its feeds' :meth:`put`, once per fetched batch, with one reference per feed (as
      faust's conductor increfs a message once per stream it delivers it to), and marks
      a message read (its partition's read offset) only once every feed took it;
      :meth:`put` waits while the feed holds :attr:`maxsize` messages (back-pressure),
      its partitions meanwhile counted as buffered (``on_buffer_full``: not fetched,
      and not stranded for the :class:`StallWatch`), as faust counts a partition whose
      stream queue is full.
    - :meth:`take` gives what is queued, at most ``max_`` messages, without waiting when
      something is there (or, with ``within``, once ``max_`` are there or ``within``
      seconds after it began waiting). Like faust's stream, it skips a message of an
      older consumer generation or taken while the flow is stopped (a rebalance): it
      releases the feed's reference, and the final release acks it untracked, which
      ``_Consumer.ack`` refuses, so its partition is read again from it. Every other
      message is tracked (``tracked``, in ``consumer.unacked``) so the agents' acks
      count. The feed's reference of a message taken is released when the agent is
      done with the batch (:func:`fed_batches`, as faust's ``take_events`` acks a
      batch's events when the agent asks for the next one); an agent that keeps a
      message beyond its batch takes its own reference first (``incref``), as it does
      with faust's stream.
    - :meth:`clear` drops what is queued. The app's flow control calls it when it
      clears faust's stream queues (the feed registers with it on its first
      :meth:`put` or :meth:`take`, which the agent calls as it starts): when
      partitions are revoked, and when the flow resumes after an assignment.
      Nothing dropped was tracked or released, so nothing dropped is acked; faust reads
      the assigned partitions again from their committed offsets after the assignment
      (``perform_seek`` resets the read offsets), and where it does not, the fold's
      hole detection or the :class:`StallWatch` reads them again, as for what faust's
      queues dropped.
    - The agent must still have its topic subscribed, as a faust stream does when it is
      iterated: ``aiter(stream.channel)`` adds the topic to the conductor, whose
      channel then never receives anything (the hand-over gives it nothing).
    - ``ignores``, when given, names the values the agent would take and do nothing
      with (``ignores(value)`` true): :meth:`put` does not queue such a message; it
      takes it as :meth:`take` would (the same generation and flow checks: one refused
      is read again), hands the ones taken to ``passed`` (an agent that keeps its
      partitions' order counts them as done, :meth:`streams.ordered.InOrder.pass_over`)
      and releases them, as the end of a batch would. The committed offset of their
      partition still waits for every message before them. A message that every feed
      of its topic ignores is passed over so by the hand-over itself, once for all of
      them (:meth:`_Consumer._pass_over`), and reaches no :meth:`put`."""

    def __init__(
        self,
        app: Any,
        topic: str,
        maxsize: int = DIRECT_FEED_MAXSIZE,
        ignores: Callable[[bytes | None], bool] | None = None,
        passed: Callable[[list[Any]], None] | None = None,
    ) -> None:
        self.app = app
        self.topic = topic
        self.maxsize = maxsize
        self.ignores = ignores
        self.passed = passed
        self.queued: deque[Any] = deque()
        self._readable: asyncio.Event | None = None
        self._writable: asyncio.Event | None = None

    def _events(self) -> tuple[asyncio.Event, asyncio.Event]:
        """The feed's events, made on first use, in the worker's running loop; the
        feed is then registered with the app's flow control (which it clears with
        faust's stream queues). Not before: the first touch of ``app.flow_control``
        binds the app to the current event loop, and the worker runs the app on a
        loop it makes after the agents are declared."""
        if self._readable is None or self._writable is None:
            self._readable, self._writable = asyncio.Event(), asyncio.Event()
            self.app.flow_control.manage_queue(self)
        return self._readable, self._writable

    def full(self) -> bool:
        return len(self.queued) >= self.maxsize

    async def put(self, messages: list[Any]) -> None:
        """Queue ``messages`` (in fetch order, each holding a reference for this feed),
        once fewer than :attr:`maxsize` wait."""
        readable, writable = self._events()
        if self.ignores is not None:
            messages = self._pass_over(messages, self.ignores)
            if not messages:
                return
        while self.full():
            writable.clear()
            await writable.wait()
        self.queued.extend(messages)
        readable.set()

    def _pass_over(self, messages: list[Any], ignores: Callable[[bytes | None], bool]) -> list[Any]:
        """The ``messages`` this feed's agent does not ignore; the others are taken,
        handed to :attr:`passed` and released here (see the class's contract)."""
        kept: list[Any] = []
        ignored: list[Any] = []
        for message in messages:
            (ignored if ignores(message.value) else kept).append(message)
        if ignored:
            taken = self._track(ignored)
            if taken and self.passed is not None:
                self.passed(taken)
            self._release(taken)
        return kept

    def _track(self, batch: list[Any]) -> list[Any]:
        """The messages of ``batch`` the agent may process, tracked so that their acks
        count; the others (an older consumer generation, or the flow stopped: a
        rebalance) lose the feed's reference here, untracked, and are read again."""
        app = self.app
        consumer = app.consumer
        generation = app.consumer_generation_id
        active = app.flow_control.is_active()
        track = consumer.unacked.add
        taken: list[Any] = []
        for message in batch:
            if not active or message.generation_id != generation:
                message.ack(consumer)  # the feed's reference: refused, read again
                continue
            message.tracked = True
            track(message)
            taken.append(message)
        return taken

    def _release(self, messages: Sequence[Any]) -> None:
        """Release the feed's reference of ``messages`` (the agent is done with them)."""
        ack_messages(self.app.consumer, messages)

    async def take(self, max_: int, within: float | None = None) -> list[Any]:
        """The queued messages to process (at most ``max_``, at least one), waiting
        while none is queued, and with ``within`` until ``max_`` are or ``within``
        seconds passed; see the class's contract for what is skipped."""
        readable, writable = self._events()
        queued = self.queued
        while True:
            while not queued:
                readable.clear()
                await readable.wait()
            if within and len(queued) < max_:
                await self._gather(max_, within)
            n = min(max_, len(queued))
            batch = [queued.popleft() for _ in range(n)]
            if not self.full():
                writable.set()
            taken = self._track(batch)
            if taken:
                return taken

    async def _gather(self, max_: int, within: float) -> None:
        """Wait until ``max_`` messages are queued or ``within`` seconds passed."""
        readable, _ = self._events()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while len(self.queued) < max_ and (left := deadline - loop.time()) > 0:
            readable.clear()
            try:
                await asyncio.wait_for(readable.wait(), left)
            except TimeoutError:
                return

    def clear(self) -> int:
        """Drop what is queued (partitions revoked); how many messages were dropped."""
        dropped = len(self.queued)
        self.queued.clear()
        if self._writable is not None:
            self._writable.set()
        return dropped


def direct_feeds(app: Any) -> dict[str, list[DirectFeed]]:
    """The app's direct feeds by topic name (empty unless :func:`direct_feed` made one)."""
    feeds: dict[str, list[DirectFeed]] | None = getattr(app, "_engram_direct_feeds", None)
    if feeds is None:
        feeds = app._engram_direct_feeds = {}
    return feeds


def direct_feed(
    app: Any,
    topic: str,
    maxsize: int = DIRECT_FEED_MAXSIZE,
    ignores: Callable[[bytes | None], bool] | None = None,
    passed: Callable[[list[Any]], None] | None = None,
) -> DirectFeed:
    """A new :class:`DirectFeed` of ``topic`` on ``app``, for one agent: the worker's
    consumer hands every message of ``topic`` to it (and to the topic's other feeds)
    from now on, none to faust's streams; what ``ignores`` names is passed over (see
    the class). Declaring it binds no event loop (see :meth:`DirectFeed._events`)."""
    feed = DirectFeed(app, topic, maxsize, ignores, passed)
    direct_feeds(app).setdefault(topic, []).append(feed)
    return feed


class Delivered:
    """A message taken from a :class:`DirectFeed`, shaped as an agent takes a faust
    event (its ``message`` only)."""

    __slots__ = ("message",)

    def __init__(self, message: Any) -> None:
        self.message = message


async def fed_batches(
    stream: faust.StreamT[bytes], feed: DirectFeed, batch_size: int, within: float | None = None
) -> AsyncIterator[list[Delivered]]:
    """An agent's batches from its direct ``feed``: up to ``batch_size`` of the messages
    queued there, as soon as there is one (with ``within``: once ``batch_size`` are, or
    ``within`` seconds after the first), where its stream's ``take_events`` waits up to
    its window for a full batch. Each batch's messages lose the feed's reference when
    the agent asks for the next batch or stops (as ``take_events`` acks its events).
    The stream's topic stays subscribed: ``aiter`` of its channel adds it to faust's
    conductor, as iterating the stream does; the worker's consumer hands that channel
    nothing."""
    aiter(stream.channel)
    while True:
        messages = await feed.take(batch_size, within)
        try:
            yield [Delivered(message) for message in messages]
        finally:
            feed._release(messages)


def agent_batches(
    stream: faust.StreamT[bytes],
    feed: DirectFeed | None,
    batch_size: int,
    within: float,
    *,
    gather: bool = False,
) -> AsyncIterator[Sequence[Any]]:
    """An agent's batches: from its direct ``feed`` when it has one (see
    :func:`fed_batches`; with ``gather``, a batch waits up to ``within`` seconds to
    fill, otherwise it goes as soon as one message waits), else from its faust stream
    (``take_events``: ``batch_size`` within ``within`` seconds)."""
    if feed is None:
        return cast(faust.Stream[bytes], stream).take_events(batch_size, within=within)
    return fed_batches(stream, feed, batch_size, within if gather else None)


def _message(tp: TP, record: Any, generation: int | None) -> ConsumerMessage:
    """The faust message of aiokafka's ``record`` of ``tp``, fetched in consumer
    generation ``generation``: what faust's ``Consumer._to_message`` makes of it."""
    timestamp = record.timestamp
    return ConsumerMessage(
        record.topic,
        record.partition,
        record.offset,
        cast(float, None) if timestamp is None else timestamp / 1000.0,
        record.timestamp_type,
        record.headers,
        record.key,
        record.value,
        record.checksum,
        record.serialized_key_size,
        record.serialized_value_size,
        tp,
        generation_id=generation,
    )


def ack_messages(consumer: Any, messages: Iterable[Any]) -> None:
    """``message.ack(consumer)`` for each of ``messages``, in order: in one step by
    the worker's consumer (:meth:`_Consumer.ack_all`), one by one by any other."""
    ack_all = getattr(consumer, "ack_all", None)
    if ack_all is not None:
        ack_all(messages)
        return
    for message in messages:
        message.ack(consumer)


class _Consumer(faust_kafka.Consumer):
    """faust's consumer, made to commit only offsets whose messages every agent of
    their topic processed.

    faust can commit past a message an agent never saw, losing it on the next start:
    (1) a stream *skips* the messages it takes during a rebalance (or from an older
    generation) and acks them, and with two agents on one topic the other agent's
    ack completes the message; (2) after a rebalance it seeks back to the committed
    offset to read skipped messages again, but a partition with no committed offset
    is not sought at all, so they never come again; (3) ``_new_offset`` commits a
    run of acked offsets that starts one past the committed offset (its test
    ``min(acked) - committed > 1`` lets a hole of one through). Here an ack made
    while the flow is stopped or for an older generation does not count (the
    message is read again: every engram agent takes a message twice idempotently), a
    partition without a committed offset is read again from the start of its log,
    and a run counts only when it starts at the committed offset."""

    def _new_consumer_thread(self) -> faust_kafka.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def ack(self, message: Any) -> bool:
        app = self.app
        if (
            not message.tracked
            or message.generation_id != app.consumer_generation_id
            or not app.flow_control.is_active()
        ):
            message.acked = True  # not processed by every agent: read again, not committed
            self._read_again(message.tp, message.offset)
            return False
        return bool(super().ack(message))

    def ack_all(self, messages: Iterable[Any]) -> None:
        """``message.ack(self)`` for each of ``messages``, in order, with the same
        outcome, as one step under faust's ack lock: the references released, the
        messages acked, those refused read again (:meth:`ack`), the acked offsets
        and count that faust's commits read (faust's ``Consumer.ack``, faust-streaming
        0.15). Why: one message's ack is five calls and three holds of that lock
        (~3 µs), and the worker acks every message of its two topics. The consumer
        generation and the flow are read once: nothing changes them within the loop (a
        rebalance runs on this event loop). A message of another kind than faust's
        :class:`ConsumerMessage` takes its own ``ack``."""
        app = self.app
        generation = app.consumer_generation_id
        active = app.flow_control.is_active()
        acks_enabled_for = app.topics.acks_enabled_for
        committed_offsets, acked_indexes, acked = (
            self._committed_offset,
            self._acked_index,
            self._acked,
        )
        counted = 0
        with ack_lock:
            try:
                for message in messages:
                    if message.acked:
                        continue
                    if type(message) is not ConsumerMessage:
                        message.ack(self)
                        continue
                    refcount = message.refcount = max(message.refcount - 1, 0)
                    if refcount:
                        continue
                    message.acked = True
                    tp, offset = message.tp, message.offset
                    if not message.tracked or message.generation_id != generation or not active:
                        self._read_again(tp, offset)  # not processed by every agent
                        continue
                    if not acks_enabled_for(message.topic):
                        continue
                    committed = committed_offsets[tp]
                    if committed is None or offset >= committed:
                        index = acked_indexes[tp]
                        if offset not in index:
                            self._unacked_messages.discard(message)
                            index.add(offset)
                            acked[tp].append(offset)
                            counted += 1
            finally:
                self._n_acked += counted
                notify(self._waiting_for_ack)

    _engram_rewind: dict[Any, int] | None = None
    _engram_rewinding: asyncio.Future[None] | None = None

    def _read_again(self, tp: Any, offset: int) -> None:
        """Have ``tp`` read again from ``offset`` (soon, once for all the refused acks
        of this loop iteration), if it is still assigned here and not committed past."""
        committed = self._committed_offset.get(tp)
        if committed is not None and offset < committed:
            return
        if self._engram_rewind is None:
            self._engram_rewind = {}
        self._engram_rewind[tp] = min(offset, self._engram_rewind.get(tp, offset))
        if self._engram_rewinding is None or self._engram_rewinding.done():
            self._engram_rewinding = asyncio.ensure_future(self._rewind())

    _engram_holes: dict[Any, tuple[int, float]] | None = None

    def _heal(self, tp: Any, committed: int) -> None:
        """A hole at ``committed`` that outlasts :data:`HOLE_PATIENCE_S` (its message
        was refused, and faust's own re-read did not bring it again) is read again."""
        if self._engram_holes is None:
            self._engram_holes = {}
        now = time.monotonic()
        seen = self._engram_holes.get(tp)
        if seen is None or seen[0] != committed:
            self._engram_holes[tp] = (committed, now)
        elif now - seen[1] > HOLE_PATIENCE_S:
            self._engram_holes[tp] = (committed, now)
            self._read_again(tp, committed)

    async def _rewind(self) -> None:
        await asyncio.sleep(0)
        rewind, self._engram_rewind = self._engram_rewind or {}, None
        assigned = self.assignment()
        for tp, offset in sorted(rewind.items()):
            if tp in assigned:
                log.info("%s[%d]: reading again from %d (acks refused)", *tp, offset)
                await self.seek(tp, offset)

    async def _seek(self, partition: Any, offset: int) -> None:
        """aiokafka's seek, run in the consumer's thread (every seek of this consumer
        comes here: faust's ``seek``, the re-reads, :meth:`perform_seek`). faust calls
        it from the worker's loop while that thread may be draining the fetched
        records, and aiokafka's fetcher then fails (``KeyError`` in
        ``fetched_records``: the fetcher crashed and the worker read nothing more;
        seen with frequent re-reads, and once at a start after ``kill -9``)."""
        thread = self._thread

        async def seek_there() -> None:
            thread.seek(partition, offset)

        await thread.call_thread(seek_there)

    async def perform_seek(self) -> None:
        await super().perform_seek()
        tracked = [tp for tp in self.assignment() if self.app.topics.acks_enabled_for(tp.topic)]
        if not tracked:
            return
        earliest = await self.earliest_offsets(*tracked)
        for tp in tracked:
            start = earliest.get(tp)
            committed = self._committed_offset.get(tp)
            if start is None or (committed is not None and committed >= start):
                continue
            if committed is not None:  # retention removed what was never read: gone
                log.warning(
                    "%s[%d]: offsets %d..%d are gone from the log", *tp, committed, start - 1
                )
            await self._seek(tp, start)
            self._read_offset[tp] = None
            self._committed_offset[tp] = start  # nothing processed before ``start``

    async def _add_gap(self, tp: Any, offset_from: int, offset_to: int) -> None:
        """faust counts offsets it did not see between two deliveries as acked (for
        compacted or transactional topics, whose offsets jump). engram's topics have
        contiguous offsets, so a jump is a read cut short by a seek (messages fetched
        before it are still delivered): counting it acked would commit past messages
        not processed yet. Nothing is counted; the seek's re-read brings them."""

    async def _drain_messages(self, fetcher: Any) -> None:
        """faust's drain loop (the worker's reading of fetched records), with one
        :meth:`wait_first` per fetched batch instead of one per message.

        faust hands each message to its streams through ``wait_first(callback,
        suspend_flow.wait())``, which makes four tasks and an ``asyncio.wait`` per
        message: most of its ~100 µs floor per message on this machine
        (``ops/bench/faust_floor.py``). Here a batch is handed over message by message
        in one task, which the same ``wait_first`` abandons when the flow is
        suspended (a rebalance), the consumer stops or the app crashes, as faust
        abandons one message. What a batch had not handed over is not marked read,
        so a seek brings it again (faust marked it read though never delivered)."""
        consumer_stopped = self._stopped.is_set
        fetcher_stopped = fetcher._stopped.is_set
        flag = faust_consumer.CONSUMER_FETCHING
        try:
            while not (consumer_stopped() or fetcher_stopped()):
                self.diag.set_flag(flag)
                batch = await self._fetched(1.0)
                await self.sleep(0)  # the fetch may not have released the loop
                if batch and not self.should_stop:
                    await self.wait_first(self._hand_over(batch), self.suspend_flow.wait())
                self.diag.unset_flag(flag)
        except self.consumer_stopped_errors:
            if not self.transport.app.should_stop:
                raise
            self.log.info("Broker stopped consumer, shutting down...")
        except asyncio.CancelledError:
            if not self.transport.app.should_stop:
                raise
            self.log.info("Consumer shutting down for user cancel.")
        except Exception as exc:
            self.log.exception("Drain messages raised: %r", exc)
            raise
        finally:
            self.diag.unset_flag(flag)

    async def _fetched(self, wait_s: float) -> list[tuple[Any, Any]]:
        """faust's ``getmany`` (the records fetched, as ``(tp, message)`` in its
        round-robin order, only of the partitions it would give), in one list.

        faust's async generator re-checks the flow, the consumer generation and the
        partition's high watermark at every message it yields. Nothing can change the
        first two within one batch (a rebalance runs on this loop, which the list's
        making never releases), so they are read once; the high watermark (a lag
        metric) is tracked once per partition. The messages are those faust's
        ``_to_message`` makes."""
        records, active = await self._wait_next_records(wait_s)
        if records is None or self.should_stop:
            return []
        if not self.flow_active:
            self.log.dev("getmany called while flow not active. Seek back to committed offsets.")
            try:
                await self.perform_seek()
            except Exception as ex:
                self.log.warning(f"exception performing seek when flow not active {ex}")
            return []
        generation = self.app.consumer_generation_id
        buffered = self._buffered_partitions
        fetched: list[tuple[Any, Any]] = []
        append = fetched.append
        tps: dict[Any, None] = {}
        for tp, record in self.scheduler.iterate(records):
            if active is not None and tp not in active and tp not in buffered:
                continue
            tps[tp] = None
            append((tp, _message(tp, record, generation)))
        track = self.app.monitor.track_tp_end_offset
        for tp in tps:
            track(tp, self.highwater(tp))
        return fetched

    async def _hand_over(self, batch: list[tuple[Any, Any]]) -> None:
        r"""Hand ``batch`` (``(tp, message)`` in fetch order) to the streams, skipping
        what was already read (a seek back re-reads it), as faust does per message;
        the loop is released every 100 messages. The messages of a topic with
        :class:`DirectFeed`\ s go to them instead, in one list per topic, after the
        others; they count as read once every feed of their topic took them."""
        callback = self.callback
        read_offset = self._read_offset
        commit_every = self._commit_every
        feeds = direct_feeds(self.app)
        fed: dict[str, tuple[list[Any], dict[Any, int]]] = {}
        since_yield = 0
        for tp, message in batch:
            since_yield += 1
            if since_yield > 100:
                await asyncio.sleep(0)
                since_yield = 0
            offset = message.offset
            if feeds and tp.topic in feeds:
                entry = fed.get(tp.topic)
                if entry is None:
                    entry = fed[tp.topic] = ([], {})
                messages, reads = entry
                read = reads.get(tp)
                if read is None:
                    read = read_offset.get(tp)
                if read is not None and offset < read:
                    continue
                messages.append(message)
                reads[tp] = offset
                continue
            read = read_offset.get(tp)
            if read is not None and offset < read:
                continue
            if commit_every is not None and self._n_acked >= commit_every:
                self._n_acked = 0
                await self.commit()
            await callback(message)
            read_offset[tp] = offset
        for topic, (messages, reads) in fed.items():
            readers = feeds[topic]
            messages = self._pass_over(readers, messages)
            if messages:
                for message in messages:  # one reference per feed, before any feed has it
                    message.incref(len(readers))
                for feed in readers:
                    await self._feed(feed, messages, reads)
            read_offset.update(reads)

    def _pass_over(self, readers: list[DirectFeed], messages: list[Any]) -> list[Any]:
        """The ``messages`` some feed of ``readers`` takes; each of the others, which
        every feed ignores, is passed over here once for them all, as each feed's
        :meth:`DirectFeed.put` would pass it over (refused in an older generation or a
        stopped flow and read again; else handed to each feed's ``passed`` and acked),
        without a reference, a tracking and a release per feed."""
        checks = [feed.ignores for feed in readers if feed.ignores is not None]
        if not messages or len(checks) < len(readers):
            return messages
        kept: list[Any] = []
        taken: list[Any] = []
        generation = self.app.consumer_generation_id
        active = self.app.flow_control.is_active()
        for message in messages:
            value = message.value
            for ignores in checks:
                if not ignores(value):
                    kept.append(message)
                    break
            else:
                if active and message.generation_id == generation:
                    message.tracked = True
                    taken.append(message)
                else:
                    message.ack(self)  # untracked: refused, read again
        if taken:
            for feed in readers:
                if feed.passed is not None:
                    feed.passed(taken)
            self.ack_all(taken)
        return kept

    async def _feed(self, feed: DirectFeed, messages: list[Any], reads: dict[Any, int]) -> None:
        """Put ``messages`` (reading ``reads``, the last offset per partition) in
        ``feed``; while it is full, their partitions count as buffered, as faust counts
        a partition whose stream queue is full."""
        if not feed.full():
            await feed.put(messages)
            return
        # faust's TP: its active-partition set asserts it (getmany's are aiokafka's)
        tps = [TP(tp.topic, tp.partition) for tp in reads]
        for tp in tps:
            self.on_buffer_full(tp)
        try:
            await feed.put(messages)
        except BaseException:  # abandoned (a rebalance, a stop)
            assigned = self.assignment()
            for tp in tps:
                if tp in assigned:
                    self.on_buffer_drop(tp)
                else:  # revoked meanwhile: not fetched here any more
                    self._buffered_partitions.discard(tp)
            raise
        for tp in tps:
            self.on_buffer_drop(tp)

    def _new_offset(self, tp: Any) -> int | None:
        acked = self._acked[tp]
        committed = self._committed_offset[tp]
        if acked and committed is not None and min(acked) > committed:
            self._heal(tp, committed)
            return None  # the committed offset itself is not acked yet: a hole
        offset: int | None = super()._new_offset(tp)
        return offset


STALL_PATIENCE_S = 5.0
"""How long a partition may sit with records fetched past what its agents were handed
before the worker reads it again from its committed offset (:class:`StallWatch`)."""

UNFINISHED_PATIENCE_S = 20.0
"""How long a partition may sit, nothing moving, with records handed to its agents
and not committed before the worker reads it again from its committed offset."""


@dataclass(frozen=True)
class Standing:
    """Where one partition stands in the worker's consumer: the offset of the last
    message handed to the agents (``read``, None before the first), the group's
    committed offset (the next to process), the fetcher's position (the next to
    fetch), and whether fetched records still wait to be handed over (``buffered``:
    in the fetcher, or behind an agent's full buffer)."""

    read: int | None
    committed: int | None
    position: int | None
    buffered: bool

    def stranded(self) -> int | None:
        """The first offset fetched but never handed over, if any: the fetcher went
        past what the agents got, and holds nothing more for them."""
        if self.position is None or self.committed is None or self.buffered:
            return None
        handed = max(self.committed, -1 if self.read is None else self.read + 1)
        return handed if self.position > handed else None

    def unfinished(self) -> bool:
        """Whether records fetched for the agents are not all committed yet."""
        return (
            self.position is not None
            and self.committed is not None
            and not self.buffered
            and self.position > self.committed
        )


class StallWatch:
    """Reads a partition again from its committed offset when it stands still with
    work left: records fetched that never reached the agents, for
    ``patience_s`` (:data:`STALL_PATIENCE_S`), or records handed over and never
    committed, for ``unfinished_s`` (:data:`UNFINISHED_PATIENCE_S`).

    faust can drop records it fetched: a worker that starts resumes its flow while it
    still restores its tables and seeks to the committed offsets only afterwards, and
    records fetched across that seek are lost to the agents (seen with a worker
    started on a group whose committed offsets lagged its marks: the partition stood
    still for ever with the fetcher at the log's end); records handed to a stream
    were seen never to reach its agent, likewise. A seek back to the committed
    offset brings them again; what comes twice is skipped (every engram agent takes
    a message twice idempotently), so a seek made while an agent is merely slow
    (a flush longer than the patience) costs a re-read, nothing else."""

    def __init__(
        self, patience_s: float = STALL_PATIENCE_S, unfinished_s: float = UNFINISHED_PATIENCE_S
    ) -> None:
        self.patience_s = patience_s
        self.unfinished_s = unfinished_s
        self.seen: dict[Any, tuple[Standing, float]] = {}

    def due(self, standings: dict[Any, Standing], now: float) -> list[tuple[Any, int]]:
        """The partitions to read again now, with their committed offsets (their clocks
        restart); partitions no longer assigned are forgotten."""
        out: list[tuple[Any, int]] = []
        for tp in set(self.seen) - set(standings):
            del self.seen[tp]
        for tp, standing in standings.items():
            seen = self.seen.get(tp)
            if seen is None or seen[0] != standing or standing.committed is None:
                self.seen[tp] = (standing, now)
                continue
            still = now - seen[1]
            stranded = standing.stranded() is not None and still >= self.patience_s
            if stranded or (standing.unfinished() and still >= self.unfinished_s):
                self.seen[tp] = (standing, now)
                out.append((tp, standing.committed))
        return out

    async def check(self, consumer: Any) -> None:
        """Seek the stalled partitions of the worker's ``consumer`` back."""
        for tp, offset in self.due(standings(consumer), time.monotonic()):
            stand = self.seen[tp][0]
            log.warning(
                "%s[%d]: standing still (fetched up to %d, handed over up to %s,"
                " committed %d); reading again from %d",
                tp.topic,
                tp.partition,
                stand.position,
                stand.read,
                offset,
                offset,
            )
            await consumer.seek(tp, offset)


def standings(consumer: Any) -> dict[Any, Standing]:
    """:class:`Standing` of every assigned partition of a topic whose messages are
    acked (the agents' topics), from faust's consumer and its aiokafka consumer; empty
    while the consumer is not running."""
    try:
        inner = consumer._thread._ensure_consumer()
        assignment = inner._subscription.subscription.assignment
        fetched = inner._fetcher._records
        acked_topics = consumer.app.topics.acks_enabled_for
        assigned = list(consumer.assignment())
    except Exception:  # not started, stopping, or between assignments
        return {}
    out: dict[Any, Standing] = {}
    for tp in assigned:
        if not acked_topics(tp.topic):
            continue
        try:
            position = assignment.state_value(tp).position
        except Exception:
            continue
        out[tp] = Standing(
            consumer._read_offset.get(tp),
            consumer._committed_offset.get(tp),
            position,
            tp in fetched or tp in consumer._buffered_partitions,
        )
    return out


class Transport(faust_kafka.Transport):
    """faust's aiokafka transport whose worker consumer waits ``fetch_max_wait_ms`` and
    commits only what its agents processed (see ``_Consumer``)."""

    Consumer = _Consumer

    def __init__(self, *args: Any, fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fetch_max_wait_ms = fetch_max_wait_ms


class QuietMonitor(Monitor):
    """faust's monitor without its per-message and per-event bookkeeping.

    faust's monitor counts and times every message and every stream event (dicts
    keyed by partition and stream, a state dict per event): about 2 % of the fold's
    time, for statistics only faust's web views read, and engram runs no faust web
    server. Every other hook (commits, sends, tables, rebalances) is kept."""

    def on_message_in(self, tp: Any, offset: int, message: Any) -> None:
        return None

    def on_stream_event_in(self, tp: Any, offset: int, stream: Any, event: Any) -> None:
        return None

    def on_stream_event_out(
        self, tp: Any, offset: int, stream: Any, event: Any, state: Any = None
    ) -> None:
        return None

    def on_message_out(self, tp: Any, offset: int, message: Any) -> None:
        return None


@dataclass(frozen=True)
class Topics:
    """The topics of the pipeline, as raw-bytes faust topics (``ingest``: where
    producers without keys publish, sealed onto ``events`` by :mod:`streams.ingest`)."""

    events: faust.TopicT
    memory: faust.TopicT
    dead_letters: faust.TopicT
    ingest: faust.TopicT | None = None


def create_app(
    *,
    app_id: str,
    bootstrap: str,
    partitions: int,
    session_timeout_s: float | None = None,
    rebalance_timeout_s: float | None = None,
    fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS,
    datadir: Path | None = None,
) -> faust.App:
    """A faust app for one engram worker: in-memory table store (state is rebuilt
    from changelogs, or from the log itself), no faust web server (engram serves
    its own HTTP API), acks from all replicas.

    Group timeouts default to faust's; the embedded broker completes a new group's
    join only after about half the session timeout, so the embedded stack passes
    short ones. ``fetch_max_wait_ms``: see :data:`FETCH_MAX_WAIT_MS`. ``datadir`` is
    where faust keeps its files (the worker passes its home; by default a directory
    under the system's temporary one, never the current directory)."""
    timeouts: dict[str, Any] = {}
    if session_timeout_s is not None:
        timeouts["broker_session_timeout"] = session_timeout_s
        timeouts["broker_heartbeat_interval"] = max(0.5, session_timeout_s / 6)
    if rebalance_timeout_s is not None:
        timeouts["broker_rebalance_timeout"] = rebalance_timeout_s
    app = faust.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        store="memory://",
        web_enabled=False,
        datadir=str(datadir or Path(tempfile.gettempdir()) / "engram-faust" / app_id),
        topic_partitions=partitions,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        table_standby_replicas=0,
        broker_commit_every=10_000,
        broker_commit_interval=1.0,
        stream_buffer_maxsize=16_384,
        # stopping does not wait for every delivered message to be acked: an agent
        # stopped with a half-filled take_events buffer never acks it, and the stop
        # would hang; what is not acked is not committed and comes again (idempotent)
        stream_wait_empty=False,
        Monitor=QuietMonitor,
        **timeouts,
    )
    app.transport = Transport(app.conf.broker_consumer, app, fetch_max_wait_ms=fetch_max_wait_ms)
    watch = StallWatch()

    @app.timer(1.0)  # type: ignore[untyped-decorator]  # faust's decorator is untyped
    async def read_stalls_again() -> None:
        await watch.check(app.consumer)

    return app


class RawSchema(faust.Schema[bytes, bytes]):
    """Keys and values as the bytes the broker holds: what faust's ``raw`` serializer
    gives for ``bytes`` types, without the serializer registry's lookups (codec by
    name, payload preparation, the event class read from the settings) per message."""

    def compile(
        self,
        app: Any,
        *,
        on_key_decode_error: Any = None,
        on_value_decode_error: Any = None,
        default_propagate: bool = False,
    ) -> Any:
        event_class = app.conf.Event

        async def decode(message: Any, *, propagate: bool = default_propagate) -> Any:
            return event_class(app, message.key, message.value, message.headers, message)

        return decode


def raw_topic(app: faust.App, name: str) -> faust.TopicT:
    """A topic of raw bytes keys and values (:class:`RawSchema`)."""
    schema = RawSchema(
        key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
    )
    return app.topic(name, schema=schema)


def create_topics(
    app: faust.App, *, events: str, memory: str, dead_letters: str, ingest: str | None = None
) -> Topics:
    return Topics(
        raw_topic(app, events),
        raw_topic(app, memory),
        raw_topic(app, dead_letters),
        raw_topic(app, ingest) if ingest is not None else None,
    )
