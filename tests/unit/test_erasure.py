"""Erasure in the fold: the per-agent ``subject.erasure_requested`` purges its subject
from the agent's state (working memory, episodes, windows, memories, facts, persona),
emits ``subject.erased`` with counts only, leaves the other users alone, and does
nothing new the second time. Pure: no I/O."""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processors import AgentMemory, AgentState, MemoryConfig
from processors.erasure import Owner, refold_fact, refold_persona
from processors.persona import PersonaVersion
from processors.state import FactVersion
from schemas import (
    ClockTicked,
    Codec,
    Event,
    FactAsserted,
    InteractionRecorded,
    PersonaUpdated,
    SessionEnded,
    SessionStarted,
    SubjectErased,
    SubjectErasureRequested,
    WorkingSet,
)

AGENT = "erasure-bot"
T0 = datetime(2026, 3, 1, tzinfo=UTC)
USERS = ("mei", "sam", "lea")
PLANTED = {
    "mei": ("秘密花园-MEI-7731", "mei-secret-boat-0042"),
    "sam": ("sam-hidden-orchid-5150", "山姆的钥匙-SAM-88"),
    "lea": ("léa-cachée-LEA-3141", "lea-pin-2718"),
}
CONFIG = MemoryConfig.model_validate(
    {"episodes": {"max_turns": 4}, "consolidation": {"window_s": 3600.0, "min_episodes": 1}}
)


class Log:
    """Builds one agent's log with increasing ids and times."""

    def __init__(self) -> None:
        self.n = 0
        self.events: list[Event] = []

    def _common(self, user: str | None, session: str | None) -> dict[str, Any]:
        self.n += 1
        return {
            "event_id": UUID(int=self.n),
            "agent_id": AGENT,
            "session_id": session,
            "user_id": user,
            "occurred_at": T0 + timedelta(seconds=30 * self.n),
        }

    def add(self, event: Event) -> Event:
        self.events.append(event)
        return event

    def turn(self, user: str | None, session: str, text: str, importance: float = 5) -> Event:
        body = {"role": "user", "content": text, "importance": importance, "sentiment": 0.9}
        return self.add(InteractionRecorded(**self._common(user, session), body=body))

    def start(self, user: str | None, session: str) -> Event:
        return self.add(SessionStarted(**self._common(user, session), body={"task": "help"}))

    def end(self, user: str | None, session: str) -> Event:
        return self.add(SessionEnded(**self._common(user, session)))

    def note(self, user: str | None, session: str, pad: str) -> Event:
        body = {"scratchpad": pad, "variables": {"k": pad}}
        return self.add(WorkingSet(**self._common(user, session), body=body))

    def fact(self, user: str | None, namespace: str, key: str, value: str) -> Event:
        body = {"namespace": namespace, "key": key, "value": value}
        return self.add(FactAsserted(**self._common(user, None), body=body))

    def persona(self, user: str | None, **body: Any) -> Event:
        return self.add(PersonaUpdated(**self._common(user, None), body=body))

    def tick(self, hours: float = 0) -> Event:
        common = self._common(None, None)
        common["occurred_at"] += timedelta(hours=hours)
        return self.add(ClockTicked(**common, body={"partition": 0, "interval_s": 60.0}))

    def erase(self, subject: str) -> SubjectErasureRequested:
        request = SubjectErasureRequested(
            **self._common(None, None), body={"subject": subject, "reason": "asked"}
        )
        self.add(request)
        return request


def history() -> Log:
    """Three users, each with closed and open episodes, working memory, facts, persona."""
    log = Log()
    for user in USERS:
        one, two = PLANTED[user]
        log.start(user, f"{user}-1")
        for i in range(5):
            log.turn(user, f"{user}-1", f"{user} says {one} ({i})", importance=9)
        log.end(user, f"{user}-1")
        log.turn(user, f"{user}-2", f"{user} also says {two}")
        log.note(user, f"{user}-2", f"{two} in a note")
        log.fact(user, f"user:{user}", "secret", one)
        log.fact(user, "shared", "motto", two)
        log.persona(user, preferences={user: two})
    log.persona("sam", description=f"talks like {PLANTED['sam'][0]}")
    log.tick(hours=1.1)  # consolidation windows close, sessions stay
    return log


