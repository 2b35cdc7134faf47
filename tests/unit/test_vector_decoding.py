"""The vector projection reads only the derived types it needs, by fingerprint: the
rest of ``engram.memory`` (working memory, episodes, …) is skipped undecoded."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from uuid import UUID

import pytest

from processors import AgentMemory, MemoryConfig
from schemas import (
    Codec,
    DerivedEvent,
    InteractionRecorded,
    MemoryCreated,
    SubjectErased,
    SubjectErasureRequested,
    WorkingUpdated,
)
from streams.vectors import CREATED, VECTOR_TYPES, decode_all, erased_points, operations


def derived() -> list[DerivedEvent]:
    """A turn important enough to be a memory: a working.updated and a memory.created."""
    memory = AgentMemory.empty("bot", MemoryConfig())
    turn = InteractionRecorded(
        event_id=UUID(int=7),
        agent_id="bot",
        session_id="s",
        user_id="mei",
        occurred_at=datetime(2026, 11, 2, tzinfo=UTC),
        body={"role": "user", "content": "我对花生过敏！", "importance": 9.0},
    )
    return list(memory.apply(turn).derived)


def test_only_the_asked_types_are_decoded(caplog: pytest.LogCaptureFixture) -> None:
    codec = Codec()
    events = derived()
    assert {type(e) for e in events} >= {WorkingUpdated, MemoryCreated}
    raw = [codec.encode(e) for e in events]
    assert decode_all(codec, raw) == events
    assert decode_all(codec, raw, VECTOR_TYPES) == [e for e in events if e.type in VECTOR_TYPES]
    created = [e for e in events if isinstance(e, MemoryCreated)]
    assert decode_all(codec, raw, CREATED) == created
    # a skipped type is not even read: broken bytes behind its fingerprint pass unnoticed
    working = next(r for r, e in zip(raw, events, strict=True) if isinstance(e, WorkingUpdated))
    broken = working[:10] + b"\xff" * 5
    with caplog.at_level(logging.ERROR):
        assert decode_all(codec, [broken], CREATED) == []
        assert not caplog.records
        assert decode_all(codec, [broken]) == []
    assert "undecodable record" in caplog.text


def test_each_erasure_gets_the_points_its_operations_deleted() -> None:
    """An agent erased as its own subject deletes two owners' points (the subject's and
    those without a user), a user one: the counts add up per ``subject.erased``."""
    memory = AgentMemory.empty("bot", MemoryConfig())
    events = list(derived())
    for i, subject in enumerate(("mei", "bot"), 1):
        request = SubjectErasureRequested(
            event_id=UUID(int=100 + i),
            agent_id="bot",
            occurred_at=datetime(2026, 11, 3, tzinfo=UTC),
            body={"subject": subject},
        )
        events += memory.apply(request).derived
    erased = [e for e in events if isinstance(e, SubjectErased)]
    ops = operations(events, "usem3")
    assert [op.kind for op in ops if op.kind == "erase"] == ["erase"] * 3
    found = erased_points(events, [4, 2, 1])
    assert [(e.body.subject, n) for e, n in found] == [("mei", 4), ("bot", 3)]
    assert [e for e, _ in found] == erased
