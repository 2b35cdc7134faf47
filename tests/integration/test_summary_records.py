"""The LLM summaries a re-fold reuses (``ClickHouseSummaryRecords.recorded``): only
those recorded for the same turns. A reprocess with another episode gap closes an
episode with the same event id (a ``uuid5`` of the closing event) over other turns;
the summary of the old turns must not be taken for it.

Real parts: chdb in a temp dir, the history's own writes."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import clickhouse_connect
import pytest

from schemas import EpisodeClosed
from sinks.clickhouse import ClickHouseHistory
from streams.summariser import ClickHouseSummaryRecords, Recorded

pytestmark = pytest.mark.integration

TURNS = [str(uuid.UUID(int=n)) for n in range(1, 5)]


def closing(sources: list[str], summariser: str, summary: str) -> EpisodeClosed:
    at = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
    return EpisodeClosed(
        event_id=uuid.UUID(int=99),
        agent_id="a",
        session_id="s",
        user_id="u",
        occurred_at=at,
        source_event_id=uuid.UUID(sources[-1]),
        seq=7,
        idx=0,
        config_version="c",
        body={
            "episode_id": "e",
            "summary": summary,
            "importance": 5,
            "sentiment": 0.0,
            "confidence": 0.5,
            "turn_count": len(sources),
            "started_at": at,
            "ended_at": at,
            "cut": "session_ended",
            "sources": sources,
            "summariser": summariser,
        },
    )


@pytest.fixture
def history(tmp_path: Path) -> Iterator[ClickHouseHistory]:
    client = clickhouse_connect.get_client(dsn=f"chdb://{tmp_path / 'ch'}")
    try:
        history = ClickHouseHistory(client)
        history.ensure_schema()
        yield history
    finally:
        client.close()


def test_a_recorded_summary_is_reused_only_for_the_same_turns(history: ClickHouseHistory) -> None:
    asyncio.run(history.write_changes("memory_changes", [closing(TURNS, "llm:m", "LLM: all four")]))
    records = ClickHouseSummaryRecords(history)
    same = closing(TURNS, "extractive-v1", "extractive")
    other = closing(TURNS[2:], "extractive-v1", "extractive")  # a later cut, same id
    assert asyncio.run(records.recorded([same])) == {
        same.event_id: Recorded("LLM: all four", "llm:m")
    }
    assert asyncio.run(records.recorded([other])) == {}
