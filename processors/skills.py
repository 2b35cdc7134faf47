"""The skills record of one agent (L4): how each tool has been used, folded from
``tool.called`` and ``tool.result``; the rule is in :mod:`processors.persona`'s
docstring, beside the persona's, and its records are :class:`~processors.persona.
SkillRecord`. A module of its own so that it is compiled with the fold (``setup.py``):
its models stay in ``persona.py``, which is not.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from processors.build import fields, trusted
from processors.persona import MAX_OPEN_CALLS, OpenCall, SkillRecord, SkillsState
from schemas import Event, ToolCalled, ToolResult
from schemas.base import INT64_MAX


def skill_record(
    name: str, uses: int, successes: int, failures: int, last_used_at: datetime | None
) -> SkillRecord:
    """A record with its ``success_rate`` computed from the counts (validated as
    ``SkillRecord(...)`` validates it: a count out of range raises)."""
    results = successes + failures
    values = {
        "name": name,
        "uses": uses,
        "successes": successes,
        "failures": failures,
        "last_used_at": last_used_at,
        "success_rate": successes / results if results else None,
    }
    if _valid_record(values):
        return trusted(SkillRecord, values, _RECORD_GIVEN)
    return SkillRecord(**values)


_RECORD_GIVEN = fields(SkillRecord.model_fields)


def _valid_record(values: dict[str, Any]) -> bool:
    """Whether validation would keep ``values`` as they are (else it raises or converts)."""
    at = values["last_used_at"]
    counts = (values["uses"], values["successes"], values["failures"])
    return (
        all(type(n) is int and 0 <= n <= INT64_MAX for n in counts)
        and (at is None or (at.tzinfo is UTC and not at.microsecond % 1000))
        and type(values["name"]) is str
    )


class Skills:
    """The live fold of one agent's skills record; see the module docstring."""

    def __init__(self, state: SkillsState | None = None) -> None:
        state = state or SkillsState()
        self.records = {r.name: r for r in state.skills}
        self.open_calls: dict[tuple[str, str], None] = dict.fromkeys(
            (c.tool, c.call_id) for c in state.open_calls
        )

    def apply(self, event: Event) -> SkillRecord | None:
        """Fold one event; the tool's updated record, or None for other types."""
        match event:
            case ToolCalled(body=body):
                self._await_result((body.tool, body.call_id))
                return self._update(body.tool, event.occurred_at, use=True)
            case ToolResult(body=body):
                matched = (body.tool, body.call_id) in self.open_calls
                self.open_calls.pop((body.tool, body.call_id), None)
                return self._update(body.tool, event.occurred_at, use=not matched, ok=body.ok)
            case _:
                return None

    def _await_result(self, call: tuple[str, str]) -> None:
        """Remember a call (as the newest), forgetting the oldest beyond the bound."""
        self.open_calls.pop(call, None)
        self.open_calls[call] = None
        if len(self.open_calls) > MAX_OPEN_CALLS:
            del self.open_calls[next(iter(self.open_calls))]

    def _update(self, tool: str, at: datetime, *, use: bool, ok: bool | None = None) -> SkillRecord:
        """Count a use and/or a result of ``tool`` at ``at``; store and return the record."""
        old = self.records.get(tool) or SkillRecord(name=tool)
        last = old.last_used_at
        if use:
            last = at if last is None else max(last, at)
        record = skill_record(
            tool,
            old.uses + int(use),
            old.successes + int(ok is True),
            old.failures + int(ok is False),
            last,
        )
        self.records[tool] = record
        return record

    def get(self, name: str) -> SkillRecord | None:
        """The record of tool ``name``, or None if it was never used."""
        return self.records.get(name)

    def all(self) -> list[SkillRecord]:
        """Every record, sorted by tool name."""
        return [self.records[name] for name in sorted(self.records)]

    def state(self) -> SkillsState:
        """Serialisable snapshot; ``Skills(state)`` resumes exactly here."""
        return SkillsState(
            skills=self.all(),
            open_calls=[OpenCall(tool=t, call_id=c) for t, c in self.open_calls],
        )
