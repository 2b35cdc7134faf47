"""Time-travel benchmark: an agent's snapshot as of T by both roads.

One agent with ``--events`` events (default 10,000) of a bilingual multi-week
history (:func:`history_of`: sessions, tool calls, facts, persona updates, recalls,
feedback, clock ticks, flashbulb turns) is published to a fresh ``engram up``; once
it is folded, snapshots as of ``--samples`` random moments are taken

* by SQL over the history (:func:`engram.history.history_snapshot`, road 2), and
* by replay of the archived log (:func:`engram.snapshot.take_snapshot`, road 1,
  opening sealed events with the stack's keys as ``engram replay`` does; it starts
  from the last checkpoint kept by position before T's cut),

both through the same ClickHouse client as a reader would use (``engram up``'s
ClickHouse-compatible HTTP endpoint), then through ``engram up``'s own API
(``GET /v1/history``, ``GET /v1/snapshot?as_of=``, which read chdb in-process). The
reference in the same run is a plain ``SELECT count() FROM events`` on the reader's
client. The two roads' answers are checked against each other before they are timed.
Timing starts once the stack has settled (every new memory embedded, so the worker's
embedding and vector agents are idle) unless ``--no-settle``: a snapshot is then
measured alone, not against the tail of the ingest. Each timed call starts after a
garbage collection of this process (:func:`_timed`).

Run: ``python -m ops.bench.timetravel [--events 10000] [--samples 30]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import httpx

from engram.events import make_event
from processors.episodes import memory_id_of
from schemas import Event

START = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
"""The first day of a generated history (a past Monday: a snapshot as of T must
not be in the future)."""

USERS = {"tom": "en", "mei": "zh"}
EN = [
    "I want to visit Kyoto in April for the cherry blossoms.",
    "Can you book the dentist for Tuesday morning?",
    "The quarterly report is due on Friday.",
    "Please remind me to call my sister tonight.",
    "I started learning the cello last month.",
    "Our landlord is raising the rent in March.",
    "Let's plan a weekend hike near the lake.",
    "The new project uses Kafka and ClickHouse.",
]
ZH = [
    "我对花生过敏，一定要记住！",
    "请把季度报告发给张经理。",
    "下周三我要去上海出差。",
    "今天天气不错，我们去公园散步吧。",
    "我女儿下个月开始学钢琴。",
    "帮我订一张去北京的高铁票。",
    "我最近在准备半程马拉松。",
    "房东说三月份要涨房租。",
]
REPLIES_EN = ["Noted.", "Sure, I will do that.", "Done, anything else?", "Got it, thanks."]
REPLIES_ZH = ["好的，记住了。", "没问题，马上办。", "已经完成了。", "明白，谢谢。"]
FLASHBULB = {
    "en": "My father passed away last week.",
    "zh": "我昨天被公司裁员了，非常难过。",
}
FACT_KEYS = [("profile", "diet"), ("profile", "city"), ("work", "manager"), ("偏好", "饮料")]
FACT_VALUES = ["vegetarian", "vegan", "Berlin", "上海", "张经理", "Dr. Lee", "绿茶", "oat milk"]


@dataclass
class Script:
    """A generated history of one agent, in log order with non-decreasing times."""

    agent_id: str
    rng: random.Random
    heavy: bool = True
    at: datetime = START
    events: list[Event] = field(default_factory=list)
    memory_ids: list[str] = field(default_factory=list)

    def add(
        self,
        kind: str,
        body: dict[str, Any],
        *,
        session: str | None = None,
        user: str | None = None,
        gap_s: float = 0.0,
    ) -> Event:
        self.at += timedelta(milliseconds=int(gap_s * 1000))
        event = make_event(
            kind,
            agent_id=self.agent_id,
            session_id=session,
            user_id=user,
            occurred_at=self.at,
            body=body,
            event_id=uuid.UUID(int=self.rng.getrandbits(128), version=4),
        )
        self.events.append(event)
        return event


def history_of(
    agent_id: str, *, days: int, seed: int, sessions_per_day: int = 3, heavy: bool = True
) -> list[Event]:
    """A seeded, bilingual history of ``agent_id`` over ``days`` days. ``heavy``: one
    turn in eight is a long text (working memory compresses it) and a third of the
    tool results are large (offloaded); else one in fifty and none."""
    script = Script(agent_id, random.Random(seed), heavy=heavy)
    rng = script.rng
    script.add("persona.updated", {"name": "Kiko", "style": "warm", "preferences": {"lang": "en"}})
    for day in range(days):
        script.at = max(script.at, START + timedelta(days=day))
        for n in range(rng.randint(1, sessions_per_day)):
            _session(script, f"d{day}-s{n}")
            script.add("clock.tick", {"partition": 0, "interval_s": 3600.0}, gap_s=3600)
        _long_term(script)
        script.add(
            "clock.tick", {"partition": 0, "interval_s": 43_200.0}, gap_s=rng.uniform(1, 8) * 3600
        )
    return script.events


def _session(script: Script, session: str) -> None:
    rng = script.rng
    user = rng.choice(list(USERS))
    lang = USERS[user]
    said, replies = (EN, REPLIES_EN) if lang == "en" else (ZH, REPLIES_ZH)
    script.add("session.started", {"task": rng.choice(said)}, session=session, user=user, gap_s=60)
    turns = rng.randint(2, 24)  # more than 20 turns: an episode cut by the turn count
    for i in range(turns):
        scores: dict[str, Any] = {}
        content = rng.choice(said) if i % 2 == 0 else rng.choice(replies)
        roll = rng.random()
        if roll < 0.03:
            content, scores = FLASHBULB[lang], {"importance": 9.5, "sentiment": -0.9}
        elif roll < 0.08:
            scores = {"importance": 8.5}  # a single important turn: an L2 memory at once
        elif roll < (0.2 if script.heavy else 0.1):
            content = " ".join([content] * rng.randint(30, 90))  # tokens: compression
        gap = rng.choice([5, 30, 90, 600]) if rng.random() > 0.05 else 2400  # an idle cut
        event = script.add(
            "interaction.recorded",
            {"role": "user" if i % 2 == 0 else "assistant", "content": content, **scores},
            session=session,
            user=user,
            gap_s=gap,
        )
        if i == 0 or scores:
            key = "episode" if i == 0 else "turn"
            script.memory_ids.append(memory_id_of(key, event.agent_id, str(event.event_id)))
        if rng.random() < 0.1:
            call = f"c{len(script.events)}"
            tool = rng.choice(["calendar", "search", "weather"])
            script.add(
                "tool.called",
                {"call_id": call, "tool": tool, "arguments": '{"q": "x"}'},
                session=session,
                user=user,
                gap_s=1,
            )
            big = script.heavy and rng.random() < 0.3
            script.add(
                "tool.result",
                {
                    "call_id": call,
                    "tool": tool,
                    "ok": rng.random() < 0.8,
                    "content": ("result line. " * 300) if big else "ok",
                },
                session=session,
                user=user,
                gap_s=2,
            )
        if rng.random() < 0.05:
            script.add(
                "working.set",
                {"variables": {"city": rng.choice(FACT_VALUES)}, "scratchpad": "notes"},
                session=session,
                user=user,
                gap_s=1,
            )
    if rng.random() < 0.8:  # else the session stays open until the idle TTL at a tick
        script.add("session.ended", {"reason": "done"}, session=session, user=user, gap_s=30)


def _long_term(script: Script) -> None:
    rng = script.rng
    user = rng.choice(list(USERS))
    if rng.random() < 0.6:
        namespace, key = rng.choice(FACT_KEYS)
        body: dict[str, Any] = {"namespace": namespace, "key": key}
        if rng.random() < 0.25:
            script.add("fact.retracted", body, user=user, gap_s=60)
        else:
            value = rng.choice(FACT_VALUES)
            script.add("fact.asserted", {**body, "value": value}, user=user, gap_s=60)
    if rng.random() < 0.2:
        style = rng.choice(["warm", "concise", "playful", "简洁"])
        prefs = {"lang": rng.choice(["en", "zh"])}
        script.add("persona.updated", {"style": style, "preferences": prefs}, gap_s=60)
    known = script.memory_ids[-40:]
    if known and rng.random() < 0.7:
        chosen = rng.sample(known, min(len(known), rng.randint(1, 4)))
        script.add(
            "memory.recalled",
            {
                "query": "what did we talk about?",
                "memory_ids": chosen,
                "scores": [0.5] * len(chosen),
            },
            user=user,
            gap_s=60,
        )
    if known and rng.random() < 0.4:
        useful = rng.random() < 0.6
        body = {"memory_id": rng.choice(known), "useful": useful}
        if not useful:
            body["correction"] = "that is wrong"
        script.add("feedback.given", body, user=user, gap_s=60)


def moments(events: list[Event], count: int, seed: int) -> list[datetime]:
    """``count`` random moments within the history (ms precision), plus both ends and
    some exact event times (ties at T are included by both roads)."""
    rng = random.Random(seed)
    first, last = events[0].occurred_at, events[-1].occurred_at
    span = int((last - first).total_seconds() * 1000)
    chosen = {first, last}
    chosen |= {rng.choice(events).occurred_at for _ in range(count // 4)}
    while len(chosen) < count:
        chosen.add(first + timedelta(milliseconds=rng.randint(0, span)))
    return sorted(chosen)


def comparable(snapshot: Any) -> dict[str, Any]:
    """A snapshot's parts both roads answer: everything but how it was made, the
    texts (the fold keeps none) and a fact's confidence (``fact.set`` drops it)."""
    data: dict[str, Any] = snapshot.model_dump(mode="json", exclude={"road"})
    data["position"].pop("skipped", None)
    for item in data["memory_items"]:
        item.pop("text", None)
    for fact in data["facts"]:
        fact.pop("confidence", None)
    return data


