"""Sealing end to end, on the session's ``engram up`` (real broker, chdb, vectors).

Events published by a client without a master key (to ``engram.ingest``) and through
``POST /v1/events`` reach ClickHouse and recall in clear, while no record of
``engram.events``, ``engram.memory`` or ``engram.keys`` holds a byte of their content;
a replay (snapshot road 1) skips, without error, the events of a subject whose key
was destroyed."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from engram import Memory, make_event
from engram.settings import Settings
from schemas import Event
from schemas.sealed import is_sealed
from sinks.keys import KafkaKeyring, MasterKey
from tests.support import FAST_GROUP, Stack, broker_kind, start_stack, wait_until

pytestmark = pytest.mark.integration
KEPT = ("engram.events", "engram.memory", "engram.keys")


def plants() -> dict[str, str]:
    """Unique strings, one per field that carries content."""
    tag = uuid.uuid4().hex[:10]
    return {
        name: f"{name}{tag}"
        for name in ("turn", "reply", "zhturn", "tool", "fact", "persona", "pref")
    }


def history(agent_id: str, user_id: str, p: dict[str, str], start: datetime) -> list[Event]:
    """A bilingual session that plants every string of ``p`` in a content field."""
    at = iter(start + timedelta(seconds=i) for i in range(100))

    def event(kind: str, body: dict[str, Any]) -> Event:
        return make_event(
            kind,
            agent_id=agent_id,
            user_id=user_id,
            session_id="s1",
            occurred_at=next(at),
            body=body,
        )

    return [
        event("session.started", {"task": "plan a trip"}),
        event("interaction.recorded", {"role": "user", "content": f"I live near {p['turn']} park"}),
        event("interaction.recorded", {"role": "assistant", "content": f"Noted: {p['reply']}"}),
        event("interaction.recorded", {"role": "user", "content": f"我住在{p['zhturn']}公园附近"}),
        event("tool.called", {"call_id": "c1", "tool": "search", "arguments": "{}"}),
        event("tool.result", {"call_id": "c1", "tool": "search", "content": f"hit {p['tool']}"}),
        event("fact.asserted", {"namespace": "home", "key": "city", "value": p["fact"]}),
        event(
            "persona.updated",
            {"description": f"helps {p['persona']}", "preferences": {"seat": p["pref"]}},
        ),
        event("session.ended", {"reason": "done"}),
    ]


def raw_records(
    bootstrap: str, topics: tuple[str, ...] = KEPT
) -> dict[str, list[tuple[bytes, bytes]]]:
    """Every (key, value) of ``topics`` (the kept ones by default), read until a fetch
    brings nothing."""

    async def read() -> dict[str, list[tuple[bytes, bytes]]]:
        probe = AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap, enable_auto_commit=False)
        await probe.start()  # a subscription loads the topics' metadata (Apache Kafka too)
        try:
            tps = [
                TopicPartition(t, p) for t in topics for p in probe.partitions_for_topic(t) or ()
            ]
        finally:
            await probe.stop()
        assert {tp.topic for tp in tps} == set(topics), f"topics not found: {tps}"
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            out: dict[str, list[tuple[bytes, bytes]]] = {t: [] for t in topics}
            while fetched := await consumer.getmany(timeout_ms=1500, max_records=20_000):
                for tp, records in fetched.items():
                    out[tp.topic] += [(r.key or b"", r.value or b"") for r in records]
            return out
        finally:
            await consumer.stop()

    return asyncio.run(read())


def archived(stack: Stack, agent_id: str) -> int:
    return int(
        stack.scalar("SELECT count() FROM events FINAL WHERE agent_id = {a:String}", a=agent_id)
    )


def content_in_clickhouse(stack: Stack, agent_id: str) -> str:
    rows = stack.rows(
        "SELECT body FROM events FINAL WHERE agent_id = {a:String} UNION ALL"
        " SELECT body FROM memory_changes FINAL WHERE agent_id = {a:String}",
        a=agent_id,
    )
    return "\n".join(str(r[0]) for r in rows)


def recalled(stack: Stack, agent_id: str, query: str) -> str:
    with Memory(http=stack.http) as memory:
        answer = memory.recall(query, agent_id=agent_id, record=False)
    return json.dumps(answer.model_dump(mode="json"), ensure_ascii=False)


def assert_sealed_everywhere(stack: Stack, agent_id: str, p: dict[str, str]) -> None:
    """The projections show every planted string; the kept topics none of them."""
    wait_until(lambda: archived(stack, agent_id) == 9, 60, "the 9 events archived")
    shown = wait_until(
        lambda: c if p["fact"] in (c := content_in_clickhouse(stack, agent_id)) else None,
        60,
        "the projections",
    )
    assert all(value in shown for value in p.values())
    wait_until(lambda: p["turn"] in recalled(stack, agent_id, p["turn"]), 60, "recall")
    records = raw_records(stack.bootstrap)
    for topic, pairs in records.items():
        for key, value in pairs:
            for planted in p.values():
                assert planted.encode() not in value, f"{planted} in clear on {topic}"
                assert planted.encode() not in key, f"{planted} in a key of {topic}"
    mine = [v for _, v in records["engram.events"] if agent_id.encode() in v]
    assert len(mine) >= 9 and all(is_sealed(v) for v in mine)
    assert records["engram.keys"], "the data keys are on engram.keys"
    derived = [v for _, v in records["engram.memory"] if agent_id.encode() in v]
    assert derived and all(is_sealed(v) for v in derived)


def keyless(tmp_path: Path) -> Settings:
    return Settings.from_env({"ENGRAM_HOME": str(tmp_path)})


def test_a_client_without_a_key_publishes_to_ingest_and_nothing_clear_is_kept(
    stack: Stack, tmp_path: Path
) -> None:
    agent_id, p = f"sealed-{uuid.uuid4().hex[:8]}", plants()
    with Memory(bootstrap=stack.bootstrap, settings=keyless(tmp_path)) as memory:
        assert memory.topic == "engram.ingest"
        memory.publish_many(history(agent_id, "mei", p, datetime.now(UTC) - timedelta(hours=1)))
    assert_sealed_everywhere(stack, agent_id, p)
    if broker_kind() == "kafka":  # Tansu does not delete records: the retention does
        wait_until(
            lambda: (
                not any(
                    p["turn"].encode() in value
                    for _, value in raw_records(stack.bootstrap, ("engram.ingest",))[
                        "engram.ingest"
                    ]
                )
                or None
            ),
            60,
            "the clear events swept off engram.ingest",
        )


def test_events_posted_to_the_api_are_sealed(stack: Stack) -> None:
    agent_id, p = f"posted-{uuid.uuid4().hex[:8]}", plants()
    events = history(agent_id, "lin", p, datetime.now(UTC) - timedelta(hours=1))
    body = "[" + ",".join(e.model_dump_json() for e in events) + "]"
    answer = httpx.post(
        f"{stack.http}/v1/events",
        content=body,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert answer.status_code < 300, answer.text
    assert_sealed_everywhere(stack, agent_id, p)


def test_a_client_with_a_master_key_seals_itself(stack: Stack) -> None:
    settings = Settings.from_env(
        {"ENGRAM_HOME": str(stack.home), "ENGRAM_MASTER_KEY_FILE": str(stack.home / "master.key")}
    )
    agent_id, p = f"keyed-{uuid.uuid4().hex[:8]}", plants()
    with Memory(bootstrap=stack.bootstrap, settings=settings) as memory:
        assert memory.topic == "engram.events"
        memory.publish_many(history(agent_id, "kai", p, datetime.now(UTC) - timedelta(hours=1)))
    assert_sealed_everywhere(stack, agent_id, p)


def destroy(stack: Stack, subject: str) -> list[str]:
    async def run() -> list[str]:
        ring = KafkaKeyring(
            stack.bootstrap, "engram.keys", MasterKey.from_file(stack.home / "master.key")
        )
        await ring.start()
        try:
            return await ring.destroy(subject)
        finally:
            await ring.stop()

    return asyncio.run(run())


def test_a_replay_skips_the_events_of_a_destroyed_key(stack: Stack, tmp_path: Path) -> None:
    agent_id = f"shred-{uuid.uuid4().hex[:8]}"
    gone, kept = plants(), plants()
    erased_user, kept_user = f"u-{uuid.uuid4().hex[:6]}", f"u-{uuid.uuid4().hex[:6]}"
    start = datetime.now(UTC) - timedelta(hours=2)
    events = history(agent_id, erased_user, gone, start)
    events += history(agent_id, kept_user, kept, start + timedelta(minutes=30))
    with Memory(bootstrap=stack.bootstrap, settings=keyless(tmp_path)) as memory:
        memory.publish_many(events)
    wait_until(lambda: archived(stack, agent_id) == 18, 60, "18 events archived")
    payloads = [
        bytes.fromhex(r[0])
        for r in stack.rows(
            "SELECT hex(payload) FROM events FINAL WHERE agent_id = {a:String}", a=agent_id
        )
    ]
    assert all(is_sealed(p) for p in payloads)  # the archive keeps the sealed bytes
    assert destroy(stack, erased_user)
    as_of = datetime.now(UTC).isoformat()
    with httpx.Client(base_url=stack.http, timeout=60) as http:
        before = http.get("/v1/snapshot", params={"agent_id": agent_id, "as_of": as_of})
    assert before.status_code == 200, before.text
    snapshot = before.json()
    text = json.dumps(snapshot, ensure_ascii=False)
    assert not any(value in text for value in gone.values())
    assert kept["fact"] in text and kept["persona"] in text
    assert snapshot["position"]["skipped"] == 9


def gone_in_key_file(home: Path, *, whole: bool = False) -> list[Any]:
    """The states (or whole records) of ``gone-user``'s keys in the stack's key file."""
    out = []
    for line in (home / "keys.jsonl").read_text().splitlines():
        record = json.loads(line)
        if base64.b64decode(record["k"]).startswith(b"gone-user\x1f"):
            value = json.loads(record["v"])
            out.append(value if whole else value["state"])
    return out


def test_the_keys_outlive_an_in_memory_broker(tmp_path: Path) -> None:
    """``engram up`` on its own embedded broker (the log in memory), stopped and started
    again: the key file restores ``engram.keys`` beside the restored log, so the sealed
    archive opens and folds to the same history; a destroyed key stays destroyed."""
    home = tmp_path / "home"
    fast = FAST_GROUP
    agent_id, kept, gone = f"again-{uuid.uuid4().hex[:8]}", plants(), plants()
    start = datetime.now(UTC) - timedelta(hours=2)
    events = history(agent_id, "kept-user", kept, start)
    events += history(agent_id, "gone-user", gone, start + timedelta(minutes=30))
    first = start_stack(home, 90.0, **fast)
    try:
        with Memory(bootstrap=first.bootstrap, settings=keyless(tmp_path)) as memory:
            memory.publish_many(events)
        wait_until(lambda: archived(first, agent_id) == 18, 60, "18 events archived")
        assert destroy(first, "gone-user")
        wait_until(lambda: gone_in_key_file(home) == ["destroyed"], 30, "the file to learn it")
    finally:
        assert first.stop() == 0
    assert oct((home / "keys.jsonl").stat().st_mode & 0o777) == "0o600"
    assert "wrapped" not in json.dumps(gone_in_key_file(home, whole=True))

    second = start_stack(home, 90.0, **fast)
    try:
        log = (home / "up.log").read_text()
        assert "restored" in log and "data key records" in log
        as_of = datetime.now(UTC).isoformat()
        with httpx.Client(base_url=second.http, timeout=60) as http:
            answer = http.get("/v1/snapshot", params={"agent_id": agent_id, "as_of": as_of})
        assert answer.status_code == 200, answer.text
        text = answer.text
        assert kept["fact"] in text and kept["persona"] in text
        assert not any(value in text for value in gone.values())
        assert answer.json()["position"]["skipped"] == 9
        # the worker opens the restored log (else it would wait for the keys) and goes on
        late = make_event(
            "interaction.recorded",
            agent_id=agent_id,
            user_id="kept-user",
            body={"role": "user", "content": "one more"},
        )
        with Memory(bootstrap=second.bootstrap, settings=keyless(tmp_path)) as memory:
            memory.publish(late)
        query = "SELECT count() FROM events FINAL WHERE event_id = {e:UUID}"
        wait_until(lambda: second.scalar(query, e=late.event_id) == 1, 60, "the late event")
    finally:
        assert second.stop() == 0
