"""How the CLI reads a moment (``--as-of``, ``--to``, ``--at``): ISO-8601 with an offset,
``Z`` in either case as RFC 3339 allows; anything else exits 2 with a reason."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
import typer

from engram.cli import parse_moment


@pytest.mark.parametrize(
    ("text", "moment"),
    [
        ("2026-11-01T10:00Z", datetime(2026, 11, 1, 10, tzinfo=UTC)),
        ("2026-11-01T10:00z", datetime(2026, 11, 1, 10, tzinfo=UTC)),
        ("2026-11-01t10:00:00.5z", datetime(2026, 11, 1, 10, 0, 0, 500000, tzinfo=UTC)),
        ("2026-11-01T10:00+09:00", datetime(2026, 11, 1, 10, tzinfo=timezone(timedelta(hours=9)))),
    ],
)
def test_a_moment_with_an_offset_reads(text: str, moment: datetime) -> None:
    assert parse_moment(text) == moment


@pytest.mark.parametrize("text", ["2026-11-01T10:00", "yesterday", "2026-13-01T10:00Z"])
def test_anything_else_exits_2(text: str) -> None:
    with pytest.raises(typer.Exit) as exited:
        parse_moment(text)
    assert exited.value.exit_code == 2
