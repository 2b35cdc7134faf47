"""``engram rollback`` and ``engram fork`` on a running ``engram up``: the rolled-back
agent's memory (replay, checkpoint and recall) is its memory as of T, history keeps
everything plus the rollback, later events fold on top; a fork at T is the source's
memory as of T under new ids, and the source is untouched."""

from __future__ import annotations

import subprocess
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from engram import Memory, make_event
from engram.results import Snapshot
from ops.bench.timetravel import comparable
from processors.episodes import memory_id_of
from processors.rebase import renamed_id
from schemas import Event
from tests.support import Stack, engram_cmd, wait_until

pytestmark = pytest.mark.integration
T0 = (datetime.now(UTC) - timedelta(days=30)).replace(microsecond=0)
T = T0 + timedelta(days=2)
COUNT = "SELECT count() FROM events FINAL WHERE agent_id = {a:String}"


def history(agent: str) -> list[Event]:
    """Kyoto and green tea before T; Paris, coffee and a formal persona after it."""
    out: list[Event] = []

    def add(kind: str, at: datetime, body: dict[str, Any], session: str | None = None) -> None:
        out.append(make_event(kind, agent_id=agent, session_id=session, user_id="mei",
                              occurred_at=at, body=body))  # fmt: skip

    def session(sid: str, start: datetime, lines: list[str]) -> None:
        add("session.started", start, {"task": "plan a trip"}, sid)
        for i, line in enumerate(lines, 1):
            body = {"role": "user", "content": line}
            add("interaction.recorded", start + timedelta(minutes=i), body, sid)
        add("session.ended", start + timedelta(minutes=9), {"reason": "done"}, sid)

    session("s1", T0, ["I want to see Kyoto in April for the cherry blossoms.", "京都的樱花很美"])
    add("fact.asserted", T0 + timedelta(hours=1), {"namespace": "prefs", "key": "drink",
                                                   "value": "绿茶"})  # fmt: skip
    add("persona.updated", T0 + timedelta(days=1), {"style": "warm, brief"})
    session("s2", T + timedelta(days=1), ["Now plan Paris and the Louvre instead.", "巴黎的卢浮宫"])
    add("fact.asserted", T + timedelta(days=2), {"namespace": "prefs", "key": "drink",
                                                 "value": "coffee"})  # fmt: skip
    add("fact.asserted", T + timedelta(days=2), {"namespace": "trip", "key": "city",
                                                 "value": "Paris"})  # fmt: skip
    add("persona.updated", T + timedelta(days=3), {"style": "formal"})
    return out


def cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        engram_cmd(*args), env=stack.env, capture_output=True, text=True, timeout=180, check=False
    )


def memory_of(snap: Snapshot) -> dict[str, Any]:
    """What must agree: facts, persona and the live memories (ids, layers)."""
    facts = sorted((f["namespace"], f["key"], f["value"]) for f in snap.facts)
    persona = None if snap.persona is None else snap.persona["style"]
    items = sorted((m.memory_id, m.layer, m.kind) for m in snap.memory_items)
    return {"facts": facts, "persona": persona, "memories": items}


def episodes_of(snap: Snapshot) -> list[str]:
    """The snapshot's recent episodes, newest first, by id."""
    return [e["episode_id"] for e in snap.episodes]


def texts(memory: Memory, agent: str, query: str) -> list[str]:
    found = memory.recall(query, agent_id=agent, k=20, record=False)
    return [m.text for m in found.memories]


