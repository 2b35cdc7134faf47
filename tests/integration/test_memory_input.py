"""Bad input to recall, snapshot, history and feedback on a running ``engram up``: a
clear 4xx (or a typed error in the client) before anything runs or is recorded, never
a 500; and a recall that finds nothing leaves no trace of an agent that has none."""

from __future__ import annotations

import uuid

import httpx
import pytest

from engram import Memory
from engram.errors import RequestFailed
from schemas import BadEvent
from tests.support import Stack

pytestmark = pytest.mark.integration


def post(stack: Stack, path: str, raw: bytes) -> httpx.Response:
    headers = {"content-type": "application/json"}
    return httpx.post(f"{stack.http}{path}", content=raw, headers=headers, timeout=30)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"query": "\\ud800", "agent_id": "a"}',  # a lone surrogate
        b'{"query": "x", "agent_id": "\\udfff"}',
        b'{"query": "x", "agent_id": "a", "k": NaN}',
        b'{"query": "x", "agent_id": "a", "min_importance": Infinity}',
        b'{"query": "x", "agent_id": "bad\\tid"}',
        b'{"query": "x", "agent_id": "a", "session_id": ""}',
    ],
)
def test_a_malformed_recall_is_a_422_not_a_500(stack: Stack, raw: bytes) -> None:
    response = post(stack, "/v1/recall", raw)
    assert response.status_code == 422, response.text
    assert response.json()["detail"]


@pytest.mark.parametrize("path", ["/v1/snapshot", "/v1/history"])
@pytest.mark.parametrize(
    ("as_of", "reason"),
    [("0001-01-01T00:00:00+00:00", "before any history"), ("2999-01-01T00:00:00Z", "future")],
)
def test_an_as_of_outside_the_history_is_a_422(
    stack: Stack, path: str, as_of: str, reason: str
) -> None:
    response = httpx.get(
        f"{stack.http}{path}", params={"agent_id": "anyone", "as_of": as_of}, timeout=30
    )
    assert response.status_code == 422, response.text
    assert reason in response.json()["reason"]


def test_a_recall_that_finds_nothing_records_nothing(stack: Stack) -> None:
    """A mistyped agent id, or a recall before the first event, must not create the agent."""
    nobody = f"typo-{uuid.uuid4().hex[:8]}"
    with Memory(http=stack.http) as memory:
        found = memory.recall("where does the user want to travel?", agent_id=nobody)
        assert (found.memories, found.event_id) == ([], None)
        with pytest.raises(RequestFailed) as unknown:
            memory.snapshot(nobody)
        assert unknown.value.status == 404


def test_feedback_needs_a_memory_id_and_sends_it_canonical(stack: Stack) -> None:
    memory_id, agent = uuid.uuid4(), f"feedback-{uuid.uuid4().hex[:8]}"
    with Memory(bootstrap=stack.bootstrap) as memory:
        with pytest.raises(BadEvent, match="is not a memory id"):
            memory.feedback("not-a-uuid", True, agent_id=agent)
        event = memory.feedback(str(memory_id).upper(), True, agent_id=agent)
    assert event.body.memory_id == str(memory_id)  # type: ignore[attr-defined]
