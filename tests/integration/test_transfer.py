"""``engram export`` / ``engram import``: an agent's log moved to another deployment
(its own broker and history) folds into the same memory there, change for change."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from engram import Memory, make_event
from ops.broker import EmbeddedBroker
from schemas import Codec, Event, MemoryForked
from streams.ticker import publish_ticks
from tests.support import FAST_GROUP, Stack, engram_cmd, start_stack, wait_until

pytestmark = pytest.mark.integration
CHANGES = (
    "SELECT seq, idx, event_id, type, source_event_id, session_id, user_id, occurred_at,"
    " config_version, memory_id, body FROM memory_changes FINAL"
    " WHERE agent_id = {a:String} ORDER BY seq, idx"
)


def history(agent: str) -> list[Event]:
    t0 = datetime(2026, 9, 1, 8, 0, tzinfo=UTC)
    out: list[Event] = []

    def add(kind: str, at: datetime, body: dict[str, Any], session: str | None = "s1") -> None:
        out.append(
            make_event(kind, agent_id=agent, session_id=session, user_id="mei", occurred_at=at,
                       body=body)
        )  # fmt: skip

    add("session.started", t0, {"task": "plan the Kyoto trip"})
    lines = [
        "I want to see Kyoto in April for the cherry blossoms.",
        "我对花生过敏，一定要记住！",
        "Book a ryokan near Gion, please.",
        "好的，我会找祇园附近的旅馆。",
    ]
    for i, line in enumerate(lines):
        add(
            "interaction.recorded", t0 + timedelta(minutes=i + 1), {"role": "user", "content": line}
        )
    add("interaction.recorded", t0 + timedelta(minutes=6),
        {"role": "user", "content": "My grandmother passed away yesterday.", "importance": 9.5,
         "sentiment": -0.9})  # fmt: skip
    add("working.set", t0 + timedelta(minutes=7), {"variables": {"city": "Kyoto"}})
    add("fact.asserted", t0 + timedelta(minutes=8), {"namespace": "prefs", "key": "drink",
                                                     "value": "绿茶"})  # fmt: skip
    add("session.ended", t0 + timedelta(minutes=9), {"reason": "done"})
    add("persona.updated", t0 + timedelta(days=1), {"style": "warm, brief"}, session=None)
    add("clock.tick", t0 + timedelta(days=40), {"partition": 0, "interval_s": 60.0}, session=None)
    add("fact.asserted", t0 + timedelta(days=41), {"namespace": "prefs", "key": "drink",
                                                   "value": "coffee"}, session=None)  # fmt: skip
    return out


def cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        engram_cmd(*args), env=stack.env, capture_output=True, text=True, timeout=120, check=False
    )


@contextmanager
def elsewhere(tmp_path: Path) -> Iterator[Stack]:
    """Another deployment: its own broker, home and history."""
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        there = start_stack(
            tmp_path / "elsewhere",
            ENGRAM_KAFKA_BOOTSTRAP=broker.bootstrap,
            **FAST_GROUP,
        )
        try:
            yield there
        finally:
            assert there.stop() == 0


@pytest.fixture(scope="module")
def there(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Another deployment shared by the tests of the module that only import into it:
    each moves agents of its own (their names carry a random tag), and none publishes
    a tick there (a tick joins the log of every agent it meets; the test that ticks
    has a deployment of its own)."""
    with elsewhere(tmp_path_factory.mktemp("transfer-elsewhere")) as stack:
        yield stack


def changes(stack: Stack, agent: str) -> list[tuple[Any, ...]]:
    return stack.rows(CHANGES, a=agent)