def fold(events: Sequence[Event], config: MemoryConfig = CONFIG) -> AgentMemory:
    memory = AgentMemory.empty(AGENT, config)
    for event in events:
        memory.apply(event)
    return memory


def test_erasure_removes_every_planted_string_of_the_subject_and_only_them() -> None:
    log = history()
    memory = fold(log.events)
    before = memory.state().model_dump_json()
    assert all(s in before for u in USERS for s in PLANTED[u])
    step = memory.apply(log.erase("mei"))
    after = memory.state().model_dump_json()
    assert not any(s in after for s in PLANTED["mei"])
    assert all(s in after for u in ("sam", "lea") for s in PLANTED[u])
    [erased] = step.derived
    assert isinstance(erased, SubjectErased) and erased.user_id is None
    body = erased.body
    assert (body.subject, body.request_id) == ("mei", log.events[-1].event_id)
    assert body.sessions >= 1 and body.memories >= 1 and body.facts == 2 and body.persona == 1
    assert not any(s in erased.model_dump_json() for s in PLANTED["mei"])
    Codec().decode(Codec().encode(erased))  # the wire schema takes it


def test_the_other_users_state_is_unchanged() -> None:
    log = history()
    memory = fold(log.events)
    kept = memory.state()
    memory.apply(log.erase("lea"))
    after = memory.state()
    for user in ("mei", "sam"):
        assert [m for m in after.memories if m.user_id == user] == [
            m for m in kept.memories if m.user_id == user
        ]
        assert [o for o in after.episodes.open if o.user_id == user] == [
            o for o in kept.episodes.open if o.user_id == user
        ]
        assert [h for h in after.facts.facts if h.namespace == f"user:{user}"] == [
            h for h in kept.facts.facts if h.namespace == f"user:{user}"
        ]
        sessions = {s.session_id for s in kept.sessions if s.session_id.startswith(user)}
        assert [s for s in after.sessions if s.session_id in sessions] == [
            s for s in kept.sessions if s.session_id in sessions
        ]


def test_erasing_twice_changes_nothing_the_second_time() -> None:
    log = history()
    memory = fold(log.events)
    memory.apply(log.erase("mei"))
    once = memory.state()
    step = memory.apply(log.erase("mei"))  # a new request for the same subject
    again = memory.state()
    [erased] = step.derived
    assert isinstance(erased, SubjectErased)
    counts = erased.body.model_dump(exclude={"subject", "request_id", "requested_at"})
    assert counts == {"sessions": 0, "episodes": 0, "memories": 0, "facts": 0, "persona": 0}
    assert again.model_dump(exclude={"seq", "recent_ids"}) == once.model_dump(
        exclude={"seq", "recent_ids"}
    )


def test_a_redelivered_request_is_a_duplicate() -> None:
    log = history()
    memory = fold(log.events)
    request = log.erase("sam")
    memory.apply(request)
    once = memory.state()
    assert memory.apply(request).seq is None
    assert memory.state() == once


def test_the_state_resumes_with_the_owners() -> None:
    log = history()
    resumed = AgentMemory(
        AgentState.model_validate_json(fold(log.events).state().model_dump_json()), CONFIG
    )
    resumed.apply(log.erase("mei"))
    assert not any(s in resumed.state().model_dump_json() for s in PLANTED["mei"])


