"""The faust app of engram and its topics; the wiring lives in :mod:`streams.pipeline`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiokafka
import faust
from faust.transport.drivers import aiokafka as faust_kafka

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


class _Consumer(faust_kafka.Consumer):
    """faust's consumer, made to commit only offsets whose messages an agent processed.

    Two faust behaviours commit past a message no agent ever saw, losing it on the
    next restart: (1) a stream *skips* the messages it takes during a rebalance (or
    from an older generation) and acks them, so the commit after the rebalance runs
    past them; (2) ``_new_offset`` commits a run of acked offsets that starts one past
    the committed offset (``min(acked) - committed > 1`` lets a hole of one through).
    Here an ack counts only for a message the stream delivered (``tracked``, set just
    after the skip test), and a run counts only when it starts at the committed
    offset. A refused ack only makes a message come again, which every engram agent
    takes idempotently."""

    def _new_consumer_thread(self) -> faust_kafka.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def ack(self, message: Any) -> bool:
        if not message.tracked:
            message.acked = True  # skipped, never delivered: read again, not committed
            return False
        return bool(super().ack(message))

    def _new_offset(self, tp: Any) -> int | None:
        acked = self._acked[tp]
        committed = self._committed_offset[tp]
        if acked and committed is not None and min(acked) > committed:
            return None  # the committed offset itself is not acked yet: a hole
        offset: int | None = super()._new_offset(tp)
        return offset


class Transport(faust_kafka.Transport):
    """faust's aiokafka transport whose worker consumer waits ``fetch_max_wait_ms`` and
    commits only what its agents processed (see ``_Consumer``)."""

    Consumer = _Consumer

    def __init__(self, *args: Any, fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fetch_max_wait_ms = fetch_max_wait_ms


@dataclass(frozen=True)
class Topics:
    """The three topics of the pipeline, as raw-bytes faust topics."""

    events: faust.TopicT
    memory: faust.TopicT
    dead_letters: faust.TopicT


def create_app(
    *,
    app_id: str,
    bootstrap: str,
    partitions: int,
    session_timeout_s: float | None = None,
    rebalance_timeout_s: float | None = None,
    fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS,
) -> faust.App:
    """A faust app for one engram worker: in-memory table store (state is rebuilt
    from changelogs, or from the log itself), no faust web server (engram serves
    its own HTTP API), acks from all replicas.

    Group timeouts default to faust's; the embedded broker completes a new group's
    join only after about half the session timeout, so the embedded stack passes
    short ones. ``fetch_max_wait_ms``: see :data:`FETCH_MAX_WAIT_MS`."""
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
        **timeouts,
    )
    app.transport = Transport(app.conf.broker_consumer, app, fetch_max_wait_ms=fetch_max_wait_ms)
    return app


def raw_topic(app: faust.App, name: str) -> faust.TopicT:
    return app.topic(
        name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
    )


def create_topics(app: faust.App, *, events: str, memory: str, dead_letters: str) -> Topics:
    return Topics(raw_topic(app, events), raw_topic(app, memory), raw_topic(app, dead_letters))
