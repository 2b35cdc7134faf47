"""``engram mcp`` as an agent framework runs it: a subprocess spoken to over stdio by
a real MCP client session, in front of a real ``engram up`` (the session stack)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import anyio
import pytest
from mcp.client import ClientSession, IncomingMessage
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp_types import CallToolResult

from ops.net import free_port
from processors.episodes import memory_id_of
from tests.support import REPO, Stack, wait_until

pytestmark = pytest.mark.integration

TOOLS = {
    "memory_recall": {"query", "agent_id"},
    "memory_publish": {"events"},
    "memory_snapshot": {"agent_id"},
    "memory_feedback": {"memory_id", "useful", "agent_id"},
}
ALLERGY = "Remember: I am severely allergic to peanuts!"


def agent() -> str:
    return f"mcp-{uuid.uuid4().hex[:10]}"


def turn(agent_id: str, role: str, content: str, **body: Any) -> dict[str, Any]:
    """An interaction event as an agent would write it: no event_id, no occurred_at."""
    return {
        "type": "interaction.recorded",
        "agent_id": agent_id,
        "session_id": "s1",
        "user_id": "u1",
        "body": {"role": role, "content": content, **body},
    }


@dataclass
class Mcp:
    """A client session with a running ``engram mcp``, and what its stdout carried
    that was not protocol (must stay empty)."""

    session: ClientSession
    faults: list[Exception] = field(default_factory=list)

    async def call(self, tool: str, **arguments: Any) -> CallToolResult:
        result = await self.session.call_tool(tool, arguments)
        assert isinstance(result, CallToolResult)
        return result

    async def data(self, tool: str, **arguments: Any) -> dict[str, Any]:
        """The structured result of a call that must succeed."""
        result = await self.call(tool, **arguments)
        assert not result.is_error, text(result)
        structured: dict[str, Any] | None = result.structured_content
        assert structured is not None
        assert json.loads(text(result)) == structured, "the text mirrors the structure"
        return structured


def text(result: CallToolResult) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


@pytest.fixture
def errlog(tmp_path: Path) -> Iterator[TextIO]:
    """The server's stderr, kept in a file (its logs go there, never to stdout)."""
    with (tmp_path / "mcp.stderr").open("w+") as log:
        yield log


@asynccontextmanager
async def engram_mcp(env: dict[str, str], errlog: TextIO) -> AsyncIterator[Mcp]:
    """Spawn ``engram mcp`` with ``env`` and open an initialised session to it."""
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "engram", "mcp"], env=env, cwd=REPO
    )
    faults: list[Exception] = []

    async def on_message(message: IncomingMessage) -> None:
        if isinstance(message, Exception):
            faults.append(message)

    async with (
        stdio_client(params, errlog=errlog) as (read, write),
        ClientSession(read, write, read_timeout_seconds=60, message_handler=on_message) as session,
    ):
        await session.initialize()
        yield Mcp(session, faults)
    assert faults == [], "stdout carried something that is not MCP"


async def eventually(check: Callable[[], object], seconds: float, what: str) -> None:
    """tests.support.wait_until off the event loop (the MCP session keeps running)."""
    await anyio.to_thread.run_sync(lambda: wait_until(check, seconds, what))


def events_of(stack: Stack, agent_id: str) -> list[tuple[Any, ...]]:
    return stack.rows(
        "SELECT seq, event_id, type, body FROM events FINAL WHERE agent_id = {a:String}"
        " ORDER BY seq",
        a=agent_id,
    )


async def test_lists_the_memory_tools_with_their_arguments(stack: Stack, errlog: TextIO) -> None:
    async with engram_mcp(stack.env, errlog) as mcp:
        listed = (await mcp.session.list_tools()).tools
    assert {tool.name for tool in listed} == set(TOOLS)
    for tool in listed:
        schema = tool.input_schema
        assert set(schema["required"]) == TOOLS[tool.name], tool.name
        assert tool.description and len(tool.description) > 100, tool.name
        assert all(p.get("description") for p in schema["properties"].values()), tool.name
        assert tool.output_schema is not None, tool.name
    recall = next(t for t in listed if t.name == "memory_recall").input_schema["properties"]
    assert set(recall) == {"query", "agent_id", "user_id", "k", "layers", "min_importance"}
    snapshot = next(t for t in listed if t.name == "memory_snapshot").input_schema["properties"]
    assert set(snapshot) == {"agent_id", "user_id", "session_id", "as_of"}