def test_an_agent_subject_erases_what_has_no_user() -> None:
    log = Log()
    log.turn(None, "solo", "the agent's own thought AGENT-ONLY-999", importance=9)
    log.fact(None, "self", "mood", "AGENT-MOOD-123")
    log.turn("sam", "sam-1", "sam keeps SAM-KEEP-1", importance=9)
    memory = fold(log.events)
    memory.apply(log.erase(AGENT))
    state = memory.state().model_dump_json()
    assert "AGENT-ONLY-999" not in state and "AGENT-MOOD-123" not in state
    assert "SAM-KEEP-1" in state


def test_a_fact_closed_by_the_subject_stays_valid_over_its_interval() -> None:
    at = [T0 + timedelta(hours=h) for h in range(4)]

    def version(value: str, start: int, end: int | None, user: str) -> FactVersion:
        return FactVersion(
            value=value,
            valid_from=at[start],
            valid_to=None if end is None else at[end],
            asserted_by=uuid4(),
            user_id=user,
        )

    kept = refold_fact(
        [version("a", 0, 1, "sam"), version("b", 1, 2, "mei"), version("a", 2, None, "lea")],
        Owner("mei", AGENT),
    )
    assert [(v.value, v.valid_from, v.valid_to, v.user_id) for v in kept] == [
        ("a", at[0], None, "sam")
    ]


def test_a_persona_is_remerged_from_the_others_changes() -> None:
    log = Log()
    for user, body in (
        ("sam", {"name": "Bot", "preferences": {"tone": "warm"}}),
        ("mei", {"description": "MEI-DESC", "preferences": {"mei": "MEI-PREF", "tone": "cold"}}),
        ("lea", {"style": "brief"}),
    ):
        log.persona(user, **body)
    memory = fold(log.events)
    versions, users = refold_persona(
        memory.persona.versions, memory.persona_users, Owner("mei", AGENT)
    )
    assert [v.content() for v in versions] == [
        ("Bot", None, None, {"tone": "warm"}),
        ("Bot", None, "brief", {"tone": "warm"}),
    ]
    assert [v.version for v in versions] == [1, 2] and users == ["sam", "lea"]
    assert all(isinstance(v, PersonaVersion) for v in versions)


# -- the property: erasing U equals never having seen U -----------------------------


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[str, str, int]]:
    """(kind, user, n) steps: turns in a user's sessions, session ends, facts in the
    user's namespace, ticks."""
    kinds = st.sampled_from(("turn", "turn", "turn", "end", "fact", "tick"))
    step = st.tuples(kinds, st.sampled_from(USERS), st.integers(0, 3))
    return draw(st.lists(step, min_size=1, max_size=60))


def build(steps: Sequence[tuple[str, str, int]], skip: str | None) -> list[Event]:
    """The log of ``steps`` (the same ids and times whatever is skipped), without
    ``skip``'s events."""
    log = Log()
    rng = random.Random(len(steps))
    for kind, user, n in steps:
        if kind == "turn":
            event = log.turn(user, f"{user}-{n % 2}", f"{user} {n} {rng.random()}", 2 + 2.5 * n)
        elif kind == "end":
            event = log.end(user, f"{user}-{n % 2}")
        elif kind == "fact":
            event = log.fact(user, f"user:{user}", f"k{n}", f"{user}-{rng.random()}")
        else:
            event = log.tick(hours=n)
        if event.user_id == skip and skip is not None:
            log.events.pop()
    return log.events


def others(memory: AgentMemory, gone: str) -> dict[str, Any]:
    state = memory.state()
    return {
        "memories": [m for m in state.memories if m.user_id != gone],
        "facts": [h for h in state.facts.facts if h.namespace != f"user:{gone}"],
        "open": [o for o in state.episodes.open if o.user_id != gone],
        "windows": [w for w in state.consolidation.windows if w.user_id != gone],
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.sampled_from(USERS))
def test_erasing_a_user_equals_never_having_folded_them(
    steps: list[tuple[str, str, int]], gone: str
) -> None:
    erased = fold(build(steps, None))
    log = Log()
    log.n = 10_000
    erased.apply(log.erase(gone))
    never = fold(build(steps, gone))
    assert others(erased, gone) == others(never, gone)
    state = erased.state()
    assert not [m for m in state.memories if m.user_id == gone]
    assert not [h for h in state.facts.facts if h.namespace == f"user:{gone}"]
    assert gone not in state.session_users.values()