def test_rollback_then_fork(stack: Stack) -> None:
    agent = f"rb-{uuid.uuid4().hex[:8]}"
    fork = f"{agent}-fork"
    events = history(agent)
    with Memory(bootstrap=stack.bootstrap, http=stack.http) as memory:
        memory.publish_many(events)
        wait_until(lambda: stack.scalar(COUNT, a=agent) == len(events), 60, "the archive")
        as_of_t = memory_of(memory.snapshot(agent, as_of=T))
        assert as_of_t["facts"] == [("prefs", "drink", "绿茶")]
        wait_until(lambda: any("Paris" in t for t in texts(memory, agent, "Paris Louvre")),
                   60, "Paris in recall")  # fmt: skip

        refused = cli(stack, "rollback", agent, "--to", "2999-01-01T00:00Z")
        assert refused.returncode == 2 and "in the future" in refused.stderr
        refused = cli(stack, "rollback", "nobody-" + agent, "--to", T.isoformat())
        assert refused.returncode == 2 and "unknown agent" in refused.stderr
        early = (T0 - timedelta(days=1)).isoformat()
        refused = cli(stack, "rollback", agent, "--to", early)
        assert refused.returncode == 2 and "before the first event" in refused.stderr

        done = cli(stack, "rollback", agent, "--to", T.isoformat(), "--reason", "回到京都")
        assert done.returncode == 0, done.stderr
        assert "rolled" in done.stdout and "memories left" in done.stdout

        # the memory now is the memory as of T: by replay, and by the worker's checkpoint
        now = datetime.now(UTC)
        assert memory_of(memory.snapshot(agent, as_of=now)) == as_of_t
        latest = memory.snapshot(agent)
        assert memory_of(latest)["facts"] == as_of_t["facts"]
        assert memory_of(latest)["persona"] == "warm, brief"
        # its episodes too, on every road: Paris's session (closed after T) was undone
        kyoto = episodes_of(memory.snapshot(agent, as_of=T))
        assert kyoto
        assert episodes_of(memory.snapshot(agent, as_of=now)) == kyoto
        assert episodes_of(latest) == kyoto
        assert episodes_of(memory.history(agent, as_of=now)) == kyoto
        before = T + timedelta(days=4)  # before the rollback: Paris's session was there
        assert episodes_of(memory.history(agent, as_of=before))[1:] == kyoto
        assert episodes_of(memory.snapshot(agent, as_of=before))[1:] == kyoto
        # history keeps everything, plus the rollback and its record
        assert stack.scalar(COUNT, a=agent) == len(events) + 1
        typed = "SELECT type FROM events FINAL WHERE agent_id = {a:String} ORDER BY seq"
        kinds = [r[0] for r in stack.rows(typed, a=agent)]
        assert kinds[-1] == "memory.rolled_back" and kinds[:-1] == [e.type for e in events]
        assert stack.scalar(
            "SELECT count() FROM memory_changes FINAL WHERE agent_id = {a:String}"
            " AND type = 'agent.rolled_back'", a=agent) == 1  # fmt: skip
        # recall: Kyoto is there, Paris has left
        wait_until(lambda: not any("Paris" in t for t in texts(memory, agent, "Paris Louvre")),
                   60, "Paris to leave recall")  # fmt: skip
        assert any("Kyoto" in t for t in texts(memory, agent, "Kyoto cherry blossoms"))

        # new events fold on top of the rolled-back memory
        later = make_event("fact.asserted", agent_id=agent, occurred_at=now,
                           body={"namespace": "trip", "key": "city", "value": "大阪"})  # fmt: skip
        memory.publish(later)
        wait_until(lambda: stack.scalar(COUNT, a=agent) == len(events) + 2, 60, "the new fact")
        facts = memory_of(memory.snapshot(agent))["facts"]
        assert facts == [("prefs", "drink", "绿茶"), ("trip", "city", "大阪")]

        # a fork of the source at T: the source's memory as of T under new ids
        refused = cli(stack, "fork", agent, "--as", agent, "--at", T.isoformat())
        assert refused.returncode == 2 and "new agent" in refused.stderr
        before_fork = stack.scalar(COUNT, a=agent)
        done = cli(stack, "fork", agent, "--as", fork, "--at", T.isoformat())
        assert done.returncode == 0, done.stderr
        assert f"as {fork}" in done.stdout
        mine = memory_of(memory.snapshot(fork, as_of=datetime.now(UTC)))
        assert (mine["facts"], mine["persona"]) == (as_of_t["facts"], as_of_t["persona"])
        assert [m[1:] for m in mine["memories"]] == sorted(m[1:] for m in as_of_t["memories"])
        assert not {m[0] for m in mine["memories"]} & {m[0] for m in as_of_t["memories"]}
        assert stack.scalar(COUNT, a=agent) == before_fork  # the source is untouched
        wait_until(lambda: any("Kyoto" in t for t in texts(memory, fork, "Kyoto cherry")),
                   60, "Kyoto in the fork's recall")  # fmt: skip
        assert not any("Paris" in t for t in texts(memory, fork, "Paris Louvre"))
        refused = cli(stack, "fork", agent, "--as", fork)
        assert refused.returncode == 2 and "exists already" in refused.stderr


