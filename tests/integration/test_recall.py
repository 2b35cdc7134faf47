"""Recall through the running stack: events in, memories embedded and projected to
the vector store, recalled over HTTP in English, Chinese and across the two; the
recall flows back as reinforcement; forgotten memories leave recall but stay in
history; no request reads another agent's memories; snapshots hold what was
published."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from engram.client import Memory
from engram.errors import RequestFailed
from engram.events import make_event
from engram.results import RecallResult
from schemas import Event
from tests.support import Stack, start_stack, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=["edge", "local"])
def recall_stack(
    request: pytest.FixtureRequest, stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """The session stack (Qdrant Edge, the default), and a stack of its own on
    qdrant-client's local mode: every test runs on both vector stores."""
    if request.param == "edge":
        yield stack
        return
    home = tmp_path_factory.mktemp("recall-local")
    local = start_stack(home, ENGRAM_QDRANT_URL=f"local://{home / 'qdrant'}")
    try:
        yield local
    finally:
        assert local.stop() == 0


START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)

IMPORTANT = [
    # (content, importance, sentiment): importance > 8 and |sentiment| >= 0.7 is a flashbulb
    ("Please remember: I am severely allergic to peanuts, even a trace is dangerous.", 9.5, -0.8),
    ("My daughter Emma starts primary school in Berlin this September.", 8.5, 0.4),
    ("我下个月要去东京出差，酒店订在新宿。", 8.5, 0.2),
    ("我最喜欢的运动是游泳，每周去三次。", 8.2, 0.5),
]


def turn(agent: str, session: str, content: str, at: datetime, **scores: float) -> Event:
    return make_event(
        "interaction.recorded",
        agent_id=agent,
        session_id=session,
        user_id="u-1",
        occurred_at=at,
        body={"role": "user", "content": content, **scores},
    )


def history_of(agent: str) -> list[Event]:
    events = [
        make_event(
            "session.started", agent_id=agent, session_id="s1", user_id="u-1", occurred_at=START
        )
    ]
    at = START
    for content, importance, sentiment in IMPORTANT:
        at += timedelta(minutes=1)
        events.append(turn(agent, "s1", content, at, importance=importance, sentiment=sentiment))
        at += timedelta(minutes=1)
        events.append(turn(agent, "s1", "ok, noted", at))
    events.append(
        make_event(
            "session.ended",
            agent_id=agent,
            session_id="s1",
            user_id="u-1",
            occurred_at=at + timedelta(minutes=1),
        )
    )
    events.append(
        make_event(
            "fact.asserted",
            agent_id=agent,
            user_id="u-1",
            occurred_at=at,
            body={"namespace": "profile", "key": "city", "value": "Berlin"},
        )
    )
    events.append(
        turn(agent, "s2", "Can you book the dentist for Tuesday?", at + timedelta(hours=1))
    )
    return events


def recall(stack: Stack, query: str, agent: str, **options: Any) -> RecallResult:
    with Memory(http=stack.http) as memory:
        return memory.recall(query, agent_id=agent, **options)


@pytest.fixture(scope="module")
def agent(recall_stack: Stack) -> str:
    """A fresh agent with four important memories, recallable."""
    stack = recall_stack
    name = f"recall-{uuid.uuid4().hex[:8]}"
    with Memory(bootstrap=stack.bootstrap) as memory:
        memory.publish_many(history_of(name))
    wait_until(
        lambda: len(recall(stack, "peanut allergy", name, k=20).memories) >= 5,
        60,
        "the memories to be recallable (4 turns and the episode)",
    )
    return name


def texts(result: RecallResult, top: int) -> list[str]:
    return [m.text for m in result.memories[:top]]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("which foods must the user avoid?", "peanuts"),
        ("when does the child begin school?", "Emma"),
        ("他什么时候去日本？住哪里？", "东京"),
        ("用户喜欢什么体育活动", "游泳"),
    ],
)
def test_paraphrases_find_the_memory(
    recall_stack: Stack, agent: str, query: str, expected: str
) -> None:
    stack = recall_stack
    found = texts(recall(stack, query, agent, k=3), 3)
    assert any(expected in text for text in found), found


def test_cross_lingual_query_finds_the_chinese_memory(recall_stack: Stack, agent: str) -> None:
    stack = recall_stack
    found = texts(recall(stack, "business trip to Tokyo next month", agent, k=3), 3)
    assert any("东京" in text for text in found), found


def test_scores_are_explained_and_ordered(recall_stack: Stack, agent: str) -> None:
    stack = recall_stack
    result = recall(stack, "peanut allergy", agent, k=10)
    scores = [m.score for m in result.memories]
    assert scores == sorted(scores, reverse=True)
    top = result.memories[0]
    assert "peanuts" in top.text
    assert top.layer == "L3"  # a flashbulb: promoted, never forgotten
    assert 0 < top.relevance <= 1 and top.retention == 1.0
    assert result.event_id is not None


