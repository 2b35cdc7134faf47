"""Hostile input through the real broker: a flood of garbage, mutated events, oversize
events, unknown and derived types, unknown writer schemas, lone surrogates and
tombstones, mixed with good events (Avro and JSON, far past and far future) each sent
several times. Every good event is folded exactly once, in log order; every bad
message lands in ``engram.events.dlq`` with its bytes and a reason."""

from __future__ import annotations

import asyncio
import copy
import io
import json
import random
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import fastavro
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from engram import make_event
from ops.fuzz import check, garbage, mutant, seed_corpus, seed_events
from schemas import DEFAULT_MAX_BYTES, Codec, Event, InteractionRecorded
from schemas.avro import MAGIC, avro_schema, fingerprint
from tests.support import Stack, open_letters, wait_until

pytestmark = pytest.mark.integration
CODEC = Codec()
DLQ = TopicPartition("engram.events.dlq", 0)
MOMENTS = [
    datetime(1901, 3, 4, 5, 6, 7, 8000, tzinfo=UTC),
    datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
    datetime(2026, 11, 1, 8, 0, tzinfo=UTC),
    datetime(2999, 1, 1, tzinfo=UTC),
    datetime(9999, 12, 30, 23, 59, 59, 999000, tzinfo=UTC),
]
Message = tuple[bytes | None, bytes | None]  # key, value


def good_events(run: str, agents: int = 3, per_agent: int = 30) -> list[Event]:
    """Bilingual sessions whose event times jump between the far past and far future."""
    events = []
    for a in range(agents):
        for i in range(per_agent):
            content = f"turn {i}: the meeting moved to Friday / 会议改到周五 ({run})"
            events.append(
                make_event(
                    "interaction.recorded",
                    agent_id=f"hostile-{run}-{a}",
                    session_id="s1",
                    occurred_at=MOMENTS[i % len(MOMENTS)] + timedelta(milliseconds=i),
                    body={"role": "user" if i % 2 else "assistant", "content": content},
                )
            )
    return events


def writer_bytes(schema: dict[str, object], record: dict[str, object]) -> bytes:
    """Single-object bytes from a producer holding a schema the worker does not know."""
    buffer = io.BytesIO()
    buffer.write(MAGIC + fingerprint(schema))
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(schema), record)
    return buffer.getvalue()


def evolved_writers(event: Event) -> list[bytes]:
    """The event as an older writer (no ``intent``) and a newer one (an extra field)
    would write it: fingerprints absent from ``schemas/avsc``."""
    record = event.model_dump()
    older = copy.deepcopy(avro_schema(InteractionRecorded))
    body = next(f for f in older["fields"] if f["name"] == "body")["type"]
    body["fields"] = [f for f in body["fields"] if f["name"] != "intent"]
    newer = copy.deepcopy(avro_schema(InteractionRecorded))
    newer["fields"].append({"name": "trace_id", "type": "string", "default": ""})
    return [writer_bytes(older, record), writer_bytes(newer, record | {"trace_id": "t-1"})]


