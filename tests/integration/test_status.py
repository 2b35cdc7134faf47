"""``engram status`` (and ``GET /v1/status``): the worker's lag per partition, the
dead-letter count with the newest reason, the live projection versions."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from engram import Memory, make_event
from tests.support import Stack, engram_cmd, wait_until

pytestmark = pytest.mark.integration


def status(stack: Stack) -> dict[str, Any]:
    done = subprocess.run(
        engram_cmd("status", "--json"), env=stack.env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


async def send_raw(bootstrap: str, value: bytes) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait("engram.events", value, key=b"status-agent")
    finally:
        await producer.stop()


def test_status_shows_lag_dead_letters_and_projections(stack: Stack) -> None:
    before = status(stack)
    assert before["group"] == "engram-worker"
    topics = {(p["topic"], p["partition"]) for p in before["lag"]}
    assert {t for t, _ in topics} == {"engram.events", "engram.memory", "engram.ingest"}
    assert before["projections"]["clickhouse_memory_changes"] >= 1
    assert before["projections"]["vectors_live"] >= 1

    agent = f"status-{uuid.uuid4().hex[:8]}"
    with Memory(bootstrap=stack.bootstrap) as memory:
        memory.publish_many(
            make_event("interaction.recorded", agent_id=agent, session_id="s",
                       body={"role": "user", "content": f"消息 {i}"})
            for i in range(20)
        )  # fmt: skip
    marker = uuid.uuid4().hex
    asyncio.run(send_raw(stack.bootstrap, f'{{"type": "nope-{marker}"}}'.encode()))
    after = wait_until(
        lambda: (
            s
            if (s := status(stack))["dead_letters"]["count"] > before["dead_letters"]["count"]
            and s["total_lag"] == 0
            else None
        ),
        60,
        "the dead letter counted and the lag back to 0",
    )
    assert marker in after["dead_letters"]["last_reason"]
    events = [p for p in after["lag"] if p["topic"] == "engram.events"]
    earlier = sum(p["end"] for p in before["lag"] if p["topic"] == "engram.events")
    # the log grew (by 21 records on Apache Kafka; Tansu's end offsets count batches)
    assert sum(p["end"] for p in events) > earlier
    assert all(p["lag"] == 0 for p in after["lag"])
    # the ingest hop runs in a process of its own, in a group of its own
    groups = {p["topic"]: p["group"] for p in after["lag"]}
    assert groups == {
        "engram.events": None,
        "engram.memory": None,
        "engram.ingest": "engram-worker.ingest",
    }

    text = subprocess.run(
        engram_cmd("status"), env=stack.env, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert text.returncode == 0, text.stderr
    assert "consumer group engram-worker" in text.stdout and "dead letters" in text.stdout
    assert "engram.ingest (engram-worker.ingest)" in text.stdout