@pytest.mark.parametrize("fmt", ["avro", "jsonl"])
def test_an_exported_agent_folds_alike_elsewhere(
    stack: Stack, there: Stack, tmp_path: Path, fmt: str
) -> None:
    agent = f"mover-{uuid.uuid4().hex[:8]}"
    events = history(agent)
    with Memory(bootstrap=stack.bootstrap) as memory:
        memory.publish_many(events)
        memory.publish_many(events[:3])  # a retry: the archive keeps them once
    wait_until(
        lambda: stack.scalar("SELECT count() FROM events FINAL WHERE agent_id = {a:String}",
                             a=agent) == len(events),
        60,
        "the history archived",
    )  # fmt: skip
    source = wait_until(lambda: changes(stack, agent), 30, "the memory changes")
    path = tmp_path / f"{agent}.{fmt}"
    done = cli(stack, "export", agent, "-o", str(path), "--format", fmt)
    assert done.returncode == 0, done.stderr
    assert f"exported {len(events)} events of {agent}" in done.stdout
    again = cli(stack, "export", agent, "-o", str(path))
    assert again.returncode == 2 and "--force" in again.stderr

    done = cli(there, "import", str(path))
    assert done.returncode == 0, done.stderr
    assert f"imported {len(events)} events of {agent}" in done.stdout
    moved = wait_until(
        lambda: (rows := changes(there, agent)) and len(rows) == len(source) and rows,
        60,
        "the same memory changes elsewhere",
    )
    assert moved == source  # same ids, bodies, sequence: the same memory
    assert cli(there, "import", str(path)).returncode == 0  # twice: nothing new
    with Memory(http=stack.http) as here_m, Memory(http=there.http) as there_m:
        # the same memory; how many events each road folded after its latest
        # checkpoint is the road's, not the memory's (states are saved when due)
        fold_free = {"position": {"events_folded"}}
        here_s, there_s = here_m.snapshot(agent), there_m.snapshot(agent)
        assert here_s.model_dump(exclude=fold_free) == there_s.model_dump(exclude=fold_free)
    assert changes(there, agent) == source


def test_importing_again_after_the_clock_ticked_sends_nothing(stack: Stack, tmp_path: Path) -> None:
    """The destination's own ticks join the imported agent's log there; they are not
    the file's, so importing the file again (a retry, a resume) still finds it whole."""
    agent = f"ticked-{uuid.uuid4().hex[:8]}"
    events = history(agent)
    with Memory(bootstrap=stack.bootstrap) as memory:
        memory.publish_many(events)
    count = "SELECT count() FROM events FINAL WHERE agent_id = {a:String}"
    wait_until(lambda: stack.scalar(count, a=agent) == len(events), 60, "the history archived")
    path = tmp_path / f"{agent}.avro"
    assert cli(stack, "export", agent, "-o", str(path)).returncode == 0
    with elsewhere(tmp_path) as there:
        assert cli(there, "import", str(path)).returncode == 0
        asyncio.run(publish_ticks(there.bootstrap, "engram.events", 60.0, Codec()))
        wait_until(lambda: there.scalar(count, a=agent) > len(events), 60, "a tick folded there")
        again = cli(there, "import", str(path))
        assert again.returncode == 0, again.stderr
        assert f"imported 0 events of {agent}" in again.stdout
        assert f"the first {len(events)} events of the file were here already" in again.stdout


def test_export_refuses_an_unknown_agent(stack: Stack, tmp_path: Path) -> None:
    done = cli(stack, "export", "nobody-at-all", "-o", str(tmp_path / "x.jsonl"))
    assert done.returncode == 1
    assert "no events of agent 'nobody-at-all'" in done.stderr
    assert not (tmp_path / "x.jsonl").exists() and not list(tmp_path.iterdir())


def test_import_refuses_a_bad_file_and_sends_nothing(stack: Stack, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "interaction.recorded", "agent_id": "a"}\n', encoding="utf-8")
    done = cli(stack, "import", str(bad))
    assert done.returncode == 2
    assert "nothing was imported: line 1:" in done.stderr


def test_import_refuses_a_file_that_repeats_an_event(stack: Stack, tmp_path: Path) -> None:
    """Two exports joined, or a line copied: the fold would drop the repeat and the
    import wait for it until its timeout; it is refused before anything is sent."""
    agent = f"twice-{uuid.uuid4().hex[:8]}"
    events = history(agent)
    codec = Codec()
    lines = [codec.encode_json(event) for event in events]
    lines.insert(3, lines[1])  # the second event again, as the fourth
    path = tmp_path / "twice.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    done = cli(stack, "import", str(path), "--timeout", "30")
    assert done.returncode == 1, done.stderr
    assert (
        f"events 2 and 4 of the file are the same event {events[1].event_id} of {agent!r}"
        in done.stderr
    )
    assert "nothing was imported" in done.stderr and "Traceback" not in done.stderr
    count = "SELECT count() FROM events FINAL WHERE agent_id = {a:String}"
    assert stack.scalar(count, a=agent) == 0