# -- the broadcast, as the pipeline reads it ------------------------------------------


def test_the_pipeline_finds_the_requested_subjects_in_avro_and_json() -> None:
    from engram.erasure import erasure_request
    from processors.erasure import ERASURE_AGENT
    from streams.pipeline import erasure_for, erasure_subjects

    codec = Codec()
    log = history()
    mei, sam = erasure_request("mei", "asked"), erasure_request("sam")
    assert mei.agent_id == ERASURE_AGENT and mei.body.requested_at is not None
    raws: list[bytes | None] = [
        codec.encode(log.events[0]),
        codec.encode(mei),
        None,
        codec.encode_json(sam),
        codec.encode(mei),  # the same request again: one subject
        b"\xc3\x01 not an event",
    ]
    assert erasure_subjects(codec, raws) == {
        "mei": mei.body.requested_at,
        "sam": sam.body.requested_at,
    }
    mine = erasure_for(mei, AGENT)
    assert erasure_subjects(codec, [codec.encode(mine)]) == {}  # an archived copy: no key
    assert (mine.agent_id, mine.event_id, mine.body) == (AGENT, mei.event_id, mei.body)
    memory = fold(log.events)
    [erased] = memory.apply(mine).derived
    assert isinstance(erased, SubjectErased) and erased.body.request_id == mei.event_id


def test_what_carries_a_users_words_is_filed_under_that_user() -> None:
    """The agent greets first and notes things naming no user: the episode its greeting
    opened and the working-memory deltas its own events made carry the user's words
    all the same, so they are filed under the user (whom the purge and the key find)."""
    secret = "mei-passport-EX-4242"
    log = Log()
    log.start("mei", "s")  # the session is mei's
    log.turn(None, "s", "How can I help you today?")  # the agent speaks first
    for i in range(3):
        log.turn("mei", "s", f"my passport is {secret} ({i})", importance=9)
    log.note(None, "s", f"{secret} for the booking")  # the agent's note on mei's session
    log.turn(None, "s", "Noted, booking now.")
    log.end(None, "s")
    memory = AgentMemory.empty(AGENT, CONFIG)
    derived = [d for e in log.events for d in memory.apply(e).derived]
    carrying = [d for d in derived if secret in d.model_dump_json()]
    assert {d.type for d in carrying} >= {"working.updated", "episode.closed", "memory.created"}
    assert [d for d in carrying if d.user_id != "mei"] == []
    memory.apply(log.erase("mei"))
    assert secret not in memory.state().model_dump_json()


def test_a_reopened_sessions_user_does_not_depend_on_when_the_state_was_saved() -> None:
    """A session that ended and opens again is a new life: its deltas are filed under
    the user of that life, whether or not a saved state (which forgets the users of
    ended sessions) lies in between."""
    log = Log()
    log.start("mei", "s")
    log.turn("mei", "s", "mei's first life")
    log.end("mei", "s")
    cut = len(log.events)
    log.note(None, "s", "the agent reopens s")  # no user named
    log.turn("sam", "s", "sam's second life")
    whole = AgentMemory.empty(AGENT, CONFIG)
    straight = [d for e in log.events for d in whole.apply(e).derived]
    first = AgentMemory.empty(AGENT, CONFIG)
    for event in log.events[:cut]:
        first.apply(event)
    resumed = AgentMemory(AgentState.model_validate_json(first.state().model_dump_json()), CONFIG)
    after = [d for e in log.events[cut:] for d in resumed.apply(e).derived]
    owners = [(d.type, d.user_id) for d in straight[-len(after) :]]
    assert owners == [(d.type, d.user_id) for d in after]
    assert ("working.updated", "mei") not in owners
