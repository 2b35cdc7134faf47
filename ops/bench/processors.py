"""Events folded per second through every processor, single-threaded and pure:
typed events in, derived events out, no I/O. Both forgetting curves are run on
the same events in the same run (exponential, the default, and FSRS).

Run: ``python -m ops.bench.processors --events 100000``.

The workloads are deterministic (seeded), so the fold's output can be pinned:
``--digest`` prints, per curve, a SHA-256 over every derived event (its
``model_dump_json()``, in order) and the final serialised state of every agent
(``AgentMemory.state().model_dump_json()``, by agent id), instead of rates. An
optimisation of the processors must leave the digests unchanged.

``--workload bench`` (the default) is the historical mix: mostly turns in
sessions of 12, session ends, facts, recalls and ticks. ``--workload rich``
walks every path of the fold: session starts with tasks, parallel sessions,
idle gaps of minutes, hours and days (episode cuts, TTL expiry, consolidation
windows, forgetting), long and offloaded texts (compression), tool calls and
results, recalls and feedback of memories that exist, persona updates, fact
assertions and retractions (some late), supplied scores, redelivered
duplicates; it also resumes agents from their serialised state on the way
(``restore_every``), as the pipeline does from its changelog.

Each curve is folded ``--repeat`` times (default 3), the curves alternated, each pass
on fresh memories; the figure is the median pass, every pass listed beside it (this
machine is shared: the same code folds at rates a third apart from one minute to the
next). The scorer's and summariser's memos of texts (bounded, the oldest out first)
carry over from pass to pass, as they do from batch to batch in a worker; a pass over
the rich workload's texts, which outnumber them, finds its first texts gone again.
The fold runs under the worker's garbage-collector policy
(:func:`ops.worker.tune_gc`: the automatic collector off, one full pass between
folds, where the worker makes one a minute); ``--gc auto`` leaves CPython's
automatic collector on, as a process that does not tune it runs.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import random
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import processors.memory
from processors import AgentMemory, AgentState, MemoryConfig
from processors.episodes import memory_id_of
from schemas import (
    ClockTicked,
    Event,
    FactAsserted,
    FactRetracted,
    FeedbackGiven,
    InteractionRecorded,
    MemoryRecalled,
    PersonaUpdated,
    SessionEnded,
    SessionStarted,
    SubjectErasureRequested,
    ToolCalled,
    ToolResult,
    WorkingSet,
)

TEXTS = (
    "I want to visit Kyoto in April for the cherry blossoms, please remember that.",
    "我对花生过敏，一定要记住！",
    "Sure, I'll look for a ryokan near Gion with vegetarian meals.",
    "今天天气不错，我们下午去散步吧。",
    "ok",
)
START = datetime(2026, 10, 1, tzinfo=UTC)


def _ids(seed: int) -> Callable[[], uuid.UUID]:
    """A seeded source of version-4 UUIDs: the same workload on every run."""
    rng = random.Random(seed)
    return lambda: uuid.UUID(int=rng.getrandbits(128), version=4)


def workload(n: int, agents: int, seed: int = 0) -> list[Event]:
    """A realistic mix: mostly turns in sessions of 12, session ends, facts, recalls, ticks."""
    new_id = _ids(seed)
    events: list[Event] = []
    for i in range(n):
        agent = f"agent-{i % agents}"
        at = START + timedelta(seconds=30 * (i // agents))
        common = {"event_id": new_id(), "agent_id": agent, "occurred_at": at, "user_id": "u"}
        session = f"s{i // (agents * 12)}"
        kind = i % 50
        if kind == 49:
            events.append(SessionEnded(**common, session_id=session))
        elif kind == 48:
            body = {"namespace": "p", "key": f"k{i % 7}", "value": str(i)}
            events.append(FactAsserted(**common, body=body))
        elif kind == 47:
            recalled = {"query": "kyoto", "memory_ids": ["x"], "scores": [0.5]}
            events.append(MemoryRecalled(**common, body=recalled))
        elif kind == 46:
            events.append(ClockTicked(**common, body={"partition": 0, "interval_s": 60.0}))
        else:
            body = {"role": "user" if i % 2 else "assistant", "content": TEXTS[i % len(TEXTS)]}
            events.append(InteractionRecorded(**common, session_id=session, body=body))
    return events


# -- the rich workload ------------------------------------------------------------------

SENTENCES_EN = (
    "I want to visit Kyoto in April for the cherry blossoms, please remember that.",
    "Sure, I'll look for a ryokan near Gion with vegetarian meals.",
    "My daughter Emma is allergic to peanuts, never forget it!",
    "The quarterly report is due on March 3rd, 2027 at 10:30am.",
    "I really hate waiting in long queues at the airport.",
    "Maybe we could try the new ramen place on 5th Avenue?",
    "Thanks, that was incredibly helpful and I'm very happy with it.",
    "I don't think that's a good idea, it's not what I asked for.",
    "Please send the invoice of $1,250.50 to accounts@example.com by Friday.",
    "We met Dr. Alice Chen at the New York conference on 2026-09-14.",
    "It’s not bad, but I’m not sure it’s worth the price.",
    "Remember my password hint is the name of my first dog, Rex.",
    "The meeting with Bob moved to 3 pm; it's urgent and important.",
    "Honestly the service was terrible and the food was awful.",
    "I guess it might rain tomorrow, so perhaps bring an umbrella.",
    "Our wedding anniversary is on June 12th, don't forget to book dinner.",
    "Definitely book the window seat, I absolutely love the view.",
    "He was diagnosed last week and is still in the hospital.",
    "Can you check #travel and ping @maria about the 45% discount?",
    "The build failed again with error 0x80004005 on v1.2.3.",
    "ok",
    "Yes.",
    "What time is it in Tokyo?",
    "ＦＵＬＬ－ＷＩＤＴＨ text and ﬁne ligatures should normalise too.",
)
SENTENCES_ZH = (
    "我对花生过敏，一定要记住！",
    "今天天气不错，我们下午去散步吧。",
    "我叫王小明，住在北京海淀区。",
    "下周三下午3点半要开会，千万别忘了。",
    "这家餐厅的服务太差了，我非常失望。",
    "谢谢你，真的帮了大忙，我很开心。",
    "我觉得可能会下雨，也许应该带伞。",
    "她的生日是6月1日，记住要准备礼物。",
    "这个方案不好，我不喜欢。",
    "《三体》这本书我特别喜欢，推荐给你。",
    "我们在上海见过张经理，他姓李吗？",
    "密码已经改了，新的记在笔记本里。",
    "好的",
    "明天见！",
)
TASKS = ("plan a trip", "write the report", "fix the build", None, "订机票")
TOOLS = ("search", "calendar", "sql", "weather")
PERSONA_FIELDS: tuple[dict[str, Any], ...] = (
    {"name": "Ada"},
    {"style": "concise"},
    {"description": "a travel assistant", "preferences": {"units": "metric"}},
    {"preferences": {"language": "zh", "units": ""}},
    {"preferences": {"tone": "warm"}},
    {"name": "Ada"},
    {},
)


def rich_text(rng: random.Random) -> str:
    """One to four sentences, English, Chinese or mixed; now and then a long one."""
    roll = rng.random()
    if roll < 0.005:  # longer than the whole token budget
        return " ".join(rng.choice(SENTENCES_EN) for _ in range(rng.randint(150, 250)))
    if roll < 0.06:  # long enough to press the token budget
        bank = SENTENCES_ZH if rng.random() < 0.4 else SENTENCES_EN
        return " ".join(rng.choice(bank) for _ in range(rng.randint(20, 80)))
    count = rng.choice((1, 1, 1, 2, 2, 3, 4))
    parts = []
    for _ in range(count):
        bank = SENTENCES_ZH if rng.random() < 0.35 else SENTENCES_EN
        parts.append(rng.choice(bank))
    return " ".join(parts)


class _AgentSim:
    """One simulated agent: its clock, open sessions, pending calls, known memory ids."""

    def __init__(self, name: str, rng: random.Random, new_id: Callable[[], uuid.UUID]) -> None:
        self.name = name
        self.rng = rng
        self.new_id = new_id
        self.at = START + timedelta(seconds=rng.randint(0, 3600))
        self.sessions: list[str] = []
        self.fresh: set[str] = set()  # sessions whose next turn starts an episode
        self.counter = 0
        self.calls: list[tuple[str, str, str]] = []
        self.memory_ids: list[str] = []
        self.sure_ids: list[str] = []  # memories that exist for sure (supplied importance >= 8)
        self.past: list[Event] = []
        self.users = (f"{name}-u1", f"{name}-u2", None)

    def _advance(self) -> datetime:
        roll = self.rng.random()
        if roll < 0.01:
            gap = self.rng.uniform(86_400, 3 * 86_400)  # days: windows close, memories fade
        elif roll < 0.02:
            gap = self.rng.uniform(7_300, 20_000)  # hours: working memory TTL
        elif roll < 0.035:
            gap = self.rng.uniform(1_900, 5_000)  # an idle gap: the episode is cut
        else:
            gap = self.rng.uniform(1, 240)
        self.at += timedelta(seconds=gap, microseconds=self.rng.randint(0, 999_999))
        if self.rng.random() < 0.02:  # a late arrival
            return self.at - timedelta(seconds=self.rng.uniform(1, 900))
        return self.at

    def _common(self, session: str | None) -> dict[str, Any]:
        return {
            "event_id": self.new_id(),
            "agent_id": self.name,
            "session_id": session,
            "user_id": self.rng.choice(self.users),
            "occurred_at": self._advance(),
        }

    def _session(self) -> str:
        if not self.sessions or (len(self.sessions) < 2 and self.rng.random() < 0.05):
            self.counter += 1
            sid = f"{self.name}-s{self.counter}"
            self.sessions.append(sid)
            self.fresh.add(sid)
        return self.rng.choice(self.sessions)

    def next(self) -> Event:
        event = self._next()
        self.past.append(event)
        return event

    def _next(self) -> Event:
        rng = self.rng
        roll = rng.random()
        if roll < 0.02 and self.past:
            return rng.choice(self.past[-600:])  # redelivered: the fold must drop it
        if roll < 0.06:
            self.counter += 1
            sid = f"{self.name}-s{self.counter}"
            self.sessions = [*self.sessions[-1:], sid]
            self.fresh.add(sid)
            return SessionStarted(**self._common(sid), body={"task": rng.choice(TASKS)})
        if roll < 0.10 and self.sessions:
            sid = self.sessions.pop(rng.randrange(len(self.sessions)))
            return SessionEnded(**self._common(sid), body={"reason": rng.choice((None, "done"))})
        if roll < 0.15:
            return ClockTicked(
                **self._common(None), body={"partition": rng.randint(0, 3), "interval_s": 60.0}
            )
        if roll < 0.20:
            sid = self._session()
            tool = rng.choice(TOOLS)
            call = f"c{self.counter}-{rng.randint(0, 99)}"
            self.calls.append((tool, call, sid))
            args = json.dumps({"q": rich_text(rng)[:80]})
            return ToolCalled(
                **self._common(sid), body={"call_id": call, "tool": tool, "arguments": args}
            )
        if roll < 0.25:
            if self.calls and rng.random() < 0.85:
                tool, call, sid = self.calls.pop(rng.randrange(len(self.calls)))
            else:
                tool, call, sid = rng.choice(TOOLS), f"orphan{self.counter}", self._session()
            big = rng.random() < 0.3
            content = " ".join(rich_text(rng) for _ in range(30 if big else 1))
            body = {"call_id": call, "tool": tool, "ok": rng.random() < 0.8, "content": content}
            return ToolResult(**self._common(sid), body=body)
        if roll < 0.28:
            body = {
                "namespace": rng.choice(("profile", "prefs")),
                "key": f"k{rng.randint(0, 5)}",
                "value": rng.choice(("tea", "coffee", "北京", "42")),
                "confidence": rng.choice((None, 0.9)),
            }
            return FactAsserted(**self._common(self._maybe_session()), body=body)
        if roll < 0.29:
            body = {"namespace": "profile", "key": f"k{rng.randint(0, 5)}", "reason": "stale"}
            return FactRetracted(**self._common(None), body=body)
        if roll < 0.30:
            return PersonaUpdated(**self._common(None), body=rng.choice(PERSONA_FIELDS))
        if roll < 0.34:
            ids = rng.sample(self.memory_ids[-40:], min(len(self.memory_ids[-40:]), 3))
            ids += ["missing", *ids[:1]]  # an unknown id and a duplicate
            body = {"query": "q", "memory_ids": ids, "scores": [0.5] * len(ids)}
            return MemoryRecalled(**self._common(self._maybe_session()), body=body)
        if roll < 0.37:
            known = self.sure_ids[-2:] if self.sure_ids and rng.random() < 0.5 else self.memory_ids
            memory_id = rng.choice(known[-3:]) if known else "missing"
            useful = rng.random() < 0.3
            correction = None if useful or rng.random() < 0.5 else "that is wrong"
            body = {"memory_id": memory_id, "useful": useful, "correction": correction}
            return FeedbackGiven(**self._common(self._maybe_session()), body=body)
        if roll < 0.372:
            body = {"subject": self.users[0] or "u", "reason": "gdpr"}
            return SubjectErasureRequested(**self._common(None), body=body)
        if roll < 0.39 and self.sessions:
            return WorkingSet(**self._common(rng.choice(self.sessions)), body=self._working_set())
        return self._turn()

    def _working_set(self) -> dict[str, Any]:
        """A ``working.set`` body: some of task, variables (set or removed), scratchpad
        (short, large enough to be offloaded, or cleared)."""
        rng = self.rng
        body: dict[str, Any] = {}
        if rng.random() < 0.3:
            body["task"] = rng.choice((*TASKS, ""))
        if rng.random() < 0.6:
            keys = rng.sample(("city", "budget", "step", "语言"), rng.randint(1, 3))
            body["variables"] = {k: rng.choice(("Kyoto", "3", "中文", None)) for k in keys}
        if rng.random() < 0.4:
            size = rng.choice((1, 1, 40, 0))
            body["scratchpad"] = " ".join(rich_text(rng) for _ in range(size))
        return body

    def _maybe_session(self) -> str | None:
        return self.rng.choice(self.sessions) if self.sessions and self.rng.random() < 0.5 else None

    def _turn(self) -> InteractionRecorded:
        rng = self.rng
        sid = None if rng.random() < 0.02 else self._session()
        body: dict[str, Any] = {
            "role": rng.choice(("user", "assistant", "user", "system")),
            "content": rich_text(rng),
        }
        roll = rng.random()
        if roll < 0.04:  # a flashbulb moment, as the agent scored it
            body.update(importance=9.5, sentiment=rng.choice((-0.9, 0.85)), confidence=0.9)
        elif roll < 0.10:
            body.update(importance=rng.uniform(1, 10))
        elif roll < 0.13:
            body.update(sentiment=rng.uniform(-1, 1), confidence=rng.uniform(0, 1))
        if rng.random() < 0.05:
            body["entities"] = ["Kyoto", "Emma"]
        event = InteractionRecorded(**self._common(sid), body=body)
        eid, agent = str(event.event_id), event.agent_id
        self.memory_ids.append(memory_id_of("turn", agent, eid))
        if body.get("importance", 0.0) >= 8.0:
            self.sure_ids.append(memory_id_of("turn", agent, eid))
        if sid is not None and sid in self.fresh:
            self.fresh.discard(sid)
            self.memory_ids.append(memory_id_of("episode", agent, eid))
        return event


def rich_workload(n: int, agents: int, seed: int = 0) -> list[Event]:
    """Every kind of event, every path of the fold (see the module docstring)."""
    rng = random.Random(seed)
    new_id = _ids(seed + 1)
    sims = [_AgentSim(f"agent-{a}", rng, new_id) for a in range(agents)]
    return [sims[rng.randrange(agents)].next() for _ in range(n)]


WORKLOADS = {"bench": workload, "rich": rich_workload}


# -- measuring --------------------------------------------------------------------------


def fold_rate(events: list[Event], config: MemoryConfig) -> tuple[float, int]:
    memories: dict[str, AgentMemory] = {}
    derived = 0
    started = time.perf_counter()
    for event in events:
        memory = memories.get(event.agent_id)
        if memory is None:
            memory = memories[event.agent_id] = AgentMemory.empty(event.agent_id, config)
        derived += len(memory.apply(event).derived)
    return len(events) / (time.perf_counter() - started), derived


def fold_pass(
    events: list[Event], config: MemoryConfig, *, automatic_gc: bool
) -> tuple[float, int, float]:
    """:func:`fold_rate` under a collector policy, and the seconds of the full
    collection after the pass: with ``automatic_gc`` False the automatic collector is
    off during the pass and one full collection runs after it, outside the rate (the
    worker's policy, :func:`ops.worker.tune_gc`, sweeps once a minute: the figure is
    reported beside the rate); the collector is left as it was found."""
    enabled = gc.isenabled()
    if not automatic_gc:
        gc.disable()
    try:
        rate, derived = fold_rate(events, config)
    finally:
        if enabled:
            gc.enable()
    started = time.perf_counter()
    if not automatic_gc:
        gc.collect()
    return rate, derived, time.perf_counter() - started


def reference_rate(events: list[Event]) -> float:
    """Events per second that pydantic validates from plain values (what decoding an
    event costs, none of our code): the same-run reference the fold is compared to."""
    dumped = [(type(event), event.model_dump()) for event in events]
    started = time.perf_counter()
    for kind, values in dumped:
        kind.model_validate(values)
    return len(dumped) / (time.perf_counter() - started)


def digest(events: list[Event], config: MemoryConfig, restore_every: int = 0) -> str:
    """SHA-256 over every derived event and every agent's final state, serialised.

    With ``restore_every``, every that many events the agent of the event is
    serialised and resumed from its state (the state is hashed too).
    """
    sha = hashlib.sha256()
    memories: dict[str, AgentMemory] = {}
    for i, event in enumerate(events, 1):
        memory = memories.get(event.agent_id)
        if memory is None:
            memory = memories[event.agent_id] = AgentMemory.empty(event.agent_id, config)
        for derived in memory.apply(event).derived:
            sha.update(derived.model_dump_json().encode())
            sha.update(b"\n")
        if restore_every and i % restore_every == 0:
            saved = memory.state().model_dump_json()
            sha.update(saved.encode())
            sha.update(b"\n")
            resumed = AgentMemory(AgentState.model_validate_json(saved), config)
            memories[event.agent_id] = resumed
    for agent_id in sorted(memories):
        sha.update(memories[agent_id].state().model_dump_json().encode())
        sha.update(b"\n")
    return sha.hexdigest()


CONFIGS = {
    "exponential": MemoryConfig(),
    "fsrs": MemoryConfig(forgetting={"curve": "fsrs"}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="bench")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--digest", action="store_true", help="print output digests, not rates")
    parser.add_argument("--restore-every", type=int, default=0)
    parser.add_argument(
        "--repeat", type=int, default=3, help="passes per curve, alternated (median reported)"
    )
    parser.add_argument(
        "--gc",
        choices=("worker", "auto"),
        default="worker",
        help="worker: the automatic collector off during a pass, as in the worker; "
        "auto: CPython's default",
    )
    parser.add_argument(
        "--no-freeze",
        action="store_true",
        help="leave the prepared events to the cyclic garbage collector (see below)",
    )
    args = parser.parse_args()
    events = WORKLOADS[args.workload](args.events, args.agents, args.seed)
    if not args.no_freeze:
        # The workload (every event, built before the clock starts) is input, not part
        # of the fold: a worker holds one batch, not the whole log. Left in the young
        # generations, its ~10^6 objects are scanned by every full collection the fold
        # triggers; frozen, the collector sees only what the fold makes.
        gc.collect()
        gc.freeze()
    head = {
        "events": args.events,
        "agents": args.agents,
        "workload": args.workload,
        "gc_freeze": not args.no_freeze,
        "fold_compiled": fold_compiled(),
    }
    if args.digest:
        digests = {
            curve: digest(events, config, args.restore_every) for curve, config in CONFIGS.items()
        }
        print(json.dumps({**head, "seed": args.seed, **digests}, indent=2))
        return
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    passes: dict[str, list[float]] = {curve: [] for curve in CONFIGS}
    derived = 0
    sweeps: list[float] = []
    automatic = args.gc == "auto"
    for _ in range(args.repeat):
        for curve, config in CONFIGS.items():
            rate, made, sweep_s = fold_pass(events, config, automatic_gc=automatic)
            passes[curve].append(rate)
            sweeps.append(sweep_s)
            if curve == "exponential":
                derived = made
    rate, fsrs_rate = (statistics.median(passes[curve]) for curve in ("exponential", "fsrs"))
    reference = reference_rate(events)
    print(
        json.dumps(
            {
                **head,
                "gc": args.gc,
                "all_processors_per_s": round(rate),
                "all_processors_fsrs_per_s": round(fsrs_rate),
                "passes_per_s": {c: [round(r) for r in rs] for c, rs in passes.items()},
                "sweep_after_pass_s": round(max(sweeps), 3),
                "derived_events": derived,
                "reference_validate_per_s": round(reference),
                "ratio_to_reference": round(rate / reference, 3),
                "fsrs_ratio_to_reference": round(fsrs_rate / reference, 3),
                "machine": machine(),
            },
            indent=2,
        )
    )


def fold_compiled() -> bool:
    """Whether the fold runs from the extensions mypyc built (``setup.py``), not from
    its Python sources."""
    return not str(processors.memory.__file__).endswith(".py")


def machine() -> str:
    from ops.bench.common import machine as describe  # heavy imports, only here

    return describe()


if __name__ == "__main__":
    main()
