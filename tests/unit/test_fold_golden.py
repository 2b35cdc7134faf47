"""The fold's output, pinned: derived events and serialised states are byte-identical
to those of the reference implementation, for both forgetting curves.

The digests were computed by ``ops.bench.processors --digest`` on the code before
it was optimised for speed; a change of any derived event, of any state, or of the
way a resumed state folds on, changes them. A deliberate change of the memory
dynamics (or of a wire format) updates them, and says so.

Updated once, for ``working.set`` and the scratchpad: ``working.updated`` became
schema version 2 with a ``scratchpad`` body field, and the rich workload publishes
``working.set``. Before the update the new code was checked against the old digests
with the new field and version removed from the output: all six matched.

Updated again for two deliberate changes of episode summaries: ``summary_chars`` 280 →
600 (the config version changes with it), and the summariser's term frequencies count
distinct sentences (a stock reply said five times no longer outranks the facts).

And once more: ``fact.set`` carries the confidence its assertion gave (it always said
None); the ``bench`` workload asserts no facts, so only the ``rich`` digests changed.

And for ``memory.created`` version 2, whose body names when the memory's forgetting
clock starts (``formed_at``): checked like the first update, all six old digests
matched the new output with that field and the version removed.

And for erasure (issue 7): ``subject.erasure_requested`` (in the ``rich`` workload)
now purges its subject and emits ``subject.erased``, and the state records whose an
item is (``session_users``, ``persona_users``, a fact version's ``user_id``). Checked
like the first update: with the erasure made a no-op and those three fields left
out of serialisation, all six old digests matched the new output.

And for the episode chain, now per user (an episode links to the previous episode of
its own user, not of the agent), so that erasing a user leaves the others' chains as
if the user had never been (issue 7). Checked the same way: with
``previous_episode_id`` nulled in ``episode.closed`` and the chain left out of the
states, the old and new code gave the same six digests.

And for the cap on open sessions per agent (``working.max_sessions``, 256), a new
parameter, which changes the config version every derived event carries. No workload
opens 256 sessions in one agent: with the new parameter left out of the version's
digest, all six old digests matched the new output.
And for memory and episode ids that name their agent (``memory_id_of``): two agents
whose events share an id made memories with one id, and the vector store keeps one
point per id. The six old digests were those of the code just before, whose only
difference is the agent left out of these ids.
And for what carries a user's words being filed under that user (issue 7): an open
episode takes the first user its turns name (a greeting naming none opened it), and a
working-memory delta an event without a user made is the session user's. The
``bench`` workload's sessions never start without a user: its digests stay; the four
``rich`` ones are those of the code just before, whose only difference is these two
rules. Updated again in the same stop: a session that ended and opens again forgets the
user of its ended life (the second rule had filed a reopened session's deltas under that
user in a run that saved no state in between, and not in one that did).
"""

from __future__ import annotations

from functools import cache

import pytest
from pydantic import BaseModel

from ops.bench.processors import CONFIGS, WORKLOADS, digest
from processors import AgentMemory, AgentState, MemoryConfig
from schemas import Event

TIGHT = {
    # small budgets and windows: compression, offloading, TTL expiry, dedupe eviction,
    # short episodes, hourly consolidation, fast forgetting
    "dedupe_window": 8,
    "working_turns": 5,
    "working": {"token_budget": 120, "offload_chars": 300, "idle_ttl_s": 900.0},
    "episodes": {"idle_gap_s": 600.0, "max_turns": 6},
    "consolidation": {"window_s": 3600.0, "min_episodes": 1},
}
TIGHT_FSRS = {
    "dedupe_window": 8,
    "working_turns": 5,
    "working": {"token_budget": 120, "offload_chars": 300},
    "episodes": {"max_turns": 6},
    "forgetting": {"curve": "fsrs", "fsrs_threshold": 0.9},
    "consolidation": {"window_s": 7200.0, "min_episodes": 1},
}
CASES = {
    "exponential": CONFIGS["exponential"],
    "fsrs": CONFIGS["fsrs"],
    "tight": MemoryConfig.model_validate(TIGHT),
    "tight-fsrs": MemoryConfig.model_validate(TIGHT_FSRS),
}