def test_a_rollback_and_a_fork_to_t_agree_with_the_snapshot_as_of_t_over_late_events(
    stack: Stack,
) -> None:
    """An event that arrives late (logged after one dated later than it) makes the
    state at T something other than a prefix of the log: the rollback and the fork
    restore what the as-of snapshot folds, not the log up to T's position."""
    agent, copy = f"late-{uuid.uuid4().hex[:8]}", f"late-copy-{uuid.uuid4().hex[:8]}"

    def fact(key: str, value: str, at: datetime) -> Event:
        body = {"namespace": "p", "key": key, "value": value}
        return make_event("fact.asserted", agent_id=agent, occurred_at=at, body=body)

    with Memory(http=stack.http) as memory:
        memory.publish_many(
            [
                fact("lang", "en", T0),
                fact("drink", "coffee", T0 + timedelta(days=3)),
                fact("city", "Kyoto", T0 + timedelta(days=1)),  # late
            ]
        )
        wait_until(lambda: stack.scalar(COUNT, a=agent) == 3, 60, "the log archived")
        then = sorted((f["key"], f["value"]) for f in memory.snapshot(agent, as_of=T).facts)
        assert then == [("city", "Kyoto"), ("lang", "en")]
        forked = cli(stack, "fork", agent, "--as", copy, "--at", T.isoformat())
        assert forked.returncode == 0, forked.stderr
        back = cli(stack, "rollback", agent, "--to", T.isoformat())
        assert back.returncode == 0, back.stderr
        for who in (agent, copy):
            now = sorted((f["key"], f["value"]) for f in memory.snapshot(who).facts)
            assert now == then, who


class Trip:
    """The events of a trip-planning scenario for ``agent`` (user mei), in the order
    they are made (:attr:`events`)."""

    def __init__(self, agent: str) -> None:
        self.agent = agent
        self.events: list[Event] = []

    def add(self, kind: str, at: datetime, body: dict[str, Any], session: str | None = None,
            who: str | None = None, user: str = "mei") -> Event:  # fmt: skip
        """One event of ``who`` (the agent by default) for ``user``, appended to
        :attr:`events`."""
        event = make_event(kind, agent_id=who or self.agent, session_id=session,
                           user_id=user, occurred_at=at, body=body)  # fmt: skip
        self.events.append(event)
        return event

    def remembered(self, sid: str, start: datetime, line: str) -> str:
        """A session with one important turn: the id of that turn's memory."""
        self.add("session.started", start, {"task": "plan a trip"}, sid)
        body = {"role": "user", "content": line, "importance": 8.5}
        turn = self.add("interaction.recorded", start + timedelta(minutes=1), body, sid)
        self.add("session.ended", start + timedelta(minutes=9), {"reason": "done"}, sid)
        return memory_id_of("turn", self.agent, str(turn.event_id))

    def recall(self, at: datetime, *memory_ids: str, who: str | None = None) -> Event:
        """``who`` (the agent by default) recalls ``memory_ids``."""
        scores = [0.5] * len(memory_ids)
        body = {"query": "the trip", "memory_ids": [*memory_ids], "scores": scores}
        return self.add("memory.recalled", at, body, who=who)