def facts(memory: Memory, agent: str) -> list[tuple[str, str, str]]:
    return sorted((f["namespace"], f["key"], f["value"]) for f in memory.snapshot(agent).facts)


def test_an_erasure_a_rollback_and_a_fork_move_alike(
    stack: Stack, there: Stack, tmp_path: Path
) -> None:
    """An erased subject's events leave gaps in the source's numbering, which the
    importing side does not have: the rollback's and the fork's positions are
    translated, the erasure's per-agent copy stays home, a fork waits for its source,
    and importing again sends nothing."""
    tag = uuid.uuid4().hex[:8]
    x, y, gone, kept = f"x-{tag}", f"y-{tag}", f"gone-{tag}", f"kept-{tag}"
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(days=30)
    count = "SELECT count() FROM events FINAL WHERE agent_id = {a:String}"

    def fact(agent: str, user: str, at: datetime, key: str, value: str) -> Event:
        body = {"namespace": "p", "key": key, "value": value}
        return make_event("fact.asserted", agent_id=agent, user_id=user, occurred_at=at, body=body)

    with Memory(bootstrap=stack.bootstrap, http=stack.http) as memory:
        memory.publish_many(
            [
                fact(x, gone, t0, "note", f"SECRET-{tag}"),
                fact(x, kept, t0 + timedelta(hours=1), "drink", "tea"),
                fact(x, kept, t0 + timedelta(days=3), "drink", "coffee"),
            ]
        )
        wait_until(lambda: stack.scalar(count, a=x) == 3, 60, "x archived")
        back = cli(stack, "rollback", x, "--to", (t0 + timedelta(days=1)).isoformat())
        assert back.returncode == 0, back.stderr
        memory.erase(gone)
        receipt = "SELECT count() FROM erasures FINAL WHERE agent_id = {a:String}"
        wait_until(lambda: stack.scalar(receipt, a=x) >= 1, 120, "x's erasure receipt")
        forked = cli(stack, "fork", x, "--as", y)
        assert forked.returncode == 0, forked.stderr
        memory.publish(fact(y, kept, datetime.now(UTC), "city", "Osaka"))
        wait_until(lambda: stack.scalar(count, a=y) == 2, 60, "y archived")
        source = {agent: facts(memory, agent) for agent in (x, y)}
    assert source == {
        x: [("p", "drink", "tea")],
        y: [("p", "city", "Osaka"), ("p", "drink", "tea")],
    }
    assert stack.scalar(count, a=x) == 4  # two facts, the rollback, the erasure's copy (seq 1-4)

    x_file, y_file = tmp_path / "x.jsonl", tmp_path / "y.avro"
    for agent, path, fmt in ((x, x_file, "jsonl"), (y, y_file, "avro")):
        done = cli(stack, "export", agent, "-o", str(path), "--format", fmt)
        assert done.returncode == 0, done.stderr
    exported = x_file.read_text(encoding="utf-8")
    assert gone not in exported and "SECRET" not in exported
    assert "subject.erasure_requested" not in exported
    assert '"to_seq":0' in exported  # seq 1 at home is the export's first event

    early = cli(there, "import", str(y_file))
    assert early.returncode == 1
    assert f"begins as a fork of {x!r}, which this deployment does not have" in early.stderr
    assert cli(there, "import", str(x_file)).returncode == 0
    assert there.scalar(count, a=x) == 3  # import waits until the history holds them
    assert cli(there, "import", str(y_file)).returncode == 0
    assert there.scalar(count, a=y) == 2
    with Memory(http=there.http) as remote:
        moved = wait_until(
            lambda: (now := {a: facts(remote, a) for a in (x, y)}) == source and now,
            60,
            "the same facts elsewhere",
        )
    assert moved == source
    again = cli(there, "import", str(x_file))
    assert again.returncode == 0, again.stderr
    assert f"imported 0 events of {x}" in again.stdout
    assert f"{x}: the first 3 events of the file were here already" in again.stdout
    assert there.scalar(count, a=x) == 3