def test_no_request_reads_another_agents_memories(recall_stack: Stack, agent: str) -> None:
    stack = recall_stack
    for other in ("", "*", f"{agent} ", agent.upper(), f"{agent}' OR 1=1 --", "x" * 256):
        try:
            result = recall(stack, "peanut allergy", other, k=10)
        except RequestFailed as refused:
            assert refused.status == 422
            continue
        assert result.memories == [], other
    # the user filter narrows inside the same agent
    assert recall(stack, "peanut allergy", agent, user_id="u-2").memories == []
    response = httpx.post(
        f"{stack.http}/v1/recall",
        json={"query": "peanut", "agent_id": agent, "filter": {"must": []}},
    )
    assert response.status_code == 422  # no raw filters: unknown fields are refused


def test_a_recall_reinforces_what_it_returned(recall_stack: Stack, agent: str) -> None:
    stack = recall_stack
    result = recall(stack, "Emma school Berlin", agent, k=1)
    memory_id = result.memories[0].memory_id
    before = result.memories[0].reinforcements
    strength_before = result.memories[0].strength

    def in_history() -> tuple[int, float] | None:
        rows = stack.rows(
            "SELECT reinforcements, strength FROM memories"
            " WHERE agent_id = {a:String} AND memory_id = {m:String}",
            a=agent,
            m=memory_id,
        )
        return rows[0] if rows and rows[0][0] > before else None

    reinforcements, strength = wait_until(in_history, 60, "the recall's reinforcement in history")
    assert reinforcements >= before + 1 and strength > strength_before
    again = wait_until(
        lambda: next(
            (
                m
                for m in recall(stack, "Emma school Berlin", agent, k=10).memories
                if m.memory_id == memory_id and m.reinforcements > before
            ),
            None,
        ),
        60,
        "the reinforcement in the vector payload",
    )
    assert again.strength > strength_before


def test_forgotten_memories_leave_recall_and_stay_in_history(recall_stack: Stack) -> None:
    stack = recall_stack
    name = f"forget-{uuid.uuid4().hex[:8]}"
    with Memory(bootstrap=stack.bootstrap) as memory:
        memory.publish_many(history_of(name))
        wait_until(lambda: len(recall(stack, "swimming", name, k=20).memories) >= 5, 60, "memories")
        tick = make_event(
            "clock.tick",
            agent_id=name,
            occurred_at=START + timedelta(days=3650),
            body={"partition": 0, "interval_s": 60.0},
        )
        memory.publish(tick)
    wait_until(
        lambda: stack.scalar(
            "SELECT count() FROM memories WHERE agent_id = {a:String} AND forgotten", a=name
        ),
        30,
        "forgetting in the history",
    )

    def survivors() -> list[str] | None:
        found = recall(stack, "swimming", name, k=20).memories
        return [m.text for m in found] if all(m.layer == "L3" for m in found) else None

    kept = wait_until(survivors, 30, "forgotten memories to leave recall")
    assert any("peanuts" in text for text in kept)  # the flashbulb is never forgotten
    assert not any("游泳" in text for text in kept)
    with_forgotten = recall(stack, "游泳", name, k=20, include_forgotten=True)
    assert any("游泳" in m.text and m.forgotten for m in with_forgotten.memories)
    # the turn and the episode that summarises it: both still in history, both forgotten
    total, forgotten = stack.rows(
        "SELECT count(), countIf(forgotten) FROM memories"
        " WHERE agent_id = {a:String} AND text LIKE '%游泳%'",
        a=name,
    )[0]
    assert total >= 1 and forgotten == total


def test_the_snapshot_holds_what_was_published(recall_stack: Stack) -> None:
    stack = recall_stack
    agent = f"snap-{uuid.uuid4().hex[:8]}"
    published = history_of(agent)
    with Memory(bootstrap=stack.bootstrap) as memory:
        memory.publish_many(published)
    wait_until(
        lambda: (
            stack.scalar("SELECT count() FROM events WHERE agent_id = {a:String}", a=agent)
            == len(published)
        ),
        30,
        "the events in the history",
    )
    with Memory(http=stack.http) as memory:
        snap = memory.snapshot(agent)
        only_s2 = memory.snapshot(agent, session_id="s2")
        with pytest.raises(RequestFailed) as unknown:
            memory.snapshot(f"nobody-{uuid.uuid4().hex}")
    assert unknown.value.status == 404
    assert snap.position.seq == len(published) - 1
    assert [s["session_id"] for s in only_s2.working] == ["s2"]
    assert only_s2.working[0]["turns"][-1]["content"] == "Can you book the dentist for Tuesday?"
    assert {(f["namespace"], f["key"], f["value"]) for f in snap.facts} == {
        ("profile", "city", "Berlin")
    }
    assert len(snap.episodes) == 1 and snap.episodes[0]["session_id"] == "s1"
    assert snap.memories["L3"] >= 1
    # as of a moment before the fact: no fact yet, fewer events folded
    early = recall_free_snapshot(stack, agent, START + timedelta(minutes=2))
    assert early["facts"] == [] and early["position"]["seq"] < snap.position.seq


def recall_free_snapshot(stack: Stack, agent: str, at: datetime) -> dict[str, Any]:
    response = httpx.get(
        f"{stack.http}/v1/snapshot", params={"agent_id": agent, "as_of": at.isoformat()}
    )
    response.raise_for_status()
    answer: dict[str, Any] = response.json()
    return answer