# -- the benchmark ---------------------------------------------------------------------


def _timed(fn: Callable[[], Any], runs: int) -> list[float]:
    """Wall time of each of ``runs`` calls of ``fn``, in ms. Each call starts after a
    full garbage collection (not timed), so it pays for its own garbage and not for the
    previous call's: this process holds a large heap (the generated history, road 1's
    replays), and a collection of it took 150-260 ms inside road 2's calls."""
    out = []
    for _ in range(runs):
        gc.collect()
        began = time.perf_counter()
        fn()
        out.append((time.perf_counter() - began) * 1000)
    return out


def _summary(name: str, ms: list[float]) -> str:
    ordered = sorted(ms)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"{name:<28} p50 {statistics.median(ordered):8.1f} ms   p95 {p95:8.1f} ms   n={len(ms)}"


def _sized(agent_id: str, target: int, seed: int, heavy: bool) -> list[Event]:
    days = 30
    while True:
        events = history_of(agent_id, days=days, seed=seed, heavy=heavy)
        if len(events) >= target:
            return events[:target]
        days = int(days * target / len(events)) + 5


def main(argv: list[str] | None = None) -> None:
    from engram.client import Memory
    from engram.history import history_snapshot, http_client
    from engram.settings import Settings
    from engram.snapshot import take_snapshot
    from engram.transfer import archive_opener
    from ops.bench.common import machine, start_stack, wait_embedded
    from sinks.clickhouse import ClickHouseHistory

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--light", action="store_true", help="fewer long turns, no large tool results"
    )
    parser.add_argument(
        "--no-settle", action="store_true", help="time at once, while the worker still embeds"
    )
    args = parser.parse_args(argv)

    agent_id = f"bench-tt-{uuid.uuid4().hex[:8]}"
    events = _sized(agent_id, args.events, args.seed, heavy=not args.light)
    print(f"machine: {machine()}")
    mix = "light" if args.light else "heavy"
    span = f"{events[0].occurred_at:%Y-%m-%d} .. {events[-1].occurred_at:%Y-%m-%d}"
    print(f"agent {agent_id}: {len(events)} events ({mix} mix), {span}")
    stack = start_stack(ENGRAM_TICK_INTERVAL_S="0")
    try:
        began = time.perf_counter()
        with Memory(bootstrap=stack.up["kafka_bootstrap"]) as memory:
            memory.publish_many(events)
        query = f"SELECT count() FROM events FINAL WHERE agent_id = '{agent_id}'"
        while stack.count(query) < len(events):
            time.sleep(0.5)
        print(f"published and folded in {time.perf_counter() - began:.1f} s")
        if not args.no_settle:
            settled = wait_embedded(stack.up["kafka_bootstrap"])
            print(f"settled (every memory embedded) {settled:.1f} s later")
        client = http_client(stack.up["http"])
        history = ClickHouseHistory(client)
        samples = moments(events, args.samples, args.seed)
        settings = Settings.from_env({"ENGRAM_HOME": str(stack.home)})
        with archive_opener(settings) as open_event:  # as `engram replay`: sealed events open
            road1 = partial(take_snapshot, history, agent_id, open_event=open_event)
            for moment in _spread(samples, 5):  # the roads agree before they are timed
                one = road1(as_of=moment)
                two = history_snapshot(client, agent_id, as_of=moment)
                if comparable(one) != comparable(two):
                    raise SystemExit(f"the roads disagree as of {moment.isoformat()}")
            parts = _parts(client)
            reference = _timed(lambda: client.query("SELECT count() FROM events"), len(samples))
            sql: list[float] = []
            replay: list[float] = []
            api_sql: list[float] = []
            api_replay: list[float] = []
            api = httpx.Client(base_url=stack.up["http"], timeout=120)
            for moment in samples:
                sql += _timed(partial(history_snapshot, client, agent_id, as_of=moment), 1)
                replay += _timed(partial(road1, as_of=moment), 1)
                params = {"agent_id": agent_id, "as_of": moment.isoformat()}
                api_sql += _timed(partial(_get, api, "/v1/history", params), 1)
                api_replay += _timed(partial(_get, api, "/v1/snapshot", params), 1)
            api.close()
        kept = stack.count(f"SELECT count() FROM agent_checkpoints WHERE agent_id = '{agent_id}'")
        print(f"checkpoints kept by position: {kept}")
        print(f"data parts when timing began: {parts}")
        print(f"load average before timing: {os.getloadavg()[0]:.2f} (1 min)")
        print(_summary("reference: count() events", reference))
        print("through the ClickHouse endpoint of engram up (a reader's client):")
        print(_summary("  road 2: SQL as of T", sql))
        print(_summary("  road 1: replay up to T", replay))
        print("through engram up's API (in-process chdb):")
        print(_summary("  GET /v1/history (SQL)", api_sql))
        print(_summary("  GET /v1/snapshot (replay)", api_replay))
        client.close()
    finally:
        stack.stop()


def _parts(client: Any) -> str:
    """How many active data parts ``events`` and ``memory_changes`` have (a read of one
    agent costs chdb a fixed amount per part it opens)."""
    rows = client.query(
        "SELECT table, count() FROM system.parts WHERE active AND database = currentDatabase()"
        " AND table IN ('events', 'memory_changes') GROUP BY table ORDER BY table"
    ).result_rows
    return ", ".join(f"{table} {count}" for table, count in rows)


def _get(api: httpx.Client, path: str, params: dict[str, str]) -> None:
    api.get(path, params=params).raise_for_status()


def _spread(items: list[datetime], count: int) -> Iterator[datetime]:
    step = max(1, len(items) // count)
    yield from items[::step]


if __name__ == "__main__":
    main()
