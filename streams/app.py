"""The faust app of engram and its topics; the wiring lives in :mod:`streams.pipeline`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import faust


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
) -> faust.App:
    """A faust app for one engram worker: in-memory table store (state is rebuilt
    from changelogs, or from the log itself), no faust web server (engram serves
    its own HTTP API), acks from all replicas.

    Group timeouts default to faust's; the embedded broker completes a new group's
    join only after about half the session timeout, so the embedded stack passes
    short ones."""
    timeouts: dict[str, Any] = {}
    if session_timeout_s is not None:
        timeouts["broker_session_timeout"] = session_timeout_s
        timeouts["broker_heartbeat_interval"] = max(0.5, session_timeout_s / 6)
    if rebalance_timeout_s is not None:
        timeouts["broker_rebalance_timeout"] = rebalance_timeout_s
    return faust.App(
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
        **timeouts,
    )


def raw_topic(app: faust.App, name: str) -> faust.TopicT:
    return app.topic(
        name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
    )


def create_topics(app: faust.App, *, events: str, memory: str, dead_letters: str) -> Topics:
    return Topics(raw_topic(app, events), raw_topic(app, memory), raw_topic(app, dead_letters))
