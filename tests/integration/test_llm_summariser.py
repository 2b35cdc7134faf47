"""The optional LLM summariser of episodes, end to end: a real ``engram up`` asks a
real (fake, deterministic) OpenAI-compatible server over HTTP, records the answer
as the ``episode.closed`` event, keeps the extractive summary when the model fails,
and never asks again about an episode it answered, even when a restart re-folds
the whole log from the archive.

The stack runs on its own embedded broker, not the session one: it must not share
``engram.events`` and ``engram.memory`` with the session stack (its worker would
fold and summarise that stack's events and publish their memories again), and a
restart must find an empty broker to restore the log from the archive.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from engram import Memory, make_event
from ops.http import HttpThread
from ops.net import free_port
from processors import MemoryConfig
from schemas import Event
from tests.support import Stack, engram_cmd, start_stack, wait_until

pytestmark = pytest.mark.integration
AGENT = "llm-agent"
MODEL = "fake-model"
TIMEOUT_S = 2
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
_clock = itertools.count()


class FakeLlm:
    """An OpenAI-compatible ``/v1/chat/completions``: answers ``LLM summary: `` and
    the first line of the user message; ``mode`` makes it fail (500), hang (longer
    than the stack's timeout) or answer garbage (200 with nothing in it)."""

    def __init__(self) -> None:
        self.url = ""
        self.mode = "ok"
        self.calls: list[dict[str, Any]] = []
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self.complete)

    async def complete(self, request: Request) -> Response:
        payload = await request.json()
        self.calls.append({**payload, "authorization": request.headers.get("authorization")})
        if self.mode == "fail":
            return PlainTextResponse("overloaded", status_code=500)
        if self.mode == "hang":
            await asyncio.sleep(TIMEOUT_S * 3)
        if self.mode == "garbage":
            return JSONResponse({"choices": [{"message": {"content": " \n "}}]})
        first = payload["messages"][-1]["content"].splitlines()[0]
        answer = {"role": "assistant", "content": f"  LLM summary:\n {first}  "}
        return JSONResponse({"choices": [{"index": 0, "message": answer}]})

    def asked_about(self, first_line: str) -> int:
        return sum(c["messages"][-1]["content"].startswith(first_line) for c in self.calls)


@pytest.fixture(scope="module")
def llm() -> Iterator[FakeLlm]:
    fake = FakeLlm()
    server = HttpThread(fake.app, "127.0.0.1", free_port())
    fake.url = server.start() + "/v1"
    yield fake
    fake.mode = "ok"
    server.stop()


def stack_env(llm: FakeLlm) -> dict[str, str]:
    return {
        "ENGRAM_LLM_URL": llm.url,
        "ENGRAM_LLM_MODEL": MODEL,
        "ENGRAM_LLM_API_KEY": "test-key",
        "ENGRAM_LLM_TIMEOUT_S": str(TIMEOUT_S),
        "ENGRAM_PARTITIONS": "2",
    }


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("llm-home")


@pytest.fixture(scope="module")
def first(home: Path, llm: FakeLlm) -> Iterator[Stack]:
    """``engram up`` with its own embedded broker and the LLM summariser on."""
    stack = start_stack(home, 90.0, **stack_env(llm))
    yield stack
    stack.stop()


def session(name: str, lines: list[str]) -> list[Event]:
    """``lines`` as alternating user / assistant turns of session ``name``, then its end."""
    turns = [
        make_event(
            "interaction.recorded",
            agent_id=AGENT,
            session_id=name,
            user_id="alice",
            occurred_at=T0 + timedelta(seconds=next(_clock)),
            body={"role": "user" if i % 2 == 0 else "assistant", "content": line},
        )
        for i, line in enumerate(lines)
    ]
    end = make_event(
        "session.ended",
        agent_id=AGENT,
        session_id=name,
        user_id="alice",
        occurred_at=T0 + timedelta(seconds=next(_clock)),
    )
    return [*turns, end]


def publish(stack: Stack, events: list[Event]) -> None:
    with Memory(bootstrap=stack.bootstrap) as memory:
        memory.publish_many(events)


