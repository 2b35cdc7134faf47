"""Broker faults on Apache Kafka (issue 6, item 3): the broker is killed with SIGKILL
while a client publishes and ``engram up`` folds, and started again on the same data
directory and port. Every event the client saw acknowledged ends up in the history,
none twice, and the projections equal the pure fold of those events. While the
broker is away, the client retries with backoff and raises BrokerUnavailable (or
PublishError for sends already under way) only once its deadline has passed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engram import Memory
from engram.errors import BrokerUnavailable, PublishError
from ops.bench.outage import Publisher, complete, expected, history, settled, wait_for
from ops.kafka import ApacheKafka, available
from ops.topics import ensure_topics, pipeline_topics
from tests.support import start_stack

UNAVAILABLE = available()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(UNAVAILABLE is not None, reason=UNAVAILABLE or ""),
]
RESTARTS = 2
DOWN_S = 3.0
# A member whose broker vanished rejoins quickly once it is back.
WORKER_ENV = {"ENGRAM_SESSION_TIMEOUT_S": "6", "ENGRAM_REBALANCE_TIMEOUT_S": "3"}


@pytest.fixture
def kafka(tmp_path: Path) -> Iterator[ApacheKafka]:
    with ApacheKafka(tmp_path / "kafka") as broker:
        yield broker


@pytest.fixture
def topics(kafka: ApacheKafka) -> ApacheKafka:
    """The broker, with the pipeline's topics (no ``engram up`` to create them)."""
    specs = pipeline_topics("engram.events", "engram.memory", "engram.events.dlq", 6)
    asyncio.run(ensure_topics(kafka.bootstrap, specs))
    return kafka


@pytest.mark.timeout(600)  # the catching-up wait fails first, saying why
def test_acknowledged_events_survive_broker_crashes_once_each(
    kafka: ApacheKafka, tmp_path: Path
) -> None:
    stack = start_stack(
        tmp_path / "home", 180.0, ENGRAM_KAFKA_BOOTSTRAP=kafka.bootstrap, **WORKER_ENV
    )
    try:
        events = history(900, run="broker-faults")
        publisher = Publisher(kafka.bootstrap, events, deadline=60.0)
        publisher.start()
        for restart in range(RESTARTS):
            mark = 200 * (restart + 1)
            wait_for(lambda: len(publisher.acked) > mark, 120, "publishing")  # noqa: B023
            kafka.kill()
            time.sleep(DOWN_S)
            kafka.start()
        publisher.join(300)
        assert not publisher.is_alive()
        assert publisher.errors == [], "the 60 s deadline outlasts each outage"
        want = expected(publisher.acked)
        try:
            wait_for(lambda: complete(stack.http, want), 300, "the worker catching up")
            late = None
        except TimeoutError as error:
            late = str(error)
        if late is not None:
            counts = [
                stack.scalar(f"SELECT count() FROM {t}") for t in ("events", "memory_changes")
            ]
            held = f"held {counts}, want {[len(want.events), len(want.changes)]}"
            pytest.fail(f"{late}: {held}\n{stack.explain()}", pytrace=False)
        settled(stack.http)
        ids = [str(r[0]) for r in stack.rows("SELECT event_id FROM events")]
        changes = [str(r[0]) for r in stack.rows("SELECT event_id FROM memory_changes")]
    finally:
        code = stack.stop()
    assert code == 0, f"engram up exited with {code}; see {stack.home / 'up.log'}"
    assert len(publisher.acked) == len(events)
    assert sorted(ids) == sorted(want.events), "every acknowledged event, once"
    assert sorted(changes) == sorted(want.changes), "every memory change, once"


def test_publishing_to_a_dead_broker_retries_until_the_deadline(topics: ApacheKafka) -> None:
    kafka = topics
    events = history(10, run="dead-broker")
    with Memory(bootstrap=kafka.bootstrap, timeout=4.0) as started:
        started.publish_many(events[:5])  # a producer already connected
        kafka.kill()
        began = time.monotonic()
        with pytest.raises(PublishError):
            started.publish_many(events[5:])
        waited_started = time.monotonic() - began
    with Memory(bootstrap=kafka.bootstrap, timeout=3.0) as fresh:  # never connected
        began = time.monotonic()
        with pytest.raises(BrokerUnavailable) as raised:
            fresh.publish_many(events[5:])
        waited_fresh = time.monotonic() - began
    assert waited_started >= 4.0, "a started producer waits out its deadline"
    assert waited_fresh >= 3.0, "a new client tries to connect until its deadline"
    assert raised.value.attempts > 1, "it tried again, with backoff"
    assert kafka.bootstrap in str(raised.value) and "deadline" in str(raised.value)


def test_a_publish_waiting_on_a_restarting_broker_is_acknowledged(topics: ApacheKafka) -> None:
    """The broker is restarted from this (the main) thread: it dies with the thread
    that started it (``PR_SET_PDEATHSIG``), so never from a short-lived one."""
    kafka = topics
    events = history(10, run="restarting-broker")
    with Memory(bootstrap=kafka.bootstrap, timeout=60.0) as memory:
        memory.publish_many(events[:5])
        kafka.kill()
        waiting = Publisher(kafka.bootstrap, events[5:], deadline=60.0)
        waiting.start()
        time.sleep(DOWN_S)
        assert waiting.is_alive() and waiting.acked == [], "no acknowledgement while down"
        kafka.start()
        waiting.join(90)
    assert waiting.errors == []
    assert waiting.acked == events[5:]
