"""The CLI refuses bad input with one line and an exit code, before it needs a stack
(or when the stack it finds does not answer), and writes JSON that strict parsers read."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engram.cli import app, render
from engram.status import erased_rows


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("ENGRAM_KAFKA_BOOTSTRAP", "ENGRAM_CLICKHOUSE_URL", "ENGRAM_HTTP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ENGRAM_HOME", str(tmp_path))
    return tmp_path


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
    return result.exit_code, " ".join(result.output.split())


def test_an_empty_moment_is_refused_not_taken_for_now(home: Path) -> None:
    assert run("snapshot", "agent-a", "--as-of", "") == (2, "error: not an ISO-8601 moment: ''")


def test_a_moment_utc_cannot_hold_is_refused(home: Path) -> None:
    code, said = run("history", "--agent", "a", "--as-of", "0001-01-01T00:00+01:00")
    assert (code, said) == (
        2,
        "error: '0001-01-01T00:00+01:00' is outside the years 1 to 9999 in UTC",
    )


def test_a_file_that_is_not_utf8_names_its_line(home: Path) -> None:
    path = home / "events.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"type": "caf\xe9"}\n')
    code, said = run("publish", str(path))
    assert code == 2
    assert said == (
        "error: nothing was published: line 3: not UTF-8 text"
        " (invalid continuation byte at byte 13)"
    )
    query = home / "q.sql"
    query.write_bytes(b"SELECT '\xff'")
    code, said = run("sql", f"@{query}")
    assert (code, said) == (
        2,
        "error: the query file is not UTF-8 text (invalid start byte at byte 8)",
    )


def test_a_stack_that_left_its_up_file_behind_is_named(home: Path) -> None:
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (home / "up.json").write_text(json.dumps({"http": f"http://127.0.0.1:{port}"}))
    for args in (("sql", "SELECT 1"), ("history", "--agent", "a", "--as-of", "2026-01-01T00:00Z")):
        code, said = run(*args)
        assert code == 1, args
        assert f"engram up's API at http://127.0.0.1:{port} does not answer" in said, args
        assert "start `engram up` again" in said


def test_json_output_has_no_numbers_json_lacks(capsys: pytest.CaptureFixture[str]) -> None:
    render(["x", "y"], [(float("inf"), [1.5, float("nan")]), (-float("inf"), {"k": 2.0})], "json")
    parsed = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(c))
    assert parsed == [{"x": None, "y": [1.5, None]}, {"x": None, "y": {"k": 2.0}}]


def test_an_erasure_receipt_says_deleted_rewritten_and_points_apart() -> None:
    rows = {
        "events": 9243,
        "memory_changes": 11635,
        "memory_changes rewritten": 252,
        "agent_states": 95,
        "agent_checkpoints": 75,
        "vector points": 2284,
    }
    assert erased_rows(rows) == (
        "21048 history rows deleted, 252 rewritten, 2284 vector points deleted"
    )
