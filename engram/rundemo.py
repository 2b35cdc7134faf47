"""Run the demo against the embedded stack: start ``engram up`` unless it is
running, publish the demo events, wait until ClickHouse holds every one of them
and their working-memory changes, print a table per agent."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.table import Table

from engram.client import Memory
from engram.demo import demo_events
from engram.errors import EngramError
from engram.history import http_client
from engram.settings import Settings
from ops.launch import LaunchError, answering, launch, stop


@contextmanager
def running_stack(settings: Settings, console: Console, timeout: float) -> Iterator[dict[str, Any]]:
    """Use the running stack, or start ``engram up`` for the duration of the block."""
    up = answering(settings.up_file)
    if up is not None:
        yield up
        return
    console.print(f"starting the embedded stack (log: {settings.home / 'up.log'})")
    try:
        process, up = launch(settings.home, os.environ, timeout)
    except LaunchError as error:
        raise EngramError(str(error)) from None
    try:
        yield up
    finally:
        stop(process)


def wait_for_history(url: str, ids: list[str], timeout: float) -> None:
    """Block until every event and its working-memory change are in ClickHouse."""
    client = http_client(url)
    wanted = len(ids)
    query = (
        "SELECT (SELECT count() FROM events FINAL WHERE event_id IN {ids:Array(UUID)}),"
        " (SELECT uniqExact(source_event_id) FROM memory_changes"
        " WHERE source_event_id IN {ids:Array(UUID)})"
    )
    deadline = time.monotonic() + timeout
    try:
        while True:
            events, changes = client.query(query, parameters={"ids": ids}).result_rows[0]
            if events >= wanted and changes >= wanted:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"after {timeout:.0f}s ClickHouse holds {events}/{wanted} demo events and "
                    f"{changes}/{wanted} memory changes"
                )
            time.sleep(0.2)
    finally:
        client.close()


SUMMARY = """
SELECT e.agent_id, e.events, e.sessions, e.users, w.last_turns
FROM (
    SELECT agent_id, count() AS events, uniqExact(session_id) AS sessions,
           groupUniqArray(user_id) AS users
    FROM events FINAL GROUP BY agent_id
) AS e
LEFT JOIN (
    SELECT agent_id,
           arrayStringConcat(arrayMap(x -> x.2,
               arrayReverse(arraySlice(arrayReverseSort(x -> x.1, groupArray((seq, line))), 1, 2))
           ), '\n') AS last_turns
    FROM (
        SELECT agent_id, seq,
               concat(JSONExtractString(turn, 'role'), ': ', JSONExtractString(turn, 'content'))
                   AS line
        FROM memory_changes FINAL
        ARRAY JOIN JSONExtractArrayRaw(body, 'added') AS turn
        WHERE type = 'working.updated'
    )
    GROUP BY agent_id
) AS w USING agent_id
ORDER BY e.agent_id
"""


def summary_table(url: str) -> Table:
    client = http_client(url)
    try:
        rows = client.query(SUMMARY).result_rows
    finally:
        client.close()
    table = Table(title="engram demo: what ClickHouse holds per agent")
    for column in ("agent", "events", "sessions", "users", "last turns in working memory"):
        table.add_column(column)
    for agent, events, sessions, users, turns in rows:
        table.add_row(agent, str(events), str(sessions), ", ".join(users), turns or "")
    return table


def run_demo(settings: Settings, console: Console, *, timeout: float) -> None:
    """The README's main job; raises on any failure, returns after printing the table."""
    events = demo_events()
    with running_stack(settings, console, timeout) as up:
        console.print(f"publishing {len(events)} events of 3 agents to {up['kafka_bootstrap']}")
        started = time.monotonic()
        with Memory(bootstrap=up["kafka_bootstrap"], settings=settings) as memory:
            memory.publish_many(events)
        wait_for_history(up["http"], [str(e.event_id) for e in events], timeout)
        elapsed = time.monotonic() - started
        console.print(f"all {len(events)} events are in ClickHouse ({elapsed:.1f}s after publish)")
        console.print(summary_table(up["http"]))
        with Memory(http=up["http"], settings=settings) as memory:
            console.print(recall_table(memory, timeout))


RECALLS = (
    ("travel-agent", "what does the traveller eat?"),
    ("travel-agent", "她什么时候飞日本？"),
    ("assistant-zh", "what should be served at the meeting instead of coffee?"),
    ("coding-agent", "why did the payment test fail?"),
)
"""Demo questions, some across languages: each agent's memory answers its own."""


def recall_table(memory: Memory, timeout: float) -> Table:
    """Recall each demo question (waiting until the agent's memories are embedded). The
    demo peeks (``record=False``): running it twice still adds nothing to the log."""
    table = Table(title="engram demo: recall (hybrid, retention weighted)")
    for column in ("agent", "question", "best memory", "score", "R"):
        table.add_column(column)
    for agent, question in RECALLS:
        deadline = time.monotonic() + timeout
        found = memory.recall(question, agent_id=agent, k=1, record=False).memories
        while not found and time.monotonic() < deadline:
            time.sleep(0.3)
            found = memory.recall(question, agent_id=agent, k=1, record=False).memories
        if not found:
            raise TimeoutError(f"after {timeout:.0f}s {agent} has no recallable memory")
        best = found[0]
        table.add_row(agent, question, best.text, f"{best.score:.3f}", f"{best.retention:.2f}")
    return table
