"""The ingest bench's events (``ops/bench/ingest.py``): one text repeated, or drawn."""

from __future__ import annotations

import pytest

from ops.bench.ingest import CONTENT, make_events, make_payloads


def test_repeated_texts_say_the_one_content() -> None:
    events = make_events(40, 4)
    assert {e.body.content for e in events} == {CONTENT}
    assert [e.agent_id for e in events[:5]] == [f"bench-agent-{i % 4:04d}" for i in range(5)]


def test_rich_texts_are_drawn_and_the_same_each_run() -> None:
    first = [e.body.content for e in make_events(400, 4, "rich")]
    again = [e.body.content for e in make_events(400, 4, "rich")]
    assert first == again  # seeded: every run publishes the same texts
    assert CONTENT not in first
    assert len(set(first)) > 250  # one to four of 38 sentences: now and then the same
    assert any("。" in text for text in first) and any(". " in text for text in first)


def test_an_unknown_kind_of_text_is_refused() -> None:
    with pytest.raises(ValueError, match="texts must be one of"):
        make_events(1, 1, "random")


def test_payloads_follow_the_texts() -> None:
    assert make_payloads(5, 1, "rich") != make_payloads(5, 1, "repeated")