async def test_published_turns_are_in_the_snapshot(stack: Stack, errlog: TextIO) -> None:
    agent_id, given_id = agent(), str(uuid.uuid4())
    contents = ["我想四月去京都", "Kyoto in April: cherry blossoms.", "Book a ryokan."]
    events = [
        {"type": "session.started", "agent_id": agent_id, "session_id": "s1",
         "body": {"task": "plan a trip"}},
        turn(agent_id, "user", contents[0]),
        turn(agent_id, "assistant", contents[1]),
        {**turn(agent_id, "user", contents[2]), "event_id": given_id,
         "occurred_at": None},
    ]  # fmt: skip
    env = {**stack.env, "ENGRAM_LOG_LEVEL": "DEBUG"}  # logs galore, all on stderr
    async with engram_mcp(env, errlog) as mcp:
        published = await mcp.data("memory_publish", events=events)
        assert published["accepted"] == 4
        ids = published["event_ids"]
        assert len(set(ids)) == 4 and ids[3] == given_id
        assert all(uuid.UUID(i) for i in ids)
        await eventually(lambda: len(events_of(stack, agent_id)) == 4, 30, "4 events archived")
        assert [str(r[1]) for r in events_of(stack, agent_id)] == ids, "in order, ids kept"

        snapshot = await mcp.data("memory_snapshot", agent_id=agent_id)
        narrowed = await mcp.data("memory_snapshot", agent_id=agent_id, session_id="s1")
    assert snapshot["agent_id"] == agent_id and snapshot["position"]["seq"] == 3
    (session,) = snapshot["working"]
    assert session["session_id"] == "s1" and session["task"] == "plan a trip"
    assert [t["content"] for t in session["turns"]] == contents
    assert [t["event_id"] for t in session["turns"]] == ids[1:]
    assert narrowed["working"] == snapshot["working"]
    errlog.seek(0)
    assert "engram.mcp" in errlog.read(), "its logs went to stderr"


async def test_an_invalid_event_fails_the_call_and_publishes_nothing(
    stack: Stack, errlog: TextIO
) -> None:
    agent_id = agent()
    valid = turn(agent_id, "user", "this must not be published")
    async with engram_mcp(stack.env, errlog) as mcp:
        bad_role = await mcp.call("memory_publish", events=[valid, turn(agent_id, "robot", "hi")])
        derived = await mcp.call(
            "memory_publish", events=[valid, {**valid, "type": "memory.created"}]
        )
        not_json_time = await mcp.call(
            "memory_publish", events=[{**valid, "occurred_at": "yesterday"}]
        )
        unknown = await mcp.call("memory_snapshot", agent_id=f"never-{agent_id}")
        marker = await mcp.data("memory_publish", events=[turn(agent_id, "user", "marker")])
    assert bad_role.is_error and "event 1" in text(bad_role) and "role" in text(bad_role)
    assert derived.is_error and "memory.created" in text(derived) and "event 1" in text(derived)
    assert not_json_time.is_error and "occurred_at" in text(not_json_time)
    assert unknown.is_error and "no events of agent" in text(unknown)
    # one agent's events keep their order: once the marker is archived, anything
    # published before it would be too
    await eventually(lambda: events_of(stack, agent_id), 30, "the marker archived")
    ((_, event_id, _, body),) = events_of(stack, agent_id)
    assert str(event_id) == marker["event_ids"][0] and json.loads(body)["content"] == "marker"


async def test_recall_finds_a_memory_of_an_important_turn(stack: Stack, errlog: TextIO) -> None:
    """Recall (embeddings + vector store) end to end: a turn of importance 9 becomes
    a memory at once; recall finds it for its agent only, and feedback records."""
    agent_id, other = agent(), agent()
    events = [
        turn(agent_id, "user", ALLERGY, importance=9),
        turn(agent_id, "assistant", "Noted, no peanuts."),
        turn(other, "user", "I like hiking."),
    ]
    query = "What food is the user allergic to?"
    async with engram_mcp(stack.env, errlog) as mcp:
        published = await mcp.data("memory_publish", events=events)
        expected = memory_id_of("turn", agent_id, published["event_ids"][0])

        found: list[dict[str, Any]] = []
        with anyio.fail_after(40):
            while not found:
                answer = await mcp.data("memory_recall", query=query, agent_id=agent_id, k=5)
                found = [m for m in answer["memories"] if m["memory_id"] == expected]
                await anyio.sleep(0.5)
        scoped = await mcp.data(
            "memory_recall", query=query, agent_id=agent_id, user_id="u1", layers=["L2", "L3"]
        )
        elsewhere = await mcp.data("memory_recall", query=query, agent_id=other)
        feedback = await mcp.data(
            "memory_feedback", memory_id=expected, useful=True, agent_id=agent_id
        )
    assert answer["agent_id"] == agent_id and answer["query"] == query
    (memory,) = found
    assert memory["text"] == ALLERGY and memory["importance"] == 9
    assert memory["layer"] in ("L2", "L3") and memory["sources"] == [published["event_ids"][0]]
    assert 0 < memory["retention"] <= 1 and memory["score"] > 0
    assert answer["memories"][0]["memory_id"] == expected, "the allergy ranks first"
    assert expected in [m["memory_id"] for m in scoped["memories"]]
    assert expected not in [m["memory_id"] for m in elsewhere["memories"]], "agents are apart"
    feedback_id = feedback["event_id"]
    await eventually(
        lambda: feedback_id in [str(r[1]) for r in events_of(stack, agent_id)],
        30,
        "the feedback archived",
    )