def test_a_rollback_that_undoes_another_brings_back_what_the_first_forgot(stack: Stack) -> None:
    """Paris is remembered after T1; a rollback to T1 forgets it, and a second rollback,
    to T2 (after Paris was made), undoes the first and brings Paris back as it was at
    T2 (one reinforcement, one lapse). At every moment around both rollbacks the two
    roads of time travel (replay and the history's SQL) give the same memories, part
    for part; the ``memories`` view shows Paris live, with the reinforcements of its
    restored trace, and Kyoto with those the first rollback left it."""
    agent = f"rr-{uuid.uuid4().hex[:8]}"
    t1, t2 = T0 + timedelta(days=2), T0 + timedelta(days=4)
    trip = Trip(agent)
    events, add, remembered, recall = trip.events, trip.add, trip.remembered, trip.recall

    kyoto = remembered("s1", T0, "I want to see Kyoto in April for the cherry blossoms.")
    recall(T0 + timedelta(hours=1), kyoto)
    paris = remembered("s2", T0 + timedelta(days=3), "Now plan Paris and the Louvre instead.")
    recall(T0 + timedelta(days=3, hours=1), paris)
    add("feedback.given", T0 + timedelta(days=3, hours=2),
        {"memory_id": paris, "useful": False, "correction": "not the Louvre"})  # fmt: skip
    recall(T0 + timedelta(days=5), paris, kyoto)

    def view(memory_id: str) -> tuple[Any, ...]:
        return stack.rows(
            "SELECT forgotten, reinforcements, layer FROM memories"
            " WHERE agent_id = {a:String} AND memory_id = {m:String}", a=agent, m=memory_id
        )[0]  # fmt: skip

    with Memory(bootstrap=stack.bootstrap, http=stack.http) as memory:
        memory.publish_many(events)
        wait_until(lambda: stack.scalar(COUNT, a=agent) == len(events), 60, "the archive")
        before = [T0 + timedelta(hours=2), t1, T0 + timedelta(days=3, hours=3), t2,
                  T0 + timedelta(days=6)]  # fmt: skip
        at_t2 = agree(memory, agent, t2)[paris]
        assert (at_t2["reinforcements"], at_t2["lapses"]) == (1, 1)

        for to in (t1, t2):
            done = cli(stack, "rollback", agent, "--to", to.isoformat())
            assert done.returncode == 0, done.stderr
        first, second = (
            _aware(at) for (at,) in stack.rows(
                "SELECT occurred_at FROM memory_changes FINAL WHERE agent_id = {a:String}"
                " AND type = 'agent.rolled_back' ORDER BY seq", a=agent)
        )  # fmt: skip
        assert first < second
        later = datetime.now(UTC)
        recall(later, paris)  # a reinforcement on top of the restored trace
        memory.publish(events[-1])
        wait_until(lambda: stack.scalar(COUNT, a=agent) == len(events) + 2, 60, "the recall")

        for at in [*before, first, second - timedelta(milliseconds=1)]:
            agree(memory, agent, at)
        assert paris not in agree(memory, agent, first)
        restored = agree(memory, agent, second)[paris]
        assert restored == at_t2 | {"retention": restored["retention"]}
        now = agree(memory, agent, datetime.now(UTC))
        assert (now[paris]["reinforcements"], now[paris]["lapses"]) == (2, 1)
        assert now[kyoto]["reinforcements"] == 1  # the first rollback undid one
        assert view(paris) == (False, 2, "L2")
        assert view(kyoto) == (False, 1, "L2")