def test_a_fork_is_refused_where_another_agent_has_its_source_s_name(
    stack: Stack, there: Stack, tmp_path: Path
) -> None:
    """A fork names its source's event at its position: another agent of the source's
    name, with as many events, does not pass for the source (nothing is sent), the
    source imported first does, and a fork of an older engram (which names no event)
    is still checked by the source's name and length only."""
    tag = uuid.uuid4().hex[:8]
    a, b = f"source-{tag}", f"fork-{tag}"
    count = "SELECT count() FROM events FINAL WHERE agent_id = {a:String}"
    events = history(a)
    with Memory(bootstrap=stack.bootstrap) as memory:
        memory.publish_many(events)
    wait_until(lambda: stack.scalar(count, a=a) == len(events), 60, "the source archived")
    forked = cli(stack, "fork", a, "--as", b)
    assert forked.returncode == 0, forked.stderr
    position, named = len(events) - 1, events[-1].event_id
    (version, body), *_ = stack.rows("SELECT schema_version, body FROM events FINAL"
                                     " WHERE agent_id = {a:String}", a=b)  # fmt: skip
    assert version == 2
    assert f'"source_seq":{position},"source_event_id":"{named}"' in body
    a_file, b_file = tmp_path / "a.avro", tmp_path / "b.jsonl"
    for agent, path in ((a, a_file), (b, b_file)):
        done = cli(stack, "export", agent, "-o", str(path))
        assert done.returncode == 0, done.stderr

    with elsewhere(tmp_path) as other:
        with Memory(bootstrap=other.bootstrap) as memory:
            memory.publish_many(history(a))  # the same name and length, other events
        wait_until(lambda: other.scalar(count, a=a) == len(events), 60, "the other archived")
        refused = cli(other, "import", str(b_file))
        assert refused.returncode == 1, refused.stderr
        message = " ".join(refused.stderr.split())
        assert (
            f"{b!r} begins as a fork of {a!r} at seq {position}, where its source had event"
            f" {named}; the {a!r} here has event " in message
        )
        assert "another agent of that name" in message and "nothing was imported" in message
        assert other.scalar(count, a=b) == 0
        codec = Codec()
        (fork_line,) = b_file.read_bytes().splitlines()
        fork = codec.decode(fork_line)
        assert isinstance(fork, MemoryForked) and fork.body.source_event_id == named
        older_body = fork.body.model_copy(update={"source_event_id": None})
        older = fork.model_copy(update={"schema_version": 1, "body": older_body})
        older_file = tmp_path / "older-fork.jsonl"
        older_file.write_bytes(codec.encode_json(older) + b"\n")
        passed = cli(other, "import", str(older_file))
        assert passed.returncode == 0, passed.stderr  # the known limit of older forks
        assert other.scalar(count, a=b) == 1

    assert cli(there, "import", str(a_file)).returncode == 0
    done = cli(there, "import", str(b_file))
    assert done.returncode == 0, done.stderr
    assert there.scalar(count, a=b) == 1
    with Memory(http=stack.http) as home, Memory(http=there.http) as remote:
        assert wait_until(
            lambda: (moved := facts(remote, b)) == facts(home, b) and moved, 60, "the fork's facts"
        )


def test_bad_input_is_refused_with_a_message_not_a_traceback(stack: Stack, tmp_path: Path) -> None:
    agent = f"plain-{uuid.uuid4().hex[:8]}"
    with Memory(bootstrap=stack.bootstrap) as memory:
        body = {"namespace": "p", "key": "k", "value": "v"}
        memory.publish(make_event("fact.asserted", agent_id=agent, body=body))
    count = "SELECT count() FROM events FINAL WHERE agent_id = {a:String}"
    wait_until(lambda: stack.scalar(count, a=agent) == 1, 60, "the agent archived")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    cases = [
        (("import", str(empty)), 1, "the file holds no events: nothing to import"),
        (("import", str(tmp_path)), 2, "is a directory: give the file engram export wrote"),
        (("export", agent, "-o", str(tmp_path / "no" / "such" / "dir.jsonl")), 1, "No such file"),
        (("fork", agent, "--as", "x" * 300), 2, "refused: "),
        (("fork", agent, "--as", "bad\tname"), 2, "refused: "),
        (("rollback", agent, "--to", "0001-01-01T00:00Z"), 2, "is before any history"),
    ]
    for args, code, message in cases:
        done = cli(stack, *args)
        assert (done.returncode, message in done.stderr) == (code, True), (args, done.stderr)
        assert "Traceback" not in done.stderr


