"""The CLI as a user runs it: ``engram demo``, then ``engram up`` again on the same
home (the log is restored from the archive), then publish / sql / schema."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from engram import Memory, make_event
from engram.demo import demo_events
from tests.support import REPO, Stack, engram_cmd, engram_env, start_stack, wait_until

pytestmark = pytest.mark.e2e
DEMO_COUNT = len(demo_events())


def run(
    args: list[str], env: dict[str, str], timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        engram_cmd(*args), env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e-home")


@pytest.fixture(scope="module")
def demo_output(home: Path) -> subprocess.CompletedProcess[str]:
    return run(["demo"], engram_env(home, COLUMNS="200"))


@pytest.fixture(scope="module")
def restarted(home: Path, demo_output: subprocess.CompletedProcess[str]) -> Iterator[Stack]:
    assert demo_output.returncode == 0, demo_output.stdout + demo_output.stderr
    stack = start_stack(home)
    broker_pid = int(stack.up["broker_pid"])
    assert Path(f"/proc/{broker_pid}").exists(), "the embedded broker runs as a child"
    yield stack
    assert stack.stop() == 0
    assert not (home / "up.json").exists(), "up.json is removed on exit"
    wait_until(lambda: not Path(f"/proc/{broker_pid}").exists(), 10, "the broker to stop too")


def test_demo_exits_zero_and_prints_its_table(
    demo_output: subprocess.CompletedProcess[str],
) -> None:
    assert demo_output.returncode == 0, demo_output.stdout + demo_output.stderr
    out = demo_output.stdout
    assert "what ClickHouse holds per agent" in out
    for agent in ("travel-agent", "coding-agent", "assistant-zh"):
        assert agent in out
    assert f"all {DEMO_COUNT} events are in ClickHouse" in out
    assert "把这个发给张经理" in out, "the last working memory of the Chinese agent is shown"
    assert "engram demo: recall" in out
    assert "vegetarian" in out, "the traveller's diet is recalled"
    assert "绿茶" in out, "an English question finds the Chinese memory"


def test_restart_restores_the_log_and_continues_the_sequence(restarted: Stack) -> None:
    assert restarted.scalar("SELECT count() FROM events FINAL") == DEMO_COUNT
    log = (restarted.home / "up.log").read_text()
    assert f"restored {DEMO_COUNT} events from the archive" in log
    before = restarted.scalar("SELECT max(seq) FROM events FINAL WHERE agent_id = 'travel-agent'")
    event = make_event(
        "interaction.recorded",
        agent_id="travel-agent",
        session_id="travel-agent-s3",
        user_id="alice",
        body={"role": "user", "content": "And a hotel in Osaka, please."},
    )
    with Memory(bootstrap=restarted.bootstrap) as memory:
        memory.publish(event)

    def seq_of_new_event() -> int | None:
        rows = restarted.rows(
            "SELECT seq FROM events FINAL WHERE event_id = {e:UUID}", e=str(event.event_id)
        )
        return rows[0][0] if rows else None

    assert wait_until(seq_of_new_event, 60, "the new event") == before + 1
    assert restarted.scalar("SELECT count() FROM events FINAL") == DEMO_COUNT + 1
    changes = restarted.scalar(
        "SELECT count() FROM memory_changes FINAL"
        " WHERE agent_id = 'travel-agent' AND type = 'working.updated'"
    )
    assert changes == before + 2, "every event of the agent made one working-memory change"


def test_demo_again_adds_nothing(restarted: Stack) -> None:
    before = restarted.scalar("SELECT count() FROM events FINAL")
    result = run(["demo"], restarted.env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert restarted.scalar("SELECT count() FROM events FINAL") == before


def test_publish_validates_every_line_first(restarted: Stack, tmp_path: Path) -> None:
    good = [
        make_event(
            "fact.asserted",
            agent_id="cli-agent",
            body={"namespace": "profile", "key": f"k{i}", "value": f"值{i}"},
        )
        for i in range(5)
    ]
    lines = [e.model_dump_json() for e in good]
    bad_file = tmp_path / "bad.jsonl"
    bad_file.write_text("\n".join([*lines[:3], '{"type": "fact.asserted"}', *lines[3:]]) + "\n")
    rejected = run(["publish", str(bad_file)], restarted.env)
    assert rejected.returncode == 2
    assert "nothing was published: line 4: invalid fact.asserted" in rejected.stderr
    good_file = tmp_path / "good.jsonl"
    good_file.write_text("\n".join(lines) + "\n\n")
    published = run(["publish", str(good_file)], restarted.env)
    assert published.returncode == 0, published.stderr
    assert "published 5 events" in published.stdout
    wait_until(
        lambda: (
            restarted.scalar("SELECT count() FROM events FINAL WHERE agent_id = 'cli-agent'") == 5
        ),
        60,
        "the 5 published facts",
    )


def test_sql_formats_and_refuses_writes(restarted: Stack) -> None:
    query = "SELECT agent_id, count() AS n FROM events FINAL GROUP BY agent_id ORDER BY agent_id"
    as_json = run(["sql", query, "--format", "json"], restarted.env)
    assert as_json.returncode == 0, as_json.stderr
    counts = {r["agent_id"]: int(r["n"]) for r in json.loads(as_json.stdout)}
    expected = sum(1 for e in demo_events() if e.agent_id == "coding-agent")
    assert counts["coding-agent"] == expected == 9
    as_csv = run(["sql", query, "-f", "csv"], restarted.env)
    assert as_csv.stdout.splitlines()[0] == "agent_id,n"
    table = run(["sql", query], restarted.env)
    assert "assistant-zh" in table.stdout
    from_file = run(
        [
            "sql",
            f"@{REPO / 'ops' / 'sql' / 'episodes_per_agent.sql'}",
            *("-p", "since=2026-01-01 00:00:00", "-p", "until=2027-01-01 00:00:00"),
            *("-p", "agent_id=assistant-zh", "-f", "json"),
        ],
        restarted.env,
    )
    assert from_file.returncode == 0, from_file.stderr
    assert json.loads(from_file.stdout)[0]["agent_id"] == "assistant-zh"
    bad_param = run(["sql", "SELECT 1", "-p", "novalue"], restarted.env)
    assert bad_param.returncode == 2 and "NAME=VALUE" in bad_param.stderr
    refused = run(["sql", "DROP TABLE events"], restarted.env)
    assert refused.returncode == 1
    assert "DROP" in refused.stderr
    assert restarted.scalar("SELECT count() FROM events FINAL") > 0


def test_schema_prints_every_type(home: Path) -> None:
    result = run(["schema"], engram_env(home))
    assert result.returncode == 0
    schemas = json.loads(result.stdout)
    assert {"interaction.recorded", "working.updated", "subject.erasure_requested"} <= set(schemas)
    assert schemas["interaction.recorded"]["properties"]["body"]
    unknown = run(["schema", "nope.nothing"], engram_env(home))
    assert unknown.returncode == 2
    assert "unknown event type 'nope.nothing'" in unknown.stderr