def test_a_fork_agrees_on_both_roads_with_the_trace_of_its_source(stack: Stack) -> None:
    """A fork at T copies its source's memories as they were at T, traces and all: at
    every moment after the fork, the two roads of time travel give the fork the
    source's creation times, last reinforcements, reinforcements, lapses and strengths
    (not the fork's time and one reinforcement for each copied trace, as the fork's
    catch-up changes would say), then the fork's own reinforcements on top; and so for
    a fork of the fork."""
    agent = f"fk-{uuid.uuid4().hex[:8]}"
    fork, again = f"{agent}-b", f"{agent}-c"
    t = T0 + timedelta(days=4)
    trip = Trip(agent)
    events, add, remembered, recall = trip.events, trip.add, trip.remembered, trip.recall

    kyoto = remembered("s1", T0, "I want to see Kyoto in April for the cherry blossoms.")
    recall(T0 + timedelta(hours=1), kyoto)
    recall(T0 + timedelta(days=1), kyoto)
    paris = remembered("s2", T0 + timedelta(days=3), "Now plan Paris and the Louvre instead.")
    recall(T0 + timedelta(days=3, hours=1), paris)
    add("feedback.given", T0 + timedelta(days=3, hours=2),
        {"memory_id": paris, "useful": False, "correction": "not the Louvre"})  # fmt: skip
    recall(T0 + timedelta(days=5), paris, kyoto)  # after T: not the fork's

    def fork_time(who: str) -> datetime:
        return _aware(stack.scalar(
            "SELECT occurred_at FROM memory_changes FINAL WHERE agent_id = {a:String}"
            " AND type = 'agent.forked'", a=who))  # fmt: skip

    with Memory(bootstrap=stack.bootstrap, http=stack.http) as memory:
        memory.publish_many(events)
        wait_until(lambda: stack.scalar(COUNT, a=agent) == len(events), 60, "the archive")
        source = agree(memory, agent, t)
        assert (source[paris]["reinforcements"], source[paris]["lapses"]) == (1, 1)
        assert source[kyoto]["reinforcements"] == 2

        done = cli(stack, "fork", agent, "--as", fork, "--at", t.isoformat())
        assert done.returncode == 0, done.stderr
        forked_at = fork_time(fork)
        copied = agree(memory, fork, forked_at)
        assert copied.keys() == {renamed_id(fork, m) for m in source}
        for old, item in source.items():  # the source's traces, retention at the fork's time
            mine = copied[renamed_id(fork, old)]
            same = {k: v for k, v in mine.items() if k not in ("memory_id", "retention")}
            assert same == {k: v for k, v in item.items() if k in same}, old

        # the fork's own reinforcement, on top of the copied trace
        recalled = recall(datetime.now(UTC), renamed_id(fork, paris), who=fork)
        memory.publish(recalled)
        wait_until(lambda: stack.scalar(COUNT, a=fork) == 2, 60, "the fork's recall")
        after = agree(memory, fork, datetime.now(UTC))[renamed_id(fork, paris)]
        assert (after["reinforcements"], after["lapses"]) == (2, 1)
        # the memories view: the source's creation time and reinforcement count
        for old, count in ((kyoto, 2), (paris, 2)):
            created, reinforcements = stack.rows(
                "SELECT created_at, reinforcements FROM memories"
                " WHERE agent_id = {a:String} AND memory_id = {m:String}",
                a=fork, m=renamed_id(fork, old))[0]  # fmt: skip
            assert (_aware(created), reinforcements) == (
                datetime.fromisoformat(source[old]["created_at"]), count), old  # fmt: skip
        moments = [forked_at + timedelta(milliseconds=1), _aware(recalled.occurred_at)]
        for at in moments:
            agree(memory, fork, at)

        # a fork of the fork: the source's trace, the first fork's reinforcement
        done = cli(stack, "fork", fork, "--as", again, "--at", datetime.now(UTC).isoformat())
        assert done.returncode == 0, done.stderr
        twice = agree(memory, again, datetime.now(UTC))[renamed_id(again, renamed_id(fork, paris))]
        assert {k: v for k, v in twice.items() if k not in ("memory_id", "retention")} == {
            k: v for k, v in after.items() if k not in ("memory_id", "retention")
        }
        agree(memory, again, fork_time(again))


def test_a_fork_lists_its_sources_episodes_as_of_the_fork_on_both_roads(stack: Stack) -> None:
    """A fork's recent episodes are its own, newest first, then its source's as the
    source's snapshot as of the fork lists them (less those a rollback of the source
    had undone by then), each with the agent whose log closed it; not the source's later
    ones. Replay, the history's SQL and the latest snapshot give the same list, also
    for one user and for fewer episodes; a fork of the fork lists three generations."""
    agent = f"fe-{uuid.uuid4().hex[:8]}"
    fork, again = f"{agent}-b", f"{agent}-c"
    past = Trip(agent)
    conversation(past, "s1", T0, "mei", "I want to see Kyoto in April.")
    conversation(past, "s2", T0 + timedelta(days=1), "ana", "Book the ryokan in Kyoto.")
    conversation(past, "s3", T + timedelta(days=1), "mei", "Now plan Paris instead.")

    def fork_time(who: str) -> datetime:
        return _aware(stack.scalar(
            "SELECT occurred_at FROM memory_changes FINAL WHERE agent_id = {a:String}"
            " AND type = 'agent.forked'", a=who))  # fmt: skip

    def own_episode(who: str, sid: str) -> None:
        trip = Trip(who)
        conversation(trip, sid, datetime.now(UTC), "mei", "And the trip after that?")
        before = stack.scalar(COUNT, a=who)
        memory.publish_many(trip.events)
        wait_until(lambda: stack.scalar(COUNT, a=who) == before + 3, 60, f"{sid} archived")
        while datetime.now(UTC) <= trip.events[-1].occurred_at:  # as_of is never ahead
            time.sleep(0.01)

    with Memory(bootstrap=stack.bootstrap, http=stack.http) as memory:
        memory.publish_many(past.events)
        wait_until(lambda: stack.scalar(COUNT, a=agent) == len(past.events), 60, "the archive")
        undo = cli(stack, "rollback", agent, "--to", T.isoformat())  # undoes s3
        assert undo.returncode == 0, undo.stderr
        at = datetime.now(UTC)
        source = episodes_agree(memory, agent, at)
        assert [(who, user) for who, _, user in source] == [(agent, "ana"), (agent, "mei")]

        done = cli(stack, "fork", agent, "--as", fork, "--at", at.isoformat())
        assert done.returncode == 0, done.stderr
        forked_at = fork_time(fork)
        assert episodes_agree(memory, fork, forked_at) == source
        assert episodes_of_latest(memory, fork) == source

        own_episode(agent, "s4")  # the source's, after the fork: not the fork's
        later = episodes_agree(memory, agent, datetime.now(UTC))[0]
        assert later[0] == agent and later not in source
        own_episode(fork, "s5")
        mine = episodes_agree(memory, fork, datetime.now(UTC))
        assert mine[0][0] == fork and mine[1:] == source
        assert later not in mine
        assert episodes_of_latest(memory, fork) == mine
        assert episodes_agree(memory, fork, forked_at) == source
        assert episodes_agree(memory, fork, datetime.now(UTC), user_id="ana") == source[:1]
        assert episodes_agree(memory, fork, datetime.now(UTC), episodes=2) == mine[:2]

        done = cli(stack, "fork", fork, "--as", again, "--at", datetime.now(UTC).isoformat())
        assert done.returncode == 0, done.stderr
        assert episodes_agree(memory, again, fork_time(again)) == mine
        own_episode(again, "s6")
        three = episodes_agree(memory, again, datetime.now(UTC))
        assert [who for who, _, _ in three] == [again, fork, agent, agent]
        assert three[1:] == mine
        assert episodes_of_latest(memory, again) == three
        assert episodes_agree(memory, again, datetime.now(UTC), user_id="ana") == source[:1]
        assert episodes_of_latest(memory, again, user_id="mei") == [
            e for e in three if e[2] == "mei"
        ]
        assert episodes_agree(memory, again, datetime.now(UTC), episodes=3) == three[:3]


