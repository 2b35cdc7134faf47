"""Persona (a versioned document merged field by field) and skills (tool use counts)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processors.persona import (
    MAX_OPEN_CALLS,
    Persona,
    PersonaState,
    PersonaVersion,
    SkillRecord,
    SkillsState,
    merge_preferences,
)
from processors.skills import Skills, skill_record
from schemas import Event, PersonaUpdated, SessionStarted, ToolCalled, ToolResult

AGENT = "agent-persona"
T0 = datetime(2024, 1, 1, tzinfo=UTC)
LAWS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def update(i: int, when: datetime | None = None, **body: Any) -> Event:
    return PersonaUpdated(
        event_id=UUID(int=i), agent_id=AGENT, occurred_at=when or at(i), body=body
    )


def call(i: int, tool: str, call_id: str, when: datetime | None = None) -> Event:
    return ToolCalled(
        event_id=UUID(int=i),
        agent_id=AGENT,
        occurred_at=when or at(i),
        body={"call_id": call_id, "tool": tool},
    )


def result(i: int, tool: str, call_id: str, ok: bool = True, when: datetime | None = None) -> Event:
    return ToolResult(
        event_id=UUID(int=i),
        agent_id=AGENT,
        occurred_at=when or at(i),
        body={"call_id": call_id, "tool": tool, "ok": ok},
    )


# -- persona --------------------------------------------------------------------------


def test_first_update_makes_version_one() -> None:
    persona = Persona()
    assert persona.current() is None
    made = persona.apply(update(1, name="Ada", style="terse", preferences={"lang": "en"}))
    assert made == PersonaVersion(
        version=1,
        name="Ada",
        style="terse",
        preferences={"lang": "en"},
        updated_at=at(1),
        source_event_id=UUID(int=1),
    )
    assert persona.current() == made


def test_fields_left_out_keep_their_value_and_preferences_merge_by_key() -> None:
    persona = Persona()
    persona.apply(update(1, name="Ada", description="helper", preferences={"lang": "en"}))
    made = persona.apply(update(2, style="warm", preferences={"tz": "UTC", "lang": "fr"}))
    assert made is not None
    assert (made.version, made.name, made.description, made.style) == (2, "Ada", "helper", "warm")
    assert made.preferences == {"lang": "fr", "tz": "UTC"}


def test_an_empty_preference_value_removes_the_key() -> None:
    persona = Persona()
    persona.apply(update(1, preferences={"lang": "en", "tz": "UTC"}))
    made = persona.apply(update(2, preferences={"lang": ""}))
    assert made is not None and made.preferences == {"tz": "UTC"}
    assert persona.apply(update(3, preferences={"lang": ""})) is None


def test_an_empty_string_field_replaces_the_value() -> None:
    persona = Persona()
    persona.apply(update(1, name="Ada", style="terse"))
    made = persona.apply(update(2, style=""))
    assert made is not None and (made.name, made.style) == ("Ada", "")


def test_updates_that_change_nothing_make_no_version() -> None:
    persona = Persona()
    assert persona.apply(update(1)) is None
    assert persona.apply(update(2, preferences={"gone": ""})) is None
    persona.apply(update(3, name="Ada", preferences={"lang": "en"}))
    assert persona.apply(update(4, name="Ada")) is None
    assert persona.apply(update(5, preferences={"lang": "en"})) is None
    assert [v.version for v in persona.versions] == [1]


def test_versions_increase_and_are_kept() -> None:
    persona = Persona()
    for i, name in enumerate(["a", "b", "c"], start=1):
        persona.apply(update(i, name=name))
    assert [(v.version, v.name) for v in persona.versions] == [(1, "a"), (2, "b"), (3, "c")]


def test_at_gives_the_version_in_force() -> None:
    persona = Persona()
    persona.apply(update(1, name="a", when=at(10)))
    persona.apply(update(2, name="b", when=at(20)))
    assert persona.at(at(9)) is None
    assert persona.at(at(10)).name == "a"  # type: ignore[union-attr]
    assert persona.at(at(19)).name == "a"  # type: ignore[union-attr]
    assert persona.at(at(20)).name == "b"  # type: ignore[union-attr]
    assert persona.at(at(99)).name == "b"  # type: ignore[union-attr]


def test_a_late_update_is_dated_at_the_previous_version() -> None:
    persona = Persona()
    persona.apply(update(1, name="a", when=at(10)))
    made = persona.apply(update(2, name="b", when=at(5)))
    assert made is not None and made.updated_at == at(10)
    assert persona.at(at(10)) == made


def test_persona_ignores_other_events() -> None:
    persona = Persona()
    assert persona.apply(call(1, "search", "c1")) is None
    assert persona.state() == PersonaState()


def test_merge_preferences_sorts_keys() -> None:
    assert list(merge_preferences({"b": "1"}, {"a": "2", "c": ""})) == ["a", "b"]


# -- skills ---------------------------------------------------------------------------


def test_calls_and_results_count_uses_and_success_rate() -> None:
    skills = Skills()
    assert skills.apply(call(1, "search", "c1")) == SkillRecord(
        name="search", uses=1, last_used_at=at(1)
    )
    skills.apply(result(2, "search", "c1", ok=True))
    skills.apply(call(3, "search", "c2"))
    record = skills.apply(result(4, "search", "c2", ok=False))
    assert record == SkillRecord(
        name="search", uses=2, successes=1, failures=1, last_used_at=at(3), success_rate=0.5
    )
    assert skills.get("search") == record


def test_success_rate_is_none_before_any_result() -> None:
    skills = Skills()
    skills.apply(call(1, "search", "c1"))
    assert skills.get("search").success_rate is None  # type: ignore[union-attr]
    assert skills.get("never") is None


def test_a_result_without_a_matching_call_is_a_use() -> None:
    skills = Skills()
    record = skills.apply(result(1, "fetch", "orphan", ok=True))
    assert record == SkillRecord(
        name="fetch", uses=1, successes=1, last_used_at=at(1), success_rate=1.0
    )
    skills.apply(call(2, "fetch", "c1"))
    skills.apply(result(3, "fetch", "c1"))
    again = skills.apply(result(4, "fetch", "c1", ok=False))
    assert again is not None and (again.uses, again.successes, again.failures) == (3, 2, 1)


def test_a_result_of_another_tool_does_not_match_the_call() -> None:
    skills = Skills()
    skills.apply(call(1, "search", "c1"))
    skills.apply(result(2, "fetch", "c1"))
    assert skills.get("search").uses == 1  # type: ignore[union-attr]
    assert skills.get("fetch").uses == 1  # type: ignore[union-attr]
    assert skills.state().open_calls[0].tool == "search"


def test_open_calls_are_bounded() -> None:
    skills = Skills()
    for i in range(MAX_OPEN_CALLS + 1):
        skills.apply(call(i, "t", f"c{i}"))
    assert len(skills.state().open_calls) == MAX_OPEN_CALLS
    skills.apply(result(10_000, "t", "c0"))
    assert skills.get("t").uses == MAX_OPEN_CALLS + 2  # type: ignore[union-attr]


def test_last_used_never_goes_back() -> None:
    skills = Skills()
    skills.apply(call(1, "t", "a", when=at(10)))
    record = skills.apply(call(2, "t", "b", when=at(5)))
    assert record is not None and record.last_used_at == at(10)


def test_all_is_sorted_by_name() -> None:
    skills = Skills()
    for i, tool in enumerate(["zeta", "alpha", "mid"]):
        skills.apply(call(i, tool, "c"))
    assert [r.name for r in skills.all()] == ["alpha", "mid", "zeta"]
    assert [r.name for r in skills.state().skills] == ["alpha", "mid", "zeta"]


def test_skills_ignore_other_events() -> None:
    skills = Skills()
    event = SessionStarted(event_id=UUID(int=1), agent_id=AGENT, session_id="s", occurred_at=T0)
    assert skills.apply(event) is None
    assert skills.state() == SkillsState()


@pytest.mark.parametrize(("ok", "fail", "rate"), [(0, 1, 0.0), (3, 1, 0.75), (2, 0, 1.0)])
def test_success_rate_formula(ok: int, fail: int, rate: float) -> None:
    assert skill_record("t", ok + fail, ok, fail, None).success_rate == rate


# -- fold laws ------------------------------------------------------------------------

persona_ops = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "name": st.sampled_from(["Ada", "Bo", ""]),
            "style": st.sampled_from(["terse", "warm"]),
            "preferences": st.dictionaries(
                st.sampled_from(["lang", "tz", "units"]), st.sampled_from(["", "x", "y"])
            ),
        },
    ),
    max_size=25,
)
tool_ops = st.lists(
    st.tuples(
        st.booleans(), st.sampled_from(["search", "fetch"]), st.integers(0, 4), st.booleans()
    ),
    max_size=40,
)


def persona_log(bodies: Sequence[dict[str, Any]]) -> list[Event]:
    return [update(i, **body) for i, body in enumerate(bodies, start=1)]


def tool_log(log: Sequence[tuple[bool, str, int, bool]]) -> list[Event]:
    return [
        call(i, tool, f"c{n}") if is_call else result(i, tool, f"c{n}", ok)
        for i, (is_call, tool, n, ok) in enumerate(log, start=1)
    ]


def fold_persona(events: Sequence[Event], persona: Persona | None = None) -> Persona:
    persona = persona or Persona()
    for event in events:
        persona.apply(event)
    return persona


def fold_skills(events: Sequence[Event], skills: Skills | None = None) -> Skills:
    skills = skills or Skills()
    for event in events:
        skills.apply(event)
    return skills


@LAWS
@given(persona_ops)
def test_persona_versions_count_up_and_at_matches_replay(bodies: list[dict[str, Any]]) -> None:
    events = persona_log(bodies)
    persona = fold_persona(events)
    assert [v.version for v in persona.versions] == list(range(1, len(persona.versions) + 1))
    for event in events:
        replayed = fold_persona([e for e in events if e.occurred_at <= event.occurred_at])
        assert persona.at(event.occurred_at) == replayed.current()


@LAWS
@given(persona_ops, st.data())
def test_persona_resume_from_serialised_state(
    bodies: list[dict[str, Any]], data: st.DataObject
) -> None:
    events = persona_log(bodies)
    cut = data.draw(st.integers(0, len(events)))
    state = fold_persona(events[:cut]).state()
    restored = Persona(PersonaState.model_validate_json(state.model_dump_json()))
    resumed = fold_persona(events[cut:], restored)
    assert resumed.state().model_dump_json() == fold_persona(events).state().model_dump_json()
    assert fold_persona(events).state() == fold_persona(events).state()


@LAWS
@given(tool_ops, st.data())
def test_skills_resume_from_serialised_state(
    log: list[tuple[bool, str, int, bool]], data: st.DataObject
) -> None:
    events = tool_log(log)
    cut = data.draw(st.integers(0, len(events)))
    state = fold_skills(events[:cut]).state()
    restored = Skills(SkillsState.model_validate_json(state.model_dump_json()))
    resumed = fold_skills(events[cut:], restored)
    whole = fold_skills(events)
    assert resumed.state().model_dump_json() == whole.state().model_dump_json()
    assert whole.state().model_dump_json() == fold_skills(events).state().model_dump_json()


@LAWS
@given(tool_ops)
def test_skill_counts_add_up(log: list[tuple[bool, str, int, bool]]) -> None:
    skills = fold_skills(tool_log(log))
    for record in skills.all():
        calls = sum(1 for c, t, _, _ in log if c and t == record.name)
        results = sum(1 for c, t, _, _ in log if not c and t == record.name)
        assert record.successes + record.failures == results
        assert calls <= record.uses <= calls + results
        if results:
            assert record.success_rate == record.successes / results