def test_without_engram_up_it_exits_with_a_clear_message(tmp_path: Path) -> None:
    missing, stale = tmp_path / "missing", tmp_path / "stale"
    stale.mkdir()
    dead = {"http": f"http://127.0.0.1:{free_port()}", "kafka_bootstrap": "127.0.0.1:1"}
    (stale / "up.json").write_text(json.dumps(dead))  # left behind by a killed engram up
    runs = [mcp_alone(home) for home in (missing, stale)]  # both at once: startup is slow
    outputs = [run.communicate(timeout=60) for run in runs]
    said = [  # (exit code, stdout, stderr), with the CLI's line wrapping undone
        (run.returncode, " ".join(out.split()), " ".join(err.split()))
        for run, (out, err) in zip(runs, outputs, strict=True)
    ]
    assert said[0][:2] == (1, "") and "engram is not running" in said[0][2]
    assert "Start it with `engram up`" in said[0][2]
    assert said[1][:2] == (1, "") and f"does not answer at {dead['http']}" in said[1][2]


def mcp_alone(home: Path) -> subprocess.Popen[str]:
    """``engram mcp`` with ``home`` as ENGRAM_HOME and nothing else of engram's."""
    return subprocess.Popen(
        [sys.executable, "-m", "engram", "mcp"],
        env={"PATH": "/usr/bin:/bin", "ENGRAM_HOME": str(home)},
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_no_tool_reaches_another_agents_or_users_memory(stack: Stack, errlog: TextIO) -> None:
    """Isolation through the MCP surface: another agent's snapshot and recall hold
    nothing of this agent's; another user of the same agent does not recall it; and
    feedback naming this agent's memory from another agent changes nothing here."""
    agent_id, other = agent(), agent()
    secret = "My locker code is ORCHID-4471, keep it safe"
    events = [turn(agent_id, "user", secret, importance=9), turn(other, "user", "I like tea.")]
    async with engram_mcp(stack.env, errlog) as mcp:
        published = await mcp.data("memory_publish", events=events)
        mine = memory_id_of("turn", agent_id, published["event_ids"][0])
        found: list[str] = []
        with anyio.fail_after(40):
            while mine not in found:
                answer = await mcp.data("memory_recall", query=secret, agent_id=agent_id)
                found = [m["memory_id"] for m in answer["memories"]]
                await anyio.sleep(0.5)
        elsewhere = await mcp.data("memory_recall", query=secret, agent_id=other, k=50)
        snapshot = await mcp.data("memory_snapshot", agent_id=other)
        other_user = await mcp.data("memory_recall", query=secret, agent_id=agent_id, user_id="u2")
        foreign = await mcp.data("memory_feedback", memory_id=mine, useful=True, agent_id=other)
        await eventually(
            lambda: foreign["event_id"] in [str(r[1]) for r in events_of(stack, other)],
            30,
            "the foreign feedback archived",
        )
    assert mine not in [m["memory_id"] for m in elsewhere["memories"]]
    assert "ORCHID-4471" not in json.dumps(elsewhere["memories"]) + json.dumps(snapshot)
    assert mine not in [m["memory_id"] for m in other_user["memories"]], "users are apart"
    touched = stack.scalar(
        "SELECT count() FROM memory_changes FINAL WHERE memory_id = {m:String}"
        " AND (agent_id = {o:String} OR source_event_id = {f:UUID})",
        m=mine,
        o=other,
        f=foreign["event_id"],
    )
    assert touched == 0, "another agent's feedback never touches this agent's memory"
