"""Erasure end to end on real parts: a bilingual history of three users on a real
``engram up`` (embedded broker over sockets, chdb, Qdrant Edge), one user erased;
then no ClickHouse row of any table, no vector, no snapshot and no recall holds any
of that user's planted strings, the receipt counts what went, ``engram status``
lists it completed, and erasing again is a no-op (a second receipt, every count 0).
The history's purge is also checked alone on chdb, redelivery included."""

from __future__ import annotations

import asyncio
import io
import json
import re
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import clickhouse_connect
import httpx
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from rich.console import Console

from engram.client import Memory
from engram.erasure import erasure_request
from engram.events import make_event
from engram.status import render, status_of
from ops.broker import EmbeddedBroker
from processors import AgentMemory, MemoryConfig
from schemas import Codec, DerivedEvent, Event, SubjectErased, SubjectErasureRequested
from sinks.clickhouse import CHANGE_COLUMNS, Checkpoint, ClickHouseHistory, SequencedEvent
from sinks.clickhouse_erasure import Purge, purge
from sinks.keys import KafkaKeyring, MasterKey
from sinks.vectors import open_index
from streams.vectors import apply_operations, operations
from tests.support import FAST_GROUP, Stack, engram_cmd, start_stack, wait_until

pytestmark = pytest.mark.integration

START = datetime(2026, 5, 4, 8, 0, tzinfo=UTC)
AGENTS = ("concierge", "tutor")
PLANTED = {
    "mei": ("我的护照号码是E7731QX", "Mei's locker code is 4F-GARNET-9120"),
    "sam": ("Sam hides the spare key under the BLUE-HERON-5150 stone", "山姆的银行卡尾号8842"),
    "lea": ("Léa's allergy list: ZEBRA-KIWI-3141", "莉亚住在梧桐路二十七号"),
}
GONE = "mei"


def user_history(agent: str, user: str, offset: int) -> list[Event]:
    """One user's sessions with ``agent``: important turns, a fact, a persona preference."""
    one, two = PLANTED[user]
    at = START + timedelta(minutes=offset)
    session = f"{agent}-{user}"

    def event(
        kind: str, minutes: int, body: dict[str, Any] | None = None, sid: Any = session
    ) -> Event:
        return make_event(
            kind,
            agent_id=agent,
            session_id=sid,
            user_id=user,
            occurred_at=at + timedelta(minutes=minutes),
            body=body,
        )

    turn = "interaction.recorded"
    return [
        event("session.started", 0, {"task": "help"}),
        event(turn, 1, {"role": "user", "content": one, "importance": 9.5, "sentiment": 0.8}),
        event(turn, 2, {"role": "assistant", "content": f"noted: {two}", "importance": 8.5}),
        event(turn, 3, {"role": "user", "content": f"{user}: thanks", "importance": 3}),
        event("session.ended", 4),
        event(
            turn, 5, {"role": "user", "content": f"again {two}", "importance": 9}, f"{session}-2"
        ),
        event("fact.asserted", 6, {"namespace": f"user:{user}", "key": "secret", "value": one}),
        event("persona.updated", 7, {"preferences": {user: two}}),
        event("fact.asserted", 8, {"namespace": "team", "key": "motto", "value": f"{user}: {two}"}),
    ]


def everything() -> list[Event]:
    return [
        e
        for a, agent in enumerate(AGENTS)
        for u, user in enumerate(PLANTED)
        for e in user_history(agent, user, 10 * (3 * a + u))
    ]


def recalled_texts(stack: Stack, agent: str, query: str, user: str | None = None) -> list[str]:
    with Memory(http=stack.http) as memory:
        result = memory.recall(query, agent_id=agent, user_id=user, k=50, record=False)
    return [m.text for m in result.memories]


def recallable(stack: Stack, agent: str, user: str, needle: str) -> Callable[[], bool]:
    return lambda: any(needle in t for t in recalled_texts(stack, agent, needle, user))


def string_columns(stack: Stack) -> list[tuple[str, str]]:
    """(table, column) of every String-like column of every table (not views)."""
    rows = stack.rows(
        "SELECT c.table, c.name FROM system.columns AS c INNER JOIN system.tables AS t"
        " ON c.database = t.database AND c.table = t.name"
        " WHERE c.database = currentDatabase() AND t.engine NOT IN ('View')"
        " AND c.type LIKE '%String%'"
    )
    return [(str(t), str(c)) for t, c in rows]


