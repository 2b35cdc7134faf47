"""``engram export`` / ``engram import``: an agent's log moved to another deployment
(its own broker and history) folds into the same memory there, change for change."""

from __future__ import annotations

import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from engram import Memory, make_event
from ops.broker import EmbeddedBroker
from schemas import Event
from tests.support import Stack, engram_cmd, start_stack, wait_until

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


def changes(stack: Stack, agent: str) -> list[tuple[Any, ...]]:
    return stack.rows(CHANGES, a=agent)


@pytest.mark.parametrize("fmt", ["avro", "jsonl"])
def test_an_exported_agent_folds_alike_elsewhere(stack: Stack, tmp_path: Path, fmt: str) -> None:
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

    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        there = start_stack(
            tmp_path / "elsewhere",
            ENGRAM_KAFKA_BOOTSTRAP=broker.bootstrap,
            ENGRAM_SESSION_TIMEOUT_S="6",
            ENGRAM_REBALANCE_TIMEOUT_S="2",
        )
        try:
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
        finally:
            assert there.stop() == 0


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