def bad_messages(run: str, sample: Event, rng: random.Random) -> dict[bytes, tuple[bytes, str]]:
    """Key -> (value, expected start of the reason) of every bad message."""
    obj = json.loads(CODEC.encode_json(sample))
    oversize = obj | {"body": obj["body"] | {"content": "记" * (DEFAULT_MAX_BYTES // 3 + 10)}}
    derived_avro, derived_json = (CODEC.encode(seed_events()[-1]), seed_corpus(CODEC)[-1])
    surrogate = json.dumps(obj | {"body": obj["body"] | {"intent": "\udc0f"}}).encode()
    named: list[tuple[bytes, str]] = [
        (json.dumps(oversize, ensure_ascii=False).encode(), "event is "),
        (
            json.dumps(obj | {"type": "memory.dreamt"}).encode(),
            "unknown event type 'memory.dreamt'",
        ),
        (b"", "empty message"),
        (surrogate, "invalid interaction.recorded: a string holds '\\udc0f', not Unicode"),
        (CODEC.encode(sample) + b"\x00", "malformed Avro body for interaction.recorded"),
        (json.dumps([obj]).encode(), "not an engram event"),
        (derived_json, "unknown event type '"),  # derived types belong on engram.memory
        (derived_avro, "event type '"),
        *((raw, "unknown Avro schema fingerprint") for raw in evolved_writers(sample)),
    ]
    corpus = seed_corpus(CODEC)
    while len(named) < 300:
        raw = mutant(rng, corpus) if rng.random() < 0.7 else garbage(rng, corpus)
        if check(CODEC, raw) is not None:  # refused: a bad message indeed
            named.append((raw, ""))
    return {f"bad-{run}-{i}".encode(): item for i, item in enumerate(named)}


def flood(
    good: Sequence[Event], bad: dict[bytes, tuple[bytes, str]], rng: random.Random
) -> list[Message]:
    """Good events as Avro or JSON, up to three times each, shuffled with the bad ones
    (an agent's events are folded in the order of their first copy in the log)."""
    messages: list[Message] = []
    for event in good:
        value = CODEC.encode(event) if rng.random() < 0.5 else CODEC.encode_json(event)
        messages += [(event.agent_id.encode(), value)] * rng.choice((1, 2, 3))
    messages += [(key, value) for key, (value, _) in bad.items()]
    rng.shuffle(messages)
    return messages


async def produce(bootstrap: str, messages: Sequence[Message]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=2**21)
    await producer.start()
    try:
        futures = [
            await producer.send("engram.events", key=key, value=value) for key, value in messages
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def dead_letters(bootstrap: str, since: int) -> dict[bytes, tuple[bytes, dict[str, bytes]]]:
    """Key -> (value, headers) of the dead letters from offset ``since`` on."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([DLQ])
        consumer.seek(DLQ, since)
        end = (await consumer.end_offsets([DLQ]))[DLQ]
        found: dict[bytes, tuple[bytes, dict[str, bytes]]] = {}
        while await consumer.position(DLQ) < end:
            batch = await consumer.getmany(DLQ, timeout_ms=1000)
            for m in batch.get(DLQ, []):
                found[m.key or b""] = (m.value or b"", dict(m.headers))
        return found
    finally:
        await consumer.stop()


async def dlq_end(bootstrap: str) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        return int((await consumer.end_offsets([DLQ]))[DLQ])
    finally:
        await consumer.stop()


def test_a_flood_of_garbage_and_duplicates_folds_every_good_event_once(stack: Stack) -> None:
    run = uuid.uuid4().hex[:8]
    rng = random.Random(run)
    good = good_events(run)
    bad = bad_messages(run, good[0], rng)
    since = asyncio.run(dlq_end(stack.bootstrap))
    messages = flood(good, bad, rng)
    asyncio.run(produce(stack.bootstrap, messages))
    asyncio.run(produce(stack.bootstrap, [(e.agent_id.encode(), CODEC.encode(e)) for e in good]))

    agents = sorted({e.agent_id for e in good})
    wait_until(
        lambda: (
            stack.scalar(
                "SELECT count() FROM events FINAL WHERE agent_id IN {a:Array(String)}", a=agents
            )
            == len(good)
        ),
        120,
        f"{len(good)} good events",
    )

    def all_dead() -> dict[bytes, tuple[bytes, dict[str, bytes]]] | None:
        found = asyncio.run(dead_letters(stack.bootstrap, since))
        return found if found.keys() >= bad.keys() else None

    try:
        letters = wait_until(all_dead, 120, f"{len(bad)} dead letters")
    except AssertionError:
        found = asyncio.run(dead_letters(stack.bootstrap, since))
        missing = [(reason, value[:80]) for key, (value, reason) in bad.items() if key not in found]
        raise AssertionError(f"{len(missing)} bad messages not dead-lettered: {missing}") from None
    rows = stack.rows(
        "SELECT agent_id, seq, toString(event_id), occurred_at FROM events FINAL"
        " WHERE agent_id IN {a:Array(String)} ORDER BY agent_id, seq",
        a=agents,
    )
    first_seen: dict[str, list[str]] = {agent: [] for agent in agents}
    for key, value in messages:
        if key is not None and key.decode() in first_seen:
            event_id = str(CODEC.decode(value or b"").event_id)
            if event_id not in first_seen[key.decode()]:
                first_seen[key.decode()].append(event_id)
    by_id = {str(e.event_id): e for e in good}
    for agent in agents:
        mine = [r for r in rows if r[0] == agent]
        assert [r[1] for r in mine] == list(range(len(mine))), f"{agent}: a gap or a repeat"
        assert [r[2] for r in mine] == first_seen[agent], f"{agent}: not in log order"
        for _, _, event_id, at in mine:
            assert at.replace(tzinfo=UTC) == by_id[event_id].occurred_at
    opened = dict(zip(letters, open_letters(stack, [v for v, _ in letters.values()]), strict=True))
    for key, (value, reason) in bad.items():
        got, headers = letters[key]
        assert got != value, "the dead letter keeps the bytes sealed"
        assert opened[key] == value, "the dead letter keeps the bytes"
        assert headers["engram.reason"], f"no reason for {value[:40]!r}"
        assert headers["engram.reason"].decode().startswith(reason)
        assert headers["engram.source"].startswith(b"engram.events:")