def test_a_file_of_an_older_engram_with_an_erasure_copy_imports_without_it(
    stack: Stack, tmp_path: Path
) -> None:
    """Exports written before this engram left out erasure copies carry them: the
    import leaves them out (what they erased is not in the file) instead of refusing."""
    agent = f"older-{uuid.uuid4().hex[:8]}"
    codec = Codec()
    body = {"namespace": "p", "key": "k", "value": "v"}
    events = [
        make_event("fact.asserted", agent_id=agent, body=body),
        make_event("subject.erasure_requested", agent_id=agent, body={"subject": "gone-user"}),
        make_event("fact.asserted", agent_id=agent, body={**body, "value": "w"}),
    ]
    path = tmp_path / "older.jsonl"
    path.write_bytes(b"".join(codec.encode_json(e) + b"\n" for e in events))
    done = cli(stack, "import", str(path))
    assert done.returncode == 0, done.stderr
    assert f"imported 2 events of {agent}" in done.stdout
    assert "left out 1 erasure copies" in done.stdout
    count = "SELECT count() FROM events FINAL WHERE agent_id = {a:String}"
    assert stack.scalar(count, a=agent) == 2


def long_history(agent: str, turns: int) -> list[Event]:
    """:func:`history`'s session, then ``turns`` turns of a second one a day later (a
    tick among them would cut the first session's idle gap or sweep at its time)."""
    t1 = datetime.now(UTC).replace(microsecond=0) - timedelta(days=20)
    more = [
        make_event(
            "interaction.recorded",
            agent_id=agent,
            session_id="s2",
            user_id="mei",
            occurred_at=t1 + timedelta(seconds=i),
            body={"role": "user", "content": f"step {i} of the itinerary"},
        )
        for i in range(turns)
    ]
    return history(agent)[:-2] + more


def test_no_tick_of_the_destination_lands_among_the_imported_events(
    stack: Stack, tmp_path: Path
) -> None:
    """The destination ticks every second; an import that takes several seconds holds
    its clock: the agent's log there is the file's, tick for tick, its memory the
    source's, and the ticks resume once the import is done."""
    agent = f"held-{uuid.uuid4().hex[:8]}"
    events = long_history(agent, 1000)
    with Memory(bootstrap=stack.bootstrap) as memory:
        memory.publish_many(events)
    count = "SELECT count() FROM events FINAL WHERE agent_id = {a:String}"
    wait_until(lambda: stack.scalar(count, a=agent) == len(events), 60, "the history archived")
    source = wait_until(
        lambda: (rows := changes(stack, agent)) and rows[-1][0] == len(events) - 1 and rows,
        30,
        "the memory changes",
    )
    path = tmp_path / f"{agent}.avro"
    assert cli(stack, "export", agent, "-o", str(path)).returncode == 0
    log = "SELECT seq, toString(event_id), type FROM events FINAL WHERE agent_id = {a:String}"
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        there = start_stack(
            tmp_path / "ticking",
            ENGRAM_KAFKA_BOOTSTRAP=broker.bootstrap,
            ENGRAM_TICK_INTERVAL_S="1",
            **FAST_GROUP,
        )
        try:
            started = time.monotonic()
            done = cli(there, "import", str(path), "--batch", "1")
            took = time.monotonic() - started
            assert done.returncode == 0, done.stderr
            assert took > 5, f"the import took {took:.1f}s: not several tick intervals"
            moved = there.rows(log + " ORDER BY seq", a=agent)
            file_ids = {str(event.event_id) for event in events}
            foreign = [(s, kind) for s, e, kind in moved[: len(events)] if e not in file_ids]
            assert foreign == [], "the destination's own events among the file's"
            assert [e for _, e, _ in moved[: len(events)]] == [str(e.event_id) for e in events]
            moved_changes = wait_until(
                lambda: (
                    (rows := [r for r in changes(there, agent) if r[0] < len(events)])
                    and len(rows) == len(source)
                    and rows
                ),
                30,
                "the same memory changes elsewhere",
            )
            assert moved_changes == source
            wait_until(
                lambda: there.scalar(count, a=agent) > len(events), 30, "a tick after the import"
            )
            tick = there.rows(log + " AND seq = {s:Int64}", a=agent, s=len(events))
            assert tick[0][2] == "clock.tick"
        finally:
            assert there.stop() == 0