def rows_holding(stack: Stack, needle: str) -> dict[str, int]:
    found = {}
    for table, column in string_columns(stack):
        n = stack.scalar(
            f"SELECT count() FROM {table} WHERE positionUTF8(toString({column}), {{n:String}}) > 0",
            n=needle,
        )
        if n:
            found[f"{table}.{column}"] = int(n)
    return found


DEAD = {  # what bad input published to engram.ingest holds, per subject it names
    "mei": "dead letter of mei: 护照 DLQ-OKAPI-7717",
    "sam": "dead letter of sam: DLQ-MARMOT-2024",
    "engram:unattributed": "nobody's dead letter: DLQ-NARWHAL-5531",
}


def bad_input() -> list[tuple[bytes | None, bytes]]:
    """(key, value) of three bad records: a turn of mei's and one of sam's with a field
    the schema does not have, and bytes that are not JSON and have no key."""

    def turn(user: str) -> bytes:
        return json.dumps(
            {
                "event_id": str(uuid.uuid4()),
                "type": "interaction.recorded",
                "agent_id": AGENTS[0],
                "user_id": user,
                "session_id": "dlq",
                "occurred_at": START.isoformat(),
                "schema_version": 1,
                "body": {"role": "user", "content": DEAD[user], "mood": "not a field"},
            },
            ensure_ascii=False,
        ).encode()

    garbage = b"\x00\x01 " + DEAD["engram:unattributed"].encode()
    return [(AGENTS[0].encode(), turn("mei")), (AGENTS[0].encode(), turn("sam")), (None, garbage)]


def publish_raw(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes]]) -> None:
    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            for key, value in records:
                await producer.send_and_wait(topic, value, key=key)
        finally:
            await producer.stop()

    asyncio.run(send())


def dead_letters(stack: Stack, content: bool = True) -> list[dict[str, Any]]:
    found = httpx.get(
        f"{stack.http}/v1/admin/dead-letters",
        params={"limit": 1000, "content": content},
        timeout=60,
    )
    found.raise_for_status()
    return list(found.json())


@pytest.fixture(scope="module")
def erased(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, uuid.UUID, Path]]:
    """A stack with the three users' history, ``mei`` erased (the request id)."""
    home = tmp_path_factory.mktemp("erasure")
    stack = start_stack(home)
    try:
        published = everything()
        with Memory(bootstrap=stack.bootstrap) as memory:
            memory.publish_many(published)
        wait_until(
            lambda: stack.scalar("SELECT count() FROM events") >= len(published),
            90,
            "the history to be archived",
        )
        for agent in AGENTS:
            for user, (one, _) in PLANTED.items():
                wait_until(
                    recallable(stack, agent, user, one),
                    90,
                    f"{user}'s memories with {agent} to be recallable",
                )
        publish_raw(stack.bootstrap, "engram.ingest", bad_input())
        wait_until(
            lambda: len({d["subject"] for d in dead_letters(stack)} & set(DEAD)) == len(DEAD),
            90,
            "the bad input's dead letters",
        )
        with Memory(http=stack.http) as memory:
            request = memory.erase(GONE, reason="test")
        wait_until(
            lambda: (
                stack.scalar("SELECT count() FROM erasures WHERE request_id = {r:UUID}", r=request)
                >= len(AGENTS)
            ),
            90,
            "the receipts of both agents",
        )
        yield stack, request, home
    finally:
        stack.stop()


def test_no_table_holds_the_erased_users_strings(
    erased: tuple[Stack, uuid.UUID, Path],
) -> None:
    stack, _, _ = erased
    for needle in PLANTED[GONE]:
        assert not rows_holding(stack, needle), needle
    for user in ("sam", "lea"):
        for needle in PLANTED[user]:
            assert rows_holding(stack, needle), f"{user}'s {needle!r} should stay"