def episode(stack: Stack, session_id: str) -> tuple[str, str, str] | None:
    rows = stack.rows(
        "SELECT episode_id, summary, summariser FROM episodes"
        " WHERE agent_id = {a:String} AND session_id = {s:String}",
        a=AGENT,
        s=session_id,
    )
    return rows[0] if rows else None


def closed(stack: Stack, session_id: str) -> tuple[str, str, str]:
    return wait_until(lambda: episode(stack, session_id), 60, f"the episode of {session_id}")


def memory_text(stack: Stack, episode_id: str) -> tuple[str, str]:
    rows = stack.rows(
        "SELECT kind, text FROM memories WHERE agent_id = {a:String} AND memory_id = {m:String}",
        a=AGENT,
        m=episode_id,
    )
    assert len(rows) == 1, rows
    return rows[0]


def all_episodes(stack: Stack) -> dict[str, tuple[str, str]]:
    rows = stack.rows(
        "SELECT session_id, summary, summariser FROM episodes WHERE agent_id = {a:String}",
        a=AGENT,
    )
    return {sid: (summary, by) for sid, summary, by in rows}


def test_an_episode_is_summarised_by_the_llm_and_recorded(first: Stack, llm: FakeLlm) -> None:
    publish(first, session("trip", ["I want to visit Kyoto in April.", "Cherry blossoms!", "Yes"]))
    episode_id, summary, summariser = closed(first, "trip")
    assert (summary, summariser) == (
        "LLM summary: user: I want to visit Kyoto in April.",
        "llm:" + MODEL,
    )
    assert memory_text(first, episode_id) == ("episode", summary)
    [call] = [c for c in llm.calls if "Kyoto" in c["messages"][-1]["content"]]
    assert call["model"] == MODEL and call["temperature"] == 0
    assert call["authorization"] == "Bearer test-key"
    assert call["messages"][0]["role"] == "system"
    assert call["messages"][-1]["content"].splitlines() == [
        "user: I want to visit Kyoto in April.",
        "assistant: Cherry blossoms!",
        "user: Yes",
    ]
    recorded = first.scalar(
        "SELECT JSONExtractString(body, 'summary') FROM memory_changes FINAL"
        " WHERE agent_id = {a:String} AND type = 'episode.closed'"
        " AND JSONExtractString(body, 'episode_id') = {e:String}",
        a=AGENT,
        e=episode_id,
    )
    assert recorded == summary


def test_turns_of_earlier_batches_come_from_the_archive(first: Stack, llm: FakeLlm) -> None:
    events = session("晚饭", ["我想订明天晚上的餐厅", "好的，几位？", "四位，不要辣"])
    publish(first, events[:-1])
    wait_until(
        lambda: (
            first.scalar(
                "SELECT count() FROM events FINAL"
                " WHERE agent_id = {a:String} AND session_id = {s:String}",
                a=AGENT,
                s="晚饭",
            )
            == 3
        ),
        60,
        "the turns in the archive",
    )
    publish(first, events[-1:])
    episode_id, summary, summariser = closed(first, "晚饭")
    assert (summary, summariser) == ("LLM summary: user: 我想订明天晚上的餐厅", "llm:" + MODEL)
    assert memory_text(first, episode_id) == ("episode", summary)
    [call] = [c for c in llm.calls if "餐厅" in c["messages"][-1]["content"]]
    assert call["messages"][-1]["content"].splitlines()[1:] == [
        "assistant: 好的，几位？",
        "user: 四位，不要辣",
    ]


@pytest.mark.parametrize("mode", ["fail", "hang", "garbage"])
def test_a_failing_llm_keeps_the_extractive_summary(first: Stack, llm: FakeLlm, mode: str) -> None:
    name = f"broken-{mode}"
    llm.mode = mode
    try:
        publish(first, session(name, [f"Plan the {mode} report.", "Sure, by Friday."]))
        episode_id, summary, summariser = closed(first, name)
    finally:
        llm.mode = "ok"
    assert summariser == "extractive-v1"
    assert "report" in summary and not summary.startswith("LLM summary")
    assert memory_text(first, episode_id) == ("episode", summary)
    assert llm.asked_about(f"user: Plan the {mode} report.") == 1
    assert f"{episode_id} failed, keeping the extractive one" in (first.home / "up.log").read_text()
    publish(first, session(f"after-{mode}", [f"And after the {mode}?", "All fine."]))
    _, later, by = closed(first, f"after-{mode}")
    assert (later, by) == (f"LLM summary: user: And after the {mode}?", "llm:" + MODEL)