GOLDEN = {
    # (workload, events, agents, seed, restore_every, config): sha-256
    ("bench", 3000, 10, 0, 0, "exponential"): (
        "1602a907b78d2f3374b9c9160d9db26267d603ca4427939d504d81d9849b32cb"
    ),
    ("bench", 3000, 10, 0, 0, "fsrs"): (
        "635b31cb5c8537887e7a9c2951981aaff8bcb8d9aa57bc7f485239189e77f94d"
    ),
    ("rich", 3000, 6, 0, 7, "exponential"): (
        "bdcf3802156d6d515f77bcfe901836bd0a208bbd73005a296e6cdc718688f6ad"
    ),
    ("rich", 3000, 6, 0, 7, "fsrs"): (
        "9d3e81b84dfca31cef676662a7f3c54b7366acc537209170439e9b5f81a3b620"
    ),
    ("rich", 2500, 5, 1, 13, "tight"): (
        "546fb6c9e49ad93ba45997ba1f41e8a828759d95aac63430a5a797b28a2d6fd5"
    ),
    ("rich", 2500, 5, 1, 13, "tight-fsrs"): (
        "a1e4f1c630c3f5c358a228dc78bbe1e794f04db47e53a49b323e9429f33c0152"
    ),
}


@cache
def events(workload: str, n: int, agents: int, seed: int = 0) -> tuple[Event, ...]:
    return tuple(WORKLOADS[workload](n, agents, seed))


@pytest.mark.parametrize(("case", "expected"), GOLDEN.items(), ids=lambda v: str(v)[:32])
def test_the_fold_output_is_unchanged(
    case: tuple[str, int, int, int, int, str], expected: str
) -> None:
    workload, n, agents, seed, restore_every, config = case
    log = list(events(workload, n, agents, seed))
    assert digest(log, CASES[config], restore_every) == expected


def test_the_workloads_are_deterministic() -> None:
    for workload in WORKLOADS:
        first = WORKLOADS[workload](200, 3, 0)
        again = WORKLOADS[workload](200, 3, 0)
        assert [e.model_dump_json() for e in first] == [e.model_dump_json() for e in again]


def _same_as_validated(made: object, checked: object, where: str) -> None:
    """``made`` holds exactly what validation made of the same values: same types (a
    float is not an int), same fields in the same order, all the way down."""
    assert type(made) is type(checked), f"{where}: {type(made)} != {type(checked)}"
    if isinstance(made, BaseModel):
        assert isinstance(checked, BaseModel)
        assert list(made.__dict__) == list(checked.__dict__), where
        for name, value in made.__dict__.items():
            _same_as_validated(value, checked.__dict__[name], f"{where}.{name}")
    elif isinstance(made, list | tuple):
        assert isinstance(checked, list | tuple)
        assert len(made) == len(checked), where
        for i, (a, b) in enumerate(zip(made, checked, strict=True)):
            _same_as_validated(a, b, f"{where}[{i}]")
    elif isinstance(made, dict):
        assert isinstance(checked, dict)
        assert list(made) == list(checked), where
        for key, value in made.items():
            _same_as_validated(value, checked[key], f"{where}[{key!r}]")
    else:
        assert made == checked, where


@pytest.mark.parametrize("curve", sorted(CONFIGS))
def test_models_built_without_validation_are_what_validation_makes(curve: str) -> None:
    """The fold builds its models from values valid by construction, without
    validating them again (``processors.build``): each must equal, type for type,
    the model validated from its own dump."""
    memories: dict[str, AgentMemory] = {}
    for event in events("rich", 1500, 4):
        memory = memories.get(event.agent_id)
        if memory is None:
            memory = memories[event.agent_id] = AgentMemory.empty(event.agent_id, CONFIGS[curve])
        for derived in memory.apply(event).derived:
            checked = type(derived).model_validate(derived.model_dump())
            _same_as_validated(derived, checked, derived.type)
    for agent_id, memory in memories.items():
        state = memory.state()
        _same_as_validated(state, AgentState.model_validate(state.model_dump()), agent_id)


@pytest.mark.parametrize(("seed", "every"), [(0, 7), (1, 13)])
def test_the_derived_events_do_not_depend_on_when_states_were_saved(seed: int, every: int) -> None:
    """The rich workload (sessions reopened, users coming and going, erasures) folded
    straight, and again with every agent's state saved and restored every ``every``
    events: the derived events are the same, byte for byte."""
    log = events("rich", 3000, 6, seed)
    config = CASES["exponential"]

    def fold(restore_every: int) -> list[str]:
        memories: dict[str, AgentMemory] = {}
        folded: dict[str, int] = {}
        out: list[str] = []
        for event in log:
            agent = event.agent_id
            memory = memories.setdefault(agent, AgentMemory.empty(agent, config))
            out += [d.model_dump_json() for d in memory.apply(event).derived]
            folded[agent] = folded.get(agent, 0) + 1
            if restore_every and folded[agent] % restore_every == 0:
                saved = memory.state().model_dump_json()
                memories[agent] = AgentMemory(AgentState.model_validate_json(saved), config)
        return out

    assert fold(every) == fold(0)