def conversation(trip: Trip, sid: str, start: datetime, user: str, line: str) -> None:
    """A session of ``user`` with one turn, a second long: one episode when it ends."""
    trip.add("session.started", start, {"task": "plan a trip"}, sid, user=user)
    body = {"role": "user", "content": line}
    trip.add("interaction.recorded", start + timedelta(milliseconds=500), body, sid, user=user)
    trip.add("session.ended", start + timedelta(seconds=1), {"reason": "done"}, sid, user=user)


def episodes_agree(
    memory: Memory, agent: str, at: datetime, **options: Any
) -> list[tuple[str, str, str]]:
    """Both roads' episodes of ``agent`` as of ``at``, which must be the same, record for
    record: newest first, as (agent that closed it, episode id, user)."""
    replayed = comparable(memory.snapshot(agent, as_of=at, **options))["episodes"]
    queried = comparable(memory.history(agent, as_of=at, **options))["episodes"]
    assert replayed == queried, (agent, at.isoformat(), options)
    return [(e["agent_id"], e["episode_id"], e["user_id"]) for e in replayed]


def episodes_of_latest(memory: Memory, agent: str, **options: Any) -> list[tuple[str, str, str]]:
    """The latest snapshot's episodes of ``agent``, as :func:`episodes_agree` gives them."""
    found = memory.snapshot(agent, **options).episodes
    return [(e["agent_id"], e["episode_id"], e["user_id"]) for e in found]


def agree(memory: Memory, agent: str, at: datetime) -> dict[str, Any]:
    """Both roads' memories of ``agent`` as of ``at``, which must be the same, part for
    part and field by field; by memory id."""
    replayed = comparable(memory.snapshot(agent, as_of=at))
    queried = comparable(memory.history(agent, as_of=at))
    for part in ("memories", "episodes", "working", "position"):
        assert replayed[part] == queried[part], (part, at.isoformat())
    one = {m["memory_id"]: m for m in replayed["memory_items"]}
    two = {m["memory_id"]: m for m in queried["memory_items"]}
    assert one.keys() == two.keys(), (at.isoformat(), one.keys() ^ two.keys())
    for memory_id, item in one.items():
        wrong = {k: (v, two[memory_id][k]) for k, v in item.items() if two[memory_id][k] != v}
        assert not wrong, f"{memory_id} as of {at.isoformat()}, (replay, history): {wrong}"
    return one


def _aware(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