def test_the_dead_letter_topic_keeps_no_clear_content(
    erased: tuple[Stack, uuid.UUID, Path],
) -> None:
    """Bad input is sealed before it reaches the dead-letter topic: no record's bytes
    (value, key or headers) hold any of it, whoever it named."""
    stack, _, _ = erased

    async def everything_kept() -> bytes:
        consumer = AIOKafkaConsumer(
            "engram.events.dlq",
            bootstrap_servers=stack.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            kept = b""
            batch = await consumer.getmany(timeout_ms=5000)
            while batch:
                for records in batch.values():
                    for r in records:
                        headers = b"".join(k.encode() + v for k, v in r.headers or ())
                        kept += (r.key or b"") + (r.value or b"") + headers
                batch = await consumer.getmany(timeout_ms=1000)
            return kept
        finally:
            await consumer.stop()

    kept = asyncio.run(everything_kept())
    assert kept, "the dead letters are on the topic"
    for text in DEAD.values():
        for needle in (text, text.split(": ")[1]):
            assert needle.encode() not in kept, needle


def test_dead_letters_open_for_the_operator_until_their_subject_is_erased(
    erased: tuple[Stack, uuid.UUID, Path],
) -> None:
    """``engram dead-letters`` (and its endpoint) show each letter's reason and subject;
    sam's and the unattributed one open to their content, mei's is gone with her keys."""
    stack, _, _ = erased
    out = subprocess.run(
        engram_cmd("dead-letters", "--limit", "1000", "--content", "--json"),
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    letters = {d["subject"]: d for d in json.loads(out.stdout) if d["subject"] in DEAD}
    assert set(letters) == set(DEAD)
    for subject, letter in letters.items():
        assert letter["reason"] and letter["source"].startswith("engram.ingest:")
        if subject == GONE:
            assert (letter["state"], letter["content"]) == ("erased", None)
        else:
            assert letter["state"] == "open" and DEAD[subject] in letter["content"]
    assert "mood" in letters["sam"]["reason"]  # the field the schema does not have
    without = {d["subject"]: d for d in dead_letters(stack, content=False)}
    assert without["sam"]["state"] == "open" and without["sam"]["content"] is None


def test_no_snapshot_or_recall_returns_them(erased: tuple[Stack, uuid.UUID, Path]) -> None:
    stack, _, _ = erased
    with Memory(http=stack.http) as memory:
        for agent in AGENTS:
            for user in (None, GONE):
                snap = memory.snapshot(agent, user_id=user).model_dump_json()
                assert not any(s in snap for s in PLANTED[GONE]), (agent, user)
            kept = memory.snapshot(agent).model_dump_json()
            assert any(s in kept for s in PLANTED["sam"])
    for agent in AGENTS:
        for needle in PLANTED[GONE]:
            for user in (None, GONE):
                texts = recalled_texts(stack, agent, needle, user)
                assert not any(s in t for t in texts for s in PLANTED[GONE])


def test_the_receipt_counts_what_went_and_status_lists_it(
    erased: tuple[Stack, uuid.UUID, Path],
) -> None:
    stack, request, _ = erased
    rows = stack.rows(
        "SELECT agent_id, subject, memories, facts, persona, rows FROM erasures FINAL"
        " WHERE request_id = {r:UUID} ORDER BY agent_id",
        r=request,
    )
    assert [r[:2] for r in rows] == [(a, GONE) for a in sorted(AGENTS)]
    for _, _, memories, facts, persona, deleted in rows:
        assert memories >= 2 and facts == 2 and persona == 1
        assert deleted["events"] == 9 and deleted["memory_changes"] > 0
        assert deleted["agent_states"] >= 1
    assert stack.scalar("SELECT requests FROM erased_subjects WHERE subject = 'mei'") == 1

    def completed() -> dict[str, Any] | None:
        status = httpx.get(f"{stack.http}/v1/status", timeout=30).json()["erasures"]
        pending = [p for p in status["pending"] if p["request_id"] == str(request)]
        done = {c["request_id"]: c for c in status["completed"]}
        return None if pending else done.get(str(request))

    def vector_points() -> dict[str, int] | None:
        found = stack.rows(
            "SELECT agent_id, max(points) FROM erasure_vectors WHERE request_id = {r:UUID}"
            " GROUP BY agent_id",
            r=request,
        )
        return {str(a): int(n) for a, n in found} if len(found) == len(AGENTS) else None

    # the vector projection counts the points it deleted, per agent
    points = wait_until(vector_points, 60, "the vector points erased with each agent")
    assert all(n >= 1 for n in points.values()), points
    # completed once every partition's fold has committed past the request
    done = wait_until(completed, 30, "the erasure completed in status")
    assert done["agents"] == len(AGENTS)
    assert done["rows"]["vector points"] == sum(points.values())
    for bad in ("", "tab\there"):
        refused = httpx.post(f"{stack.http}/v1/erasures", json={"subject": bad}, timeout=30)
        assert refused.status_code == 422, refused.text
    out = io.StringIO()
    render(Console(file=out, width=200), status_of(httpx.get(f"{stack.http}/v1/status").json()))
    assert f"completed {request} 'mei'" in out.getvalue()


def test_the_subjects_data_keys_are_destroyed(erased: tuple[Stack, uuid.UUID, Path]) -> None:
    stack, _, home = erased

    async def read() -> KafkaKeyring:
        ring = KafkaKeyring(
            stack.bootstrap, "engram.keys", MasterKey.from_file(home / "master.key")
        )
        await ring.start()
        await ring.stop()
        return ring

    ring = asyncio.run(read())
    assert GONE in ring.erased() and ring.keys[GONE]
    assert ring.live("sam") and ring.live("lea")


def test_erasing_again_with_the_cli_is_a_no_op_with_a_zero_receipt(
    erased: tuple[Stack, uuid.UUID, Path],
) -> None:
    stack, first, _ = erased
    before = stack.rows("SELECT count() FROM events")
    done = subprocess.run(
        engram_cmd("erase", "--user", GONE, "--reason", "asked twice"),
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found = re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", done.stdout)
    assert found, done.stdout
    again = uuid.UUID(found.group(0))
    assert again != first
    wait_until(
        lambda: (
            stack.scalar("SELECT count() FROM erasures WHERE request_id = {r:UUID}", r=again)
            >= len(AGENTS)
        ),
        90,
        "the second request's receipts",
    )
    rows = stack.rows(
        "SELECT sessions + episodes + memories + facts + persona, rows"
        " FROM erasures FINAL WHERE request_id = {r:UUID}",
        r=again,
    )
    for fold, deleted in rows:
        assert fold == 0
        # nothing of the subject is left; only the agent's checkpoints (the latest, and
        # those kept by position) from before this request go, as with every erasure
        # (superseded: the state as the first left it)
        checkpoints = ("agent_states", "agent_checkpoints")
        assert {k: v for k, v in deleted.items() if k not in checkpoints} == {
            "events": 0,
            "memory_changes": 0,
        }
    after = stack.rows("SELECT count() FROM events")
    assert after[0][0] == before[0][0] + len(AGENTS)  # the two per-agent requests


def test_a_request_a_kafka_producer_sends_once_to_the_ingest_topic_reaches_every_agent(
    erased: tuple[Stack, uuid.UUID, Path],
) -> None:
    """A JSON producer without keys sends the broadcast request (agent ``__all__``)
    once, to ``engram.ingest``: the ingest agent copies it to every partition, so every
    agent purges and writes its receipt. ``POST /v1/events`` refuses it (one agent's
    partition is not enough) and names the way that works."""
    stack, _, _ = erased
    request = erasure_request(GONE, reason="from a Kafka producer")
    refused = httpx.post(
        f"{stack.http}/v1/events", json=json.loads(Codec().encode_json(request)), timeout=10
    )
    assert refused.status_code == 422 and "/v1/erasures" in refused.json()["reason"]

    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=stack.bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait("engram.ingest", Codec().encode_json(request))
        finally:
            await producer.stop()

    asyncio.run(send())
    wait_until(
        lambda: (
            stack.scalar(
                "SELECT count() FROM erasures WHERE request_id = {r:UUID}", r=request.event_id
            )
            >= len(AGENTS)
        ),
        90,
        "a receipt from every agent",
    )


def test_rebuilds_and_replays_after_the_erasure_bring_nothing_back(
    erased: tuple[Stack, uuid.UUID, Path],
) -> None:
    """Both projections rebuilt from the log (blue/green) and every agent replayed from
    the archive: the erased user's derived events are sealed under destroyed keys and
    are skipped, so no rebuilt row, point or replayed state holds the planted strings;
    the others' are back."""
    stack, _, _ = erased
    for target in ("clickhouse", "vectors"):
        done = subprocess.run(
            engram_cmd("rebuild", target, "--keep"),
            env=stack.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    versions = stack.rows(
        "SELECT name FROM system.tables WHERE database = currentDatabase()"
        " AND name LIKE 'memory_changes%'"
    )
    assert len(versions) >= 2, "the rebuilt version is live, the old one kept"
    for needle in PLANTED[GONE]:
        assert not rows_holding(stack, needle), needle
    for agent in AGENTS:
        assert any(PLANTED["sam"][0] in t for t in recalled_texts(stack, agent, PLANTED["sam"][0]))
        for needle in PLANTED[GONE]:
            assert not any(needle in t for t in recalled_texts(stack, agent, needle))
        replay = subprocess.run(
            engram_cmd("replay", "--agent", agent, "--until", datetime.now(UTC).isoformat()),
            env=stack.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert replay.returncode == 0, replay.stderr
        assert "sam" in replay.stdout
        for needle in PLANTED[GONE]:
            assert needle not in replay.stdout, (agent, needle)


def test_no_vector_holds_them_once_stopped(erased: tuple[Stack, uuid.UUID, Path]) -> None:
    stack, _, home = erased
    assert stack.stop() == 0
    index = open_index(f"edge://{home / 'vectors'}", name="memories_usem3")
    try:
        texts = [str(p.payload) for p in index.points()]
    finally:
        index.close()
    assert texts
    assert not any(s in t for t in texts for s in PLANTED[GONE])
    assert any(s in t for t in texts for s in PLANTED["sam"])
    assert not any(p for p in texts if "'user_id': 'mei'" in p)


# -- the history's purge alone, on chdb ---------------------------------------------


def fold_into(
    history: ClickHouseHistory, events: list[Event], memory: AgentMemory
) -> list[DerivedEvent]:
    """Fold ``events`` and write them as one flush (a checkpoint after them); return
    the derived events."""
    codec = Codec()
    sequenced: list[SequencedEvent] = []
    changes: list[DerivedEvent] = []
    for event in events:
        step = memory.apply(event)
        if step.seq is not None:
            sequenced.append(SequencedEvent(event, step.seq, codec.encode(event)))
            changes += step.derived
    state = memory.state().model_dump_json().encode()
    history.write_sync(sequenced, changes, [Checkpoint(memory.agent_id, memory.seq, state)])
    return changes


def test_the_history_purge_is_idempotent_and_reaches_every_version(tmp_path: Path) -> None:
    client = clickhouse_connect.get_client(dsn=f"chdb://{tmp_path / 'ch'}")
    history = ClickHouseHistory(client)
    history.ensure_schema()
    agent = AGENTS[0]
    memory = AgentMemory.empty(agent, MemoryConfig())
    events = [e for u, user in enumerate(PLANTED) for e in user_history(agent, user, 10 * u)]
    fold_into(history, events, memory)
    kept = history.create_version()
    history.insert_change_rows(
        f"memory_changes_v{kept}",
        client.query("SELECT * FROM memory_changes").result_rows,
    )
    request = SubjectErasureRequested(
        event_id=uuid.uuid4(),
        agent_id=agent,
        occurred_at=START + timedelta(hours=5),
        body={"subject": GONE, "requested_at": START + timedelta(hours=5)},
    )
    step = memory.apply(request)
    [derived] = step.derived
    assert isinstance(derived, SubjectErased)
    fold_into(history, [], memory)  # a checkpoint after the erasure
    receipt = history.erase_sync(derived)
    assert receipt is not None and receipt.rows["events"] == 9
    assert receipt.rows["memory_changes rewritten"] == 3  # sam's and lea's persona, sam's motto
    assert receipt.rows[f"memory_changes_v{kept}"] == receipt.rows["memory_changes"] > 0
    assert receipt.rows["agent_states"] == 1
    assert receipt.rows["agent_checkpoints"] == 1  # the first checkpoint a writer sees is kept
    searched = {
        "events": "concat(body, payload)",
        "memory_changes": "body",
        f"memory_changes_v{kept}": "body",
        "agent_states": "state",
    }
    for needle in PLANTED[GONE]:  # the kept checkpoints before the erasure are gone
        found = client.query(
            "SELECT count() FROM agent_checkpoints WHERE position(state, {n:String}) > 0",
            parameters={"n": needle},
        ).result_rows[0][0]
        assert found == 0, ("agent_checkpoints", needle)
    for table, column in searched.items():
        for needle in PLANTED[GONE]:
            found = client.query(
                f"SELECT count() FROM {table} WHERE position({column}, {{n:String}}) > 0",
                parameters={"n": needle},
            ).result_rows[0][0]
            assert found == 0, (table, needle)
        for needle in PLANTED["sam"][:1]:
            assert client.query(
                f"SELECT count() FROM {table} WHERE position({column}, {{n:String}}) > 0",
                parameters={"n": needle},
            ).result_rows[0][0], (table, "sam's rows stay")
    tables = ["memory_changes", f"memory_changes_v{kept}"]
    [again] = purge(client, [derived], tables, CHANGE_COLUMNS)
    assert set(again.values()) == {0}, again
    assert history.erase_sync(derived) is None, "redelivered: the first receipt stands"
    [only] = history.erasures()
    assert only == receipt


def test_a_purge_cut_short_by_a_crash_is_completed_by_the_redelivery(tmp_path: Path) -> None:
    """A worker killed mid-purge (here: after the archive, before the memory
    changes) meets the request again: the redo finishes the purge and writes the
    receipt once; its counts are what the redo deleted."""
    client = clickhouse_connect.get_client(dsn=f"chdb://{tmp_path / 'ch'}")
    history = ClickHouseHistory(client)
    history.ensure_schema()
    agent = AGENTS[1]
    memory = AgentMemory.empty(agent, MemoryConfig())
    fold_into(history, [e for u in PLANTED for e in user_history(agent, u, 0)], memory)
    request = SubjectErasureRequested(
        event_id=uuid.uuid4(),
        agent_id=agent,
        occurred_at=START + timedelta(hours=5),
        body={"subject": GONE},
    )
    [derived] = memory.apply(request).derived
    assert isinstance(derived, SubjectErased)
    fold_into(history, [], memory)
    [cut] = purge(client, [derived], [], CHANGE_COLUMNS)  # archive and checkpoints purged,
    assert cut["events"] == 9  # the memory changes not yet: the worker dies here
    receipt = history.erase_sync(derived)
    assert receipt is not None
    assert receipt.rows["events"] == 0 and receipt.rows["memory_changes"] > 0
    for needle in PLANTED[GONE]:
        for table, column in (("events", "body"), ("memory_changes", "body")):
            found = client.query(
                f"SELECT count() FROM {table} WHERE position({column}, {{n:String}}) > 0",
                parameters={"n": needle},
            ).result_rows[0][0]
            assert found == 0, (table, needle)
    assert history.erase_sync(derived) is None
    assert len(history.erasures()) == 1


def test_a_crash_between_a_rewrite_and_its_delete_is_repaired(tmp_path: Path) -> None:
    """Shared documents are rewritten insert-first: killed before the DELETE, both the
    old and the new bodies are there; the redo deletes the old ones."""
    client = clickhouse_connect.get_client(dsn=f"chdb://{tmp_path / 'ch'}")
    history = ClickHouseHistory(client)
    history.ensure_schema()
    agent = AGENTS[0]
    memory = AgentMemory.empty(agent, MemoryConfig())
    fold_into(history, [e for u in PLANTED for e in user_history(agent, u, 0)], memory)
    request = SubjectErasureRequested(
        event_id=uuid.uuid4(), agent_id=agent, occurred_at=START + timedelta(hours=5),
        body={"subject": GONE},
    )  # fmt: skip
    [derived] = memory.apply(request).derived
    assert isinstance(derived, SubjectErased)
    fold_into(history, [], memory)
    plan = Purge(client, derived, 0, CHANGE_COLUMNS)
    changed, stale = plan.persona_rewrites("memory_changes", "1")
    assert (len(changed), len(stale)) == (2, 3)  # sam and lea rewritten; mei's too goes
    client.insert("memory_changes", changed, column_names=CHANGE_COLUMNS)  # ... killed here
    assert history.erase_sync(derived) is not None
    for needle in PLANTED[GONE]:
        found = client.query(
            "SELECT count() FROM memory_changes WHERE position(body, {n:String}) > 0",
            parameters={"n": needle},
        ).result_rows[0][0]
        assert found == 0, needle
    versions = client.query(
        "SELECT user_id, JSONExtractUInt(body, 'version') FROM memory_changes FINAL"
        " WHERE type = 'persona.versioned' ORDER BY seq"
    ).result_rows
    assert versions == [("sam", 1), ("lea", 2)]
    assert [v.version for v in memory.persona.versions] == [1, 2]


def test_the_erasures_of_one_flush_are_purged_together_with_a_receipt_each(
    tmp_path: Path,
) -> None:
    client = clickhouse_connect.get_client(dsn=f"chdb://{tmp_path / 'ch'}")
    history = ClickHouseHistory(client)
    history.ensure_schema()
    request_id = uuid.uuid4()
    erasures: list[SubjectErased] = []
    for agent in AGENTS:
        memory = AgentMemory.empty(agent, MemoryConfig())
        fold_into(history, [e for u in PLANTED for e in user_history(agent, u, 0)], memory)
        request = SubjectErasureRequested(
            event_id=request_id, agent_id=agent, occurred_at=START + timedelta(hours=5),
            body={"subject": GONE},
        )  # fmt: skip
        [derived] = memory.apply(request).derived
        assert isinstance(derived, SubjectErased)
        erasures.append(derived)
        fold_into(history, [], memory)
    receipts = history.erase_many(erasures)
    assert [r.agent_id for r in receipts if r is not None] == list(AGENTS)
    assert all(r is not None and r.rows["events"] == 9 for r in receipts)
    for needle in PLANTED[GONE]:
        found = client.query(
            "SELECT count() FROM memory_changes WHERE position(body, {n:String}) > 0",
            parameters={"n": needle},
        ).result_rows[0][0]
        assert found == 0, needle
    assert history.erase_many(erasures) == [None, None]


def test_a_request_not_yet_folded_is_pending_on_every_partition(broker: str) -> None:
    """``engram status`` reads pending requests off the log: a broadcast request ahead
    of the group's commits is pending on every partition; a receipt alone does not
    complete it."""
    from aiokafka import AIOKafkaProducer

    from engram.erasure import broadcast, erasure_request
    from engram.status import Projections, gather_status
    from ops.topics import TopicSpec, ensure_topics
    from sinks.clickhouse import ErasureReceipt

    topic, dlq = f"erasure-{uuid.uuid4().hex[:8]}", f"erasure-dlq-{uuid.uuid4().hex[:8]}"
    request = erasure_request("zoe", "test")

    async def scenario() -> Any:
        await ensure_topics(broker, [TopicSpec(topic, 3, {}), TopicSpec(dlq, 1, {})])
        producer = AIOKafkaProducer(bootstrap_servers=broker, acks="all")
        await producer.start()
        try:
            assert await broadcast(producer, topic, Codec(), request, 30) == 3
        finally:
            await producer.stop()
        receipt = ErasureReceipt(
            request.event_id, "a", "zoe", None, datetime.now(UTC), 1, {"memories": 2}, {}
        )
        return await gather_status(
            bootstrap=broker,
            group=f"nobody-{uuid.uuid4().hex[:6]}",
            topics=(topic,),
            dead_letter_topic=dlq,
            projections=Projections(),
            receipts=[receipt],
        )

    status = asyncio.run(scenario())
    [pending] = status.erasures.pending
    assert (pending.request_id, pending.subject) == (request.event_id, "zoe")
    assert sorted(pending.partitions) == [0, 1, 2]
    assert status.erasures.completed == []


# -- the other users' projections equal a run where the erased user never existed ----


Projection = tuple[dict[str, list[tuple[str, ...]]], list[Any]]


def project(root: Path, events: list[Event], erase: str | None) -> Projection:
    """Fold ``events`` per agent into a history on chdb and a vector index on Qdrant
    Edge under ``root`` (the projections the worker writes, flush by flush), then,
    given ``erase``, erase that user; return the other users' rows per table
    (:func:`others_rows`) and every point."""
    client = clickhouse_connect.get_client(dsn=f"chdb://{root / 'ch'}")
    history = ClickHouseHistory(client)
    history.ensure_schema()
    index = open_index(f"edge://{root / 'vectors'}", name="memories_test")
    index.ensure(4)
    try:
        for agent in AGENTS:
            memory = AgentMemory.empty(agent, MemoryConfig())
            mine = [e for e in events if e.agent_id == agent]
            derived = fold_into(history, mine, memory)
            if erase is not None:
                request = SubjectErasureRequested(
                    event_id=uuid.uuid5(uuid.NAMESPACE_URL, f"erase/{agent}/{erase}"),
                    agent_id=agent,
                    occurred_at=START + timedelta(hours=5),
                    body={"subject": erase},
                )
                derived += fold_into(history, [request], memory)
            apply_operations(index, operations(derived, "test"))
        rows = {t: others_rows(client, t, GONE) for t in ("events", "memory_changes")}
        return rows, sorted(index.points(), key=lambda p: p.id)
    finally:
        index.close()
        client.close()


def others_rows(client: Any, table: str, gone: str) -> list[tuple[Any, ...]]:
    """Every row of ``table`` but the erased user's and the erasure's own (its
    request, its ``subject.erased``), without the per-agent sequence numbers (an
    erased user's events took numbers the others' come after)."""
    columns = [
        c
        for (c,) in client.query(
            "SELECT name FROM system.columns WHERE database = currentDatabase()"
            " AND table = {t:String} ORDER BY position",
            parameters={"t": table},
        ).result_rows
        if c not in ("seq", "idx")
    ]
    rows = client.query(
        f"SELECT {', '.join(columns)} FROM {table} FINAL"
        " WHERE ifNull(user_id, '') != {g:String}"
        " AND type NOT IN ('subject.erasure_requested', 'subject.erased')",
        parameters={"g": gone},
    ).result_rows
    return sorted(tuple(str(v) for v in row) for row in rows)


def test_the_other_users_projections_equal_a_run_where_the_erased_user_never_existed(
    tmp_path: Path,
) -> None:
    published = everything()
    erased_rows, erased_points = project(tmp_path / "erased", published, erase=GONE)
    never_rows, never_points = project(
        tmp_path / "never", [e for e in published if e.user_id != GONE], erase=None
    )
    for table, kept in erased_rows.items():
        assert kept, f"the other users' {table} rows stay"
        assert kept == never_rows[table], table
    assert erased_points == never_points
    assert {p.payload["user_id"] for p in erased_points} == {"sam", "lea"}


# -- a worker killed in the middle of an erasure ---------------------------------------


def test_a_worker_killed_mid_erasure_completes_it_when_started_again(tmp_path: Path) -> None:
    """kill -9 (``ENGRAM_CRASH_AT=erasure.purged:1``) once the purge has emptied the
    archive of the subject and before the memory changes, the checkpoints, the
    receipt and the agent states: started again on the same broker and home, the
    worker reads the request again and completes the erasure, one receipt per agent."""
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        env = {"ENGRAM_KAFKA_BOOTSTRAP": broker.bootstrap, **FAST_GROUP}
        first = start_stack(tmp_path / "home", ENGRAM_CRASH_AT="erasure.purged:1", **env)
        try:
            published = everything()
            with Memory(bootstrap=broker.bootstrap) as memory:
                memory.publish_many(published)
            for agent in AGENTS:
                wait_until(
                    recallable(first, agent, GONE, PLANTED[GONE][0]),
                    90,
                    f"{GONE}'s memories with {agent} to be recallable",
                )
            assert rows_holding(first, PLANTED[GONE][0])
            with Memory(http=first.http) as memory:
                request = memory.erase(GONE, reason="test")
            wait_until(lambda: first.process.poll() is not None, 60, "the kill mid-purge")
        finally:
            code = first.stop(signal.SIGKILL)
        assert code == -signal.SIGKILL, "the worker died at the crash point"
        second = start_stack(tmp_path / "home", **env)
        try:
            wait_until(
                lambda: (
                    second.scalar(
                        "SELECT count() FROM erasures WHERE request_id = {r:UUID}", r=request
                    )
                    >= len(AGENTS)
                ),
                90,
                "the receipts of both agents",
            )
            assert second.scalar("SELECT count() FROM erasures") == len(AGENTS), "one each"
            for needle in PLANTED[GONE]:
                assert not rows_holding(second, needle), needle
                for agent in AGENTS:
                    assert not any(needle in t for t in recalled_texts(second, agent, needle))
            for needle in PLANTED["sam"]:
                assert rows_holding(second, needle), f"sam's {needle!r} should stay"
        finally:
            second.stop()