def test_a_restart_reuses_the_recorded_summaries(first: Stack, llm: FakeLlm, home: Path) -> None:
    publish(first, session("kept", ["Remember my seat: 14A.", "Noted."]))
    kept_id, kept, _ = closed(first, "kept")
    before = all_episodes(first)
    answered = {sid for sid, (_, by) in before.items() if by.startswith("llm:")}
    assert "kept" in answered
    failed = set(before) - answered
    asked = {sid: llm.asked_about(first_line(first, sid)) for sid in before}
    assert first.stop() == 0

    second = start_stack(home, 90.0, **stack_env(llm))
    try:
        assert "restored" in (home / "up.log").read_text()
        marker = session("marker", ["One more thing."])
        publish(second, marker)
        closed(second, "marker")  # the agent's log before it is folded and flushed again
        after = all_episodes(second)
        for sid in answered:
            assert llm.asked_about(first_line(second, sid)) == asked[sid], f"{sid} asked again"
            assert after[sid] == before[sid]
        for sid in failed:  # no LLM answer was recorded: the re-fold asks again
            assert llm.asked_about(first_line(second, sid)) == asked[sid] + 1
            assert after[sid][1] == "llm:" + MODEL
        assert memory_text(second, kept_id) == ("episode", kept)
    finally:
        assert second.stop() == 0


def first_line(stack: Stack, session_id: str) -> str:
    rows = stack.rows(
        "SELECT role, content FROM (SELECT seq, JSONExtractString(body, 'role') AS role,"
        " JSONExtractString(body, 'content') AS content FROM events FINAL"
        " WHERE agent_id = {a:String} AND session_id = {s:String}"
        " AND type = 'interaction.recorded' ORDER BY seq LIMIT 1)",
        a=AGENT,
        s=session_id,
    )
    role, content = rows[0]
    return f"{role}: {content}"


def test_a_reprocess_keeps_the_summaries_of_the_same_turns(llm: FakeLlm, tmp_path: Path) -> None:
    """``engram reprocess`` to new forgetting parameters cuts the same episodes: the
    new derivation's episodes carry the LLM summaries recorded by the live one, and
    the model is not asked again (a reprocess used to fall back to the extractive
    summaries, and drop the old ones with the previous version)."""
    stack = start_stack(tmp_path / "home", 90.0, **stack_env(llm))
    try:
        publish(stack, session("again", ["My passport number ends in 42.", "Noted."]))
        episode_id, summary, summariser = closed(stack, "again")
        assert summariser == "llm:" + MODEL
        asked = llm.asked_about(first_line(stack, "again"))
        config = tmp_path / "threshold.json"
        config.write_text(json.dumps({"name": "lower", "forgetting": {"threshold": 0.1}}))
        done = subprocess.run(
            engram_cmd("reprocess", "--config", str(config)),
            env=stack.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr + done.stdout
        version = MemoryConfig.model_validate({"name": "lower", "forgetting": {"threshold": 0.1}})
        made_by = stack.rows(
            "SELECT config_version, JSONExtractString(body, 'summary') FROM memory_changes FINAL"
            " WHERE agent_id = {a:String} AND session_id = {s:String}"
            " AND type = 'episode.closed'",
            a=AGENT,
            s="again",
        )
        assert made_by == [(version.version, summary)]  # the new derivation's record
        assert episode(stack, "again") == (episode_id, summary, summariser)
        assert memory_text(stack, episode_id) == ("episode", summary)
        assert llm.asked_about(first_line(stack, "again")) == asked
    finally:
        assert stack.stop() == 0
