"""publish -> faust worker -> ClickHouse, through a real broker and chdb."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from engram import Memory, make_event
from schemas import Codec, Event
from streams.pipeline import STATE_CHANGELOG
from tests.support import Stack, open_letters, wait_until

pytestmark = pytest.mark.integration
T0 = datetime(2026, 11, 1, 8, 0, tzinfo=UTC)


def agent() -> str:
    return f"agent-{uuid.uuid4().hex[:10]}"


def turns(agent_id: str, n: int, session: str = "s1") -> list[Event]:
    return [
        make_event(
            "interaction.recorded",
            agent_id=agent_id,
            session_id=session,
            user_id="u1",
            occurred_at=T0 + timedelta(seconds=i),
            body={"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} 第{i}轮"},
        )
        for i in range(n)
    ]


def count_events(stack: Stack, agent_id: str) -> int:
    return int(
        stack.scalar("SELECT count() FROM events FINAL WHERE agent_id = {a:String}", a=agent_id)
    )


def count_changes(stack: Stack, agent_id: str) -> int:
    return int(
        stack.scalar(
            "SELECT count() FROM memory_changes FINAL"
            " WHERE agent_id = {a:String} AND type = 'working.updated'",
            a=agent_id,
        )
    )


def test_published_events_reach_clickhouse_in_sequence(stack: Stack) -> None:
    agent_id = agent()
    events = turns(agent_id, 30)
    with Memory(bootstrap=stack.bootstrap) as memory:
        memory.publish_many(events)
    wait_until(lambda: count_events(stack, agent_id) == 30, 60, "30 events in ClickHouse")
    rows = stack.rows(
        "SELECT seq, event_id, type, body FROM events FINAL"
        " WHERE agent_id = {a:String} ORDER BY seq",
        a=agent_id,
    )
    assert [r[0] for r in rows] == list(range(30))
    assert [r[1] for r in rows] == [e.event_id for e in events]
    assert json.loads(rows[7][3])["content"] == "turn 7 第7轮"
    wait_until(lambda: count_changes(stack, agent_id) == 30, 60, "30 working.updated changes")
    deltas = [
        json.loads(body)
        for (body,) in stack.rows(
            "SELECT body FROM memory_changes FINAL"
            " WHERE agent_id = {a:String} AND type = 'working.updated' ORDER BY seq",
            a=agent_id,
        )
    ]
    working: list[str] = []
    for delta in deltas:
        working = working[delta["evicted"] :] + [t["content"] for t in delta["added"]]
        assert delta["size"] == len(working)
    assert working == [f"turn {i} 第{i}轮" for i in range(10, 30)], "the last 20 turns"
    assert deltas[-1]["evicted"] == 1
    assert deltas[-1]["tokens"] == sum(t["tokens"] for d in deltas[-20:] for t in d["added"]), (
        "tokens count the whole working memory"
    )


async def dlq_records(bootstrap: str, since: int) -> list[tuple[bytes, dict[str, bytes]]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition("engram.events.dlq", 0)
        consumer.assign([tp])
        consumer.seek(tp, since)
        batch = await consumer.getmany(tp, timeout_ms=1000)
        return [(m.value or b"", dict(m.headers)) for m in batch.get(tp, [])]
    finally:
        await consumer.stop()


async def dlq_end(bootstrap: str) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        tp = TopicPartition("engram.events.dlq", 0)
        return int((await consumer.end_offsets([tp]))[tp])
    finally:
        await consumer.stop()


async def produce_raw(bootstrap: str, items: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for key, value in items:
            await producer.send_and_wait("engram.events", key=key, value=value)
    finally:
        await producer.stop()


def test_malformed_message_goes_to_dlq_and_next_event_is_processed(stack: Stack) -> None:
    agent_id = agent()
    start = asyncio.run(dlq_end(stack.bootstrap))
    good = turns(agent_id, 1)[0]
    garbage = b"\xc3\x01\x00\x00\x00\x00\x00\x00\x00\x00 not avro"
    asyncio.run(
        produce_raw(
            stack.bootstrap,
            [(agent_id.encode(), garbage), (agent_id.encode(), Codec().encode(good))],
        )
    )
    wait_until(lambda: count_events(stack, agent_id) == 1, 60, "the good event after the bad one")

    def sealed_garbage() -> list[tuple[bytes, dict[str, bytes]]]:
        found = asyncio.run(dlq_records(stack.bootstrap, start))
        opened = open_letters(stack, [value for value, _ in found])
        return [r for r, raw in zip(found, opened, strict=True) if raw == garbage]

    records = wait_until(sealed_garbage, 30, "the bad message in the DLQ, sealed")
    assert garbage not in records[0][0]
    _, headers = records[0]
    assert headers["engram.reason"] == b"unknown Avro schema fingerprint 0000000000000000"
    assert headers["engram.source"].startswith(b"engram.events:")


def test_duplicate_event_id_yields_one_row(stack: Stack) -> None:
    agent_id = agent()
    events = turns(agent_id, 3)
    with Memory(bootstrap=stack.bootstrap) as memory:
        memory.publish_many([events[0], events[1], events[0], events[2], events[1]])
    wait_until(lambda: count_events(stack, agent_id) == 3, 60, "3 distinct events")
    wait_until(lambda: count_changes(stack, agent_id) == 3, 60, "3 changes")
    seqs = stack.rows(
        "SELECT seq, event_id FROM events FINAL WHERE agent_id = {a:String} ORDER BY seq",
        a=agent_id,
    )
    assert seqs == [(i, e.event_id) for i, e in enumerate(events)]


def test_json_event_from_a_plain_kafka_producer_is_processed(stack: Stack) -> None:
    agent_id = agent()
    obj = {
        "event_id": str(uuid.uuid4()),
        "type": "fact.asserted",
        "agent_id": agent_id,
        "session_id": None,
        "user_id": "u9",
        "occurred_at": "2026-11-01T10:00:00+08:00",
        "schema_version": 1,
        "body": {"namespace": "profile", "key": "city", "value": "上海"},
    }
    asyncio.run(produce_raw(stack.bootstrap, [(agent_id.encode(), json.dumps(obj).encode())]))
    wait_until(lambda: count_events(stack, agent_id) == 1, 60, "the JSON event")
    type_, occurred, user = stack.rows(
        "SELECT type, toString(occurred_at), user_id FROM events FINAL WHERE agent_id = {a:String}",
        a=agent_id,
    )[0]
    assert (type_, occurred, user) == ("fact.asserted", "2026-11-01 02:00:00.000", "u9")


def test_http_api_accepts_a_batch_and_rejects_it_whole(stack: Stack) -> None:
    agent_id = agent()
    events = [json.loads(e.model_dump_json()) for e in turns(agent_id, 3)]
    bad = [*events[:2], {**events[2], "body": {"role": "user"}}]
    rejected = httpx.post(f"{stack.http}/v1/events", json=bad, timeout=10)
    assert rejected.status_code == 422
    assert rejected.json()["index"] == 2
    assert "body.content" in rejected.json()["reason"]
    accepted = httpx.post(f"{stack.http}/v1/events", json=events, timeout=10)
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["accepted"] == 3
    wait_until(lambda: count_events(stack, agent_id) == 3, 60, "the 3 accepted events")
    assert count_events(stack, agent_id) == 3, "nothing of the rejected batch was published"


def test_http_mode_client_and_health(stack: Stack) -> None:
    agent_id = agent()
    with Memory(http=stack.http) as memory:
        memory.publish_many(turns(agent_id, 2))
    wait_until(lambda: count_events(stack, agent_id) == 2, 60, "events published over HTTP")
    health = httpx.get(f"{stack.http}/v1/health", timeout=5).json()
    assert health["status"] == "ok"
    assert health["kafka_bootstrap"] == stack.bootstrap


def test_superseded_agent_states_are_compacted_within_the_hour(stack: Stack) -> None:
    """The agent-state changelog (where a state an erasure replaced still holds the
    erased subject until compaction) is created with a bounded compaction lag. Apache
    Kafka only: the embedded broker keeps nothing across a restart and never compacts."""
    if os.environ.get("ENGRAM_TEST_BROKER") != "kafka":
        pytest.skip("topic configs are Apache Kafka's (ENGRAM_TEST_BROKER=kafka)")
    name = "engram-worker-agent_state-changelog"
    agent = f"compact-{uuid.uuid4().hex[:8]}"
    with Memory(bootstrap=stack.bootstrap) as memory:
        memory.publish(make_event("session.started", agent_id=agent, session_id="s"))
    wait_until(
        lambda: stack.scalar("SELECT count() FROM events WHERE agent_id = {a:String}", a=agent),
        60,
        "a state saved",
    )

    async def configs() -> dict[str, str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=stack.bootstrap)
        await admin.start()
        try:
            [response] = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, name)]
            )
        finally:
            await admin.close()
        [(error, _, _, _, entries)] = response.resources
        assert error == 0, response
        return {str(entry[0]): str(entry[1]) for entry in entries}

    found = asyncio.run(configs())
    assert found["cleanup.policy"] == "compact"
    assert {k: found[k] for k in STATE_CHANGELOG} == STATE_CHANGELOG
