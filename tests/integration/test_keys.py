"""The data keys on a real broker: created once per subject, read back by a fresh
reader, destroyed for good (a marker, so a later reader knows), and two writers
racing for one subject keep both keys."""

from __future__ import annotations

import asyncio
import secrets
import uuid
from datetime import UTC, datetime

import pytest

from ops.topics import TopicSpec, ensure_topics
from schemas import Codec, InteractionRecorded
from schemas.sealed import Sealer, Shredded
from sinks.keys import KafkaKeyring, MasterKey

pytestmark = pytest.mark.integration
COMPACTED = {"cleanup.policy": "compact"}


def event(user: str, text: str) -> InteractionRecorded:
    return InteractionRecorded(
        event_id=uuid.uuid4(),
        agent_id="key-bot",
        session_id="s",
        user_id=user,
        occurred_at=datetime(2026, 11, 2, tzinfo=UTC),
        body={"role": "user", "content": text},
    )


async def keyring(broker: str, topic: str, master: MasterKey) -> KafkaKeyring:
    ring = KafkaKeyring(broker, topic, master)
    await ring.start()
    return ring


def test_keys_survive_readers_and_destruction_is_final(broker: str) -> None:
    async def scenario() -> None:
        topic = f"engram.keys.test-{uuid.uuid4().hex[:8]}"
        await ensure_topics(broker, [TopicSpec(topic, 1, COMPACTED)])
        master = MasterKey(secrets.token_bytes(32))
        writer = await keyring(broker, topic, master)
        try:
            await writer.ensure(["mei", "sam", "mei"])
            mei_key = writer.data_key("mei")
            await writer.ensure(["mei"])  # already has one: nothing new
            assert writer.data_key("mei") == mei_key and len(writer.live("mei")) == 1
            sealed = {
                u: Sealer(Codec(), writer).seal(event(u, f"{u}: 我的秘密")) for u in ("mei", "sam")
            }

            reader = await keyring(broker, topic, master)  # a worker starting later
            try:
                assert reader.data_key("mei") == mei_key
                assert Sealer(Codec(), reader).open(sealed["mei"]).user_id == "mei"
                destroyed = await writer.destroy("mei")
                assert destroyed == [mei_key[0]]
                await reader.refresh()
                with pytest.raises(Shredded):
                    Sealer(Codec(), reader).open(sealed["mei"])
                assert Sealer(Codec(), reader).open(sealed["sam"]).user_id == "sam"
            finally:
                await reader.stop()

            late = await keyring(broker, topic, master)  # reads the markers, not the keys
            try:
                assert late.erased() == ["mei"]
                assert late.destroyed("mei", mei_key[0])
                with pytest.raises(Shredded):
                    Sealer(Codec(), late).open(sealed["mei"])
                await late.ensure(["mei"])  # mei comes back: a new key for new events
                assert late.data_key("mei")[0] != mei_key[0]
            finally:
                await late.stop()
        finally:
            await writer.stop()

    asyncio.run(scenario())


def test_two_writers_racing_for_a_subject_keep_both_keys(broker: str) -> None:
    async def scenario() -> None:
        topic = f"engram.keys.test-{uuid.uuid4().hex[:8]}"
        await ensure_topics(broker, [TopicSpec(topic, 1, COMPACTED)])
        master = MasterKey(secrets.token_bytes(32))
        first, second = await keyring(broker, topic, master), await keyring(broker, topic, master)
        try:
            await asyncio.gather(first.ensure(["ana"]), second.ensure(["ana"]))
            a, b = first.data_key("ana"), second.data_key("ana")
            assert a[0] != b[0]
            sealed = [Sealer(Codec(), ring).seal(event("ana", "x")) for ring in (first, second)]
            await first.refresh()
            assert sorted(first.live("ana")) == sorted([a[0], b[0]])
            for raw in sealed:
                Sealer(Codec(), first).open(raw)  # either key opens
            assert sorted(await first.destroy("ana")) == sorted([a[0], b[0]])
            await second.refresh()
            for raw in sealed:
                with pytest.raises(Shredded):
                    Sealer(Codec(), second).open(raw)
        finally:
            await first.stop()
            await second.stop()

    asyncio.run(scenario())


def test_an_erasure_read_again_spares_the_keys_made_after_it(broker: str) -> None:
    """A request replayed later (a re-read of the log) destroys only the keys made by
    the time it was requested: a subject that came back keeps its new key."""

    async def scenario() -> None:
        topic = f"engram.keys.test-{uuid.uuid4().hex[:8]}"
        await ensure_topics(broker, [TopicSpec(topic, 1, COMPACTED)])
        master = MasterKey(secrets.token_bytes(32))
        ring = await keyring(broker, topic, master)
        try:
            await ring.ensure(["lea"])
            first = ring.data_key("lea")[0]
            requested = datetime.now(UTC)
            assert await ring.destroy("lea", made_by=requested) == [first]
            await asyncio.sleep(0.01)
            await ring.ensure(["lea"])  # lea comes back after her erasure
            second = ring.data_key("lea")[0]
            assert await ring.destroy("lea", made_by=requested) == []  # the old request
            assert ring.live("lea") == [second]
            reader = await keyring(broker, topic, master)  # ages read from the topic
            try:
                assert await reader.destroy("lea", made_by=requested) == []
                assert await reader.destroy("lea", made_by=datetime.now(UTC)) == [second]
            finally:
                await reader.stop()
        finally:
            await ring.stop()

    asyncio.run(scenario())


def test_a_refresh_leaves_no_fetch_waiting_at_the_broker(broker: str) -> None:
    """Between refreshes the key consumer's partition is paused: a broker answers a
    connection's requests in order, so an idle long-poll fetch held every refresh's
    end-offset request for ``fetch_max_wait_ms`` (500 ms: a rebuild, which reads the
    keys again every second, stood still a third of its time). A refresh still reads
    what was written since, in several rounds."""

    async def scenario() -> None:
        topic = f"engram.keys.test-{uuid.uuid4().hex[:8]}"
        await ensure_topics(broker, [TopicSpec(topic, 1, COMPACTED)])
        master = MasterKey(secrets.token_bytes(32))
        writer, reader = await keyring(broker, topic, master), await keyring(broker, topic, master)
        try:
            consumer = reader._consumer  # the keyring's own: is anything left fetching?
            assert consumer is not None
            assert consumer.paused() == consumer.assignment()  # after start's read
            for n in range(3):
                subjects = [f"u{n}-{i}" for i in range(40)]
                await writer.ensure(subjects)
                await reader.refresh()
                assert consumer.paused() == consumer.assignment()
                assert all(reader.live(s) == writer.live(s) != [] for s in subjects)
            await reader.refresh()  # nothing new
            assert consumer.paused() == consumer.assignment()
        finally:
            await writer.stop()
            await reader.stop()

    asyncio.run(scenario())
