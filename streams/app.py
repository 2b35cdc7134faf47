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
    def _new_consumer_thread(self) -> faust_kafka.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class Transport(faust_kafka.Transport):
    """faust's aiokafka transport whose worker consumer waits ``fetch_max_wait_ms``."""

    Consumer = _Consumer

    def __init__(self, *args: Any, fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fetch_max_wait_ms = fetch_max_wait_ms


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


def create_topics(
    app: faust.App, *, events: str, memory: str, dead_letters: str, ingest: str | None = None
) -> Topics:
    return Topics(
        raw_topic(app, events),
        raw_topic(app, memory),
        raw_topic(app, dead_letters),
        raw_topic(app, ingest) if ingest is not None else None,
    )
